"""Device-side experiment: what sets gpu_resident's epoch, the floor no feature path can beat.

On papers100M-like, gpu_resident (features in GPU memory) takes 5.1 s an epoch while its
training steps take 2.8-2.9 s of GPU time when they run alone (docs/pipeline-measurements.md). This
splits a fixed number of batches into its parts, each timed by wall clock with the GPU
synchronised at both ends, on the same batches and model:

  sample     the GPU sampler alone, batch after batch on a stream of its own
  gather     each sampled batch's feature rows read from GPU memory (the store's gather)
  step       the training step alone (forward, loss, backward, Adam) over batches sampled and
             gathered beforehand, cycled (--cached of them)
  step_fill  with --cuda-graph: of the step, the copies of each batch into the graph's padded
             buffers alone
  sample_gather   sampling batch i on one stream while batch i-1's rows are gathered on
             another, in a second thread (as the loader does with --sample-ahead): what
             sampling and gathering cost each other on the GPU
  together   the pipelined loader feeding the steps, as `train` runs it
  together_ahead   the same with --sample-ahead K (sampling in K threads, each on a stream of
             its own; K = --sample-ahead, default 1)

``--step-priority`` runs the together parts' steps on a stream of that priority, as train's.

``--store unified`` reads the rows from the unified (host-memory) table instead, with
``--cache-mb`` of hot rows in GPU memory, ``--gather-sms`` and ``--gather-cpu-threads`` as
train's, and ``--cached-gather split,fused`` times the cache's gather in each form (the
experimental cached_gather; a store of its own for each); ``--profile-sample PATH`` writes the
sampler's top operators over 20 batches.

and reports milliseconds per batch, with together / (sample + gather + step) (1.0: the loader
overlaps nothing; (max part) / (sum of parts): perfect overlap). Runs on the CPU too (a check
of the tool, not a measurement).

    python experiments/step_floor_probe.py --dataset papers100M-like --graph gpu --precision fp32,tf32,bf16 \\
        --out probe.json
"""
import argparse
import itertools
from concurrent.futures import ThreadPoolExecutor
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import run, seconds, write_record  # noqa: E402

import torch_direct  # noqa: E402
from torch_direct.gnn.graph import GPUNeighborSampler, load_dataset  # noqa: E402
from torch_direct.gnn.progress import progress  # noqa: E402
from torch_direct.gnn.pipeline.features import make_feature_store  # noqa: E402
from torch_direct.gnn.pipeline.graphed import GraphedStep  # noqa: E402
from torch_direct.gnn.pipeline.loader import STREAM_PRIORITIES, PipelinedLoader  # noqa: E402
from torch_direct.gnn.pipeline.stages import Batch  # noqa: E402
from torch_direct.gnn.pipeline.batches import feature_table, graph_to_gpu  # noqa: E402
from torch_direct.gnn.pipeline.aggregate import IMPLEMENTATIONS as AGGREGATIONS  # noqa: E402
from torch_direct.gnn.pipeline.models import (GNN, LAYERS, MODELS, PRECISIONS, SAGELayer,  # noqa: E402
                                          check_precision, make_optimizer, model_precision, use_pyg_for)
