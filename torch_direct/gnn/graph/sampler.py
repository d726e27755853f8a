"""Neighbour sampling: per-layer bipartite blocks for mini-batch GNN training.

``NeighborSampler(graph, fanouts).sample(seeds)`` returns a :class:`SampledBatch`
in the layout of PyG's (and SALIENT's) neighbour samplers::

    batch = sampler.sample(seeds)
    x = features[batch.n_id]
    for layer, (edge_index, _, size) in zip(layers, batch.adjs):
        x = layer((x, x[:size[1]]), edge_index)     # e.g. SAGEConv
    # x now holds one row per seed, in the order of `seeds`
"""

from __future__ import annotations

import math
from typing import Iterator, NamedTuple, Sequence

import torch

from . import _sampler
from .csr import CSRGraph


class Block(NamedTuple):
    """One layer's bipartite graph: ``edge_index[0]`` are local source ids (into
    ``n_id[:size[0]]``), ``edge_index[1]`` local target ids (into ``n_id[:size[1]]``).
    ``e_id``: each edge's id in the graph (``None`` unless asked for)."""

    edge_index: torch.Tensor
    e_id: torch.Tensor | None
    size: tuple[int, int]

    def to(self, device, non_blocking: bool = False) -> "Block":
        e_id = None if self.e_id is None else self.e_id.to(device, non_blocking=non_blocking)
        return Block(self.edge_index.to(device, non_blocking=non_blocking), e_id, self.size)


class SampledBatch:
    """The sampled computation graph of one batch of seed nodes.

    ``n_id``: global ids of every node the batch touches, the seeds first (in
    the order given), then each hop's new nodes. ``adjs``: one :class:`Block`
    per layer, in the order a model applies them (the outermost hop first; the
    last block's targets are the seeds). ``hops`` is the same list in sampling
    order. ``batch_size``: the number of seeds.
    """

    __slots__ = ("n_id", "hops", "batch_size")

    def __init__(self, n_id: torch.Tensor, hops: list[Block], batch_size: int):
        self.n_id = n_id
        self.hops = hops
        self.batch_size = batch_size

    @property
    def adjs(self) -> list[Block]:
        return self.hops[::-1]

    @property
    def num_sampled_edges(self) -> list[int]:
        return [h.edge_index.size(1) for h in self.hops]

    def to(self, device, non_blocking: bool = False) -> "SampledBatch":
        return SampledBatch(self.n_id.to(device, non_blocking=non_blocking),
                            [h.to(device, non_blocking) for h in self.hops], self.batch_size)

    def pin_memory(self) -> "SampledBatch":
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return SampledBatch(pin(self.n_id), [Block(pin(h.edge_index), pin(h.e_id), h.size)
                                             for h in self.hops], self.batch_size)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s[0]}x{s[1]}:{b.edge_index.size(1)}" for b in self.adjs for s in [b.size])
        return f"SampledBatch(batch_size={self.batch_size}, nodes={self.n_id.numel()}, adjs=[{sizes}])"


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A graph array as the samplers' kernels read it on ``device``: a unified array as its
    CPU or CUDA alias (the same bytes, read in place, no copy), any other as it is."""
    import torch_direct
    if not torch_direct.is_unified(t):
        return t
    if device.type == "cuda":
        return torch_direct.cuda_alias(t, device.index or 0)
    return torch_direct.cpu_alias(t)


def seeds_per_shard(n: int, shard: tuple[int, int] | None, shuffle: bool) -> int:
    """How many of ``n`` seeds a process takes with ``shard=(rank, world)``: shuffled, the same
    count on every rank (so all take the same number of steps); else every seed once."""
    if shard is None:
        return n
    rank, world = shard
    return n // world if shuffle else len(range(rank, n, world))


def seed_batches(node_ids: torch.Tensor, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
                 generator: torch.Generator | None = None,
                 shard: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """The seed batches of one epoch: ``node_ids`` (in an order drawn from ``generator`` when
    ``shuffle``) cut into batches of ``batch_size``, the last one shorter unless ``drop_last``.
    ``shard=(rank, world)``: every rank draws the same order and takes every world-th seed
    (:func:`seeds_per_shard` of them). The samplers' loaders and the pipelined loader all
    batch their seeds here."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    ids = node_ids
    if shuffle:
        ids = ids[torch.randperm(ids.numel(), generator=generator).to(ids.device)]
    n = seeds_per_shard(ids.numel(), shard, shuffle)
    if shard is not None:
        rank, world = shard
        ids = ids[rank::world][:n]
    count = n // batch_size if drop_last else math.ceil(n / batch_size)
    return [ids[i * batch_size:(i + 1) * batch_size] for i in range(count)]


