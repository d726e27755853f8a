"""Device-side experiment: several `bench train` runs in one process over one relabelled copy
of the data set, each with options of its own, each written to a record of its own.

A `--reorder` is made by the first run and used by the others (bench train's
`keep_reordered`): on papers100M-like it takes minutes, so that comparing levers one process
at a time spends most of a device call reordering.

    python experiments/train_variants.py --out-dir OUT --name papers \\
        --variant one= --variant two="--gather-workers 2" \\
        --experimental split=cached_gather=split --variant split= \\
        -- --dataset papers100M-like --pipelines unified --graph gpu --reorder frequency ...

Each variant's options follow the common ones after `--` (for an option given twice, the
variant's wins). `--experimental NAME=k=v[,k=v]` runs variant NAME under those experimental
settings (torch_direct.experimental). `--oom-report` records each live GPU block's Python
stack and, at a variant's first CUDA out-of-memory error, writes what held the memory
(experiments/gpu_memory_report.py) to OUT/oom_<name>_<variant>.json. `--cuda-sync NAME=MODE` runs
variant NAME with the GPU's host waits in MODE (auto, spin, yield or blocking: how a thread that
waits for the device, a loader thread's count of misses or the loop's wait for a buffer set,
gives its core to the others; CUDA's auto spins on a machine of more cores than processes), put
back to what it was after. `--misses-in-batch-order NAME` runs variant NAME with the cached
stores' split gathers reading their misses in the batch's order, as before they were sorted
(`torch_direct.gnn.pipeline.cache.SORT_MISSES`). The records are OUT/train_<name>_<variant>.json, each
with a "variant" object saying what its run added. Variants run in the order given; a variant
that fails is recorded as bench train records a failed row, and the others still run.
"""
import argparse
import ctypes
import os
import shlex
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import run  # noqa: E402

# cudaDeviceSchedule* of the CUDA runtime: the low three bits of a device's flags
CUDA_SYNC = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}
_SCHEDULE_BITS = 7


def parse_pairs(items, what: str) -> dict:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{what} {item!r}: give NAME=VALUE, NAME of letters, digits, '-' or '_'")
        if name in out:
            raise ValueError(f"{what}: {name} is given twice")
        out[name] = value
    return out


def check_names(names, variants, flag: str) -> None:
    """Refuse a per-variant option (``flag``) that names a variant not given."""
    unknown = sorted(set(names) - set(variants))
    if unknown:
        raise ValueError(f"{flag} names no variant: {', '.join(unknown)}")


def settings_of(text: str, name: str) -> dict:
    settings = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"--experimental {name}: give k=v[,k=v], got {text!r}")
        settings[key] = value
    return settings


def cuda_runtime():
    """The CUDA runtime torch loaded (found by its soname, so no second copy is loaded)."""
    import torch
    lib = ctypes.CDLL(f"libcudart.so.{torch.version.cuda.split('.')[0]}")
    lib.cudaGetDeviceFlags.argtypes = [ctypes.POINTER(ctypes.c_uint)]
    lib.cudaSetDeviceFlags.argtypes = [ctypes.c_uint]
    return lib


def _cuda_call(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"--cuda-sync: {what} failed with CUDA error {rc}")


class CudaSync:
    """The current GPU's host waits in ``mode`` (a key of CUDA_SYNC; None: left as they are)
    for a block, and the flags as they were put back after (the runtime lets an initialised
    device's flags be set again)."""

    def __init__(self, mode):
        self.mode, self.before = mode, None

    def __enter__(self):
        if self.mode is None:
            return self
        import torch
        torch.cuda.init()
        self.lib = cuda_runtime()
        flags = ctypes.c_uint()
        _cuda_call(self.lib.cudaGetDeviceFlags(ctypes.byref(flags)), "cudaGetDeviceFlags")
        self.before = flags.value
        _cuda_call(self.lib.cudaSetDeviceFlags((self.before & ~_SCHEDULE_BITS) | CUDA_SYNC[self.mode]),
                   "cudaSetDeviceFlags")
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            _cuda_call(self.lib.cudaSetDeviceFlags(self.before), "cudaSetDeviceFlags")
        return False


def release_gpu_cache() -> None:
    """Give the blocks the caching allocator keeps from a variant back to the driver, so that
    the next variant starts with the GPU memory a process of its own would have."""
    import gc
    import torch
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def gpu_memory() -> dict | None:
    """This process's GPU memory now, in GiB: what its tensors hold and what the caching
    allocator reserves (None without an initialised GPU): in each variant's record, so that
    memory a run leaves behind shows in the next one's."""
    import torch
    if not torch.cuda.is_initialized():
        return None
    return {"allocated_gib": torch.cuda.memory_allocated() / 2**30, "reserved_gib": torch.cuda.memory_reserved() / 2**30}


