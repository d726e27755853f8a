"""The models of the training loop: GraphSAGE, GAT and GIN over the blocks of a sampled batch,
their optimizer, and the arithmetic precision a run uses.

PyG's convs when torch_geometric is installed (``layers="pyg"``), else a built-in GraphSAGE
(mean aggregation in the fused kernels of ``aggregate.py``, CPU and CUDA) so training runs anywhere.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch import nn
import torch.nn.functional as F

from .aggregate import IMPLEMENTATIONS, fused_applies, mean_aggregate, relu_dropout, sage_input

MODELS = ("sage", "gat", "gin")
LAYERS = ("auto", "pyg", "builtin")   # --layers: PyG's convs when installed, PyG's, or the built-in SAGE
PRECISIONS = ("fp32", "tf32", "bf16")


def have_pyg() -> bool:
    import warnings
    try:
        with warnings.catch_warnings():  # PyG's import-time deprecation notices are not ours to show
            warnings.simplefilter("ignore", FutureWarning)
            import torch_geometric.nn  # noqa: F401
    except ImportError:
        return False
    return True


class SAGELayer(nn.Module):
    """GraphSAGE with mean aggregation on a bipartite block: the fused mean (:mod:`.aggregate`)
    and two linear layers: ``out = W_l mean_{u in N(v)} x_u + W_r x_v``. ``aggregate``:
    ``fused`` or ``index_add`` (:func:`.aggregate.mean_aggregate`)."""

    def __init__(self, in_dim: int, out_dim: int, aggregate: str = "fused"):
        super().__init__()
        if aggregate not in IMPLEMENTATIONS:
            raise ValueError(f"aggregate must be one of {', '.join(IMPLEMENTATIONS)}, got {aggregate!r}")
        self.lin_l = nn.Linear(in_dim, out_dim)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)
        self.aggregate = aggregate

    def forward(self, x, edge_index, size):
        n_dst = size[1]
        if self.aggregate == "fused" and fused_applies(x, edge_index[0]):
            # [mean, x_v, 1] @ [W_l, W_r, b]^T: one matmul, the bias's gradient inside the weight's
            # product; the matrix made in the autocast dtype, so that autocast casts only the weights
            device_type = x.device.type
            dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
                     else torch.promote_types(x.dtype, self.lin_l.weight.dtype))
            a = sage_input(x, edge_index[0], edge_index[1], n_dst, dtype)
            w_l = self.lin_l.weight
            pad = a.size(1) - 2 * w_l.size(1) - 1
            w = torch.cat([w_l, self.lin_r.weight, self.lin_l.bias.unsqueeze(1), w_l.new_zeros(w_l.size(0), pad)], 1)
            return F.linear(a, w)
        # float16 or bfloat16 rows (the feature table's own) meet float32 weights as float32
        dtype = torch.promote_types(x.dtype, self.lin_l.weight.dtype)
        agg = mean_aggregate(x, edge_index[0], edge_index[1], n_dst, self.aggregate, dtype=dtype)
        out, x_dst = self.lin_l(agg), x[:n_dst].to(dtype)
        if torch.is_autocast_enabled(x.device.type) or out.dtype != x_dst.dtype:
            return out + self.lin_r(x_dst)
        # W_r x_v added by the second matmul itself: no second [n_dst, out] product, no add
        return out.addmm_(x_dst, self.lin_r.weight.t())


class PyGLayer(nn.Module):
    """A PyG conv applied to a bipartite block ``(x, x[:n_dst])``, plus an optional skip
    (GAT without self-loops keeps the target's own features through it)."""

    def __init__(self, conv: nn.Module, skip: nn.Module | None = None):
        super().__init__()
        self.conv, self.skip = conv, skip

    def forward(self, x, edge_index, size):
        x_dst = x[:size[1]]
        out = self.conv((x, x_dst), edge_index)
        return out if self.skip is None else out + self.skip(x_dst)


def use_pyg_for(layers: str) -> bool | None:
    """``GNN``'s ``use_pyg`` for a ``--layers`` choice (None: PyG's when installed); ``pyg``
    without torch_geometric is refused here, before any data is loaded."""
    if layers not in LAYERS:
        raise ValueError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    use_pyg = {"auto": None, "pyg": True, "builtin": False}[layers]
    if use_pyg and not have_pyg():
        raise ValueError("--layers pyg: torch_geometric is not installed (pip install torch_geometric)")
    return use_pyg


def make_layer(model: str, in_dim: int, out_dim: int, last: bool, use_pyg: bool) -> nn.Module:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: expected one of {', '.join(MODELS)}")
    if not use_pyg:
        if model != "sage":
            raise RuntimeError(f"--model {model} needs torch_geometric (pip install torch_geometric); "
                               f"without it only the built-in 'sage' is available")
        return SAGELayer(in_dim, out_dim)
    from torch_geometric.nn import GATConv, GINConv, SAGEConv
    if model == "sage":
        return PyGLayer(SAGEConv((in_dim, in_dim), out_dim))
    if model == "gat":
        heads = 1 if last or out_dim % 4 else 4
        conv = GATConv((in_dim, in_dim), out_dim // heads, heads=heads, add_self_loops=False)
        return PyGLayer(conv, nn.Linear(in_dim, out_dim, bias=False))
    mlp = nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))
    return PyGLayer(GINConv(mlp, train_eps=True))


