"""Device-side experiment: where ours loses to naive_uva_sorted on a large table.

Both read the same rows in address order; they differ in the reordering around
the read and in the read kernel. For a 32 GB unified table (PROBE_TABLE_GB),
400K random indices and a few row sizes, times (median of 5, GB/s of rows
moved):

  ours            torch_direct.gather(table, idx): sort, read, write back to place
  ours_read       torch_direct.gather(table, sorted_idx, order="as_is"): our read alone
  stock_read      torch.index_select(cuda_alias, 0, sorted_idx): the stock read alone
  sort            torch.sort(idx) alone (reported as seconds)
  naive_sorted    sort + stock read + scatter back (the bench's naive_uva_sorted)

so ours - ours_read is our reordering, ours_read vs stock_read the kernels.
PROBE_WINDOWS=1024,4096 adds ours_read with those rows in flight, PROBE_UNITS=4,8
ours_read with loads of at most that many bytes.
Writes JSON to argv[1].
"""
import os
import sys

import torch

import torch_direct
from hybrid_probe import med, report, write_points  # experiments/ is on sys.path when run as python3 experiments/gather_phase_probe.py


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gather_phase_probe.json"
    gb = float(os.environ.get("PROBE_TABLE_GB", "32"))
    n = int(os.environ.get("PROBE_INDICES", "400000"))
    base = torch.empty(int(gb * 1e9) // 4, device="unified")
    base.uniform_(-1, 1)
    g = torch.Generator().manual_seed(0)
    res = []
    for row_bytes in (128, 256, 512, 1024):
        rows = base.numel() * 4 // row_bytes
        table = base[: rows * row_bytes // 4].view(rows, row_bytes // 4)
        alias = torch_direct._C._as_cuda_alias(table, 0)
        idx = torch.randint(0, rows, (n,), generator=g).cuda()
        sidx, perm = torch.sort(idx)
        buf = torch.empty(n, row_bytes // 4, device="cuda")

        def naive_sorted():
            s, p = torch.sort(idx)
            buf[p] = torch.index_select(alias, 0, s)

        moved = n * row_bytes / 1e9
        rec = {"row_bytes": row_bytes, "table_gb": gb, "indices": n,
               "ours": moved / med(lambda: torch_direct.gather(table, idx)),
               "ours_read": moved / med(lambda: torch_direct.gather(table, sidx, order="as_is")),
               "stock_read": moved / med(lambda: torch.index_select(alias, 0, sidx)),
               "naive_sorted": moved / med(naive_sorted),
               "sort_s": med(lambda: torch.sort(idx))}
        # Our read with other row windows (the default is 2048 rows in flight) and
        # narrower loads (the default is the widest of 16/8/4/2 bytes the row allows).
        for var, name, probe in (("gather_window_rows", "window", "PROBE_WINDOWS"),
                                 ("gather_max_unit", "unit", "PROBE_UNITS")):
            for v in (int(x) for x in os.environ.get(probe, "").split(",") if x):
                with torch_direct.experimental(**{var: v}):
                    rec[f"ours_read_{name}{v}"] = moved / med(lambda: torch_direct.gather(table, sidx, order="as_is"))
        assert torch.equal(torch_direct.gather(table, sidx, order="as_is"), torch.index_select(alias, 0, sidx))
        report(res, rec)
    write_points(out, res)


if __name__ == "__main__":
    main()
