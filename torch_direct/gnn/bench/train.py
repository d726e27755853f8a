"""train: end-to-end epoch time of each training pipeline on the same data, model and seeds.

    python -m torch_direct.gnn.bench train --dataset products-like --epochs 3 \\
        --pipelines unified,cpu_centric,gpu_resident,pyg --out results/train_products-like.json --plot train.svg

Trains the same model (default GraphSAGE, hidden 256, fanouts 15,10,5, batch 1024) with the
same seeds once per pipeline: ``unified`` (zero-copy gathers from pinned host memory),
``cpu_centric`` (CPU slicing into pinned buffers + DMA), ``gpu_resident`` (every feature on
the GPU) and ``pyg`` (PyG's NeighborLoader with worker processes and ``.to(device)``, the path a
PyG user writes; see ``torch_direct/gnn/pipeline/pyg_baseline.py``). Prints one table (epoch time,
speed relative to unified, the exposed loader time per stage, final loss, test accuracy) and
the headline ratios (``unified_vs_cpu_centric`` = cpu_centric epoch / unified epoch,
``unified_vs_pyg``, ``gpu_resident_vs_unified`` = unified epoch / gpu_resident epoch), and writes
the JSON record after each pipeline (a killed run keeps what it measured). The epoch time is the
median over the epochs after the first (the first warms up), or the one epoch when
``--epochs 1``; the exposed stage times are medians over the same epochs. ``--repeats N`` trains
each pipeline N times, the pipelines taking turns (so that a drift of the machine touches each
alike); a pipeline's row is then its median run (by epoch time; the lower middle one for an
even N), with every run's epoch time and test accuracy beside it, and the ratios are those of
the median runs.

Every option of ``python -m torch_direct train`` applies to every pipeline (``--json`` is
another name for ``--out``; ``--pipeline`` is replaced by ``--pipelines``); ``--cache-mb``
applies to unified only, the PyG pipeline does not merge gathers, and cpu_centric, which samples
on the CPU, takes one sampling thread for ``--sample-ahead K`` (each change is noted in its row);
options that a pipeline would refuse are refused before the first one runs. A pipeline that cannot
run here is recorded as skipped with the reason: ``gpu_resident`` without a GPU or with
``--device cpu``, ``pyg`` without torch_geometric or without pyg-lib / torch-sparse (its
NeighborLoader's sampler). A pipeline that fails while running (out of memory, say) is
recorded as failed with the error, the others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import re
import statistics
import sys
import time
from pathlib import Path

from .ablation import epoch_seconds
from .common import (check_writable, default_out, key_medians, machine_record, median_or_none, print_host_side,
                     print_markdown, run_and_report, write_json)
from .targets import add_targets
from ..pipeline.options import check_machine, positive, resolve_device

PIPELINES = ("unified", "cpu_centric", "gpu_resident", "pyg")
# Headline ratios: name -> (numerator pipeline, denominator pipeline) of epoch seconds.
RATIOS = {"unified_vs_cpu_centric": ("cpu_centric", "unified"),
          "unified_vs_pyg": ("pyg", "unified"),
          "gpu_resident_vs_unified": ("unified", "gpu_resident")}


def _set_help(ap: argparse.ArgumentParser, dest: str, text: str) -> None:
    for action in ap._actions:
        if action.dest == dest:
            action.help = text


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..pipeline import train
    train.add_arguments(ap)
    ap.set_defaults(epochs=3, pipeline=None)
    _set_help(ap, "epochs", "training epochs per pipeline (default: %(default)s)")
    _set_help(ap, "pipeline", "not used here: give --pipelines")
    _set_help(ap, "json", "another name for --out")
    _set_help(ap, "pyg_workers", "worker processes of the pyg pipeline's NeighborLoader (default: min(4, CPUs) "
                                 "= %(default)s)")
    _set_help(ap, "plot", "also draw a bar chart of the epoch time per pipeline, stacked by exposed "
                          "loader stage, to PATH (.svg; .png with matplotlib)")
    ap.add_argument("--pipelines", default=",".join(PIPELINES),
                    help="pipelines to run, comma-separated, from the default list (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON record (default: train_<dataset>.json in the user's cache, "
                         "~/.cache/torch_direct/results)")
    ap.add_argument("--repeats", type=positive(int), default=1,
                    help="train each pipeline this many times, the pipelines taking turns; a row is its "
                         "pipeline's median run by epoch time (default: %(default)s)")
    ap.add_argument("--verbose", action="store_true", help="show each training run's own output")


def median_row(runs: list[dict]) -> dict:
    """One pipeline's row from its runs: the first run that did not finish, else the median run by
    epoch time (the lower middle one for an even count) with every run's epoch time and test
    accuracy under ``repeats``, and the seconds all of them spent reordering (one run made the
    relabelled copy the others used)."""
    for r in runs:
        if r["status"] != "ok":
            return r
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda r: r["epoch_s"])
    row = dict(ordered[(len(runs) - 1) // 2])
    row["repeats"] = {"epoch_s": [r["epoch_s"] for r in runs], "test_acc": [r["test_acc"] for r in runs]}
    row["reorder_s"] = sum(r.get("reorder_s", 0.0) for r in runs)
    parts = {}
    for r in runs:
        for k, v in (r.get("reorder_parts_s") or {}).items():
            parts[k] = parts.get(k, 0.0) + v
    row["reorder_parts_s"] = parts
    return row


def parse_pipelines(text: str) -> list[str]:
    """The names in a ``--pipelines`` list, in order, each once; ValueError for an unknown name
    or an empty list."""
    wanted = []
    for name in (p.strip() for p in text.split(",")):
        if name and name not in wanted:
            wanted.append(name)
    bad = [p for p in wanted if p not in PIPELINES]
    if bad or not wanted:
        raise ValueError(f"--pipelines: unknown {', '.join(map(repr, bad)) if bad else 'empty list'}; "
                         f"choose from {', '.join(PIPELINES)}")
    return wanted


def out_path(args) -> Path:
    if args.json:
        return Path(args.json)
    if args.out:
        return Path(args.out)
    return default_out(f"train_{re.sub(r'[^A-Za-z0-9_.-]', '_', Path(str(args.dataset)).name)}")


def _skip_reason(name: str, device) -> str | None:
    if name == "gpu_resident" and device.type != "cuda":
        from ..pipeline.features import cuda_usable
        if cuda_usable():
            return "gpu_resident keeps every feature in GPU memory: not run with --device cpu"
        return "gpu_resident keeps every feature in GPU memory: no usable CUDA GPU here"
    if name == "pyg":
        from ..pipeline import pyg_baseline
        return pyg_baseline.unavailable()
    return None


def epoch_row(name: str, rec: dict, note: str) -> dict:
    epochs = rec["epochs"]
    timed = epochs[1:] if len(epochs) > 1 else epochs      # the epochs epoch_seconds takes
    stages = ("sample", "gather", "transfer")
    exposed = {k: statistics.median(e["exposed_s"][k] for e in timed) for k in stages}
    # Busy seconds per stage (CUDA events on the loader's streams): what each stage costs, where
    # exposed says what the training loop waited for.
    busy = {k: statistics.median(e["busy_s"][k] for e in timed) for k in stages if "busy_s" in timed[0]}
    row = {"pipeline": name, "status": "ok", "epoch_s": epoch_seconds(rec),
           "epoch_times_s": [e["total_s"] for e in epochs],
           "train_step_s": statistics.median(e["train_step_s"] for e in timed),
           "train_step_host_s": statistics.median(e["train_step_host_s"] for e in timed),
           "train_step_cpu_s": statistics.median(e["train_step_cpu_s"] for e in timed),
           "train_step_copy_wait_s": median_or_none(e.get("train_step_copy_wait_s") for e in timed),
           "train_steps_dry": median_or_none(e.get("train_steps_dry") for e in timed),
           "train_step_dry_host_s": median_or_none(e.get("train_step_dry_host_s") for e in timed),
           "loop_run_delay_s": median_or_none(e["loop_run_delay_s"] for e in timed),
           "loop_gil_wait_ms": median_or_none(e.get("loop_gil_wait_ms") for e in timed),
           "process_cpu_s": median_or_none(e["process_cpu_s"] for e in timed),
           "loader_threads": key_medians([e["loader_threads"] for e in timed]),
           "gather_parts": key_medians([e.get("gather_parts", {}) for e in timed]),
           "loader_wait_s": statistics.median(e["loader_wait_s"] for e in timed),
           "exposed_s": exposed, "busy_s": busy, "losses": [e["loss"] for e in epochs],
           "train_acc": [e["train_acc"] for e in epochs], "valid_acc": [e["valid_acc"] for e in epochs],
           "test_acc": rec["test_acc"], "backend": rec["backend"], "sampler": rec["sampler"],
           "device": rec["device"], "graph": rec.get("graph"), "note": note}
    if "test_acc_full" in rec:
        row["test_acc_full"] = rec["test_acc_full"]
    for k in ("feature_store", "block_mode", "num_workers", "cuda_graph", "reorder_s", "reorder_parts_s"):
        if k in rec:
            row[k] = rec[k]
    return row


def pipeline_args(name: str, args, device):
    """The options pipeline ``name`` runs with, and a note for each one changed from ``args``
    because it does not apply to that pipeline."""
    from ..pipeline.options import uses_gpu_sampler
    a = copy.copy(args)
    a.pipeline = name
    a.json = a.plot = None
    notes = []
    if args.cache_mb and name != "unified":
        a.cache_mb = 0
        notes.append(f"no cache: --cache-mb applies to unified, not {name}")
    if getattr(args, "cache_share", None) is not None and name != "unified":
        a.cache_share = None
        notes.append(f"no cache: --cache-share applies to unified, not {name}")
    if args.gather_sms and name != "unified":
        a.gather_sms = 0
        notes.append(f"all SMs: --gather-sms applies to unified, not {name}")
    if args.gather_cpu_threads and name != "unified":
        a.gather_cpu_threads = 0
        a.gather_cpu_share = None
        notes.append(f"GPU-centric: --gather-cpu-threads applies to unified, not {name}")
    if args.graph == "gpu" and name in ("cpu_centric", "pyg"):
        a.graph = "unified"   # both sample on the CPU, from the CSR in host memory, by definition
        notes.append(f"CSR in host memory: {name} samples on the CPU")
    if name == "pyg":   # the options of our loaders that PyG's has no counterpart for
        for attr, default, note in (("merge_gathers", 1, "no merged gathers: PyG's loader gathers per batch"),
                                    ("sampler", "auto", "--sampler does not apply: PyG samples in its loader"),
                                    ("sample_ahead", False, "no sample-ahead: PyG's workers sample and slice "
                                                            "together"),
                                    ("gather_workers", 1, "one gathering thread: PyG's workers sample and "
                                                          "slice together"),
                                    ("loader_priority", "normal", "no stream priority: PyG's loader has no "
                                                                  "CUDA streams")):
            if getattr(args, attr) != default:
                setattr(a, attr, default)
                notes.append(note)
    elif name == "cpu_centric" and not uses_gpu_sampler(a, device.type == "cuda"):
        # the GPU sampler's levers, where cpu_centric samples on the CPU as it does by definition
        # (another pipeline on the CPU sampler refuses them, as train does)
        if a.sample_ahead > 1:
            a.sample_ahead = 1
            notes.append(f"one sampling thread: --sample-ahead {args.sample_ahead} applies to the GPU sampler, "
                         f"and the CPU sampler samples on every core already")
        if getattr(a, "sampler_batches", 1) > 1:
            a.sampler_batches = 1
            notes.append("one batch per sampler call: --sampler-batches applies to the GPU sampler")
    return a, notes


def check_pipelines(wanted, args, device) -> None:
    """Refuse, before any pipeline runs, options that one of ``wanted`` would refuse once its
    turn came (the error names that pipeline)."""
    from ..pipeline.options import check_options
    for name in wanted:
        if _skip_reason(name, device):
            continue
        a, _ = pipeline_args(name, args, device)
        try:
            check_options(a, device)
        except ValueError as e:
            raise ValueError(f"--pipelines {name}: {e}") from None


def _run_one(name: str, args, device) -> dict:
    from ..pipeline import pyg_baseline, train
    reason = _skip_reason(name, device)
    if reason:
        return {"pipeline": name, "status": "skipped", "reason": reason, "epoch_s": None}
    a, notes = pipeline_args(name, args, device)
    out = io.StringIO()
    ctx = contextlib.nullcontext() if args.verbose else contextlib.redirect_stdout(out)
    try:
        with ctx:
            rec = pyg_baseline.run(a) if name == "pyg" else train.run(a)
    except ImportError as e:    # PyG's loader found no sampler after all
        return {"pipeline": name, "status": "skipped", "reason": str(e), "epoch_s": None}
    except (RuntimeError, MemoryError) as e:   # out of memory, a CUDA error: the others still run
        return {"pipeline": name, "status": "failed", "reason": f"{type(e).__name__}: {e}", "epoch_s": None}
    return epoch_row(name, rec, "; ".join(notes))


def add_ratios(record: dict) -> None:
    """Each ran row's ``speedup_vs`` (other's epoch / this epoch, per other ran pipeline) and the
    record's headline ``ratios`` (where both sides ran)."""
    ran = {r["pipeline"]: r for r in record["rows"] if r["status"] == "ok" and r["epoch_s"] > 0}
    for r in record["rows"]:
        if r["status"] == "ok":
            r["speedup_vs"] = {o: ran[o]["epoch_s"] / r["epoch_s"] for o in ran if o != r["pipeline"]} \
                if r["epoch_s"] > 0 else {}
    record["ratios"] = {k: ran[a]["epoch_s"] / ran[b]["epoch_s"] for k, (a, b) in RATIOS.items()
                        if a in ran and b in ran}


