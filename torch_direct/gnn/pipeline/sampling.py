"""The sampling side of the pipelined loader: the sampled batches of an epoch, timed as the
``sample`` stage, drawn in the producer's own thread or ahead of it in threads of their own.

With ``sample_ahead=k`` (k >= 1), k sampling threads each take every k-th batch, on a CUDA
stream of their own, and queue it with an event recorded after its work; the producer takes
them back in order. One thread overlaps a batch's sampling with the previous batch's gather.
More than one also overlaps the GPU sampler's host waits (it reads each hop's sizes back)
with another batch's kernels. Each batch draws from its own random stream, numbered by its
place in the epoch, so the batches are the same for any k.
"""

from __future__ import annotations

import queue
import threading
from contextlib import nullcontext

import torch

from .stages import Stages, sampled_tensors
from .timing import Timer

END = object()


class Failure:
    """An exception raised in a loader thread, handed on to the thread that reads its queue."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def put(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; whether it went in."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def timed_samples(it, timer: Timer, stream):
    """The sampled batches of ``it``, each draw timed as the ``sample`` stage on ``stream``
    (drawing from ``it`` is the sampling; it runs in the caller's stream context)."""
    while True:
        t = timer.start(stream)
        sb = next(it, None)
        if sb is None:
            return
        timer.stop("sample", t, stream)
        yield sb


def _sample_thread(stages: Stages, it, stream, timer: Timer, q: queue.Queue, stop: threading.Event) -> None:
    """A sampling thread's body: its share of the epoch's sampled batches, each with an event
    recorded on its stream after its work, into ``q``."""
    with timer.thread_use("sample"):
        try:
            if stages.cuda:
                torch.cuda.set_device(stages.device)
            ctx = torch.cuda.stream(stream) if stages.cuda else nullcontext()
            samples = timed_samples(it, timer, stream)
            with ctx:
                while not stop.is_set():
                    sb = next(samples, None)
                    if sb is None:
                        break
                    event = None
                    if stages.cuda:
                        event = torch.cuda.Event()
                        event.record(stream)
                    if not put(q, (sb, event), stop):
                        return
            put(q, END, stop)
        except BaseException as e:  # noqa: BLE001 - handed to the producer, then the training loop
            put(q, Failure(e), stop)


def _in_turn(queues: list, stages: Stages, stop: threading.Event):
    """The sampled batches of the sampling threads' queues, taken in turn (the epoch's order),
    each made safe to use on the stream current where it is drawn (a gathering thread's: it
    waits for the batch's event, and the batch's tensors record it)."""
    turn = 0
    while True:
        try:
            item = queues[turn].get(timeout=0.05)
        except queue.Empty:
            if stop.is_set():
                return
            continue
        if item is END:
            return   # the thread whose turn it was has no batch left, so none of the others has
        if isinstance(item, Failure):
            raise item.exc
        turn = (turn + 1) % len(queues)
        sb, event = item
        if event is not None:
            stream = torch.cuda.current_stream(stages.device)
            stream.wait_event(event)
            for t in sampled_tensors(sb):
                if t.is_cuda:                         # the GPU sampler's; a CPU sampler's are host tensors
                    t.record_stream(stream)
        yield sb


def sampling_threads(stages: Stages, seeds: list, timer: Timer, prefetch: int, stop: threading.Event):
    """``(sampled batches in order, [(thread, queue)])`` for ``stages.sample_ahead`` threads,
    each queueing up to ``prefetch`` batches; the threads are not started."""
    shares = stages.sample_shares(seeds)
    threads = []
    for i, (share, stream) in enumerate(zip(shares, stages.sample_streams)):
        q: queue.Queue = queue.Queue(maxsize=prefetch)
        name = "torch_direct-sampler" if len(shares) == 1 else f"torch_direct-sampler-{i}"
        threads.append((threading.Thread(target=_sample_thread, name=name, daemon=True,
                                         args=(stages, share, stream, timer, q, stop)), q))
    return _in_turn([q for _, q in threads], stages, stop), threads
