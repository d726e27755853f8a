"""Shared benchmark plumbing: timing, machine record, JSON and plots."""

from __future__ import annotations

import statistics
import sys
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


def run_and_report(name: str, path, start: Callable[[], dict], print_table: Callable[[dict], None],
                   plot=None, draw: Callable | None = None) -> int:
    """A benchmark command's frame: ``start()`` checks its input and runs, giving the record;
    bad input or a failure before the first row is ``<name>: error: ...`` with status 2. Then the
    table, the record's path and, with ``plot``, ``draw(record, plot)``'s chart; status 1 if a row
    failed, else 0."""
    try:
        record = start()
    except (ValueError, RuntimeError, TypeError, FileNotFoundError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    print_table(record)
    print(f"wrote {path}")
    if plot:
        try:
            print(f"wrote {draw(record, plot)}")
        except ValueError as e:     # nothing ran: no bar to draw
            print(f"{name}: no plot: {e}", file=sys.stderr)
    return 1 if any(r["status"] == "failed" for r in record["rows"]) else 0