def check_bench(args):
    """(pipelines, device) of a bench train run, after refusing any option one of its runs would
    refuse once its turn came."""
    wanted = parse_pipelines(args.pipelines)
    if args.pipeline is not None:
        raise ValueError(f"--pipeline: this benchmark runs every pipeline of --pipelines; "
                         f"give --pipelines {args.pipeline}")
    if args.plot:
        from ..pipeline.plot import check_bench_plot_path
        check_bench_plot_path(args.plot)
    device = resolve_device(args.device)
    if device.type != "cuda":
        # unified's GPU-only levers (gpu_resident itself is skipped with its reason)
        check_machine(args, device)
    check_pipelines(wanted, args, device)
    return wanted, device


def run_bench(args, path: Path | None = None) -> dict:
    """Run each pipeline; the record (rewritten at ``path`` after each pipeline when given)."""
    import torch

    wanted, device = check_bench(args)
    record = {"benchmark": "train", "machine": machine_record(), "device": str(device),
              "torch_threads": args.threads or torch.get_num_threads(),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
              "pipelines": wanted, "rows": [], "ratios": {}}
    repeats = getattr(args, "repeats", 1)
    runs: dict[str, list[dict]] = {}
    from ..pipeline.train import keep_reordered
    with keep_reordered():   # a --reorder is made once, for the first run, and kept for the rest
        _run_turns(args, device, wanted, repeats, runs, record, path)
    return record


