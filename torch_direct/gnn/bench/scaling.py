"""scaling: epoch time and host memory of one training job on 1 and N GPUs.

    python -m torch_direct.gnn.bench scaling --nproc 1,2 --dataset papers100M-like \\
        --out results/scaling_papers100M-like.json --plot results/scaling_papers100M-like.svg

Runs ``torchrun --standalone --nproc-per-node=K -m torch_direct train ...`` for each K of
``--nproc`` with the same options (every option of ``python -m torch_direct train`` applies),
all through the distributed path (one host copy per node in shared memory, page-locked by
every rank; the 1-process run too, so that the runs differ only in their number of GPUs).
Prints per K the epoch time (median over the epochs after the first), its ratio to the
smallest K's, the job's host memory (the ranks' summed PSS) and its ratio, and checks the
targets: epoch time at 2, 4 and 8 times the baseline's GPUs <= 0.55x, 0.30x and 0.17x its time
(``--target-speed``, for each count measured), <=
``--target-epoch-s`` seconds when given, host memory within 10% of the 1-GPU run's (each
process adds the interpreter and torch, about half a GB: the target means something when the
data set dwarfs that, as papers100M-like does). Writes
JSON after each run and, with ``--plot``, a bar chart (.svg, or .png with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import check_writable, default_out, machine_record, print_markdown, write_json
from .train import epoch_row, exposed_cell


def _nprocs(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated process counts such as 1,2, got {text!r}") from None
    if not out or any(k <= 0 for k in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"process counts must be distinct positive ints, got {text!r}")
    return sorted(out)


DEFAULT_SPEED_TARGETS = "2:0.55,4:0.30,8:0.17"


def _speed_targets(text: str) -> dict:
    """``--target-speed``: ``R`` (the largest count's epoch <= R x the baseline's) or
    ``M:R,...`` (at M times the baseline's processes, <= R x its epoch), as ``{M or None: R}``."""
    try:
        if ":" not in text:
            out = {None: float(text)}
        else:
            out = {}
            for part in text.split(","):
                m, r = part.split(":")
                out[int(m)] = float(r)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a ratio such as 0.55 or multiples and ratios such as {DEFAULT_SPEED_TARGETS}, got {text!r}") from None
    if any(r <= 0 for r in out.values()) or any(m is not None and m < 2 for m in out):
        raise argparse.ArgumentTypeError(f"ratios must be > 0 and multiples >= 2, got {text!r}")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..pipeline import train
    train.add_arguments(ap)
    ap.set_defaults(epochs=3)
    ap.add_argument("--nproc", type=_nprocs, default=[1, 2],
                    help="processes (GPUs) per run, comma-separated; the smallest is the baseline (default: 1,2)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON record (default: scaling_<dataset>.json in the user's cache, "
                         "~/.cache/torch_direct/results)")
    ap.add_argument("--target-speed", type=_speed_targets, default=_speed_targets(DEFAULT_SPEED_TARGETS),
                    help="target epoch-time ratios to the baseline: M:R,... (at M times its processes, "
                         "<= R x its epoch; checked for each count measured) or one R for the largest count "
                         f"(default: {DEFAULT_SPEED_TARGETS})")
    ap.add_argument("--target-epoch-s", type=float, default=None,
                    help="target: epoch time at the largest count <= this many seconds (default: none)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run (default: %(default)s)")
    ap.add_argument("--verbose", action="store_true", help="show each run's output as it comes")


def _train_argv(args, json_path: str) -> list[str]:
    """The ``train`` command line for ``args`` (the options this benchmark does not own)."""
    from ..pipeline import train
    p = argparse.ArgumentParser(add_help=False)
    train.add_arguments(p)
    argv = []
    for action in p._actions:
        if not action.option_strings or action.dest in ("json", "plot"):
            continue
        v = getattr(args, action.dest, None)
        if v is None or v == action.default:
            continue
        opt = action.option_strings[0]
        if isinstance(v, bool):
            argv += [opt] if v else []
        elif isinstance(v, list):
            argv += [opt, ",".join(str(x) for x in v)]
        elif action.dest == "merge_gathers" and v == 0:
            argv += [opt]
        else:
            argv += [opt, str(v)]
    return argv + ["--json", json_path, "--no-progress"]


def _launch(k: int, argv: list[str], timeout: float, verbose: bool) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={k}",
           "-m", "torch_direct", "train", *argv]
    env = dict(os.environ, TORCH_DIRECT_DISTRIBUTED="1")
    if verbose:
        p = subprocess.run(cmd, env=env, timeout=timeout)
        return p.returncode, ""
    p = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr)[-4000:]


