"""The options of ``python -m torch_direct train`` (and of the benchmarks that train), and
the checks that refuse a bad combination before any data is loaded."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from .models import LAYERS, MODELS, PRECISIONS, check_precision, use_pyg_for


def fanout_list(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 15,10,5, got {text!r}") from None
    if not out or any(f < -1 or f == 0 for f in out):
        raise argparse.ArgumentTypeError(f"each fanout is a positive int or -1 (all neighbours), got {text!r}")
    return out


def positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return v
    return parse


def share(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}") from None
    if not 0.0 <= v <= 1.0:   # a NaN fails too
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text!r}")
    return v


def graph_margin(text: str):
    """``auto`` or a share from 0 to 1: --cuda-graph-margin's value."""
    if text == "auto":
        return text
    try:
        return share(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto or a number from 0 to 1, got {text!r}") from None


def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


FEATURE_DTYPES = ("stored", "fp32", "fp16", "bf16", "fp8", "int4")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python -m torch_direct train``."""
    from .features import KINDS
    from .loader import STREAM_PRIORITIES
    p.add_argument("--dataset", default="tiny",
                   help="a preset (tiny, arxiv-like, products-like, papers100M-like; generated once and "
                        "cached) or an OGB name such as ogbn-arxiv read from --root (default: %(default)s)")
    p.add_argument("--root", default=None,
                   help="data set directory (default: $TORCH_DIRECT_DATA or ~/.cache/torch_direct/datasets)")
    p.add_argument("--model", choices=MODELS, default="sage",
                   help="GraphSAGE, GAT or GIN; PyG's layers when torch_geometric is installed, else a "
                        "built-in GraphSAGE (sage only) (default: %(default)s)")
    p.add_argument("--layers", choices=LAYERS, default="auto",
                   help="layer implementation: pyg = torch_geometric's convs, builtin = the plain-torch "
                        "GraphSAGE (sage only; fast on a CPU), auto = pyg when installed (default: %(default)s)")
    p.add_argument("--pipeline", choices=KINDS + ("pyg",), default="unified",
                   help="where features come from: unified = zero-copy gather from pinned host memory; "
                        "cpu_centric = CPU slicing into pinned buffers + DMA; gpu_resident = all features "
                        "copied to the GPU; pyg = PyG's NeighborLoader (CPU sampling and slicing in "
                        "--pyg-workers processes, .to(device) per batch; needs torch_geometric with pyg-lib "
                        "or torch-sparse) (default: %(default)s)")
    p.add_argument("--pyg-workers", type=nonneg_int, default=min(4, os.cpu_count() or 1),
                   help="--pipeline pyg: NeighborLoader worker processes (default: %(default)s)")
    p.add_argument("--epochs", type=positive(int), default=5, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=positive(int), default=1024,
                   help="seed nodes per mini-batch (default: %(default)s)")
    p.add_argument("--fanouts", type=fanout_list, default=[15, 10, 5],
                   help="neighbours sampled per node at each hop from the seeds, comma-separated; one "
                        "per layer, -1 = all (default: 15,10,5)")
    p.add_argument("--eval-fanouts", type=fanout_list, default=None,
                   help="fanouts of sampled inference (default: 20 per layer)")
    p.add_argument("--eval-batch-size", type=positive(int), default=4096,
                   help="seed nodes per inference batch (default: %(default)s)")
    p.add_argument("--test-nodes", type=nonneg_int, default=0,
                   help="report test accuracy over this many test nodes, a fixed random subset (the same "
                        "for every pipeline with the same --data-seed); 0 = the whole test split "
                        "(default: %(default)s)")
    p.add_argument("--full-eval", action="store_true",
                   help="also report test accuracy with full neighbourhoods (layer-wise inference over the "
                        "test nodes' receptive field: each layer runs for the nodes the next one reads)")
    p.add_argument("--hidden", type=positive(int), default=256, help="hidden width (default: %(default)s)")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout between layers (default: %(default)s)")
    p.add_argument("--lr", type=positive(float), default=3e-3, help="Adam learning rate (default: %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="the model's arithmetic: fp32 = float32 (torch's default); tf32 = float32 tensors, "
                        "matmuls on TF32 tensor cores (CUDA only); bf16 = autocast to bfloat16 in training and "
                        "inference, weights and optimizer in float32. Either way the built-in GraphSAGE layers take a "
                        "float16/bfloat16 table's rows as stored, other layers float32 rows "
                        "(default: %(default)s)")
    p.add_argument("--feature-dtype", choices=FEATURE_DTYPES, default="stored",
                   help="how the feature table is held: stored = as the data set stores it; fp32, fp16, bf16 = "
                        "converted once at load; fp8 = float8 e4m3 with a float32 scale per row "
                        "(torch_direct.quantize_rows_fp8: half of fp16's bytes, so twice the rows fit in "
                        "--cache-mb), upcast and scaled in the gather kernel; int4 = 4-bit integers, two a "
                        "byte, with a float32 scale per row (torch_direct.quantize_rows_int4: half of fp8's "
                        "bytes, a larger rounding error), gathered as bytes and unpacked on the device. Rows "
                        "reach the model as float32 either way (default: %(default)s)")
    p.add_argument("--device", default=None,
                   help="cuda[:k] or cpu (default: cuda when a usable GPU is present, else cpu)")
    p.add_argument("--sampler", choices=("auto", "cpu", "gpu"), default="auto",
                   help="neighbour sampler: CPU threads, or the GPU reading the unified CSR in place; auto = "
                        "gpu for the unified and gpu_resident pipelines on a GPU, cpu otherwise")
    p.add_argument("--graph", choices=("unified", "gpu"), default="unified",
                   help="where the GPU sampler reads the CSR: unified = in host memory, read in place over "
                        "PCIe (no GPU memory); gpu = a copy in GPU memory (faster sampling; needs the GPU "
                        "sampler; the features stay where --pipeline puts them). gpu_resident always "
                        "copies it (default: %(default)s)")
    p.add_argument("--cache-mb", type=nonneg_int, default=0,
                   help="unified or cpu_centric pipeline on a GPU: MiB of GPU memory for the hottest feature rows, those "
                        "the sampler reads most often (torch_direct.gnn.graph.access_frequency with the last "
                        "fanout) (default: %(default)s)")
    p.add_argument("--cache-share", type=share, default=None, metavar="F",
                   help="unified or cpu_centric pipeline on a GPU, instead of --cache-mb: a cache of the hottest "
                        "rows sized so that at most this share of the feature table's bytes is in GPU memory, "
                        "what the store keeps there already (row scales) counted (0.5: half)")
    p.add_argument("--gather-sms", type=nonneg_int, default=0,
                   help="unified pipeline on a GPU: streaming multiprocessors the feature gather may use, "
                        "leaving the others to the training step it overlaps; 0 = all (default: %(default)s)")
    p.add_argument("--gather-cpu-share", type=share, default=None, metavar="F",
                   help="with --gather-cpu-threads: the CPU threads take this fixed share of each gather's "
                        "rows, 0 to 1 (1: all of them, so that no gather kernel waits on PCIe beside the "
                        "training step's kernels; default: the share the measured rates of both paths give)")
    p.add_argument("--gather-cpu-threads", type=nonneg_int, default=0,
                   help="unified pipeline on a GPU: make each feature gather hybrid, that many CPU threads "
                        "gathering a share of the rows into pinned memory (copied to the GPU while the "
                        "kernel reads the rest; the share follows measured rates); at least torch's thread "
                        "count (--threads) hands the share to index_select on torch's threads, the fastest "
                        "CPU path; they compete with a CPU sampler's threads and with the training loop, which needs "
                        "a core to launch its kernels (16 threads on 16 cores took the step from 2.6 to 5.9 s "
                        "an epoch on papers100M-like); 0 = the GPU reads every row "
                        "(default: %(default)s)")
    p.add_argument("--cuda-graph", type=int, nargs="?", const=1, default=0, choices=(1, 2), metavar="BUFFERS",
                   help="replay the training step as one CUDA graph: captured after 3 eager batches, each "
                        "batch then copied into buffers padded to --cuda-graph-margin more than the "
                        "largest seen (a larger one steps eagerly); the padding changes no logit or gradient "
                        "of the batch's rows. "
                        "One launch a step instead of hundreds (CUDA only; any --precision). BUFFERS 2: two "
                        "sets of buffers with a graph each, used in turn, a batch copied into one on a stream "
                        "of its own while the other's graph runs (default without a number: 1)")
    p.add_argument("--cuda-graph-margin", type=graph_margin, default=None, metavar="SHARE|auto",
                   help="with --cuda-graph: the captured step's capacities exceed the largest of the 3 eager "
                        "batches by this share (0 to 1); each replay computes at full capacity, so a smaller "
                        "margin pads less, and a batch past it steps eagerly (slower; counted as a miss). "
                        "auto: each size of each block (sources, edges) its own, four times its relative "
                        "spread over the eager batches, from 0.02 to 0.1 (default: auto)")
    p.add_argument("--prefetch", type=nonneg_int, default=2,
                   help="batches prepared ahead by the loader thread; 0 = no overlap (default: %(default)s)")
    p.add_argument("--sample-ahead", type=positive(int), nargs="?", const=1, default=0, metavar="THREADS",
                   help="sample in a thread (and CUDA stream) of its own, up to --prefetch batches ahead of "
                        "the feature gather, so that one batch's gather overlaps the next one's sampling "
                        "(the batches are the same); with THREADS > 1 (GPU sampler only) that many threads "
                        "take batches in turn, so one's waits for its sizes overlap another's kernels; "
                        "needs --prefetch > 0")
    p.add_argument("--gather-workers", type=positive(int), default=1, metavar="THREADS",
                   help="threads that gather and transfer batches, each on a CUDA stream of its own, taking "
                        "the sampled batches in turn and handing them to the training loop in order, so "
                        "that one batch's gather overlaps the next one's where a gather waits for the "
                        "host (--gather-cpu-threads, a --cache-mb cache's split gather); the batches are "
                        "the same; above 1 needs --sample-ahead; evaluation gathers on one thread, its "
                        "batches being many times larger (default: %(default)s)")
    p.add_argument("--sampler-batches", type=positive(int), default=1, metavar="K",
                   help="GPU sampler: sample K batches in one call, each hop's steps run once over all of "
                        "them (fewer launches and host waits a batch; the batches are the same); not with "
                        "--sample-ahead above 1 (default: %(default)s)")
    p.add_argument("--loader-priority", choices=STREAM_PRIORITIES, default="normal",
                   help="priority of the loader's CUDA streams: high = the device's highest, so the GPU runs "
                        "the loader's short sampling and gather kernels ahead of the training step's waiting "
                        "ones; the batches are the same (default: %(default)s)")
    p.add_argument("--step-priority", choices=STREAM_PRIORITIES, default="normal",
                   help="priority of the CUDA stream the training steps run on: high = the device's "
                        "highest, so that as SMs free up the step's kernels get them before the loader's "
                        "sampling and gather kernels, which fill the gaps; the batches and the steps are "
                        "the same (default: %(default)s)")
    p.add_argument("--reorder", choices=("degree", "frequency", "none"), default="none",
                   help="locality lever: relabel the nodes once before training, hot nodes first "
                        "(degree = most neighbours, frequency = most often read, ranked as --cache-mb ranks "
                        "rows, so the cache holds the table's first rows and misses fall in the rest), so "
                        "the rows a batch reads most sit together at the start of the feature table; features, "
                        "labels, splits and the CSR are permuted, accuracy is unchanged (default: %(default)s)")
    p.add_argument("--merge-gathers", type=positive(int), nargs="?", const=0, default=1, metavar="K",
                   help="locality lever: gather the features of K batches at once (the union of their "
                        "nodes, each row read once, in address order), each batch then taking its rows; "
                        "without K: the prefetch window (max(2, --prefetch)); 1 = a gather per batch "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of model init, shuffling and sampling (default: %(default)s)")
    p.add_argument("--data-seed", type=nonneg_int, default=0,
                   help="seed of the synthetic preset (default: %(default)s)")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="CPU threads of torch ops and the CPU sampler (default: torch's, usually one per core)")
    p.add_argument("--json", metavar="PATH", default=None, help="write a JSON record of the run to PATH")
    p.add_argument("--profile", metavar="PATH", default=None,
                   help="profile training steps 10-29 of the first epoch (a warm-up epoch, left out of the "
                        "benchmarks' medians) with torch.profiler and write the top operators by device "
                        "time to PATH (.txt), or a Chrome trace (.json)")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="write an SVG of the run to PATH: per-epoch time by stage, accuracy curves")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def resolve_device(name) -> torch.device:
    """The device of ``--device`` (None: the current CUDA device when usable, else the CPU)."""
    from .features import check_device, cuda_usable
    if name is None:
        return torch.device("cuda", torch.cuda.current_device()) if cuda_usable() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: not a device name: {name!r}") from None
    return check_device(dev)


def uses_gpu_sampler(args, cuda: bool) -> bool:
    """Whether a run samples with the GPU sampler: ``--sampler gpu``, or ``auto`` on a CUDA
    device unless cpu_centric keeps its graph in host memory."""
    return args.sampler == "gpu" or (args.sampler == "auto" and cuda
                                     and (args.pipeline != "cpu_centric" or args.graph == "gpu"))


def experimental_int(name: str, lo: int, hi: int | None = None) -> int | None:
    """The experimental setting ``name`` as an int in [lo, hi] (None when unset); a ValueError
    naming the setting for any other value."""
    import torch_direct
    value = torch_direct.experimental_setting(name)
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or n < lo or (hi is not None and n > hi):
        want = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        raise ValueError(f"TORCH_DIRECT_EXPERIMENTAL: {name} must be {want}, not {value!r}")
    return n


def check_options(args, device) -> None:
    """Refuse, before any data is loaded, options that contradict each other or ``device``
    (one line each, naming the option)."""
    import torch_direct

    from .features import hybrid_split, store_index_bounds
    from .graphed import step_host
    from .pages import feature_pages
    from .turns import gather_turns
    hybrid_split()            # refuses a setting that is not one of its splits
    pages = feature_pages()   # refuses a setting that is not one of its pages
    experimental_int("gil_switch_us", 1)
    step_host()               # refuses a setting that is not fused or python
    gather_turns()            # refuses a setting that is not wait or deposit
    store_index_bounds()      # refuses a setting that is not checked or known
    experimental_int("cpu_pool_nice", 0, 19)   # read by the C++ pool at its first use: refused here first
    torch_direct.experimental_setting("cpu_pool_size", choices=("concurrent", "largest"))  # read by the C++ pool
    torch_direct.experimental_setting("cpu_gather_stores", choices=("plain", "streaming"))  # by the CPU gather
    torch_direct.experimental_setting("hybrid_copies", choices=("wait", "ordered"))  # by the hybrid gather
    experimental_int("hybrid_piece_kb", 16)   # by the hybrid gather's CPU threads
    if pages == "driver" and (torch.device(device).type != "cuda" or not torch_direct.cuda_available()):
        raise ValueError("TORCH_DIRECT_EXPERIMENTAL: feature_pages=driver needs a CUDA GPU (the driver "
                         f"allocates and maps the table), and this run's device is {device}")
    eval_fanouts = args.eval_fanouts or [20] * len(args.fanouts)
    if len(eval_fanouts) != len(args.fanouts):
        raise ValueError(f"--eval-fanouts has {len(eval_fanouts)} entries, --fanouts {len(args.fanouts)}: "
                         f"one per layer in both")
    if not 0.0 <= args.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {args.dropout}")
    if getattr(args, "cuda_graph_margin", None) is not None and not getattr(args, "cuda_graph", False):
        raise ValueError("--cuda-graph-margin applies to the captured step: add --cuda-graph")
    if getattr(args, "cuda_graph", False):
        if device.type != "cuda":
            raise ValueError("--cuda-graph needs a CUDA device (it replays the step as a CUDA graph)")
    if args.sample_ahead and args.prefetch == 0:
        raise ValueError("--sample-ahead needs --prefetch > 0 (the sampling thread runs ahead of the loader's)")
    if getattr(args, "gather_workers", 1) > 1 and not args.sample_ahead and args.pipeline != "pyg":
        raise ValueError(f"--gather-workers {args.gather_workers} takes its batches from sampling threads: "
                         f"add --sample-ahead")
    if getattr(args, "sampler_batches", 1) > 1:
        if not uses_gpu_sampler(args, device.type == "cuda"):
            raise ValueError("--sampler-batches applies to the GPU sampler (--sampler gpu, or a CUDA device)")
        if args.sample_ahead > 1:
            raise ValueError("--sampler-batches and --sample-ahead above 1 do not go together: the sampling "
                             "threads take one batch per call")
    if args.sample_ahead > 1 and not uses_gpu_sampler(args, device.type == "cuda"):
        raise ValueError(f"--sample-ahead {args.sample_ahead} needs the GPU sampler (--sampler gpu, or a CUDA "
                         f"device); the CPU sampler samples on every core already")
    if args.loader_priority == "high" and getattr(args, "step_priority", "normal") == "high":
        raise ValueError("--loader-priority high and --step-priority high together put both at one priority: "
                         "give one of them")
    cache_share = getattr(args, "cache_share", None)
    if args.cache_mb and cache_share is not None:
        raise ValueError("--cache-mb and --cache-share both size the GPU cache: give one of them")
    if cache_share == 0.0:
        raise ValueError("--cache-share 0 holds no row: leave it out for no cache")
    for option, given in (("--cache-mb", args.cache_mb), ("--cache-share", cache_share is not None)):
        if given and args.pipeline not in ("unified", "cpu_centric"):
            raise ValueError(f"{option} does not apply to --pipeline {args.pipeline}: "
                             + ("its whole table is in GPU memory" if args.pipeline == "gpu_resident"
                                else "PyG's loader reads its own feature tensor"))
    if args.gather_sms and args.pipeline != "unified":
        raise ValueError("--gather-sms applies to --pipeline unified only (its zero-copy gather kernel)")
    if args.gather_cpu_threads and args.pipeline != "unified":
        raise ValueError("--gather-cpu-threads applies to --pipeline unified only (its hybrid gather)")
    if getattr(args, "gather_cpu_share", None) is not None and not args.gather_cpu_threads:
        raise ValueError(f"--gather-cpu-share {args.gather_cpu_share:g} sets the share of the hybrid gather's CPU "
                         "threads: give --gather-cpu-threads too")
    if args.pipeline == "pyg":
        for option, set_, what in (("--feature-dtype", getattr(args, "feature_dtype", "stored") != "stored",
                                    "PyG's loader reads the data set's own tensor"),
("--sampler", args.sampler != "auto", "PyG samples in its loader"),
                                   ("--graph gpu", args.graph == "gpu", "PyG samples on the CPU"),
                                   ("--merge-gathers", args.merge_gathers != 1, "PyG's loader gathers per batch"),
                                   ("--sample-ahead", args.sample_ahead, "PyG's workers sample and slice together"),
                                   ("--gather-workers", getattr(args, "gather_workers", 1) != 1,
                                    "PyG's workers sample and slice together"),
                                   ("--sampler-batches", getattr(args, "sampler_batches", 1) != 1,
                                    "PyG samples in its loader"),
                                   ("--loader-priority", args.loader_priority != "normal",
                                    "PyG's loader has no CUDA streams")):
            if set_:
                raise ValueError(f"{option} does not apply to --pipeline pyg: {what}")
    if args.graph == "gpu":
        if device.type != "cuda":
            raise ValueError("--graph gpu needs a CUDA device")
        if args.sampler == "cpu":
            raise ValueError("--graph gpu is read by the GPU sampler; --sampler cpu reads the CSR in host memory")
    if args.sampler == "gpu" and device.type != "cuda":
        raise ValueError("--sampler gpu needs a CUDA device")
    check_machine(args, device)
    check_precision(args.precision, device)
    use_pyg_for(args.layers)


def check_machine(args, device) -> None:
    """Refuse the options that cannot take effect on ``device`` (one line each):
    they act on GPU memory or GPU kernels, and a run on the CPU would ignore them.
    (``--pipeline gpu_resident`` runs on the CPU too: the device's memory is then host memory.)"""
    if device.type == "cuda":
        return
    where = "with --device cpu" if str(getattr(args, "device", "")) == "cpu" else "without a usable CUDA GPU"
    for option, value, what in (("--cache-mb", args.cache_mb, "caches rows in GPU memory"),
                                ("--cache-share", getattr(args, "cache_share", None), "caches rows in GPU memory"),
                                ("--gather-sms", args.gather_sms, "caps the GPU gather kernel's SMs"),
                                ("--gather-cpu-threads", args.gather_cpu_threads,
                                 "adds CPU threads to the GPU gather")):
        if value:
            raise ValueError(f"{option} {what}: it has no effect {where}")


def check_paths(args) -> None:
    """Refuse, before any data is made or loaded, a path the run could not use:
    ``--json``/``--profile``/``--plot`` that cannot be written or name a format
    the run does not write, a ``--root`` that is not a folder."""
    from ..outputs import check_writable
    if args.json:
        check_writable(args.json, "--json")
    if args.profile:
        check_writable(args.profile, "--profile")
        if Path(args.profile).suffix.lower() not in (".txt", ".json"):
            raise ValueError(f"--profile: give a .txt (top operators) or .json (Chrome trace) path, "
                             f"got {args.profile!r}")
    if args.plot:
        check_writable(args.plot, "--plot")
        if Path(args.plot).suffix.lower() != ".svg":
            raise ValueError(f"--plot: the run's chart is an SVG; give a .svg path, got {args.plot!r}")
    if args.root is not None:
        root = Path(args.root).expanduser()
        if root.exists() and not root.is_dir():
            raise ValueError(f"--root: {root} is not a folder")
        if not root.exists():
            check_writable(root / "probe", "--root")
