"""Where a training run's batches come from: the sampler, the feature store and the loaders of
one pipeline. The training loop (``pipeline/train.py``) is the same for all of them; a source
gives it

- ``train``: an iterable of batches (``x``, ``adjs``, ``y``, ``batch_size``) with ``len``,
  entered as a context, whose ``stats()`` after an epoch gives ``wait`` (seconds the loop
  waited for a batch) and ``busy`` (seconds per loader stage);
- ``evaluation(ids, fanouts, seed)``: a loader of the same kind over ``ids`` in order;
- ``store``: the feature store full-neighbourhood inference reads (None: one is made for it
  by ``full_eval_store()``);
- ``info``: the fields the run's record gets, ``describe()``: the header line, and
  ``finish()``: notes after the run (``info`` may then have changed).

:class:`PipelinedBatches` is the unified, cpu_centric and gpu_resident pipelines (our samplers,
feature stores and :class:`~torch_direct.gnn.pipeline.loader.PipelinedLoader`);
``pipeline/pyg_baseline.py`` gives PyG's ``NeighborLoader`` the same shape.
"""

from __future__ import annotations

import sys
from functools import partial

import torch


def free_gpu_bytes(device) -> int:
    """Bytes this process can still allocate on the GPU ``device``: what the driver reports
    free, plus the segments torch's caching allocator holds with no tensor in them (an earlier
    run in the same process leaves them reserved; the driver counts them as taken, and the
    allocator gives them back when a larger allocation needs the room). Free blocks inside
    segments a tensor still uses (``inactive_split_bytes``) do not count: a large array cannot
    use them."""
    free, _ = torch.cuda.mem_get_info(device)
    split = torch.cuda.memory_stats(device).get("inactive_split_bytes.all.current", 0)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) - split
    return free + max(idle, 0)


def graph_to_gpu(graph, device):
    """``graph`` copied to the GPU ``device``, with a clear error, before any allocation, when
    its arrays would leave less than a quarter of the free GPU memory for training (the
    caching allocator's idle blocks count as free: :func:`free_gpu_bytes`)."""
    need = sum(t.numel() * t.element_size() for t in (graph.rowptr, graph.col, graph.edge_ids)
               if t is not None)
    free = free_gpu_bytes(device)
    if need > 0.75 * free:
        raise ValueError(f"the graph's CSR takes {need / 2**30:.2f} GiB, {device} has {free / 2**30:.2f} GiB free: "
                         f"too little left to train beside a GPU copy; keep it in host memory (--graph unified)")
    return graph.to(device)


_CONVERT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def feature_table(x: torch.Tensor, feature_dtype: str, where: str, say=print, show: bool = True):
    """``(table, scale)``: the feature table as ``--feature-dtype`` holds it. ``stored``: ``x``
    itself; ``fp32``/``fp16``/``bf16``: converted once; ``fp8``: float8 e4m3 rows with a float32
    scale each (``scale``; None otherwise); ``int4``: 4-bit integers two a byte (a ``uint8``
    table) with a float32 scale each. The quantized tables are made on ``where`` ("unified" or
    "cpu") a chunk at a time on the GPU when one is usable."""
    if feature_dtype == "stored":
        return x, None
    if feature_dtype in _CONVERT:
        return x.to(_CONVERT[feature_dtype]), None
    if feature_dtype not in ("fp8", "int4"):
        from .options import FEATURE_DTYPES
        raise ValueError(f"--feature-dtype: expected one of {', '.join(FEATURE_DTYPES)}, got {feature_dtype!r}")
    from ..progress import progress
    from torch_direct import quantize_rows_fp8, quantize_rows_int4
    quantize, what = ((quantize_rows_fp8, "float8 e4m3") if feature_dtype == "fp8"
                      else (quantize_rows_int4, "4-bit integers, two a byte,"))
    rows = x.shape[0]
    with progress(rows, f"features to {feature_dtype}", enabled=show and rows >= 1 << 20) as bar:
        done = [0]

        def advance(n):
            bar.update(n - done[0])
            done[0] = n
        q, scale = quantize(x, device=where, progress=advance)
    say(f"train: features held as {what} with a scale per row ({q.numel() / 2**30:.2f} GiB + "
        f"{scale.numel() * 4 / 2**30:.2f} GiB of scales, from {x.numel() * x.element_size() / 2**30:.2f} GiB "
        f"of {str(x.dtype).replace('torch.', '')})")
    return q, scale


def batch_dtype(args, table_dtype: torch.dtype, scale, source_dtype: torch.dtype | None = None) -> torch.dtype:
    """The dtype of a batch's features: float32, but a float16 or bfloat16 table's own for the
    built-in GraphSAGE layers, which sum those rows in float32 as they read them (half the
    bytes to gather, copy and read; the same logits). A float8 table (``scale``) made from a
    float16 or bfloat16 one (``source_dtype``) is read back as that: its rows times their scales
    are at most the source rows' largest values, so they fit. PyG's layers take float32."""
    from .models import have_pyg
    halves = (torch.float16, torch.bfloat16)
    builtin = args.layers == "builtin" or (args.layers == "auto" and not have_pyg())
    if not builtin or args.model != "sage":
        return torch.float32
    if scale is None:
        return table_dtype if table_dtype in halves else torch.float32
    return source_dtype if source_dtype in halves else torch.float32