def _check_fanouts(fanouts) -> list[int]:
    if isinstance(fanouts, int) or not isinstance(fanouts, Sequence) or len(fanouts) == 0:
        raise ValueError(f"fanouts must be a non-empty list of ints (one per layer), got {fanouts!r}")
    out = []
    for f in fanouts:
        if isinstance(f, bool) or not isinstance(f, int):
            raise TypeError(f"fanouts must hold ints, got {f!r} ({type(f).__name__})")
        if f < -1:
            raise ValueError(f"a fanout is >= 0, or -1 for all neighbours; got {f}")
        out.append(int(f))
    return out


def seed_tensor(seeds) -> torch.Tensor:
    """A batch's seeds as a tensor (lists too), refused unless 1-D int32/int64."""
    if not isinstance(seeds, torch.Tensor):
        seeds = torch.as_tensor(seeds)
    if seeds.dtype not in (torch.int32, torch.int64) or seeds.dim() != 1:
        raise TypeError(f"seeds must be a 1-D int32/int64 tensor, got {seeds.dtype} of shape {tuple(seeds.shape)}")
    return seeds


class NeighborSampler:
    """Uniform neighbour sampling without replacement on CPU worker threads (C++).

    ``graph``: a :class:`CSRGraph` on the CPU or in unified memory (row ``v``
    lists the nodes ``v`` aggregates from). ``fanouts[i]``: neighbours drawn per
    node at hop ``i`` from the seeds (``-1``: all). At each hop every node found
    so far draws ``min(fanout, degree)`` distinct neighbour slots, each subset
    equally likely. Batches run in parallel on torch's intra-op threads, each
    with its own generator seeded from ``(seed, batch number)``: the same seed
    and the same sequence of calls give the same batches whatever the number of
    threads. ``return_edge_ids`` fills each block's ``e_id`` (the graph's
    ``edge_ids`` where it has them, else CSR slot positions). ``pin_memory``
    writes each batch's ``n_id`` and blocks into page-locked memory (needs
    CUDA), so that ``.to("cuda", non_blocking=True)`` is an asynchronous DMA
    rather than a copy the host waits for.
    """

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int], *, seed: int = 0,
                 return_edge_ids: bool = False, pin_memory: bool = False):
        if not isinstance(graph, CSRGraph):
            raise TypeError(f"NeighborSampler: graph must be a CSRGraph, got {type(graph).__name__}")
        if graph.device.type not in ("cpu", "unified"):
            raise ValueError(f"NeighborSampler samples on the CPU: the graph must be on the CPU or in "
                             f"unified memory, it is on {graph.device}")
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("NeighborSampler: pin_memory=True needs CUDA (page-locked memory is for a GPU's "
                             "DMA), and torch.cuda.is_available() is False")
        self.graph = graph
        cpu = torch.device("cpu")
        self._rowptr, self._col = on_device(graph.rowptr, cpu), on_device(graph.col, cpu)
        self._eids = None if graph.edge_ids is None else on_device(graph.edge_ids, cpu)
        self.fanouts = _check_fanouts(fanouts)
        self.return_edge_ids = bool(return_edge_ids)
        self.pin_memory = bool(pin_memory)
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Restart the sequence of batches from ``seed``."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = seed
        self._next_stream = 0

    def _prepare(self, seeds) -> torch.Tensor:
        seeds = seed_tensor(seeds)
        if seeds.device.type != "cpu":
            seeds = seeds.cpu()
        return seeds.long().contiguous()

    def sample(self, seeds) -> SampledBatch:
        """Sample one batch rooted at ``seeds`` (distinct node ids)."""
        return self.sample_batches([seeds])[0]

    def sample_batches(self, seed_batches) -> list[SampledBatch]:
        """Sample several batches at once, in parallel (one worker thread per batch)."""
        batches = [self._prepare(s) for s in seed_batches]
        streams = list(range(self._next_stream, self._next_stream + len(batches)))
        self._next_stream += len(batches)
        raw = _sampler._sample_neighbors(self._rowptr, self._col, batches, self.fanouts,
                                   self.seed % 2**64, streams, self.return_edge_ids, self.pin_memory)
        eids = self._eids
        out = []
        for seeds, (n_id, hops) in zip(batches, raw):
            blocks = []
            for edge_index, slots, n_src, n_dst in hops:
                if slots is not None and eids is not None:
                    slots = eids[slots]
                blocks.append(Block(edge_index, slots, (n_src, n_dst)))
            out.append(SampledBatch(n_id, blocks, seeds.numel()))
        return out

    def loader(self, node_ids, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
               generator: torch.Generator | None = None,
               batches_per_call: int | None = None) -> Iterator[SampledBatch]:
        """Iterate over ``node_ids`` in batches of ``batch_size`` seeds, sampling
        ``batches_per_call`` batches at a time in parallel (default: the number of
        torch threads)."""
        batches = seed_batches(self._prepare(node_ids), batch_size, shuffle=shuffle, drop_last=drop_last,
                               generator=generator)
        group = batches_per_call or max(1, torch.get_num_threads())
        for first in range(0, len(batches), group):
            yield from self.sample_batches(batches[first:first + group])

    def __repr__(self) -> str:
        return f"NeighborSampler({self.graph!r}, fanouts={self.fanouts}, seed={self.seed})"


