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

import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ..progress import progress
from .csr import CSRGraph, host_values

ORDERS = ("degree", "frequency", "none")
_EDGE_CHUNK = 1 << 26
_ROW_CHUNK = 1 << 22
# access_frequency's pass shares its chunks among threads, each with buffers of 16 bytes an edge
# of its own (_PerSlot's): chunks of at most 2^24 edges keep those to 256 MiB a thread.
_THREAD_CHUNK = 1 << 24
# Its threads add into int64 partial sums of their own (8 bytes a node each): at most this many,
# and no more than fit in this many bytes together.
_MAX_PARTIALS = 8
_PARTIAL_BYTES = 4 << 30
# Its weights are whole numbers of 2^-_FRACTION_BITS (of fewer on a graph whose weights add up to
# more than 2^22, so that no sum can pass 2^62).
_FRACTION_BITS = 40
# The score a frequency reorder ranked by, kept for the graph it made (in new ids), per fanout:
# the cache that ranks the same graph's rows next reads it instead of a second pass over the
# edges (a minute on a graph of billions of edges). Held only while that graph lives.
_KNOWN_FREQUENCY: "weakref.WeakKeyDictionary[CSRGraph, dict[int, torch.Tensor]]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Reordering:
    """A relabelling of ``num_nodes`` ids: ``perm[new] = old`` and ``inv[old] = new`` (int64, CPU).
    ``seconds``: what :func:`reorder` spent on each part (``rank``: scoring and sorting the nodes;
    ``relabel``: the CSR; ``rows``: the features and labels)."""

    perm: torch.Tensor
    inv: torch.Tensor
    by: str
    seconds: dict = field(default_factory=dict, compare=False)

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


