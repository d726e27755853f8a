"""Graphs for GNN training: CSR graphs on any device, data sets, neighbour samplers.

    >>> from torch_direct.graph import CSRGraph, NeighborSampler
    >>> g = CSRGraph.from_edge_index(edge_index, num_nodes, symmetrize=True, dedupe=True)
    >>> batch = NeighborSampler(g.to("unified"), [15, 10, 5]).sample(seeds)
"""

from .csr import CSRGraph
from .sampler import Block, NeighborSampler, SampledBatch

__all__ = ["Block", "CSRGraph", "NeighborSampler", "SampledBatch"]
