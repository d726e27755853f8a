"""python -m torch_direct.bench BENCHMARK [options]   (BENCHMARK: gather, train, train-ablation, scaling)"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_direct.bench",
                                 description="PyTorch-Direct benchmarks; each writes JSON and can plot it.")
    sub = ap.add_subparsers(dest="bench")
    from . import ablation, gather, scaling, train

    gather.add_arguments(sub.add_parser("gather", help=gather.__doc__.splitlines()[0],
                                        description=gather.__doc__,
                                        formatter_class=argparse.RawDescriptionHelpFormatter))
    train.add_arguments(sub.add_parser("train", help=train.__doc__.splitlines()[0],
                                       description=train.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter))
    ablation.add_arguments(sub.add_parser("train-ablation", help=ablation.__doc__.splitlines()[0],
                                          description=ablation.__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    scaling.add_arguments(sub.add_parser("scaling", help=scaling.__doc__.splitlines()[0],
                                         description=scaling.__doc__,
                                         formatter_class=argparse.RawDescriptionHelpFormatter))
    args = ap.parse_args(argv)
    if args.bench == "gather":
        return gather.run(args)
    if args.bench == "train":
        return train.run(args)
    if args.bench == "train-ablation":
        return ablation.run(args)
    if args.bench == "scaling":
        return scaling.run(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
