"""Node-ID reordering: relabel a graph so that hot nodes get the smallest ids (a locality lever).

    >>> ds2, ro = reorder(ds, by="degree")       # features, labels, splits and CSR permuted once
    >>> ds2.x[ro.to_new(v)] == ds.x[v]           # a node's row follows it
    >>> pred_original = ro.rows_to_original(pred_new)   # results back in the original ids

Why: a zero-copy gather from host memory is bounded by how fast the GPU translates the
addresses it reads (DESIGN.md, "Performance model"), and the rows a mini-batch reads most
often are those of high-degree nodes. Giving them the smallest ids packs them into the first
pages of the feature table, so the reads of a batch touch fewer pages, and a GPU cache of the
hottest rows becomes a prefix of the table.

The relabel is exact: new node ``r`` is old node ``perm[r]`` (``inv[perm[r]] == r``), its
row lists the same neighbours (relabelled) in the same order, so a sampler that draws
neighbour slots by position, fed the relabelled seeds in the same order, samples the same
nodes. Splits keep their order (``split_new = inv[split_old]``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..progress import progress
from .csr import CSRGraph, host_values

ORDERS = ("degree", "frequency", "none")
_EDGE_CHUNK = 1 << 26
_ROW_CHUNK = 1 << 22
# The score a frequency reorder ranked by, kept for the graph it made (in new ids), per fanout:
# the cache that ranks the same graph's rows next reads it instead of a second pass over the
# edges (a minute on a graph of billions of edges). Held only while that graph lives.
_KNOWN_FREQUENCY: "weakref.WeakKeyDictionary[CSRGraph, dict[int, torch.Tensor]]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Reordering:
    """A relabelling of ``num_nodes`` ids: ``perm[new] = old`` and ``inv[old] = new`` (int64, CPU)."""

    perm: torch.Tensor
    inv: torch.Tensor
    by: str

    @property
    def num_nodes(self) -> int:
        return self.perm.numel()

    def to_new(self, ids: torch.Tensor) -> torch.Tensor:
        """Original ids -> new ids."""
        return self.inv.to(ids.device)[ids]

    def to_old(self, ids: torch.Tensor) -> torch.Tensor:
        """New ids -> original ids."""
        return self.perm.to(ids.device)[ids]

    def rows_to_original(self, t: torch.Tensor) -> torch.Tensor:
        """A per-node table in new-id order (row ``r`` = new node ``r``, e.g. logits of every
        node) -> the same table in original-id order."""
        if t.size(0) != self.num_nodes:
            raise ValueError(f"rows_to_original: expected {self.num_nodes} rows, got {t.size(0)}")
        return t[self.inv.to(t.device)]

    def rows_to_new(self, t: torch.Tensor) -> torch.Tensor:
        """A per-node table in original-id order -> new-id order."""
        if t.size(0) != self.num_nodes:
            raise ValueError(f"rows_to_new: expected {self.num_nodes} rows, got {t.size(0)}")
        return t[self.perm.to(t.device)]


def _check_fanout(fanout, who: str) -> None:
    if isinstance(fanout, bool) or not isinstance(fanout, int) or not (fanout == -1 or fanout > 0):
        raise ValueError(f"{who}: fanout must be a positive int or -1 (all neighbours), got {fanout!r}")


def _edge_chunks(rowptr: torch.Tensor) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` of about ``_EDGE_CHUNK`` edges each (a longer row is a chunk of its
    own), covering every edge: a pass over them keeps its temporaries that small."""
    bounds = torch.searchsorted(rowptr, torch.arange(0, int(rowptr[-1]), _EDGE_CHUNK), right=True) - 1
    bounds = torch.unique(torch.cat([bounds, torch.tensor([rowptr.numel() - 1])])).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


class _PerSlot:
    """For each edge slot of a chunk of rows, a value of the row it belongs to, in buffers made
    once for the largest chunk: fresh ones for every chunk would be faulted in page by page,
    which took longer than the work. Each row's change of value is marked where the row starts
    (an empty row's where the next one starts) and a running sum gives every slot its row's."""

    def __init__(self, rowptr: torch.Tensor, chunks: list[tuple[int, int]]):
        self.rowptr = rowptr
        cap = max((int(rowptr[b] - rowptr[a]) for a, b in chunks), default=0)
        self.marks = torch.empty(cap + 1, dtype=torch.int64)
        self.out = torch.empty(cap, dtype=torch.int64)

    def __call__(self, a: int, b: int, values: torch.Tensor) -> torch.Tensor:
        """``values[r]`` (int64, one per row of ``[a, b)``) at every slot of row ``r``."""
        lo, hi = int(self.rowptr[a]), int(self.rowptr[b])
        marks = self.marks[:hi - lo + 1].zero_()
        marks.index_add_(0, self.rowptr[a:b] - lo, torch.diff(values, prepend=values.new_zeros(1)))
        return torch.cumsum(marks[:hi - lo], 0, out=self.out[:hi - lo])


