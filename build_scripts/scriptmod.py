"""Load one of build_scripts/' extension-less Python scripts as a module (their
functions are shared: record_fork_wheel uses run_upstream_tests', probe_cuda_toolkit verify's)."""

import importlib.machinery
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(name: str):
    loader = importlib.machinery.SourceFileLoader(name, str(HERE / name))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
