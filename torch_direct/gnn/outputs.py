"""Files a command writes: where they go by default, checked before any work, written atomically,
each JSON record saying what produced it (``provenance``: commit, source digest, machine,
command)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

# The checkout (or installed tree) this package was imported from.
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]   # the checkout: torch_direct/gnn/outputs.py


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


def machine_record() -> dict:
    """The machine a record was measured on: host, CPUs, Python, torch, CUDA, GPU, memory."""
    rec = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "torch": None, "cuda": None, "gpu": None}
    try:
        import torch

        rec["torch"] = torch.__version__
        rec["cuda"] = torch.version.cuda
        rec["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # a record is still written without torch's answers
        pass
    try:
        with open("/proc/meminfo") as f:
            rec["mem_total_kb"] = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rec


def _git(*args: str) -> str | None:
    """``git -C <package root> args`` stripped, or None when git or the checkout is not there."""
    try:
        done = subprocess.run(["git", "-C", str(_PACKAGE_ROOT), *args], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """What code is running: ``commit`` (HEAD of the git checkout the package was imported
    from) and ``dirty`` (tracked files changed since it), or, outside a checkout, commit None
    and the installed package's ``version``. Asked once per process."""
    commit = None
    if (_PACKAGE_ROOT / ".git").exists():
        commit = _git("rev-parse", "HEAD")
    if commit:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return {"commit": commit, "dirty": None if status is None else bool(status)}
    try:
        from importlib.metadata import version

        installed = version("torch_direct")
    except Exception:
        installed = None
    return {"commit": None, "version": installed}


# The code a record's figures come from: the package, the extension's sources and their build.
SOURCE_PATHS = ("torch_direct", "csrc", "c10_allocator", "setup.py", "native_functions_additions.yaml",
                "tools/gen_registrations.py")
SOURCE_SUFFIXES = (".py", ".cpp", ".cu", ".h", ".cuh", ".yaml")


def source_digest(root=None) -> str | None:
    """A digest of the source files under ``root`` (default: the checkout this package was
    imported from): SHA-256 over the relative path and bytes of each file of SOURCE_PATHS with
    a SOURCE_SUFFIXES ending, in path order, generated code left out; its first 16 hex digits.
    The same files give the same digest on any machine, with or without git metadata, so that a
    record made from a copy of the tree (a GPU machine's, an image's) can be matched to the
    commit whose checkout gives its digest (``python tools/source_digest.py REV``). None when
    no source file is there."""
    root = Path(root) if root is not None else _PACKAGE_ROOT
    files = []
    for part in SOURCE_PATHS:
        top = root / part
        if top.is_file():
            files.append(top)
        elif top.is_dir():
            files.extend(f for f in top.rglob("*") if f.is_file() and f.name.endswith(SOURCE_SUFFIXES)
                         and "generated" not in f.relative_to(root).parts
                         and "__pycache__" not in f.relative_to(root).parts)
    if not files:
        return None
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _source_digest_once() -> str | None:
    """This checkout's source digest, taken once per process (like the commit): every record
    a run writes names the code it started with."""
    return source_digest()


def command_line() -> str:
    """This process's command line, shell-quoted: ``python -m <module> args`` when it was
    started with ``-m``, else its argv (``python`` first for a ``.py`` script); preceded by
    ``TORCH_DIRECT_EXPERIMENTAL=...`` when experimental settings are in force, which change
    what was measured."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    module = getattr(spec, "name", None)
    if module:
        if module.endswith(".__main__"):
            module = module[: -len(".__main__")]
        argv = ["python", "-m", module] + sys.argv[1:]
    else:
        argv = list(sys.argv)
        if argv and argv[0].endswith(".py"):
            argv.insert(0, "python")
    line = " ".join(shlex.quote(a) for a in argv)
    settings = os.environ.get("TORCH_DIRECT_EXPERIMENTAL")
    return f"TORCH_DIRECT_EXPERIMENTAL={shlex.quote(settings)} {line}" if settings else line


def provenance() -> dict:
    """The ``provenance`` object of a record written now: the code's commit (or version), the
    digest of its source files (``source``), the machine and the command. Never raises: what
    cannot be found is None."""
    out = {"commit": None}
    for key, fn in (("code", code_version), ("source", _source_digest_once), ("machine", machine_record),
                    ("command", command_line)):
        try:
            value = fn()
        except Exception:
            value = None
        if key == "code":
            out.update(value or {})
        else:
            out[key] = value
    return out


def write_json(path, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` atomically (a temporary file beside it, then a
    rename: never a half-written record), with a ``provenance`` object first unless the
    record has one already. The caller's dict is not changed."""
    path = Path(path)
    if "provenance" not in record:
        record = {"provenance": provenance(), **record}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()
