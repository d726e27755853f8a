"""What a training step's GPU time is made of, from a Chrome trace of `train --profile PATH.json`.

The loop marks each profiled step's call with a ``train_step`` range (torch_direct's STEP_MARK).
The kernels and copies launched inside those ranges (a CUDA graph's replay included: its kernels
carry the launch's correlation id) are the step's own work; every other device event is the
loader's (sampling, gathering, copies). For the profiled steps this prints:

- on each stream of the step's work (the training stream; the batch copies' own stream with two
  sets of graphed buffers), its busy time, its idle time inside the steps (waiting for an event
  of another stream, or for the host) and between them (waiting for the next batch or launch),
  and how often a step starts there;
- how much of its busy time ran beside other work, and which of the loader's kernels ran there;
- its kernels by total time, and with ``--compare OTHER.json`` (a trace of another pipeline, e.g.
  gpu_resident's) each kernel's mean time in both: a ratio above 1 is a kernel stretched by what
  shares the GPU with it.

    python experiments/trace_overlap.py unified.json --compare gpu_resident.json --json out.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from pathlib import Path

MARK = "train_step"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def load(path: Path) -> list:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"trace_overlap: no trace at {path}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"trace_overlap: {path} is not a Chrome trace (JSON: {e})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise SystemExit(f"trace_overlap: {path} has no traceEvents list")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def merge(intervals):
    """The union of (start, end) intervals, sorted and disjoint."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def covered(merged, starts, s, e) -> float:
    """How much of [s, e) the sorted disjoint ``merged`` intervals (``starts``: their starts) cover."""
    i = max(bisect.bisect_right(starts, s) - 1, 0)
    total = 0.0
    while i < len(merged) and merged[i][0] < e:
        total += max(0.0, min(e, merged[i][1]) - max(s, merged[i][0]))
        i += 1
    return total


def split(events):
    """(step work as (event, its step's index), other device work, the number of ``train_step``
    ranges): device events split by whether their launch ran inside such a range of the same
    host thread."""
    marks = defaultdict(list)
    for e in events:
        if e.get("name") == MARK and e.get("cat") in ("user_annotation", "cpu_op"):
            marks[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0)))
    for v in marks.values():
        v.sort()
    in_step = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if corr is None or e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        ranges = marks.get((e.get("pid"), e.get("tid")), [])
        i = bisect.bisect_right(ranges, (e["ts"], float("inf"))) - 1
        if i >= 0 and ranges[i][0] <= e["ts"] <= ranges[i][1]:
            in_step[corr] = i
    step, other = [], []
    for e in events:
        if e.get("cat") not in DEVICE_CATS:
            continue
        corr = (e.get("args") or {}).get("correlation")
        if corr in in_step:
            step.append((e, in_step[corr]))
        else:
            other.append(e)
    return step, other, sum(len(v) for v in marks.values())


def short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def kernel_means(work) -> dict:
    acc = defaultdict(lambda: [0, 0.0])
    for e in work:
        if e.get("cat") == "kernel":
            acc[e["name"]][0] += 1
            acc[e["name"]][1] += e.get("dur", 0)
    return acc


def analyse(events, top: int = 12) -> dict:
    step, other, n_marks = split(events)
    if n_marks == 0:
        raise SystemExit("trace_overlap: the trace has no train_step ranges (profile with `train --profile "
                         "PATH.json`, which marks each profiled step)")
    if not step:
        raise SystemExit(f"trace_overlap: {n_marks} train_step ranges but no device work launched in them "
                         "(a CPU run's trace has none: profile on a GPU)")
    by_stream = defaultdict(lambda: defaultdict(list))
    for e, i in step:
        by_stream[(e.get("args") or {}).get("stream")][i].append((e["ts"], e["ts"] + e.get("dur", 0)))
    per_stream = {str(s): stream_figures(steps) for s, steps in
                  sorted(by_stream.items(), key=lambda kv: -sum(b - a for iv in kv[1].values() for a, b in iv))}
    step_union = merge(iv for steps in by_stream.values() for ivs in steps.values() for iv in ivs)
    busy = sum(b - a for a, b in step_union)
    other_union = merge((e["ts"], e["ts"] + e.get("dur", 0)) for e in other)
    other_starts, step_starts = [m[0] for m in other_union], [m[0] for m in step_union]
    shared = sum(covered(other_union, other_starts, a, b) for a, b in step_union)
    beside = defaultdict(float)     # the loader's kernels by the time they ran beside the step's work
    for e in other:
        t = covered(step_union, step_starts, e["ts"], e["ts"] + e.get("dur", 0))
        if t > 0:
            beside[(e.get("cat"), e["name"])] += t
    streams = defaultdict(float)
    for e in other:
        streams[(e.get("args") or {}).get("stream")] += e.get("dur", 0)
    means = kernel_means(e for e, _ in step)
    return {
        "steps": len({i for _, i in step}), "step_streams": per_stream, "step_busy_ms": busy / 1e3,
        "step_busy_beside_other_ms": shared / 1e3,
        "other_busy_ms_by_stream": {str(k): v / 1e3 for k, v in sorted(streams.items(), key=lambda kv: -kv[1])},
        "beside_step_ms": [{"cat": c, "name": n, "ms": t / 1e3}
                           for (c, n), t in sorted(beside.items(), key=lambda kv: -kv[1])[:top]],
        "step_kernels": [{"name": n, "count": c, "total_ms": t / 1e3, "mean_us": t / c}
                         for n, (c, t) in sorted(means.items(), key=lambda kv: -kv[1][1])],
    }


