"""Shared benchmark plumbing: timing, machine record, JSON and plots."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from ..pipeline.timing import Timer
from ..progress import track  # noqa: F401  (the benchmarks' progress bar)
from ..outputs import check_writable, default_out, machine_record, results_dir, write_json  # noqa: F401  (the benchmarks' names)


def time_it(fn: Callable[[], object], repeats: int, warmup: int, gpu: bool) -> dict:
    """Median wall time (s) and CPU time (s) per call, after warm-up.

    GPU work is timed with CUDA events around each call (the host waits for
    the end event), CPU work with perf_counter: the package's one Timer.
    """
    for _ in range(warmup):
        fn()
    if gpu:
        torch.cuda.synchronize()
    walls, cpus = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        # Blocking events: the host sleeps while it waits, so process_time counts the CPU
        # work of the method, not a spinning wait.
        timer = Timer(gpu, blocking=True)
        start = timer.start()
        fn()
        timer.stop("call", start)
        walls.append(timer.totals()["call"])
        cpus.append(time.process_time() - c0)
    return {"median_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
            "repeats": repeats, "all_s": walls}


def print_markdown(header: list[str], rows: list[list]) -> None:
    """A markdown table: one line per row, cells as given (already formatted)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