def _run_turns(args, device, wanted, repeats, runs, record, path) -> None:
    """run_bench's runs: ``repeats`` turns over ``wanted``, the record updated after each."""
    for turn in range(repeats):
        for name in wanted:
            if runs.get(name) and runs[name][-1]["status"] != "ok":
                continue   # skipped or failed: once says it
            label = f"{name} (run {turn + 1} of {repeats})" if repeats > 1 else name
            print(f"{label}: running", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            row = _run_one(name, args, device)
            # the whole run: loading, warm-up, every epoch, evaluation (where a long run's time goes)
            row["run_s"] = time.perf_counter() - t0
            runs.setdefault(name, []).append(row)
            record["rows"] = [median_row(runs[n]) for n in wanted if n in runs]
            add_ratios(record)
            add_targets(record)
            if path is not None:
                write_json(path, record)
            msg = f"epoch {row['epoch_s']:.3f} s" if row["status"] == "ok" else f"{row['status']}: {row['reason']}"
            # a reorder is setup the epochs do not show: say what it took of the whole run
            parts = row.get("reorder_parts_s") or {}
            reordering = (f", {row['reorder_s']:.1f} s of it reordering ("
                          + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items()) + ")") if row.get("reorder_s") else ""
            msg += f" ({row['run_s']:.0f} s in all{reordering})"
            print(f"{label}: {msg}", file=sys.stderr, flush=True)


