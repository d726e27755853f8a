"""Several gathering threads in flight (``PipelinedLoader(gather_workers=k)``): the sampled
batches are handed out one gather at a time, numbered; each thread makes its batches on a
stream of its own while the others make theirs, and puts them into the loader's queue in the
epoch's order.

Each thread's waits outside its gathers are kept as parts (``Turns.waits``, in the loader's
``gather_parts``): for a sampled batch to take (``thread_wait_sampled``: the sampling threads'
pace, or another gathering thread holding the hand-out), for its turn to queue its batches
(``thread_wait_turn``: a gather taken earlier not yet done) and for room in the queue
(``thread_wait_queue``: the training loop's pace)."""

from __future__ import annotations

import queue
import threading
import time

import torch

from .sampling import END, Failure, put
from .stages import Stages
from .timing import Parts, Timer


class Turns:
    """The gathering threads' shared state: the sampled batches are handed out one gather at a
    time, numbered, and each thread puts its batches into the queue in that order."""

    def __init__(self, stages: Stages, sampled):
        self.stages, self.sampled = stages, sampled
        self._take = threading.Lock()
        self._turn = threading.Condition()
        self.taken = 0        # gathers handed out
        self.done = 0         # gathers whose batches (or END, or a Failure) are in the queue
        self.ended = False    # the sampled batches ran out, or drawing them failed
        self.waits = Parts()  # the threads' waits outside their gathers (the module's docstring)

    def take(self, stream):
        """``(number, sampled batches, error)`` of the next gather, drawn in ``stream``'s
        context; the batches are empty for the thread that finds the epoch's end, and None
        comes to every thread after it."""
        with self._take:
            if self.ended:
                return None
            n = self.taken
            self.taken += 1
            try:
                sbs = self.stages.take(self.sampled, stream)
            except BaseException as e:  # noqa: BLE001 - put in the queue in its turn
                self.ended = True
                return n, None, e
            self.ended = not sbs
            return n, sbs, None

    def wait(self, n: int, stop: threading.Event) -> bool:
        """Wait until gather ``n`` is next to go into the queue; False if stopped first."""
        with self._turn:
            while self.done != n:
                if stop.is_set():
                    return False
                self._turn.wait(0.05)
        return not stop.is_set()

    def next(self) -> None:
        with self._turn:
            self.done += 1
            self._turn.notify_all()


def gather_in_turn(stages: Stages, turns: Turns, stream, timer: Timer, q: queue.Queue,
                   stop: threading.Event) -> None:
    """A gathering thread's body: take a gather's sampled batches, make them on ``stream``
    while the other threads make theirs, and put them into the queue in the epoch's order. An
    error goes into the queue in its batch's turn."""
    waits = turns.waits
    with timer.thread_use("loader"):
        if stages.cuda:
            torch.cuda.set_device(stages.device)
        while not stop.is_set():
            t0 = time.perf_counter()
            got = turns.take(stream)
            waits.add("thread_wait_sampled", time.perf_counter() - t0)
            if got is None:
                return
            n, sbs, err = got
            items = []
            if err is None and sbs:
                try:
                    items = stages.make(sbs, timer, stream)
                except BaseException as e:  # noqa: BLE001 - handed to the training loop
                    err = e
            t0 = time.perf_counter()
            if not turns.wait(n, stop):
                return
            waits.add("thread_wait_turn", time.perf_counter() - t0)
            try:
                if err is not None:
                    turns.ended = True
                    put(q, Failure(err), stop)
                    return
                if not sbs:
                    put(q, END, stop)
                    return
                t0 = time.perf_counter()
                for item in items:
                    if not put(q, item, stop):
                        return
                waits.add("thread_wait_queue", time.perf_counter() - t0)
            finally:
                turns.next()
