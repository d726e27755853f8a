"""Shared benchmark plumbing: timing, machine record, JSON and plots."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import torch

from ..pipeline.timing import GIL_PROBE_EVERY, Timer
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


def median_or_none(values) -> float | None:
    """The median of ``values``; None if there are none, or any is None (a figure the machine
    did not give)."""
    values = list(values)
    return None if not values or any(v is None for v in values) else statistics.median(values)


def key_medians(epochs: list[dict]) -> dict:
    """``{key: {figure: value}}`` per epoch (the loader threads' roles in ``loader_threads``, the
    gathers' parts in ``gather_parts``) to the median over ``epochs`` of each figure, for the
    keys every epoch has."""
    keys = [r for r in (epochs[0] if epochs else {}) if all(r in e for e in epochs)]
    return {r: {k: median_or_none(e[r][k] for e in epochs) for k in epochs[0][r]} for r in keys}


def _secs(v) -> str:
    return "?" if v is None else f"{v:.3f}"


def print_host_side(rows: list[dict]) -> None:
    """Under bench train's table, each run's CPU side: the training step's host time beside its
    GPU time, the loop's wait for a core, the process's CPU seconds and the loader threads', the
    host time of the feature gathers' parts, and how the captured step's batches fit it."""
    for r in rows:
        if r["status"] != "ok" or "train_step_host_s" not in r:
            continue
        print(f"{r['pipeline']}: train step {r['train_step_s']:.3f} s; the loop's host side of it "
              f"{r['train_step_host_s']:.3f} s wall, {r['train_step_cpu_s']:.3f} s CPU; the loop waited "
              f"{_secs(r.get('loop_run_delay_s'))} s for a core in the epoch (host near the step: the host "
              "paced it; wall above CPU: the loop waited, for the GIL or for a core)")
        if r.get("train_step_copy_wait_s") is not None:
            print(f"{r['pipeline']}: of the train step, the training stream waited {r['train_step_copy_wait_s']:.3f} s "
                  "for ready batches' copies into the captured step's buffers (what the replay before did not hide)")
        if r.get("train_steps_dry") is not None:
            print(f"{r['pipeline']}: steps handed to a training stream that had run dry: {r['train_steps_dry']:.0f} "
                  "(the epoch's first always is); the GPU idled until the loop launched them, and the loop's "
                  f"{r['train_step_dry_host_s']:.3f} s in those steps count in the step's GPU time")
        if r.get("loop_gil_wait_ms") is not None:
            print(f"{r['pipeline']}: the loop took {r['loop_gil_wait_ms']:.3f} ms on average to get the GIL back "
                  f"after letting it go (sampled every {GIL_PROBE_EVERY} steps; alone, about a system call's "
                  "cost; each call into torch lets it go)")
        threads = "; ".join(f"{role} threads ({u['threads']}) {_secs(u['cpu_s'])} s CPU, "
                            f"{_secs(u['run_delay_s'])} s waiting for a core"
                            for role, u in (r.get("loader_threads") or {}).items())
        print(f"{r['pipeline']}: process CPU {_secs(r.get('process_cpu_s'))} s in the epoch"
              + (f"; {threads}" if threads else ""))
        parts = r.get("gather_parts") or {}
        if parts:
            print(f"{r['pipeline']}: the feature gathers' parts in the epoch (host seconds summed over the "
                  "gathering threads, calls): " + ", ".join(f"{name.replace('_', ' ')} {_secs(p['s'])} s "
                                                            f"({p['calls']:.0f})" for name, p in parts.items()))
        graph = r.get("cuda_graph") or {}
        if graph.get("fill"):
            # a fill means replays, so the capacities, and the margins they took, were set
            fill, margin = graph["fill"][0], graph["margin_used"][0][0]
            print(f"{r['pipeline']}: the captured step: {graph['replays']} replays, {graph['misses']} misses "
                  f"(stepped eagerly); the batches filled {fill[0]:.3f} of the first block's padded sources and "
                  f"{fill[1]:.3f} of its edges (its sources' margin {margin:.3f})")
        parts = {k: v for k, v in (graph.get("host_parts") or {}).items() if v["wall_s"] > 0}
        if parts and graph["replays"]:
            n = graph["replays"]
            print(f"{r['pipeline']}: the captured step's host side a replay, wall / CPU (wall above CPU: a "
                  "wait off the CPU, for the GIL or inside the call): "
                  + ", ".join(f"{k.replace('_', ' ')} {1e6 * v['wall_s'] / n:.1f} / {1e6 * v['cpu_s'] / n:.1f} us"
                              for k, v in parts.items()))