from torch_direct.gnn.pipeline.options import FEATURE_DTYPES, fanout_list, resolve_device  # noqa: E402
from torch_direct.gnn.pipeline.loader import TrainingStream  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--dataset", default="tiny", help="a preset or OGB name, as for train (default: %(default)s)")
    p.add_argument("--root", default=None, help="data set directory (default: train's)")
    p.add_argument("--device", default=None, help="cuda[:k] or cpu (default: cuda when usable)")
    p.add_argument("--graph", choices=("gpu", "unified"), default="gpu",
                   help="where the GPU sampler reads the CSR (default: %(default)s)")
    p.add_argument("--batches", type=int, default=200, help="batches timed per part (default: %(default)s)")
    p.add_argument("--cached", type=int, default=20,
                   help="batches sampled and gathered beforehand for the step-alone part (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=5,
                   help="batches sampled, gathered and trained on before each run's timing (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default: %(default)s)")
    p.add_argument("--fanouts", type=fanout_list, default=[15, 10, 5], help="as for train (default: 15,10,5)")
    p.add_argument("--hidden", type=int, default=256, help="hidden width (default: %(default)s)")
    p.add_argument("--model", choices=MODELS, default="sage", help="as for train (default: %(default)s)")
    p.add_argument("--layers", type=_choices("layers", LAYERS), default=["auto"],
                   help="comma-separated layer implementations, as for train: pyg = PyG's convs, builtin = the "
                        "built-in GraphSAGE (fused aggregation, less Python per step); each is measured with each --precision "
                        "(default: auto)")
    p.add_argument("--precision", type=_choices("precisions", PRECISIONS), default=["fp32"],
                   help="comma-separated precisions (fp32, tf32, bf16, as for train), each measured in turn on "
                        "the data loaded once, with a fresh model of the same seed (default: fp32)")
    p.add_argument("--sampler-waits", type=_choices("settings", ("default", "fewer")), default=["default"],
                   help="comma-separated values of the experimental sampler_waits for the GPU sampler: default = "
                        "two host waits per hop and the seeds checked first; fewer = one wait per hop (the same "
                        "batches); each is measured with each layer implementation and precision (default: default)")
    p.add_argument("--sampler-relabel", type=_choices("settings", ("hash", "sort")), default=["hash"],
                   help="comma-separated values of the experimental sampler_relabel for the GPU sampler: hash = "
                        "a hash table, three passes and a scan; sort = unique and argsort (the same batches); "
                        "each is measured with each of the other settings (default: hash)")
    p.add_argument("--aggregate", type=_choices("aggregations", AGGREGATIONS), default=["fused"],
                   help="the built-in SAGE layer's mean aggregation, comma-separated to compare: fused "
                        "(the kernels) or index_add (index_select + index_add_) (default: fused)")
    p.add_argument("--sampler-batches", type=int, default=1, metavar="K",
                   help="batches the GPU sampler samples in one call, in the sample and pipelined parts "
                        "(as train --sampler-batches; default: %(default)s)")
    p.add_argument("--cuda-graph", type=int, nargs="?", const=1, default=0, choices=(1, 2), metavar="BUFFERS",
                   help="replay each training step as a CUDA graph, as train --cuda-graph [BUFFERS] does "
                        "(captured during the warm-up; CUDA only; BUFFERS 2: two sets of buffers used in turn, "
                        "each batch copied in beside the other set's replay)")
    for option, whose in (("--loader-priority", "the loader's CUDA streams"),
                          ("--step-priority", "the training step's CUDA stream")):
        p.add_argument(option, type=_choices("priorities", STREAM_PRIORITIES), default=["normal"],
                       help=f"comma-separated priorities of {whose} in the together parts, as train's {option} "
                            f"(default: normal)")
    p.add_argument("--sample-ahead", type=int, default=1, metavar="K",
                   help="sampling threads of the together_ahead part, as train's --sample-ahead K (more than 1: "
                        "the GPU sampler; default: %(default)s)")
    p.add_argument("--store", choices=("gpu_resident", "unified"), default="gpu_resident",
                   help="where the feature rows are read from (default: %(default)s)")
    p.add_argument("--cache-mb", type=int, default=0,
                   help="--store unified: MiB of GPU memory for the hottest rows, as train's (default: %(default)s)")
    p.add_argument("--gather-sms", type=int, default=0,
                   help="--store unified: SMs the gather kernel may use, 0 = all (default: %(default)s)")
    p.add_argument("--gather-cpu-threads", type=int, default=0,
                   help="--store unified: CPU threads of the hybrid gather, as train's (default: %(default)s)")
    p.add_argument("--cached-gather", type=_choices("forms", ("split", "fused")), default=["split"],
                   help="--store unified with --cache-mb: comma-separated forms of the cache's gather, each "
                        "timed with each of the other settings: split (a lookup, a wait for the misses' count, "
                        "a gather of each part) or fused (one pass, the experimental cached_gather=fused) "
                        "(default: split)")
    p.add_argument("--feature-dtype", choices=FEATURE_DTYPES, default="stored",
                   help="the feature table's type, as train's --feature-dtype (fp8: float8 rows with a scale each, "
                        "upcast in the gather) (default: %(default)s)")
    p.add_argument("--profile-sample", type=Path, default=None,
                   help="write the sampler's top operators over 20 batches (torch.profiler) to this .txt")
    p.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    for name in ("batches", "cached", "batch_size", "hidden", "warmup", "sampler_batches", "sample_ahead"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    for name in ("cache_mb", "gather_sms", "gather_cpu_threads"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
        if getattr(a, name) and a.store != "unified":
            p.error(f"--{name.replace('_', '-')} applies to --store unified only")
    if a.cached_gather != ["split"] and not a.cache_mb:
        p.error("--cached-gather compares the forms of a cache's gather: give --store unified and --cache-mb")
    return a


def _choices(what: str, allowed):
    def parse(text: str) -> list[str]:
        out = [v.strip() for v in text.split(",") if v.strip()]
        if not out or any(v not in allowed for v in out):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what} among {', '.join(allowed)}, "
                                             f"got {text!r}")
        return out
    return parse


