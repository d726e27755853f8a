"""The ``pyg`` pipeline of ``python -m torch_direct.bench train``: training as a PyG user writes it.

    rec = pyg_baseline.run(args)        # args: the options of ``python -m torch_direct train``

``torch_geometric.loader.NeighborLoader`` over a ``torch_geometric.data.Data(x, edge_index, y)``
held on the CPU (``edge_index`` built from the CSR: row 0 the source ``col``, row 1 the node
whose row lists it, so messages flow as in our samplers), ``num_neighbors=fanouts``,
``batch_size``, ``shuffle=True``, ``num_workers`` (``--pyg-workers``; persistent, so workers are
not re-forked each epoch), ``pin_memory`` on CUDA; each batch's tensors are moved with
``.to(device)``. Same model class (``train.GNN``, the layers ``--layers`` picks: PyG's convs by
default), optimizer (Adam, ``--lr``), epochs, seed, loss and accuracy bookkeeping as
``train.run``; valid and test accuracy by sampled inference through a NeighborLoader with
``--eval-fanouts`` (default 20 per layer), ``--full-eval`` by ``train.layerwise_inference``.

The model math: PyG returns one subgraph per batch with nodes in hop order (the
``batch_size`` seeds first, then each hop's new nodes) and edges in hop order, and (pyg-lib
after 0.1) ``num_sampled_nodes`` / ``num_sampled_edges`` per hop. :func:`batch_to_adjs` cuts
that into the bipartite blocks ``train.GNN`` takes, as PyG's ``trim_to_layer`` does: layer
``i`` of ``L`` reads the nodes of hops ``0..L-i`` and writes those of hops ``0..L-i-1``, over
the edges of hops ``1..L-i`` (they are a prefix of ``edge_index``, and their targets a prefix
of the nodes). That is exactly the per-batch computation of the other pipelines, whose
samplers emit the same hop-ordered blocks. Without the per-hop counts (torch-sparse's
sampler) every layer runs on the whole subgraph and the first ``batch_size`` rows are kept,
the textbook PyG loop: the seeds' outputs are the same (a node's layer-``k`` value only
depends on edges of later hops), but the inner layers do more work; the record's
``block_mode`` says which ran.

Timing as ``train.run``: an epoch's total is wall clock with CUDA synchronised at both ends;
the training steps are timed by CUDA events (perf_counter on a CPU). Exposed stage times:
``sample`` = the host's wait on the loader's next batch (sampling and the feature slicing
both happen in the loader workers), ``gather`` = 0 (part of that wait), ``transfer`` = the
``.to(device)`` of the batch (CUDA events around the copies).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

PYG_MISSING = "torch_geometric is not installed (pip install torch_geometric)"
SAMPLER_MISSING = "PyG's NeighborLoader needs pyg-lib or torch-sparse, not installed"


def unavailable() -> str | None:
    """Why the PyG pipeline cannot run here, or None when it can."""
    from .train import have_pyg
    if not have_pyg():
        return PYG_MISSING
    import torch_geometric.typing as t
    if not (getattr(t, "WITH_PYG_LIB", False) or getattr(t, "WITH_TORCH_SPARSE", False)):
        return SAMPLER_MISSING
    return None


def neighbor_loader(data, input_nodes, fanouts, batch_size, *, shuffle, num_workers, pin_memory,
                    generator=None):
    """PyG's NeighborLoader as a user sets it up. ImportError (with :data:`SAMPLER_MISSING`)
    when neither pyg-lib nor torch-sparse is installed."""
    reason = unavailable()
    if reason:
        raise ImportError(reason)
    from torch_geometric.loader import NeighborLoader
    kw = {"num_workers": num_workers, "pin_memory": pin_memory, "persistent_workers": num_workers > 0}
    if generator is not None:
        kw["generator"] = generator
    return NeighborLoader(data, num_neighbors=list(fanouts), input_nodes=input_nodes, batch_size=batch_size,
                          shuffle=shuffle, **kw)


def batch_to_adjs(num_nodes: int, batch_size: int, edge_index: torch.Tensor, num_layers: int,
                  num_sampled_nodes=None, num_sampled_edges=None):
    """``(adjs, mode)``: the blocks of a PyG sampled subgraph in model order, each
    ``(edge_index, None, (n_src, n_dst))``. ``mode`` "trimmed" when the per-hop counts are
    given (one block per hop, as the other pipelines), else "full" (the whole subgraph at every
    layer; keep the first ``batch_size`` output rows)."""
    if (num_sampled_nodes is not None and num_sampled_edges is not None
            and len(num_sampled_nodes) == num_layers + 1 and len(num_sampled_edges) == num_layers):
        nodes, edges = [0], [0]
        for v in num_sampled_nodes:
            nodes.append(nodes[-1] + int(v))
        for v in num_sampled_edges:
            edges.append(edges[-1] + int(v))
        # nodes[h + 1]: nodes of hops 0..h; edges[h]: edges of hops 1..h.
        adjs = []
        for i in range(num_layers):
            hops = num_layers - i
            adjs.append((edge_index[:, :edges[hops]], None, (nodes[hops + 1], nodes[hops])))
        return adjs, "trimmed"
    return [(edge_index, None, (num_nodes, num_nodes))] * num_layers, "full"


def _adjs_of(batch, edge_index, num_layers):
    return batch_to_adjs(int(batch.num_nodes), int(batch.batch_size), edge_index, num_layers,
                         getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None))


def _move(batch, device, non_blocking):
    x = batch.x.to(device=device, dtype=torch.float32, non_blocking=non_blocking)
    edge_index = batch.edge_index.to(device, non_blocking=non_blocking)
    y = batch.y[:int(batch.batch_size)].to(device, non_blocking=non_blocking)
    return x, edge_index, y


@torch.no_grad()
def evaluate(model, loader, device, num_layers, show: bool, desc: str) -> float:
    from ..graph._progress import progress
    from .train import correct_count
    model.eval()
    correct = total = 0
    with progress(len(loader), desc, show) as bar:
        for batch in loader:
            x, edge_index, y = _move(batch, device, False)
            adjs, _ = _adjs_of(batch, edge_index, num_layers)
            correct += correct_count(model(x, adjs)[:y.numel()], y)
            total += (y >= 0).sum()
            bar.update(1)
    correct, total = int(correct), int(total)
    return correct / total if total else float("nan")


def run(args, make_loader=None) -> dict:
    """Train as ``args`` say with PyG's loader; print per-epoch lines; return a record shaped as
    ``train.run``'s. ``make_loader`` replaces :func:`neighbor_loader` (tests)."""
    from ..graph._progress import progress
    from .train import (GNN, _StepTimer, _resolve_device, _sync, check_precision, correct_count,
                        full_test_accuracy, have_pyg, load_for_run, make_optimizer, model_precision, test_ids,
                        use_pyg_for)

    make_loader = make_loader or neighbor_loader
    if make_loader is neighbor_loader:
        reason = unavailable()
        if reason:
            raise ImportError(reason)
    elif not have_pyg():
        raise ImportError(PYG_MISSING)
    from torch_geometric.data import Data

    device = _resolve_device(args.device)
    show = not args.no_progress
    num_layers = len(args.fanouts)
    eval_fanouts = args.eval_fanouts or [20] * num_layers
    if len(eval_fanouts) != num_layers:
        raise ValueError(f"--eval-fanouts has {len(eval_fanouts)} entries, --fanouts {num_layers}: "
                         f"one per layer in both")
    if not 0.0 <= args.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {args.dropout}")
    precision = getattr(args, "precision", "fp32")
    check_precision(precision, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    ds, reorder_s = load_for_run(args, show)
    data = Data(x=ds.x, edge_index=ds.graph.cpu().to_edge_index(), y=ds.y, num_nodes=ds.num_nodes)
    cuda = device.type == "cuda"
    workers = getattr(args, "pyg_workers", 0)
    loader_kw = {"num_workers": workers, "pin_memory": cuda}
    train_loader = make_loader(data, ds.split["train"], args.fanouts, args.batch_size, shuffle=True,
                               generator=torch.Generator().manual_seed(args.seed), **loader_kw)
    valid_loader = make_loader(data, ds.split["valid"], eval_fanouts, args.eval_batch_size, shuffle=False,
                               **loader_kw)
    use_pyg = use_pyg_for(args.layers)
    model = GNN(args.model, ds.num_features, args.hidden, ds.num_classes, num_layers,
                dropout=args.dropout, use_pyg=use_pyg, precision=precision).to(device)
    opt = make_optimizer(model, args.lr)  # the same optimizer as train.run's
    record = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "device": str(device),
              "dataset": repr(ds), "backend": model.backend, "sampler": "pyg", "graph": "cpu", "loader": "NeighborLoader",
              "num_workers": workers, "pin_memory": cuda, "block_mode": None, "reorder": args.reorder,
              "reorder_s": reorder_s, "merge_gathers": 1, "precision": precision, "epochs": []}
    print(f"train (PyG NeighborLoader): {ds!r}\n  model {args.model} ({model.backend}), device {device}, "
          f"workers {workers}, fanouts {args.fanouts}, batch {args.batch_size}, hidden {args.hidden}", flush=True)

    with model_precision(precision, device):  # the same arithmetic as train.run's
        for epoch in range(1, args.epochs + 1):
            model.train()
            steps, moves = _StepTimer(device), _StepTimer(device)
            correct = seen = 0
            wait = 0.0
            loss_sum = torch.zeros((), device=device)
            _sync(device)
            t0 = time.perf_counter()
            with progress(len(train_loader), f"epoch {epoch}", show) as bar:
                tw = time.perf_counter()
                it = iter(train_loader)
                while True:
                    try:
                        batch = next(it)
                    except StopIteration:
                        wait += time.perf_counter() - tw
                        break
                    wait += time.perf_counter() - tw
                    t = moves.start()
                    x, edge_index, y = _move(batch, device, cuda)
                    moves.stop(t)
                    adjs, record["block_mode"] = _adjs_of(batch, edge_index, num_layers)
                    n = y.numel()
                    t = steps.start()
                    opt.zero_grad(set_to_none=True)
                    out = model(x, adjs)[:n]
                    loss = F.cross_entropy(out, y, ignore_index=-1)
                    loss.backward()
                    opt.step()
                    loss_sum += loss.detach() * n
                    correct += correct_count(out, y)
                    seen += n
                    steps.stop(t)
                    bar.update(1)
                    tw = time.perf_counter()
            _sync(device)
            total = time.perf_counter() - t0
            train_s, move_s = steps.total(), moves.total()
            train_acc = float(correct) / seen if seen else float("nan")
            valid_acc = evaluate(model, valid_loader, device, num_layers, show, "valid")
            exposed = {"sample": wait, "gather": 0.0, "transfer": move_s}
            rec = {"epoch": epoch, "total_s": total, "train_step_s": train_s, "loader_wait_s": wait,
                   "exposed_s": exposed, "batches": len(train_loader),
                   "loss": float(loss_sum) / seen if seen else float("nan"),
                   "train_acc": train_acc, "valid_acc": valid_acc}
            record["epochs"].append(rec)
            print(f"epoch {epoch:3d}  total {total:7.3f} s  exposed: loader wait {wait:.3f} transfer {move_s:.3f}  "
                  f"train-step {train_s:.3f} s  loss {rec['loss']:.4f}  train acc {train_acc:.4f}  "
                  f"valid acc {valid_acc:.4f}", flush=True)

        test = test_ids(ds, args.test_nodes, args.data_seed)
        record["test_nodes"] = test.numel()
        test_loader = make_loader(data, test, eval_fanouts, args.eval_batch_size, shuffle=False, **loader_kw)
        record["test_acc"] = evaluate(model, test_loader, device, num_layers, show, "test")
        line = f"test acc {record['test_acc']:.4f} (sampled, fanouts {eval_fanouts}, {test.numel()} nodes)"
        if args.full_eval:
            from .features import make_feature_store
            store = make_feature_store("cpu_centric", ds.x, device, torch.float32)
            record["test_acc_full"] = full_test_accuracy(model, ds, store, device, show, test=test)
            line += f", {record['test_acc_full']:.4f} (full neighbourhoods)"
    print(line, flush=True)
    if record["block_mode"] == "full":
        print("pyg: the sampler gave no per-hop counts: every layer ran on the whole subgraph",
              file=sys.stderr)
    return record
