"""The GNN training pipeline: feature stores, a pipelined loader and the training CLI.

    >>> from torch_direct.gnn.pipeline import make_feature_store, PipelinedLoader
    >>> store = make_feature_store("unified", ds.x, "cuda", cache_bytes=2**30,
    ...                            degree=access_frequency(ds.graph, fanout=5))
    >>> with PipelinedLoader(NeighborSampler(ds.graph, [15, 10, 5]), store, ds.split["train"], 1024,
    ...                      labels=ds.y) as loader:
    ...     for b in loader: ...

``python -m torch_direct train --help`` trains a GNN with it from the shell.
"""

from .features import (KINDS, CPUCentricFeatureStore, FeatureStore, GPUResidentFeatureStore, UnifiedFeatureStore,
                       make_feature_store)
from .cache import CachedFeatureStore
from .loader import PipelinedLoader
from .stages import STAGES, Batch
from .pyg import to_pyg, to_pyg_graph_store

__all__ = ["Batch", "CachedFeatureStore", "CPUCentricFeatureStore", "FeatureStore", "GPUResidentFeatureStore", "KINDS",
           "PipelinedLoader", "STAGES", "UnifiedFeatureStore", "make_feature_store", "to_pyg",
           "to_pyg_graph_store"]
