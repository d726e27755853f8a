"""Load one of build_scripts/' extension-less Python scripts as a module (their
functions are shared: record_fork_wheel uses run_upstream_tests', probe_cuda_toolkit verify's),
and write their JSON records as the package does (torch_direct/gnn/outputs.py: atomically, with a
provenance object), without importing torch_direct itself."""

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


def write_record(path, record: dict) -> None:
    """``record`` as JSON at ``path`` through torch_direct/gnn/outputs.py's ``write_json``."""
    loader = importlib.machinery.SourceFileLoader("torch_direct_outputs", str(HERE.parent / "torch_direct" / "gnn" / "outputs.py"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    outputs = importlib.util.module_from_spec(spec)
    loader.exec_module(outputs)
    outputs.write_json(Path(path), record)
