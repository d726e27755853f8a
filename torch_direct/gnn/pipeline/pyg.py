"""PyG adapters: a ``FeatureStore`` over our feature stores (:func:`to_pyg`) and a
``GraphStore`` over a :class:`~torch_direct.gnn.graph.CSRGraph` (:func:`to_pyg_graph_store`).

    >>> fs = to_pyg(store)                         # a torch_geometric.data.FeatureStore
    >>> gs = to_pyg_graph_store(ds.graph)          # a torch_geometric.data.GraphStore
    >>> row, colptr = gs.get_edge_index(edge_type=None, layout="csc")

Our CSR lists, for each node, the nodes it aggregates from: in PyG's terms that is the CSC
layout (``colptr`` over targets, ``row`` = sources), served without a copy from a CPU graph
and from the host pages of a unified one. ``coo`` and ``csr`` are built on request.
"""

from __future__ import annotations

import torch

from .features import FeatureStore


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


def to_pyg(stores, group_name=None, attr_name: str = "x"):
    """A ``torch_geometric.data.FeatureStore`` over our stores, for PyG's loaders.

    ``stores``: one :class:`FeatureStore` (registered as ``(group_name, attr_name)``)
    or a dict ``{(group_name, attr_name): store}``. Reads gather through our stores
    onto each store's device; the adapter is read-only (``put``/``remove`` raise).
    Raises ImportError when torch_geometric is not installed.
    """
    try:
        from torch_geometric.data import FeatureStore as PyGFeatureStoreBase
    except ImportError as e:
        raise ImportError("to_pyg needs torch_geometric (pip install torch_geometric)") from e
    if isinstance(stores, FeatureStore):
        stores = {(group_name, attr_name): stores}
    for k, v in stores.items():
        if not isinstance(v, FeatureStore):
            raise TypeError(f"to_pyg: {k!r} maps to {type(v).__name__}, not a FeatureStore")

    class PyGFeatureStore(PyGFeatureStoreBase):
        def __init__(self, stores):
            super().__init__()
            self._stores = dict(stores)

        def _store(self, attr):
            try:
                return self._stores[(attr.group_name, attr.attr_name)]
            except KeyError:
                raise KeyError(f"no feature store for ({attr.group_name!r}, {attr.attr_name!r}); "
                               f"have {sorted(map(str, self._stores))}") from None

        def _put_tensor(self, tensor, attr) -> bool:
            raise NotImplementedError("this PyG FeatureStore adapter is read-only")

        def _remove_tensor(self, attr) -> bool:
            raise NotImplementedError("this PyG FeatureStore adapter is read-only")

        def _get_tensor(self, attr):
            store = self._store(attr)
            index = attr.index
            if index is None or isinstance(index, slice):
                index = torch.arange(store.num_rows)[index if isinstance(index, slice) else slice(None)]
            return store.gather(torch.as_tensor(index))

        def _get_tensor_size(self, attr):
            store = self._store(attr)
            return (store.num_rows, store.dim)

        def get_all_tensor_attrs(self):
            from torch_geometric.data import TensorAttr
            return [TensorAttr(group_name=g, attr_name=a) for g, a in self._stores]

    return PyGFeatureStore(stores)
