"""Graphs for GNN training: CSR graphs on any device, data sets, neighbour samplers.

    >>> from torch_direct.gnn.graph import CSRGraph, NeighborSampler
    >>> g = CSRGraph.from_edge_index(edge_index, num_nodes, symmetrize=True, dedupe=True)
    >>> batch = NeighborSampler(g.to("unified"), [15, 10, 5]).sample(seeds)
    >>> ds = load_dataset("products-like")   # or "ogbn-products" with root= OGB's directory
    >>> ds, ro = reorder(ds, by="degree")    # hot nodes first; ro maps ids and results back

``python -m torch_direct.gnn.graph --help`` generates or converts a data set from the shell.
"""

from .csr import CSRGraph
from .datasets import PRESETS, NodeDataset, default_root, generate, load_dataset
from .ogb import load_ogb
from .reorder import Reordering, access_frequency, reorder
from .sampler import Block, GPUNeighborSampler, NeighborSampler, SampledBatch

__all__ = ["Block", "CSRGraph", "GPUNeighborSampler", "NeighborSampler", "NodeDataset", "PRESETS",
           "Reordering", "SampledBatch", "access_frequency", "default_root", "generate", "load_dataset",
           "load_ogb", "reorder"]