def access_frequency(graph: CSRGraph, fanout: int = -1) -> torch.Tensor:
    """How often each node is read as a neighbour when every node draws ``fanout`` of its
    neighbours uniformly without replacement (all of them with ``-1``): for node ``v``, the sum
    over the rows ``r`` that list it of ``min(1, fanout / len(r))``. float32, on the CPU.

    This is what the GPU cache of hot rows ranks by (``train --cache-mb``). A row's length is
    not a proxy for it on a directed graph: on the synthetic presets the two are uncorrelated,
    and a cache of the longest rows holds only its own share of the reads (docs/pipeline.md).
    On an undirected graph with ``fanout=-1`` it equals the degree. Computed in chunks of about
    ``_EDGE_CHUNK`` edges. For a graph that ``reorder(..., "frequency", fanout=)`` made, the
    score it ranked by (permuted to the new ids) is returned without a pass over the edges."""
    _check_fanout(fanout, "access_frequency")
    if not isinstance(graph, CSRGraph):
        raise TypeError(f"access_frequency: graph must be a CSRGraph, got {type(graph).__name__}")
    known = _KNOWN_FREQUENCY.get(graph, {}).get(fanout)
    if known is not None:
        return known.clone()   # the caller's own copy: the kept one must not change
    return _frequency_pass(graph, fanout)


def _frequency_pass(graph: CSRGraph, fanout: int) -> torch.Tensor:
    """access_frequency's pass over the edges, in chunks."""
    rowptr = host_values(graph.rowptr).cpu()
    col = host_values(graph.col).cpu()
    n = graph.num_nodes
    deg = rowptr[1:] - rowptr[:-1]
    ones = torch.ones(1)
    weight = (None if fanout < 0   # every neighbour read: each edge counts 1
              else (float(fanout) / deg.clamp(min=1).to(torch.float64)).clamp_(max=1.0).float())
    out = torch.zeros(n, dtype=torch.float32)
    chunks = _edge_chunks(rowptr)
    row_of = None if fanout < 0 else _PerSlot(rowptr, chunks)
    src = None if fanout < 0 else torch.empty(row_of.out.numel(), dtype=torch.float32)
    for a, b in chunks:
        e0, e1 = int(rowptr[a]), int(rowptr[b])
        # each edge's weight is its row's; the column indices as they are (int32 or int64)
        if fanout < 0:
            w = ones.expand(e1 - e0)
        else:
            w = torch.index_select(weight, 0, row_of(a, b, torch.arange(a, b)), out=src[:e1 - e0])
        out.index_add_(0, col[e0:e1], w)
    return out


def _order(graph: CSRGraph, by, fanout: int = -1) -> tuple[torch.Tensor, str, torch.Tensor | None]:
    """(perm, the order's name, the score it ranked by or None)."""
    n = graph.num_nodes
    if isinstance(by, torch.Tensor):
        perm = by.cpu()
        if perm.dtype not in (torch.int32, torch.int64) or perm.dim() != 1 or perm.numel() != n:
            raise ValueError(f"reorder: a permutation must be a 1-D int tensor of {n} entries, got "
                             f"{perm.dtype} of shape {tuple(perm.shape)}")
        perm = perm.long()
        seen = torch.zeros(n, dtype=torch.bool)
        if n and (int(perm.min()) < 0 or int(perm.max()) >= n):
            raise ValueError(f"reorder: the permutation holds ids outside [0, {n})")
        seen[perm] = True
        if not bool(seen.all()):
            raise ValueError("reorder: the given tensor is not a permutation (an id repeats)")
        return perm, "custom", None
    if by == "none":
        return torch.arange(n), by, None
    if by == "degree":          # row length
        score = graph.degree().cpu()
    elif by == "frequency":     # how often a node is someone's neighbour (sampled, so gathered)
        score = access_frequency(graph, fanout)   # in chunks: no int64 copy of the whole column array
    else:
        raise ValueError(f"reorder: by must be one of {', '.join(ORDERS)} or a permutation tensor, got {by!r}")
    # Highest first; ties keep their original order (stable), so the result is deterministic.
    return torch.sort(score, descending=True, stable=True).indices, by, score


