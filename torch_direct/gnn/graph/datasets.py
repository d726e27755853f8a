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
from . import synthetic
from .csr import CSRGraph, load_npy, save_npy
from .synthetic import Classes, chunk_generator, symmetric_graph

_FORMAT = "torch_direct.node_dataset/1"
# Bump when the generator changes what a preset produces: old caches are then regenerated.
GENERATOR_VERSION = 2
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Preset:
    """Size and shape of a synthetic graph.

    ``num_edges`` counts CSR entries of the symmetric graph (twice its undirected
    edges: what the samplers walk). ``split`` gives the train/valid/test sizes as
    node counts (ints), or as fractions of ``num_nodes`` (floats); the other nodes
    are unlabelled for training purposes. The knobs set how hard the labels are:
    ``signal`` (features alone), ``homophily`` (what neighbours add) and
    ``label_noise`` (a fraction of nodes whose label is a random class, which caps
    every model's accuracy). Degrees follow a power law whose exponent is set by
    ``max_degree``, the expected degree of the most popular node (None: tail exponent 2.67).
    """

    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    dtype: torch.dtype
    split: tuple
    homophily: float = 0.75      # probability that a drawn neighbour comes from the node's own class
    signal: float = 0.3          # class-centroid norm relative to the per-row noise norm
    max_degree: int | None = None  # expected degree of the most popular node
    label_noise: float = 0.0     # fraction of nodes labelled with a random class

    def __post_init__(self):
        if self.num_nodes < 2 or self.num_features < 1 or self.num_classes < 1:
            raise ValueError(f"Preset: needs num_nodes >= 2, num_features >= 1 and num_classes >= 1, got "
                             f"{self.num_nodes}, {self.num_features}, {self.num_classes}")
        if self.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"Preset: dtype must be torch.float32 or torch.float16, got {self.dtype}")
        for knob in ("homophily", "label_noise"):
            if not 0.0 <= getattr(self, knob) <= 1.0:
                raise ValueError(f"Preset: {knob} must lie in [0, 1], got {getattr(self, knob)}")
        if self.signal < 0:
            raise ValueError(f"Preset: signal must be >= 0, got {self.signal}")
        mean = self.num_edges / self.num_nodes
        if not 0 < mean < min(self.max_degree or self.num_nodes, self.num_nodes - 1):
            raise ValueError(f"Preset: the mean degree num_edges / num_nodes = {mean:.3g} must be positive and "
                             f"below max_degree ({self.max_degree}) and num_nodes - 1")
        split_sizes(self)


def split_sizes(p: Preset) -> list[int]:
    """The train/valid/test node counts of ``p`` (fractions of ``num_nodes`` rounded)."""
    if len(p.split) != len(SPLITS):
        raise ValueError(f"Preset: split needs {len(SPLITS)} entries (train, valid, test), got {p.split!r}")
    exact = all(isinstance(s, int) and not isinstance(s, bool) for s in p.split)
    sizes = [int(s) if exact else int(round(float(s) * p.num_nodes)) for s in p.split]
    if min(sizes) < 0 or sum(sizes) > p.num_nodes:
        raise ValueError(f"Preset: split {p.split!r} gives sizes {sizes}: each must be >= 0 and together "
                         f"at most num_nodes = {p.num_nodes}")
    return sizes


