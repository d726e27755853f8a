"""The ``pyg`` pipeline: training as a PyG user writes it, run by the same training loop as
every other pipeline (``python -m torch_direct train --pipeline pyg``, and the ``pyg`` row of
``python -m torch_direct.gnn.bench train``).

    rec = pyg_baseline.run(args)        # args: the options of ``python -m torch_direct train``

``torch_geometric.loader.NeighborLoader`` over a ``torch_geometric.data.Data(x, edge_index, y)``
held on the CPU (``edge_index`` built from the CSR: row 0 the source ``col``, row 1 the node
whose row lists it, so messages flow as in our samplers), ``num_neighbors=fanouts``,
``batch_size``, ``shuffle=True``, ``num_workers`` (``--pyg-workers``; persistent, so workers are
not re-forked each epoch), ``pin_memory`` on CUDA; each batch's tensors are moved with
``.to(device)``. :class:`PyGBatches` gives that loader the shape of a batch source
(``pipeline/batches.py``), so model (``models.GNN``, the layers ``--layers`` picks: PyG's
convs by default), optimizer (Adam, ``--lr``), epochs, seed, loss and accuracy bookkeeping are
the training loop's own; valid and test accuracy by sampled inference through a NeighborLoader
with ``--eval-fanouts`` (default 20 per layer), ``--full-eval`` by
``evaluation.layerwise_inference``.

The model math: PyG returns one subgraph per batch with nodes in hop order (the
``batch_size`` seeds first, then each hop's new nodes) and edges in hop order, and (pyg-lib
after 0.1) ``num_sampled_nodes`` / ``num_sampled_edges`` per hop. :func:`batch_to_adjs` cuts
that into the bipartite blocks ``models.GNN`` takes, as PyG's ``trim_to_layer`` does: layer
``i`` of ``L`` reads the nodes of hops ``0..L-i`` and writes those of hops ``0..L-i-1``, over
the edges of hops ``1..L-i`` (they are a prefix of ``edge_index``, and their targets a prefix
of the nodes). That is exactly the per-batch computation of the other pipelines, whose
samplers emit the same hop-ordered blocks. Without the per-hop counts (torch-sparse's
sampler) every layer runs on the whole subgraph and the first ``batch_size`` rows are kept,
the textbook PyG loop: the seeds' outputs are the same (a node's layer-``k`` value only
depends on edges of later hops), but the inner layers do more work; the record's
``block_mode`` says which ran.

Timing is the training loop's: an epoch's total is wall clock with CUDA synchronised at both
ends, the training steps are timed by CUDA events (perf_counter on a CPU), and the exposed time
(the epoch less its steps) is split over the stages by their busy time. The stages' busy
times here: ``sample`` = the host's wait on the loader's next batch (sampling and the feature
slicing both happen in the loader workers), ``gather`` = 0 (part of that wait), ``transfer`` =
the ``.to(device)`` of the batch (CUDA events around the copies).
"""

from __future__ import annotations

import argparse
import time

import torch

from .stages import STAGES, Batch
from .models import have_pyg
from .timing import Timer

PYG_MISSING = "torch_geometric is not installed (pip install torch_geometric)"
SAMPLER_MISSING = "PyG's NeighborLoader needs pyg-lib or torch-sparse, not installed"


def unavailable() -> str | None:
    """Why the PyG pipeline cannot run here, or None when it can."""
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