def run_scaling(args) -> dict:
    from ..pipeline.options import resolve_device
    device = resolve_device(args.device)
    if device.type == "cuda":
        import torch
        have = torch.cuda.device_count()
        if max(args.nproc) > have:
            raise ValueError(f"--nproc {max(args.nproc)}: this machine has {have} GPU(s)")
    out = check_writable(args.out or default_out(f"scaling_{Path(str(args.dataset)).name}"), "--out")
    if args.plot:
        check_writable(args.plot, "--plot")
    record = {"benchmark": "scaling", "machine": machine_record(), "device": device.type,
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
              "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.nproc:
            path = os.path.join(tmp, f"run{k}.json")
            print(f"scaling: {k} process(es) ...", file=sys.stderr, flush=True)
            rc, tail = _launch(k, _train_argv(args, path), args.timeout, args.verbose)
            label = f"{k} GPU" + ("s" if k > 1 else "") if device.type == "cuda" else f"{k} proc"
            if rc != 0 or not os.path.exists(path):
                record["rows"].append({"nproc": k, "pipeline": label, "status": "failed", "reason": f"exit {rc}",
                                       "output_tail": tail})
                write_json(out, record)
                continue
            rec = json.load(open(path))
            row = {"nproc": k, **epoch_row(label, rec, "")}   # the epoch figures as bench train reports them
            row.update(host_pss_gb=rec["host_pss_gb"], data_gb=rec["data_gb"], world_size=rec["world_size"])
            record["rows"].append(row)
            write_json(out, record)
    ok = [r for r in record["rows"] if r["status"] == "ok"]
    if ok:
        base = ok[0]
        for r in ok:
            r["speed_ratio"] = r["epoch_s"] / base["epoch_s"]
            r["memory_ratio"] = r["host_pss_gb"] / base["host_pss_gb"] if base["host_pss_gb"] else None
        top = ok[-1]
        targets = []
        for r in ok[1:]:
            m = r["nproc"] // base["nproc"] if r["nproc"] % base["nproc"] == 0 else None
            want = args.target_speed.get(m, args.target_speed.get(None) if r is top else None)
            if want is not None:
                targets.append({"name": f"epoch at {r['nproc']} / at {base['nproc']}", "want": f"<= {want}",
                                "value": r["speed_ratio"], "met": r["speed_ratio"] <= want})
        if len(ok) > 1:
            if top["memory_ratio"] is not None:
                targets.append({"name": f"host memory at {top['nproc']} / at {base['nproc']}", "want": "<= 1.10",
                                "value": top["memory_ratio"], "met": top["memory_ratio"] <= 1.10})
        if args.target_epoch_s is not None:
            targets.append({"name": f"epoch seconds at {top['nproc']}", "want": f"<= {args.target_epoch_s}",
                            "value": top["epoch_s"], "met": top["epoch_s"] <= args.target_epoch_s})
        record["targets"] = targets
    record["out"] = str(out)
    write_json(out, record)
    return record


def run(args) -> int:
    try:
        if args.plot:
            from ..pipeline.plot import check_bench_plot_path
            check_bench_plot_path(args.plot)
        record = run_scaling(args)
    except ValueError as e:
        print(f"bench scaling: error: {e}", file=sys.stderr)
        return 2
    rows = []
    for r in record["rows"]:
        if r["status"] != "ok":
            rows.append([r["nproc"], "-", "-", "-", "-", "-", "-", "-", "-", f"{r['status']}: {r['reason']}"])
            continue
        mem = f"{r['memory_ratio']:.2f}x" if r.get("memory_ratio") is not None else "-"
        rows.append([r["nproc"], f"{r['epoch_s']:.3f}", f"{r['speed_ratio']:.2f}x", f"{r['train_step_s']:.3f}",
                     exposed_cell(r), f"{r['host_pss_gb']:.2f}", mem,
                     f"{r['data_gb']:.2f}", f"{r['test_acc']:.4f}", ""])
    # The epoch is the training step plus the loader's exposed stages: what bounds each count.
    print_markdown(["processes", "epoch s", "vs baseline", "train step s", "exposed s sample/gather/transfer",
                    "host memory GB (PSS)", "vs baseline", "data set GB", "test acc", "note"], rows)
    for t in record.get("targets", []):
        print(f"target {t['name']}: {t['value']:.3f} (want {t['want']}) {'met' if t['met'] else 'MISSED'}")
    if args.plot:
        from ..pipeline.plot import write_bench_plot
        # a bar per count, labelled with its epoch time's ratio to the baseline's
        shown = dict(record, rows=[dict(r, pipeline=f"{r['pipeline']} ({r['speed_ratio']:.2f}x)")
                                   if r["status"] == "ok" else r for r in record["rows"]])
        print(f"wrote {write_bench_plot(shown, args.plot)}")
    print(f"wrote {record['out']}")
    failed = [r for r in record["rows"] if r["status"] != "ok"]
    for r in failed:
        print(f"{r['nproc']} process(es) failed ({r['reason']}); the end of its output:\n{r['output_tail']}",
              file=sys.stderr)
    return 1 if failed else 0
