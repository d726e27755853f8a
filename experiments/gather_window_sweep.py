"""Device-side experiment: the gather kernel's in-flight window on large tables.

Times torch_direct.gather (CUDA index, unified table) for several values of
the experimental gather_window_rows (distinct rows in flight; "default" = the
built-in rule) against naive_uva_sorted, on a large and a 1 GB table. Writes
JSON to the path given (default gather_window.json).
"""
import json
import os
import sys

import torch

import torch_direct
from torch_direct.gnn.bench.gather import _methods

from _cli import median_seconds  # experiments/ is on sys.path when run as python3 experiments/gather_window_sweep.py


def med(fn, reps=5):
    return median_seconds(torch.device("cuda"), fn, reps)


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "gather_window.json"
    big_gb = float(os.environ.get("SWEEP_TABLE_GB", "32"))
    windows = ["default", 0, 8192, 4096, 2048, 1024, 512]
    res = []
    g = torch.Generator().manual_seed(0)
    big = [(128, 400000), (512, 400000), (1024, 400000), (2048, 400000), (128, 2000000), (512, 2000000)]
    for gb, cases in ((1.0, [(128, 400000)]), (big_gb, big)):
        nbytes = int(gb * 1e9)
        base = torch.empty(nbytes // 4, device="unified")
        base.uniform_(-1, 1)
        for row_bytes, count in cases:
            rows = nbytes // row_bytes
            table = base[: rows * row_bytes // 4].view(rows, row_bytes // 4)
            idx = torch.randint(0, rows, (count,), generator=g).cuda()
            ref = _methods(table, idx, True, None, 1)["naive_uva_sorted"]
            t_ref = med(ref)
            for w in windows:
                with torch_direct.experimental(gather_window_rows=None if w == "default" else w):
                    t = med(lambda: torch_direct.gather(table, idx))
                r = {"table_gb": gb, "row_bytes": row_bytes, "indices": count, "window_rows": w,
                     "ours_GBps": count * row_bytes / t / 1e9,
                     "naive_uva_sorted_GBps": count * row_bytes / t_ref / 1e9,
                     "ratio_vs_naive_uva_sorted": t_ref / t}
                res.append(r)
                print(json.dumps(r), flush=True)
        del base
    with open(out_path, "w") as f:
        json.dump({"machine": torch.cuda.get_device_name(), "points": res}, f, indent=1)


if __name__ == "__main__":
    main()
