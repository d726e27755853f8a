"""The training step as one CUDA graph (``train --cuda-graph``).

A step over a sampled batch is a few hundred small kernels: each block's gather and scatter,
its linear layers, the loss, all of their backward, the optimizer. On papers100M-like each of
them is short, and the host's launches set the step's pace. Captured once as a CUDA graph, the
step is replayed with one launch per batch.

A graph has fixed shapes, and no two batches have the same: :class:`PaddedBatch` holds static
buffers of fixed capacities and copies each batch into them, padded so that the logits and
gradients of the batch's own rows are those of the batch alone:

- feature rows past the batch's nodes are zeros;
- each block's edges past its own run to the block's padding target rows, those past the
  batch's targets (every target capacity is one more than any batch it takes); they are
  spread over those rows and their sources over all source rows, so that no row takes a
  long run of them (a run of equal indices serialises a scatter's atomics and the sorted
  accumulation of an indexing backward: one row taking every padding edge once made the
  step several times slower than eager on papers100M-like);
- labels past the seeds are -1, which the loss ignores; so a padding row's logits get a
  gradient of exactly zero, and so does everything that only padding rows read: a padding
  edge adds zero to the gradient of the source row it reads.

:class:`GraphedStep` runs the first ``warmup`` batches eagerly, sets the capacities to the
largest sizes they had plus a margin (by default each size's from its spread: :func:`auto_margins`),
warms the step up on a side stream (the model and the optimizer are put back as they were
after), captures it and replays it from then on. A batch
larger than a capacity takes the eager step (counted in ``misses``). Where the capture fails
(an op that waits for the host, say), the run continues eagerly and ``note`` says why.

With ``buffers=2`` there are two sets of buffers, each with a graph of its own (captured in a
memory pool of its own), used in turn: a batch is copied into one set on a stream of its own
while the graph of the other set still runs, so the copies leave the training stream's path.
The copy waits for the batch's own ``ready`` event (set by the pipelined loader; without one,
for the training stream's work so far) and for the last replay that read that set.

The copy into the buffers is one call into C++ that runs without the GIL (``_aggregate.
PaddedBuffers.fill``, ``padded.py``), so the training loop takes the GIL once for it instead of once
an op while the loader's Python threads want it too. On a GPU that call is a memcpy of the
features, a memset of their padding and one kernel for every block's edges and the labels: the
loop's time from a batch's arrival to its replay's launch is time a training stream that waited
for the batch stands idle. The experimental setting ``step_host=fused_waits`` also issues, with
two sets, the fill stream's waits and the training stream's wait for the copy from that call;
``step_host=aten`` issues ATen ops from it, and ``step_host=python`` one Python call an op.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

from . import _aggregate
from .evaluation import correct_count
from .padded import PaddedBatch, batch_sizes, step_host  # noqa: F401  (PaddedBatch, batch_sizes: graphed's too)


# The parts of a replayed step's host side that GraphedStep times: checking the batch against the
# capacities, copying it into the buffers (with two sets: the waits and the copy on the fill
# stream), the replay's launch, and (two sets) the event after it; and, within the fill, the copy
# call's own time as it measures it without the GIL (``fill_inside``: the fused copy only).
HOST_PARTS = ("fits", "fill", "fill_inside", "replay", "record")


AUTO_MARGIN_FLOOR, AUTO_MARGIN_CAP, AUTO_MARGIN_SPREADS = 0.02, 0.1, 4.0


def auto_margins(seen) -> list[list[float]]:
    """Each block's margin for each size (as :func:`batch_sizes`: sources, targets, edges) over
    the largest of the warm-up batches' sizes ``seen`` when no margin is given: that size's
    relative spread over the warm-up batches times ``AUTO_MARGIN_SPREADS``, within
    [``AUTO_MARGIN_FLOOR``, ``AUTO_MARGIN_CAP``]. Each replay computes at full capacity, so a
    size that hardly varies (papers100M-like's, within about 0.5% of the largest warm-up batch's)
    gets a tight fit, and one that varies widely the room that keeps most batches from taking
    the eager step. The run's ``misses`` and ``fill`` say how it went."""
    margins = []
    for i in range(len(seen[0])):
        block = []
        for k in range(3):
            values = [s[i][k] for s in seen]
            spread = (max(values) - min(values)) / max(values) if max(values) else 0.0
            block.append(min(AUTO_MARGIN_CAP, max(AUTO_MARGIN_FLOOR, AUTO_MARGIN_SPREADS * spread)))
        margins.append(block)
    return margins


