"""The stages of one batch: sample its blocks, gather its features, move it to the device.
The pipelined loader (``pipeline/loader.py``) runs them in its threads and CUDA streams."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .features import stream_context
from .timing import Timer

STAGES = ("sample", "gather", "transfer")


@dataclass
class Batch:
    """One mini-batch on the device: features ``x`` of every sampled node (``n_id``
    order), labels ``y`` of the ``batch_size`` seeds (or None), and the model-order
    blocks ``adjs`` (``(edge_index, e_id, (n_src, n_dst))``, PyG's layout)."""

    x: torch.Tensor
    y: torch.Tensor | None
    adjs: list
    batch_size: int
    n_id: torch.Tensor
    # the CUDA event after which the tensors above are ready (set by the pipelined loader; None:
    # ready on the consumer's stream)
    ready: object = None


def sampled_tensors(sb):
    """The tensors of a sampled batch (for ``record_stream``)."""
    yield sb.n_id
    for h in sb.hops:
        yield h.edge_index
        if h.e_id is not None:
            yield h.e_id


def batch_tensors(b: Batch):
    """The tensors of a batch (for ``record_stream``)."""
    yield b.x
    yield b.n_id
    if b.y is not None:
        yield b.y
    for edge_index, e_id, _ in b.adjs:
        yield edge_index
        if e_id is not None:
            yield e_id


class Stages:
    """What the producer needs to make a batch: sampler, store, labels, device, side stream,
    and how many batches share one merged feature gather (``merge``; 1 = none)."""

    def __init__(self, sampler, features, labels, device, stream, merge: int = 1, sample_ahead: int = 0,
                 stream_priority: int = 0, gather_workers: int = 1):
        self.sampler, self.features, self.labels = sampler, features, labels
        self.device, self.stream = device, stream
        self.cuda = device.type == "cuda"
        self.merge = merge
        # Sampling in sample_ahead threads of its own (0: in the producer), each on a stream of
        # its own on CUDA.
        self.sample_ahead = int(sample_ahead)
        self.sample_streams = [torch.cuda.Stream(device, priority=stream_priority) if self.cuda else None
                               for _ in range(self.sample_ahead)]
        # The gathering threads' streams: the first is ``stream``, each other thread has its own.
        self.gather_streams = [stream] + [torch.cuda.Stream(device, priority=stream_priority) if self.cuda
                                          else None for _ in range(int(gather_workers) - 1)]

    def sample_iter(self, seeds):
        # a CPU sampler samples a group of batches on its threads; the GPU sampler groups
        # batches_per_call of them into each hop's steps
        many = getattr(self.sampler, "sample_batches", None)
        group = getattr(self.sampler, "batches_per_call", None) or max(1, torch.get_num_threads())
        if many is None or group == 1:
            many, group = None, 1
        for first in range(0, len(seeds), group):
            chunk = seeds[first:first + group]
            yield from (many(chunk) if many is not None else [self.sampler.sample(s) for s in chunk])

    def sample_shares(self, seeds) -> list:
        """One iterator per sampling thread: thread i samples batches i, i + k, ... of the
        epoch, each from the random stream it would have had in order (the epoch's streams are
        taken from the sampler up front)."""
        k = self.sample_ahead
        if k <= 1:
            return [self.sample_iter(seeds)]
        first = self.sampler.take_streams(len(seeds))
        return [(self.sampler.sample(seeds[j], stream=first + j) for j in range(i, len(seeds), k))
                for i in range(k)]

    def batch_iter(self, it, timer: Timer):
        """The epoch's ``(Batch, event)`` items, made from the sampled batches of ``it``."""
        while True:
            sbs = self.take(it)
            if not sbs:
                return
            yield from self.make(sbs, timer)

    def _ctx(self, stream):
        return stream_context(stream, self.device)

    def take(self, it, stream=None) -> list:
        """The sampled batches of one gather from ``it``: ``merge`` of them (fewer at the end of
        the epoch, none after it), drawn in ``stream``'s context (default: the loader's), on
        which a sampling thread's batch is then ready."""
        with self._ctx(self.stream if stream is None else stream):
            sbs = []
            for _ in range(self.merge):
                sb = next(it, None)
                if sb is None:
                    break
                sbs.append(sb)
        return sbs

    def make(self, sbs: list, timer: Timer, stream=None) -> list:
        """The ``(Batch, event)`` items of sampled batches ``sbs`` (one gather's, from
        :meth:`take`), their work queued on ``stream`` (default: the loader's)."""
        stream = self.stream if stream is None else stream
        if self.merge <= 1:
            return [self.make_batch(sb, timer, stream) for sb in sbs]
        return self.make_window(sbs, timer, stream)

    def make_window(self, sbs: list, timer: Timer, stream) -> list:
        """Gather the union of the nodes of sampled batches ``sbs`` in one ordered gather (each
        row read once), and let every batch take its rows by position."""
        with self._ctx(stream):
            t = timer.start(stream)
            union, pos = torch.unique(torch.cat([sb.n_id for sb in sbs]), sorted=True, return_inverse=True)
            rows = self.features.gather(union, self.device, stream=stream)
            pos = pos.to(self.device, non_blocking=self.cuda)
            xs, at = [], 0
            for sb in sbs:
                k = sb.n_id.numel()
                xs.append(rows.index_select(0, pos[at:at + k]))
                at += k
            del rows, pos
            timer.stop("gather", t, stream)
        return [self.finish_batch(sb, x, timer, stream) for sb, x in zip(sbs, xs)]

    def make_batch(self, sb, timer: Timer, stream):
        """Gather and transfer sampled batch ``sb``."""
        with self._ctx(stream):
            t = timer.start(stream)
            x = self.features.gather(sb.n_id, self.device, stream=stream)
            timer.stop("gather", t, stream)
        return self.finish_batch(sb, x, timer, stream)

    def finish_batch(self, sb, x, timer: Timer, stream):
        """Move a batch's blocks, ids and labels to the device, on ``stream``; the batch and
        its event."""
        with self._ctx(stream):
            t = timer.start(stream)
            nb = self.cuda
            n_id = sb.n_id.to(self.device, non_blocking=nb)
            adjs = [(ei.to(self.device, non_blocking=nb),
                     None if e is None else e.to(self.device, non_blocking=nb), size)
                    for ei, e, size in sb.adjs]
            y = None
            if self.labels is not None:
                seeds = sb.n_id[:sb.batch_size]
                y = self.labels[seeds.to(self.labels.device)].to(self.device, non_blocking=nb)
            timer.stop("transfer", t, stream)
            event = None
            if self.cuda:
                event = torch.cuda.Event()
                event.record(stream)
        return Batch(x, y, adjs, sb.batch_size, n_id), event