def _edge_chunks(rowptr: torch.Tensor, size: int | None = None) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` of about ``size`` (``_EDGE_CHUNK`` if None) edges each (a longer row
    is a chunk of its own), covering every edge: a pass over them keeps its temporaries that small."""
    size = _EDGE_CHUNK if size is None else size
    bounds = torch.searchsorted(rowptr, torch.arange(0, int(rowptr[-1]), size), right=True) - 1
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
    and a cache of the longest rows holds only its own share of the reads (docs/pipeline-measurements.md).
    On an undirected graph with ``fanout=-1`` it equals the degree.

    The result is the same bit for bit on every machine, whatever the number of threads
    (``torch.get_num_threads()``, at most 8), the chunking (about ``_EDGE_CHUNK`` edges, at most
    2^24) or the order of the additions: each edge adds its weight as a whole number of 2^-S
    units, ``floor(2^S * min(1, fanout / len(r)))``, into an exact int64 sum, and each node's
    sum is converted once at the end (through float64: two IEEE roundings to nearest). ``S`` is
    40, or fewer on a graph whose weights add up to more than 2^22 (so that no sum can pass
    2^62); each edge's weight is low by less than 2^-S. With ``fanout=-1``, or one that no row
    is longer than, every edge counts 1 and the sums are counts. So nodes listed by rows of
    the same lengths get equal scores, whose ties :func:`reorder` breaks by id everywhere.

    For a graph that ``reorder(..., "frequency", fanout=)`` made, the score it ranked by
    (permuted to the new ids) is returned without a pass over the edges."""
    _check_fanout(fanout, "access_frequency")
    if not isinstance(graph, CSRGraph):
        raise TypeError(f"access_frequency: graph must be a CSRGraph, got {type(graph).__name__}")
    known = _KNOWN_FREQUENCY.get(graph, {}).get(fanout)
    if known is not None:
        return known.clone()   # the caller's own copy: the kept one must not change
    return _frequency_pass(graph, fanout)


def _frequency_pass(graph: CSRGraph, fanout: int) -> torch.Tensor:
    """access_frequency's pass over the edges. index_add_ into a 1-D tensor runs on one thread
    and its adds land at random across the table, so chunks of rows are shared among threads
    (torch releases the GIL), each adding into an int64 partial sum of its own; the partials
    are added once all chunks are done."""
    rowptr = host_values(graph.rowptr).cpu()
    col = host_values(graph.col).cpu()
    n = graph.num_nodes
    deg = rowptr[1:] - rowptr[:-1]
    longest = int(deg.max()) if n else 0
    if fanout < 0 or fanout >= longest:   # every neighbour read: each edge counts 1
        weight, bits = None, 0
    else:
        # A node's sum is at most the sum of all weights (a row's add up to min(len, fanout)):
        # below 2^62 in units of 2^-bits. fanout is at most that sum (some row is longer), so
        # fanout << bits is exact in int64 too, and so is each row's weight, its floor division.
        everything = int(deg.clamp(max=fanout).sum())
        bits = min(_FRACTION_BITS, 62 - everything.bit_length())
        weight = (fanout << bits) // deg.clamp(min=fanout)
    chunks = _edge_chunks(rowptr, min(_EDGE_CHUNK, _THREAD_CHUNK))
    threads = max(1, min(torch.get_num_threads(), _MAX_PARTIALS, len(chunks), _PARTIAL_BYTES // (8 * max(n, 1))))
    todo = iter(chunks)
    taking = threading.Lock()
    ones = torch.ones(1, dtype=torch.int64)

    def add_chunks() -> torch.Tensor:
        partial = torch.zeros(n, dtype=torch.int64)
        row_of = None if weight is None else _PerSlot(rowptr, chunks)   # buffers of this thread's own
        while True:
            with taking:
                ab = next(todo, None)
            if ab is None:
                return partial
            a, b = ab
            e0, e1 = int(rowptr[a]), int(rowptr[b])
            w = ones.expand(e1 - e0) if weight is None else row_of(a, b, weight[a:b])
            partial.index_add_(0, col[e0:e1], w)   # the column indices as they are (int32 or int64)

    with ThreadPoolExecutor(threads) as pool:
        partials = [f.result() for f in [pool.submit(add_chunks) for _ in range(threads)]]
    total = partials.pop()
    while partials:
        total += partials.pop()   # integers: exact in any order
    return _fixed_to_float32(total, bits)


def _fixed_to_float32(total: torch.Tensor, bits: int) -> torch.Tensor:
    """``total * 2^-bits`` (int64, each in [0, 2^62)) in float32, the same on every machine:
    its two 31-bit halves are exact in float64, their sum is rounded once, then to float32
    (both IEEE round-to-nearest); scaling by a power of two is exact. So the result does not
    rest on how a conversion of an int64 past 2^53 rounds, which vector and scalar code need
    not do alike. In chunks of ``_ROW_CHUNK`` nodes through buffers made once: temporaries
    the size of the table, faulted in page by page, took several times longer."""
    n = total.numel()
    out = torch.empty(n, dtype=torch.float32)
    step = max(1, min(n, _ROW_CHUNK))
    half = torch.empty(step, dtype=torch.int64)
    lo, hi = torch.empty(step, dtype=torch.float64), torch.empty(step, dtype=torch.float64)
    for a in range(0, n, step):
        b = min(n, a + step)
        m = b - a
        torch.bitwise_and(total[a:b], (1 << 31) - 1, out=half[:m])
        lo[:m].copy_(half[:m]).mul_(2.0 ** -bits)
        torch.bitwise_right_shift(total[a:b], 31, out=half[:m])
        hi[:m].copy_(half[:m]).mul_(2.0 ** (31 - bits)).add_(lo[:m])
        out[a:b].copy_(hi[:m])
    return out


def _order(graph: CSRGraph, by, fanout: int = -1, device=None) -> tuple[torch.Tensor, str, torch.Tensor | None]:
    """(perm, the order's name, the score it ranked by or None); the scores sorted on ``device``."""
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
    # Highest first; ties keep their original order (stable), so the result is deterministic,
    # and the same wherever it is sorted. The CPU's sort runs on one thread (10-16 s for 111M
    # nodes); a GPU's takes well under a second.
    if device is not None and device.type == "cuda":
        return torch.sort(score.to(device), descending=True, stable=True).indices.cpu(), by, score
    return torch.sort(score, descending=True, stable=True).indices, by, score


def _sort_device(device):
    """``reorder``'s ``device`` as a torch.device (None stays None), refused unless the CPU or a
    CUDA device this machine has."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"reorder: device must be a torch.device, 'cpu' or 'cuda[:N]', got {device!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"reorder: device={device} but torch sees no CUDA GPU here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"reorder: device={device} but this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type != "cpu":
        raise ValueError(f"reorder: device must be the CPU or a CUDA GPU, got {device}")
    return device


def relabel_graph(graph: CSRGraph, perm: torch.Tensor, inv: torch.Tensor, *, show_progress: bool = False) -> CSRGraph:
    """``graph`` with node ``perm[r]`` renamed ``r``: rows moved, column ids mapped through
    ``inv``, each row's neighbour order (and ``edge_ids``) kept. On the CPU's threads, in
    chunks of about ``_EDGE_CHUNK`` edges (each split by edges over the threads, so that long
    rows do not leave threads idle); the result is on the graph's device (computed on the
    host)."""
    from . import _sampler
    rowptr = host_values(graph.rowptr).cpu().long().contiguous()
    col = host_values(graph.col).cpu().contiguous()
    eids = None if graph.edge_ids is None else host_values(graph.edge_ids).cpu().long().contiguous()
    perm = perm.cpu().long().contiguous()
    deg_new = (rowptr[1:] - rowptr[:-1])[perm]
    rowptr_new = torch.zeros_like(rowptr)
    torch.cumsum(deg_new, 0, out=rowptr_new[1:])
    del deg_new
    col_new = torch.empty_like(col)
    eids_new = None if eids is None else torch.empty_like(eids)
    inv = inv.cpu().to(col.dtype).contiguous()   # new ids in the column array's own type
    e = graph.num_edges
    with progress(e, "reorder: CSR entries", enabled=show_progress and e >= 1 << 27) as bar:
        for a, b in _edge_chunks(rowptr_new):
            _sampler._relabel_csr(rowptr, col, perm, inv, rowptr_new, col_new, eids, eids_new, a, b, 0)
            bar.update(int(rowptr_new[b] - rowptr_new[a]))
    out = CSRGraph(rowptr_new, col_new, eids_new, validate=False)
    return out if graph.device.type == "cpu" else out.to(graph.device)


def reorder(obj, by="degree", *, fanout: int = -1, show_progress: bool = False, device=None):
    """Relabel a :class:`NodeDataset` or a :class:`CSRGraph` so that the hottest nodes come first.

    ``by``: ``"degree"`` (most neighbours first), ``"frequency"`` (most often read first:
    :func:`access_frequency` with ``fanout``), ``"none"`` (identity), or a
    permutation tensor (``perm[new] = old``). With the fanout that ranks a GPU cache of hot
    rows (``train`` passes its last one), the cached rows become exactly the first rows of the
    table and every miss falls in the rest, a narrower span of host memory.
    Returns ``(relabelled, Reordering)``: for a data set, its graph, ``x``, ``y`` and splits
    are permuted once (``x`` is copied into memory); use the :class:`Reordering` to map ids
    and results back. ``show_progress`` draws a bar over a large graph's CSR entries and
    feature rows. ``device``: where the nodes' scores are sorted (default: the CPU); a CUDA
    device gives the same order, sooner on a large graph. The rest is done on the CPU.
    """
    from .datasets import NodeDataset
    if isinstance(obj, NodeDataset):
        graph = obj.graph
    elif isinstance(obj, CSRGraph):
        graph = obj
    else:
        raise TypeError(f"reorder: expected a NodeDataset or a CSRGraph, got {type(obj).__name__}")
    _check_fanout(fanout, "reorder")
    device = _sort_device(device)
    seconds = {}
    t0 = time.perf_counter()
    perm, name, score = _order(graph, by, fanout, device)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    seconds["rank"] = time.perf_counter() - t0
    ro = Reordering(perm, inv, name, seconds)
    t0 = time.perf_counter()
    new_graph = graph if name == "none" else relabel_graph(graph, perm, inv, show_progress=show_progress)
    seconds["relabel"] = time.perf_counter() - t0
    if name == "frequency":
        _KNOWN_FREQUENCY.setdefault(new_graph, {})[fanout] = score[perm]   # node r's is old perm[r]'s
    if isinstance(obj, CSRGraph):
        return new_graph, ro
    if name == "none":
        return obj, ro
    t0 = time.perf_counter()
    x = host_values(obj.x) if obj.x.device.type == "unified" else obj.x
    split = {k: inv[v.cpu().long()] for k, v in obj.split.items()}
    info = dict(obj.info, reorder=name)
    ds = NodeDataset(obj.name, new_graph, _permute_rows(x, perm, show_progress), obj.y[perm.to(obj.y.device)],
                     split, obj.num_classes, info)
    seconds["rows"] = time.perf_counter() - t0
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
