"""The synthetic graph behind the presets: planted classes, a power-law degree
shape, a symmetric CSR built in parallel chunks with bounded memory."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..progress import progress
from .csr import CSRGraph

if TYPE_CHECKING:
    from .datasets import Preset

# Planted classes: every node gets a class; its features are its class centroid plus noise
# strong enough that features alone classify it poorly, and most of its neighbours come from
# its own class, so aggregating over the graph recovers the class (a GNN beats an MLP).
# A ``label_noise`` share of the nodes is then labelled with a random class.
#
# Degrees (a Chung-Lu graph with planted classes). Each class lists its members in a random
# order; member j of a class of n_c gets the slice [j/n_c, (j+1)/n_c) of the unit interval
# and the expected degree w = n_c * (mass of f over its slice), where
# f(q) = min(max_degree, a * q**-beta), beta = 1 / (power - 1): a power-law tail
# P(w >= k) ~ k**-(power - 1), capped, with ``a`` solved so that the mean is num_edges /
# num_nodes. Every class has the same shape, so the whole graph has it too.
#
# Symmetric by construction, each undirected edge drawn once: a node u at position q_u draws
# Poisson(w_u * G(q_u) / G(1)) partners (G: the integral of f) among nodes of lower position,
# each with probability proportional to its w: from u's class with probability ``homophily``,
# else from a class drawn by size. Then every node's expected degree is w (what it draws plus
# what higher nodes draw to it), and a pair can only be drawn by its higher end, so repeats
# occur only within a row; they are redrawn (_REDRAWS rounds) to keep the entry count on target.
# Drawing inverts G in closed form: O(1) per edge, no search.
#
# Assembly in two passes over fixed node ranges (NODE_CHUNK nodes): pass 1 draws each
# range's pairs (u, v), u in the range, sorted by v; pass 2 builds each range's rows from
# its own pairs (u -> v) and every range's pairs whose v falls in it (v -> u), sorting that
# bucket alone. Peak memory: 8 bytes per undirected edge for the pairs plus the output CSR.
# Every chunk has its own generator seeded from (seed, stage, chunk): results do not depend
# on the number of threads.

NODE_CHUNK = 1 << 18
_REDRAWS = 2
_ATTEMPTS = 3
_TOLERANCE = 0.005


def chunk_generator(seed: int, stage: int, chunk: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + stage) * 1_000_033 + chunk)


def _class_sizes(n: int, c: int) -> torch.Tensor:
    w = torch.arange(1, c + 1, dtype=torch.float64) ** -0.6  # mildly skewed, like real label sets
    sizes = torch.floor(w / w.sum() * n).long()
    sizes[0] += n - int(sizes.sum())
    return sizes


@dataclass(frozen=True)
class _Shape:
    """Expected degrees over within-class position q in [0, 1): density f(q) = mean * e * q**(e - 1),
    a power law P(degree >= k) ~ k**(-1 / (1 - e)), and its integral G(q) = mean * q**e."""

    mean: float
    e: float

    def G(self, q: torch.Tensor) -> torch.Tensor:
        return self.mean * q ** self.e

    def G_inv(self, t: torch.Tensor) -> torch.Tensor:
        return (t / self.mean) ** (1.0 / self.e)

    @classmethod
    def solve(cls, p: Preset, largest_class: int) -> "_Shape":
        """The shape whose largest class's first member expects ``max_degree`` (it takes the
        slice [0, 1/n) of that class, so its expected degree is mean * n**(1 - e))."""
        mean = p.num_edges / p.num_nodes
        if p.max_degree is None:
            return cls(mean, 0.4)
        beta = math.log(p.max_degree / mean) / math.log(max(largest_class, 2))
        if not 0 < beta <= 0.9:
            raise ValueError(f"Preset: max_degree {p.max_degree} needs a degree tail of exponent "
                             f"{1 + 1 / beta if beta > 0 else float('inf'):.3g}; between 2.1 and infinity is "
                             f"possible with mean {mean:.3g} and a largest class of {largest_class} nodes")
        return cls(mean, 1.0 - beta)


@dataclass(frozen=True)
class Classes:
    """Each node's planted class and position in its class's member list (``perm``)."""

    cls: torch.Tensor      # [N] planted class
    rank: torch.Tensor     # [N] position within its class
    perm: torch.Tensor     # members of class 0, then class 1, ...
    sizes: torch.Tensor
    offsets: torch.Tensor
    ends: torch.Tensor     # cumulative sizes

    @classmethod
    def plant(cls, n: int, c: int, seed: int) -> "Classes":
        sizes = _class_sizes(n, c)
        ends = torch.cumsum(sizes, 0)
        offsets = ends - sizes
        perm = torch.randperm(n, generator=chunk_generator(seed, 0))
        planted, rank = torch.empty(n, dtype=torch.long), torch.empty(n, dtype=torch.long)
        planted[perm] = torch.repeat_interleave(torch.arange(c), sizes)
        rank[perm] = torch.arange(n) - torch.repeat_interleave(offsets, sizes)
        return cls(planted, rank, perm, sizes, offsets, ends)


def _draw(rows, c_u, j_u, n_u, below, k: Classes, shape: _Shape, homophily: float, g) -> torch.Tensor:
    """One partner for each entry of ``rows`` (local node index): a node of lower position,
    chosen with probability proportional to its expected degree."""
    m = rows.numel()
    same = torch.rand(m, generator=g) < homophily
    other = torch.searchsorted(k.ends, torch.randint(int(k.ends[-1]), (m,), generator=g), right=True)
    c2 = torch.where(same, c_u[rows], other)
    q = shape.G_inv(torch.rand(m, generator=g, dtype=torch.float64) * below[rows])
    n2 = k.sizes[c2]
    last = (j_u[rows] * n2 + n_u[rows] - 1) // n_u[rows] - 1  # the last position below the drawer's
    j2 = torch.minimum((q * n2).long(), last)
    return k.perm[k.offsets[c2] + j2]


def _merge(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``old`` and ``new`` sorted and free of repeats: (their sorted union, what ``new`` added).
    A merge by insertion positions, no sort: the redraws add a few keys to many."""
    if old.numel() == 0:
        return new, new
    pos = torch.searchsorted(old, new)
    fresh = old[pos.clamp(max=old.numel() - 1)] != new
    fresh |= pos == old.numel()
    new, pos = new[fresh], pos[fresh]
    at = pos + torch.arange(new.numel())
    out = torch.empty(old.numel() + new.numel(), dtype=old.dtype)
    keep = torch.ones(out.numel(), dtype=torch.bool)
    keep[at] = False
    out[at] = new
    out[keep] = old
    return out, new