def make_optimizer(model: nn.Module, lr: float, capturable: bool = False) -> torch.optim.Optimizer:
    """Adam over ``model``'s parameters; with every parameter on a CUDA device, the fused
    implementation (one kernel per step for all of them, where the default launches several per
    group: a 3-layer GraphSAGE step on papers100M-like is a few milliseconds, much of it launch
    overhead). Elsewhere torch's default implementation. ``capturable``: its state on the
    device, so that its step can be captured in a CUDA graph (``train --cuda-graph``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    if fused:
        return torch.optim.Adam(params, lr=lr, fused=True, capturable=capturable)
    return torch.optim.Adam(params, lr=lr)


def known_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def check_precision(precision: str, device) -> torch.device:
    """Refuse a precision the device cannot run (before any data is loaded); the device."""
    known_precision(precision)
    device = torch.device(device)
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(f"--precision tf32 needs a CUDA device (TF32 is a GPU tensor-core format), not {device}")
    return device


@contextmanager
def model_precision(precision: str, device):
    """The run-wide side of ``precision`` (see :class:`GNN` for bf16): with ``tf32``, float32
    matmuls run on TF32 tensor cores inside the block (``torch.set_float32_matmul_precision
    ("high")``, restored on exit; CUDA only); ``fp32`` and ``bf16`` change nothing here."""
    device = check_precision(precision, device)
    if precision != "tf32":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class GNN(nn.Module):
    """``num_layers`` message-passing layers over the blocks of a sampled batch
    (``adjs`` in model order); ReLU and dropout between layers."""

    def __init__(self, model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 dropout: float = 0.5, use_pyg: bool | None = None, precision: str = "fp32"):
        super().__init__()
        self.precision = known_precision(precision)
        use_pyg = have_pyg() if use_pyg is None else use_pyg
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(make_layer(model, dims[i], dims[i + 1], i == num_layers - 1, use_pyg)
                                    for i in range(num_layers))
        self.dropout = dropout
        self.backend = "pyg" if use_pyg else "builtin"

    def autocast(self, device):
        """The context of this model's arithmetic on ``device``: with precision ``bf16``,
        autocast to bfloat16 (matmuls and linear layers in bfloat16, weights float32). Without
        autocast's cache of the weights' bfloat16 copies: each weight is read once a forward
        pass, so the cache saves nothing, and a step captured as a CUDA graph must cast its
        weights inside the graph (PyTorch's CUDA-graph notes ask for ``cache_enabled=False``)."""
        if self.precision == "bf16":
            return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False)
        return nullcontext()

    def forward(self, x, adjs):
        """Logits of the batch's seeds, float32 whatever the precision."""
        if len(adjs) != len(self.layers):
            raise ValueError(f"GNN: {len(self.layers)} layers but the batch has {len(adjs)} blocks")
        with self.autocast(x.device):
            x = self._layers(x, adjs)
        return x.float()

    def _layers(self, x, adjs):
        for i, (edge_index, _, size) in enumerate(adjs):
            x = self.layers[i](x, edge_index, size)
            if i < len(self.layers) - 1:
                x = relu_dropout(x, self.dropout, self.training)
        return x
