"""Feature tables with fewer bytes a row: float8 rows (``quantize_rows_fp8``, read by the gather's
``scale=``) and 4-bit rows (``quantize_rows_int4``, read as bytes and unpacked by
``dequantize_rows_int4``), each row with a float32 scale.

A 4-bit row ``x[i]`` of ``dim`` values is held as ``dim / 2`` bytes: value ``j`` is the integer
``v = round(x[i, j] / scale[i])`` in [-7, 7], stored as ``v + 8`` in the low four bits of byte
``j // 2`` for even ``j`` and in the high four bits for odd ``j``; ``scale[i] = max(|x[i]|) / 7``
(1 for a row of zeros). Such a table is an ordinary ``uint8`` tensor, so every gather moves its
rows as bytes (a unified table's too, the hybrid gather's CPU share included); the rows are
unpacked and scaled after the gather, where they landed. Against float8 rows it halves the bytes
a row takes again, at a larger rounding error (about a tenth of a row's magnitude against 2-3%).
"""
from __future__ import annotations

import torch

from . import _C
from ._gather import _CASTABLE, FP8

FP8_MAX = float(torch.finfo(FP8).max)   # 448
INT4_MAX = 7   # the largest magnitude a 4-bit value takes: symmetric, so zero is exact


def _quantize(who: str, x, encode, q_cols: int, q_dtype, limit: float, device, compute, chunk_rows, progress):
    """The chunked loop both quantizers share: each chunk of rows in float32 on ``compute``,
    its scales ``max|row| / limit`` (1 for a row of zeros), ``encode(rows / scale)`` written to
    ``q`` ([rows, q_cols] of q_dtype on ``device``)."""
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows <= 0:
        raise ValueError(f"{who}: chunk_rows must be a positive int, got {chunk_rows!r}")
    device = torch.device(device) if device is not None else x.device
    if compute is None:
        compute = torch.device("cuda", torch.cuda.current_device()) if (
            torch.cuda.is_available() and _C._built_with_cuda()) else torch.device("cpu")
    compute = torch.device(compute)
    if compute.type not in ("cpu", "cuda"):
        raise ValueError(f"{who}: compute must be 'cpu' or a CUDA device, got {compute}")
    src = _C._as_cpu_alias(x) if x.device.type == "unified" else x
    q = torch.empty((x.shape[0], q_cols), dtype=q_dtype, device=device)
    scale = torch.empty(x.shape[0], dtype=torch.float32, device=device)
    q_w = _C._as_cpu_alias(q) if device.type == "unified" else q
    s_w = _C._as_cpu_alias(scale) if device.type == "unified" else scale
    on_gpu = compute.type == "cuda"
    for b in range(0, x.shape[0], chunk_rows):
        e = min(b + chunk_rows, x.shape[0])
        part = src[b:e].to(compute, non_blocking=on_gpu).to(torch.float32)
        amax = part.abs().amax(dim=1)
        if not bool(torch.isfinite(amax).all()):
            bad = b + int(torch.nonzero(~torch.isfinite(amax))[0, 0])
            raise ValueError(f"{who}: row {bad} holds a non-finite value")
        s = torch.where(amax > 0, amax / limit, torch.ones_like(amax))
        q_w[b:e].copy_(encode(part / s.unsqueeze(1)))
        s_w[b:e].copy_(s)
        if progress is not None:
            progress(e)
    if on_gpu:
        torch.cuda.synchronize(compute)
    return q, scale


def _check_row_scale(scale, rows: int, who: str) -> None:
    """Refuse anything but a 1-D float32 tensor of ``rows`` entries as a table's row scales."""
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or scale.dim() != 1 or scale.shape[0] != rows:
        raise ValueError(f"{who}: scale must be a 1-D float32 tensor with one entry per row ({rows}), got "
                         + (f"{scale.dtype} of shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor)
                            else type(scale).__name__))


def _check_x(x, who: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError(f"{who}: x must be a 2-D floating tensor, got "
                        + (f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor)
                           else type(x).__name__))


