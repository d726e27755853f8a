"""A cache of a feature store's hottest rows in its device's memory (:class:`CachedFeatureStore`),
and its gather: one pass (``_features.cached_gather``, the default) or, with
``TORCH_DIRECT_EXPERIMENTAL=cached_gather=split``, split (a lookup, a wait for the misses' count,
a gather of each part)."""

from __future__ import annotations

import threading
import time

import torch

import torch_direct
from . import _features
from .features import FeatureStore, UnifiedFeatureStore, store_index_bounds, take_rows
from .timing import Parts


# what the fused pass casts between (csrc/aten/RowGather.h)
_FUSED_OUT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
_FUSED_TABLE_TYPES = _FUSED_OUT_TYPES + (torch.float8_e4m3fn,)


def cached_gather_mode() -> str:
    """The experimental setting cached_gather: "fused" (unset: the default) or "split"."""
    return torch_direct.experimental_setting("cached_gather", choices=("split", "fused"), default="fused")


# A table of this many bytes or more in host memory is read by the fused pass in address order,
# its index sorted first, as the device's own gather reads it (the pass's one-block-a-row kernel
# takes over at the same size: one constant, from the module).
LARGE_TABLE_BYTES = _features.large_table_bytes

# Whether stores made from now on sort a split gather's misses before a store of host memory
# reads them (below); False reads them in the batch's order, as before (for comparisons:
# experiments/train_variants.py --misses-in-batch-order).
SORT_MISSES = True


def check_cache_args(cache_bytes, degree, num_rows, who: str):
    """``degree`` as a flat tensor, after refusing a bad ``cache_bytes`` or a ``degree`` that
    is missing or has not one entry per row (``num_rows``; None: not known yet)."""
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
        raise ValueError(f"{who}cache_bytes must be an int >= 0, got {cache_bytes!r}")
    if degree is None:
        raise ValueError(f"{who}a cache needs degree= (rows are ranked by it)")
    degree = torch.as_tensor(degree).reshape(-1)
    if num_rows is not None and degree.numel() != num_rows:
        raise ValueError(f"{who}degree has {degree.numel()} entries for {num_rows} rows")
    return degree


def check_cache_request(kind: str, cache_bytes, cache_share, degree, num_rows, who: str):
    """Refuse, before a store copies its table (gigabytes, maybe), a cache that ``cache_bytes``
    or ``cache_share`` (one or the other) cannot give a store of ``kind``; ``degree`` as a flat
    tensor when a cache is asked for (:func:`check_cache_args`), else as given."""
    if (cache_bytes or cache_share is not None) and kind == "gpu_resident":
        given = "cache_share" if cache_share is not None else "cache_bytes"
        raise ValueError(f"{given}: the gpu_resident store holds its whole table in device memory already")
    if cache_share is not None:
        if cache_bytes:
            raise ValueError(f"{who}: give cache_bytes or cache_share, not both")
        _check_share(cache_share, f"{who}: ")
    elif isinstance(cache_bytes, int) and not isinstance(cache_bytes, bool) and cache_bytes == 0:
        return degree   # no cache
    return check_cache_args(cache_bytes, degree, num_rows, f"{who}: ")


def _check_share(share, who: str) -> None:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
        raise ValueError(f"{who}cache_share must be a number in (0, 1], got {share!r}")


def cache_bytes_within(share, table_bytes: int, held: int) -> int:
    """The bytes of a cache that keep a store within ``share`` (a number in (0, 1]) of its
    table's ``table_bytes`` in device memory, where it holds ``held`` there already (row scales,
    say): 0 when those use up the share."""
    _check_share(share, "")
    return max(0, int(share * table_bytes) - held)


def _put_misses(out, miss, at, rows):
    out[miss] = rows


