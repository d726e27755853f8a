"""Feature stores: where a mini-batch's feature rows come from, behind one interface.

    >>> store = make_feature_store("unified", ds.x, device="cuda", cache_bytes=2**30,
    ...                            degree=access_frequency(ds.graph, fanout=5))
    >>> x = store.gather(batch.n_id, "cuda", stream=side_stream)   # [len(n_id), F] on cuda

Three kinds (BENCHMARKS.md, "End-to-end GNN training"):

``unified``       the table lives in unified memory (pinned, GPU-mapped host memory); a CUDA
                  index gathers the rows in place with ``torch_direct.gather`` (one kernel, no
                  staging copy). Optional GPU cache: the ``cache_bytes`` worth of rows with the
                  highest ``degree`` score (how often a row is read:
                  ``torch_direct.gnn.graph.access_frequency``, which ``train`` passes; an undirected
                  graph's degree is the same ranking) are copied to the GPU once and served
                  from there.
``cpu_centric``   the baseline: CPU threads slice the rows into a pinned buffer, then a DMA
                  copies it to the GPU (on the caller's stream, typically a side stream).
``gpu_resident``  the whole table is copied to the GPU once; a gather is an ``index_select``.

On a machine without a GPU every kind gathers on the CPU (the unified table is then plain host
memory), so pipelines and tests run the same code there.

``to_pyg(store)`` wraps a store as a ``torch_geometric.data.FeatureStore`` when PyG is installed.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

import torch_direct

KINDS = ("unified", "cpu_centric", "gpu_resident")


def cuda_usable() -> bool:
    return torch.cuda.is_available() and torch_direct.cuda_available()


def check_device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda":
        if not cuda_usable():
            raise RuntimeError(f"feature store: device {device} asked for, but no usable CUDA GPU here")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise ValueError(f"feature store: device must be 'cpu' or a CUDA device, got {device}")
    return device


def _check_index(n_id, num_rows: int) -> torch.Tensor:
    if not isinstance(n_id, torch.Tensor):
        n_id = torch.as_tensor(n_id)
    if n_id.dtype not in (torch.int32, torch.int64) or n_id.dim() != 1:
        raise TypeError(f"gather: n_id must be a 1-D int32/int64 tensor, got {n_id.dtype} "
                        f"of shape {tuple(n_id.shape)}")
    return n_id


def _stream_ctx(stream, device: torch.device):
    if stream is None or device.type != "cuda":
        return nullcontext()
    return torch.cuda.stream(stream)


class FeatureStore:
    """One table of node features ``[num_rows, dim]``; ``gather(n_id, device, stream)``
    returns ``x[n_id]`` as ``dtype`` on ``device``, its work queued on ``stream`` (CUDA)
    when given, else on the current stream. The result is owned by the caller; when it
    is used on another stream, the caller records that stream on it (the pipelined
    loader does)."""

    kind = "abstract"

    def __init__(self, x: torch.Tensor, device, dtype: torch.dtype | None = None):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise TypeError(f"{type(self).__name__}: x must be a 2-D tensor [num_rows, dim], got "
                            f"{type(x).__name__ if not isinstance(x, torch.Tensor) else tuple(x.shape)}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"{type(self).__name__}: dtype must be a torch.dtype, got {dtype!r}")
        self.device = check_device(device)
        self.num_rows, self.dim = x.shape
        self.source_dtype = x.dtype
        self.dtype = dtype or x.dtype

    @property
    def row_bytes(self) -> int:
        return self.dim * torch.empty((), dtype=self.source_dtype).element_size()

    def gather(self, n_id, device=None, stream=None) -> torch.Tensor:
        raise NotImplementedError

    def stats(self) -> dict:
        return {"kind": self.kind}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rows={self.num_rows}, dim={self.dim}, {self.source_dtype}"
                f"->{self.dtype}, device={self.device})")


class UnifiedFeatureStore(FeatureStore):
    """Zero-copy gathers from a unified table, optionally with a GPU cache of hot rows.

    ``x`` is used as is when already unified, else copied into unified memory once
    (``pin_inplace=True`` maps a CPU tensor's own pages instead). ``cache_bytes``
    (GPU device only): the rows with the highest ``degree`` score that fit in that many
    bytes are copied to the GPU and served from there; the others are read in place. The
    score should say how often a row is read (``access_frequency``); a directed graph's row
    lengths need not (on the synthetic presets they are uncorrelated with it).
    ``max_sms`` caps the streaming multiprocessors the gather kernel runs on (None: all),
    so that a training step queued beside a gather is not left waiting for it.
    ``cpu_threads`` (GPU device only; 0: off) makes each gather hybrid: that many CPU threads
    gather a share of the rows into pinned memory, copied to the GPU while the kernel reads
    the rest (``torch_direct.gather(..., cpu_threads=)``, its share chosen from measured rates).
    Rows are then gathered in the table's dtype and cast on the GPU, so that the CPU share moves
    the table's bytes, not the wider output's.
    """

    kind = "unified"

    def __init__(self, x, device, dtype=None, *, cache_bytes: int = 0, degree=None,
                 pin_inplace: bool = False, max_sms: int | None = None, cpu_threads: int = 0):
        super().__init__(x, device, dtype)
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"UnifiedFeatureStore: cache_bytes must be an int >= 0, got {cache_bytes!r}")
        if max_sms is not None and (isinstance(max_sms, bool) or not isinstance(max_sms, int) or max_sms <= 0):
            raise ValueError(f"UnifiedFeatureStore: max_sms must be a positive int or None, got {max_sms!r}")
        if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 0:
            raise ValueError(f"UnifiedFeatureStore: cpu_threads must be an int >= 0, got {cpu_threads!r}")
        self.max_sms = max_sms
        self.cpu_threads = cpu_threads if self.device.type == "cuda" else 0  # the CPU path has no GPU share
        if x.device.type == "unified":
            self.table = x
        elif pin_inplace:
            self.table = torch_direct.pin_inplace(x.contiguous())
        else:
            self.table = x.contiguous().to("unified")
        self.cache_rows = 0
        self.cache = self.slot = None
        self.hits = self.lookups = 0
        if cache_bytes and self.device.type == "cuda":
            if degree is None:
                raise ValueError("UnifiedFeatureStore: a GPU cache needs degree= (rows are ranked by it)")
            degree = torch.as_tensor(degree).reshape(-1)
            if degree.numel() != self.num_rows:
                raise ValueError(f"UnifiedFeatureStore: degree has {degree.numel()} entries for "
                                 f"{self.num_rows} rows")
            k = min(self.num_rows, cache_bytes // max(1, self.row_bytes))
            if k > 0:
                hot = torch.topk(degree.cpu().float(), k, sorted=False).indices
                hot = hot.sort().values.to(self.device)
                self.cache = torch_direct.gather(self.table, hot, dtype=self.dtype)
                self.slot = torch.full((self.num_rows,), -1, dtype=torch.int32, device=self.device)
                self.slot[hot] = torch.arange(k, dtype=torch.int32, device=self.device)
                self.cache_rows = k
                torch.cuda.synchronize(self.device)   # gathers on side streams read the cache

    def _read(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` of the table (``idx`` on the output's device), in the store's dtype."""
        if self.cpu_threads and idx.device.type == "cuda":
            y = torch_direct.gather(self.table, idx, max_sms=self.max_sms, cpu_threads=self.cpu_threads)
            return y.to(self.dtype)
        return torch_direct.gather(self.table, idx, dtype=self.dtype, max_sms=self.max_sms)

    def gather(self, n_id, device=None, stream=None) -> torch.Tensor:
        device = self.device if device is None else check_device(device)
        n_id = _check_index(n_id, self.num_rows)
        with _stream_ctx(stream, device):
            idx = n_id.to(device, non_blocking=True)
            if self.cache is None or device != self.device:
                return self._read(idx)
            slot = self.slot[idx]
            hit = slot >= 0
            out = torch.empty(idx.numel(), self.dim, dtype=self.dtype, device=device)
            miss = torch.nonzero(~hit).squeeze(1)
            n_hit = idx.numel() - miss.numel()   # one sync: the sizes drive the two gathers
            self.hits += n_hit
            self.lookups += idx.numel()
            if n_hit:
                hit_pos = torch.nonzero(hit).squeeze(1)
                out[hit_pos] = self.cache[slot[hit_pos].long()]
            if miss.numel():
                out[miss] = self._read(idx[miss])
            return out

    def stats(self) -> dict:
        s = {"kind": self.kind, "cache_rows": self.cache_rows}
        if self.max_sms is not None:
            s["max_sms"] = self.max_sms
        if self.cpu_threads:
            s["cpu_threads"] = self.cpu_threads
        if self.cache is not None:
            s["cache_hit_rate"] = self.hits / self.lookups if self.lookups else 0.0
        return s


class CPUCentricFeatureStore(FeatureStore):
    """The CPU-centric baseline: CPU threads slice the rows into pinned memory, then a DMA
    (``non_blocking``, on ``stream`` when given) moves them to the GPU. The pinned buffers
    come from torch's caching host allocator, which keeps one from being reused until the
    copy that reads it has finished."""

    kind = "cpu_centric"

    def __init__(self, x, device, dtype=None):
        super().__init__(x, device, dtype)
        if x.device.type == "unified":
            x = torch_direct.cpu_alias(x)
        elif x.device.type != "cpu":
            x = x.cpu()
        self.table = x

    def gather(self, n_id, device=None, stream=None) -> torch.Tensor:
        device = self.device if device is None else check_device(device)
        n_id = _check_index(n_id, self.num_rows).cpu()
        pin = device.type == "cuda"
        buf = torch.empty(n_id.numel(), self.dim, dtype=self.source_dtype, pin_memory=pin)
        torch.index_select(self.table, 0, n_id, out=buf)        # intra-op CPU threads
        if device.type == "cpu":
            return buf.to(self.dtype)
        with _stream_ctx(stream, device):
            return buf.to(device, non_blocking=True).to(self.dtype)


class GPUResidentFeatureStore(FeatureStore):
    """The whole table on the device, copied once; a gather is an ``index_select`` there."""

    kind = "gpu_resident"

    def __init__(self, x, device, dtype=None):
        super().__init__(x, device, dtype)
        if x.device.type == "unified":
            x = torch_direct.cpu_alias(x)
        self.table = x.to(self.device)          # in its own dtype: rows are cast as gathered
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)   # gathers on side streams read the table

    def gather(self, n_id, device=None, stream=None) -> torch.Tensor:
        device = self.device if device is None else check_device(device)
        if device != self.device:
            raise ValueError(f"GPUResidentFeatureStore: the table is on {self.device}, asked for {device}")
        n_id = _check_index(n_id, self.num_rows)
        with _stream_ctx(stream, device):
            return torch.index_select(self.table, 0, n_id.to(device, non_blocking=True)).to(self.dtype)


