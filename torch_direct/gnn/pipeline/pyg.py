"""A PyG ``GraphStore`` over a :class:`~torch_direct.gnn.graph.CSRGraph` (the feature side is
:func:`~torch_direct.gnn.pipeline.features.to_pyg`).

    >>> gs = to_pyg_graph_store(ds.graph)          # a torch_geometric.data.GraphStore
    >>> row, colptr = gs.get_edge_index(edge_type=None, layout="csc")

Our CSR lists, for each node, the nodes it aggregates from: in PyG's terms that is the CSC
layout (``colptr`` over targets, ``row`` = sources), served without a copy from a CPU graph
and from the host pages of a unified one. ``coo`` and ``csr`` are built on request.
"""

from __future__ import annotations

import torch


def to_pyg_graph_store(graph, edge_type=None):
    """A read-only ``torch_geometric.data.GraphStore`` holding ``graph`` as ``edge_type``.
    Raises ImportError when torch_geometric is not installed."""
    try:
        from torch_geometric.data import EdgeAttr, GraphStore
    except ImportError as e:
        raise ImportError("to_pyg_graph_store needs torch_geometric (pip install torch_geometric)") from e
    from ..graph import CSRGraph
    from ..graph.csr import host_values
    if not isinstance(graph, CSRGraph):
        raise TypeError(f"to_pyg_graph_store: graph must be a CSRGraph, got {type(graph).__name__}")

    def host(t):
        return host_values(t) if t.device.type == "unified" else t

    class CSRGraphStore(GraphStore):
        def __init__(self):
            super().__init__()
            n = graph.num_nodes
            self._attr = EdgeAttr(edge_type, "csc", size=(n, n))

        def _put_edge_index(self, edge_index, edge_attr) -> bool:
            raise NotImplementedError("this PyG GraphStore adapter is read-only")

        def _remove_edge_index(self, edge_attr) -> bool:
            raise NotImplementedError("this PyG GraphStore adapter is read-only")

        def _get_edge_index(self, edge_attr):
            if edge_attr.edge_type != edge_type:
                raise KeyError(f"no edges of type {edge_attr.edge_type!r}; have {edge_type!r}")
            layout = edge_attr.layout.value
            rowptr, col = host(graph.rowptr), host(graph.col).long()
            if layout == "csc":
                return col, rowptr
            dst = torch.repeat_interleave(torch.arange(graph.num_nodes, device=rowptr.device),
                                          rowptr[1:] - rowptr[:-1])
            if layout == "coo":
                return col, dst
            order = torch.argsort(col, stable=True)            # csr: rows are sources
            ptr = torch.zeros(graph.num_nodes + 1, dtype=torch.long, device=rowptr.device)
            ptr[1:] = torch.cumsum(torch.bincount(col, minlength=graph.num_nodes), 0)
            return ptr, dst[order]

        def get_all_edge_attrs(self):
            return [self._attr]

    return CSRGraphStore()
