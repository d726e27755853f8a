"""torch_direct.gather: rows of a (unified) table, on the index's device."""

from __future__ import annotations

import torch

from . import _C

_INDEX_DTYPES = (torch.int32, torch.int64)


_ORDERS = {"auto": 0, "sort": 1, "as_is": 2}
_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn


def hybrid_cpu_fraction(row_bytes: int, device: int | None = None, table_bytes: int = 0) -> float:
    """The CPU share a hybrid gather of rows of ``row_bytes`` from a table of ``table_bytes``
    would use now (0.25 before any hybrid call has measured the two paths' rates).

    Rates are kept per device, row size and table size class (below 8 GiB, or 8 GiB and
    more: on a large table each row read costs the GPU an address translation of its own,
    and its rate drops several times), so ``table_bytes`` picks the class; the gather counts
    a table's bytes as ``t.shape[0] * t.stride(0) * t.element_size()``. The default, 0,
    asks for the small class."""
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if isinstance(row_bytes, bool) or not isinstance(row_bytes, int) or row_bytes <= 0:
        raise ValueError(f"hybrid_cpu_fraction: row_bytes must be a positive int, got {row_bytes!r}")
    if isinstance(table_bytes, bool) or not isinstance(table_bytes, int) or table_bytes < 0:
        raise ValueError(f"hybrid_cpu_fraction: table_bytes must be an int >= 0, got {table_bytes!r}")
    return _C._hybrid_cpu_fraction(device, row_bytes, table_bytes)


def hybrid_gather_parts() -> dict[str, tuple[float, int]]:
    """Host seconds and calls of the parts of every hybrid gather (``gather`` with
    ``cpu_threads``) this process has run, summed over the threads that called it:
    ``{"hybrid_bounds_wait": (s, calls), ...}`` for the wait for the index's bounds check, the
    CPU threads' rows with their copies' launch (``hybrid_cpu_rows``), the wait for those
    copies (``hybrid_copy_wait``) and for the GPU part (``hybrid_gpu_wait``). Empty before the
    first hybrid gather, without CUDA, and on a fork wheel (which keeps no such counters).
    Differences between two calls time what ran between them."""
    try:
        counters = _C._hybrid_parts
    except AttributeError:   # a fork wheel's torch_direct._C
        return {}
    return {name: (float(s), int(n)) for name, (s, n) in counters().items()}


