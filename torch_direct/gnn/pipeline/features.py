"""Feature stores: where a mini-batch's feature rows come from, behind one interface.

    >>> store = make_feature_store("unified", ds.x, device="cuda", cache_bytes=2**30,
    ...                            degree=access_frequency(ds.graph, fanout=5))
    >>> x = store.gather(batch.n_id, "cuda", stream=side_stream)   # [len(n_id), F] on cuda

Three kinds (BENCHMARKS.md, "End-to-end GNN training"):

``unified``       the table in unified memory (pinned, GPU-mapped host memory); a CUDA index
                  gathers the rows in place with ``torch_direct.gather`` (one kernel, no staging).
``cpu_centric``   the baseline: CPU threads slice the rows into a pinned buffer, then a DMA
                  copies it to the GPU (on the caller's stream, typically a side stream).
``gpu_resident``  the whole table copied to the GPU once, gathered there (one kernel, cast fused).

A float8 (e4m3) table with a float32 scale per row (``torch_direct.quantize_rows_fp8``;
``make_feature_store(kind, q, device, scale=scale)``) moves half of float16's bytes and returns
``q[n_id] * scale[n_id]`` as ``dtype``, upcast and scaled in the unified store's gather kernel.

``CachedFeatureStore(store, cache_bytes, degree)`` (``cache.py``; ``make_feature_store(...,
cache_bytes=)`` or ``cache_share=``) keeps the rows ranked highest by ``degree`` (how often a row
is read: ``torch_direct.gnn.graph.access_frequency``) in the store's device memory, in the
table's own format, and reads the others from the store. Without a GPU every kind gathers on
the CPU, so pipelines and tests run the same code there. ``to_pyg(store)`` (``pipeline/pyg.py``)
wraps a store as a ``torch_geometric.data.FeatureStore``.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

import torch_direct
from .pages import feature_pages, huge_page_share, table_on_pages
from .timing import Parts

HYBRID_SPLITS = ("index", "address")


def store_index_bounds() -> bool:
    """The experimental setting store_index_bounds: "known" (unset: the default; the stores pass
    gather the bounds of the indices they make themselves: no pass over them and no wait for the
    stream) or "checked" (gather checks them as it checks any index)."""
    return torch_direct.experimental_setting("store_index_bounds", choices=("checked", "known"),
                                             default="known") == "known"


def hybrid_split() -> str:
    """The experimental setting hybrid_split: "index" (unset: the default) or "address"."""
    return torch_direct.experimental_setting("hybrid_split", choices=HYBRID_SPLITS, default="index")


KINDS = ("unified", "cpu_centric", "gpu_resident")
FP8 = torch.float8_e4m3fn
SCALED_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)   # what a scaled table is read as


def take_rows(table: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``index_select(table, 0, idx)``; float8 rows move as their bytes (torch before 2.7
    indexes no float8 tensor on the CPU)."""
    if table.dtype != FP8:
        return torch.index_select(table, 0, idx, out=out)
    raw = None if out is None else out.view(torch.uint8)
    return torch.index_select(table.view(torch.uint8), 0, idx, out=raw).view(FP8)


