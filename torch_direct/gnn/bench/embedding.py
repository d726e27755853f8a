"""embedding: GraphSAGE over a learned node embedding, its table in unified memory, on the GPU or on the CPU.

    python -m torch_direct.gnn.bench embedding --dataset products-like --epochs 2 --dim 128 \\
        --out results/embedding_products-like.json --plot embedding.svg

Trains GraphSAGE (hidden 256, fanouts 15,10,5, batch 1024) whose input is a learned embedding
of --dim columns per node, not the data set's features (labels and splits are used). The table
starts from one CPU table drawn from --seed; only the rows a batch touched are updated
(torch.optim.SparseAdam); the model's other parameters are on the compute device (Adam). Three
variants, with the same initial table, model, seeds and batches:

  unified        nn.Embedding(sparse=True).to("unified"): the table in pinned host memory, read
                 in place by the compute device; its sparse gradient is a unified tensor and
                 SparseAdam updates the touched rows in place
  gpu            the same nn.Embedding on the compute device, SparseAdam there
  cpu_optimizer  the table as a CPU tensor (pinned with CUDA), as DGL's NodeEmbedding keeps it:
                 each batch's rows are gathered on the CPU and copied to the device as a leaf;
                 their gradient is copied back and a CPU SparseAdam applies it

Neighbours are sampled on the CPU. Per variant: the epoch time (median over the epochs after
the first, which warms up, or the one epoch with --epochs 1) and its split (CUDA synchronised
around each part): sample (with the blocks' copy to the device); embedding_read, the batch's
rows from the table (for cpu_optimizer the CPU gather and the copy to the device);
forward_backward, the model's, down to the rows' gradient; gradient_write, that gradient into
the table's sparse .grad (for unified into unified memory, for cpu_optimizer copied back to the
CPU); embedding_step, the table's optimizer (its state and the update of the touched rows); and
model_step, the model's. The losses; valid and test accuracy by sampled inference (the training
fanouts) over a fixed random --eval-nodes of each split. Prints a markdown table, the ratios
unified_vs_cpu_optimizer (cpu_optimizer epoch / unified epoch; target on a GPU: >= 2) and
gpu_vs_unified (unified epoch / gpu epoch) and the accuracy spread over the variants; writes
the JSON record after each variant. A variant that fails is recorded with its error, the
others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import re
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .common import check_writable, default_out, machine_record, print_markdown, run_and_report, track, write_json
from ..pipeline.options import fanout_list, nonneg_int, positive, resolve_device
from ..pipeline.timing import Timer, sync

VARIANTS = ("unified", "gpu", "cpu_optimizer")
RATIOS = {"unified_vs_cpu_optimizer": ("cpu_optimizer", "unified"), "gpu_vs_unified": ("unified", "gpu")}
TARGET = ("unified_vs_cpu_optimizer", 2.0)     # on a GPU
SPLIT = ("sample", "embedding_read", "forward_backward", "gradient_write", "embedding_step", "model_step")


def parse_variants(text: str) -> list[str]:
    """The names of a ``--variants`` list, in order, each once (argparse's error otherwise)."""
    wanted = []
    for name in (v.strip() for v in text.split(",")):
        if name and name not in wanted:
            wanted.append(name)
    bad = [v for v in wanted if v not in VARIANTS]
    if bad or not wanted:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad)) if bad else 'empty list'}; "
                                         f"choose from {', '.join(VARIANTS)}")
    return wanted


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..pipeline.models import LAYERS
    ap.add_argument("--dataset", default="products-like",
                    help="a preset (tiny, arxiv-like, products-like, papers100M-like; generated once and cached) "
                         "or an OGB name read from --root (default: %(default)s)")
    ap.add_argument("--root", default=None,
                    help="data set directory (default: $TORCH_DIRECT_DATA or ~/.cache/torch_direct/datasets)")
    ap.add_argument("--variants", type=parse_variants, default=list(VARIANTS),
                    help=f"variants to run, comma-separated, from {','.join(VARIANTS)} (default: all)")
    ap.add_argument("--epochs", type=positive(int), default=2,
                    help="training epochs per variant (default: %(default)s)")
    ap.add_argument("--dim", type=positive(int), default=128, help="embedding width (default: %(default)s)")
    ap.add_argument("--hidden", type=positive(int), default=256, help="hidden width (default: %(default)s)")
    ap.add_argument("--layers", choices=LAYERS, default="auto",
                    help="GraphSAGE layers: PyG's (pyg), the plain-torch ones (builtin) or PyG's when "
                         "installed (auto) (default: %(default)s)")
    ap.add_argument("--batch-size", type=positive(int), default=1024,
                    help="seed nodes per batch (default: %(default)s)")
    ap.add_argument("--fanouts", type=fanout_list, default=[15, 10, 5],
                    help="neighbours sampled per node at each hop, comma-separated, one per layer; also "
                         "those of inference (default: 15,10,5)")
    ap.add_argument("--lr", type=positive(float), default=3e-3,
                    help="learning rate of both optimizers (default: %(default)s)")
    ap.add_argument("--max-batches", type=positive(int), default=None,
                    help="train on at most this many batches per epoch, for quick runs (default: all)")
    ap.add_argument("--eval-nodes", type=nonneg_int, default=10000,
                    help="valid and test accuracy over this many nodes of each split, a fixed random subset; "
                         "0 = the whole split (default: %(default)s)")
    ap.add_argument("--device", default="auto",
                    help="compute device: auto (cuda when a usable GPU is present, else cpu), cpu, cuda[:k] "
                         "(default: %(default)s)")
    ap.add_argument("--seed", type=nonneg_int, default=0,
                    help="seed of the initial table, the model, shuffling, sampling and dropout (default: %(default)s)")
    ap.add_argument("--threads", type=positive(int), default=None,
                    help="CPU threads of torch ops and the sampler (default: torch's, usually one per core)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON record (default: embedding_<dataset>.json in the user's cache, "
                         "~/.cache/torch_direct/results)")
    ap.add_argument("--plot", default=None,
                    help="also draw a bar chart of the epoch time per variant, sampling stacked under the rest "
                         "(the train benchmark's chart), to PATH (.svg; .png with matplotlib)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")


