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
``python -m torch_direct.bench train-ablation`` times each of them. The fastest unified setting
measured on products-like (one H200, docs/pipeline.md): ``--graph gpu --reorder frequency
--sample-ahead --cache-mb 512``, within 1.15x of gpu_resident's epoch.

Models: GraphSAGE, GAT and GIN from PyG when torch_geometric is installed; without it a
built-in GraphSAGE (mean aggregation, plain torch ops) so the command runs anywhere.

Several GPUs: ``torchrun --nproc-per-node=N -m torch_direct train ...`` runs one process per
GPU (DistributedDataParallel over NCCL) over one host copy of the data set per node
(docs/distributed.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn
import torch.nn.functional as F

MODELS = ("sage", "gat", "gin")
LAYERS = ("auto", "pyg", "builtin")   # --layers: PyG's convs when installed, PyG's, or the built-in SAGE
PRECISIONS = ("fp32", "tf32", "bf16")


def have_pyg() -> bool:
    import warnings
    try:
        with warnings.catch_warnings():  # PyG's import-time deprecation notices are not ours to show
            warnings.simplefilter("ignore", FutureWarning)
            import torch_geometric.nn  # noqa: F401
    except ImportError:
        return False
    return True


# -- models ----------------------------------------------------------------------------------------

class SAGELayer(nn.Module):
    """GraphSAGE with mean aggregation on a bipartite block, in plain torch ops:
    ``out = W_l mean_{u in N(v)} x_u + W_r x_v``."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin_l = nn.Linear(in_dim, out_dim)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, x, edge_index, size):
        n_dst = size[1]
        src, dst = edge_index[0], edge_index[1]
        agg = torch.zeros(n_dst, x.size(1), dtype=x.dtype, device=x.device).index_add_(0, dst, x[src])
        # Degrees by index_add, not bincount: bincount on a CUDA tensor reads its maximum back to
        # size the output, a host wait in every layer of every step.
        deg = torch.zeros(n_dst, dtype=x.dtype, device=x.device).index_add_(
            0, dst, torch.ones(dst.numel(), dtype=x.dtype, device=x.device))
        deg = deg.clamp_(min=1).unsqueeze(1)
        return self.lin_l(agg / deg) + self.lin_r(x[:n_dst])


class _PyGLayer(nn.Module):
    """A PyG conv applied to a bipartite block ``(x, x[:n_dst])``, plus an optional skip
    (GAT without self-loops keeps the target's own features through it)."""

    def __init__(self, conv: nn.Module, skip: nn.Module | None = None):
        super().__init__()
        self.conv, self.skip = conv, skip

    def forward(self, x, edge_index, size):
        x_dst = x[:size[1]]
        out = self.conv((x, x_dst), edge_index)
        return out if self.skip is None else out + self.skip(x_dst)


def use_pyg_for(layers: str) -> bool | None:
    """``GNN``'s ``use_pyg`` for a ``--layers`` choice (None: PyG's when installed); ``pyg``
    without torch_geometric is refused here, before any data is loaded."""
    if layers not in LAYERS:
        raise ValueError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    use_pyg = {"auto": None, "pyg": True, "builtin": False}[layers]
    if use_pyg and not have_pyg():
        raise ValueError("--layers pyg: torch_geometric is not installed (pip install torch_geometric)")
    return use_pyg


def make_layer(model: str, in_dim: int, out_dim: int, last: bool, use_pyg: bool) -> nn.Module:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: expected one of {', '.join(MODELS)}")
    if not use_pyg:
        if model != "sage":
            raise RuntimeError(f"--model {model} needs torch_geometric (pip install torch_geometric); "
                               f"without it only the built-in 'sage' is available")
        return SAGELayer(in_dim, out_dim)
    from torch_geometric.nn import GATConv, GINConv, SAGEConv
    if model == "sage":
        return _PyGLayer(SAGEConv((in_dim, in_dim), out_dim))
    if model == "gat":
        heads = 1 if last or out_dim % 4 else 4
        conv = GATConv((in_dim, in_dim), out_dim // heads, heads=heads, add_self_loops=False)
        return _PyGLayer(conv, nn.Linear(in_dim, out_dim, bias=False))
    mlp = nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))
    return _PyGLayer(GINConv(mlp, train_eps=True))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam over ``model``'s parameters; with every parameter on a CUDA device, the fused
    implementation (one kernel per step for all of them, where the default launches several per
    group: a 3-layer GraphSAGE step on papers100M-like is a few milliseconds, much of it launch
    overhead). Elsewhere torch's default implementation."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    return torch.optim.Adam(params, lr=lr, fused=True) if fused else torch.optim.Adam(params, lr=lr)


def _known_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def check_precision(precision: str, device) -> torch.device:
    """Refuse a precision the device cannot run (before any data is loaded); the device."""
    _known_precision(precision)
    device = torch.device(device)
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(f"--precision tf32 needs a CUDA device (TF32 is a GPU tensor-core format), not {device}")
    return device


@contextmanager
def model_precision(precision: str, device):
    """The run-wide side of ``precision`` (see :class:`GNN` for bf16): with ``tf32``, float32
    matmuls run on TF32 tensor cores inside the block (``torch.set_float32_matmul_precision
    ("high")``, restored on exit; CUDA only); ``fp32`` and ``bf16`` change nothing here."""
    device = check_precision(precision, device)
    if precision != "tf32":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class GNN(nn.Module):
    """``num_layers`` message-passing layers over the blocks of a sampled batch
    (``adjs`` in model order); ReLU and dropout between layers."""

    def __init__(self, model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 dropout: float = 0.5, use_pyg: bool | None = None, precision: str = "fp32"):
        super().__init__()
        self.precision = _known_precision(precision)
        use_pyg = have_pyg() if use_pyg is None else use_pyg
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(make_layer(model, dims[i], dims[i + 1], i == num_layers - 1, use_pyg)
                                    for i in range(num_layers))
        self.dropout = dropout
        self.backend = "pyg" if use_pyg else "builtin"

    def autocast(self, device):
        """The context of this model's arithmetic on ``device``: with precision ``bf16``,
        autocast to bfloat16 (matmuls and linear layers in bfloat16, weights float32). Entered
        around each forward pass, never around a whole loop: autocast caches the bfloat16 copies
        of the weights until it exits, so a loop inside one context would train on stale ones."""
        if self.precision == "bf16":
            return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
        return nullcontext()

    def forward(self, x, adjs):
        """Logits of the batch's seeds, float32 whatever the precision."""
        if len(adjs) != len(self.layers):
            raise ValueError(f"GNN: {len(self.layers)} layers but the batch has {len(adjs)} blocks")
        with self.autocast(x.device):
            x = self._layers(x, adjs)
        return x.float()

    def _layers(self, x, adjs):
        for i, (edge_index, _, size) in enumerate(adjs):
            x = self.layers[i](x, edge_index, size)
            if i < len(self.layers) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


# -- the command -----------------------------------------------------------------------------------

def _fanouts(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 15,10,5, got {text!r}") from None
    if not out or any(f < -1 or f == 0 for f in out):
        raise argparse.ArgumentTypeError(f"each fanout is a positive int or -1 (all neighbours), got {text!r}")
    return out


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return v
    return parse


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


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
    p.add_argument("--pipeline", choices=KINDS, default="unified",
                   help="where features come from: unified = zero-copy gather from pinned host memory; "
                        "cpu_centric = CPU slicing into pinned buffers + DMA; gpu_resident = all features "
                        "copied to the GPU (default: %(default)s)")
    p.add_argument("--epochs", type=_positive(int), default=5, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=_positive(int), default=1024,
                   help="seed nodes per mini-batch (default: %(default)s)")
    p.add_argument("--fanouts", type=_fanouts, default=[15, 10, 5],
                   help="neighbours sampled per node at each hop from the seeds, comma-separated; one "
                        "per layer, -1 = all (default: 15,10,5)")
    p.add_argument("--eval-fanouts", type=_fanouts, default=None,
                   help="fanouts of sampled inference (default: 20 per layer)")
    p.add_argument("--eval-batch-size", type=_positive(int), default=4096,
                   help="seed nodes per inference batch (default: %(default)s)")
    p.add_argument("--test-nodes", type=_nonneg_int, default=0,
                   help="report test accuracy over this many test nodes, a fixed random subset (the same "
                        "for every pipeline with the same --data-seed); 0 = the whole test split "
                        "(default: %(default)s)")
    p.add_argument("--full-eval", action="store_true",
                   help="also report test accuracy with full neighbourhoods (layer-wise inference over the "
                        "test nodes' receptive field: each layer runs for the nodes the next one reads)")
    p.add_argument("--hidden", type=_positive(int), default=256, help="hidden width (default: %(default)s)")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout between layers (default: %(default)s)")
    p.add_argument("--lr", type=_positive(float), default=3e-3, help="Adam learning rate (default: %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="the model's arithmetic: fp32 = float32 (torch's default); tf32 = float32 tensors, "
                        "matmuls on TF32 tensor cores (CUDA only); bf16 = autocast to bfloat16 in training and "
                        "inference, weights and optimizer in float32. Features are gathered as float32 "
                        "either way (default: %(default)s)")
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
    p.add_argument("--cache-mb", type=_nonneg_int, default=0,
                   help="unified pipeline on a GPU: MiB of GPU memory for the hottest feature rows, those "
                        "the sampler reads most often (torch_direct.graph.access_frequency with the last "
                        "fanout) (default: %(default)s)")
    p.add_argument("--gather-sms", type=_nonneg_int, default=0,
                   help="unified pipeline on a GPU: streaming multiprocessors the feature gather may use, "
                        "leaving the others to the training step it overlaps; 0 = all (default: %(default)s)")
    p.add_argument("--gather-cpu-threads", type=_nonneg_int, default=0,
                   help="unified pipeline on a GPU: make each feature gather hybrid, that many CPU threads "
                        "gathering a share of the rows into pinned memory (copied to the GPU while the "
                        "kernel reads the rest; the share follows measured rates); at least torch's thread "
                        "count (--threads) hands the share to index_select on torch's threads, the fastest "
                        "CPU path; they compete with a CPU sampler's threads and with the training loop, which needs "
                        "a core to launch its kernels (16 threads on 16 cores took the step from 2.6 to 5.9 s "
                        "an epoch on papers100M-like); 0 = the GPU reads every row "
                        "(default: %(default)s)")
    p.add_argument("--prefetch", type=_nonneg_int, default=2,
                   help="batches prepared ahead by the loader thread; 0 = no overlap (default: %(default)s)")
    p.add_argument("--sample-ahead", action="store_true",
                   help="sample in a thread (and CUDA stream) of its own, up to --prefetch batches ahead of "
                        "the feature gather, so that one batch's gather overlaps the next one's sampling "
                        "(the batches are the same); needs --prefetch > 0")
    p.add_argument("--loader-priority", choices=STREAM_PRIORITIES, default="normal",
                   help="priority of the loader's CUDA streams: high = the device's highest, so the GPU runs "
                        "the loader's short sampling and gather kernels ahead of the training step's waiting "
                        "ones; the batches are the same (default: %(default)s)")
    p.add_argument("--reorder", choices=("degree", "frequency", "none"), default="none",
                   help="locality lever: relabel the nodes once before training, hot nodes first "
                        "(degree = most neighbours, frequency = most often a neighbour), so the rows a "
                        "batch reads most sit together at the start of the feature table; features, "
                        "labels, splits and the CSR are permuted, accuracy is unchanged (default: %(default)s)")
    p.add_argument("--merge-gathers", type=_positive(int), nargs="?", const=0, default=1, metavar="K",
                   help="locality lever: gather the features of K batches at once (the union of their "
                        "nodes, each row read once, in address order), each batch then taking its rows; "
                        "without K: the prefetch window (max(2, --prefetch)); 1 = a gather per batch "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of model init, shuffling and sampling (default: %(default)s)")
    p.add_argument("--data-seed", type=_nonneg_int, default=0,
                   help="seed of the synthetic preset (default: %(default)s)")
    p.add_argument("--threads", type=_positive(int), default=None,
                   help="CPU threads of torch ops and the CPU sampler (default: torch's, usually one per core)")
    p.add_argument("--json", metavar="PATH", default=None, help="write a JSON record of the run to PATH")
    p.add_argument("--profile", metavar="PATH", default=None,
                   help="profile training steps 10-29 of the first epoch (a warm-up epoch, left out of the "
                        "benchmarks' medians) with torch.profiler and write the top operators by device "
                        "time to PATH (.txt), or a Chrome trace (.json)")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="write an SVG of the run to PATH: per-epoch time by stage, accuracy curves")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _resolve_device(name):
    from .features import _check_device, _cuda_usable
    if name is None:
        return torch.device("cuda", torch.cuda.current_device()) if _cuda_usable() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: not a device name: {name!r}") from None
    return _check_device(dev)


class _StepTimer:
    """Seconds spent in training steps: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.pairs, self.seconds = [], 0.0

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, start):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pairs.append((start, ev))
        else:
            self.seconds += time.perf_counter() - start

    def total(self) -> float:
        for a, b in self.pairs:
            b.synchronize()
            self.seconds += a.elapsed_time(b) / 1e3
        self.pairs.clear()
        return self.seconds


class _StepProfiler:
    """torch.profiler over training steps [first, first + count) of an epoch; ``finish`` writes
    the top operators (a .txt table) or a Chrome trace (.json) to ``path``."""

    def __init__(self, path, device, first: int = 10, count: int = 20):
        self.path, self.first, self.count = Path(path), first, count
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.cuda = device.type == "cuda"
        self.prof = torch.profiler.profile(activities=acts)
        self.steps = 0
        self.running = False

    def step(self, i: int) -> None:
        if i == self.first:
            self.prof.start()
            self.running = True
        elif self.running and i == self.first + self.count:
            self._stop()
        if self.running:
            self.steps += 1

    def _stop(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.prof.stop()
        self.running = False

    def finish(self) -> Path:
        if self.running:              # an epoch shorter than first + count steps
            self._stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.steps == 0:
            self.path.write_text(f"no step profiled: the epoch has {self.first} steps or fewer\n")
        elif self.path.suffix == ".json":
            self.prof.export_chrome_trace(str(self.path))
        else:
            key = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
            table = self.prof.key_averages().table(sort_by=key, row_limit=40)
            self.path.write_text(f"{self.steps} training steps (from step {self.first} of epoch 1), "
                                 f"sorted by {key}\n{table}\n")
        return self.path


def graph_to_gpu(graph, device):
    """``graph`` copied to the GPU ``device``, with a clear error, before any allocation, when
    its arrays would leave less than a quarter of the free GPU memory for training."""
    need = sum(t.numel() * t.element_size() for t in (graph.rowptr, graph.col, graph.edge_ids)
               if t is not None)
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.75 * free:
        raise ValueError(f"the graph's CSR takes {need / 2**30:.2f} GiB, {device} has {free / 2**30:.2f} GiB free: "
                         f"too little left to train beside a GPU copy; keep it in host memory (--graph unified)")
    return graph.to(device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def correct_count(logits, y):
    """How many labelled nodes (``y >= 0``) have their label as top logit, as a tensor on
    ``y``'s device: no boolean-mask index, whose size would make the host wait for the batch."""
    return ((logits.argmax(1) == y) & (y >= 0)).sum()


def evaluate(model, loader, device, show: bool, desc: str, ctx=None) -> float:
    """Accuracy over the loader's seeds (sampled or full-neighbourhood inference); with a
    distributed context ``ctx``, over the seeds of every rank."""
    from ..graph._progress import progress
    model.eval()
    correct = total = 0
    with progress(len(loader), desc, show) as bar:
        for b in loader:
            correct += correct_count(model(b.x, b.adjs), b.y)   # on the device: no wait per batch
            total += (b.y >= 0).sum()
            bar.update(1)
    correct, total = int(correct), int(total)
    if ctx is not None:
        correct, total = ctx.all_sum([correct, total])
    return correct / total if total else float("nan")


@torch.no_grad()
def layerwise_inference(model: GNN, graph, store, device, chunk: int = 65536, show: bool = False,
                        targets=None):
    """Full-neighbourhood inference layer by layer (as SALIENT and PyG do it): layer ``i`` runs
    for every node over all of its neighbours, reading layer ``i - 1``'s outputs, kept on
    the CPU. Costs one pass over the graph per layer instead of an L-hop neighbourhood per
    batch. ``graph`` is on the CPU or unified; returns the logits of every node (CPU).

    ``targets`` (node ids): only their logits are wanted. Each layer then runs for the nodes
    the next layer reads (the targets, their neighbours, theirs, ... back to the first layer),
    and the result has one row per target in ``targets``' order. The same numbers, with memory
    for those nodes only: on papers100M-like every node's hidden layer would take ~100 GB."""
    from ..graph import NeighborSampler
    from ..graph._progress import progress
    model.eval()
    hop = NeighborSampler(graph, [-1])
    n = graph.num_nodes
    num_layers = len(model.layers)
    if targets is None:
        needed = [torch.arange(n)] * (num_layers + 1)
    else:
        targets = torch.as_tensor(targets).long().reshape(-1)
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= n):
            raise IndexError(f"layerwise_inference: targets must be node ids in [0, {n})")
        # needed[i]: nodes whose layer-i input is read (needed[0]: feature rows).
        if targets.numel() == 0:
            return torch.empty(0, 0)
        needed = [None] * (num_layers + 1)
        needed[num_layers] = targets.unique()
        for i in range(num_layers, 0, -1):
            mark = torch.zeros(n, dtype=torch.bool)
            mark[needed[i]] = True
            for start in range(0, needed[i].numel(), chunk):
                mark[hop.sample(needed[i][start:start + chunk]).n_id] = True
            needed[i - 1] = mark.nonzero().reshape(-1)
    h, pos = None, None   # previous layer's outputs, and each node's row in them
    last = num_layers - 1
    work = sum(needed[i + 1].numel() for i in range(num_layers))
    with progress(work, "full inference", show) as bar:
        for i, layer in enumerate(model.layers):
            rows = needed[i + 1]
            out = None
            for start in range(0, rows.numel(), chunk):
                ids = rows[start:start + chunk]
                sb = hop.sample(ids)
                xin = store.gather(sb.n_id, device) if h is None else h[pos[sb.n_id]].to(device)
                edge_index, _, size = sb.adjs[0]
                with model.autocast(device):
                    o = layer(xin, edge_index.to(device), size)
                if i < last:
                    o = F.relu(o)
                if out is None:
                    out = torch.empty(rows.numel(), o.size(1), dtype=o.dtype)
                out[start:start + ids.numel()] = o.cpu()
                bar.update(ids.numel())
            h = out
            pos = torch.full((n,), -1, dtype=torch.long)
            pos[rows] = torch.arange(rows.numel())
    return h if targets is None else h[pos[targets]]


