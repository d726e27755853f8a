"""Node-classification data sets: synthetic presets sized like OGB's, OGB data from disk, and a cache.

    >>> ds = load_dataset("products-like")          # generated once, then mapped from the cache
    >>> ds = load_dataset("ogbn-products", root="~/ogb")   # OGB's own files, parsed once
    >>> ds.graph, ds.x, ds.y, ds.split["train"], ds.num_classes

The cache is ``$TORCH_DIRECT_DATA`` or ``~/.cache/torch_direct/datasets``
(``root=`` overrides it). A saved data set is a directory of ``.npy`` files
that loads memory-mapped, so even papers100M-like opens in a moment.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..outputs import write_json
from ..progress import progress
from .csr import CSRGraph, load_npy, save_npy

_FORMAT = "torch_direct.node_dataset/1"
# Bump when the generator changes what a preset produces: old caches are then regenerated.
GENERATOR_VERSION = 1
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Preset:
    """Size and shape of a synthetic graph. ``num_edges`` counts CSR entries
    (edges the samplers walk); ``split`` holds the train/valid/test fractions of
    all nodes (the rest are unlabelled for training purposes)."""

    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    dtype: torch.dtype
    split: tuple[float, float, float]
    homophily: float = 0.75      # fraction of a node's neighbours drawn from its own class
    signal: float = 0.3          # class-centroid norm relative to the per-row noise norm
                                 # (tuned so features alone give ~50% accuracy, + neighbours ~80%)
    power: float = 2.3           # exponent of the power-law degree tail
    max_degree: int = 50_000


# Shapes of OGB's ogbn-arxiv, ogbn-products and ogbn-papers100M (BENCHMARKS.md); split
# fractions follow theirs (papers100M labels ~1.4% of its nodes).
PRESETS: dict[str, Preset] = {
    "tiny": Preset(3_000, 30_000, 32, 8, torch.float32, (0.5, 0.2, 0.3), signal=0.3, max_degree=300),
    "arxiv-like": Preset(169_343, 1_166_243, 128, 40, torch.float32, (0.537, 0.176, 0.287), signal=0.25),
    "products-like": Preset(2_449_029, 61_859_140, 100, 47, torch.float32, (0.08, 0.016, 0.904),
                            signal=0.27),
    "papers100M-like": Preset(111_059_956, 1_615_685_872, 128, 172, torch.float16,
                              (0.01087, 0.00113, 0.00193), signal=0.35),
}


class NodeDataset:
    """A graph with node features ``x`` ``[N, F]``, labels ``y`` (int64 ``[N]``, -1
    where unknown), index splits ``split[name]`` (int64) and ``num_classes``."""

    def __init__(self, name: str, graph: CSRGraph, x: torch.Tensor, y: torch.Tensor,
                 split: dict[str, torch.Tensor], num_classes: int, info: dict | None = None):
        if x.size(0) != graph.num_nodes or y.numel() != graph.num_nodes:
            raise ValueError(f"NodeDataset: graph has {graph.num_nodes} nodes, x has {x.size(0)} rows, "
                             f"y has {y.numel()} labels")
        self.name, self.graph, self.x, self.y = name, graph, x, y
        self.split = dict(split)
        self.num_classes = int(num_classes)
        self.info = dict(info or {})

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v.numel()}" for k, v in self.split.items())
        return (f"NodeDataset({self.name!r}, nodes={self.num_nodes}, edges={self.graph.num_edges}, "
                f"features={self.num_features} {self.x.dtype}, classes={self.num_classes}, {sizes})")

    def save(self, path, *, write_features: bool = True) -> Path:
        """Write to directory ``path`` (``graph/``, ``x.npy``, ``y.npy``, ``split_*.npy``,
        ``meta.json``); ``write_features=False`` when ``x`` already maps ``path/x.npy``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.graph.save(path / "graph")
        if write_features:
            save_npy(path / "x.npy", self.x)
        save_npy(path / "y.npy", self.y)
        for k, v in self.split.items():
            save_npy(path / f"split_{k}.npy", v)
        meta = {"format": _FORMAT, "name": self.name, "num_classes": self.num_classes,
                "x_dtype": str(self.x.dtype).replace("torch.", ""), "splits": list(self.split),
                "info": self.info}
        write_json(path / "meta.json", meta)   # atomic, with the provenance of the writer
        return path

    @classmethod
    def load(cls, path, *, mmap: bool = True) -> "NodeDataset":
        path = Path(path)
        meta = read_meta(path)
        if meta is None:
            raise FileNotFoundError(f"NodeDataset.load: {path} holds no saved data set (no valid meta.json)")
        graph = CSRGraph.load(path / "graph", mmap=mmap, validate=False)
        x = load_npy(path / "x.npy", mmap)
        if meta["x_dtype"] == "bfloat16":
            x = x.view(torch.bfloat16)
        y = load_npy(path / "y.npy", mmap)
        split = {k: load_npy(path / f"split_{k}.npy", mmap) for k in meta["splits"]}
        return cls(meta["name"], graph, x, y, split, meta["num_classes"], meta.get("info"))