def gather(table: torch.Tensor, index: torch.Tensor, *, dtype: torch.dtype | None = None,
           scale: torch.Tensor | None = None, out: torch.Tensor | None = None, order: str = "auto",
           max_sms: int | None = None, cpu_threads: int = 0,
           cpu_fraction: float | None = None, index_bounds: tuple[int, int] | None = None) -> torch.Tensor:
    """Return ``table[index]`` cast to ``dtype``, on ``index``'s device.

    ``table`` is typically a unified tensor (host memory read in place);
    ``index`` is an int32/int64 CPU or CUDA tensor of any shape (negative
    values count from the end). The result has shape
    ``(*index.shape, *table.shape[1:])``. With ``out`` the rows are written
    into that caller-owned buffer (same shape, dtype and device) and ``out``
    is returned. Every index is checked before a row is read: a bad one raises
    ``IndexError`` naming it and the table's size.

    A CPU index gathers with CPU threads, the cast fused into each row's copy
    (placement rule R2). A CUDA index reads the rows in place from the GPU
    (rule R1) with a kernel that reads rows in address order: ``order="auto"``
    sorts an unsorted index of 4096 or more entries first (on large tables
    the GPU reads host memory far faster in address order), ``"sort"`` always
    sorts an unsorted index, ``"as_is"`` reads in the order given. Repeated
    rows are read once when adjacent in the order read. The cast is fused for
    float32/float16/bfloat16 pairs and from float8_e4m3fn to those.
    ``scale`` (a 1-D float32 tensor, one entry per table row) reads a
    float8_e4m3fn table as made by :func:`quantize_rows_fp8`: the result is
    ``table[index] * scale[index]`` as ``dtype`` (default float32), the upcast
    and the scaling done in the gather kernel itself on a CUDA index (there
    ``scale`` is unified or on the index's device). ``max_sms`` caps the streaming
    multiprocessors the kernel runs on (leave room for a training step
    beside it). The kernel runs on the current CUDA stream; the index check
    waits for the work queued before it on that stream.

    ``cpu_threads > 0`` (CUDA index, unified table) makes the gather hybrid:
    that many CPU threads gather the first part of the index into pinned
    memory, copied to the GPU on a side stream, while the GPU kernel reads
    the rest in place, so both paths move rows at once. The split comes from
    the rates measured in earlier hybrid calls for the same row size and table
    size class (below 8 GiB or not; see :func:`hybrid_cpu_fraction`), or is
    ``cpu_fraction`` when given. A hybrid call returns when its rows are on
    the GPU (with the experimental setting ``hybrid_copies=ordered``, once the
    copies of its CPU rows are queued, the current stream ordered after them).
    ``cpu_threads=0`` (the default) is purely GPU-centric.

    ``index_bounds=(lo, hi)`` states that every value of ``index`` lies in
    ``[lo, hi]`` (``0 <= lo <= hi``), as for an index the caller made itself (an
    arange, a clamp). On a CUDA index the GPU gather then checks those bounds
    against the table instead of passing over the index, and does not wait for
    the stream. An index outside them is then not detected: the kernel still
    reads no row outside the table (it skips such an entry, leaving its output
    row unwritten), so pass only bounds that hold by construction.
    ``order="auto"`` then sorts any index of 4096 or more entries (its order
    is not measured). Elsewhere (a
    CPU index, a hybrid gather, which waits for its index anyway) the bounds
    are checked against the table and every index is checked as usual.
    """
    if not isinstance(table, torch.Tensor) or not isinstance(index, torch.Tensor):
        raise TypeError("gather(table, index): both must be tensors, got "
                        f"{type(table).__name__} and {type(index).__name__}")
    if index.dtype not in _INDEX_DTYPES:
        raise TypeError(f"gather: index must be int32 or int64, got {index.dtype}")
    if index.device.type not in ("cpu", "cuda"):
        raise ValueError(f"gather: index must be on the CPU or a CUDA device, got {index.device}")
    if table.dim() == 0:
        raise ValueError("gather: table must have at least one dimension")
    if order not in _ORDERS:
        raise ValueError(f"gather: order must be one of {sorted(_ORDERS)}, got {order!r}")
    if max_sms is not None and (not isinstance(max_sms, int) or max_sms <= 0):
        raise ValueError(f"gather: max_sms must be a positive int, got {max_sms!r}")
    if not isinstance(cpu_threads, int) or cpu_threads < 0:
        raise ValueError(f"gather: cpu_threads must be an int >= 0, got {cpu_threads!r}")
    if cpu_fraction is not None and not 0.0 <= float(cpu_fraction) <= 1.0:
        raise ValueError(f"gather: cpu_fraction must be within [0, 1], got {cpu_fraction!r}")
    bounds = _check_index_bounds(index_bounds, table)
    if scale is not None:
        _check_scale(table, index, scale, dtype, cpu_threads)
        dtype = dtype or (out.dtype if out is not None else torch.float32)
    dtype = dtype or (out.dtype if out is not None else table.dtype)
    shape = (*index.shape, *table.shape[1:])
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=index.device)
    else:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gather: out must be a tensor, got {type(out).__name__}")
        problems = []
        if tuple(out.shape) != shape:
            problems.append(f"shape {tuple(out.shape)} (expected {shape})")
        if out.dtype != dtype:
            problems.append(f"dtype {out.dtype} (expected {dtype})")
        if out.device != index.device:
            problems.append(f"device {out.device} (expected the index's, {index.device})")
        if not out.is_contiguous():
            problems.append("non-contiguous layout")
        if problems:
            raise ValueError("gather: out has " + ", ".join(problems))
    flat = index.reshape(-1)
    rows_contiguous = table.shape[0] == 0 or table[0].is_contiguous()
    if scale is not None:
        if (index.device.type == "cuda" and rows_contiguous and _C._built_with_cuda()
                and (table.device.type == "unified" or table.device == index.device)):
            _C._gather_rows_scaled_cuda(table, flat, out.view(-1, *table.shape[1:]), scale.contiguous(),
                                        _ORDERS[order], max_sms or 0, bounds)
            return out
        # elsewhere: the float8 rows as they are, then upcast and scaled where they landed
        rows = gather(table, index, order=order, max_sms=max_sms)
        s = gather(scale, index, order=order, max_sms=max_sms)
        out.copy_((rows.to(torch.float32) * s.view(*index.shape, *([1] * (table.dim() - 1)))).to(dtype))
        return out
    if index.device.type == "cpu" and table.device.type == "unified" and rows_contiguous:
        _C._gather_rows_cpu(table, flat, out.view(-1, *table.shape[1:]))
        return out
    if (index.device.type == "cuda" and rows_contiguous and _C._built_with_cuda()
            and (table.device.type == "unified" or table.device == index.device)):
        fused = dtype == table.dtype or (dtype in _CASTABLE and table.dtype in _CASTABLE)
        target = out if fused else torch.empty(shape, dtype=table.dtype, device=index.device)
        if cpu_threads > 0 and table.device.type == "unified":
            frac = -1.0 if cpu_fraction is None else float(cpu_fraction)
            _C._gather_rows_hybrid(table, flat, target, cpu_threads, frac, _ORDERS[order],
                                   max_sms or 0)
        else:
            _C._gather_rows_cuda(table, flat, target, _ORDERS[order], max_sms or 0, bounds)
        if target is not out:
            out.copy_(target)
        return out
    if table.dtype == torch.float8_e4m3fn:
        # the rows as their bytes: torch before 2.7 indexes no float8 tensor on the CPU
        rows = torch.index_select(table.view(torch.uint8), 0, flat).view(table.dtype)
    else:
        rows = torch.index_select(table, 0, flat)
    out.copy_(rows.view(shape))
    return out