class CachedFeatureStore(FeatureStore):
    """Any store, with a cache of its hottest rows in its device's memory.

    The rows with the highest ``degree`` score (one entry per row; it should say how often
    a row is read, as ``access_frequency`` does) that fit in ``cache_bytes`` are read from
    ``store`` once and kept on ``store.device`` in the table's own format (``row_bytes``
    each: a float16 table's rows as float16, a float8 table's with their scales), and cast
    (scaled) to the output dtype when served. A gather onto that device serves the cached rows from there and reads
    the others through ``store.read``; it waits for the device once, to learn how many rows
    missed. Where ``degree`` never rises with the row number (a table in the order of its
    ranking: ``train --reorder frequency``), the cache holds the first rows (:attr:`prefix`):
    a row's slot is its number, so the split gather keeps no table of slots on the device, and
    a float8 store's scales already there serve the cache too. A gather onto another device
    goes to the store. On a CPU device the cache is a copy in ordinary memory (it changes
    nothing there, which is what the CPU tests use).

    By default (:func:`cached_gather_mode`; ``cached_gather=split`` turns it off), a gather
    whose table the device can read in place (a unified store on a GPU without CPU threads, or
    any store on the CPU) is one pass instead (``_features.cached_gather``): each row from the
    cache or the table, cast and scaled as it is written, the misses counted on the device, with
    no wait for it. Rows outside the table are refused with IndexError before the pass on the
    CPU; on a GPU they are written as zeros and counted, and :meth:`stats`, which waits for the
    device, raises IndexError for them.
    """

    def __init__(self, store: FeatureStore, cache_bytes: int, degree):
        if not isinstance(store, FeatureStore) or isinstance(store, CachedFeatureStore):
            raise TypeError(f"CachedFeatureStore: store must be an uncached FeatureStore, got {type(store).__name__}")
        degree = check_cache_args(cache_bytes, degree, store.num_rows, "CachedFeatureStore: ")
        self.store = store
        self.kind = store.kind
        self.device, self.num_rows, self.dim = store.device, store.num_rows, store.dim
        self.source_dtype, self.dtype, self.scaled = store.source_dtype, store.dtype, store.scaled
        self.cache_rows = min(self.num_rows, cache_bytes // max(1, store.row_bytes))
        self.cache = self.cache_scale = self.slot = None
        self.hits = self.lookups = 0
        self._count_lock = threading.Lock()   # gathers of several loader threads count here
        self.parts = Parts()   # host seconds of parts of its gathers (loader stats: gather_parts)
        # The split gather reads its misses from host memory in address order: random rows of a
        # large table cost CPU threads a page walk each, which rows in order share
        # (experiments/cpu_row_order_probe.py), and the GPU's reads go faster in order too. A
        # unified store under hybrid_split=address sorts them itself.
        self._sort_misses = SORT_MISSES and (store.kind == "cpu_centric" or (
            isinstance(store, UnifiedFeatureStore) and store.hybrid_split != "address"))
        # Scores that never rise with the row number (a table in the order of its ranking, as
        # train --reorder frequency makes it) make the first rows the hottest, ties alike: the
        # cache then holds rows 0 .. cache_rows - 1, a row's slot is its number, and the split
        # gather needs no table of slots (4 bytes a row of the table on the device).
        self.prefix = False
        self._scale_shared = False   # cache_scale is a view of the store's own scales on the device
        hot = None
        if self.cache_rows:
            score = degree.cpu().float()
            self.prefix = bool((score[1:] <= score[:-1]).all())
            hot = (torch.arange(self.cache_rows) if self.prefix
                   else torch.topk(score, self.cache_rows, sorted=False).indices.sort().values)
            # the rows as the table holds them, read once (a unified table by the GPU's gather)
            at = hot.to(self.device) if store.table.device.type == "unified" else hot
            self.cache = torch_direct.gather(store.table, at).to(self.device)
            if self.scaled and self.prefix and self.device.type == "cuda" and store.scale.device == self.device:
                # the store's scales on the GPU (counted in its device_bytes): the cache's are their first rows
                self.cache_scale, self._scale_shared = store.scale[:self.cache_rows], True
            elif self.scaled:
                self.cache_scale = store.scale[hot.to(store.scale.device)].to(self.device)
        # the slots a lookup clamps lie in [0, cache_rows): bounds known by construction
        self._slot_bounds = (0, self.cache_rows - 1) if self.cache_rows and store_index_bounds() else None
        self._fused = self._fused_source() if self.cache_rows and cached_gather_mode() == "fused" else None
        if self.cache_rows and (self._fused is not None or not self.prefix):   # the fused pass reads slots
            self.slot = torch.full((self.num_rows,), -1, dtype=torch.int32, device=self.device)
            self.slot[hot.to(self.device)] = torch.arange(self.cache_rows, dtype=torch.int32, device=self.device)
        if self.cache_rows and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)   # gathers on side streams read the cache
        # misses and rows outside the table, counted by the fused pass on the device
        self._counts = torch.zeros(2, dtype=torch.int64, device=self.device) if self._fused else None

    def _fused_source(self):
        """(table as the fused pass reads it, its scales, sort the index first?) when the fused
        pass can read ``store``'s table on its device, else None (the split gather then)."""
        store = self.store
        if store.table.stride(-1) != 1:
            return None      # rows the pass cannot read as runs of elements
        if store.table.dtype not in _FUSED_TABLE_TYPES or self.dtype not in _FUSED_OUT_TYPES:
            return None      # types the pass does not cast between (float64, integers)
        if self.device.type == "cpu":
            table = store.table
            if table.device.type == "unified":
                table = torch_direct.cpu_alias(table)
            elif table.device.type != "cpu":
                return None
            return table, store.scale if self.scaled else None, False   # on the CPU there
        if not isinstance(store, UnifiedFeatureStore) or store.cpu_threads:
            return None      # a table the GPU cannot read in place, or the hybrid gather's CPU share
        table = torch_direct.cuda_alias(store.table, self.device.index)
        large = store.table.shape[0] * store.table.stride(0) * store.table.element_size() >= LARGE_TABLE_BYTES
        return table, store.scale, large

    @property
    def table(self):
        return self.store.table

    @property
    def row_bytes(self) -> int:
        return self.store.row_bytes

    @property
    def device_bytes(self) -> int:
        """The cache (its rows' scales too) and what the store it wraps copied to the device."""
        own = (self.cache,) if self._scale_shared else (self.cache, self.cache_scale)   # shared: counted once
        held = sum(t.numel() * t.element_size() for t in own if t is not None)
        return held + self.store.device_bytes

    def read(self, idx, device):
        if self.cache is None or device != self.device:
            return self.store.read(idx, device)
        if self._fused is not None:
            return self._read_fused(idx, device)
        return self.read_split(idx, device, self._take_hits, _put_misses)

    def splits(self, device) -> bool:
        """Whether a gather onto ``device`` takes the split path (:meth:`read_split`)."""
        return self.cache is not None and device == self.device and self._fused is None

    def read_split(self, idx, device, take_hits, put_misses):
        """The split gather, with what writes each part given: ``take_hits(idx, slot)`` returns
        the batch's rows with every hit written (``idx`` on the device; ``slot``, int64, each
        row's place in :attr:`cache`, -1 for a miss), before the misses are read;
        ``put_misses(out, miss, at, rows)`` writes the misses' rows (``rows``, read from the
        wrapped store as it returns them, of the table's rows ``at``, in address order where
        that store reads host memory) at their positions ``miss`` of ``out``. A store that
        unpacks what it gathers (4-bit rows) passes its own, so that neither part is written
        twice."""
        idx = idx.to(device, non_blocking=True)
        # a row's slot, -1 for a miss (a negative index, counted from the end, misses too)
        slot = (torch.where(idx < self.cache_rows, idx, -1) if self.slot is None else self.slot[idx]).long()
        t0 = time.perf_counter()
        miss = torch.nonzero(slot < 0).squeeze(1)   # one sync: the misses' count sizes their gather
        self.parts.add("lookup_wait", time.perf_counter() - t0)
        with self._count_lock:
            self.hits += idx.numel() - miss.numel()
            self.lookups += idx.numel()
        t0 = time.perf_counter()
        out = take_hits(idx, slot)
        self.parts.add("hits", time.perf_counter() - t0)   # on a GPU, the gather's wait for its bounds check
        if miss.numel():
            t0 = time.perf_counter()
            at = idx[miss]
            if self._sort_misses:   # each row still written at its own place: its position moves with it
                at, order = torch.sort(at)
                miss = miss[order]
            put_misses(out, miss, at, self.store.read(at, device))
            self.parts.add("misses", time.perf_counter() - t0)
        return out

    def _take_hits(self, idx, slot):
        # Every position reads the cache, a miss its row 0 (overwritten by the misses): one
        # gather writing the batch in order, where taking the hits apart would compact them and
        # scatter them back, a second pass over the batch's rows.
        at = slot.clamp(min=0)
        if self.cache_scale is None and self.cache.dtype == self.dtype:
            return take_rows(self.cache, at)   # rows as they are: one pass, and no wait on the device
        # one pass: each row read from the cache and cast (a float8 row scaled) as it is
        # written, where index_select and then a cast write the batch's rows twice (a float8
        # batch's through float32 buffers: four passes over the batch on the device); the
        # gather's bounds check waits for the lookup, which is all its stream holds
        return torch_direct.gather(self.cache, at, dtype=self.dtype, scale=self.cache_scale, order="as_is",
                                   index_bounds=self._slot_bounds)

    def _read_fused(self, idx, device):
        table, scale, sort = self._fused
        idx = idx.to(device, non_blocking=True)
        if device.type == "cpu" and idx.numel():
            lo, hi = torch.aminmax(idx)
            if lo < 0 or hi >= self.num_rows:
                bad = int(lo) if lo < 0 else int(hi)
                raise IndexError(f"gather: index {bad} is out of bounds for a table of {self.num_rows} rows")
        out = torch.empty(idx.numel(), self.dim, dtype=self.dtype, device=device)
        if idx.numel() == 0:
            return out
        pos = None
        if sort:
            idx, pos = torch.sort(idx)
        # On a GPU the pass counts into the store's counters with atomics; the CPU pass adds its
        # count once at its end, not atomically, so each CPU call counts apart, added here.
        counts = self._counts if device.type == "cuda" else torch.zeros_like(self._counts)
        _features.cached_gather(table, self.cache, self.slot, idx.contiguous(), pos, out, scale,
                                self.cache_scale, counts, getattr(self.store, "max_sms", None) or 0)
        with self._count_lock:
            self.lookups += out.shape[0]
            if counts is not self._counts:
                self._counts += counts
        return out

    def stats(self) -> dict:
        if self._counts is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)   # the passes queued on any stream have counted
            misses, bad = (int(v) for v in self._counts.tolist())
            self.hits = self.lookups - misses
            if bad:
                raise IndexError(f"gather: {bad} gathered rows lay outside the table of {self.num_rows} rows "
                                 f"(or past its cache); they were written as zeros")
        s = self.store.stats()
        s["cache_rows"] = self.cache_rows
        s["cached_share"] = self.cache_rows / self.num_rows if self.num_rows else 0.0  # of the table's rows
        s["device_share"] = self.device_share
        if self.cache is not None:
            s["cache_hit_rate"] = self.hits / self.lookups if self.lookups else 0.0
        return s

    def __repr__(self) -> str:
        return f"CachedFeatureStore({self.store!r}, cache_rows={self.cache_rows})"
