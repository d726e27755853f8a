"""Device-side experiment: why the hybrid gather's CPU part is slower than cpu_centric.

For a 32 GB unified table (PROBE_TABLE_GB), 400K random indices and rows of
128 and 512 bytes (PROBE_ROWS), times (median of 5, GB/s of rows moved) the pieces of the
CPU path one at a time:

  cpu_centric        index_select into a pinned buffer, then one DMA (the bench's)
  index_select_only  index_select into the pinned buffer, no DMA
  ours_cpu_only      torch_direct.gather with a CPU index into the pinned buffer
  ours_cpu_dma       the same, then one DMA: cpu_centric with our CPU gather
  hybrid_1.0         torch_direct.gather(cuda index, cpu_threads=T, cpu_fraction=1.0)
  idx_to_host_s      the CUDA index to the host (seconds)

PROBE_PREFETCH=0,8,16 adds ours_cpu_only and hybrid_1.0 with software prefetch that
many rows ahead (0: none, as without it).

Writes JSON to argv[1].
"""
import os
import sys

import torch

import torch_direct
from hybrid_probe import med, report, write_points  # experiments/ is on sys.path when run as python3 experiments/hybrid_cpu_path_probe.py


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "hybrid_cpu_path_probe.json"
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    gb = float(os.environ.get("PROBE_TABLE_GB", "32"))
    n = 400000
    base = torch.empty(int(gb * 1e9) // 4, device="unified")
    base.uniform_(-1, 1)
    g = torch.Generator().manual_seed(0)
    res = []
    for row_bytes in (int(x) for x in os.environ.get("PROBE_ROWS", "128,512").split(",")):
        w = row_bytes // 4
        rows = base.numel() // w
        table = base[: rows * w].view(rows, w)
        host = torch_direct._C._as_cpu_alias(table)
        idx_cpu = torch.randint(0, rows, (n,), generator=g)
        idx = idx_cpu.cuda()
        pinned = torch.empty(n, w, pin_memory=True)
        dst = torch.empty(n, w, device="cuda")

        def cpu_centric():
            torch.index_select(host, 0, idx_cpu, out=pinned)
            dst.copy_(pinned, non_blocking=True)

        def ours_cpu_dma():
            torch_direct.gather(table, idx_cpu, out=pinned)
            dst.copy_(pinned, non_blocking=True)

        moved = n * row_bytes / 1e9
        rec = {"row_bytes": row_bytes, "table_gb": gb, "threads": threads,
               "cpu_centric": moved / med(cpu_centric),
               "index_select_only": moved / med(lambda: torch.index_select(host, 0, idx_cpu, out=pinned)),
               "ours_cpu_only": moved / med(lambda: torch_direct.gather(table, idx_cpu, out=pinned)),
               "ours_cpu_dma": moved / med(ours_cpu_dma),
               "hybrid_1.0": moved / med(lambda: torch_direct.gather(table, idx, cpu_threads=threads,
                                                                      cpu_fraction=1.0)),
               "idx_to_host_s": med(lambda: idx.cpu())}
        # Our CPU gather with rows requested that many rows ahead (software prefetch).
        for d in (int(x) for x in os.environ.get("PROBE_PREFETCH", "").split(",") if x):
            with torch_direct.experimental(cpu_gather_prefetch=d):
                rec[f"ours_cpu_only_prefetch{d}"] = moved / med(lambda: torch_direct.gather(table, idx_cpu, out=pinned))
                rec[f"hybrid_1.0_prefetch{d}"] = moved / med(lambda: torch_direct.gather(
                    table, idx, cpu_threads=threads, cpu_fraction=1.0))
        report(res, rec)
    write_points(out, res)


if __name__ == "__main__":
    main()