def measure(precision, layers, aggregate, priority, step_priority, ds, device, sampler, store, labels, batches,
            seeds, a, show) -> dict:
    """Milliseconds per batch of each part with a fresh model of ``layers`` in ``precision``
    (``aggregate``: the built-in layers' mean aggregation)."""
    n_batches = len(batches)
    torch.manual_seed(0)
    use_pyg = use_pyg_for(layers)
    model = GNN(a.model, ds.num_features, a.hidden, ds.num_classes, len(a.fanouts), use_pyg=use_pyg,
                precision=precision).to(device)
    for layer in model.layers:
        if isinstance(layer, SAGELayer):
            layer.aggregate = aggregate
    opt = make_optimizer(model, 3e-3, capturable=bool(a.cuda_graph))
    graphed = GraphedStep(model, opt, a.batch_size, buffers=a.cuda_graph) if a.cuda_graph else None
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    on_side = (lambda: torch.cuda.stream(side)) if side is not None else nullcontext  # noqa: E731

    def step(b):
        if graphed is not None:
            graphed(b)
            return
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(b.x, b.adjs), b.y, ignore_index=-1)
        loss.backward()
        opt.step()

    def batch(sb):
        return Batch(store.gather(sb.n_id, device), labels[sb.n_id[:sb.batch_size]], sb.adjs, sb.batch_size, sb.n_id)

    parts, sampled = {}, []
    with model_precision(precision, device):
        # warm-up: a few batches through every part (allocator, kernels, autotuning, PyG's first calls)
        for s in batches[:a.warmup]:
            step(batch(sampler.sample(s)))

        def sample_all():   # batches_per_call at a time (--sampler-batches), as the loader asks
            k = sampler.batches_per_call
            with on_side(), progress(n_batches, f"{precision} sample", show) as bar:
                for first in range(0, n_batches, k):
                    group = batches[first:first + k]
                    sampled.extend(sampler.sample_batches(group) if k > 1 else [sampler.sample(group[0])])
                    bar.update(len(group))
        parts["sample"] = seconds(device, sample_all)

        def gather_all():
            with on_side():
                for sb in sampled:
                    store.gather(sb.n_id, device)
        parts["gather"] = seconds(device, gather_all)

        # Sampling batch i (its own stream, its host waits) while batch i-1's rows are gathered on
        # a second stream from a second thread: a gather call may hold its thread until its rows
        # are in (the cache's counts, the hybrid's CPU share), which must not hold the sampling.
        other = torch.cuda.Stream(device) if device.type == "cuda" else None
        previous = list(sampled)

        def gather_on_other(sb):
            if other is None:
                store.gather(sb.n_id, device)
                return
            torch.cuda.set_device(device)
            with torch.cuda.stream(other):
                store.gather(sb.n_id, device)
            other.synchronize()

        def sample_gather_all():
            with ThreadPoolExecutor(1) as pool, progress(n_batches, f"{precision} sample+gather", show) as bar:
                for i, s in enumerate(batches):
                    pending = pool.submit(gather_on_other, previous[i - 1]) if i > 0 else None
                    with on_side():
                        sampler.sample(s)
                    if pending is not None:
                        pending.result()
                    bar.update(1)
        parts["sample_gather"] = seconds(device, sample_gather_all)
        previous.clear()

        cached = [batch(sb) for sb in sampled[:a.cached]]
        sampled.clear()
        if device.type == "cuda":   # ready from here on (what a graphed step's copy on its own stream waits for)
            ready = torch.cuda.Event()
            ready.record()
            for b in cached:
                b.ready = ready

        def steps_alone():
            with progress(n_batches, f"{precision} step", show) as bar:
                for i in range(n_batches):
                    step(cached[i % len(cached)])
                    bar.update(1)
        parts["step"] = seconds(device, steps_alone)
        if graphed is not None and graphed.bufs:
            # of the graphed step's time, the copy of each batch into the padded buffers
            def fills():
                for i in range(n_batches):
                    b = cached[i % len(cached)]
                    if graphed.bufs[0].fits(b):
                        graphed.bufs[0].fill(b)
            parts["step_fill"] = seconds(device, fills)
        cached.clear()   # the cached batches go before the pipelined parts

        training = TrainingStream(step_priority, device)
        for name, ahead in (("together", 0), ("together_ahead", a.sample_ahead)):
            loader = PipelinedLoader(sampler, store, seeds, a.batch_size, labels=labels, device=device,
                                     prefetch=2, shuffle=False, sample_ahead=ahead,
                                     stream_priority=priority)

            def pipelined():
                with training.active(), loader, progress(n_batches, f"{precision} {name}", show) as bar:
                    for b in loader:
                        step(b)
                        bar.update(1)
            parts[name] = seconds(device, pipelined)
    ms = {k: v / n_batches * 1e3 for k, v in parts.items()}
    alone = ms["sample"] + ms["gather"] + ms["step"]
    info = getattr(store, "stats", None)
    return {"precision": precision, "layers": model.backend, "ms_per_batch": ms,
            "cuda_graph": graphed.stats() if graphed is not None else None,
            "together_over_sum": ms["together"] / alone, "together_ahead_over_sum": ms["together_ahead"] / alone,
            "max_part_over_sum": max(ms["sample"], ms["gather"], ms["step"]) / alone,
            "store_stats": info() if callable(info) else None}


