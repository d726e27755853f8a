"""Device-side experiment: do hybrid gathers on other threads stretch a training loop's launches?

The main thread replays a CUDA graph of a small training-like step (a few matrix products
forward and backward), timing each replay's host call by wall clock and by the thread's own
CPU time, and waits for it before the next. Beside it, THREADS threads each run hybrid gathers
(``torch_direct.gather`` with CPU threads taking every row, as ``train --gather-cpu-share 1``
does) of ROWS random rows of a unified table, one after another on streams of their own. This
runs once alone and once under each experimental ``hybrid_piece_kb`` of PIECES (the bytes each
CPU thread writes before it starts their copy to the GPU: fewer, larger pieces mean fewer
calls into the CUDA driver). A launch that waits on a lock inside the driver shows a wall time
well above its CPU time; one that waits for a core shows neither.

    python experiments/launch_contention_probe.py OUT.json [--threads 4] [--cpu-threads 4]
        [--rows 150000] [--pieces 1024,4096,16384] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from _cli import finish  # experiments/ is on sys.path when run as python3 experiments/launch_contention_probe.py


def replay_times(graph, seconds: float) -> dict:
    import torch
    done = torch.cuda.Event()
    wall, cpu = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0, c0 = time.perf_counter(), time.thread_time()
        graph.replay()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        done.record()
        done.synchronize()
    gap = sorted(w - c for w, c in zip(wall, cpu))
    return {"replays": len(wall),
            "wall_us_median": 1e6 * statistics.median(wall),
            "cpu_us_median": 1e6 * statistics.median(cpu),
            "wall_minus_cpu_us_median": 1e6 * gap[len(gap) // 2],
            "wall_minus_cpu_us_p90": 1e6 * gap[int(len(gap) * 0.9)],
            "wall_minus_cpu_ms_total": 1e3 * sum(gap)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--threads", type=int, default=4, help="gathering threads beside the loop (default 4)")
    ap.add_argument("--cpu-threads", type=int, default=4, help="CPU threads of each hybrid gather (default 4)")
    ap.add_argument("--rows", type=int, default=150_000, help="rows of each gather (default 150000)")
    ap.add_argument("--row-bytes", type=int, default=128, help="bytes a row (default 128: a float8 row of 128)")
    ap.add_argument("--table-gb", type=float, default=2.0, help="the unified table's size (default 2 GB)")
    ap.add_argument("--pieces", default="1024,4096,16384", help="hybrid_piece_kb values (default 1024,4096,16384)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds each configuration runs (default 5)")
    args = ap.parse_args(argv)
    try:
        pieces = [int(p) for p in args.pieces.split(",") if p.strip()]
    except ValueError:
        ap.error(f"--pieces must be integers (KiB) separated by commas, got {args.pieces!r}")
    if not pieces or min(pieces) < 16:
        ap.error(f"--pieces must name at least one size, each >= 16 (KiB), got {args.pieces!r}")
    if min(args.threads, args.cpu_threads, args.rows, args.row_bytes) < 1:
        ap.error("--threads, --cpu-threads, --rows and --row-bytes must be >= 1")
    if args.seconds <= 0 or args.table_gb <= 0:
        ap.error("--seconds and --table-gb must be positive")

    import torch
    import torch_direct
    if not torch.cuda.is_available():
        print("launch_contention_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = int(args.table_gb * 1e9) // args.row_bytes
    table = torch.empty(rows, args.row_bytes, dtype=torch.uint8, device="unified")
    table.view(-1)[::4096].fill_(1)

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 172)).to(dev)
    x = torch.randn(8192, 256, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up before capture, as CUDA graphs need
        for _ in range(3):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x).sum().backward()

    def gatherer(stop: threading.Event, counts: list, i: int):
        stream = torch.cuda.Stream()
        gen = torch.Generator(device=dev).manual_seed(i)
        with torch.cuda.stream(stream):
            while not stop.is_set():
                idx = torch.randint(0, rows, (args.rows,), device=dev, generator=gen)
                torch_direct.gather(table, idx, cpu_threads=args.cpu_threads, cpu_fraction=1.0)
                stream.synchronize()
                counts[i] += 1

    result = {"threads": args.threads, "cpu_threads": args.cpu_threads, "rows": args.rows,
              "row_bytes": args.row_bytes, "table_rows": rows, "seconds": args.seconds,
              "gpu": torch.cuda.get_device_name(), "runs": {}}
    result["runs"]["alone"] = replay_times(graph, args.seconds)
    for kb in pieces:
        with torch_direct.experimental(hybrid_piece_kb=kb):
            stop, counts = threading.Event(), [0] * args.threads
            ts = [threading.Thread(target=gatherer, args=(stop, counts, i)) for i in range(args.threads)]
            began = time.perf_counter()
            for t in ts:
                t.start()
            time.sleep(0.5)
            run = replay_times(graph, args.seconds)
            stop.set()
            for t in ts:
                t.join()
            ran = time.perf_counter() - began
        run["gathers_per_s"] = sum(counts) / ran
        result["runs"][f"piece_{kb}kb"] = run
    for name, r in result["runs"].items():
        print(f"{name:>16}: replay wall {r['wall_us_median']:8.1f} us, cpu {r['cpu_us_median']:8.1f} us, "
              f"wall-cpu median {r['wall_minus_cpu_us_median']:8.1f} p90 {r['wall_minus_cpu_us_p90']:8.1f} us"
              + (f", {r['gathers_per_s']:.0f} gathers/s" if "gathers_per_s" in r else ""))
    finish(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
