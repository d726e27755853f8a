"""Read OGB node-property data sets from their on-disk layout (no ogb or pandas needed).

OGB lays a data set out as ``<root>/<name with '-' -> '_'>/``::

    raw/edge.csv.gz            one "src,dst" line per edge
    raw/num-node-list.csv.gz   the node count
    raw/node-feat.csv.gz       one comma-separated feature row per node
    raw/node-label.csv.gz      one label per node
    raw/data.npz               binary sets (papers100M): edge_index, node_feat, num_nodes_list
    raw/node-label.npz         binary sets: node_label (float, NaN where unlabelled)
    split/<scheme>/{train,valid,test}.csv.gz   node ids, one per line

:func:`load_ogb` parses it once into a :class:`NodeDataset` saved under
``processed/torch_direct/`` beside it, and maps that on later calls.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from ..progress import progress
from .csr import CSRGraph

# name: (classes, split scheme); from OGB's master table of node-property sets.
OGB_NODE_SETS = {
    "ogbn-arxiv": (40, "time"),
    "ogbn-products": (47, "sales_ranking"),
    "ogbn-papers100M": (172, "time"),
}

_BLOCK = 64 << 20


def read_csv_gz(path, dtype, *, show_progress: bool = False) -> np.ndarray:
    """A numeric CSV (``.csv.gz`` or plain ``.csv``, no header) as a 2-D array; ``nan``
    entries parse for float dtypes. Parsed in blocks of whole lines."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    parts, width = [], None
    with opener(path, "rb") as f, progress(path.stat().st_size, f"reading {path.name}", show_progress) as bar:
        tail = b""
        raw = f.fileobj if hasattr(f, "fileobj") else f
        while True:
            block = f.read(_BLOCK)
            at_end = not block
            data = tail + block
            cut = len(data) if at_end else data.rfind(b"\n") + 1
            lines, tail = data[:cut], data[cut:]
            if lines.strip():
                if width is None:
                    first = lines.lstrip().split(b"\n", 1)[0]
                    width = first.count(b",") + 1
                text = lines.replace(b"\r", b"").replace(b"\n", b",").decode("ascii")
                parts.append(np.fromstring(text, dtype=dtype, sep=","))
            bar.update(raw.tell() - bar.n if hasattr(raw, "tell") else 0)
            if at_end:
                break
    values = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    width = width or 1
    if values.size % width:
        raise ValueError(f"{path}: {values.size} values do not form rows of {width} columns")
    return values.reshape(-1, width)


def ogb_dir(name: str, root) -> Path:
    """The data set's directory: ``root/<name with '-' -> '_'>``, or ``root`` itself when it holds ``raw/``."""
    root = Path(root).expanduser()
    if (root / "raw").is_dir():
        return root
    return root / name.replace("-", "_")


def _labels(values: np.ndarray) -> torch.Tensor:
    values = values.reshape(-1)
    if values.dtype.kind == "f":
        missing = np.isnan(values)
        values = np.where(missing, -1, values)
    return torch.from_numpy(values.astype(np.int64))


def read_ogb_raw(name: str, root, *, symmetrize: bool = True, show_progress: bool = True):
    """Parse the raw files into ``(graph, x, y, split, num_classes)`` without caching."""
    from .datasets import NodeDataset
    d = ogb_dir(name, root)
    raw = d / "raw"
    if not raw.is_dir():
        raise FileNotFoundError(f"{name}: no OGB data at {d} (expected {raw}/edge.csv.gz or {raw}/data.npz; "
                                f"download it with the ogb package or from OGB's site and pass root=)")
    if (raw / "data.npz").exists():
        with np.load(raw / "data.npz") as z:
            edge_index = torch.from_numpy(np.ascontiguousarray(z["edge_index"]).astype(np.int64))
            x = torch.from_numpy(np.ascontiguousarray(z["node_feat"]))
            num_nodes = int(np.asarray(z["num_nodes_list"]).sum())
        with np.load(raw / "node-label.npz") as z:
            y = _labels(z["node_label"])
    else:
        edges = read_csv_gz(raw / "edge.csv.gz", np.int64, show_progress=show_progress)
        if edges.shape[1] != 2:
            raise ValueError(f"{raw / 'edge.csv.gz'}: expected 2 columns, found {edges.shape[1]}")
        edge_index = torch.from_numpy(np.ascontiguousarray(edges.T))
        num_nodes = int(read_csv_gz(raw / "num-node-list.csv.gz", np.int64).sum())
        x = torch.from_numpy(read_csv_gz(raw / "node-feat.csv.gz", np.float32, show_progress=show_progress))
        y = _labels(read_csv_gz(raw / "node-label.csv.gz", np.float64))
    if x.size(0) != num_nodes or y.numel() != num_nodes:
        raise ValueError(f"{name}: {num_nodes} nodes but {x.size(0)} feature rows and {y.numel()} labels")
    graph = CSRGraph.from_edge_index(edge_index, num_nodes, symmetrize=symmetrize, dedupe=True,
                                     col_dtype=torch.int32 if num_nodes < 2**31 else torch.int64)
    del edge_index
    classes, scheme = OGB_NODE_SETS.get(name, (None, None))
    split_root = d / "split"
    schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
    if scheme not in schemes:
        if len(schemes) != 1:
            raise FileNotFoundError(f"{name}: expected one split scheme under {split_root}, found {schemes}")
        scheme = schemes[0]
    split = {}
    for part in ("train", "valid", "test"):
        f = split_root / scheme / f"{part}.csv.gz"
        if not f.exists():
            f = split_root / scheme / f"{part}.csv"
        split[part] = torch.from_numpy(read_csv_gz(f, np.int64).reshape(-1))
    if classes is None:
        classes = int(y.max()) + 1
    info = {"source": "ogb", "split_scheme": scheme, "symmetrized": symmetrize}
    return NodeDataset(name, graph, x, y, split, classes, info)


def load_ogb(name: str, root, *, symmetrize: bool = True, mmap: bool = True,
             show_progress: bool = True):
    """An OGB node-property data set: parsed from ``root`` once, then loaded from its cache.

    ``symmetrize`` adds reverse edges (what GNN training on these sets does;
    ogbn-products is stored one way and OGB itself adds them). Repeated edges
    are dropped. Unlabelled nodes (papers100M) get label -1.
    """
    from .datasets import NodeDataset, read_meta
    if root is None:
        raise ValueError(f"{name}: pass root= (the directory holding {name.replace('-', '_')}/)")
    d = ogb_dir(name, root)
    cache = d / "processed" / ("torch_direct" if symmetrize else "torch_direct_directed")
    if read_meta(cache) is None:
        ds = read_ogb_raw(name, root, symmetrize=symmetrize, show_progress=show_progress)
        ds.save(cache)
    return NodeDataset.load(cache, mmap=mmap)
