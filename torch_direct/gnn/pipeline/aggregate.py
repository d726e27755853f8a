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
        return _grad_of_x(ctx, grad_out.contiguous())


def _grad_of_x(ctx, grad_means, grad_own=None):
    """The backward of the functions below: each target's mean's gradient scattered to its
    sources' rows, plus ``grad_own`` (the targets' own rows' gradient, if any) on x's first
    rows, summed in float32 and cast to x's dtype once; Nones for the other inputs."""
    if not ctx.needs_input_grad[0]:
        return None, None, None, None, None
    degree, src, dst = ctx.saved_tensors
    grad_x = _aggregate.mean_backward(grad_means, degree, src, dst, ctx.n_src)
    if grad_own is not None:
        grad_x[:grad_own.size(0)].add_(grad_own)
    return grad_x.to(ctx.x_dtype), None, None, None, None


class _SAGEInput(torch.autograd.Function):
    """``[mean, x[:n_dst], 1, 0...]`` as one ``[n_dst, sage_input_width(F)]`` matrix in ``dtype``
    (see :func:`sage_input`). Backward: the means' gradient scattered as in :class:`_FusedMean`
    and the targets' own rows' gradient added into the same float32 buffer, one cast at the end."""

    @staticmethod
    def forward(ctx, x, src, dst, n_dst, dtype):
        means, degree = _aggregate.mean_forward(x, src, dst, n_dst)   # float32
        f = x.size(1)
        out = torch.empty(n_dst, sage_input_width(f), dtype=dtype, device=x.device)
        out[:, :f].copy_(means)
        out[:, f:2 * f].copy_(x[:n_dst])
        out[:, 2 * f:].zero_()
        out[:, 2 * f].fill_(1)
        ctx.save_for_backward(degree, src, dst)
        ctx.n_src, ctx.x_dtype, ctx.f = x.size(0), x.dtype, f
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        f = ctx.f
        return _grad_of_x(ctx, grad_out[:, :f].contiguous(), grad_out[:, f:2 * f])


def sage_input_width(features: int) -> int:
    """Columns of :func:`sage_input`'s matrix for rows of ``features``: the means, the targets'
    own rows, a column of ones and zeros up to a multiple of 8 (aligned rows for the matmul)."""
    return 2 * features + 8 - (2 * features) % 8


def sage_input(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n_dst: int,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """GraphSAGE's two inputs and its bias term side by side: ``[n_dst, sage_input_width(F)]``
    holding ``mean_aggregate(x, src, dst, n_dst)``, then ``x[:n_dst]``, then ones, then zeros,
    as ``dtype`` (default ``x``'s). ``W_l mean + W_r x_v + b`` is then one matmul of this
    matrix with ``[W_l, W_r, b, 0]``: one product where there were two, no sum of their outputs,
    and the bias's gradient comes out of the weight's product instead of a column sum of the
    output's gradient. Float rows with the fused kernels only (:func:`fused_applies`).
    Differentiable in ``x``, once."""
    n_dst, dtype = int(n_dst), dtype or x.dtype
    if not fused_applies(x, src):
        raise ValueError(f"sage_input: needs float32/float16/bfloat16 rows and int32/int64 edges on the CPU or "
                         f"a CUDA device with the fused kernels, got {x.dtype} rows on {x.device}")
    check_edges(x, src, dst, n_dst)
    if n_dst > x.size(0):
        raise ValueError(f"sage_input: n_dst ({n_dst}) is more than x's {x.size(0)} rows (targets come first)")
    return _SAGEInput.apply(x, src, dst, n_dst, dtype)


class _ReluDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        out = _aggregate.relu_dropout_forward(x, p)
        ctx.save_for_backward(out)
        ctx.p = p
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (out,) = ctx.saved_tensors
        return _aggregate.relu_dropout_backward(grad_out.contiguous(), out, ctx.p), None


def relu_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(F.relu(x), p, training)``. On a CUDA device, in training, one kernel each way
    (``csrc/aggregate/ReluDropout.h``): the output itself marks what passed, so no mask is kept
    and the activation is read and written once per pass, not twice. Its random numbers come
    from the default CUDA generator (``torch.manual_seed`` repeats them), but not the same ones
    as ``F.dropout``'s. Elsewhere, and for other dtypes, the two torch functions."""
    if not 0 <= p <= 1:
        raise ValueError(f"relu_dropout: p must be in [0, 1], got {p}")
    if training and 0 < p < 1 and x.is_cuda and x.dtype in _FLOATS and _aggregate.has_cuda:
        return _ReluDropout.apply(x, p)
    return torch.nn.functional.dropout(torch.relu(x), p=p, training=training)


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