def read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads((Path(path) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if meta.get("format") == _FORMAT else None


def default_root() -> Path:
    """Where data sets are cached: ``$TORCH_DIRECT_DATA`` or ``~/.cache/torch_direct/datasets``."""
    env = os.environ.get("TORCH_DIRECT_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "torch_direct" / "datasets"


def load_dataset(name: str, root=None, *, seed: int = 0, regenerate: bool = False, mmap: bool = True,
                 show_progress: bool = True, workers: int | None = None) -> NodeDataset:
    """A preset (``tiny``, ``arxiv-like``, ``products-like``, ``papers100M-like``) or an
    OGB node-property data set (``ogbn-*``, read from ``root``).

    Presets are generated once per ``seed`` into ``root`` and loaded from there
    afterwards (``regenerate=True`` forces a new run). OGB data is parsed from
    its CSV/NPZ files once and cached beside them.
    """
    root = Path(root).expanduser() if root is not None else default_root()
    if name in PRESETS:
        path = root / f"{name}-seed{seed}"
        meta = read_meta(path)
        fresh = (meta is not None and meta.get("info", {}).get("generator_version") == GENERATOR_VERSION)
        if regenerate or not fresh:
            tmp = root / f".{name}-seed{seed}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            generate(name, seed=seed, path=tmp, show_progress=show_progress, workers=workers)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
        return NodeDataset.load(path, mmap=mmap)
    if name.startswith("ogbn-"):
        from .ogb import load_ogb
        return load_ogb(name, root, mmap=mmap, show_progress=show_progress)
    raise ValueError(f"unknown data set {name!r}: expected one of {sorted(PRESETS)} or an OGB name "
                     f"such as 'ogbn-arxiv'")


# -- the synthetic generator -----------------------------------------------------------------------
#
# Planted classes: every node gets a class; its features are its class centroid
# plus noise strong enough that features alone classify it poorly, and most of
# its neighbours come from its own class, so aggregating over the graph
# recovers the class (a GNN beats an MLP). In-degrees follow a power law;
# neighbours are drawn with a skewed popularity, so out-degrees are heavy-tailed
# too and some nodes are hot (what the GPU cache and reordering levers exploit).
# Work runs in fixed-size chunks, each with its own generator seeded from
# (seed, stage, chunk): results do not depend on the number of threads.

_NODE_CHUNK = 1 << 18


def _gen(seed: int, stage: int, chunk: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + stage) * 1_000_033 + chunk)


def _class_sizes(n: int, c: int) -> torch.Tensor:
    w = torch.arange(1, c + 1, dtype=torch.float64) ** -0.6  # mildly skewed, like real label sets
    sizes = torch.floor(w / w.sum() * n).long()
    sizes[0] += n - int(sizes.sum())
    return sizes


def _degrees(p: Preset, seed: int) -> torch.Tensor:
    """Power-law in-degrees summing to about ``num_edges`` (stochastic rounding)."""
    n = p.num_nodes
    g = _gen(seed, 1)
    u = torch.rand(n, generator=g, dtype=torch.float64).clamp_(min=1e-12)
    w = u.pow_(-1.0 / (p.power - 1.0))
    target = p.num_edges / n
    cap = min(p.max_degree, n - 1)
    scale = target / float(w.mean())
    for _ in range(3):  # re-scale after clipping the tail
        scale *= target / float((w * scale).clamp(max=cap).mean())
    d = (w * scale).clamp_(max=cap)
    r = torch.rand(n, generator=g, dtype=torch.float64)
    return (d.floor() + (r < d - d.floor())).long()


def _edges_chunk(start: int, deg: torch.Tensor, y: torch.Tensor, perm: torch.Tensor,
                 offsets: torch.Tensor, sizes: torch.Tensor, p: Preset, g: torch.Generator):
    """Neighbours of targets start..start+len(deg): (per-row counts, col as int32), each row
    sorted and free of repeats and self-loops."""
    n = p.num_nodes
    local = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    total = local.numel()
    target_class = y[local + start]
    other_class = y[torch.randint(n, (total,), generator=g)]  # a random node's class: size-weighted
    same = torch.rand(total, generator=g) < p.homophily
    cls = torch.where(same, target_class, other_class)
    # Popularity: position within the class's (random) member list, skewed to the front.
    pos = (torch.rand(total, generator=g, dtype=torch.float64).square_() * sizes[cls]).long()
    src = perm[offsets[cls] + torch.minimum(pos, sizes[cls] - 1)]
    del target_class, other_class, same, cls, pos
    key = local * n + src
    key = key[src != local + start]
    key = torch.unique(key, sorted=True)  # sorts by row, then neighbour; drops repeats
    row = torch.div(key, n, rounding_mode="floor")
    counts = torch.bincount(row, minlength=deg.numel())
    return counts, (key - row * n).to(torch.int32)


def generate(name: str, seed: int = 0, path=None, *, show_progress: bool = True,
             workers: int | None = None, preset: Preset | None = None) -> NodeDataset:
    """Generate preset ``name`` deterministically for ``seed``; with ``path``, write it
    there (features go straight to a memory-mapped file) and return the loaded set."""
    p = preset or PRESETS.get(name)
    if p is None:
        raise ValueError(f"unknown preset {name!r}: expected one of {sorted(PRESETS)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    workers = workers or max(1, min(os.cpu_count() or 1, 16))
    n, c, f = p.num_nodes, p.num_classes, p.num_features
    sizes = _class_sizes(n, c)
    offsets = torch.zeros(c, dtype=torch.long)
    offsets[1:] = torch.cumsum(sizes, 0)[:-1]
    perm = torch.randperm(n, generator=_gen(seed, 0))
    y = torch.empty(n, dtype=torch.long)
    y[perm] = torch.repeat_interleave(torch.arange(c), sizes)
    deg = _degrees(p, seed)

    chunks = list(range(0, n, _NODE_CHUNK))
    col = torch.empty(int(deg.sum()), dtype=torch.int32)
    counts = torch.empty(n, dtype=torch.long)
    filled = 0
    with ThreadPoolExecutor(workers) as pool, progress(len(chunks), f"{name}: edges", show_progress) as bar:
        def job(i):
            s = chunks[i]
            return _edges_chunk(s, deg[s:s + _NODE_CHUNK], y, perm, offsets, sizes, p, _gen(seed, 2, i))
        window = 2 * workers
        futures = {i: pool.submit(job, i) for i in range(min(window, len(chunks)))}
        for i, s in enumerate(chunks):
            cnt, cols = futures.pop(i).result()
            if i + window < len(chunks):
                futures[i + window] = pool.submit(job, i + window)
            counts[s:s + cnt.numel()] = cnt
            col[filled:filled + cols.numel()] = cols
            filled += cols.numel()
            bar.update(1)
    del perm
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=rowptr[1:])
    graph = CSRGraph(rowptr, col[:filled], validate=False)

    # Features: centroid of the node's class plus isotropic noise of unit norm per row.
    centroids = torch.randn(c, f, generator=_gen(seed, 3)) * (p.signal / math.sqrt(f))
    noise_std = 1.0 / math.sqrt(f)
    if path is not None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16}[p.dtype]
        x_np = np.lib.format.open_memmap(path / "x.npy", mode="w+", dtype=np_dtype, shape=(n, f))
        x = torch.from_numpy(x_np)
    else:
        x = torch.empty(n, f, dtype=p.dtype)
    with ThreadPoolExecutor(workers) as pool, progress(len(chunks), f"{name}: features", show_progress) as bar:
        def feat(i):
            s = chunks[i]
            e = min(n, s + _NODE_CHUNK)
            rows = torch.randn(e - s, f, generator=_gen(seed, 4, i)).mul_(noise_std)
            x[s:e] = rows.add_(centroids[y[s:e]])
        for _ in pool.map(feat, range(len(chunks))):
            bar.update(1)

    order = torch.randperm(n, generator=_gen(seed, 5))
    split, at = {}, 0
    for key, frac in zip(SPLITS, p.split):
        k = int(round(frac * n))
        split[key] = order[at:at + k].sort().values
        at += k
    del order
    info = {"preset": name, "seed": seed, "generator_version": GENERATOR_VERSION,
            "homophily": p.homophily, "signal": p.signal, "power": p.power}
    ds = NodeDataset(name, graph, x, y, split, c, info)
    if path is None:
        return ds
    x_np.flush()
    ds.save(path, write_features=False)
    del ds, x, x_np
    return NodeDataset.load(path)
