"""``python -m torch_direct train``: mini-batch GNN training over the pipelined loader.

    python -m torch_direct train --dataset tiny --model sage --pipeline unified --epochs 5

Samples neighbourhoods (fanouts per layer), gathers features from the chosen feature store
(``unified``: zero-copy from pinned host memory, optionally with a GPU cache of hot rows;
``cpu_centric``: CPU slicing into pinned buffers + DMA; ``gpu_resident``: all features on the
GPU), overlaps that with training, and prints per epoch the total time, each loader stage's
exposed time (the epoch's time outside training steps, split over sampling, gather and
transfer by their busy time), the training step's time, and the train/valid accuracy (valid
by sampled inference). At the end: test accuracy by sampled inference, and with
``--full-eval`` by full-neighbourhood inference for comparison.

Locality levers: ``--reorder`` relabels the nodes hot ones first, ``--merge-gathers`` gathers
the features of several batches in one ordered gather, ``--cache-mb`` keeps the hottest rows
on the GPU. They change where rows are read from, not what is trained (``reorder`` and
``merge`` give the same batches, losses and accuracies);
``python -m torch_direct.gnn.bench train-ablation`` times each of them. The fastest unified setting
measured on products-like (one H200, docs/pipeline-measurements.md): ``--graph gpu --reorder frequency
--sample-ahead --cache-mb 512``, within 1.15x of gpu_resident's epoch.

Models: GraphSAGE, GAT and GIN from PyG when torch_geometric is installed; without it a
built-in GraphSAGE (mean aggregation in fused CPU/CUDA kernels) so the command runs anywhere.

Several GPUs: ``torchrun --nproc-per-node=N -m torch_direct train ...`` runs one process per
GPU (DistributedDataParallel over NCCL) over one host copy of the data set per node
(docs/distributed.md).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from ..progress import progress
from .evaluation import evaluate, full_test_accuracy, test_ids
from .graphed import GraphedStep, StepTally, eager_step
from .loader import TrainingStream
from .models import GNN, make_optimizer, model_precision, use_pyg_for
from .options import add_arguments, check_options, check_paths, resolve_device  # noqa: F401  (add_arguments: the command.s options)
from .timing import STEP_MARK, GilProbe, StepProfiler, Timer, split_by_busy, sync


# While keep_reordered() is active: the last relabelled data set, under the key of what made it.
_KEPT: dict | None = None


@contextmanager
def keep_reordered():
    """Within it, runs that ask for the same data set, seed and ``--reorder`` (and fanout) share
    one relabelled copy, made by the first: a benchmark of several runs reorders once (minutes
    on papers100M-like). One copy is kept at a time, and none after the block."""
    global _KEPT
    outer = _KEPT is not None
    if not outer:
        _KEPT = {}
    try:
        yield
    finally:
        if not outer:
            _KEPT = None


def load_for_run(args, show: bool):
    """The data set of a run, relabelled when ``--reorder`` asks; (dataset, seconds spent
    reordering by part: ``rank``, ``relabel``, ``rows``; none where :func:`keep_reordered` had
    it already, or without ``--reorder``)."""
    from ..graph import load_dataset
    key = (args.dataset, str(args.root), args.data_seed, args.reorder, args.fanouts[-1])
    if args.reorder != "none" and _KEPT is not None and key in _KEPT:
        return _KEPT[key], {}
    ds = load_dataset(args.dataset, root=args.root, seed=args.data_seed, show_progress=show)
    seconds = {}
    if args.reorder != "none":
        from ..graph import reorder
        # frequency: ranked as the cache ranks its rows (the last fanout), so that the cached rows
        # are the table's first ones; results stay per node: accuracies need no mapping back.
        # The nodes are sorted on the run's GPU, where there is one (the same order, sooner).
        ds, ro = reorder(ds, args.reorder, fanout=args.fanouts[-1], show_progress=show,
                         device=resolve_device(args.device))
        seconds = dict(ro.seconds)
        if _KEPT is not None:
            _KEPT.clear()   # the earlier copy goes before this one is kept
            _KEPT[key] = ds
    return ds, seconds


REORDER_PARTS = ("rank", "relabel", "rows")


def load(args, ctx, show: bool):
    """The run's data set and the seconds spent reordering it, by part (``REORDER_PARTS``);
    under several processes one copy per node in shared memory, mapped by every rank of the
    node (the parts the longest of any node's)."""
    if ctx is None:
        return load_for_run(args, show)
    from .distributed import shared_dataset
    loaded = {}

    def load_here():
        loaded["ds"], loaded["seconds"] = load_for_run(args, show)
        return loaded["ds"]
    ds = shared_dataset(ctx, load_here)
    mine = loaded.get("seconds", {})
    seconds = dict(zip(REORDER_PARTS, ctx.all_max([mine.get(k, 0.0) for k in REORDER_PARTS])))
    loaded.clear()  # local rank 0 drops its private copy: the shared one is all that is left
    return ds, (seconds if any(seconds.values()) else {})


def train_epoch(step_model, opt, loader, device, show: bool, desc: str, profiler=None, step=None) -> dict:
    """One pass over ``loader``'s batches: forward, loss, backward, optimizer step (``step(batch)``
    when given, returning the loss and the seeds' logits: the CUDA-graphed step). Returns the
    epoch's wall time (CUDA synchronised at both ends), its training steps' time (CUDA events
    around each step; perf_counter on the CPU), the host's wall time inside the step calls
    and this thread's CPU time there (on CUDA, a step whose host side takes about as long as
    its stream time was paced by the host: by launches, or by a thread that waited for the
    GIL or a core where the wall time exceeds the CPU time), the steps handed to a CUDA stream
    that had run dry (whose time includes the host's launch of them) and the loop's wall time in
    them, the steps' stream time waiting for their batches' copies into a graphed step's buffers
    (two sets: ``step.timer``; None otherwise), the seconds this thread waited for a core over
    the epoch (None where the kernel does not say), the process's CPU seconds over the epoch (every thread's, the loader's and the
    gathers' pools included), the summed loss and the correct and seen counts, as floats."""
    step_model.train()
    steps = Timer(device.type == "cuda")
    eager = lambda b: eager_step(step_model, opt, b)  # noqa: E731
    seen = 0
    cpu = 0.0
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    dry, dry_host = 0, 0.0
    tally = StepTally(device)
    gil = GilProbe()
    graphed = step if isinstance(step, GraphedStep) else None
    if graphed is not None:
        graphed.timer = steps
    sync(device)
    p0 = time.process_time()
    t0 = time.perf_counter()
    with steps.thread_use("loop"), progress(len(loader), desc, show) as bar:
        for i, b in enumerate(loader):
            if profiler is not None:
                profiler.step(i)
            ran_dry = stream is not None and stream.query()
            t = steps.start()
            c0 = time.thread_time()
            # while profiled, the trace marks each step's own work
            marked = profiler is not None and profiler.running
            with torch.profiler.record_function(STEP_MARK) if marked else nullcontext():
                loss, out = (step or eager)(b)
            # On the device: a host wait here would hold the next step back.
            tally.add(loss, out, b.y, b.batch_size)
            seen += b.batch_size
            host = steps.stop("step", t)
            cpu += time.thread_time() - c0
            if ran_dry:
                dry += 1
                dry_host += host
            gil.tick()   # outside the step's timing
            bar.update(1)
        sync(device)
    total = time.perf_counter() - t0
    process_cpu = time.process_time() - p0
    if graphed is not None:
        graphed.timer = None
    times = steps.totals()
    return {"total": total, "step": times.get("step", 0.0), "copy_wait": times.get("copy_wait"),
            "step_host": steps.host_seconds.get("step", 0.0), "step_cpu": cpu,
            "dry_steps": dry, "dry_step_host": dry_host,
            "run_delay": steps.threads()["loop"]["run_delay_s"], "process_cpu": process_cpu,
            "gil_ms": gil.mean_ms(),
            "loss": float(tally.loss), "correct": float(tally.correct), "seen": float(seen)}


def epoch_record(epoch: int, ep: dict, stats: dict, valid_acc: float) -> dict:
    """The record of one epoch. Exposed loader time: the epoch less its training steps (on a
    GPU the host runs ahead, so its queue wait alone misses the stream waiting on a batch's
    event; never less than that wait), split over the stages by :func:`split_by_busy`. The
    training steps' host side: the loop's wall time inside the step calls
    (``train_step_host_s``) and its thread's CPU time there (``train_step_cpu_s``), the steps
    handed to a training stream that had run dry and the loop's wall time in their calls
    (``train_steps_dry``, ``train_step_dry_host_s``: time the steps' stream time counts though
    the GPU idled, waiting for the host to launch them), the part of the steps' stream time that
    waited for the copies of ready batches into the graphed step's buffers, which the replay
    before did not hide (``train_step_copy_wait_s``; None but with two sets of buffers), and the
    seconds the loop's thread waited for a core in the epoch (``loop_run_delay_s``, None where
    unknown) and the mean milliseconds it took to get the GIL back after letting it go, sampled
    every ``timing.GIL_PROBE_EVERY`` steps (``loop_gil_wait_ms``: :class:`timing.GilProbe`; None
    with fewer steps); the loader's threads' CPU seconds and wait for a core, per role
    (``loader_threads``), the host seconds and calls of parts of the feature store's gathers
    (``gather_parts``), and the whole process's CPU seconds in the epoch (``process_cpu_s``:
    against the epoch's wall time times the cores, how busy the CPU was)."""
    total, step, seen = ep["total"], ep["step"], ep["seen"]
    exposed = split_by_busy(max(stats["wait"], total - step), stats["busy"])
    return {"epoch": epoch, "total_s": total, "train_step_s": step, "train_step_host_s": ep["step_host"],
            "train_step_cpu_s": ep["step_cpu"], "train_step_copy_wait_s": ep["copy_wait"],
            "train_steps_dry": ep["dry_steps"],
            "train_step_dry_host_s": ep["dry_step_host"], "loop_run_delay_s": ep["run_delay"],
            "loop_gil_wait_ms": ep["gil_ms"], "loader_wait_s": stats["wait"],
            "exposed_s": exposed, "busy_s": stats["busy"], "loader_threads": stats.get("threads", {}),
            "gather_parts": stats.get("gather_parts", {}),
            "process_cpu_s": ep["process_cpu"], "batches": stats["batches"],
            "loss": ep["loss"] / seen if seen else float("nan"),
            "train_acc": ep["correct"] / seen if seen else float("nan"), "valid_acc": valid_acc}


def run(args, make_batches=None) -> dict:
    """Train as ``args`` (the parsed options) say; print per-epoch lines; return the record.
    ``make_batches(args, ds, device, ctx, say)`` gives the run's batch source (default: the
    pipeline ``--pipeline`` names; ``pipeline/batches.py``). Under torchrun with several
    processes: one rank per GPU (``pipeline/distributed.py``)."""
    from . import distributed
    check_paths(args)
    with gil_switch_interval():
        if not distributed.requested():
            return _run(args, None, make_batches)
        ctx = distributed.init(args.device)
        try:
            record = _run(args, ctx, make_batches)
        except BaseException as e:
            instead = distributed.report_stop(ctx, e)
            if instead is not None:
                raise instead from e
            raise
        ctx.close()
        return record


@contextmanager
def gil_switch_interval():
    """The experimental setting gil_switch_us, in force for a block: the GIL's switch interval
    (how long a thread that wants the GIL, such as the training loop beside the loader's
    threads, waits before it asks the holder to drop it), put back after. Unset: unchanged. A
    bad value is a ValueError before anything changes."""
    from .options import experimental_int
    us = experimental_int("gil_switch_us", 1)
    if us is None:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(us / 1e6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def default_batches(args, ds, device, ctx, say):
    if args.pipeline == "pyg":
        from .pyg_baseline import PyGBatches
        return PyGBatches(args, ds, device, ctx, say)
    from .batches import PipelinedBatches
    return PipelinedBatches(args, ds, device, ctx, say)


def _run(args, ctx, make_batches) -> dict:
    from .distributed import fail_injected
    from .stages import STAGES

    main = ctx is None or ctx.main
    say = print if main else (lambda *a, **k: None)
    device = ctx.device if ctx is not None else resolve_device(args.device)
    show = not args.no_progress and main
    check_options(args, device)
    if ctx is not None and getattr(args, "cuda_graph", False):
        raise ValueError("--cuda-graph runs in one process: DistributedDataParallel's gradient "
                         "all-reduce is not captured")
    if make_batches is None and args.pipeline == "pyg":
        from . import pyg_baseline
        reason = pyg_baseline.unavailable()
        if reason:
            raise ValueError(f"--pipeline pyg: {reason}")
    eval_fanouts = args.eval_fanouts or [20] * len(args.fanouts)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    ds, reorder_parts = load(args, ctx, show)
    reorder_s = sum(reorder_parts.values())
    source = (make_batches or default_batches)(args, ds, device, ctx, say)
    model = GNN(args.model, ds.num_features, args.hidden, ds.num_classes, len(args.fanouts),
                dropout=args.dropout, use_pyg=use_pyg_for(args.layers), precision=args.precision).to(device)
    step_model = model
    if ctx is not None:
        from torch.nn.parallel import DistributedDataParallel
        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    buffers = int(getattr(args, "cuda_graph", 0) or 0)
    opt = make_optimizer(model, args.lr, capturable=buffers > 0)
    graphed = GraphedStep(step_model, opt, args.batch_size, buffers=buffers,
                          margin=getattr(args, "cuda_graph_margin", None)) if buffers else None
    step_priority = getattr(args, "step_priority", "normal")
    step_stream = TrainingStream(step_priority, device)
    record = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "device": str(device),
              "world_size": 1 if ctx is None else ctx.world, "dataset": repr(ds), "backend": model.backend,
              **source.info, "step_priority": step_priority, "reorder": args.reorder,
              "reorder_s": reorder_s, "reorder_parts_s": reorder_parts, "precision": args.precision,
              "epochs": []}
    reorder_text = f", reorder {args.reorder} ({reorder_s:.2f} s)" if args.reorder != "none" else ""
    say(f"train: {ds!r}\n" + source.describe(f"{args.model} ({model.backend})", reorder_text), flush=True)

    with model_precision(args.precision, device), source.train as train_loader, \
            source.evaluation(ds.split["valid"], eval_fanouts, args.seed + 1) as valid_loader:
        for epoch in range(1, args.epochs + 1):
            if ctx is not None:
                fail_injected(ctx.rank, epoch)
            prof = StepProfiler(args.profile, device) if epoch == 1 and main and args.profile else None
            with step_stream.active():
                ep = train_epoch(step_model, opt, train_loader, device, show, f"epoch {epoch}", prof, graphed)
            if prof is not None:
                say(f"wrote {prof.finish()} ({prof.steps} profiled steps of epoch 1)", flush=True)
            stats = train_loader.stats()
            if ctx is not None:  # the job's figures: sums over ranks, the slowest rank's times (the
                # run delay and the GIL probe stay this rank's own)
                ep["loss"], ep["correct"], ep["seen"] = ctx.all_sum([ep["loss"], ep["correct"], ep["seen"]])
                ep["total"], ep["step"], ep["step_host"], ep["step_cpu"] = ctx.all_max(
                    [ep["total"], ep["step"], ep["step_host"], ep["step_cpu"]])
            rec = epoch_record(epoch, ep, stats, evaluate(model, valid_loader, show, "valid", ctx))
            record["epochs"].append(rec)
            stages = " ".join(f"{k} {rec['exposed_s'][k]:.3f}" for k in STAGES)
            say(f"epoch {epoch:3d}  total {rec['total_s']:7.3f} s  exposed: {stages}  "
                f"train-step {rec['train_step_s']:.3f} s (host {rec['train_step_host_s']:.3f} s, "
                f"cpu {rec['train_step_cpu_s']:.3f} s)  loss {rec['loss']:.4f}  train acc {rec['train_acc']:.4f}  "
                f"valid acc {rec['valid_acc']:.4f}", flush=True)

        test = test_ids(ds, args.test_nodes, args.data_seed)
        record["test_nodes"] = test.numel()
        with source.evaluation(test, eval_fanouts, args.seed + 2) as test_loader:
            record["test_acc"] = evaluate(model, test_loader, show, "test", ctx)
        line = f"test acc {record['test_acc']:.4f} (sampled, fanouts {eval_fanouts}, {test.numel()} nodes)"
        if args.full_eval:
            record["test_acc_full"] = full_test_accuracy(model, ds, source.full_eval_store(), device, show, ctx, test)
            line += f", {record['test_acc_full']:.4f} (full neighbourhoods)"
    if source.store is not None:
        record["feature_store"] = source.store.stats()
    if graphed is not None:
        record["cuda_graph"] = graphed.stats()
        if graphed.note:
            say(f"train: --cuda-graph: {graphed.note}", file=sys.stderr)
    say(line, flush=True)
    for note in source.finish():   # what the source learnt in the run, and its notes
        say(note, file=sys.stderr)
    record.update(source.info)
    _memory(record, ds, ctx, say)
    if main:
        _write_outputs(args, record)
    return record


def _memory(record: dict, ds, ctx, say) -> None:
    from .distributed import host_pss_bytes
    pss = float(host_pss_bytes())
    procs = 1 if ctx is None else ctx.world
    if ctx is not None:
        pss = ctx.all_sum([pss])[0]
    record["host_pss_gb"] = pss / 1e9
    g = ds.graph
    record["data_gb"] = sum(t.nbytes for t in (ds.x, ds.y, g.rowptr, g.col, g.edge_ids) if t is not None) / 1e9
    say(f"host memory: {pss / 2**30:.2f} GiB (PSS over {procs} process{'es' if procs > 1 else ''}; the data set "
        f"itself {record['data_gb'] * 1e9 / 2**30:.2f} GiB)", flush=True)


def _write_outputs(args, record: dict) -> None:
    if args.json:
        from ..outputs import write_json
        path = Path(args.json)
        write_json(path, record)
        print(f"wrote {path}")
    if args.plot:
        from .plot import write_plot
        print(f"wrote {write_plot(record, args.plot)}")


def main(args) -> int:
    """Entry point of the ``train`` subcommand: clear messages for bad input, exit codes."""
    try:
        run(args)
    except (ValueError, RuntimeError, TypeError, FileNotFoundError, ImportError) as e:
        where = f" (rank {os.environ['RANK']})" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"train: error{where}: {e}", file=sys.stderr)
        return 2
    return 0