class PipelinedBatches:
    """The batches of ``--pipeline unified|cpu_centric|gpu_resident`` for data set ``ds`` on
    ``device``; ``ctx`` the distributed context (or None)."""

    def __init__(self, args, ds, device, ctx=None, say=print):
        from ..graph import GPUNeighborSampler, NeighborSampler, access_frequency
        from .distributed import pinned_graph
        from .features import make_feature_store
        from .loader import PipelinedLoader
        from .options import uses_gpu_sampler

        cuda = device.type == "cuda"
        if args.pipeline == "gpu_resident" and not cuda:
            say("train: gpu_resident on the CPU keeps the features in host memory (no GPU here)", file=sys.stderr)
        graph_on_gpu = args.graph == "gpu"
        merge = args.merge_gathers or max(2, args.prefetch)
        use_gpu_sampler = uses_gpu_sampler(args, cuda)
        if use_gpu_sampler:
            if args.pipeline == "gpu_resident" or graph_on_gpu:
                graph = graph_to_gpu(ds.graph, device)
            elif ctx is not None:
                graph = pinned_graph(ds.graph)  # the node's shared pages, page-locked here: no copy
            else:
                graph = ds.graph.to("unified")
            make_sampler = lambda f, s: GPUNeighborSampler(  # noqa: E731
                graph, f, seed=s, device=device, batches_per_call=getattr(args, "sampler_batches", 1))
        else:
            graph = ds.graph
            # pinned batches: the loader's copy of each batch to the GPU is then a DMA
            make_sampler = lambda f, s: NeighborSampler(graph, f, seed=s, pin_memory=cuda)  # noqa: E731
        x, scale = feature_table(ds.x, getattr(args, "feature_dtype", "stored"),
                                 "unified" if args.pipeline == "unified" and ctx is None else "cpu", say,
                                 show=not getattr(args, "no_progress", False))
        int4 = getattr(args, "feature_dtype", "stored") == "int4"
        if int4:   # a store of the packed bytes, unpacked after each gather
            from .packed import make_int4_store
            make_store = partial(make_int4_store, args.pipeline, x, scale)
        else:
            make_store = partial(make_feature_store, args.pipeline, x, scale=scale)
        cache_share = getattr(args, "cache_share", None)
        self.store = make_store(device, batch_dtype(args, x.dtype, scale, ds.x.dtype),
                                cache_bytes=args.cache_mb << 20, cache_share=cache_share,
                                # ranked by how often the sampler reads a row (its outermost
                                # hop reads the most rows), not by row length
                                degree=(access_frequency(ds.graph, args.fanouts[-1])
                                        if args.cache_mb or cache_share else None),
                                pin_inplace=ctx is not None,
                                max_sms=args.gather_sms if cuda and args.gather_sms else None,
                                cpu_threads=args.gather_cpu_threads if cuda else 0,
                                cpu_share=getattr(args, "gather_cpu_share", None) if cuda else None)
        labels = ds.y.to(device) if cuda else ds.y
        shard = None if ctx is None else (ctx.rank, ctx.world)
        # Sampling streams differ per rank (seed + rank * 7919); the seed permutation does not.
        sample_seed = args.seed if ctx is None else args.seed + 7919 * ctx.rank

        def loader(ids, fanouts, seed, batch_size, gather_workers=getattr(args, "gather_workers", 1), **kw):
            return PipelinedLoader(make_sampler(fanouts, seed), self.store, ids, batch_size, labels=labels,
                                   device=device, prefetch=args.prefetch, merge_gathers=merge, shard=shard,
                                   sample_ahead=args.sample_ahead, stream_priority=args.loader_priority,
                                   gather_workers=gather_workers, **kw)

        self._loader, self._eval_batch = loader, args.eval_batch_size
        self.train = loader(ds.split["train"], args.fanouts, sample_seed, args.batch_size,
                            generator=torch.Generator().manual_seed(args.seed))
        self.info = {"sampler": "gpu" if use_gpu_sampler else "cpu", "graph": graph.device.type,
                     "loader_priority": args.loader_priority, "merge_gathers": merge,
                     "gather_workers": getattr(args, "gather_workers", 1),
                     "feature_dtype": ("4-bit integers" if int4 else str(self.store.source_dtype).replace("torch.", ""))
                     + (" with row scales" if self.store.scaled else "")}
        self._args, self._ctx, self._device = args, ctx, device

    def evaluation(self, ids, fanouts, seed):
        """The loader of sampled inference over ``ids``. It gathers on one thread whatever
        --gather-workers says: an evaluation batch (--eval-batch-size, --eval-fanouts) is many
        times a training batch (on papers100M-like, 4096 seeds at fanouts 20 reach millions of
        nodes, gigabytes of rows), and each gathering thread holds one gather's rows and their
        copies at once, so three of them ran out of an 80 GB GPU's memory where training fit."""
        return self._loader(ids, fanouts, seed, self._eval_batch, shuffle=False, gather_workers=1)

    def full_eval_store(self):
        return self.store

    def finish(self) -> list[str]:
        """Notes of the run (none: every option took effect or was refused before it)."""
        return []

    def describe(self, model_text: str, reorder_text: str = "") -> str:
        a, ctx, info = self._args, self._ctx, self.info
        merge = info["merge_gathers"]
        return (f"  model {model_text}, pipeline {a.pipeline}, device {self._device}, "
                f"sampler {info['sampler']} (CSR on {info['graph']}), fanouts {a.fanouts}, batch {a.batch_size}, "
                f"hidden {a.hidden}"
                + (f", precision {a.precision}" if a.precision != "fp32" else "")
                + (f", features as {info['feature_dtype']}" if getattr(a, "feature_dtype", "stored") != "stored" else "")
                + (f", loader streams at {a.loader_priority} priority" if a.loader_priority != "normal" else "")
                + reorder_text
                + (f", {merge} batches per gather" if merge > 1 else "")
                + (f", {info['gather_workers']} gathering threads" if info["gather_workers"] > 1 else "")
                + (f"\n  {ctx.world} processes ({ctx.backend}), one host copy per node in shared memory"
                   if ctx is not None else ""))