def test_ids(ds, limit: int = 0, seed: int = 0) -> torch.Tensor:
    """The test nodes accuracy is reported over: the test split, or ``limit`` of them (when
    fewer than the split) drawn by a generator seeded with ``seed``, in the split's order."""
    test = ds.split["test"]
    if limit and limit < test.numel():
        pick = torch.randperm(test.numel(), generator=torch.Generator().manual_seed(seed))[:limit]
        test = test[pick.sort().values]
    return test


def full_test_accuracy(model, ds, store, device, show: bool, ctx=None, test=None) -> float:
    """Test accuracy with full neighbourhoods (layer-wise inference for the test nodes, default
    the whole test split); with a distributed context ``ctx``, each rank infers its share of
    the test nodes and the counts are summed."""
    test = ds.split["test"] if test is None else test
    if ctx is not None:
        test = test[ctx.rank::ctx.world]
    correct = total = 0
    if test.numel():
        logits = layerwise_inference(model, ds.graph, store, device, show=show, targets=test)
        y = ds.y[test]
        correct, total = int(correct_count(logits, y)), int((y >= 0).sum())
    if ctx is not None:
        correct, total = ctx.all_sum([correct, total])
    return correct / total if total else float("nan")


def load_for_run(args, show: bool):
    """The data set of a run, relabelled when ``--reorder`` asks; (dataset, seconds spent reordering)."""
    from ..graph import load_dataset
    ds = load_dataset(args.dataset, root=args.root, seed=args.data_seed, show_progress=show)
    reorder_s = 0.0
    if args.reorder != "none":
        from ..graph import reorder
        t0 = time.perf_counter()
        ds, _ = reorder(ds, args.reorder)   # results stay per node: accuracies need no mapping back
        reorder_s = time.perf_counter() - t0
    return ds, reorder_s