def _fmt(v, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def exposed_cell(row: dict) -> str:
    """A row's exposed loader seconds as one table cell: sample/gather/transfer."""
    ex = row["exposed_s"]
    return f"{ex['sample']:.3f}/{ex['gather']:.3f}/{ex['transfer']:.3f}"


def busy_cell(row: dict) -> str:
    """A row's busy loader seconds (what each stage costs, hidden or not) as one table cell."""
    b = row.get("busy_s") or {}
    if not all(k in b for k in ("sample", "gather", "transfer")):
        return "-"
    return f"{b['sample']:.3f}/{b['gather']:.3f}/{b['transfer']:.3f}"


def print_table(record: dict) -> None:
    a = record["args"]
    print(f"train: {a['dataset']}, model {a['model']}, hidden {a['hidden']}, fanouts "
          f"{','.join(map(str, a['fanouts']))}, batch {a['batch_size']}, {a['epochs']} epochs, "
          f"device {record['device']}" + (f", precision {a['precision']}" if a.get("precision", "fp32") != "fp32" else ""))
    rows = []
    for r in record["rows"]:
        if r["status"] != "ok":
            rows.append([r["pipeline"], "-", "-", "-", "-", "-", "-", "-", "-", f"{r['status']}: {r['reason']}"])
            continue
        vs = 1.0 if r["pipeline"] == "unified" else r["speedup_vs"].get("unified")
        rows.append([r["pipeline"], f"{r['epoch_s']:.3f}", _fmt(vs, ".2f", "x"), f"{r['train_step_s']:.3f}",
                     exposed_cell(r), busy_cell(r), f"{r['losses'][-1]:.4f}",
                     f"{r['test_acc']:.4f}", f"{r['sampler']} ({r.get('graph') or '-'})", r["note"]])
    print_markdown(["pipeline", "epoch s", "vs unified", "train step s", "exposed s sample/gather/transfer",
                    "busy s sample/gather/transfer", "final loss", "test acc", "sampler (CSR on)", "note"], rows)
    print("(vs unified: unified's epoch time / the row's, above 1 = faster than unified; train step: the "
          "epoch's training steps; exposed: what the loop waited for each stage; busy: what each stage took)")
    print_host_side(record["rows"])
    for r in record["rows"]:
        if "repeats" in r:
            print(f"{r['pipeline']}: {len(r['repeats']['epoch_s'])} runs, epoch s "
                  + ", ".join(f"{v:.3f}" for v in r["repeats"]["epoch_s"]) + "; test acc "
                  + ", ".join(f"{v:.4f}" for v in r["repeats"]["test_acc"]) + " (the row is the median run)")
    for k, (num, den) in RATIOS.items():
        v = record["ratios"].get(k)
        if v is not None:
            print(f"{k}: {v:.2f}x ({num} epoch / {den} epoch)")
    for t in record.get("targets", []):
        print(f"target {t['name']}: {t['value']:.3f} (want {t['want']}) {'met' if t['met'] else 'MISSED'}")


def run(args) -> int:
    path = out_path(args)

    def start() -> dict:
        check_writable(path, "--json" if args.json else "--out")
        if args.plot:
            check_writable(args.plot, "--plot")
        return run_bench(args, path)

    from ..pipeline.plot import write_bench_plot
    return run_and_report("train", path, start, print_table, args.plot, write_bench_plot)