# Shaped like OGB's ogbn-arxiv, ogbn-products and ogbn-papers100M made undirected, as
# GNN training reads them: OGB's node counts, feature widths and dtypes, class counts and
# split sizes; num_edges is the CSR entry count of the symmetrized graph. max_degree sets
# the degree tail (arxiv: median 6, max about 13,000, as OGB's). The knobs put a
# features-only model near OGB's MLP accuracy and GraphSAGE near OGB's GraphSAGE
# (arxiv 0.55 / 0.71, products 0.61 / 0.79, papers100M 0.47 / 0.65): label_noise caps
# every model a little above the GraphSAGE figure, signal sets the MLP's, homophily what
# neighbours add (docs/datasets.md).
PRESETS: dict[str, Preset] = {
    "tiny": Preset(3_000, 30_000, 32, 8, torch.float32, (1_500, 600, 900), signal=0.3, max_degree=300),
    "arxiv-like": Preset(169_343, 2_315_598, 128, 40, torch.float32, (90_941, 29_799, 48_603),
                         homophily=0.35, signal=0.33, label_noise=0.2, max_degree=24_000),
    "products-like": Preset(2_449_029, 123_718_280, 100, 47, torch.float32, (196_615, 39_323, 2_213_091),
                            homophily=0.25, signal=0.45, label_noise=0.2, max_degree=17_481),
    "papers100M-like": Preset(111_059_956, 3_231_371_744, 128, 172, torch.float16,
                              (1_207_179, 125_265, 214_338), homophily=0.25, signal=0.6, label_noise=0.34,
                              max_degree=50_000),
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
        # Fresh: written by this generator for this preset as it now is (its knobs included).
        want = generation_info(name, PRESETS[name], seed)
        have = (meta or {}).get("info", {})
        fresh = meta is not None and all(have.get(k) == v for k, v in want.items())
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


def generation_info(name: str, p: Preset, seed: int) -> dict:
    """What a generated preset's ``info`` records of how it was made: a cached one is reused
    only while all of it matches."""
    return {"preset": name, "seed": seed, "generator_version": GENERATOR_VERSION, "homophily": p.homophily,
            "signal": p.signal, "label_noise": p.label_noise, "max_degree": p.max_degree}


def generate(name: str, seed: int = 0, path=None, *, show_progress: bool = True,
             workers: int | None = None, preset: Preset | None = None) -> NodeDataset:
    """Generate preset ``name`` (or ``preset``, named ``name``) deterministically for ``seed``;
    with ``path``, write it there (features go straight to a memory-mapped file) and return
    the loaded set. The graph is symmetric, without self loops or repeats, rows sorted."""
    p = preset or PRESETS.get(name)
    if p is None:
        raise ValueError(f"unknown preset {name!r}: expected one of {sorted(PRESETS)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None, got {workers!r}")
    workers = workers or max(1, min(os.cpu_count() or 1, 16))
    n, c, f = p.num_nodes, p.num_classes, p.num_features
    k = Classes.plant(n, c, seed)
    graph = symmetric_graph(p, k, seed, name, workers, show_progress)

    # Features: centroid of the planted class plus isotropic noise of unit norm per row;
    # labels: the planted class, or for a label_noise share of the nodes a random one.
    centroids = torch.randn(c, f, generator=chunk_generator(seed, 3)) * (p.signal / math.sqrt(f))
    noise_std = 1.0 / math.sqrt(f)
    if path is not None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        np_dtype = {torch.float32: np.float32, torch.float16: np.float16}[p.dtype]
        x_np = np.lib.format.open_memmap(path / "x.npy", mode="w+", dtype=np_dtype, shape=(n, f))
        x = torch.from_numpy(x_np)
    else:
        x = torch.empty(n, f, dtype=p.dtype)
    y = k.cls.clone()
    chunk = synthetic.NODE_CHUNK
    starts = list(range(0, n, chunk))
    with ThreadPoolExecutor(workers) as pool, progress(len(starts), f"{name}: features", show_progress) as bar:
        def feat(i):
            s = starts[i]
            e = min(n, s + chunk)
            rows = torch.randn(e - s, f, generator=chunk_generator(seed, 4, i)).mul_(noise_std)
            x[s:e] = rows.add_(centroids[k.cls[s:e]])
            g = chunk_generator(seed, 6, i)
            noisy = torch.rand(e - s, generator=g) < p.label_noise
            y[s:e][noisy] = torch.randint(c, (int(noisy.sum()),), generator=g)
            bar.update(1)
        list(pool.map(feat, range(len(starts))))
    del k

    order = torch.randperm(n, generator=chunk_generator(seed, 5))
    split, at = {}, 0
    for key, size in zip(SPLITS, split_sizes(p)):
        split[key] = order[at:at + size].sort().values
        at += size
    del order
    ds = NodeDataset(name, graph, x, y, split, c, generation_info(name, p, seed))
    if path is None:
        return ds
    x_np.flush()
    ds.save(path, write_features=False)
    del ds, x, x_np
    return NodeDataset.load(path)
