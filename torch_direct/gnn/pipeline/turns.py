"""Several gathering threads in flight (``PipelinedLoader(gather_workers=k)``): the sampled
batches are handed out one gather at a time, numbered; each thread makes its batches on a
stream of its own while the others make theirs, and they go into the loader's queue in the
epoch's order.

How a thread whose gather is done before an earlier one queues its batches is the experimental
setting ``gather_turns``: ``wait`` (the default) waits for its turn and puts them into the queue
itself; ``deposit`` leaves them with the others' and goes on to take the next gather, and
whichever thread finds the next gather's batches in order puts them into the queue. With
``deposit`` at most twice as many gathers as threads are taken and not yet queued, which bounds
the batches held on the device. The batches and their order are the same either way.

Each thread's waits outside its gathers are kept as parts (``Turns.waits``, in the loader's
``gather_parts``): for a sampled batch to take (``thread_wait_sampled``: the sampling threads'
pace, or another gathering thread holding the hand-out), for its turn (``thread_wait_turn``: a
gather taken earlier not yet done; with ``deposit``, the wait for the bound on gathers taken
ahead) and for room in the queue (``thread_wait_queue``: the training loop's pace)."""

from __future__ import annotations

import queue
import threading
import time

import torch

from .sampling import END, Failure, put
from .stages import Stages
from .timing import Parts, Timer


TURNS = ("wait", "deposit")


def gather_turns() -> str:
    """The experimental setting gather_turns: "wait" (unset: the default) or "deposit"."""
    import torch_direct
    return torch_direct.experimental_setting("gather_turns", choices=TURNS, default="wait")


class Turns:
    """The gathering threads' shared state: the sampled batches are handed out one gather at a
    time, numbered, and go into the queue in that order (``deposit``: the module's docstring)."""

    def __init__(self, stages: Stages, sampled, workers: int = 1, deposit: bool = False,
                 stop: threading.Event | None = None):
        self.stages, self.sampled = stages, sampled
        self.stop = stop if stop is not None else threading.Event()
        self._take = threading.Lock()
        self._turn = threading.Condition()
        self.taken = 0        # gathers handed out
        self.done = 0         # gathers whose batches (or END, or a Failure) are in the queue
        self.ended = False    # the sampled batches ran out, or drawing them failed
        self.waits = Parts()  # the threads' waits outside their gathers (the module's docstring)
        self.deposit = deposit
        self.ahead = 2 * workers   # deposit: gathers taken and not yet queued, at most
        self._ready: dict = {}     # deposit: gather number -> what goes into the queue for it
        self._putting = False      # deposit: a thread is putting gathers into the queue

    def take(self, stream):
        """``(number, sampled batches, error)`` of the next gather, drawn in ``stream``'s
        context; the batches are empty for the thread that finds the epoch's end, and None
        comes to every thread after it (and, with ``deposit``, once the loader stops). Its waits
        are timed: for the hand-out and the sampled batches, and with ``deposit`` for room."""
        t0 = time.perf_counter()
        room = 0.0
        try:
            with self._take:
                if self.deposit:
                    t1 = time.perf_counter()
                    if not self._room():
                        return None
                    room = time.perf_counter() - t1
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
        finally:
            self.waits.add("thread_wait_sampled", time.perf_counter() - t0 - room)
            if self.deposit:
                self.waits.add("thread_wait_turn", room)

    def _until(self, ready) -> bool:
        """Wait until ``ready()`` holds (called under the turn's lock); False if the loader
        stops first."""
        with self._turn:
            while not ready():
                if self.stop.is_set():
                    return False
                self._turn.wait(0.05)
        return not self.stop.is_set()

    def wait(self, n: int) -> bool:
        """Wait until gather ``n`` is next to go into the queue; False if stopped first."""
        return self._until(lambda: self.done == n)

    def next(self) -> None:
        with self._turn:
            self.done += 1
            self._turn.notify_all()

    def _room(self) -> bool:
        """deposit: wait until fewer than ``ahead`` gathers are taken and not yet queued; False
        if the loader stops first."""
        return self._until(lambda: self.taken - self.done < self.ahead)

    def put(self, entries: list, batches: bool, q: queue.Queue) -> bool:
        """Put one gather's entries into the queue (timed as the wait for the queue when they
        are batches); False if the loader stops first."""
        t0 = time.perf_counter()
        for item in entries:
            if not put(q, item, self.stop):
                return False
        if batches:
            self.waits.add("thread_wait_queue", time.perf_counter() - t0)
        return True

    def hand_over(self, n: int, entries: list, batches: bool, q: queue.Queue) -> bool:
        """deposit: leave gather ``n``'s entries (its batches, or END, or a Failure) to be put
        into the queue in their turn, and put every gather that is next in order unless another
        thread is doing so; False if the loader stops first."""
        with self._turn:
            self._ready[n] = (entries, batches)
            if self._putting:
                return True
            self._putting = True
        while True:
            with self._turn:
                entries, batches = self._ready.pop(self.done, (None, False))
                if entries is None:
                    self._putting = False
                    return True
            if not self.put(entries, batches, q):
                return False
            self.next()


def gather_in_turn(stages: Stages, turns: Turns, stream, timer: Timer, q: queue.Queue) -> None:
    """A gathering thread's body: take a gather's sampled batches, make them on ``stream``
    while the other threads make theirs, and put them into the queue in the epoch's order. An
    error goes into the queue in its batch's turn."""
    with timer.thread_use("loader"):
        if stages.cuda:
            torch.cuda.set_device(stages.device)
        while not turns.stop.is_set():
            got = turns.take(stream)
            if got is None:
                return
            n, sbs, err = got
            items = []
            if err is None and sbs:
                try:
                    items = stages.make(sbs, timer, stream)
                except BaseException as e:  # noqa: BLE001 - handed to the training loop
                    err = e
            if err is not None:
                turns.ended = True
                entries = [Failure(err)]
            else:
                entries = items if sbs else [END]
            batches = err is None and bool(sbs)
            if turns.deposit:
                if not turns.hand_over(n, entries, batches, q) or not batches:
                    return
                continue
            t0 = time.perf_counter()
            if not turns.wait(n):
                return
            turns.waits.add("thread_wait_turn", time.perf_counter() - t0)
            try:
                if not turns.put(entries, batches, q):
                    return
            finally:
                turns.next()
            if not batches:
                return