def _check_index_bounds(bounds, table) -> list[int] | None:
    """``index_bounds`` as the CUDA gathers take it, refused unless it is two ints with
    0 <= lo <= hi < the table's rows."""
    if bounds is None:
        return None
    if (not isinstance(bounds, (tuple, list)) or len(bounds) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in bounds)):
        raise TypeError(f"gather: index_bounds must be a pair of ints (lo, hi), got {bounds!r}")
    lo, hi = bounds
    if not 0 <= lo <= hi:
        raise ValueError(f"gather: index_bounds must satisfy 0 <= lo <= hi, got ({lo}, {hi})")
    if hi >= table.shape[0]:
        raise IndexError(f"gather: index_bounds' hi {hi} is out of bounds for a table of {table.shape[0]} rows")
    return [lo, hi]


def _check_scale(table, index, scale, dtype, cpu_threads) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"gather: scale must be a tensor, got {type(scale).__name__}")
    if table.dtype != FP8:
        raise TypeError(f"gather: scale= reads a float8_e4m3fn table (quantize_rows_fp8), got a {table.dtype} table")
    if scale.dtype != torch.float32 or scale.dim() != 1 or scale.shape[0] != table.shape[0]:
        raise ValueError(f"gather: scale must be a 1-D float32 tensor with one entry per table row "
                         f"({table.shape[0]}), got {scale.dtype} of shape {tuple(scale.shape)}")
    if dtype is not None and dtype not in _CASTABLE:
        raise TypeError(f"gather: a scaled gather returns float32, float16 or bfloat16, not {dtype}")
    if cpu_threads:
        raise ValueError("gather: cpu_threads does not apply to a scaled (float8) gather")
    if index.device.type == "cuda" and scale.device.type != "unified" and scale.device != index.device:
        raise ValueError(f"gather: with a CUDA index, scale must be unified or on {index.device}, "
                         f"got {scale.device}")