def make_feature_store(kind: str, x: torch.Tensor, device, dtype=None, *, cache_bytes: int = 0,
                       degree=None, pin_inplace: bool = False, max_sms: int | None = None,
                       cpu_threads: int = 0) -> FeatureStore:
    """A store of ``kind`` (one of :data:`KINDS`) over ``x``, serving ``device``
    (``pin_inplace``: the unified store maps ``x``'s own pages instead of copying them)."""
    if kind == "unified":
        return UnifiedFeatureStore(x, device, dtype, cache_bytes=cache_bytes, degree=degree,
                                   pin_inplace=pin_inplace, max_sms=max_sms, cpu_threads=cpu_threads)
    for name, value in (("cache_bytes", cache_bytes), ("max_sms", max_sms), ("cpu_threads", cpu_threads)):
        if value:
            raise ValueError(f"{name} applies to the 'unified' store only, not {kind!r}")
    if kind == "cpu_centric":
        return CPUCentricFeatureStore(x, device, dtype)
    if kind == "gpu_resident":
        return GPUResidentFeatureStore(x, device, dtype)
    raise ValueError(f"unknown feature store {kind!r}: expected one of {', '.join(KINDS)}")


# -- PyG adapter -------------------------------------------------------------------------------------

def to_pyg(stores, group_name=None, attr_name: str = "x"):
    """A ``torch_geometric.data.FeatureStore`` over our stores, for PyG's loaders.

    ``stores``: one :class:`FeatureStore` (registered as ``(group_name, attr_name)``)
    or a dict ``{(group_name, attr_name): store}``. Reads gather through our stores
    onto each store's device; the adapter is read-only (``put``/``remove`` raise).
    Raises ImportError when torch_geometric is not installed.
    """
    try:
        from torch_geometric.data import FeatureStore as PyGFeatureStoreBase
    except ImportError as e:
        raise ImportError("to_pyg needs torch_geometric (pip install torch_geometric)") from e
    if isinstance(stores, FeatureStore):
        stores = {(group_name, attr_name): stores}
    for k, v in stores.items():
        if not isinstance(v, FeatureStore):
            raise TypeError(f"to_pyg: {k!r} maps to {type(v).__name__}, not a FeatureStore")

    class PyGFeatureStore(PyGFeatureStoreBase):
        def __init__(self, stores):
            super().__init__()
            self._stores = dict(stores)

        def _store(self, attr):
            try:
                return self._stores[(attr.group_name, attr.attr_name)]
            except KeyError:
                raise KeyError(f"no feature store for ({attr.group_name!r}, {attr.attr_name!r}); "
                               f"have {sorted(map(str, self._stores))}") from None

        def _put_tensor(self, tensor, attr) -> bool:
            raise NotImplementedError("this PyG FeatureStore adapter is read-only")

        def _remove_tensor(self, attr) -> bool:
            raise NotImplementedError("this PyG FeatureStore adapter is read-only")

        def _get_tensor(self, attr):
            store = self._store(attr)
            index = attr.index
            if index is None or isinstance(index, slice):
                index = torch.arange(store.num_rows)[index if isinstance(index, slice) else slice(None)]
            return store.gather(torch.as_tensor(index))

        def _get_tensor_size(self, attr):
            store = self._store(attr)
            return (store.num_rows, store.dim)

        def get_all_tensor_attrs(self):
            from torch_geometric.data import TensorAttr
            return [TensorAttr(group_name=g, attr_name=a) for g, a in self._stores]

    return PyGFeatureStore(stores)
