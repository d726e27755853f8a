"""Device-side experiment: does a feature table on 2 MiB pages make the GPU's random-row reads faster?

The zero-copy gather reads random 256-byte rows of a 32 GB table at about 57 M rows/s (15 GB/s,
`results/gather_32gb.json`) where a bulk copy moves 53 GB/s over the same link: each row is a
read of its own, and the table spans eight million 4 KiB pages, far more than the GPU's
translation caches hold for host memory. Unified tables live on 4 KiB pages (memfd, shareable
between processes). This probe gathers the same random rows from:

  unified   a unified tensor as the allocator makes it (4 KiB pages);
  thp       anonymous memory advised MADV_HUGEPAGE (transparent huge pages) before it is
            touched, then pinned in place (``torch_direct.pin_inplace``);

and reports the median time of each, rows per second and GB/s, and how much of the ``thp``
table the kernel put on huge pages (AnonHugePages in /proc/meminfo: THP is a request the
kernel may refuse). On the CPU it runs as a check of the tool, not a measurement.

    python experiments/hugepage_gather_probe.py --table-gb 16 --out hugepages.json
"""
import argparse
import mmap
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import finish, run, write_record  # noqa: E402

import torch_direct  # noqa: E402

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Whether shared memory (the allocator's memfd blocks) may take huge pages at all: "never" leaves
# anonymous memory as the only way to them.
SHMEM_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--table-gb", type=float, default=16.0, help="size of each table in GB (default: %(default)s)")
    p.add_argument("--row-bytes", type=int, default=256, help="bytes a row, float32 (default: %(default)s)")
    p.add_argument("--indices", type=int, default=400_000, help="rows a gather (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=10, help="timed gathers per table (default: %(default)s)")
    p.add_argument("--device", default=None, help="cuda[:k] or cpu (default: cuda when usable)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    a = p.parse_args(argv)
    if a.table_gb <= 0:
        p.error(f"--table-gb must be positive, got {a.table_gb}")
    if a.row_bytes <= 0 or a.row_bytes % 4:
        p.error(f"--row-bytes must be a positive multiple of 4 (float32 rows), got {a.row_bytes}")
    for name in ("indices", "repeats"):
        if getattr(a, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(a, name)}")
    return a


def anon_huge_kb() -> int:
    """AnonHugePages of /proc/meminfo in KiB (0 where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def thp_table(rows: int, cols: int):
    """(float32 CPU tensor over anonymous memory advised MADV_HUGEPAGE, the mapping, KiB of it on
    huge pages): advised before the first touch, so the kernel can fault 2 MiB pages in."""
    size = rows * cols * 4
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    before = anon_huge_kb()
    t = torch.frombuffer(mm, dtype=torch.float32).view(rows, cols)
    t.fill_(1.0)   # fault every page in now
    return t, mm, max(0, anon_huge_kb() - before)


def timed_gathers(table, index, device, repeats: int) -> list[float]:
    out = None
    for _ in range(2):   # warm-up
        out = torch_direct.gather(table, index, out=out)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch_direct.gather(table, index, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None):
    a = parse(argv)
    from torch_direct.gnn.pipeline.options import resolve_device
    device = resolve_device(a.device)
    cols = a.row_bytes // 4
    rows = max(1, int(a.table_gb * 1e9) // a.row_bytes)
    n = min(a.indices, rows)
    index = torch.randint(0, rows, (n,), generator=torch.Generator().manual_seed(0)).to(device)
    record = {"tool": "hugepage_gather_probe", "args": {k: (str(v) if isinstance(v, Path) else v)
                                                        for k, v in vars(a).items()},
              "device": str(device), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "thp_setting": THP_SETTING.read_text().strip() if THP_SETTING.exists() else None,
              "shmem_thp_setting": SHMEM_THP_SETTING.read_text().strip() if SHMEM_THP_SETTING.exists() else None,
              "rows": rows, "indices": n, "tables": {}}
    print(f"hugepage_gather_probe: {rows} rows of {a.row_bytes} B ({rows * a.row_bytes / 1e9:.1f} GB), "
          f"{n} random rows a gather, {device}; THP {record['thp_setting']}; shared memory THP "
          f"{record['shmem_thp_setting']}", flush=True)
    for name in ("unified", "thp"):
        t0 = time.perf_counter()
        if name == "unified":
            table, keep, huge_kb = torch.empty(rows, cols, device="unified"), None, 0
            table.fill_(1.0)
        else:
            host, keep, huge_kb = thp_table(rows, cols)
            table = torch_direct.pin_inplace(host)
        made_s = time.perf_counter() - t0
        times = timed_gathers(table, index, device, a.repeats)
        med = statistics.median(times)
        entry = {"made_s": made_s, "median_s": med, "all_s": times, "Mrows_per_s": n / med / 1e6,
                 "GBps": n * a.row_bytes / med / 1e9, "huge_page_kb": huge_kb,
                 "huge_page_share": huge_kb * 1024 / (rows * cols * 4)}
        record["tables"][name] = entry
        print(f"  {name:8s} {med * 1e3:8.3f} ms  {entry['Mrows_per_s']:7.1f} M rows/s  {entry['GBps']:6.2f} GB/s  "
              f"huge pages {entry['huge_page_share']:.0%}  (made in {made_s:.1f} s)", flush=True)
        del table
        keep = None  # noqa: F841  (the mapping goes with the table)
        if a.out:
            write_record(a.out, record)
    u, h = record["tables"]["unified"], record["tables"]["thp"]
    record["thp_speedup"] = u["median_s"] / h["median_s"]
    print(f"  thp / unified speed: {record['thp_speedup']:.2f}x")
    return finish(a.out, record)


if __name__ == "__main__":
    run("hugepage_gather_probe", main)
