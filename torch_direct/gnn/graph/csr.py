"""CSRGraph: a graph in compressed sparse rows whose arrays live on the CPU, a GPU or in unified memory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

_FORMAT = "torch_direct.csr/1"


def _as_index_tensor(t, name: str) -> torch.Tensor:
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(t)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"CSRGraph: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"CSRGraph: {name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"CSRGraph: {name} must be 1-D, got shape {tuple(t.shape)}")
    return t


def host_values(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with t's values (the same bytes when t is a unified tensor)."""
    if t.device.type == "cpu":
        return t
    if t.device.type == "unified":
        from torch_direct import cpu_alias
        return cpu_alias(t)
    return t.cpu()


class CSRGraph:
    """A directed graph in CSR form: row ``v`` lists the nodes that ``v`` aggregates from.

    ``rowptr`` (int64, ``num_nodes + 1``) and ``col`` (int32 or int64,
    ``num_edges``): the neighbours of ``v`` are ``col[rowptr[v]:rowptr[v+1]]``.
    ``edge_ids`` (optional, int64, ``num_edges``) gives, for each CSR slot, the
    id of that edge in the input it was built from (to look up edge features).

    The arrays can live on the CPU, a CUDA device or in unified memory
    (``graph.to("unified")``: pinned host memory that GPU samplers read in
    place). ``validate`` checks the structure once (monotone ``rowptr``,
    ``col`` within range); samplers rely on it.
    """

    def __init__(self, rowptr, col, edge_ids=None, *, num_nodes: int | None = None,
                 validate: bool = True):
        rowptr = _as_index_tensor(rowptr, "rowptr")
        col = _as_index_tensor(col, "col")
        if rowptr.dtype != torch.int64:
            raise TypeError(f"CSRGraph: rowptr must be int64 (edge counts can exceed 2^31), got {rowptr.dtype}")
        if rowptr.numel() == 0:
            raise ValueError("CSRGraph: rowptr needs num_nodes + 1 >= 1 entries, got 0")
        if num_nodes is not None and num_nodes != rowptr.numel() - 1:
            raise ValueError(f"CSRGraph: num_nodes={num_nodes} but rowptr has {rowptr.numel()} entries "
                             f"(expected num_nodes + 1)")
        if edge_ids is not None:
            edge_ids = _as_index_tensor(edge_ids, "edge_ids")
            if edge_ids.numel() != col.numel():
                raise ValueError(f"CSRGraph: edge_ids has {edge_ids.numel()} entries, col has {col.numel()}")
        devices = {t.device for t in (rowptr, col, edge_ids) if t is not None}
        if len(devices) != 1:
            raise ValueError(f"CSRGraph: rowptr, col and edge_ids must be on one device, got {sorted(map(str, devices))}")
        self.rowptr = rowptr
        self.col = col
        self.edge_ids = edge_ids
        if validate:
            self.validate()

    # -- structure -----------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.rowptr.device

    def validate(self) -> "CSRGraph":
        """Raise ValueError unless the arrays form a CSR graph (checked on the CPU, in place)."""
        rowptr, col = host_values(self.rowptr), host_values(self.col)
        n, e = self.num_nodes, self.num_edges
        if int(rowptr[0]) != 0 or int(rowptr[-1]) != e:
            raise ValueError(f"CSRGraph: rowptr must start at 0 and end at num_edges={e}, "
                             f"got {int(rowptr[0])} and {int(rowptr[-1])}")
        if n > 0 and bool((rowptr[1:] < rowptr[:-1]).any()):
            bad = int(torch.nonzero(rowptr[1:] < rowptr[:-1])[0])
            raise ValueError(f"CSRGraph: rowptr decreases at node {bad} ({int(rowptr[bad])} -> {int(rowptr[bad + 1])})")
        if e > 0:
            lo, hi = _chunked_minmax(col)
            if lo < 0 or hi >= n:
                raise ValueError(f"CSRGraph: col holds node {lo if lo < 0 else hi}, out of range for {n} nodes")
        return self

    def degree(self) -> torch.Tensor:
        """Number of neighbours of every node (int64, on the graph's device; CPU for unified)."""
        rowptr = host_values(self.rowptr) if self.device.type == "unified" else self.rowptr
        return rowptr[1:] - rowptr[:-1]

    def neighbors(self, v: int) -> torch.Tensor:
        """The neighbours of node ``v`` (a view of ``col`` on the CPU or the graph's device)."""
        if not -self.num_nodes <= v < self.num_nodes:
            raise IndexError(f"CSRGraph.neighbors: node {v} is out of range for {self.num_nodes} nodes")
        v = v % self.num_nodes
        rowptr = host_values(self.rowptr) if self.device.type == "unified" else self.rowptr
        col = host_values(self.col) if self.device.type == "unified" else self.col
        return col[int(rowptr[v]):int(rowptr[v + 1])]

    def to_edge_index(self) -> torch.Tensor:
        """``[2, num_edges]`` int64 edge list (row 0: source ``col``, row 1: target row), on the CPU."""
        deg = self.degree().cpu()
        dst = torch.repeat_interleave(torch.arange(self.num_nodes), deg)
        return torch.stack([host_values(self.col).cpu().long(), dst])

    # -- placement -------------------------------------------------------------------------------
    def to(self, device) -> "CSRGraph":
        """The same graph with its arrays on ``device`` ("cpu", "cuda[:k]" or "unified")."""
        device = torch.device(device)
        here = self.device
        if device.type == here.type and device.index in (None, here.index):
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return CSRGraph(move(self.rowptr), move(self.col), move(self.edge_ids), validate=False)

    def cpu(self) -> "CSRGraph":
        return self.to("cpu")

    def pin_inplace(self) -> "CSRGraph":
        """A unified graph over this CPU graph's own pages (no copy; see torch_direct.pin_inplace)."""
        from torch_direct import pin_inplace
        if self.device.type != "cpu":
            raise ValueError(f"CSRGraph.pin_inplace: the graph must be on the CPU, it is on {self.device}")
        pin = lambda t: None if t is None else pin_inplace(t.contiguous())  # noqa: E731
        return CSRGraph(pin(self.rowptr), pin(self.col), pin(self.edge_ids), validate=False)

    def __repr__(self) -> str:
        extra = ", edge_ids" if self.edge_ids is not None else ""
        return (f"CSRGraph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"col={self.col.dtype}{extra}, device={self.device})")

    # -- builders --------------------------------------------------------------------------------
    @classmethod
    def from_edge_index(cls, edge_index, num_nodes: int | None = None, *, by: str = "dst",
                        symmetrize: bool = False, dedupe: bool = False,
                        remove_self_loops: bool = False, keep_edge_ids: bool = False,
                        col_dtype: torch.dtype = torch.int64) -> "CSRGraph":
        """Build from a ``[2, E]`` edge list (row 0: sources, row 1: targets).

        ``by="dst"`` (default) makes row ``v`` list the sources of the edges into
        ``v``: what message passing aggregates, and what the samplers walk.
        ``by="src"`` lists out-neighbours instead. ``symmetrize`` adds every
        reverse edge; ``dedupe`` keeps one copy of repeated edges;
        ``remove_self_loops`` drops ``v -> v``. Each row's neighbours come out
        sorted. ``keep_edge_ids`` records each slot's column in ``edge_index``
        (a reverse edge added by ``symmetrize`` records the edge it mirrors).
        Runs on torch's CPU sort; memory is about 4 int64 words per edge.
        """
        if isinstance(edge_index, np.ndarray):
            edge_index = torch.from_numpy(edge_index)
        if not isinstance(edge_index, torch.Tensor):
            raise TypeError(f"from_edge_index: edge_index must be a tensor, got {type(edge_index).__name__}")
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"from_edge_index: edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        if edge_index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"from_edge_index: edge_index must be int32 or int64, got {edge_index.dtype}")
        if by not in ("dst", "src"):
            raise ValueError(f"from_edge_index: by must be 'dst' or 'src', got {by!r}")
        if col_dtype not in (torch.int32, torch.int64):
            raise TypeError(f"from_edge_index: col_dtype must be torch.int32 or torch.int64, got {col_dtype}")
        ei = host_values(edge_index).cpu().long()
        e_in = ei.size(1)
        lo = int(ei.min()) if e_in else 0
        hi = int(ei.max()) if e_in else -1
        if lo < 0:
            raise ValueError(f"from_edge_index: negative node id {lo}")
        if num_nodes is None:
            num_nodes = hi + 1
        elif hi >= num_nodes:
            raise ValueError(f"from_edge_index: node id {hi} is out of range for num_nodes={num_nodes}")
        if col_dtype == torch.int32 and num_nodes > 2**31 - 1:
            raise ValueError(f"from_edge_index: {num_nodes} nodes do not fit int32 col ids")
        row, col = (ei[1], ei[0]) if by == "dst" else (ei[0], ei[1])
        eid = torch.arange(e_in) if keep_edge_ids else None
        if symmetrize:
            row, col = torch.cat([row, col]), torch.cat([col, row])
            if eid is not None:
                eid = torch.cat([eid, eid])
        if remove_self_loops:
            keep = row != col
            row, col = row[keep], col[keep]
            if eid is not None:
                eid = eid[keep]
        key = row * max(num_nodes, 1) + col  # sorts by row, then neighbour
        del row, col
        if dedupe or eid is not None:
            key, order = torch.sort(key, stable=True)
            if eid is not None:
                eid = eid[order]
            del order
            if dedupe:
                first = torch.ones_like(key, dtype=torch.bool)
                first[1:] = key[1:] != key[:-1]
                key = key[first]
                if eid is not None:
                    eid = eid[first]
        else:
            key = torch.sort(key).values
        row = torch.div(key, max(num_nodes, 1), rounding_mode="floor")
        col = (key - row * max(num_nodes, 1)).to(col_dtype)
        counts = torch.bincount(row, minlength=num_nodes)
        rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=rowptr[1:])
        return cls(rowptr, col, eid, validate=False)

    # -- disk --------------------------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write the graph to directory ``path`` as ``.npy`` files plus ``meta.json``.

        ``load(path)`` maps the files instead of reading them, so a large graph
        opens at once and its pages are read on first touch.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        arrays = {"rowptr": self.rowptr, "col": self.col}
        if self.edge_ids is not None:
            arrays["edge_ids"] = self.edge_ids
        for name, t in arrays.items():
            save_npy(path / f"{name}.npy", host_values(t).cpu())
        meta = {"format": _FORMAT, "num_nodes": self.num_nodes, "num_edges": self.num_edges,
                "col_dtype": str(self.col.dtype).replace("torch.", ""),
                "edge_ids": self.edge_ids is not None}
        from ..outputs import write_json
        write_json(path / "meta.json", meta)   # atomic, with the provenance of the writer
        return path

    @classmethod
    def load(cls, path, *, mmap: bool = True, device=None, validate: bool = True) -> "CSRGraph":
        """Read a graph written by :meth:`save` (memory-mapped copy-on-write when ``mmap``)."""
        path = Path(path)
        meta_file = path / "meta.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"CSRGraph.load: {meta_file} does not exist (not a saved CSRGraph)")
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"CSRGraph.load: {path} has format {meta.get('format')!r}, expected {_FORMAT!r}")
        rowptr = load_npy(path / "rowptr.npy", mmap)
        col = load_npy(path / "col.npy", mmap)
        eid = load_npy(path / "edge_ids.npy", mmap) if meta.get("edge_ids") else None
        g = cls(rowptr, col, eid, validate=validate)
        if g.num_nodes != meta["num_nodes"] or g.num_edges != meta["num_edges"]:
            raise ValueError(f"CSRGraph.load: {path}'s arrays disagree with its meta.json")
        return g if device is None else g.to(device)


def _chunked_minmax(t: torch.Tensor, chunk: int = 1 << 26) -> tuple[int, int]:
    lo, hi = None, None
    for start in range(0, t.numel(), chunk):
        part = t[start:start + chunk]
        a, b = int(part.min()), int(part.max())
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    return lo, hi


def save_npy(path, t: torch.Tensor) -> None:
    """Write a CPU tensor as ``.npy`` (fp16/int/float dtypes numpy knows; bfloat16 as raw int16)."""
    t = t.contiguous()
    arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def load_npy(path, mmap: bool = True) -> torch.Tensor:
    """Read a ``.npy`` file as a tensor; ``mmap`` maps it copy-on-write instead of reading it."""
    arr = np.load(path, mmap_mode="c" if mmap else None)
    if arr.size == 0:
        return torch.from_numpy(np.array(arr))
    return torch.from_numpy(arr)