def profile_sampler(sampler, batches, device, path: Path) -> None:
    """The sampler's top operators over ``batches``, the first few (at most five, and never all)
    warming it up first, to ``path``."""
    warm = min(5, len(batches) // 2)
    for s in batches[:warm]:
        sampler.sample(s)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        wall = seconds(device, lambda: [sampler.sample(s) for s in batches[warm:]])
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{len(batches) - warm} batches sampled in {wall * 1e3:.1f} ms under the profiler\n"
                    + prof.key_averages().table(sort_by=key, row_limit=30))
    print(f"wrote {path}", flush=True)


def main(argv=None):
    a = parse(argv)
    device = resolve_device(a.device)
    for precision in a.precision:                 # before any data is loaded
        check_precision(precision, device)
    if a.sample_ahead > 1 and device.type != "cuda":
        raise ValueError(f"--sample-ahead {a.sample_ahead} needs the GPU sampler (a CUDA device), not {device}")
    if "high" in a.step_priority and "high" in a.loader_priority:
        raise ValueError("--step-priority high and --loader-priority high together put both at one priority: "
                         "give one of them")
    if a.cuda_graph and device.type != "cuda":
        raise ValueError(f"--cuda-graph needs a CUDA device (it replays the step as a CUDA graph), not {device}")
    show = not a.no_progress
    ds = load_dataset(a.dataset, root=a.root, show_progress=show)
    train_ids = ds.split["train"]
    n_batches = min(a.batches, train_ids.numel() // a.batch_size)
    if n_batches < 1:
        raise ValueError(f"{a.dataset}'s {train_ids.numel()} training nodes make no batch of {a.batch_size}")
    seeds = train_ids[torch.randperm(train_ids.numel(), generator=torch.Generator().manual_seed(0))]
    seeds = seeds[:n_batches * a.batch_size]
    batches = [seeds[i * a.batch_size:(i + 1) * a.batch_size] for i in range(n_batches)]

    if device.type == "cuda":
        graph = graph_to_gpu(ds.graph, device) if a.graph == "gpu" else ds.graph.to("unified")
    else:
        graph = ds.graph
    sampler = GPUNeighborSampler(graph, a.fanouts, seed=0, device=device, batches_per_call=a.sampler_batches)
    x, scale = feature_table(ds.x, a.feature_dtype, "unified" if a.store == "unified" else "cpu",
                             show=not a.no_progress)
    degree = None
    if a.store == "unified" and a.cache_mb:
        from torch_direct.gnn.graph import access_frequency
        degree = access_frequency(ds.graph, a.fanouts[-1])

    def make_store(form):   # the cache's form is read when the store is made
        if a.store != "unified":
            return make_feature_store("gpu_resident", x, device, torch.float32, scale=scale)
        with torch_direct.experimental(cached_gather=form):
            return make_feature_store("unified", x, device, torch.float32, scale=scale, cache_bytes=a.cache_mb << 20,
                                      degree=degree, max_sms=a.gather_sms or None, cpu_threads=a.gather_cpu_threads)
    if a.profile_sample is not None:
        profile_sampler(sampler, batches[:25], device, a.profile_sample)
    labels = ds.y.to(device)
    record = {"tool": "step_floor_probe", "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
              "device": str(device), "graph_device": str(graph.device), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "batches": n_batches, "store": a.store, "runs": []}
    print(f"step_floor_probe: {a.dataset}, {n_batches} batches of {a.batch_size}, fanouts "
          f"{','.join(map(str, a.fanouts))}, {a.model} hidden {a.hidden}, CSR on {graph.device}, {device}", flush=True)
    store, form_made = None, None
    for form, relabel, waits, priority, step_priority, layers, aggregate, precision in itertools.product(
            a.cached_gather, a.sampler_relabel, a.sampler_waits, a.loader_priority, a.step_priority, a.layers,
            a.aggregate, a.precision):
        if form != form_made:
            store = None      # the last form's cache goes first
            store, form_made = make_store(form), form
        with torch_direct.experimental(sampler_waits=waits, sampler_relabel=relabel):   # read on each call
            run = measure(precision, layers, aggregate, priority, step_priority, ds, device, sampler, store, labels,
                          batches, seeds, a, show)
        run["sampler_waits"], run["sampler_relabel"], run["loader_priority"] = waits, relabel, priority
        run["step_priority"], run["sample_ahead"] = step_priority, a.sample_ahead
        run["aggregate"], run["cached_gather"] = aggregate, form
        record["runs"].append(run)
        print(f" {run['layers']} layers ({aggregate} aggregation), {precision}, sampler waits {waits}, "
              f"relabel {relabel}, loader priority {priority}, step priority {step_priority}"
              f"{f', cached gather {form}' if a.cache_mb else ''}:")
        for k, v in run["ms_per_batch"].items():
            print(f"  {k:15s} {v:8.3f} ms/batch")
        print(f"  together / (sample + gather + step) = {run['together_over_sum']:.2f} (sample ahead: "
              f"{run['together_ahead_over_sum']:.2f}; perfect overlap: {run['max_part_over_sum']:.2f})", flush=True)
        if a.out:   # rewritten after each run: a call cut short keeps what it measured
            write_record(a.out, record)
    if a.out:
        print(f"wrote {a.out}")
    return record


if __name__ == "__main__":
    run("step_floor_probe", main)
