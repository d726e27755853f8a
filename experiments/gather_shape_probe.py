"""Device-side experiment: which shape of read kernel reaches stock index_select's rate.

On a 32 GB table with 400K random indices read in sorted order, stock
``index_select`` over a CUDA alias of the table reads 256-512 B rows 1.1-1.2x
faster than our kernel (docs/gather.md; results/gather_phase_probe.json), and
neither a wider spread over the SMs, other row windows nor narrower loads closed
the gap. The two kernels still differ in how the grid walks the rows: the stock
one gives each thread one 4-byte element per step, 128 threads a block, a full
grid, no unrolling; ours 16-byte chunks, 256 threads a block, four items in
flight per thread at a stride of a block, and a grid cut to a window of rows.

This builds that family of read kernels with CuPy (no rebuild of the extension)
and times each shape against stock ``index_select`` and our kernel on the same
sorted index (median of 5, GB/s of rows moved):

  UNIT     bytes per load (4 or 16)
  THREADS  threads per block (128 or 256)
  UNROLL   items in flight per thread (1 or 4)
  ORDER    "strided": a thread's items a block apart (ours); "adjacent": next to each other
  window   rows in flight (the grid cut to them; 0: a full grid, 8 blocks of 256 threads an SM)

PROBE_ROWS (bytes, default 256,512), PROBE_TABLE_GB (32), PROBE_INDICES (400000).
Each shape's output is checked against stock index_select's before it is timed.
Writes JSON to argv[1]; prints one line per row size with the five fastest shapes.
"""
import itertools
import os
import sys

import torch

import torch_direct
from hybrid_probe import med, report, write_points  # experiments/ is on sys.path when run as python3 experiments/gather_shape_probe.py

KERNEL = r"""
struct alignas(UNIT) Chunk { unsigned char b[UNIT]; };

extern "C" __global__ void __launch_bounds__(THREADS)
read_rows(unsigned long long table_addr, long long stride_bytes, const long long* __restrict__ keys,
          long long n, long long chunks, unsigned long long out_addr, long long out_row_bytes) {
  const char* __restrict__ table = reinterpret_cast<const char*>(table_addr);
  char* __restrict__ out = reinterpret_cast<char*>(out_addr);
  const long long total = n * chunks;
  const long long per_block = static_cast<long long>(THREADS) * UNROLL;
  const long long step = static_cast<long long>(gridDim.x) * per_block;
  for (long long base = static_cast<long long>(blockIdx.x) * per_block; base < total; base += step) {
    Chunk v[UNROLL];
    long long item[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#if ADJACENT
      item[u] = base + static_cast<long long>(threadIdx.x) * UNROLL + u;
#else
      item[u] = base + threadIdx.x + static_cast<long long>(u) * THREADS;
#endif
      if (item[u] < total) {
        const long long j = item[u] / chunks;
        v[u] = reinterpret_cast<const Chunk*>(table + keys[j] * stride_bytes)[item[u] - j * chunks];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (item[u] < total) {
        const long long j = item[u] / chunks;
        reinterpret_cast<Chunk*>(out + j * out_row_bytes)[item[u] - j * chunks] = v[u];
      }
    }
  }
}
"""

SHAPES = list(itertools.product((4, 16), (128, 256), (1, 4), ("strided", "adjacent"), (1024, 2048, 4096, 0)))


def kernel(cp, unit, threads, unroll, order):
    opts = (f"-DUNIT={unit}", f"-DTHREADS={threads}", f"-DUNROLL={unroll}",
            f"-DADJACENT={1 if order == 'adjacent' else 0}")
    return cp.RawKernel(KERNEL, "read_rows", options=opts)


def main():
    import cupy as cp
    import numpy as np

    out = sys.argv[1] if len(sys.argv) > 1 else "gather_shape_probe.json"
    gb = float(os.environ.get("PROBE_TABLE_GB", "32"))
    n = int(os.environ.get("PROBE_INDICES", "400000"))
    row_sizes = [int(x) for x in os.environ.get("PROBE_ROWS", "256,512").split(",") if x]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = torch.empty(int(gb * 1e9) // 4, device="unified")
    base.uniform_(-1, 1)
    g = torch.Generator().manual_seed(0)
    kernels = {}
    res = []
    for row_bytes in row_sizes:
        rows = base.numel() * 4 // row_bytes
        table = base[: rows * row_bytes // 4].view(rows, row_bytes // 4)
        alias = torch_direct._C._as_cuda_alias(table, 0)
        sidx = torch.randint(0, rows, (n,), generator=g).cuda().sort().values
        want = torch.index_select(alias, 0, sidx)
        buf = torch.empty_like(want)
        moved = n * row_bytes / 1e9
        rec = {"row_bytes": row_bytes, "table_gb": gb, "indices": n,
               "stock_read": moved / med(lambda: torch.index_select(alias, 0, sidx)),
               "ours_read": moved / med(lambda: torch_direct.gather(table, sidx, order="as_is")),
               "shapes": {}}
        torch.cuda.synchronize()
        for unit, threads, unroll, order, window in SHAPES:
            key = (unit, threads, unroll, order)
            if key not in kernels:
                kernels[key] = kernel(cp, *key)
            chunks = row_bytes // unit
            per_block = threads * unroll
            full = sms * (2048 // threads)
            blocks = full if window == 0 else max(1, (window * chunks + per_block - 1) // per_block)
            blocks = min(blocks, (n * chunks + per_block - 1) // per_block)
            # pointers as 8-byte integers (the kernel casts them back)
            args = (np.uint64(table.data_ptr()), np.int64(table.stride(0) * 4), np.uint64(sidx.data_ptr()),
                    np.int64(n), np.int64(chunks), np.uint64(buf.data_ptr()), np.int64(row_bytes))

            def launch(k=kernels[key], blocks=blocks, threads=threads, args=args):
                k((blocks,), (threads,), args)

            buf.zero_()
            launch()
            torch.cuda.synchronize()
            name = f"u{unit}_t{threads}_x{unroll}_{order}_w{window}"
            if not torch.equal(buf, want):
                rec["shapes"][name] = "wrong rows"
                continue
            rec["shapes"][name] = moved / med(launch)
        ok = {k: v for k, v in rec["shapes"].items() if isinstance(v, float)}
        rec["best"] = sorted(ok, key=ok.get, reverse=True)[:5]
        report(res, {"row_bytes": row_bytes, "stock_read": rec["stock_read"], "ours_read": rec["ours_read"],
                     **{k: ok[k] for k in rec["best"]}}, digits=2)
        res[-1] = rec  # the JSON keeps every shape
    write_points(out, res)


if __name__ == "__main__":
    main()