class StepTally:
    """The loop's running sums over an epoch's steps, on ``device``: the loss times each batch's
    size (``loss``) and the seeds whose top logit is their label (``correct``). Added to without
    a host wait, in one call without the GIL (under ``step_host=python``, a Python call an op)."""

    def __init__(self, device):
        self.loss = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.long, device=device)
        self.fused = step_host() != "python"

    def add(self, loss, logits, y, batch_size: int) -> None:
        if self.fused:
            _aggregate.tally_step(self.loss, self.correct, loss, logits, y, batch_size)
        else:
            self.loss += loss.detach() * batch_size
            self.correct += correct_count(logits, y)


def eager_step(model, opt, b):
    """One training step on batch ``b``: (loss, the seeds' logits), both detached.

    Detached, so that no autograd graph outlives its step: a graph kept alive keeps the
    parameters' AccumulateGrad nodes, which remember the stream they were made on, and a later
    capture whose gradients reach them from its own stream is invalidated."""
    opt.zero_grad(set_to_none=True)
    out = model(b.x, b.adjs)[:b.batch_size]   # the seeds' rows come first
    loss = F.cross_entropy(out, b.y, ignore_index=-1)
    loss.backward()
    opt.step()
    return loss.detach(), out.detach()


class GraphedStep:
    """The training step of ``model`` and ``opt`` (built with ``capturable=True``), replayed as a
    CUDA graph once ``warmup`` batches have set the capacities. Called with a batch, it returns
    (loss, the seeds' logits), as :func:`eager_step`; the tensors of a replay are overwritten by
    the next one, so read them on the same stream before it (the training loop does)."""

    def __init__(self, model, opt, batch_size: int, *, warmup: int = 3, margin: float | str | None = "auto",
                 buffers: int = 1):
        margin = "auto" if margin is None else margin
        if buffers not in (1, 2):
            raise ValueError(f"GraphedStep: buffers must be 1 or 2, got {buffers!r}")
        if warmup < 1:
            raise ValueError(f"GraphedStep: warmup must be >= 1, got {warmup}")
        if margin != "auto" and not (isinstance(margin, (int, float)) and margin >= 0):
            raise ValueError(f"GraphedStep: margin must be 'auto' or a number >= 0, got {margin!r}")
        self.model, self.opt, self.batch_size = model, opt, batch_size
        self.warmup, self.margin, self.buffers = warmup, margin, buffers
        self.seen: list = []
        self.bufs: list[PaddedBatch] = []
        self.graphs: list = []
        self.outs: list = []
        self.note = ""
        self.replays = self.misses = self.eager = 0
        self.margin_used = None   # per block, each size's margin the capacities took
        self._filled = None   # per block, the replayed batches' (sources, edges) summed: their fill
        self._turn = 0
        self._fill_stream = None   # with two sets: the copies' stream
        self._released: list = []   # with two sets: per set, the event after the last replay that read it
        # per part of a replayed step's host side, the [wall, this thread's CPU] seconds summed:
        # where the loop's time in a step call goes, and which part waits off the CPU
        self.host_parts = {p: [0.0, 0.0] for p in HOST_PARTS}
        # a timing.Timer (the training loop's): with two sets, the training stream's wait for each
        # replayed batch's copy, the part of the copy the last replay did not hide ("copy_wait")
        self.timer = None

    @property
    def graph(self):
        """The captured graph (of the first set of buffers), or None before the capture."""
        return self.graphs[0] if self.graphs else None

    def stats(self) -> dict:
        caps = self.bufs[0].caps if self.bufs else None
        fill = None
        if caps and self.replays:   # the mean share of each block's padded sources and edges a batch filled
            fill = [[round(f[0] / (c[0] * self.replays), 4), round(f[1] / (c[2] * self.replays), 4)]
                    for f, c in zip(self._filled, caps)]
        parts = {p: {"wall_s": round(w, 6), "cpu_s": round(c, 6)} for p, (w, c) in self.host_parts.items()}
        return {"replays": self.replays, "eager_steps": self.eager, "misses": self.misses,
                "host_parts": parts if self.replays else None,
                "capacities": [list(c) for c in caps] if caps else None, "margin": self.margin,
                "margin_used": self.margin_used,
                "fill": fill, "buffers": self.buffers, "note": self.note}

    def __call__(self, b):
        if self.graphs:
            t = (time.perf_counter(), time.thread_time())
            sizes = self.bufs[0].fits(b)
            if sizes:
                for f, s in zip(self._filled, sizes):
                    f[0] += s[0]
                    f[1] += s[2]
                k = self._turn
                self._turn = (k + 1) % len(self.graphs)
                t = self._part("fits", t)
                beside = self._fill_stream is not None
                self._add("fill_inside", self._fill_beside(k, b) if beside else self.bufs[k].fill(b))
                t = self._part("fill", t)
                self.graphs[k].replay()
                t = self._part("replay", t)
                if beside:
                    self._released[k].record()
                    self._part("record", t)
                self.replays += 1
                loss, out = self.outs[k]
                return loss, out[:b.batch_size]
            self.misses += 1
        elif not self.note:
            self.seen.append(batch_sizes(b))
        self.eager += 1
        out = eager_step(self.model, self.opt, b)
        if self.graph is None and not self.note and len(self.seen) >= self.warmup:
            self._capture(b)
        return out

    def capacities(self):
        """Each block's (sources, targets, edges) capacity: the largest seen plus its margin (kept
        in ``margin_used``), with a padding target row; the last block's targets are the seeds
        (the batch size plus one), a block's targets are the next one's sources, and a block has
        at least as many sources as targets (its targets are its first sources)."""
        n = len(self.seen[0])
        if self.margin == "auto":
            self.margin_used = auto_margins(self.seen)
        else:
            self.margin_used = [[float(self.margin)] * 3 for _ in range(n)]
        most = [[max(s[i][k] for s in self.seen) for k in range(3)] for i in range(n)]
        caps = [None] * n
        targets = self.batch_size + 1
        for i in reversed(range(n)):
            grow = [1.0 + m for m in self.margin_used[i]]
            sources = max(int(most[i][0] * grow[0]) + 1, targets)
            caps[i] = (sources, targets, int(most[i][2] * grow[2]) + 1)
            targets = sources
        return caps

    def _capture(self, b) -> None:
        model, opt = self.model, self.opt
        if not b.x.is_cuda:
            self.note = "no CUDA graph on the CPU: every step eager"
            return
        bufs = [PaddedBatch(self.capacities(), self.batch_size + 1, b.x.shape[1], b.x.dtype,
                            b.adjs[0][0].dtype, b.x.device) for _ in range(self.buffers)]
        buf = bufs[0]
        buf.fill(b)   # for the warm-up; a capture reads no buffer's contents, and every replay fills first
        saved_model = copy.deepcopy(model.state_dict())
        saved_opt = copy.deepcopy(opt.state_dict())
        rng = torch.cuda.get_rng_state(b.x.device)
        try:
            side = torch.cuda.Stream(b.x.device)
            side.wait_stream(torch.cuda.current_stream(b.x.device))
            with torch.cuda.stream(side):
                for _ in range(3):   # the warm-up a capture needs, on a side stream
                    self._padded_step(buf)
            torch.cuda.current_stream(b.x.device).wait_stream(side)
            # put back what the warm-up changed (in place: the graph reads these tensors)
            model.load_state_dict(saved_model)
            opt.load_state_dict(saved_opt)
            torch.cuda.set_rng_state(rng, b.x.device)
            graphs, outs = [], []
            for each in bufs:   # a graph per set, each in a pool of its own (none reads another's memory)
                graph = torch.cuda.CUDAGraph()
                opt.zero_grad(set_to_none=True)
                # thread_local: the loader's threads keep using CUDA (their own streams, host
                # syncs) while this thread captures; in the default global mode any such call
                # invalidates the capture.
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    outs.append(self._padded_step(each, zero_grad=False))
                graphs.append(graph)
        except Exception as e:   # an op that cannot be captured: the run goes on eagerly
            model.load_state_dict(saved_model)
            opt.load_state_dict(saved_opt)
            _release_generator(b.x.device, rng)
            self.note = f"the step could not be captured as a CUDA graph ({type(e).__name__}: {e}); every step eager"
            return
        self.bufs, self.graphs, self.outs = bufs, graphs, outs
        self._filled = [[0, 0] for _ in bufs[0].caps]
        if len(bufs) > 1:
            # at the training stream's priority: the copies are on the step's path
            self._fill_stream = torch.cuda.Stream(b.x.device, priority=torch.cuda.current_stream(b.x.device).priority)
            # recorded again at each replay; waiting on one not yet recorded waits for nothing
            self._released = [torch.cuda.Event() for _ in bufs]
            if bufs[0].waits_in_call:   # each set's copy done, recorded by the one call by its handle
                self._copied = [torch.cuda.Event() for _ in bufs]
                for ev in self._copied:
                    ev.record(self._fill_stream)   # created now, so that the handle exists

    def _add(self, name: str, wall_cpu) -> None:
        """Add (wall, CPU) seconds to part ``name`` (nothing for None: an untimed copy)."""
        if wall_cpu is not None:
            acc = self.host_parts[name]
            acc[0] += wall_cpu[0]
            acc[1] += wall_cpu[1]

    def _part(self, name: str, since: tuple) -> tuple:
        """Add the wall and CPU time from ``since`` to part ``name``; returns now's pair."""
        now = (time.perf_counter(), time.thread_time())
        self._add(name, (now[0] - since[0], now[1] - since[1]))
        return now

    def _fill_beside(self, k: int, b):
        """Copy batch ``b`` into set ``k`` on the fill stream, and make the training stream wait
        for the copy (not for anything before it). Returns what :meth:`PaddedBatch.fill` does."""
        cur = torch.cuda.current_stream(b.x.device)
        fs, buf = self._fill_stream, self.bufs[k]
        ready = getattr(b, "ready", None)
        if ready is None:   # no event of its own: the batch is whatever the training stream did so far
            ready = cur.record_event()
        if buf.waits_in_call:   # the waits, the copy and the training stream's wait for it in one call
            t = self.timer.start(cur) if self.timer is not None else None
            inside = buf.fill_beside(b, fs, cur, (ready, self._released[k]), self._copied[k])
        else:
            fs.wait_event(ready)
            fs.wait_event(self._released[k])
            with torch.cuda.stream(fs):
                inside = buf.fill(b)
            t = self.timer.start(cur) if self.timer is not None else None
            cur.wait_stream(fs)
        if t is not None:
            self.timer.stop("copy_wait", t, cur)
        return inside

    def _padded_step(self, buf: PaddedBatch, zero_grad: bool = True):
        if zero_grad:
            self.opt.zero_grad(set_to_none=True)
        out = self.model(buf.x, buf.adjs)[:buf.seeds]
        loss = F.cross_entropy(out, buf.y, ignore_index=-1)
        loss.backward()
        self.opt.step()
        return loss.detach(), out.detach()


def _release_generator(device, rng) -> None:
    """After a capture that failed, give ``device``'s default CUDA generator a state of its own
    again (``rng``'s seed and offset): the failed capture never ended its generator's capture,
    and later eager random ops (dropout) would be refused."""
    gen = torch.cuda.default_generators[torch.device(device).index or 0]
    try:
        fresh = torch.Generator(device=gen.device)
        fresh.set_state(rng)
        gen.graphsafe_set_state(fresh.graphsafe_get_state())
    except (AttributeError, RuntimeError):   # torch without graph-safe generator states
        torch.cuda.set_rng_state(rng, device)