def check_machine(args, device) -> None:
    """Refuse the options that cannot take effect on ``device`` (one line each):
    they act on GPU memory or GPU kernels, and a run on the CPU would ignore them.
    (``--pipeline gpu_resident`` runs on the CPU too: the device's memory is then host memory.)"""
    if device.type == "cuda":
        return
    where = "with --device cpu" if str(getattr(args, "device", "")) == "cpu" else "without a usable CUDA GPU"
    for option, value, what in (("--cache-mb", args.cache_mb, "caches rows in GPU memory"),
                                ("--gather-sms", args.gather_sms, "caps the GPU gather kernel's SMs"),
                                ("--gather-cpu-threads", args.gather_cpu_threads,
                                 "adds CPU threads to the GPU gather")):
        if value:
            raise ValueError(f"{option} {what}: it has no effect {where}")


def check_paths(args) -> None:
    """Refuse, before any data is made or loaded, a path the run could not use:
    ``--json``/``--profile``/``--plot`` that cannot be written or name a format
    the run does not write, a ``--root`` that is not a folder."""
    from .._io import check_writable
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


def run(args) -> dict:
    """Train as ``args`` (the parsed options) say; print per-epoch lines; return the record.
    Under torchrun with several processes: one rank per GPU (``pipeline/distributed.py``)."""
    from . import distributed
    check_paths(args)
    if not distributed.requested():
        return _run(args, None)
    ctx = distributed.init(args.device)
    try:
        record = _run(args, ctx)
    except BaseException as e:
        instead = distributed.report_stop(ctx, e)
        if instead is not None:
            raise instead from e
        raise
    ctx.close()
    return record