def relabel_graph(graph: CSRGraph, perm: torch.Tensor, inv: torch.Tensor, *, show_progress: bool = False) -> CSRGraph:
    """``graph`` with node ``perm[r]`` renamed ``r``: rows moved, column ids mapped through
    ``inv``, each row's neighbour order (and ``edge_ids``) kept. Vectorized, in chunks of
    about ``_EDGE_CHUNK`` edges (so temporaries stay small on large graphs); the result is on
    the graph's device (computed on the host)."""
    rowptr = host_values(graph.rowptr).cpu()
    col = host_values(graph.col).cpu()
    eids = None if graph.edge_ids is None else host_values(graph.edge_ids).cpu()
    deg = rowptr[1:] - rowptr[:-1]
    deg_new = deg[perm]
    rowptr_new = torch.zeros_like(rowptr)
    torch.cumsum(deg_new, 0, out=rowptr_new[1:])
    start_old = rowptr[:-1][perm]
    col_new = torch.empty_like(col)
    eids_new = None if eids is None else torch.empty_like(eids)
    inv = inv.to(col.dtype)   # new ids in the column array's own type: mapped straight into place
    e = graph.num_edges
    chunks = _edge_chunks(rowptr_new)
    per_slot = _PerSlot(rowptr_new, chunks)
    cap = per_slot.out.numel()
    ramp, old_col = torch.empty(cap, dtype=torch.int64), torch.empty(cap, dtype=col.dtype)
    # Slot j of new row r is slot (rowptr[perm[r]] + j - rowptr_new[r]) of the old arrays.
    offset = start_old - rowptr_new[:-1]
    with progress(e, "reorder: CSR entries", enabled=show_progress and e >= 1 << 27) as bar:
        for a, b in chunks:
            lo, hi = int(rowptr_new[a]), int(rowptr_new[b])
            m = hi - lo
            at = per_slot(a, b, offset[a:b]).add_(torch.arange(lo, hi, out=ramp[:m]))
            torch.index_select(inv, 0, torch.index_select(col, 0, at, out=old_col[:m]), out=col_new[lo:hi])
            if eids is not None:
                torch.index_select(eids, 0, at, out=eids_new[lo:hi])
            bar.update(m)
    out = CSRGraph(rowptr_new, col_new, eids_new, validate=False)
    return out if graph.device.type == "cpu" else out.to(graph.device)


def reorder(obj, by="degree", *, fanout: int = -1, show_progress: bool = False):
    """Relabel a :class:`NodeDataset` or a :class:`CSRGraph` so that the hottest nodes come first.

    ``by``: ``"degree"`` (most neighbours first), ``"frequency"`` (most often read first:
    :func:`access_frequency` with ``fanout``), ``"none"`` (identity), or a
    permutation tensor (``perm[new] = old``). With the fanout that ranks a GPU cache of hot
    rows (``train`` passes its last one), the cached rows become exactly the first rows of the
    table and every miss falls in the rest, a narrower span of host memory.
    Returns ``(relabelled, Reordering)``: for a data set, its graph, ``x``, ``y`` and splits
    are permuted once (``x`` is copied into memory); use the :class:`Reordering` to map ids
    and results back. ``show_progress`` draws a bar over a large graph's CSR entries and
    feature rows.
    """
    from .datasets import NodeDataset
    if isinstance(obj, NodeDataset):
        graph = obj.graph
    elif isinstance(obj, CSRGraph):
        graph = obj
    else:
        raise TypeError(f"reorder: expected a NodeDataset or a CSRGraph, got {type(obj).__name__}")
    _check_fanout(fanout, "reorder")
    perm, name, score = _order(graph, by, fanout)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    ro = Reordering(perm, inv, name)
    new_graph = graph if name == "none" else relabel_graph(graph, perm, inv, show_progress=show_progress)
    if name == "frequency":
        _KNOWN_FREQUENCY.setdefault(new_graph, {})[fanout] = score[perm]   # node r's is old perm[r]'s
    if isinstance(obj, CSRGraph):
        return new_graph, ro
    if name == "none":
        return obj, ro
    x = host_values(obj.x) if obj.x.device.type == "unified" else obj.x
    split = {k: inv[v.cpu().long()] for k, v in obj.split.items()}
    info = dict(obj.info, reorder=name)
    ds = NodeDataset(obj.name, new_graph, _permute_rows(x, perm, show_progress), obj.y[perm.to(obj.y.device)],
                     split, obj.num_classes, info)
    return ds, ro


def _permute_rows(x: torch.Tensor, perm: torch.Tensor, show_progress: bool) -> torch.Tensor:
    """``x[perm]``, a large table's in chunks of rows under a bar."""
    n = perm.numel()
    if x.device.type != "cpu" or n <= _ROW_CHUNK:
        return x[perm.to(x.device)]
    out = torch.empty((n, *x.shape[1:]), dtype=x.dtype)
    with progress(n, "reorder: feature rows", enabled=show_progress) as bar:
        for a in range(0, n, _ROW_CHUNK):
            b = min(n, a + _ROW_CHUNK)
            torch.index_select(x, 0, perm[a:b], out=out[a:b])   # straight into place, no temporary
            bar.update(b - a)
    return out
