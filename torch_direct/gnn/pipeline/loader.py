"""A pipelined mini-batch loader: sampling, feature gather and transfer of upcoming batches
overlap with the current training step.

    >>> with PipelinedLoader(sampler, store, ds.split["train"], 1024, labels=ds.y,
    ...                      device="cuda", prefetch=2) as loader:
    ...     for epoch in range(3):
    ...         for b in loader:                  # b.x, b.y, b.adjs, b.batch_size, b.n_id
    ...             loss = step(model, b)
    ...         print(loader.stats())             # busy and exposed seconds per stage

One producer thread per epoch samples a batch, gathers its features and moves its blocks and
labels to the device, then puts it into a queue of at most ``prefetch`` batches (with
``gather_workers=k``, k such threads take the sampled batches in turn, each on its own
stream, and queue them in order). On CUDA that
work is queued on a side stream; each batch carries an event recorded after its work, the
consumer's stream waits for that event, and every tensor of the batch gets ``record_stream``
of the consumer's stream, so the caching allocator cannot hand its memory to the producer
while the training step still reads it.

With ``merge_gathers=k`` the producer samples ``k`` batches, gathers the union of their nodes
in one sorted gather (a locality lever: each row read once, reads in address order) and gives
each batch its rows by position; batches and their features are the same as without it.

Stage times: ``busy`` is the time each stage took in the producer, summed over a stage's
threads (on a GPU the longer of its host time and its stream time between CUDA events;
``perf_counter`` on the CPU), ``wait`` the time the training loop stood waiting for a batch (the
loader's exposed time); ``exposed`` splits ``wait`` over the stages in proportion to their busy
time (with ``prefetch=0`` the stages run in the loop itself and all of their time is exposed).

An exception in the producer is raised again in the training loop (from ``next``). Breaking out
of an epoch and then starting a new one, ``close()`` or leaving the ``with`` block stop the
producer and join its thread (a broken-off epoch keeps prefetching until one of those);
dropping the loader stops it too. Stopping drops the queued batches, pinned buffers included.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from contextlib import contextmanager

import torch

from ..graph.sampler import seed_batches, seeds_per_shard
from .features import FeatureStore, check_device
from .sampling import END, Failure, put, sampling_threads, timed_samples
from .stages import STAGES, Batch, Stages, batch_tensors  # noqa: F401  (Batch, STAGES: the loader's)
from .timing import Timer, parts_since, split_by_busy
from .turns import Turns, gather_in_turn, gather_turns

STREAM_PRIORITIES = ("normal", "high")


def cuda_priority(name: str, what: str, cuda: bool) -> int:
    """The CUDA stream priority a ``STREAM_PRIORITIES`` name stands for: ``high`` the device's
    highest (CUDA's lower number is the higher priority), ``normal`` 0, and 0 off CUDA
    (``cuda`` False). Another name is refused on any device; ``what`` names it in the error."""
    if name not in STREAM_PRIORITIES:
        raise ValueError(f"{what} must be one of {', '.join(STREAM_PRIORITIES)}, got {name!r}")
    return torch.cuda.Stream.priority_range()[1] if cuda and name == "high" else 0


def _produce(stages: Stages, it, timer: Timer, q: queue.Queue, stop: threading.Event) -> None:
    """The producer thread's body. It holds no reference to the epoch or the loader, so
    dropping those (without close()) still stops it: a finalizer sets ``stop``."""
    with timer.thread_use("loader"):
        try:
            if stages.cuda:
                torch.cuda.set_device(stages.device)
            while not stop.is_set():
                item = next(it, None)
                if item is None:
                    break
                if not put(q, item, stop):
                    return
            put(q, END, stop)
        except BaseException as e:  # noqa: BLE001 - handed to the training loop
            put(q, Failure(e), stop)


class _Epoch:
    """The iterator of one epoch (see :class:`PipelinedLoader`)."""

    def __init__(self, stages: Stages, seeds: list, prefetch: int):
        self.stages = stages
        self.timer = Timer(stages.cuda, STAGES, host_floor=True)
        self.wait = 0.0
        self.batches = 0
        self.done = False
        self.num_batches = len(seeds)
        self.stop = threading.Event()
        self.threads: list = []    # the threads that make batches (none with prefetch=0)
        self.samplers: list = []   # (thread, queue) of each sampling thread
        if prefetch > 0 and stages.sample_ahead:
            # Sampling runs ahead in threads of its own (sampling.py): a batch's gather overlaps
            # the next one's sampling instead of following it.
            sampled, self.samplers = sampling_threads(stages, seeds, self.timer, prefetch, self.stop)
        else:  # sampled in the loader's thread, on its stream, as each batch is made
            sampled = timed_samples(stages.sample_iter(seeds), self.timer, stages.stream)
        workers = len(stages.gather_streams)
        turns = (Turns(stages, sampled, workers, gather_turns() == "deposit", self.stop)
                 if prefetch > 0 and workers > 1 else None)
        # where the gathers' time goes, and (several gathering threads) the threads' waits
        self.gather_parts = parts_since(stages.features, turns.waits if turns is not None else None)
        # the batches made one after another (in the loop, or in the one producer thread)
        self._it = stages.batch_iter(sampled, self.timer) if workers == 1 else None
        if prefetch > 0:
            self.q: queue.Queue = queue.Queue(maxsize=prefetch)
            if workers == 1:
                self.threads = [threading.Thread(target=_produce, name="torch_direct-loader", daemon=True,
                                                 args=(stages, self._it, self.timer, self.q, self.stop))]
            else:   # several gathers in flight, each thread's on its own stream (PipelinedLoader)
                self.threads = [threading.Thread(target=gather_in_turn, name=f"torch_direct-loader-{i}",
                                                 daemon=True,
                                                 args=(stages, turns, stream, self.timer, self.q))
                                for i, stream in enumerate(stages.gather_streams)]
            weakref.finalize(self, self.stop.set)
            for thread, _ in self.samplers:
                thread.start()
            for thread in self.threads:
                thread.start()

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self.num_batches

    def __next__(self) -> Batch:
        if self.done:
            raise StopIteration
        t0 = time.perf_counter()
        try:
            if not self.threads:
                item = next(self._it, None)
                if item is None:
                    item = END
            else:
                while True:
                    try:
                        item = self.q.get(timeout=0.1)
                        break
                    except queue.Empty:
                        # one of them always leaves an item (END or a Failure); be safe anyway
                        if not any(thread.is_alive() for thread in self.threads) and self.q.empty():
                            item = Failure(RuntimeError("loader thread ended without a result"))
                            break
        finally:
            self.wait += time.perf_counter() - t0
        if item is END:
            self.close()
            raise StopIteration
        if isinstance(item, Failure):
            self.close()
            raise item.exc
        batch, event = item
        if event is not None:
            cur = torch.cuda.current_stream(self.stages.device)
            cur.wait_event(event)
            for t in batch_tensors(batch):
                t.record_stream(cur)
            batch.ready = event   # for work on another stream (GraphedStep's copies with two buffer sets)
        self.batches += 1
        return batch

    def close(self) -> None:
        """Stop the producer (and the sampling thread) and join them (idempotent)."""
        self.done = True
        self.stop.set()
        mine = getattr(self, "q", None)   # the queue every batch-making thread puts into
        for thread, q in [(thread, mine) for thread in self.threads] + self.samplers:
            while thread.is_alive():
                _drain(q)                             # free queued batches (and pinned memory)
                thread.join(timeout=0.05)
            _drain(q)


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


class PipelinedLoader:
    """Batches of ``node_ids`` (seeds) with their sampled blocks, features and labels on ``device``.

    ``sampler``: a ``NeighborSampler`` (CPU threads) or ``GPUNeighborSampler``; ``features``:
    a :class:`~torch_direct.gnn.pipeline.features.FeatureStore`; ``labels``: node labels indexed
    by global id (or None). ``prefetch``: batches prepared ahead (the queue bound; 0 runs
    every stage in the training loop, no thread). ``merge_gathers``: batches whose feature
    gathers are merged into one (the union of their ``n_id``, gathered once in sorted order,
    each batch then taking its rows by position: fewer, more local reads); 1 = a gather per
    batch. Every batch's ``x`` equals ``x[n_id]`` either way. ``shuffle``/``generator``/``drop_last``
    as in a DataLoader. ``shard=(rank, world)``: this process's share of the seeds (of the same
    shuffled order on every rank; cut to the same length on every rank when shuffling, so that
    all take the same number of steps). ``sample_ahead``: sample in ``sample_ahead`` threads
    (``True``: one), each with a CUDA stream of its own, up to ``prefetch`` batches ahead of the
    gathering thread, so that one batch's gather overlaps the next one's sampling (more than one
    thread: a ``GPUNeighborSampler`` only; see ``sampling.py``); the batches are the same.
    ``stream_priority``: ``"high"`` puts the loader's CUDA streams at the device's highest priority, so that the
    GPU schedules their short kernels (sampling, gathers) ahead of the training step's waiting
    ones; ``"normal"`` (default) leaves them equal. ``gather_workers``: threads that gather and
    transfer batches (default 1), each on a CUDA stream of its own, taking the sampled batches
    in turn and queueing them in the epoch's order, so that a gather which makes its thread
    wait (a hybrid gather's CPU share, a cache's count of its misses) overlaps the next
    batch's; more than one needs ``sample_ahead`` (the sampling threads feed them). The batches
    are the same. Iterating starts an epoch; see the module docstring for streams, timing,
    errors and shutdown.
    """

    def __init__(self, sampler, features: FeatureStore, node_ids, batch_size: int, *, labels=None,
                 device=None, prefetch: int = 2, shuffle: bool = True, drop_last: bool = False,
                 generator: torch.Generator | None = None, merge_gathers: int = 1,
                 shard: tuple[int, int] | None = None, sample_ahead: bool | int = False,
                 stream_priority: str = "normal", gather_workers: int = 1):
        if not isinstance(features, FeatureStore):
            raise TypeError(f"PipelinedLoader: features must be a FeatureStore, got {type(features).__name__}")
        if not hasattr(sampler, "sample"):
            raise TypeError(f"PipelinedLoader: sampler must have .sample(seeds), got {type(sampler).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"PipelinedLoader: batch_size must be a positive int, got {batch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"PipelinedLoader: prefetch must be an int >= 0, got {prefetch!r}")
        if isinstance(merge_gathers, bool) or not isinstance(merge_gathers, int) or merge_gathers < 1:
            raise ValueError(f"PipelinedLoader: merge_gathers must be an int >= 1 (batches per gather), "
                             f"got {merge_gathers!r}")
        if shard is not None:
            if (not isinstance(shard, tuple) or len(shard) != 2 or not all(isinstance(v, int) for v in shard)
                    or not 0 <= shard[0] < shard[1]):
                raise ValueError(f"PipelinedLoader: shard must be (rank, world) with 0 <= rank < world, "
                                 f"got {shard!r}")
        ids = torch.as_tensor(node_ids)
        if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1:
            raise TypeError(f"PipelinedLoader: node_ids must be a 1-D int tensor, got {ids.dtype} "
                            f"of shape {tuple(ids.shape)}")
        self.sampler, self.features = sampler, features
        self.node_ids = ids.cpu().long()
        self.labels = None if labels is None else torch.as_tensor(labels)
        self.batch_size, self.prefetch, self.merge_gathers = batch_size, prefetch, merge_gathers
        self.shuffle, self.drop_last, self.generator = shuffle, drop_last, generator
        self.shard = shard
        self.device = features.device if device is None else check_device(device)
        self.cuda = self.device.type == "cuda"
        prio = cuda_priority(stream_priority, "PipelinedLoader: stream_priority", self.cuda)
        self.stream = torch.cuda.Stream(self.device, priority=prio) if self.cuda else None
        if isinstance(sample_ahead, bool):
            sample_ahead = int(sample_ahead)
        if not isinstance(sample_ahead, int) or sample_ahead < 0:
            raise ValueError(f"PipelinedLoader: sample_ahead must be a bool or an int >= 0 (sampling threads), "
                             f"got {sample_ahead!r}")
        if sample_ahead and prefetch == 0:
            raise ValueError("PipelinedLoader: sample_ahead needs prefetch > 0 (it is a thread of its own)")
        if sample_ahead > 1 and not hasattr(sampler, "take_streams"):
            raise ValueError(f"PipelinedLoader: sample_ahead={sample_ahead} needs a GPUNeighborSampler (its "
                             f"batches are drawn one at a time, each from a stream numbered by its place); "
                             f"{type(sampler).__name__} samples on every core already: use sample_ahead=1")
        if sample_ahead > 1 and getattr(sampler, "batches_per_call", 1) > 1:
            raise ValueError("PipelinedLoader: sample_ahead > 1 takes one batch per sampler call; the sampler "
                             f"groups {sampler.batches_per_call} (batches_per_call): use one or the other")
        if isinstance(gather_workers, bool) or not isinstance(gather_workers, int) or gather_workers < 1:
            raise ValueError(f"PipelinedLoader: gather_workers must be an int >= 1 (gathering threads), "
                             f"got {gather_workers!r}")
        if gather_workers > 1 and not sample_ahead:
            raise ValueError(f"PipelinedLoader: gather_workers={gather_workers} takes its batches from sampling "
                             f"threads: set sample_ahead (and prefetch > 0)")
        self.sample_ahead, self.gather_workers = sample_ahead, gather_workers
        self._stages = Stages(sampler, features, self.labels, self.device, self.stream,
                              merge_gathers, self.sample_ahead, prio, gather_workers)
        self._epoch: _Epoch | None = None
        self._last: dict | None = None

    def __len__(self) -> int:
        n = seeds_per_shard(self.node_ids.numel(), self.shard, self.shuffle)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _seed_batches(self) -> list[torch.Tensor]:
        return seed_batches(self.node_ids, self.batch_size, shuffle=self.shuffle, drop_last=self.drop_last,
                            generator=self.generator, shard=self.shard)

    # epochs ------------------------------------------------------------------------------------------
    def __iter__(self) -> _Epoch:
        self._finish_epoch()
        self._epoch = _Epoch(self._stages, self._seed_batches(), self.prefetch)
        return self._epoch

    def _finish_epoch(self) -> None:
        ep = self._epoch
        if ep is not None:
            ep.close()
            busy = ep.timer.totals()
            exposed = split_by_busy(ep.wait, busy)
            self._last = {"batches": ep.batches, "wait": ep.wait, "busy": busy, "exposed": exposed,
                          "threads": ep.timer.threads(), "gather_parts": ep.gather_parts()}
            self._epoch = None

    def stats(self) -> dict:
        """Times of the last finished (or stopped) epoch: ``batches``, ``wait`` (seconds the
        loop waited), ``busy`` and ``exposed`` (seconds per stage), ``threads`` (per role of
        the loader's threads, ``sample`` and ``loader``: how many, their CPU seconds and their
        wait for a core), ``gather_parts`` (host seconds and calls of named parts of the feature
        store's gathers in the epoch, summed over the threads). Ends a running epoch."""
        self._finish_epoch()
        return dict(self._last) if self._last else {"batches": 0, "wait": 0.0,
                                                     "busy": dict.fromkeys(STAGES, 0.0),
                                                     "exposed": dict.fromkeys(STAGES, 0.0), "threads": {}}

    def close(self) -> None:
        """Stop a running epoch and join its thread."""
        self._finish_epoch()

    def __enter__(self) -> "PipelinedLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class TrainingStream:
    """The CUDA stream the training steps run on (``--step-priority``): the current one, or with
    ``high`` one stream at the device's highest priority for the whole run (tensors the steps
    allocate stay in one stream's pool). ``active()`` runs a block on it, ordered after the
    current stream's work on entry and before its later work on exit. On the CPU, nothing
    changes."""

    def __init__(self, priority: str, device):
        self.device = device
        prio = cuda_priority(priority, "step priority", device.type == "cuda")
        self.stream = torch.cuda.Stream(device, priority=prio) if prio != 0 else None

    @contextmanager
    def active(self):
        if self.stream is None:
            yield
            return
        before = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(before)
        with torch.cuda.stream(self.stream):
            yield
        before.wait_stream(self.stream)
