"""python -m torch_direct.gnn.graph: generate, convert and inspect node-classification data sets."""

from __future__ import annotations

import argparse
import sys
import time

from .datasets import PRESETS, default_root, load_dataset


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_direct.gnn.graph",
        description="Generate a synthetic preset or parse an OGB data set into the cache, then print "
                    "its shape. Presets: " + ", ".join(PRESETS) + ". OGB names (ogbn-arxiv, "
                    "ogbn-products, ogbn-papers100M) are read from --root in OGB's own layout.")
    parser.add_argument("dataset", help="preset name or OGB name")
    parser.add_argument("--root", default=None,
                        help=f"cache / OGB directory (default: $TORCH_DIRECT_DATA or {default_root()})")
    parser.add_argument("--seed", type=int, default=0, help="generator seed of a preset (default 0)")
    parser.add_argument("--regenerate", action="store_true", help="generate a preset again even if cached")
    parser.add_argument("--workers", type=int, default=None,
                        help="generator threads (default: CPU count, at most 16; results do not depend on it)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        ds = load_dataset(args.dataset, args.root, seed=args.seed, regenerate=args.regenerate,
                          show_progress=not args.quiet, workers=args.workers)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    deg = ds.graph.degree()
    print(ds)
    print(f"  degree: mean {float(deg.float().mean()):.2f}, max {int(deg.max())}; "
          f"ready in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