def stream_figures(steps: dict) -> dict:
    """One stream's share of the steps (step -> its intervals there): busy time, idle time inside
    the steps (first start to last end, less busy) and between them, and the mean time from one
    step's first start to the next one's."""
    rows = []
    for ivs in steps.values():
        union = merge(ivs)
        rows.append((union[0][0], union[-1][1], sum(b - a for a, b in union)))
    rows.sort()
    busy = sum(r[2] for r in rows)
    inside = sum(b - a for a, b, _ in rows) - busy
    between = sum(max(0.0, rows[j + 1][0] - rows[j][1]) for j in range(len(rows) - 1))
    period = (rows[-1][0] - rows[0][0]) / (len(rows) - 1) if len(rows) > 1 else None
    return {"steps": len(rows), "busy_ms": busy / 1e3, "idle_inside_steps_ms": inside / 1e3,
            "idle_between_steps_ms": between / 1e3, "period_ms": None if period is None else period / 1e3}


def compare(rec: dict, other_events) -> None:
    """Each step kernel's mean time in the other trace beside this one's, and the kernels found
    in both traces: their total time here and at the other trace's means."""
    step, _, _ = split(other_events)
    means = kernel_means(e for e, _ in step)
    rec["compare_steps"] = len({i for _, i in step})
    for k in rec["step_kernels"]:
        c, t = means.get(k["name"], (0, 0.0))
        k["other_mean_us"] = t / c if c else None
        k["stretch"] = k["mean_us"] / k["other_mean_us"] if c and t > 0 else None
    both = [k for k in rec["step_kernels"] if k["stretch"]]
    rec["matched_kernel_ms"] = sum(k["total_ms"] for k in both)
    rec["matched_kernel_ms_other"] = sum(k["other_mean_us"] * k["count"] for k in both) / 1e3


def report(rec: dict, top: int) -> str:
    n = rec["steps"]
    lines = [f"{n} profiled steps, busy {rec['step_busy_ms']:.2f} ms on the device ({rec['step_busy_ms'] / n:.3f} ms a step)"]
    for s, f in rec["step_streams"].items():
        every = "" if f["period_ms"] is None else f"; a step every {f['period_ms']:.3f} ms"
        lines.append(f"  stream {s}: busy {f['busy_ms']:.2f} ms in {f['steps']} steps, idle {f['idle_inside_steps_ms']:.2f} ms "
                     f"inside them and {f['idle_between_steps_ms']:.2f} ms between them{every}")
    lines += [f"  busy beside the loader's work: {rec['step_busy_beside_other_ms']:.2f} ms "
             f"({100 * rec['step_busy_beside_other_ms'] / max(rec['step_busy_ms'], 1e-9):.0f}%)",
             "  the loader's device time by stream (ms): " +
             ", ".join(f"{s}: {t:.2f}" for s, t in rec["other_busy_ms_by_stream"].items()),
             "the loader's work beside the step's (ms, name):"]
    lines += [f"  {b['ms']:9.3f}  {b['cat']:10s} {short(b['name'])}" for b in rec["beside_step_ms"]]
    cmp = "compare_steps" in rec
    lines.append("the step's kernels (total ms, count, mean us" + (", other trace's mean us, stretch)" if cmp else ")"))
    for k in rec["step_kernels"][:top]:
        extra = ""
        if cmp:
            extra = (f"  {k['other_mean_us']:9.1f}  {k['stretch']:5.2f}x" if k["stretch"] else "  (not in the other)")
        lines.append(f"  {k['total_ms']:9.3f} {k['count']:6d} {k['mean_us']:9.1f}{extra}  {short(k['name'], 70)}")
    if cmp:
        here, there = rec["matched_kernel_ms"], rec["matched_kernel_ms_other"]
        lines.append(f"kernels in both traces: {here:.2f} ms here against {there:.2f} ms at the other's means "
                     f"({here / there:.2f}x)" if there else "no kernel is in both traces")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="The trace comes from `python -m torch_direct train ... --profile PATH.json`.")
    p.add_argument("trace", type=Path, help="a Chrome trace (.json) written by train --profile")
    p.add_argument("--compare", type=Path, default=None, help="a second trace: each step kernel's mean time there")
    p.add_argument("--top", type=int, default=12, help="rows in each list (default 12)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    a = p.parse_args(argv)
    if a.top < 1:
        p.error(f"--top must be at least 1, got {a.top}")
    rec = analyse(load(a.trace), a.top)
    rec["trace"] = str(a.trace)
    if a.compare is not None:
        compare(rec, load(a.compare))
        rec["compare"] = str(a.compare)
    print(report(rec, a.top))
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