def quantize_rows_fp8(x: torch.Tensor, *, device=None, compute=None, chunk_rows: int = 1 << 16,
                      progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: the rows of ``x`` as float8_e4m3fn with a float32 scale per row.

    ``scale[i] = max(|x[i]|) / 448`` (448 is e4m3's largest value; 1 for a row of zeros) and
    ``q[i] = x[i] / scale[i]`` rounded to e4m3, so ``q[i].float() * scale[i]`` is ``x[i]``
    to e4m3's 3 mantissa bits (a relative error of at most 1/16 per entry, and exact zeros).
    A table so stored takes a quarter of float32's bytes and half of float16's; read it with
    ``gather(q, index, scale=scale, dtype=...)``.

    ``x``: a 2-D floating tensor (CPU, unified or CUDA). ``q`` and ``scale`` are made on
    ``device`` (default ``x``'s device; ``"unified"`` puts a CPU table's result in unified
    memory). Rows are converted ``chunk_rows`` at a time on ``compute`` (default: the GPU
    when one is usable, else the CPU), so memory beyond the result stays bounded.
    ``progress(rows_done)`` is called after each chunk. A non-finite value raises
    ValueError naming its row, before the result is returned.
    """
    _check_x(x, "quantize_rows_fp8")
    return _quantize("quantize_rows_fp8", x, lambda r: r.clamp_(-FP8_MAX, FP8_MAX).to(FP8), x.shape[1], FP8,
                     FP8_MAX, device, compute, chunk_rows, progress)


def quantize_rows_int4(x: torch.Tensor, *, device=None, compute=None, chunk_rows: int = 1 << 16,
                       progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: the rows of ``x`` as 4-bit integers, two a byte, with a float32 scale per
    row (the module's docstring gives the layout). ``q`` is ``uint8`` of shape
    ``[rows, dim / 2]``; ``dequantize_rows_int4(q, scale)`` gives the rows back to within half
    a step (``scale / 2``) a value.

    ``x``: a 2-D floating tensor (CPU, unified or CUDA) with an even number of columns. The
    other arguments are :func:`quantize_rows_fp8`'s.
    """
    _check_x(x, "quantize_rows_int4")
    if x.shape[1] % 2:
        raise ValueError(f"quantize_rows_int4: two values share a byte, so a row needs an even number of "
                         f"values, got {x.shape[1]}")

    def encode(r):
        v = (r.round_().clamp_(-INT4_MAX, INT4_MAX) + 8).to(torch.uint8)   # 1..15
        return v[:, 0::2] | (v[:, 1::2] << 4)
    return _quantize("quantize_rows_int4", x, encode, x.shape[1] // 2, torch.uint8, INT4_MAX,
                     device, compute, chunk_rows, progress)


def dequantize_rows_int4(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The rows that ``q`` packs (``quantize_rows_int4``), times their ``scale``, as ``dtype``
    (float32, float16 or bfloat16): ``[rows, 2 * q.shape[1]]`` on ``q``'s device. ``q`` is the
    whole table or rows of it (gathered as bytes), ``scale`` a float32 entry for each of its
    rows on the same device. Computed in float32 with ATen's ops, so it runs wherever ``q`` is."""
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.dtype != torch.uint8:
        raise TypeError("dequantize_rows_int4: q must be a 2-D uint8 tensor of packed rows (quantize_rows_int4), got "
                        + (f"{q.dtype} of shape {tuple(q.shape)}" if isinstance(q, torch.Tensor)
                           else type(q).__name__))
    _check_row_scale(scale, q.shape[0], "dequantize_rows_int4")
    if scale.device != q.device:
        raise ValueError(f"dequantize_rows_int4: scale is on {scale.device}, the rows on {q.device}")
    if dtype not in _CASTABLE:
        raise TypeError(f"dequantize_rows_int4: rows are read as float32, float16 or bfloat16, not {dtype}")
    nibbles = torch.stack((q & 15, q >> 4), dim=2).view(q.shape[0], 2 * q.shape[1])
    return ((nibbles.to(torch.float32) - 8) * scale.unsqueeze(1)).to(dtype)