def gpu_memory_peak() -> dict | None:
    """The most this process's tensors and the caching allocator held since the last
    ``torch.cuda.reset_peak_memory_stats()``, in GiB, and how often since the last
    ``reset_accumulated_memory_stats()`` the allocator found no free block, gave its cached
    ones back to the device and tried again (each a wait for the device), or freed device
    memory at all (None without an initialised GPU)."""
    import torch
    if not torch.cuda.is_initialized():
        return None
    stats = torch.cuda.memory_stats()
    return {"allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "alloc_retries": stats.get("num_alloc_retries"), "device_frees": stats.get("num_device_free")}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        cut = argv.index("--")
        own, common = argv[:cut], argv[cut + 1:]
    else:
        own, common = argv, []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s --out-dir DIR --name NAME --variant V=OPTIONS ... -- BENCH_TRAIN_OPTIONS")
    ap.add_argument("--out-dir", required=True, type=Path, help="folder of the records (made if missing)")
    ap.add_argument("--name", required=True, help="the records' common name: train_<name>_<variant>.json")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS",
                    help="a run: its name and the bench train options it adds (may be empty)")
    ap.add_argument("--experimental", action="append", default=[], metavar="NAME=k=v[,k=v]",
                    help="experimental settings for variant NAME")
    ap.add_argument("--cuda-sync", action="append", default=[], metavar="NAME=MODE",
                    help="variant NAME's host waits for the GPU: " + ", ".join(CUDA_SYNC)
                         + " (CUDA's schedule flag; default: as the process has them)")
    ap.add_argument("--misses-in-batch-order", action="append", default=[], metavar="NAME",
                    help="variant NAME's cached gathers read their misses in the batch's order, not sorted")
    ap.add_argument("--oom-report", action="store_true",
                    help="on a variant's CUDA out-of-memory error, write what held the GPU memory "
                         "to OUT/oom_<name>_<variant>.json (records each live block's stack: slower)")
    a = ap.parse_args(own)
    variants = parse_pairs(a.variant, "--variant")
    if not variants:
        raise ValueError("give at least one --variant NAME=OPTIONS")
    experimental = {k: settings_of(v, k) for k, v in parse_pairs(a.experimental, "--experimental").items()}
    check_names(experimental, variants, "--experimental")
    sync = parse_pairs(a.cuda_sync, "--cuda-sync")
    check_names(sync, variants, "--cuda-sync")
    bad = {k: v for k, v in sync.items() if v not in CUDA_SYNC}
    if bad:
        raise ValueError(f"--cuda-sync: a mode is one of {', '.join(CUDA_SYNC)}, got {bad}")
    check_names(a.misses_in_batch_order, variants, "--misses-in-batch-order")

    import torch
    import torch_direct
    from torch_direct.gnn.bench import train as bench_train
    from torch_direct.gnn.outputs import check_writable, write_json
    from torch_direct.gnn.pipeline import cache
    from torch_direct.gnn.pipeline.train import keep_reordered

    parser = argparse.ArgumentParser(prog="bench train")
    bench_train.add_arguments(parser)
    runs = []
    for name, options in variants.items():   # every variant is checked before any runs
        args = parser.parse_args(common + shlex.split(options) + ["--out", str(a.out_dir / f"train_{a.name}_{name}.json")])
        if args.json:
            raise ValueError("give no --json: each variant's record is written under --out-dir")
        check_writable(args.out, "--out-dir")
        with torch_direct.experimental(**experimental.get(name, {})):
            bench_train.check_bench(args)
        runs.append((name, options, args))
    if sync and not torch_direct.cuda_available():
        raise ValueError("--cuda-sync sets how the host waits for a GPU, and CUDA is not available here")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    with keep_reordered():
        for name, options, args in runs:
            path = Path(args.out)
            before = gpu_memory()
            # a run's loader or sampling threads still alive would hold its stores and GPU CSR
            left = sorted(t.name for t in threading.enumerate() if t.name.startswith("torch_direct"))
            held = "" if before is None else (f" (GPU memory before it: {before['allocated_gib']:.2f} GiB allocated, "
                                              f"{before['reserved_gib']:.2f} GiB reserved)")
            print(f"variant {name}: {options or '(the common options)'}{held}", file=sys.stderr, flush=True)
            if torch.cuda.is_initialized():
                torch.cuda.reset_peak_memory_stats()
                torch.cuda.reset_accumulated_memory_stats()
            watch = None
            if a.oom_report and torch_direct.cuda_available():
                from gpu_memory_report import OomReport
                watch = OomReport(a.out_dir / f"oom_{a.name}_{name}.json")
            try:
                cache.SORT_MISSES = name not in a.misses_in_batch_order
                with torch_direct.experimental(**experimental.get(name, {})), CudaSync(sync.get(name)):
                    record = bench_train.run_bench(args, path)
            finally:
                cache.SORT_MISSES = True
                if watch is not None:
                    watch.close()
            record["variant"] = {"name": name, "options": options, "experimental": experimental.get(name, {}),
                                 "gpu_memory_before": before, "gpu_memory_peak": gpu_memory_peak(),
                                 "threads_before": left, "cuda_sync": sync.get(name),
                                 "misses_in_batch_order": name in a.misses_in_batch_order,
                                 # the caching allocator's settings, read by torch from the
                                 # environment when the process starts (None: its defaults)
                                 "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
            write_json(path, record)
            bench_train.print_table(record)
            print(f"wrote {path}", flush=True)
            release_gpu_cache()


if __name__ == "__main__":
    run("train_variants", main)
