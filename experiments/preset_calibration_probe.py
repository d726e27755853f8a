"""How hard a synthetic preset's labels are, without a GPU: linear classifiers
standing in for an MLP (the features alone) and for a GNN (the features with
their 1- and 2-hop neighbour means, as SIGN does), fitted on the train split
and scored on the test split, next to the degree statistics of the graph.

    python experiments/preset_calibration_probe.py arxiv-like
    python experiments/preset_calibration_probe.py products-like --scale 0.1 \
        --set label_noise=0.2 --set homophily=0.8

``--scale`` shrinks node count, edge count and split sizes together (the mean
degree stays), so a knob can be tried on a large preset in minutes; ``--set``
overrides a knob of the preset. One JSON line per run goes to stdout (and to
``--out`` when given). The linear stand-ins only rank settings: the accuracy
that counts is GraphSAGE's, from ``python -m torch_direct.gnn.pipeline.train``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from torch_direct.gnn.graph.datasets import PRESETS, generate, split_sizes

KNOBS = ("homophily", "signal", "label_noise", "max_degree")


def ridge_accuracy(features: torch.Tensor, y: torch.Tensor, train: torch.Tensor, test: torch.Tensor,
                   num_classes: int, reg: float = 1e-2) -> float:
    """Test accuracy of a one-vs-rest ridge-regression classifier."""
    def with_bias(rows):
        return torch.cat([features[rows].double(), torch.ones(len(rows), 1, dtype=torch.float64)], 1)
    a = with_bias(train)
    target = torch.nn.functional.one_hot(y[train], num_classes).double()
    w = torch.linalg.solve(a.T @ a + reg * torch.eye(a.size(1), dtype=torch.float64), a.T @ target)
    return float(((with_bias(test) @ w).argmax(1) == y[test]).float().mean())


def neighbour_mean(rowptr: torch.Tensor, col: torch.Tensor, x: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
    """Row v: the mean of x over v's neighbours (zero for an isolated node), float32."""
    n = rowptr.numel() - 1
    out = torch.zeros(n, x.size(1))
    deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).float()
    start = 0
    while start < n:   # node ranges of at most ``chunk`` entries, to bound memory
        end = int(torch.searchsorted(rowptr, rowptr[start] + chunk, right=True)) - 1
        end = max(start + 1, min(end, n))
        a, b = int(rowptr[start]), int(rowptr[end])
        rows = torch.repeat_interleave(torch.arange(start, end), rowptr[start + 1:end + 1] - rowptr[start:end])
        out.index_add_(0, rows, x[col[a:b].long()].float())
        start = end
    return out / deg[:, None]


def scaled(name: str, scale: float, overrides: dict):
    p = dataclasses.replace(PRESETS[name], **overrides)
    if scale == 1.0:
        return p
    sizes = split_sizes(p)
    n = max(100, int(p.num_nodes * scale))
    m = int(p.num_edges * n / p.num_nodes)
    m -= m % 2
    md = p.max_degree if p.max_degree is None else max(2 * m // n + 1, int(p.max_degree * scale ** 0.5))
    return dataclasses.replace(p, num_nodes=n, num_edges=m, max_degree=md,
                               split=tuple(max(1, int(s * scale)) for s in sizes))


def parse_set(items) -> dict:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or key not in KNOBS:
            raise SystemExit(f"--set: expected KNOB=VALUE with KNOB one of {', '.join(KNOBS)}, got {item!r}")
        try:
            out[key] = None if value == "none" else (int(value) if key == "max_degree" else float(value))
        except ValueError:
            raise SystemExit(f"--set: {key} needs a number, got {value!r}") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the preset (0 < s <= 1; default 1)")
    ap.add_argument("--set", action="append", metavar="KNOB=VALUE", help=f"override one of {', '.join(KNOBS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="append the JSON line to this file too")
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 1:
        ap.error("--scale must lie in (0, 1]")
    try:
        p = scaled(args.preset, args.scale, parse_set(args.set))
    except ValueError as e:   # a knob the preset refuses (homophily above 1, say)
        ap.error(str(e))
    t0 = time.perf_counter()
    ds = generate(args.preset, seed=args.seed, preset=p, show_progress=sys.stderr.isatty())
    gen_s = time.perf_counter() - t0
    g, y = ds.graph, ds.y
    deg = g.degree().float()
    x = ds.x.float()
    h1 = neighbour_mean(g.rowptr, g.col, x)
    h2 = neighbour_mean(g.rowptr, g.col, h1)
    tr, te = ds.split["train"], ds.split["test"]
    if te.numel() > 200_000:   # scoring needs no more
        te = te[torch.randperm(te.numel(), generator=torch.Generator().manual_seed(0))[:200_000]]
    args_ = (y, tr, te, ds.num_classes)
    rec = {"preset": args.preset, "scale": args.scale, "seed": args.seed,
           "knobs": {k: getattr(p, k) for k in KNOBS},
           "num_nodes": g.num_nodes, "entries": g.num_edges, "target_entries": p.num_edges,
           "degree": {"mean": round(float(deg.mean()), 2), "median": float(deg.median()),
                      "max": int(deg.max()), "isolated": int((deg == 0).sum())},
           "generate_s": round(gen_s, 1),
           "linear_features": round(ridge_accuracy(x, *args_), 4),
           "linear_sign2": round(ridge_accuracy(torch.cat([x, h1, h2], 1), *args_), 4)}
    line = json.dumps(rec)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