def dequantize(rows: torch.Tensor, scale_rows: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Rows of a table as ``dtype``: times their row scales when the table is float8."""
    return rows.to(dtype) if scale_rows is None else (rows.to(torch.float32) * scale_rows.unsqueeze(1)).to(dtype)


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


def check_row_scale(scale, rows: int, who: str) -> None:
    """Refuse anything but a 1-D float32 tensor of ``rows`` entries as a table's row scales."""
    if not (isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and tuple(scale.shape) == (rows,)):
        got = f"{scale.dtype} of shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise ValueError(f"{who}: scale must be a 1-D float32 tensor with one entry per row ({rows}), got {got}")


def check_scale(x, scale, dtype, who: str) -> None:
    """Refuse a float8 table without its scales, or scales that do not fit the table."""
    if scale is None:
        if isinstance(x, torch.Tensor) and x.dtype == FP8:
            raise ValueError(f"{who}: a float8 table needs its per-row scale= "
                             f"(torch_direct.quantize_rows_fp8 returns both)")
        return
    if not isinstance(x, torch.Tensor) or x.dtype != FP8:
        raise TypeError(f"{who}: scale= goes with a float8_e4m3fn table, got "
                        f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
    check_row_scale(scale, x.shape[0], who)
    if dtype is not None and dtype not in SCALED_OUT_DTYPES:
        raise TypeError(f"{who}: a float8 table is read as float32, float16 or bfloat16, not {dtype}")


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a CPU tensor: a unified one's CPU alias, a CUDA one's copy."""
    if t.device.type == "unified":
        return torch_direct.cpu_alias(t)
    return t if t.device.type == "cpu" else t.cpu()


def stream_context(stream, device: torch.device):
    """``stream`` made current for a block (nothing to do without one, or off CUDA)."""
    if stream is None or device.type != "cuda":
        return nullcontext()
    return torch.cuda.stream(stream)


class FeatureStore:
    """One table of node features ``[num_rows, dim]``; ``gather(n_id, device, stream)``
    returns ``x[n_id]`` as ``dtype`` on ``device``, its work queued on ``stream`` (CUDA)
    when given, else on the current stream. The result is owned by the caller; when it
    is used on another stream, the caller records that stream on it (the pipelined
    loader does).

    A store implements ``read(idx, device)``: the rows ``idx`` (a checked 1-D int32/int64
    index, on ``device`` or on the CPU) as ``dtype`` on ``device``, on the current stream.
    ``gather`` checks its arguments and calls it; :class:`CachedFeatureStore` calls it for
    the rows its cache misses, so a cached gather checks nothing twice."""

    kind = "abstract"

    def __init__(self, x: torch.Tensor, device, dtype: torch.dtype | None = None,
                 scale: torch.Tensor | None = None):
        who = type(self).__name__
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise TypeError(f"{who}: x must be a 2-D tensor [num_rows, dim], got "
                            f"{type(x).__name__ if not isinstance(x, torch.Tensor) else tuple(x.shape)}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"{who}: dtype must be a torch.dtype, got {dtype!r}")
        check_scale(x, scale, dtype, who)
        self.device = check_device(device)
        self.num_rows, self.dim = x.shape
        self.source_dtype = x.dtype
        self.dtype = dtype or (torch.float32 if scale is not None else x.dtype)
        self.scaled = scale is not None
        self.parts = Parts()   # host seconds of parts of its gathers (loader stats: gather_parts)

    @property
    def row_bytes(self) -> int:
        """Bytes a row takes in the table (its scale included)."""
        return self.dim * torch.empty((), dtype=self.source_dtype).element_size() + (4 if self.scaled else 0)

    def gather(self, n_id, device=None, stream=None) -> torch.Tensor:
        device = self.device if device is None else check_device(device)
        n_id = _check_index(n_id, self.num_rows)
        with stream_context(stream, device):
            return self.read(n_id, device)

    def read(self, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        raise NotImplementedError

    @property
    def table_bytes(self) -> int:   # the whole table's, its scales included
        return self.num_rows * self.row_bytes

    @property
    def device_bytes(self) -> int:
        """Bytes of the table's data the store holds in the device's memory (a cache, row scales, a table)."""
        return 0

    @property
    def device_share(self) -> float:   # of the table's bytes, the share held in the device's memory
        return self.device_bytes / self.table_bytes if self.table_bytes else 0.0

    def stats(self) -> dict:
        return {"kind": self.kind, "cache_rows": 0, "device_share": self.device_share}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rows={self.num_rows}, dim={self.dim}, {self.source_dtype}"
                f"->{self.dtype}, device={self.device})")


class UnifiedFeatureStore(FeatureStore):
    """Zero-copy gathers from a unified table.

    ``x`` is used as is when already unified, else copied into unified memory once
    (``pin_inplace=True`` maps a CPU tensor's own pages instead).
    ``max_sms`` caps the streaming multiprocessors the gather kernel runs on (None: all),
    so that a training step queued beside a gather is not left waiting for it.
    ``cpu_threads`` (GPU device only; 0: off) makes each gather hybrid: that many CPU threads
    gather a share of the rows into pinned memory, copied to the GPU while the kernel reads
    the rest (``torch_direct.gather(..., cpu_threads=)``, its share chosen from measured rates,
    or ``cpu_share`` of the rows when given: 1 leaves the GPU no read of host memory).
    Rows are then gathered in the table's dtype (a float8 table's as bytes) and cast (and
    scaled) on the GPU, so that the CPU share moves the table's bytes, not the wider output's.
    """

    kind = "unified"

    def __init__(self, x, device, dtype=None, *, scale=None, pin_inplace: bool = False,
                 max_sms: int | None = None, cpu_threads: int = 0, cpu_share: float | None = None):
        super().__init__(x, device, dtype, scale)
        if max_sms is not None and (isinstance(max_sms, bool) or not isinstance(max_sms, int) or max_sms <= 0):
            raise ValueError(f"UnifiedFeatureStore: max_sms must be a positive int or None, got {max_sms!r}")
        if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 0:
            raise ValueError(f"UnifiedFeatureStore: cpu_threads must be an int >= 0, got {cpu_threads!r}")
        if cpu_share is not None and (isinstance(cpu_share, bool) or not isinstance(cpu_share, (int, float))
                                      or not 0.0 <= cpu_share <= 1.0):
            raise ValueError(f"UnifiedFeatureStore: cpu_share must be a number from 0 to 1 or None, got {cpu_share!r}")
        self.cpu_share = None if cpu_share is None else float(cpu_share)
        self.max_sms = max_sms
        self.cpu_threads = cpu_threads if self.device.type == "cuda" else 0  # the CPU path has no GPU share
        self.hybrid_split = hybrid_split()
        self.known_bounds = store_index_bounds()
        pages = feature_pages()
        if x.device.type == "unified" and (pages == "small" or pin_inplace):
            self.table = x
        elif pin_inplace:
            self.table = torch_direct.pin_inplace(x.contiguous())
        else:   # a unified table too (a float8 one made in unified memory) moves to those pages
            self.table = table_on_pages(x, pages)
        # what the kernel granted of a request for huge pages (stats' huge_page_share)
        self.huge_share = huge_page_share(self.table) if pages == "huge" and not pin_inplace else None
        # the scales (4 bytes a row) sit in the device's memory, read by the gather kernel; their
        # host copy serves gathers onto the CPU
        self.scale_host = None if scale is None else _host(scale)
        self.scale = None if scale is None else (
            self.scale_host.to(self.device) if self.device.type == "cuda" else self.scale_host)

    def read(self, idx, device):
        idx = idx.to(device, non_blocking=True)
        if self.cpu_threads and device.type == "cuda":
            return self._read_hybrid(idx, device)
        if self.scale is not None:
            scale = (self.scale if device == self.device
                     else self.scale_host if device.type == "cpu" else self.scale.to(device))
            return torch_direct.gather(self.table, idx, dtype=self.dtype, scale=scale, max_sms=self.max_sms)
        return torch_direct.gather(self.table, idx, dtype=self.dtype, max_sms=self.max_sms)

    def _read_hybrid(self, idx, device):
        """The hybrid gather: rows as the table stores them (a float8 table's as their bytes),
        then cast, and scaled, on the GPU, so that the CPU share moves the table's bytes."""
        flat = idx.reshape(-1)
        if not flat.numel():
            return torch.empty(*idx.shape, self.dim, dtype=self.dtype, device=device)
        table = self.table if self.scale is None else self.table.view(torch.uint8)
        scale = None if self.scale is None else (self.scale if device == self.device else self.scale.to(device))
        if self.hybrid_split == "address":
            # The CPU threads take the first part of the index: sorted farthest rows first, that
            # is the table's far end, and the GPU reads the rest, nearer together (random rows
            # read faster the narrower their span: docs/gather.md).
            read, order = torch.sort(flat, descending=True)   # the batch's row i is read's order^-1[i]
        else:
            read, order = flat, None
        t0 = time.perf_counter()
        got = torch_direct.gather(table, read, max_sms=self.max_sms, cpu_threads=self.cpu_threads,
                                  cpu_fraction=self.cpu_share)
        self.parts.add("hybrid_gather", time.perf_counter() - t0)   # bounds wait, CPU rows, copies' wait
        if scale is not None:
            got = got.view(self.table.dtype)
        if scale is None and got.dtype == self.dtype:
            rows = got
            if order is not None:   # back in place: one scatter, with no wait on the device
                rows = torch.empty_like(got)
                rows[order] = got
        else:
            # one pass on the GPU puts the rows in place and casts (scales) them as it writes,
            # where a scatter and an upcast through float32 would write them three or four times
            ramp = torch.arange(got.shape[0], device=got.device)
            at = ramp if order is None else torch.empty_like(ramp).scatter_(0, order, ramp)  # the sort's inverse
            # `at` is a permutation of 0 .. n-1: known bounds (store_index_bounds=known, the default) spare the
            # gather its pass over them and its wait for the stream
            rows = torch_direct.gather(got, at, dtype=self.dtype, scale=None if scale is None else scale[read],
                                       order="as_is", index_bounds=(0, got.shape[0] - 1) if self.known_bounds else None)
        return rows.view(*idx.shape, *rows.shape[1:])

    @property
    def device_bytes(self) -> int:
        return 0 if self.scale is None or self.scale is self.scale_host else self.scale.numel() * 4

    def stats(self) -> dict:
        s = super().stats()
        if self.max_sms is not None:
            s["max_sms"] = self.max_sms
        if self.huge_share is not None:
            s["huge_page_share"] = self.huge_share
        if self.cpu_threads:
            s["cpu_threads"] = self.cpu_threads
            if self.cpu_share is not None:
                s["cpu_share"] = self.cpu_share
        return s


class CPUCentricFeatureStore(FeatureStore):
    """The CPU-centric baseline: CPU threads slice the rows into pinned memory, then a DMA
    (``non_blocking``, on ``stream`` when given) moves them to the GPU. The pinned buffers
    come from torch's caching host allocator, which keeps one from being reused until the
    copy that reads it has finished. An index on the GPU is first copied to the CPU (a wait
    for the GPU: the CPU reads it)."""

    kind = "cpu_centric"

    def __init__(self, x, device, dtype=None, *, scale=None):
        super().__init__(x, device, dtype, scale)
        self.table = _host(x)
        self.scale = None if scale is None else _host(scale)

    def read(self, idx, device):
        idx = idx.cpu()
        pin = device.type == "cuda"
        buf = torch.empty(idx.numel(), self.dim, dtype=self.source_dtype, pin_memory=pin)
        take_rows(self.table, idx, out=buf)                     # intra-op CPU threads
        sbuf = None
        if self.scale is not None:
            sbuf = torch.empty(idx.numel(), dtype=torch.float32, pin_memory=pin)
            torch.index_select(self.scale, 0, idx, out=sbuf)
        if device.type == "cuda":
            buf = buf.to(device, non_blocking=True)
            sbuf = None if sbuf is None else sbuf.to(device, non_blocking=True)
        return dequantize(buf, sbuf, self.dtype)


class GPUResidentFeatureStore(FeatureStore):
    """The whole table on the device, copied once; a gather is an ``index_select`` there."""

    kind = "gpu_resident"

    def __init__(self, x, device, dtype=None, *, scale=None):
        super().__init__(x, device, dtype, scale)
        if x.device.type == "unified":
            x = torch_direct.cpu_alias(x)
        self.table = x.to(self.device)          # in its own dtype: rows are cast as gathered
        self.scale = None if scale is None else _host(scale).to(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)   # gathers on side streams read the table

    @property
    def device_bytes(self) -> int:
        return self.table_bytes if self.device.type == "cuda" else 0   # on the CPU .to() copied nothing

    def read(self, idx, device):
        if device != self.device:
            raise ValueError(f"GPUResidentFeatureStore: the table is on {self.device}, asked for {device}")
        # casting (and scaling) each row as it is written (one kernel on a GPU), where index_select
        # and .to() would write the rows twice, in the table's dtype and then in the store's
        return torch_direct.gather(self.table, idx.to(device, non_blocking=True), dtype=self.dtype,
                                   scale=self.scale, order="as_is")


def make_feature_store(kind: str, x: torch.Tensor, device, dtype=None, *, scale=None, cache_bytes: int = 0,
                       degree=None, pin_inplace: bool = False, max_sms: int | None = None, cpu_threads: int = 0,
                       cpu_share: float | None = None, cache_share: float | None = None) -> FeatureStore:
    """A store of ``kind`` (one of :data:`KINDS`) over ``x``, serving ``device``
    (``pin_inplace``: the unified store maps ``x``'s own pages instead of copying them).
    ``scale``: ``x`` is a float8_e4m3fn table and these its float32 row scales
    (``torch_direct.quantize_rows_fp8``); rows are returned as ``dtype`` (default float32).
    ``cache_bytes`` > 0 wraps it in a :class:`CachedFeatureStore` ranked by ``degree``
    (not for ``gpu_resident``, whose whole table is already in device memory); ``cache_share``
    instead sizes that cache so that the store holds at most that share of the table's bytes
    in device memory, what it holds there already (row scales) counted."""
    if kind not in KINDS:
        raise ValueError(f"unknown feature store {kind!r}: expected one of {', '.join(KINDS)}")
    from .cache import CachedFeatureStore, cache_bytes_within, check_cache_request   # (cache.py builds on this module)
    check_cache_request(kind, cache_bytes, cache_share, degree, x.shape[0] if isinstance(x, torch.Tensor) else None,
                        "make_feature_store")
    check_scale(x, scale, dtype, "make_feature_store")
    if kind == "unified":
        store = UnifiedFeatureStore(x, device, dtype, scale=scale, pin_inplace=pin_inplace, max_sms=max_sms,
                                    cpu_threads=cpu_threads, cpu_share=cpu_share)
    else:
        for name, given in (("max_sms", bool(max_sms)), ("cpu_threads", bool(cpu_threads)),
                            ("cpu_share", cpu_share is not None)):
            if given:
                raise ValueError(f"{name} applies to the 'unified' store only, not {kind!r}")
        store = (CPUCentricFeatureStore if kind == "cpu_centric" else GPUResidentFeatureStore)(
            x, device, dtype, scale=scale)
    if cache_share is not None:
        cache_bytes = cache_bytes_within(cache_share, store.table_bytes, store.device_bytes)
    return CachedFeatureStore(store, cache_bytes, degree) if cache_bytes else store
