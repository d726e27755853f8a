"""Device-side experiment: does a feature table on 2 MiB pages make the GPU's random-row reads faster?

The zero-copy gather reads random 256-byte rows of a 32 GB table at about 57 M rows/s (15 GB/s,
`results/gather_32gb.json`) where a bulk copy moves 53 GB/s over the same link: each row is a
read of its own, and the table spans eight million 4 KiB pages, far more than the GPU's
translation caches hold for host memory. Unified tables live on 4 KiB pages (memfd, shareable
between processes). This probe gathers the same random rows from:

  unified   a unified tensor as the allocator makes it (4 KiB pages);
  thp       anonymous memory advised MADV_HUGEPAGE (transparent huge pages) before it is
            touched, then pinned in place (``torch_direct.pin_inplace``);
  vmm_host  (GPU only, with CuPy) pinned host memory the CUDA driver allocates and maps itself
            (cuMemCreate with a host location), at its allocation granularity (2 MiB
            typically) whatever pages the kernel has: the driver's way to large mappings;
  driver    (GPU only) the product's form of the same: ``torch_direct.driver_mapped`` (cuMemCreate
            on the host's NUMA node, mapped for the CPU too), a unified table the product's
            gather reads (the feature store's ``feature_pages=driver``);

and reports the median time of each, rows per second and GB/s, and how much of the ``thp``
table the kernel put on huge pages (the AnonHugePages of its own mappings, as the feature store
reports it: THP is a request the kernel may refuse). Each table is read by ``torch_direct.gather`` (the product's kernel) and,
on a GPU, by ``torch.index_select`` over a CUDA view of it (the one kernel all three can use).
On the CPU it runs as a check of the tool, not a measurement.

``--spans 1,4,14`` also times, on the unified table, the same number of random rows drawn from
its first 1, 4 and 14 GB only: whether the rate follows the span of addresses the rows fall in
(what a table ordered by access frequency would narrow for a cache's misses) rather than the
table's size. ``--tables`` picks the tables (default: all of them).

    python experiments/hugepage_gather_probe.py --table-gb 16 --out hugepages.json
    python experiments/hugepage_gather_probe.py --table-gb 28 --tables unified --spans 1,4,14
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import finish, run, seconds, write_record  # noqa: E402

import torch_direct  # noqa: E402
from torch_direct.gnn.pipeline.pages import huge_page_bytes, huge_page_share  # noqa: E402

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Whether shared memory (the allocator's memfd blocks) may take huge pages at all: "never" leaves
# anonymous memory as the only way to them.
SHMEM_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
TABLES = ("unified", "thp", "vmm_host", "driver")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--table-gb", type=float, default=16.0, help="size of each table in GB (default: %(default)s)")
    p.add_argument("--row-bytes", type=int, default=256, help="bytes a row, float32 (default: %(default)s)")
    p.add_argument("--indices", type=int, default=400_000, help="rows a gather (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=10, help="timed gathers per table (default: %(default)s)")
    p.add_argument("--device", default=None, help="cuda[:k] or cpu (default: cuda when usable)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    p.add_argument("--tables", default=",".join(TABLES),
                   help="comma-separated tables to time, of " + ", ".join(TABLES) + " (default: all)")
    p.add_argument("--spans", default="",
                   help="comma-separated GB: random rows from the unified table's first SPAN GB only "
                        "(default: none)")
    a = p.parse_args(argv)
    if a.table_gb <= 0:
        p.error(f"--table-gb must be positive, got {a.table_gb}")
    if a.row_bytes <= 0 or a.row_bytes % 4:
        p.error(f"--row-bytes must be a positive multiple of 4 (float32 rows), got {a.row_bytes}")
    for name in ("indices", "repeats"):
        if getattr(a, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(a, name)}")
    a.tables = [t.strip() for t in a.tables.split(",") if t.strip()]
    bad = [t for t in a.tables if t not in TABLES]
    if bad or not a.tables:
        p.error(f"--tables takes names of {', '.join(TABLES)}, got {bad or 'none'}")
    try:
        a.spans = [float(x) for x in a.spans.split(",") if x.strip()]
    except ValueError:
        p.error(f"--spans takes comma-separated numbers of GB, got {a.spans!r}")
    if any(x <= 0 or x > a.table_gb for x in a.spans):
        p.error(f"--spans must lie in (0, --table-gb = {a.table_gb}], got {a.spans}")
    if a.spans and "unified" not in a.tables:
        p.error("--spans times the unified table: keep unified in --tables")
    return a


def thp_table(rows: int, cols: int):
    """(float32 CPU tensor on memory advised for huge pages, as the feature store's
    ``feature_pages=huge`` table, KiB of it the kernel put on huge pages)."""
    t = huge_page_bytes(rows * cols * 4).view(torch.float32).view(rows, cols)
    t.fill_(1.0)   # fault every page in now
    return t, int((huge_page_share(t) or 0.0) * rows * cols * 4) // 1024


def timed(fn, device, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` after two warm-up calls, the device
    synchronised around each."""
    for _ in range(2):
        fn()
    return [seconds(device, fn) for _ in range(repeats)]


