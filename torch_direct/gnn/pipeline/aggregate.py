"""Mean aggregation over a sampled block's edges, the built-in GraphSAGE layer's message passing.

``mean_aggregate(x, src, dst, n_dst)[d]`` is the mean of the rows ``x[src[e]]`` over the edges
``e`` with ``dst[e] == d`` (zeros for a target without edges). The fused kernels
(``csrc/aggregate``) sum the rows straight into the output and scatter the gradient straight
into ``x``'s, where ``index_select`` + ``index_add_`` first copy every edge's row (on
papers100M-like the first layer's block has about a million edges: half a gigabyte written and
read back twice a step). Edges in any order give the same means; edges grouped by target, as
the samplers emit them, are the fast case.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _aggregate

IMPLEMENTATIONS = ("fused", "index_add")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class _FusedMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src, dst, n_dst, dtype):
        out, degree = _aggregate.mean_forward(x, src, dst, n_dst)   # float32 sums and degrees
        ctx.save_for_backward(degree, src, dst)
        ctx.n_src, ctx.x_dtype = x.size(0), x.dtype
        return out.to(dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        degree, src, dst = ctx.saved_tensors
        grad_x = _aggregate.mean_backward(grad_out.contiguous(), degree, src, dst, ctx.n_src)
        return grad_x.to(ctx.x_dtype), None, None, None, None


def index_add_mean(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n_dst: int) -> torch.Tensor:
    """The same means in stock torch ops (the reference, and the path for other devices and dtypes)."""
    agg = torch.zeros(n_dst, x.size(1), dtype=x.dtype, device=x.device).index_add_(0, dst, x.index_select(0, src))
    # Degrees by index_add, not bincount: bincount on a CUDA tensor reads its maximum back to
    # size the output, a host wait in every layer of every step.
    deg = torch.zeros(n_dst, dtype=x.dtype, device=x.device).index_add_(
        0, dst, torch.ones(dst.numel(), dtype=x.dtype, device=x.device))
    return agg / deg.clamp_(min=1).unsqueeze(1)


def fused_applies(x: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether the fused kernels take these inputs: float rows on the CPU, or on a GPU when
    the module was built with CUDA; int64 or int32 edges."""
    if x.dtype not in _FLOATS or src.dtype not in (torch.int64, torch.int32) or x.dim() != 2:
        return False
    return x.device.type == "cpu" or (x.device.type == "cuda" and _aggregate.has_cuda)


def mean_aggregate(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n_dst: int,
                   implementation: str = "fused", dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[n_dst, x.size(1)]`` means of ``x``'s rows over the edges ``src -> dst``, as ``dtype``
    (default ``x``'s; the fused kernels sum in float32 either way, so float16 rows can give
    float32 means without a float32 copy of the rows).

    ``implementation``: ``fused`` (the kernels, where :func:`fused_applies`; else the stock
    ops) or ``index_add`` (the stock ops). Differentiable in ``x``, once."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    n_dst, dtype = int(n_dst), dtype or x.dtype
    if implementation == "fused" and fused_applies(x, src):
        check_edges(x, src, dst, n_dst)
        return _FusedMean.apply(x, src, dst, n_dst, dtype)
    return index_add_mean(x.to(dtype), src, dst, n_dst)


def check_edges(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n_dst: int) -> None:
    """The fused kernels' inputs, refused with torch's error types before any work. The
    indices' range is read on the CPU only: on a GPU the kernels assert it, as torch's own
    index kernels do (reading it back would make the host wait in every layer)."""
    if src.dim() != 1 or dst.dim() != 1 or src.numel() != dst.numel():
        raise ValueError(f"mean_aggregate: src and dst must be one-dimensional and of one length, got shapes "
                         f"{tuple(src.shape)} and {tuple(dst.shape)}")
    if src.dtype != dst.dtype:
        raise TypeError(f"mean_aggregate: src and dst must both be int64 or both int32, got {src.dtype} and "
                        f"{dst.dtype}")
    if src.device != x.device or dst.device != x.device:
        raise ValueError(f"mean_aggregate: the edges are on {src.device} and {dst.device} but x on {x.device}")
    if n_dst < 0:
        raise ValueError(f"mean_aggregate: n_dst must be >= 0, got {n_dst}")
    if x.device.type == "cpu" and src.numel():
        for name, index, bound in (("src", src, x.size(0)), ("dst", dst, n_dst)):
            low, high = (int(v) for v in torch.aminmax(index))
            if low < 0 or high >= bound:
                raise IndexError(f"mean_aggregate: {name} holds {low if low < 0 else high}, outside [0, {bound})")