def _run(args, ctx) -> dict:
    from ..graph import GPUNeighborSampler, NeighborSampler, access_frequency
    from ..graph._progress import progress
    from .distributed import fail_injected, host_pss_bytes, pinned_graph, shared_dataset
    from .features import make_feature_store
    from .loader import STAGES, PipelinedLoader

    main = ctx is None or ctx.main
    say = print if main else (lambda *a, **k: None)
    device = ctx.device if ctx is not None else _resolve_device(args.device)
    show = not args.no_progress and main
    eval_fanouts = args.eval_fanouts or [20] * len(args.fanouts)
    if len(eval_fanouts) != len(args.fanouts):
        raise ValueError(f"--eval-fanouts has {len(eval_fanouts)} entries, --fanouts {len(args.fanouts)}: "
                         f"one per layer in both")
    if not 0.0 <= args.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {args.dropout}")
    graph_on_gpu = args.graph == "gpu"
    if args.sample_ahead and args.prefetch == 0:
        raise ValueError("--sample-ahead needs --prefetch > 0 (the sampling thread runs ahead of the loader's)")
    if args.cache_mb and args.pipeline != "unified":
        raise ValueError("--cache-mb applies to --pipeline unified only")
    if args.gather_sms and args.pipeline != "unified":
        raise ValueError("--gather-sms applies to --pipeline unified only (its zero-copy gather kernel)")
    if args.gather_cpu_threads and args.pipeline != "unified":
        raise ValueError("--gather-cpu-threads applies to --pipeline unified only (its hybrid gather)")
    if graph_on_gpu:
        if device.type != "cuda":
            raise ValueError("--graph gpu needs a CUDA device")
        if args.sampler == "cpu":
            raise ValueError("--graph gpu is read by the GPU sampler; --sampler cpu reads the CSR in host memory")
    check_machine(args, device)
    if args.pipeline == "gpu_resident" and device.type != "cuda":
        say("train: gpu_resident on the CPU keeps the features in host memory (no GPU here)", file=sys.stderr)
    check_precision(args.precision, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    if ctx is None:
        ds, reorder_s = load_for_run(args, show)
    else:  # one copy per node in shared memory, mapped by every rank of the node
        loaded = {}

        def load():
            loaded["ds"], loaded["reorder_s"] = load_for_run(args, show)
            return loaded["ds"]
        ds = shared_dataset(ctx, load)
        reorder_s = ctx.all_max([loaded.get("reorder_s", 0.0)])[0]
        loaded.clear()  # local rank 0 drops its private copy: the shared one is all that is left
    merge = args.merge_gathers or max(2, args.prefetch)
    use_gpu_sampler = args.sampler == "gpu" or (
        args.sampler == "auto" and device.type == "cuda" and (args.pipeline != "cpu_centric" or graph_on_gpu))
    if use_gpu_sampler and device.type != "cuda":
        raise ValueError("--sampler gpu needs a CUDA device")
    if use_gpu_sampler:
        if args.pipeline == "gpu_resident" or graph_on_gpu:
            graph = graph_to_gpu(ds.graph, device)
        elif ctx is not None:
            graph = pinned_graph(ds.graph)  # the node's shared pages, page-locked here: no copy
        else:
            graph = ds.graph.to("unified")
        make_sampler = lambda f, s: GPUNeighborSampler(graph, f, seed=s, device=device)  # noqa: E731
    else:
        graph = ds.graph
        pin = device.type == "cuda"   # the loader's copy of each batch to the GPU is then a DMA
        make_sampler = lambda f, s: NeighborSampler(graph, f, seed=s, pin_memory=pin)  # noqa: E731
    store = make_feature_store(args.pipeline, ds.x, device, torch.float32,
                               cache_bytes=args.cache_mb << 20,
                               # ranked by how often the sampler reads a row (its outermost
                               # hop reads the most rows), not by row length
                               degree=(access_frequency(ds.graph, args.fanouts[-1])
                                       if args.cache_mb and device.type == "cuda" else None),
                               pin_inplace=ctx is not None,
                               max_sms=args.gather_sms if device.type == "cuda" and args.gather_sms else None,
                               cpu_threads=args.gather_cpu_threads if device.type == "cuda" else 0)
    labels = ds.y.to(device) if device.type == "cuda" else ds.y
    gen = torch.Generator().manual_seed(args.seed)
    shard = None if ctx is None else (ctx.rank, ctx.world)
    # Sampling streams differ per rank (seed + rank * 7919); the seed permutation does not.
    sample_seed = args.seed if ctx is None else args.seed + 7919 * ctx.rank
    train_loader = PipelinedLoader(make_sampler(args.fanouts, sample_seed), store, ds.split["train"],
                                   args.batch_size, labels=labels, device=device, prefetch=args.prefetch,
                                   generator=gen, merge_gathers=merge, shard=shard,
                                   sample_ahead=args.sample_ahead, stream_priority=args.loader_priority)
    eval_loader = lambda ids, f, seed: PipelinedLoader(  # noqa: E731
        make_sampler(f, seed), store, ids, args.eval_batch_size, labels=labels, device=device,
        prefetch=args.prefetch, shuffle=False, merge_gathers=merge, shard=shard,
        sample_ahead=args.sample_ahead, stream_priority=args.loader_priority)
    use_pyg = use_pyg_for(args.layers)
    model = GNN(args.model, ds.num_features, args.hidden, ds.num_classes, len(args.fanouts),
                dropout=args.dropout, use_pyg=use_pyg, precision=args.precision).to(device)
    step_model = model
    if ctx is not None:
        from torch.nn.parallel import DistributedDataParallel
        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = make_optimizer(model, args.lr)
    record = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "device": str(device),
              "world_size": 1 if ctx is None else ctx.world,
              "dataset": repr(ds), "backend": model.backend,
              "sampler": "gpu" if use_gpu_sampler else "cpu", "graph": graph.device.type,
              "reorder": args.reorder, "reorder_s": reorder_s, "precision": args.precision,
              "loader_priority": args.loader_priority,
              "merge_gathers": merge, "epochs": []}
    say(f"train: {ds!r}\n  model {args.model} ({model.backend}), pipeline {args.pipeline}, device {device}, "
          f"sampler {record['sampler']} (CSR on {record['graph']}), fanouts {args.fanouts}, batch {args.batch_size}, hidden {args.hidden}"
          + (f", precision {args.precision}" if args.precision != "fp32" else "")
          + (f", loader streams at {args.loader_priority} priority" if args.loader_priority != "normal" else "")
          + (f", reorder {args.reorder} ({reorder_s:.2f} s)" if args.reorder != "none" else "")
        + (f", {merge} batches per gather" if merge > 1 else "")
        + (f"\n  {ctx.world} processes ({ctx.backend}), one host copy per node in shared memory"
           if ctx is not None else ""),
        flush=True)

    with model_precision(args.precision, device), train_loader, \
            eval_loader(ds.split["valid"], eval_fanouts, args.seed + 1) as valid_loader:
        for epoch in range(1, args.epochs + 1):
            if ctx is not None:
                fail_injected(ctx.rank, epoch)
            model.train()
            steps = _StepTimer(device)
            correct = seen = 0
            loss_sum = torch.zeros((), device=device)
            _sync(device)
            t0 = time.perf_counter()
            prof = (_StepProfiler(args.profile, device)
                    if epoch == 1 and main and args.profile else None)
            with progress(len(train_loader), f"epoch {epoch}", show) as bar:
                for i, b in enumerate(train_loader):
                    if prof is not None:
                        prof.step(i)
                    t = steps.start()
                    opt.zero_grad(set_to_none=True)
                    out = step_model(b.x, b.adjs)
                    loss = F.cross_entropy(out, b.y, ignore_index=-1)
                    loss.backward()
                    opt.step()
                    loss_sum += loss.detach() * b.batch_size
                    # On the device: a host wait here would hold the next step back.
                    correct += correct_count(out, b.y)
                    seen += b.batch_size
                    steps.stop(t)
                    bar.update(1)
            _sync(device)
            total = time.perf_counter() - t0
            if prof is not None:
                say(f"wrote {prof.finish()} ({prof.steps} profiled steps of epoch 1)", flush=True)
            st = train_loader.stats()
            train_s = steps.total()
            loss_total, correct, seen = float(loss_sum), float(correct), float(seen)
            if ctx is not None:  # the job's figures: sums over ranks, the slowest rank's times
                loss_total, correct, seen = ctx.all_sum([loss_total, correct, seen])
                total, train_s = ctx.all_max([total, train_s])
            train_acc = correct / seen if seen else float("nan")
            valid_acc = evaluate(model, valid_loader, device, show, "valid", ctx)
            # Exposed loader time: the epoch less its training steps (on a GPU the host runs ahead,
            # so its queue wait alone misses the stream waiting on a batch's event), split over
            # the stages in proportion to their busy time.
            exposed_total = max(st["wait"], total - train_s)
            busy_sum = sum(st["busy"].values())
            exposed = {k: (exposed_total * v / busy_sum if busy_sum else 0.0) for k, v in st["busy"].items()}
            rec = {"epoch": epoch, "total_s": total, "train_step_s": train_s, "loader_wait_s": st["wait"],
                   "exposed_s": exposed, "busy_s": st["busy"], "batches": st["batches"],
                   "loss": loss_total / seen if seen else float("nan"),
                   "train_acc": train_acc, "valid_acc": valid_acc}
            record["epochs"].append(rec)
            stages = " ".join(f"{k} {exposed[k]:.3f}" for k in STAGES)
            say(f"epoch {epoch:3d}  total {total:7.3f} s  exposed: {stages}  train-step {train_s:.3f} s  "
                  f"loss {rec['loss']:.4f}  train acc {train_acc:.4f}  valid acc {valid_acc:.4f}", flush=True)

    test = test_ids(ds, args.test_nodes, args.data_seed)
    record["test_nodes"] = test.numel()
    with model_precision(args.precision, device):
        with eval_loader(test, eval_fanouts, args.seed + 2) as test_loader:
            record["test_acc"] = evaluate(model, test_loader, device, show, "test", ctx)
        line = f"test acc {record['test_acc']:.4f} (sampled, fanouts {eval_fanouts}, {test.numel()} nodes)"
        if args.full_eval:
            record["test_acc_full"] = full_test_accuracy(model, ds, store, device, show, ctx, test)
            line += f", {record['test_acc_full']:.4f} (full neighbourhoods)"
    record["feature_store"] = store.stats()
    say(line, flush=True)
    pss = float(host_pss_bytes())
    procs = 1 if ctx is None else ctx.world
    if ctx is not None:
        pss = ctx.all_sum([pss])[0]
    record["host_pss_gb"] = pss / 1e9
    g = ds.graph
    record["data_gb"] = sum(t.nbytes for t in (ds.x, ds.y, g.rowptr, g.col, g.edge_ids) if t is not None) / 1e9
    say(f"host memory: {pss / 2**30:.2f} GiB (PSS over {procs} process{'es' if procs > 1 else ''}; the data set "
        f"itself {record['data_gb'] * 1e9 / 2**30:.2f} GiB)", flush=True)
    if not main:
        return record
    if args.json:
        from .._io import write_json
        path = Path(args.json)
        write_json(path, record)
        print(f"wrote {path}")
    if args.plot:
        from .plot import write_plot
        print(f"wrote {write_plot(record, args.plot)}")
    return record


def main(args) -> int:
    """Entry point of the ``train`` subcommand: clear messages for bad input, exit codes."""
    try:
        run(args)
    except (ValueError, RuntimeError, TypeError, FileNotFoundError) as e:
        where = f" (rank {os.environ['RANK']})" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"train: error{where}: {e}", file=sys.stderr)
        return 2
    return 0
