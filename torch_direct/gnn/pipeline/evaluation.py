"""Accuracy of a trained model: sampled inference over any loader of batches, and
full-neighbourhood inference layer by layer (as SALIENT and PyG do it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..graph import NeighborSampler
from ..progress import progress


@torch.no_grad()
def correct_count(logits, y):
    """How many labelled nodes (``y >= 0``) have their label as top logit, as a tensor on
    ``y``'s device: no boolean-mask index, whose size would make the host wait for the batch."""
    return ((logits.argmax(1) == y) & (y >= 0)).sum()


@torch.no_grad()
def evaluate(model, loader, show: bool, desc: str, ctx=None) -> float:
    """Accuracy over the loader's seeds (sampled or full-neighbourhood inference); with a
    distributed context ``ctx``, over the seeds of every rank."""
    model.eval()
    correct = total = 0
    with progress(len(loader), desc, show) as bar:
        for b in loader:
            # the seeds' rows (a loader may run every layer on the whole subgraph), counted on
            # the device: no host wait per batch
            correct += correct_count(model(b.x, b.adjs)[:b.batch_size], b.y)
            total += (b.y >= 0).sum()
            bar.update(1)
    correct, total = int(correct), int(total)
    if ctx is not None:
        correct, total = ctx.all_sum([correct, total])
    return correct / total if total else float("nan")


@torch.no_grad()
def layerwise_inference(model, graph, store, device, chunk: int = 65536, show: bool = False,
                        targets=None):
    """Full-neighbourhood inference layer by layer (as SALIENT and PyG do it): layer ``i`` runs
    for every node over all of its neighbours, reading layer ``i - 1``'s outputs, kept on
    the CPU. Costs one pass over the graph per layer instead of an L-hop neighbourhood per
    batch. ``graph`` is on the CPU or unified; returns the logits of every node (CPU).

    ``targets`` (node ids): only their logits are wanted. Each layer then runs for the nodes
    the next layer reads (the targets, their neighbours, theirs, ... back to the first layer),
    and the result has one row per target in ``targets``' order. The same numbers, with memory
    for those nodes only: on papers100M-like every node's hidden layer would take ~100 GB."""
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
