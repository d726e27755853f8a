"""Device-side experiment: where the CPU time of one GPU-centric gather goes.

`bench gather` counts process CPU seconds per GB moved. On a 1 GB table with 64 B rows the
CPU-centric path is one serial index_select of a few ms, so our fixed per-call cost decides the
ratio. This times, per call (median of PROBE_REPS calls, each waited for with a blocking event
as the benchmark does), the process and the calling thread's CPU time and the wall time of:
  gather            torch_direct.gather(u, idx), random index (index check, sort, read)
  gather_sorted     the same index sorted beforehand (no sort)
  gather_as_is      order="as_is" (no sort)
  c_call            the C++ entry point directly (no Python argument checks)
  cuda_table        torch_direct.gather of a CUDA (device-resident) table: no unified alias
  empty_launch      torch.empty + zero_ (one allocation, one kernel: the floor of any call)
  cpu_centric       index_select into pinned memory + one copy (the benchmark's baseline)
for rows of PROBE_ROWS bytes (default 64,128) of a 1 GB float32 table, PROBE_N indices (400000).
Writes JSON to argv[1].
"""
import json
import os
import statistics
import sys
import time

import torch

import torch_direct
from torch_direct import _C


def per_call(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    proc, thr, wall = [], [], []
    for _ in range(reps):
        p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        end = torch.cuda.Event(blocking=True)
        fn()
        end.record()
        end.synchronize()
        proc.append(time.process_time() - p0)
        thr.append(time.thread_time() - t0)
        wall.append(time.perf_counter() - w0)
    us = lambda xs: round(statistics.median(xs) * 1e6, 1)  # noqa: E731
    return {"process_us": us(proc), "thread_us": us(thr), "wall_us": us(wall)}


def main(out_path):
    reps = int(os.environ.get("PROBE_REPS", "200"))
    n = int(os.environ.get("PROBE_N", "400000"))
    rows_list = [int(x) for x in os.environ.get("PROBE_ROWS", "64,128").split(",")]
    torch.set_num_threads(os.cpu_count() or 1)
    base = torch.empty(int(1e9) // 4, device="unified")
    base.uniform_(-1, 1)
    host = _C._as_cpu_alias(base)
    res = []
    g = torch.Generator().manual_seed(0)
    for row_bytes in rows_list:
        width = row_bytes // 4
        n_rows = base.numel() // width
        u = base[: n_rows * width].view(n_rows, width)
        h = host[: n_rows * width].view(n_rows, width)
        idx_cpu = torch.randint(0, n_rows, (n,), generator=g)
        idx = idx_cpu.cuda()
        idx_sorted = idx.sort().values
        out = torch.empty(n, width, device="cuda")
        resident = h[: min(n_rows, 1 << 22)].cuda()
        idx_res = idx % resident.shape[0]
        pinned = torch.empty(n, width, pin_memory=True)
        dst = torch.empty(n, width, device="cuda")

        def cpu_centric():
            torch.index_select(h, 0, idx_cpu, out=pinned)
            dst.copy_(pinned, non_blocking=True)

        variants = {
            "gather": lambda: torch_direct.gather(u, idx),
            "gather_sorted": lambda: torch_direct.gather(u, idx_sorted),
            "gather_as_is": lambda: torch_direct.gather(u, idx, order="as_is"),
            "c_call": lambda: _C._gather_rows_cuda(u, idx, out, 0, 0, None),
            "cuda_table": lambda: torch_direct.gather(resident, idx_res),
            "empty_launch": lambda: torch.empty(n, width, device="cuda").zero_(),
            "cpu_centric": cpu_centric,
        }
        assert torch.equal(torch_direct.gather(u, idx).cpu(), h[idx_cpu])
        for name, fn in variants.items():
            r = {"row_bytes": row_bytes, "indices": n, "variant": name, **per_call(fn, reps)}
            r["cpu_s_per_GB"] = round(r["process_us"] * 1e-6 / (n * row_bytes / 1e9), 5)
            res.append(r)
            print(json.dumps(r), flush=True)
    with open(out_path, "w") as f:
        json.dump({"machine": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "threads": torch.get_num_threads(), "points": res}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gather_cpu_probe.json")
