"""Benchmarks: python -m torch_direct.gnn.bench {gather} --help."""
