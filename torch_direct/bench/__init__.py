"""Benchmarks: python -m torch_direct.bench {gather} --help."""
