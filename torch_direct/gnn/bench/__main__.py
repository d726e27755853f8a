"""python -m torch_direct.gnn.bench BENCHMARK [options]   (BENCHMARK: gather, train, train-ablation, scaling, embedding)"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_direct.gnn.bench",
                                 description="PyTorch-Direct benchmarks; each writes JSON and can plot it.")
    sub = ap.add_subparsers(dest="bench")
    from . import ablation, embedding, gather, scaling, train

    # Each benchmark module: its docstring is its help, add_arguments its options, run its body.
    benches = {"gather": gather, "train": train, "train-ablation": ablation, "scaling": scaling,
               "embedding": embedding}
    for name, mod in benches.items():
        mod.add_arguments(sub.add_parser(name, help=mod.__doc__.splitlines()[0], description=mod.__doc__,
                                         formatter_class=argparse.RawDescriptionHelpFormatter))
    args = ap.parse_args(argv)
    if args.bench in benches:
        return benches[args.bench].run(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