def out_path(args) -> Path:
    if args.out:
        return Path(args.out)
    return default_out(f"embedding_{re.sub(r'[^A-Za-z0-9_.-]', '_', str(args.dataset))}")


def initial_table(num_nodes: int, dim: int, seed: int) -> torch.Tensor:
    """The table every variant starts from: N(0, 1) entries (nn.Embedding's init), on the CPU."""
    return torch.randn(num_nodes, dim, generator=torch.Generator().manual_seed(seed))


class EmbeddingTable:
    """``unified`` and ``gpu``: an ``nn.Embedding(sparse=True)`` at ``where``, looked up with
    ids on the compute device, updated by SparseAdam wherever the table is."""

    def __init__(self, init: torch.Tensor, where, lr: float):
        self.emb = nn.Embedding.from_pretrained(init.clone(), freeze=False, sparse=True).to(where)
        self.weight = self.emb.weight
        self.opt = torch.optim.SparseAdam([self.weight], lr=lr)

    def rows(self, n_id: torch.Tensor, n_id_dev: torch.Tensor) -> torch.Tensor:
        return self.emb(n_id_dev)

    def write_grad(self, rows: torch.Tensor, grad: torch.Tensor) -> None:
        rows.backward(grad)      # the embedding's backward: a sparse .grad where the table is

    def step(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class HostTable:
    """``cpu_optimizer``: the table on the CPU; rows gathered there and copied to the device as a
    leaf, their gradient copied back and applied by a CPU SparseAdam."""

    def __init__(self, init: torch.Tensor, device: torch.device, lr: float):
        self.device = device
        self.weight = nn.Parameter(init.pin_memory() if device.type == "cuda" else init.clone())
        self.opt = torch.optim.SparseAdam([self.weight], lr=lr)
        self._n_id = self._rows = None

    def rows(self, n_id: torch.Tensor, n_id_dev: torch.Tensor) -> torch.Tensor:
        self._n_id = n_id
        return self.weight.detach().index_select(0, n_id).to(self.device)

    def write_grad(self, rows: torch.Tensor, grad: torch.Tensor) -> None:
        self.weight.grad = torch.sparse_coo_tensor(self._n_id[None], grad.to("cpu"), self.weight.shape,
                                                   check_invariants=False)

    def step(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._n_id = None


def make_table(name: str, init: torch.Tensor, device: torch.device, lr: float):
    if name == "cpu_optimizer":
        return HostTable(init, device, lr)
    return EmbeddingTable(init, "unified" if name == "unified" else device, lr)


@dataclass
class Trained:
    """What :func:`train_variant` leaves: the variant's row of the record, its table (the
    embedding weight, where the variant keeps it) and which nodes any training batch touched."""

    row: dict
    table: torch.Tensor
    touched: torch.Tensor


def _to_device(sb, labels: torch.Tensor, device: torch.device):
    nb = device.type == "cuda"
    return (sb.n_id.to(device, non_blocking=nb), [b.to(device, non_blocking=nb) for b in sb.adjs],
            labels[sb.n_id[:sb.batch_size]].to(device, non_blocking=nb))


@torch.no_grad()
def accuracy(model, table, ds, split: str, args, device, seed: int) -> float:
    """Sampled inference (the training fanouts) over ``--eval-nodes`` of ``split``, a random
    subset fixed by ``--seed``: the fraction labelled right."""
    from ..graph import NeighborSampler
    from ..pipeline.evaluation import correct_count
    ids = ds.split[split]
    if args.eval_nodes and args.eval_nodes < ids.numel():
        pick = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(args.seed))
        ids = ids[pick[:args.eval_nodes].sort().values]
    model.eval()
    correct = total = 0
    for sb in NeighborSampler(ds.graph, args.fanouts, seed=seed).loader(ids, args.batch_size, shuffle=False):
        n_id_dev, adjs, y = _to_device(sb, ds.y, device)
        correct += int(correct_count(model(table.rows(sb.n_id, n_id_dev), adjs)[:sb.batch_size], y))
        total += int((y >= 0).sum())
    return correct / total if total else float("nan")


@contextlib.contextmanager
def _timed(timer: Timer, key: str, device: torch.device):
    """Time the block as ``key`` on the host clock, once ``device`` has finished its work."""
    t = timer.start()
    yield
    sync(device)
    timer.stop(key, t)


def train_variant(name: str, ds, init: torch.Tensor, args, device: torch.device) -> Trained:
    """Train variant ``name`` on data set ``ds`` from table ``init`` as ``args`` say."""
    from ..graph import NeighborSampler
    from ..graph.sampler import seed_batches
    from ..pipeline.models import GNN, make_optimizer, use_pyg_for
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    table = make_table(name, init, device, args.lr)
    model = GNN("sage", init.size(1), args.hidden, ds.num_classes, len(args.fanouts),
                use_pyg=use_pyg_for(args.layers)).to(device)
    opt = make_optimizer(model, args.lr)
    sampler = NeighborSampler(ds.graph, args.fanouts, seed=args.seed, pin_memory=cuda)
    order = torch.Generator().manual_seed(args.seed)
    touched = torch.zeros(ds.num_nodes, dtype=torch.bool)
    epochs = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        timer = Timer(False, SPLIT)
        seeds = seed_batches(ds.split["train"], args.batch_size, generator=order)[:args.max_batches]
        group = max(1, torch.get_num_threads())      # batches sampled at once, one per thread
        loss_sum, seen = torch.zeros((), device=device), 0
        sync(device)
        t0 = time.perf_counter()
        for first in track(range(0, len(seeds), group), -(-len(seeds) // group), f"{name} epoch {epoch}",
                           not args.no_progress):
            with _timed(timer, "sample", device):
                sampled = sampler.sample_batches(seeds[first:first + group])
            for sb in sampled:
                with _timed(timer, "sample", device):
                    n_id_dev, adjs, y = _to_device(sb, ds.y, device)
                with _timed(timer, "embedding_read", device):
                    rows = table.rows(sb.n_id, n_id_dev)
                with _timed(timer, "forward_backward", device):
                    opt.zero_grad(set_to_none=True)
                    x = rows.detach().requires_grad_()     # the model's backward stops here
                    out = model(x, adjs)[:sb.batch_size]
                    loss = F.cross_entropy(out, y, ignore_index=-1)
                    loss.backward()
                with _timed(timer, "gradient_write", device):
                    table.write_grad(rows, x.grad)
                    del rows, x
                with _timed(timer, "embedding_step", device):
                    table.step()
                with _timed(timer, "model_step", device):
                    opt.step()
                loss_sum += loss.detach() * sb.batch_size
                seen += sb.batch_size
                touched[sb.n_id] = True
        sync(device)
        epochs.append({"epoch": epoch, "total_s": time.perf_counter() - t0, "split_s": timer.totals(),
                       "batches": len(seeds), "loss": float(loss_sum) / seen})
    timed_epochs = epochs[1:] if len(epochs) > 1 else epochs
    row = {"variant": name, "status": "ok", "device": str(device), "table_device": str(table.weight.device),
           "epoch_s": statistics.median(e["total_s"] for e in timed_epochs),
           "epoch_times_s": [e["total_s"] for e in epochs],
           "split_s": {k: statistics.median(e["split_s"][k] for e in timed_epochs) for k in SPLIT},
           "batches": epochs[-1]["batches"], "losses": [e["loss"] for e in epochs], "final_loss": epochs[-1]["loss"],
           "touched_rows": int(touched.sum()),
           "valid_acc": accuracy(model, table, ds, "valid", args, device, args.seed + 1),
           "test_acc": accuracy(model, table, ds, "test", args, device, args.seed + 2),
           "note": "" if name != "gpu" or cuda else "no GPU here: the table is on the CPU"}
    return Trained(row, table.weight.detach(), touched)


def add_summary(record: dict) -> None:
    """The record's headline ``ratios``, ``accuracy_spread`` and ``targets`` from its ok rows."""
    ran = {r["variant"]: r for r in record["rows"] if r["status"] == "ok" and r["epoch_s"] > 0}
    record["ratios"] = {k: ran[a]["epoch_s"] / ran[b]["epoch_s"] for k, (a, b) in RATIOS.items()
                        if a in ran and b in ran}
    record["accuracy_spread"] = {k: max(r[k] for r in ran.values()) - min(r[k] for r in ran.values())
                                 for k in ("valid_acc", "test_acc")} if len(ran) > 1 else {}
    # Where unified's epoch goes beyond the GPU-memory table's: per part, unified's seconds minus gpu's.
    record["unified_minus_gpu_s"] = ({k: ran["unified"]["split_s"][k] - ran["gpu"]["split_s"][k] for k in SPLIT}
                                     if "unified" in ran and "gpu" in ran else {})
    key, want = TARGET
    value = record["ratios"].get(key)
    record["targets"] = [{"name": f"{key} (the target is set on a GPU)", "value": value, "want": f">= {want}",
                          "met": value >= want}] if value is not None and record["device"].startswith("cuda") else []


def run_bench(args, path: Path | None, device: torch.device) -> dict:
    """Run each variant; the record (rewritten at ``path`` after each variant when given)."""
    from ..graph import load_dataset
    if args.threads:
        torch.set_num_threads(args.threads)
    record = {"benchmark": "embedding", "machine": machine_record(), "device": str(device),
              "torch_threads": torch.get_num_threads(),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
              "variants": args.variants, "rows": []}
    ds = load_dataset(args.dataset, root=args.root, show_progress=not args.no_progress)
    record["dataset"] = repr(ds)
    init = initial_table(ds.num_nodes, args.dim, args.seed)
    for name in args.variants:
        print(f"{name}: running", file=sys.stderr, flush=True)
        try:
            row = train_variant(name, ds, init, args, device).row
        except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
            row = {"variant": name, "status": "failed", "reason": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc(), "epoch_s": None}
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        record["rows"].append(row)
        add_summary(record)
        if path is not None:
            write_json(path, record)
        msg = f"epoch {row['epoch_s']:.3f} s" if row["status"] == "ok" else f"failed: {row['reason']}"
        print(f"{name}: {msg}", file=sys.stderr, flush=True)
    return record


def print_table(record: dict) -> None:
    a = record["args"]
    epochs = f"{a['epochs']} epoch" + ("s" if a["epochs"] > 1 else "")
    print(f"embedding: {a['dataset']}, GraphSAGE over a {a['dim']}-wide learned embedding, hidden {a['hidden']}, "
          f"fanouts {','.join(map(str, a['fanouts']))}, batch {a['batch_size']}, {epochs}"
          + (f" of at most {a['max_batches']} batches" if a.get("max_batches") else "")
          + f", device {record['device']}")
    rows = []
    for r in record["rows"]:
        if r["status"] != "ok":
            rows.append([r["variant"]] + ["-"] * 11 + [f"failed: {r['reason']}"])
            continue
        s = r["split_s"]
        unified = next((u for u in record["rows"] if u["variant"] == "unified" and u["status"] == "ok"), None)
        vs = f"{unified['epoch_s'] / r['epoch_s']:.2f}x" if unified and r["epoch_s"] > 0 else "-"
        rows.append([r["variant"], r["table_device"], f"{r['epoch_s']:.3f}", vs]
                    + [f"{s[k]:.3f}" for k in SPLIT]
                    + [f"{r['final_loss']:.4f}", f"{r['valid_acc']:.4f} / {r['test_acc']:.4f}", r["note"]])
    print_markdown(["variant", "table on", "epoch s", "vs unified", "sample s", "emb read s", "fwd+bwd s",
                    "grad write s", "emb step s", "model step s", "final loss", "valid / test acc", "note"], rows)
    print("(vs unified: unified's epoch time / the row's, above 1 = faster than unified)")
    for k, (num, den) in RATIOS.items():
        if k in record["ratios"]:
            print(f"{k}: {record['ratios'][k]:.2f}x ({num} epoch / {den} epoch)")
    gap = record.get("unified_minus_gpu_s")
    if gap:
        print("unified's epoch minus gpu's, per part: " + ", ".join(f"{k} {v:+.3f} s" for k, v in gap.items()))
    spread = record["accuracy_spread"]
    if spread:
        print(f"accuracy spread over the variants: valid {spread['valid_acc']:.4f}, test {spread['test_acc']:.4f}")
    for t in record["targets"]:
        print(f"target {t['name']}: {t['value']:.3f} (want {t['want']}) {'met' if t['met'] else 'MISSED'}")


def _plot(record: dict, path) -> Path:
    """The train benchmark's bar chart of the epoch time per variant, sampling stacked under the rest."""
    from ..pipeline.plot import write_bench_plot
    bars = {"args": {"dataset": record["args"]["dataset"], "model": f"sage, {record['args']['dim']}-wide embedding"},
            "device": record["device"],
            "rows": [{"pipeline": r["variant"], "status": r["status"], "epoch_s": r["epoch_s"],
                      "reason": r.get("reason"), "exposed_s": {"sample": r.get("split_s", {}).get("sample", 0.0)}}
                     for r in record["rows"]]}
    return write_bench_plot(bars, path)


def run(args) -> int:
    path = out_path(args)

    def start() -> dict:
        check_writable(path, "--out")
        if args.plot:
            from ..pipeline.plot import check_bench_plot_path
            check_bench_plot_path(args.plot)
            check_writable(args.plot, "--plot")
        root = Path(args.root).expanduser() if args.root is not None else None
        if root is not None and root.exists() and not root.is_dir():
            raise ValueError(f"--root: {root} is not a folder")
        from ..pipeline.models import use_pyg_for
        use_pyg_for(args.layers)
        device = resolve_device(None if args.device == "auto" else args.device)
        return run_bench(args, path, device)

    return run_and_report("embedding", path, start, print_table, args.plot, _plot)
