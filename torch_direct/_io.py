"""Files a command writes: where they go by default, checked before any work, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

def results_dir() -> Path:
    """Where a benchmark writes when no ``--out`` is given: the user's cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``)/torch_direct/results, never the
    repository's committed ``results/``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch_direct" / "results"


def default_out(stem: str) -> Path:
    """The default JSON path of a benchmark: ``results_dir()/<stem>.json``."""
    return results_dir() / f"{stem}.json"


def check_writable(path, option: str) -> Path:
    """Raise ValueError (one line naming ``option``) unless ``path`` can be written as a
    file: not a folder, under a folder that exists or can be made, writable. Called
    before any work, so a bad path never ends a long run."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option}: {path} is a folder; give a file path")
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{option}: cannot write {path}: {probe} is not a folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option}: {path} is not writable")
    if not path.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: cannot write {path}: {probe} is not writable")
    return path


def write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)  # never leave a half-written record