class PyGLoader:
    """A NeighborLoader's batches as :class:`~torch_direct.gnn.pipeline.loader.Batch` es on
    ``device``, with the loader's ``stats()``: ``wait`` (seconds the loop waited on the
    NeighborLoader) and ``busy`` per stage (``sample`` = that wait, ``gather`` = 0,
    ``transfer`` = the ``.to(device)`` of the batches)."""

    def __init__(self, loader, device, num_layers: int):
        self.loader, self.device, self.num_layers = loader, device, num_layers
        self.cuda = device.type == "cuda"
        self.block_mode = None
        self._stats = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        moves = Timer(self.cuda)
        wait = 0.0
        batches = 0
        it = iter(self.loader)
        try:
            while True:
                tw = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    wait += time.perf_counter() - tw
                    break
                wait += time.perf_counter() - tw
                t = moves.start()
                n = int(batch.batch_size)
                x = batch.x.to(device=self.device, dtype=torch.float32, non_blocking=self.cuda)
                edge_index = batch.edge_index.to(self.device, non_blocking=self.cuda)
                y = batch.y[:n].to(self.device, non_blocking=self.cuda)
                moves.stop("transfer", t)
                adjs, self.block_mode = _adjs_of(batch, edge_index, self.num_layers)
                batches += 1
                yield Batch(x, y, adjs, n, batch.n_id)
        finally:
            busy = dict.fromkeys(STAGES, 0.0)
            busy["sample"], busy["transfer"] = wait, moves.totals().get("transfer", 0.0)
            self._stats = {"batches": batches, "wait": wait, "busy": busy}

    def stats(self) -> dict:
        return dict(self._stats) if self._stats else {"batches": 0, "wait": 0.0, "busy": dict.fromkeys(STAGES, 0.0)}

    def __enter__(self) -> "PyGLoader":
        return self

    def __exit__(self, *exc) -> None:
        pass


class PyGBatches:
    """The batch source of ``--pipeline pyg`` (see ``pipeline/batches.py``): PyG's
    NeighborLoader over a ``Data(x, edge_index, y)`` on the CPU. ``make_loader`` replaces
    :func:`neighbor_loader` (tests)."""

    def __init__(self, args, ds, device, ctx=None, say=print, make_loader=None):
        if ctx is not None:
            raise ValueError("--pipeline pyg runs in one process: PyG's NeighborLoader has no host copy to share")
        make_loader = make_loader or neighbor_loader
        from torch_geometric.data import Data
        self.data = Data(x=ds.x, edge_index=ds.graph.cpu().to_edge_index(), y=ds.y, num_nodes=ds.num_nodes)
        cuda = device.type == "cuda"
        workers = getattr(args, "pyg_workers", 0)
        self._kw = {"num_workers": workers, "pin_memory": cuda}
        self._make, self._device, self._layers = make_loader, device, len(args.fanouts)
        self._args, self._ds = args, ds
        self._eval_batch = args.eval_batch_size
        self.train = PyGLoader(make_loader(self.data, ds.split["train"], args.fanouts, args.batch_size, shuffle=True,
                                           generator=torch.Generator().manual_seed(args.seed), **self._kw),
                               device, self._layers)
        self.store = None   # PyG's loader slices the features itself
        self.info = {"sampler": "pyg", "graph": "cpu", "loader": "NeighborLoader", "num_workers": workers,
                     "pin_memory": cuda, "block_mode": None, "merge_gathers": 1}

    def evaluation(self, ids, fanouts, seed):
        return PyGLoader(self._make(self.data, ids, fanouts, self._eval_batch, shuffle=False, **self._kw),
                         self._device, self._layers)

    def full_eval_store(self):
        from .features import make_feature_store
        return make_feature_store("cpu_centric", self._ds.x, self._device, torch.float32)

    def describe(self, model_text: str, reorder_text: str = "") -> str:
        a = self._args
        return (f"  model {model_text}, pipeline pyg (NeighborLoader), device {self._device}, "
                f"workers {self.info['num_workers']}, fanouts {a.fanouts}, batch {a.batch_size}, hidden {a.hidden}"
                + (f", precision {a.precision}" if a.precision != "fp32" else "") + reorder_text)

    def finish(self) -> list[str]:
        """The block mode the batches had, and a note when every layer ran on the whole subgraph."""
        self.info["block_mode"] = self.train.block_mode
        if self.train.block_mode == "full":
            return ["pyg: the sampler gave no per-hop counts: every layer ran on the whole subgraph"]
        return []


def run(args, make_loader=None) -> dict:
    """Train as ``args`` say with PyG's loader, through the training loop every pipeline uses;
    return its record. ``make_loader`` replaces :func:`neighbor_loader` (tests)."""
    if make_loader is None:
        reason = unavailable()
        if reason:
            raise ImportError(reason)
    elif not have_pyg():
        raise ImportError(PYG_MISSING)
    from . import train
    a = argparse.Namespace(**vars(args))
    a.pipeline = "pyg"
    return train.run(a, make_batches=lambda *p: PyGBatches(*p, make_loader=make_loader))
