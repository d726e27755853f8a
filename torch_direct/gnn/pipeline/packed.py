"""A feature store over a table of 4-bit rows (``torch_direct.quantize_rows_int4``).

The packed table is an ordinary ``uint8`` table, so any store reads it as it reads any other:
the unified store's gather (its hybrid CPU share too), the CPU-centric and all-in-GPU stores,
a GPU cache of hot rows. :class:`Int4FeatureStore` wraps such a store of the packed bytes and
unpacks and scales each gathered batch of rows on the device they landed on, in one pass
(``_features.unpack_int4``, csrc/features/Int4Unpack.h: a kernel on a GPU).

    >>> q, scale = torch_direct.quantize_rows_int4(x)
    >>> store = make_int4_store("unified", q, scale, "cuda", torch.bfloat16, cache_bytes=1 << 30,
    ...                         degree=access_frequency(ds.graph, fanout=5))
    >>> rows = store.gather(n_id)   # [len(n_id), 2 * q.shape[1]] bfloat16 on cuda
"""
from __future__ import annotations

import torch

import torch_direct

from . import _features
from .cache import CachedFeatureStore, cache_bytes_within, check_cache_request
from .features import SCALED_OUT_DTYPES, FeatureStore, check_row_scale, make_feature_store

INT4_ROW_SCALE_BYTES = 4   # each row's float32 scale, held on the store's device for every row


class Int4FeatureStore(FeatureStore):
    """Rows of a 4-bit table: ``packed`` (a store over the ``uint8`` table, cached or not,
    returning the bytes as they are) gathers them, this store unpacks them and multiplies them
    by their rows' ``scale`` (one float32 a row, copied to the store's device once) as
    ``dtype`` (float32, float16 or bfloat16; default float32)."""

    def __init__(self, packed: FeatureStore, scale: torch.Tensor, dtype: torch.dtype | None = None):
        if not isinstance(packed, FeatureStore):
            raise TypeError(f"Int4FeatureStore: packed must be a FeatureStore, got {type(packed).__name__}")
        if packed.source_dtype != torch.uint8 or packed.dtype != torch.uint8:
            raise TypeError(f"Int4FeatureStore: packed must return the uint8 table's bytes as they are, got "
                            f"{packed.source_dtype} -> {packed.dtype}")
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in SCALED_OUT_DTYPES:
            raise TypeError(f"Int4FeatureStore: rows are read as float32, float16 or bfloat16, not {dtype}")
        check_row_scale(scale, packed.num_rows, "Int4FeatureStore")
        self.packed = packed
        self.kind = packed.kind
        self.device, self.num_rows, self.dim = packed.device, packed.num_rows, 2 * packed.dim
        self.source_dtype, self.dtype, self.scaled, self.bits = torch.uint8, dtype, True, 4
        host = torch_direct.cpu_alias(scale) if scale.device.type == "unified" else scale
        self.scale = host.to(self.device) if host.device != self.device else host
        self.parts = packed.parts   # the packed store's gathers are this store's

    @property
    def row_bytes(self) -> int:
        return self.packed.row_bytes + INT4_ROW_SCALE_BYTES

    @property
    def table(self) -> torch.Tensor:
        return self.packed.table

    def read(self, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        if isinstance(self.packed, CachedFeatureStore) and self.packed.splits(device):
            return self._read_cached(idx, device)
        rows = self.packed.read(idx, device).contiguous()
        scale = self.scale if self.scale.device == rows.device else self.scale.to(rows.device)
        out = torch.empty((rows.shape[0], self.dim), dtype=self.dtype, device=rows.device)
        # one pass: each byte's two values, times the scale its row's index names
        # (torch_direct.dequantize_rows_int4's arithmetic, bit for bit; a negative index names
        # its scale from the end, as the packed store reads its row)
        return _features.unpack_int4(rows, scale, idx.to(rows.device, non_blocking=True).contiguous(), out)

    def _read_cached(self, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        # The cache's split gather, each part unpacked where it lies: the hits straight from the
        # cache's rows, the misses from the rows the wrapped store read, each written once at
        # its place in the batch (where gathering the hits' bytes, scattering the misses' among
        # them and unpacking the whole took three passes over the batch's rows).
        scale = self.scale if self.scale.device == device else self.scale.to(device)
        cache = self.packed.cache

        def take_hits(at, slot):
            out = torch.empty((at.shape[0], self.dim), dtype=self.dtype, device=device)
            return _features.unpack_int4(cache, scale, at.contiguous(), out, rows_at=slot)

        def put_misses(out, miss, at, rows):
            _features.unpack_int4(rows.contiguous(), scale, at, out, out_at=miss)

        return self.packed.read_split(idx, device, take_hits, put_misses)

    @property
    def device_bytes(self) -> int:
        return self.packed.device_bytes + (self.scale.numel() * INT4_ROW_SCALE_BYTES if self.scale.device.type == "cuda" else 0)

    def stats(self) -> dict:
        return {**self.packed.stats(), "feature_bits": 4, "device_share": self.device_share}


def make_int4_store(kind: str, q: torch.Tensor, scale: torch.Tensor, device, dtype=None, *, cache_bytes: int = 0,
                    degree=None, cache_share: float | None = None, **kw) -> Int4FeatureStore:
    """:func:`make_feature_store` for a 4-bit table ``q`` with its row ``scale``
    (``torch_direct.quantize_rows_int4``). A cache of ``cache_bytes`` holds packed rows only,
    ``cache_bytes // (dim / 2)`` of them: every row's scale sits in the store's device memory
    beside it (4 bytes a row, read through the index as each batch is unpacked). ``cache_share``
    instead sizes the cache so that the store holds at most that share of the table's bytes
    (packed rows and scales) in device memory, the scales counted. Other keywords
    (``pin_inplace``, ``max_sms``, ``cpu_threads``, ``cpu_share``) go to the store of the packed
    bytes."""
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.dtype != torch.uint8:
        raise TypeError("make_int4_store: q must be the 2-D uint8 table of quantize_rows_int4, got "
                        + (f"{q.dtype} of shape {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__))
    # the scale and the cache's arguments are checked before the packed store copies the table
    # (gigabytes, maybe)
    check_row_scale(scale, q.shape[0], "make_int4_store")
    if cache_share is None:
        packed = make_feature_store(kind, q, device, torch.uint8, cache_bytes=cache_bytes, degree=degree, **kw)
        return Int4FeatureStore(packed, scale, dtype)
    degree = check_cache_request(kind, cache_bytes, cache_share, degree, q.shape[0], "make_int4_store")
    store = Int4FeatureStore(make_feature_store(kind, q, device, torch.uint8, **kw), scale, dtype)
    budget = cache_bytes_within(cache_share, store.table_bytes, store.device_bytes)
    # the scales stay where the first store put them
    return Int4FeatureStore(CachedFeatureStore(store.packed, budget, degree), store.scale, dtype) if budget else store