class GPUNeighborSampler:
    """Neighbour sampling by whole-batch tensor steps on a GPU that reads the CSR in place.

    ``graph`` in unified memory is read over PCIe by the sampling kernel (no
    copy of the graph to the GPU); a graph already on ``device`` works too.
    Same semantics and block layout as :class:`NeighborSampler` (uniform
    without replacement, nodes numbered in discovery order), but its own
    random streams: for a seed it is reproducible, not equal to the CPU
    sampler. ``device="cpu"`` runs the same steps on the CPU (a reference for
    tests). Seeds may be on any device; results are on ``device``.
    ``batches_per_call``: how many batches a loader asks :meth:`sample_batches`
    for at once (1: one :meth:`sample` call each).
    """

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int], *, seed: int = 0, device="cuda",
                 return_edge_ids: bool = False, batches_per_call: int = 1):
        if isinstance(batches_per_call, bool) or not isinstance(batches_per_call, int) or batches_per_call < 1:
            raise ValueError(f"GPUNeighborSampler: batches_per_call must be an int >= 1, got {batches_per_call!r}")
        self.batches_per_call = batches_per_call
        if not isinstance(graph, CSRGraph):
            raise TypeError(f"GPUNeighborSampler: graph must be a CSRGraph, got {type(graph).__name__}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type not in ("cuda", "cpu"):
            raise ValueError(f"GPUNeighborSampler: device must be a CUDA device (or 'cpu'), got {device}")
        if graph.device.type != "unified" and graph.device != device:
            raise ValueError(f"GPUNeighborSampler: the graph is on {graph.device}; put it in unified "
                             f"memory (graph.to('unified')) or on {device}")
        self.graph = graph
        self.device = device
        self._rowptr, self._col = on_device(graph.rowptr, device), on_device(graph.col, device)
        self.fanouts = _check_fanouts(fanouts)
        self.return_edge_ids = bool(return_edge_ids)
        self.reseed(seed)

    reseed = NeighborSampler.reseed

    def take_streams(self, n: int) -> int:
        """Reserve the random streams of the next ``n`` batches; the first one's number. A
        batch sampled with ``sample(seeds, stream=first + j)`` is the one the ``j``-th call of
        plain ``sample`` would have drawn, so threads can share an epoch's batches."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"take_streams: n must be an int >= 0, got {n!r}")
        first = self._next_stream
        self._next_stream += n
        return first

    def sample(self, seeds, *, stream: int | None = None) -> SampledBatch:
        """Sample one batch rooted at ``seeds`` (distinct node ids); results on ``self.device``.
        ``stream``: the batch's random stream, one that :meth:`take_streams` reserved (default:
        the next one)."""
        seeds = seed_tensor(seeds)
        if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)
                                   or not 0 <= stream < self._next_stream):
            raise ValueError(f"stream must be an int that take_streams reserved (below {self._next_stream}), "
                             f"got {stream!r}")
        seeds = seeds.to(self.device).long()
        if stream is None:
            stream = self._next_stream
            self._next_stream += 1
        n_id, hops = _sampler._sample_blocks(self._rowptr, self._col, seeds, self.fanouts,
                                       self.seed % 2**64, stream, self.return_edge_ids)
        return self._batch(n_id, hops, seeds.numel())

    def sample_batches(self, batches) -> list[SampledBatch]:
        """The batches rooted at each of ``batches`` (lists or tensors of distinct node ids), the
        same as one :meth:`sample` call each in turn, with every hop's steps run once over all of
        them: fewer kernel launches and host waits per batch."""
        seeds = [seed_tensor(b).to(self.device).long() for b in batches]
        if not seeds:
            return []
        first = self.take_streams(len(seeds))
        raw = _sampler._sample_blocks_many(self._rowptr, self._col, seeds, self.fanouts, self.seed % 2**64,
                                           list(range(first, first + len(seeds))), self.return_edge_ids)
        return [self._batch(n_id, hops, s.numel()) for (n_id, hops), s in zip(raw, seeds)]

    def _batch(self, n_id, hops, batch_size: int) -> SampledBatch:
        eids = self.graph.edge_ids
        blocks = []
        for edge_index, slots, n_src, n_dst in hops:
            if slots is not None and eids is not None:
                slots = torch.index_select(eids, 0, slots)
            blocks.append(Block(edge_index, slots, (n_src, n_dst)))
        return SampledBatch(n_id, blocks, batch_size)

    def loader(self, node_ids, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
               generator: torch.Generator | None = None) -> Iterator[SampledBatch]:
        """Iterate over ``node_ids`` in batches of ``batch_size`` seeds."""
        for seeds in seed_batches(torch.as_tensor(node_ids), batch_size, shuffle=shuffle, drop_last=drop_last,
                                  generator=generator):
            yield self.sample(seeds)

    def __repr__(self) -> str:
        return f"GPUNeighborSampler({self.graph!r}, fanouts={self.fanouts}, device={self.device})"