def _pairs(s: int, e: int, k: Classes, shape: _Shape, p: Preset, scale: float, g):
    """Pass 1 for nodes s..e-1: the pairs (v, u) they draw (u in range), int32, sorted by v then u;
    ``scale`` multiplies the number of draws."""
    m = e - s
    c_u, j_u = k.cls[s:e], k.rank[s:e]
    n_u = k.sizes[c_u]
    below = shape.G(j_u / n_u)
    w = (shape.G((j_u + 1) / n_u) - below) * n_u
    want = torch.poisson((w * below * (scale / shape.mean)).clamp_(min=0), generator=g).long()
    keys, have, need = torch.empty(0, dtype=torch.long), torch.zeros(m, dtype=torch.long), want
    for _ in range(1 + _REDRAWS):
        rows = torch.repeat_interleave(torch.arange(m), need)
        if rows.numel() == 0:
            break
        v = _draw(rows, c_u, j_u, n_u, below, k, shape, p.homophily, g)
        new = torch.unique(v * m + rows)  # sorted by v, then u; repeats dropped
        keys, new = _merge(keys, new)
        have += torch.bincount(new % m, minlength=m)
        need = (want - have).clamp_(min=0)
    v = torch.div(keys, m, rounding_mode="floor")
    return v.to(torch.int32), (keys - v * m + s).to(torch.int32)


def _rows(b: int, pairs: list, cuts: list, s: int, e: int, n: int):
    """Pass 2 for nodes s..e-1 (bucket ``b``): their rows' lengths and sorted columns.
    ``cuts[i]``: where range i's pairs (sorted by v) cross each bucket's start."""
    rows, cols = [pairs[b][1]], [pairs[b][0]]              # u -> v, drawn by these nodes
    for (v, u), cut in zip(pairs, cuts):                   # v -> u, drawn by others to these nodes
        rows.append(v[cut[b]:cut[b + 1]])
        cols.append(u[cut[b]:cut[b + 1]])
    row = torch.cat(rows).long() - s
    key = (row * n + torch.cat(cols).long()).sort().values
    row = torch.div(key, n, rounding_mode="floor")
    return torch.bincount(row, minlength=e - s), (key - row * n).to(torch.int32)


def symmetric_graph(p: Preset, k: Classes, seed: int, name: str, workers: int, show_progress: bool) -> CSRGraph:
    n = p.num_nodes
    shape = _Shape.solve(p, int(k.sizes.max()))
    starts = list(range(0, n, NODE_CHUNK))
    bounds = torch.tensor(starts + [n], dtype=torch.int32)
    scale = 1.0
    with ThreadPoolExecutor(workers) as pool:
        # Pass 1, again with more draws while the entry count misses its target (repeats that
        # could not be redrawn: pairs of popular nodes); only the whole count decides that.
        for attempt in range(_ATTEMPTS):
            with progress(len(starts), f"{name}: edges", show_progress) as bar:
                def draw(i):
                    s, e = starts[i], min(n, starts[i] + NODE_CHUNK)
                    v, u = _pairs(s, e, k, shape, p, scale, chunk_generator(seed, 20 + attempt, i))
                    bar.update(1)
                    return v, u, torch.searchsorted(v, bounds)
                drawn = list(pool.map(draw, range(len(starts))))
            entries = 2 * sum(u.numel() for _, u, _ in drawn)
            if abs(entries / p.num_edges - 1) <= _TOLERANCE or attempt == _ATTEMPTS - 1:
                break
            scale *= p.num_edges / max(entries, 1)
            del drawn
        pairs = [(v, u) for v, u, _ in drawn]
        cuts = torch.stack([c for _, _, c in drawn])             # [chunk, bucket + 1]
        del drawn
        size = (cuts[:, 1:] - cuts[:, :-1]).sum(0) + torch.tensor([u.numel() for _, u in pairs])
        at = torch.cumsum(size, 0) - size
        cuts = cuts.tolist()   # once: every bucket reads every range's cuts
        col = torch.empty(int(size.sum()), dtype=torch.int32)
        counts = torch.empty(n, dtype=torch.long)
        with progress(len(starts), f"{name}: rows", show_progress) as bar:
            def assemble(b):   # pass 2
                s, e = starts[b], min(n, starts[b] + NODE_CHUNK)
                counts[s:e], col[int(at[b]):int(at[b] + size[b])] = _rows(b, pairs, cuts, s, e, n)
                bar.update(1)
            list(pool.map(assemble, range(len(starts))))
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return CSRGraph(rowptr, col, validate=False)
