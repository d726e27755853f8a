"""Host-side experiment: how much faster CPU threads copy random rows of a large table when they
read them in address order.

The hybrid gather's CPU threads read each batch's missed rows (about 310,000 rows of 64 bytes
on papers100M-like's 4-bit table of 7 GB) in the order of the batch's index, that is at random.
With 4 KiB pages, each row of a table that large also needs its page's translation, and a
random one misses the TLB and the caches of the page walk; in address order, successive rows
share the walk's upper levels and its cache lines. This times `index_select` of the same rows
from the same table in both orders, on 1 thread and on all of them, and prints each order's
rate and the ratio:

    python experiments/cpu_row_order_probe.py --table-gb 7.1 --row-bytes 64 --rows 310000 --out order.json

With `--pages small,huge` each thread count is timed on a table of 4 KiB pages and on one advised
for transparent huge pages (2 MiB: one translation covers 32,768 rows of 64 B), as the unified
store's table is under `TORCH_DIRECT_EXPERIMENTAL=feature_pages=huge`; each point then says how
much of the table the kernel gave huge pages (the AnonHugePages of its mapping, as the store reports).

Each point is the median of --repeats calls (after one), each with a fresh random index of
--rows distinct-ish rows (drawn with replacement; sorting it is not timed: on the GPU it is a
radix sort of the index before its copy to the host).
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import finish, run  # noqa: E402
from torch_direct.gnn.pipeline.options import positive  # noqa: E402


def time_orders(table, a, threads, kind, huge_share):
    """Each thread count's median copy time of random rows, in the order drawn and sorted."""
    import torch
    out = torch.empty(a.rows, a.row_bytes, dtype=torch.uint8)
    n = table.shape[0]
    g = torch.Generator().manual_seed(0)
    points = []
    for t in threads:
        torch.set_num_threads(t)
        times = {"random": [], "sorted": []}
        for i in range(a.repeats + 1):
            idx = torch.randint(0, n, (a.rows,), generator=g)
            for order, at in (("random", idx), ("sorted", torch.sort(idx).values)):
                t0 = time.perf_counter()
                torch.index_select(table, 0, at, out=out)
                if i:   # the first call of each order warms up
                    times[order].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        point = {"pages": kind, "huge_share": round(huge_share, 3), "threads": t,
                 **{f"{k}_ms": v * 1e3 for k, v in med.items()},
                 **{f"{k}_mrows_s": a.rows / v / 1e6 for k, v in med.items()},
                 "sorted_speedup": med["random"] / med["sorted"]}
        points.append(point)
        print(f"{kind} pages ({huge_share:.0%} huge), {t:3d} threads: random {point['random_ms']:.2f} ms "
              f"({point['random_mrows_s']:.1f} M rows/s), sorted {point['sorted_ms']:.2f} ms "
              f"({point['sorted_mrows_s']:.1f} M rows/s): sorted {point['sorted_speedup']:.2f}x", flush=True)
    return points


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-gb", type=positive(float), default=7.1, help="the table's size in GB (default 7.1)")
    ap.add_argument("--row-bytes", type=positive(int), default=64, help="bytes a row (default 64)")
    ap.add_argument("--rows", type=positive(int), default=310_000, help="rows a gather (default 310000)")
    ap.add_argument("--repeats", type=positive(int), default=5, help="timed calls a point (default 5)")
    ap.add_argument("--threads", default=None,
                    help="comma-separated thread counts (default: 1 and every core)")
    ap.add_argument("--pages", default="small",
                    help="comma-separated page kinds of the table: small (4 KiB, the default) and/or huge "
                         "(advised MADV_HUGEPAGE before the first touch)")
    ap.add_argument("--out", default=None, help="JSON record to write")
    a = ap.parse_args(argv)
    threads = ([int(t) for t in a.threads.split(",")] if a.threads
               else sorted({1, os.cpu_count() or 1}))
    if any(t <= 0 for t in threads):
        raise ValueError(f"--threads must list positive counts, got {a.threads!r}")
    pages = a.pages.split(",")
    if not pages or any(p not in ("small", "huge") for p in pages):
        raise ValueError(f"--pages lists small and/or huge, got {a.pages!r}")
    n = int(a.table_gb * 1e9) // a.row_bytes
    if n < 1:
        raise ValueError(f"--table-gb {a.table_gb} holds no row of {a.row_bytes} bytes")

    import torch
    points = []
    for kind in pages:
        if kind == "huge":
            from torch_direct.gnn.pipeline.pages import huge_page_bytes, huge_page_share
            table = huge_page_bytes(n * a.row_bytes).view(n, a.row_bytes)
        else:
            table = torch.empty(n, a.row_bytes, dtype=torch.uint8)
        table.fill_(1)   # every page touched before any timing
        huge_share = (huge_page_share(table) or 0.0) if kind == "huge" else 0.0
        points += time_orders(table, a, threads, kind, huge_share)
        del table
    finish(a.out, {"benchmark": "cpu_row_order_probe", "table_gb": a.table_gb, "row_bytes": a.row_bytes,
                   "rows": a.rows, "repeats": a.repeats, "pages": pages, "points": points})


if __name__ == "__main__":
    run("cpu_row_order_probe", main)
