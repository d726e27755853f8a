"""python -m torch_direct: a short tour of unified tensors on this machine.

    python -m torch_direct demo [--rows N] [--dim D] [--batch B] [--repeats R]
    python -m torch_direct train [--dataset tiny] [--model sage] [--pipeline unified] ...

Builds a feature table in unified memory (mapped, pinned host memory), gathers
random mini-batches of rows onto the GPU (or the CPU when no GPU is usable) in
place, checks them against a CPU gather, and prints the rate and the
allocator's counters. ``train`` trains a GNN over the pipelined loader
(``python -m torch_direct train --help``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def demo(args) -> int:
    import torch_direct

    if args.rows <= 0 or args.dim <= 0 or args.batch <= 0 or args.repeats <= 0:
        print("demo: --rows, --dim, --batch and --repeats must be positive", file=sys.stderr)
        return 2
    gpu = torch.cuda.is_available() and torch_direct.cuda_available()
    dev = torch.device("cuda") if gpu else torch.device("cpu")
    print(f"torch {torch.__version__}, torch_direct {torch_direct.__version__}, "
          f"CUDA build: {torch_direct.built_with_cuda()}, GPU: "
          f"{torch.cuda.get_device_name() if gpu else 'none (gathers run on the CPU, rule R2/R3)'}")
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(args.rows, args.dim, generator=gen)
    t0 = time.perf_counter()
    table = feats.to("unified")
    print(f"table {tuple(table.shape)} float32 ({table.nbytes / 2**20:.1f} MiB) in unified memory "
          f"in {time.perf_counter() - t0:.2f} s")
    idx = torch.randint(0, args.rows, (args.batch,), device=dev, generator=None)
    out = table[idx]  # warm-up (maps the pages for the GPU on first use)
    ok = torch.equal(out.cpu(), feats[idx.cpu()])
    if gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        out = table[idx]
    if gpu:
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.repeats
    moved = args.batch * args.dim * 4
    print(f"gather of {args.batch} random rows -> {out.device}: {dt * 1e3:.3f} ms "
          f"({moved / dt / 1e9:.2f} GB/s), matches CPU gather: {ok}")
    for k, v in torch_direct.memory_stats().items():
        print(f"  {k:24s} {v}")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_direct", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    d = sub.add_parser("demo", help="gather rows of a unified table (the default)")
    d.add_argument("--rows", type=int, default=1_000_000, help="table rows (default: %(default)s)")
    d.add_argument("--dim", type=int, default=128, help="floats per row (default: %(default)s)")
    d.add_argument("--batch", type=int, default=100_000, help="rows per gather (default: %(default)s)")
    d.add_argument("--repeats", type=int, default=20, help="timed gathers (default: %(default)s)")
    from .gnn.pipeline import train
    t = sub.add_parser("train", help="train a GNN over the pipelined loader", description=train.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_arguments(t)
    args = ap.parse_args(argv)
    if args.cmd == "train":
        return train.main(args)
    if args.cmd in (None, "demo"):
        if args.cmd is None:
            args = d.parse_args([])
        return demo(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
