"""torch_direct.gather: rows of a (unified) table, on the index's device."""

from __future__ import annotations

import torch

from . import _C

_INDEX_DTYPES = (torch.int32, torch.int64)


def gather(table: torch.Tensor, index: torch.Tensor, *, dtype: torch.dtype | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
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
    (rule R1).
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
    if index.device.type == "cpu" and table.device.type == "unified" and rows_contiguous:
        _C._gather_rows_cpu(table, flat, out.view(-1, *table.shape[1:]))
        return out
    rows = torch.index_select(table, 0, flat)
    out.copy_(rows.view(shape))
    return out
