"""How the training loop and the loader measure time: one timer, one way to split the
epoch's exposed time over the loader stages, and a profiler over a window of steps."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import torch_direct


class Parts:
    """Host seconds and calls of named parts of a feature store's gathers, summed over the
    threads that gather (a lock guards them): where a gathering thread's time goes, such as
    the wait for a cache lookup's misses or the hybrid gather's call."""

    def __init__(self):
        self._lock = threading.Lock()
        self._parts: dict = {}

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            s, n = self._parts.get(name, (0.0, 0))
            self._parts[name] = (s + seconds, n + 1)

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._parts)


def parts_since(store, extra: "Parts | None" = None):
    """A function that gives ``{part: {"s": seconds, "calls": n}}`` of ``store``'s gathers (a
    cached store's and the store under it, and the process's hybrid gathers), and of ``extra``'s
    parts, since this call."""
    def now() -> dict:
        out, seen = torch_direct.hybrid_gather_parts(), set()
        if extra is not None:
            out.update(extra.snapshot())
        st = store
        while st is not None and id(st) not in seen:
            seen.add(id(st))
            if isinstance(getattr(st, "parts", None), Parts):
                out.update(st.parts.snapshot())
            st = getattr(st, "store", None)
        return out
    start = now()

    def since() -> dict:
        got = {}
        for name, (s, n) in now().items():
            s0, n0 = start.get(name, (0.0, 0))
            if n > n0:
                got[name] = {"s": s - s0, "calls": n - n0}
        return got
    return since


class Timer:
    """Seconds spent in timed sections, summed per key.

    On the CPU each section is timed by ``perf_counter``. On CUDA by a pair of events on
    ``stream`` (default: the current stream), read only by :meth:`totals`, so timing never
    makes the host wait for the GPU mid-epoch. With ``host_floor`` a CUDA section counts the
    longer of its host time and its stream time: a loader stage then counts its CPU work
    (sampling threads, CPU slicing) and its GPU work alike. Without it, the stream time
    alone: a training step is the GPU's time for it, however far ahead the host launched it.
    ``blocking`` events make :meth:`totals` sleep rather than spin while it waits, so that
    the host's CPU time counts the timed work only (benchmarks). ``host_seconds`` sums each
    key's host time alone, on every device: where it nears the stream time of a CUDA section,
    the host's pace, not the GPU's, set that section's length.
    """

    def __init__(self, cuda: bool, keys=(), host_floor: bool = False, blocking: bool = False):
        self.cuda, self.host_floor, self.blocking = bool(cuda), host_floor, blocking
        self.seconds = dict.fromkeys(keys, 0.0)
        self.host_seconds = dict.fromkeys(keys, 0.0)
        self.events: list = []
        self._lock = threading.Lock()   # several sampling threads stop sections of one key
        self._threads: dict = {}

    def start(self, stream=None):
        ev = None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True, blocking=self.blocking)
            ev.record(stream)
        return ev, time.perf_counter()

    def stop(self, key: str, start, stream=None) -> float:
        """End the section ``start`` began under ``key``; returns its host seconds."""
        ev0, t0 = start
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True, blocking=self.blocking)
            ev.record(stream)
            host = time.perf_counter() - t0
            self.events.append((key, ev0, ev, host))
        else:
            host = time.perf_counter() - t0
        with self._lock:
            self.host_seconds[key] = self.host_seconds.get(key, 0.0) + host
            if not self.cuda:
                self.seconds[key] = self.seconds.get(key, 0.0) + host
        return host

    def totals(self) -> dict:
        """Seconds per key so far (waits for the GPU to reach the last recorded event)."""
        for key, a, b, host in self.events:
            b.synchronize()
            dev = a.elapsed_time(b) / 1e3
            self.seconds[key] = self.seconds.get(key, 0.0) + (max(host, dev) if self.host_floor else dev)
        self.events.clear()
        return dict(self.seconds)

    def total(self) -> float:
        """Seconds over every key."""
        return sum(self.totals().values())

    @contextmanager
    def thread_use(self, role: str):
        """Count the calling thread's CPU seconds and its wait for a core (run delay) over a
        block, summed per ``role`` with the other threads of that role (``threads()``)."""
        c0, d0 = time.thread_time(), thread_run_delay()
        try:
            yield
        finally:
            cpu, d1 = time.thread_time() - c0, thread_run_delay()
            with self._lock:
                use = self._threads.setdefault(role, {"threads": 0, "cpu_s": 0.0, "run_delay_s": 0.0})
                use["threads"] += 1
                use["cpu_s"] += cpu
                if d0 is None or d1 is None or use["run_delay_s"] is None:
                    use["run_delay_s"] = None
                else:
                    use["run_delay_s"] += d1 - d0

    def threads(self) -> dict:
        """Per role of the threads that ran under ``thread_use``: their number, CPU seconds and
        seconds waiting for a core (None where the kernel does not say)."""
        with self._lock:
            return {k: dict(v) for k, v in self._threads.items()}


GIL_PROBE_EVERY = 8   # the training loop's GIL probe samples every this many steps


class GilProbe:
    """How long the calling thread takes to get the GIL back after letting it go, sampled on
    every ``every``-th :meth:`tick` (``time.sleep(0)`` lets go of it). With other Python
    threads busy (a loader's sampling and gathering threads), that is about what each of the
    thread's releases costs it in waiting (every call into torch releases the GIL); alone, about
    the cost of the system call. Sampled, so that the probe itself costs the loop little."""

    def __init__(self, every: int = GIL_PROBE_EVERY):
        self.every, self.ticks, self.samples, self.seconds = every, 0, 0, 0.0

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % self.every:
            return
        t0 = time.perf_counter()
        time.sleep(0)
        self.seconds += time.perf_counter() - t0
        self.samples += 1

    def mean_ms(self) -> float | None:
        """The mean wait of the samples so far, in milliseconds (None before the first)."""
        return 1e3 * self.seconds / self.samples if self.samples else None


def thread_run_delay() -> float | None:
    """Seconds the calling thread has spent waiting for a core, runnable but not running (the
    kernel's schedstat ``run_delay``), or None where the kernel does not say (not Linux, or no
    scheduler statistics)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def split_by_busy(seconds: float, busy: dict) -> dict:
    """``seconds`` of exposed loader time split over the stages in proportion to their busy
    time (all zero when no stage was busy): the one formula for every exposed-time figure."""
    total = sum(busy.values())
    return {k: (seconds * v / total if total else 0.0) for k, v in busy.items()}


def sync(device) -> None:
    """Wait for ``device``'s work (CUDA); nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


STEP_MARK = "train_step"   # the record_function range around each profiled step's call


class StepProfiler:
    """torch.profiler over training steps [first, first + count) of an epoch; ``finish`` writes
    the top operators (a .txt table) or a Chrome trace (.json) to ``path``. While it runs, the
    loop marks each step's call with a ``STEP_MARK`` range, so a trace tells the step's own
    kernels and copies from the loader's (experiments/trace_overlap.py reads them)."""

    def __init__(self, path, device, first: int = 10, count: int = 20):
        self.path, self.first, self.count = Path(path), first, count
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.cuda = device.type == "cuda"
        self.prof = torch.profiler.profile(activities=acts)
        self.steps = 0
        self.running = False

    def step(self, i: int) -> None:
        if i == self.first:
            self.prof.start()
            self.running = True
        elif self.running and i == self.first + self.count:
            self._stop()
        if self.running:
            self.steps += 1

    def _stop(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.prof.stop()
        self.running = False

    def finish(self) -> Path:
        if self.running:              # an epoch shorter than first + count steps
            self._stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.steps == 0:
            self.path.write_text(f"no step profiled: the epoch has {self.first} steps or fewer\n")
        elif self.path.suffix == ".json":
            self.prof.export_chrome_trace(str(self.path))
        else:
            key = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
            table = self.prof.key_averages().table(sort_by=key, row_limit=40)
            self.path.write_text(f"{self.steps} training steps (from step {self.first} of epoch 1), "
                                 f"sorted by {key}\n{table}\n")
        return self.path
