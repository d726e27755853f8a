"""Device-side experiment: the hybrid gather's split on a large table.

For a few row sizes (PROBE_ROWS, bytes) of a 32 GB unified table and 400K random indices, times
the GPU-centric gather, cpu_centric, naive_uva_sorted and the hybrid mode at
fixed CPU fractions (also with the CPU part on our own pool: *_own_pool) and with the
automatic split (auto_fractions: the share each of its calls chose). Writes JSON to argv[1].
"""
import json
import os
import statistics
import sys
import time

import torch

import torch_direct
from torch_direct.gnn.bench.gather import _methods


def med(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def report(res, rec, digits=5):
    """Keep one point and print it as a JSON line (floats to ``digits`` places)."""
    res.append(rec)
    print(json.dumps({k: round(v, digits) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)


def write_points(out, res):
    with open(out, "w") as f:
        json.dump({"machine": torch.cuda.get_device_name(), "points": res}, f, indent=1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "hybrid_probe.json"
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    gb = float(os.environ.get("PROBE_TABLE_GB", "32"))
    nbytes = int(gb * 1e9)
    base = torch.empty(nbytes // 4, device="unified")
    base.uniform_(-1, 1)
    g = torch.Generator().manual_seed(0)
    res = []
    for row_bytes in (int(x) for x in os.environ.get("PROBE_ROWS", "128,512,1024").split(",")):
        rows = nbytes // row_bytes
        table = base[: rows * row_bytes // 4].view(rows, row_bytes // 4)
        table_bytes = table.shape[0] * table.stride(0) * table.element_size()  # as the gather counts it
        idx = torch.randint(0, rows, (400000,), generator=g).cuda()
        m = _methods(table, idx, True, None, threads)
        moved = 400000 * row_bytes
        rec = {"row_bytes": row_bytes, "table_gb": gb}
        for name in ("ours", "cpu_centric", "naive_uva_sorted"):
            rec[name] = moved / med(m[name]) / 1e9
        for f in (0.0, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0):
            rec[f"hybrid_{f}"] = moved / med(lambda: torch_direct.gather(
                table, idx, cpu_threads=threads, cpu_fraction=f)) / 1e9
        # the CPU part on our own pool, where it would take index_select (the same run's comparison)
        with torch_direct.experimental(gather_own_pool=1):
            for f in (0.55, 0.85, 1.0):
                rec[f"hybrid_{f}_own_pool"] = moved / med(lambda: torch_direct.gather(
                    table, idx, cpu_threads=threads, cpu_fraction=f)) / 1e9
        chosen = []

        def auto():
            chosen.append(round(torch_direct.hybrid_cpu_fraction(row_bytes, table_bytes=table_bytes), 3))
            return torch_direct.gather(table, idx, cpu_threads=threads)

        rec["hybrid_auto"] = moved / med(auto, reps=9) / 1e9
        rec["auto_fractions"] = chosen
        rec["auto_fraction"] = torch_direct.hybrid_cpu_fraction(row_bytes, table_bytes=table_bytes)
        report(res, rec, digits=2)
    write_points(out, res)


if __name__ == "__main__":
    main()