def rates(times: list[float], n: int, row_bytes: int) -> dict:
    med = statistics.median(times)
    return {"median_s": med, "all_s": times, "Mrows_per_s": n / med / 1e6, "GBps": n * row_bytes / med / 1e9}


def vmm_host_table(rows: int, cols: int, device: torch.device):
    """(float32 CUDA tensor [rows, cols] over pinned host memory the driver allocated and mapped
    itself, a function releasing it, the allocation granularity): cuMemCreate with a host
    location, cuMemAddressReserve, cuMemMap, cuMemSetAccess for ``device``; wrapped through CuPy.
    RuntimeError saying why where it cannot be made."""
    import ctypes
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError("needs CuPy to view the mapping as a tensor") from e
    cu = ctypes.CDLL("libcuda.so.1")

    class Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class Flags(ctypes.Structure):
        _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]

    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                    ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]

    class Access(ctypes.Structure):
        _fields_ = [("location", Location), ("flags", ctypes.c_int)]

    u64, size_t = ctypes.c_ulonglong, ctypes.c_size_t
    cu.cuMemGetAllocationGranularity.argtypes = [ctypes.POINTER(size_t), ctypes.POINTER(Prop), ctypes.c_int]
    cu.cuMemCreate.argtypes = [ctypes.POINTER(u64), size_t, ctypes.POINTER(Prop), u64]
    cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), size_t, size_t, u64, u64]
    cu.cuMemMap.argtypes = [u64, size_t, size_t, u64, u64]
    cu.cuMemSetAccess.argtypes = [u64, size_t, ctypes.POINTER(Access), size_t]
    cu.cuMemUnmap.argtypes = [u64, size_t]
    cu.cuMemAddressFree.argtypes = [u64, size_t]
    cu.cuMemRelease.argtypes = [u64]

    def check(rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            cu.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    host, pinned, readwrite, gpu = 2, 1, 3, 1   # CU_MEM_LOCATION_TYPE_HOST, _ALLOCATION_TYPE_PINNED, ...
    prop = Prop(type=pinned, requestedHandleTypes=0, location=Location(host, 0))
    gran = size_t()
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "cuMemGetAllocationGranularity")
    size = -(-rows * cols * 4 // gran.value) * gran.value
    handle, ptr = u64(), u64()
    check(cu.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), "cuMemCreate")
    done = []

    def release():
        for step in reversed(done):
            step()
        done.clear()
    try:
        done.append(lambda: cu.cuMemRelease(handle.value))
        check(cu.cuMemAddressReserve(ctypes.byref(ptr), size, gran.value, 0, 0), "cuMemAddressReserve")
        done.append(lambda: cu.cuMemAddressFree(ptr.value, size))
        check(cu.cuMemMap(ptr.value, size, 0, handle.value, 0), "cuMemMap")
        done.append(lambda: cu.cuMemUnmap(ptr.value, size))
        access = Access(location=Location(gpu, device.index or 0), flags=readwrite)
        check(cu.cuMemSetAccess(ptr.value, size, ctypes.byref(access), 1), "cuMemSetAccess")
        mem = cupy.cuda.UnownedMemory(ptr.value, size, None, device.index or 0)
        view = cupy.ndarray((rows, cols), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))
        return torch.from_dlpack(view), release, gran.value
    except Exception:
        release()
        raise


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
    gpu_only = ("vmm_host", "driver")
    names = [t for t in a.tables if device.type == "cuda" or t not in gpu_only]
    record["skipped"] = {t: "needs a CUDA device" for t in a.tables if t not in names}
    for name in names:
        t0 = time.perf_counter()
        release, huge_kb, entry, host = None, 0, {}, None
        try:
            if name == "unified":
                table = torch.empty(rows, cols, device="unified")
                table.fill_(1.0)
            elif name == "thp":
                host, huge_kb = thp_table(rows, cols)
                table = torch_direct.pin_inplace(host)
            elif name == "driver":
                table = torch_direct.driver_mapped(torch.ones(1, cols).expand(rows, cols))
            else:
                table, release, entry["granularity"] = vmm_host_table(rows, cols, device)
                table.fill_(1.0)
        except RuntimeError as e:   # the driver refused (an old one, a machine without host VMM)
            record["skipped"][name] = str(e)
            print(f"  {name:8s} skipped: {e}", flush=True)
            continue
        entry["made_s"] = time.perf_counter() - t0
        if name != "vmm_host":   # the product's kernel reads unified tables only
            out = torch.empty(n, cols, device=device)
            entry.update(rates(timed(lambda: torch_direct.gather(table, index, out=out), device, a.repeats),
                               n, a.row_bytes))
        if device.type == "cuda":
            view = table if name == "vmm_host" else torch_direct.cuda_alias(table, device.index or 0)
            entry["index_select"] = rates(timed(lambda: torch.index_select(view, 0, index), device, a.repeats),
                                          n, a.row_bytes)
            del view
        if name == "unified" and a.spans:   # the same number of rows, from the first SPAN GB only
            entry["spans"] = {}
            for span in a.spans:
                span_rows = max(1, min(rows, int(span * 1e9) // a.row_bytes))
                idx = torch.randint(0, span_rows, (n,), generator=torch.Generator().manual_seed(1)).to(device)
                out = torch.empty(n, cols, device=device)
                got = rates(timed(lambda: torch_direct.gather(table, idx, out=out), device, a.repeats),
                            n, a.row_bytes)
                entry["spans"][f"{span:g}"] = got
                print(f"  unified, rows from the first {span:g} GB: {got['median_s'] * 1e3:8.3f} ms  "
                      f"{got['Mrows_per_s']:7.1f} M rows/s  {got['GBps']:6.2f} GB/s", flush=True)
        entry["huge_page_kb"] = huge_kb
        entry["huge_page_share"] = huge_kb * 1024 / (rows * cols * 4)
        record["tables"][name] = entry
        shown = entry if "median_s" in entry else entry["index_select"]
        print(f"  {name:8s} {shown['median_s'] * 1e3:8.3f} ms  {shown['Mrows_per_s']:7.1f} M rows/s  "
              f"{shown['GBps']:6.2f} GB/s  huge pages {entry['huge_page_share']:.0%}  (made in {entry['made_s']:.1f} s)"
              + (f"; index_select {entry['index_select']['Mrows_per_s']:.1f} M rows/s" if "index_select" in entry
                 else ""), flush=True)
        del table, host   # the huge-page mapping goes with its last tensor
        if release is not None:
            torch.cuda.synchronize(device)
            release()
        if a.out:
            write_record(a.out, record)
    u = record["tables"].get("unified")
    if u is None:
        return finish(a.out, record)
    if "thp" in record["tables"]:
        record["thp_speedup"] = u["median_s"] / record["tables"]["thp"]["median_s"]
        print(f"  thp / unified speed: {record['thp_speedup']:.2f}x")
    if "driver" in record["tables"]:
        record["driver_speedup"] = u["median_s"] / record["tables"]["driver"]["median_s"]
        print(f"  driver / unified speed: {record['driver_speedup']:.2f}x")
    if "vmm_host" in record["tables"]:
        record["vmm_host_speedup_index_select"] = (u["index_select"]["median_s"]
                                                   / record["tables"]["vmm_host"]["index_select"]["median_s"])
        print(f"  vmm_host / unified speed (index_select): {record['vmm_host_speedup_index_select']:.2f}x")
    return finish(a.out, record)


if __name__ == "__main__":
    run("hugepage_gather_probe", main)
