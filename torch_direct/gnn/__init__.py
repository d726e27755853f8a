"""The GNN training stack over the unified device: graphs and data sets
(``torch_direct.gnn.graph``: CSR graphs, presets, OGB, reordering, neighbour samplers),
feature stores, the pipelined loader, models and the one training loop
(``torch_direct.gnn.pipeline``), and benchmarks (``torch_direct.gnn.bench``).

It uses the device only through its public API (``torch_direct.pin_inplace``,
``cpu_alias``, ``cuda_alias``, ``gather``, ``is_unified``), plus the neighbour samplers'
bindings, compiled into ``torch_direct._C`` (or the fork's ``torch._C``).

    python -m torch_direct train --help            # the training command
    python -m torch_direct.gnn.bench --help        # benchmarks
    python -m torch_direct.gnn.graph --help        # generate or convert a data set
"""
