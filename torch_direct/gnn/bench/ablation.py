"""train-ablation: the epoch time with each locality lever off and on.

    python -m torch_direct.gnn.bench train-ablation --dataset products-like --pipeline unified \\
        --reorder frequency --merge-gathers --cache-mb 1024 --epochs 3 --out results/train_ablation.json

Trains the same model on the same data with the same seeds once per configuration:
``baseline`` (no lever), each lever alone (``reorder``: node ids relabelled hot nodes first;
``merge``: the feature gathers of the prefetch window merged into one ordered gather;
``cache``: a GPU cache of the hottest rows; ``graph``: the GPU sampler's CSR in GPU memory
instead of read in place from host memory) and ``all`` of them, and prints one table (epoch
time, speed-up over the baseline, the loader's exposed gather time, loss and accuracy) and a
JSON record. The epoch time is the median over the epochs after the first (the first warms
up), or the one epoch when ``--epochs 1``. Every option of ``python -m torch_direct train``
applies (``--json`` is another name for ``--out``); the lever options give each lever's setting when on (their defaults here: reorder
by frequency, the nodes read most often first, merge the prefetch window, a 256 MiB cache, ``--graph gpu``). The levers change where rows are
read, not what is computed: ``reorder`` and ``merge`` train on the same batches and features
as the baseline (same losses and accuracies), and the cache only exists on a GPU (on a CPU
its row is run and says it had no effect; so does the graph lever).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import statistics
import sys
from pathlib import Path

from .common import check_writable, default_out, machine_record, write_json
from ..pipeline.options import resolve_device

LEVERS = ("reorder", "merge", "cache", "graph")
CONFIGS = (("baseline", ()), ("reorder", ("reorder",)), ("merge", ("merge",)), ("cache", ("cache",)),
           ("graph", ("graph",)), ("all", LEVERS))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..pipeline import train
    train.add_arguments(ap)
    ap.set_defaults(reorder="frequency", merge_gathers=0, cache_mb=256, graph="gpu", epochs=3)
    ap.add_argument("--configs", default=",".join(c for c, _ in CONFIGS),
                    help="configurations to run, comma-separated, from the default list (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON record (default: train_ablation.json in the user's cache, "
                         "~/.cache/torch_direct/results)")
    ap.add_argument("--verbose", action="store_true", help="show each training run's own output")


def _config_args(args, levers) -> argparse.Namespace:
    a = copy.copy(args)
    a.reorder = args.reorder if "reorder" in levers else "none"
    a.merge_gathers = args.merge_gathers if "merge" in levers else 1
    a.cache_share = getattr(args, "cache_share", None) if "cache" in levers else None
    # --cache-share takes the place of the default --cache-mb
    a.cache_mb = args.cache_mb if "cache" in levers and a.cache_share is None else 0
    a.graph = args.graph if "graph" in levers else "unified"
    a.json = a.plot = None
    return a


def epoch_seconds(rec: dict) -> float:
    times = [e["total_s"] for e in rec["epochs"]]
    return statistics.median(times[1:] if len(times) > 1 else times)


def run_ablation(args) -> dict:
    from ..pipeline import train
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    known = dict(CONFIGS)
    bad = [c for c in wanted if c not in known]
    if bad or not wanted:
        raise ValueError(f"--configs: unknown {bad or 'empty list'}; choose from {', '.join(known)}")
    if args.reorder == "none":
        raise ValueError("--reorder none leaves nothing to ablate: give degree or frequency")
    if args.plot:
        raise ValueError("--plot: the ablation prints a table and writes JSON (--out); it draws no plot")
    if args.merge_gathers == 1:
        raise ValueError("--merge-gathers 1 leaves nothing to ablate: give K >= 2 or no K (the prefetch window)")
    device = resolve_device(args.device)
    rows = []
    for name in wanted:
        levers = known[name]
        a = _config_args(args, levers)
        note = ""
        if "cache" in levers:
            if args.pipeline not in ("unified", "cpu_centric"):
                a.cache_mb, a.cache_share = 0, None
                note = f"no cache: --cache-mb does not apply to the {args.pipeline} pipeline"
            elif device.type != "cuda":
                a.cache_mb, a.cache_share, note = 0, None, "no cache: no GPU here (the cache lives in GPU memory)"
            elif args.cache_mb == 0 and a.cache_share is None:
                note = "no cache: --cache-mb 0"
        if "graph" in levers:
            if device.type != "cuda":
                a.graph, note = "unified", (note + "; " if note else "") + "CSR in host memory: no GPU here"
            elif args.pipeline == "gpu_resident":
                note = (note + "; " if note else "") + "gpu_resident keeps the CSR on the GPU in every row"
        out = io.StringIO()
        ctx = contextlib.nullcontext() if args.verbose else contextlib.redirect_stdout(out)
        with ctx:
            rec = train.run(a)
        row = {"config": name, "levers": list(levers), "reorder": a.reorder, "merge_gathers": rec["merge_gathers"],
               "cache_mb": a.cache_mb, "graph": rec["graph"], "epoch_s": epoch_seconds(rec),
               "epoch_times_s": [e["total_s"] for e in rec["epochs"]],
               "exposed_gather_s": statistics.median(e["exposed_s"]["gather"] for e in rec["epochs"]),
               "reorder_s": rec["reorder_s"], "losses": [e["loss"] for e in rec["epochs"]],
               "train_acc": [e["train_acc"] for e in rec["epochs"]], "test_acc": rec["test_acc"],
               "test_acc_full": rec.get("test_acc_full"), "feature_store": rec["feature_store"],
               "note": note}
        rows.append(row)
        print(f"{name}: epoch {row['epoch_s']:.3f} s", file=sys.stderr, flush=True)
    base = next((r for r in rows if r["config"] == "baseline"), None)
    for r in rows:
        r["speedup"] = base["epoch_s"] / r["epoch_s"] if base and r["epoch_s"] > 0 else None
    import torch
    record = {"benchmark": "train-ablation", "machine": machine_record(), "device": str(device),
              "torch_threads": torch.get_num_threads(),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
              "rows": rows}
    return record


def print_table(record: dict) -> None:
    print(f"train-ablation: {record['args']['dataset']}, pipeline {record['args']['pipeline']}, "
          f"device {record['device']}")
    print("| config | reorder | merge | cache MiB | CSR on | epoch s | speed-up | exposed gather s | final loss | test acc | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in record["rows"]:
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        print(f"| {r['config']} | {r['reorder']} | {r['merge_gathers']} | {r['cache_mb']} | {r['graph']} | {r['epoch_s']:.3f} | "
              f"{sp} | {r['exposed_gather_s']:.4f} | {r['losses'][-1]:.4f} | {r['test_acc']:.4f} | {r['note']} |")


def run(args) -> int:
    out = Path(args.json) if args.json else (args.out or default_out("train_ablation"))
    try:
        check_writable(out, "--json" if args.json else "--out")
        record = run_ablation(args)
    except (ValueError, RuntimeError, TypeError, FileNotFoundError) as e:
        print(f"train-ablation: error: {e}", file=sys.stderr)
        return 2
    print_table(record)
    write_json(out, record)
    print(f"wrote {out}")
    return 0
