"""The source digest a record's provenance names (``source``), for commits of this repository:
which commit a record made from a copy of the tree (a GPU machine's, an image's) was measured on.

    python tools/source_digest.py                 # this checkout's files as they are now
    python tools/source_digest.py 793ab2a HEAD~3  # each commit's files (git archive, nothing checked out)
    python tools/source_digest.py --record results/X.json REV...   # which of the commits matches X's
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _outputs():
    # the module alone, by path: importing the package would import torch and the extension
    spec = importlib.util.spec_from_file_location("_td_outputs", ROOT / "torch_direct" / "gnn" / "outputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def digest_of(rev: str, outputs) -> str | None:
    """The source digest of commit ``rev``'s files: its tree exported by git archive into a
    temporary folder (the checkout is not touched)."""
    paths = [p for p in outputs.SOURCE_PATHS if _in_tree(rev, p)]
    if not paths:   # (git archive would take the whole tree)
        if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"],
                          capture_output=True).returncode != 0:
            raise ValueError(f"{rev}: not a commit of this repository")
        return None
    done = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "--", *paths],
                          capture_output=True)
    if done.returncode != 0:
        raise ValueError(f"{rev}: {done.stderr.decode().strip() or 'git archive failed'}")
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            # (the "data" filter where this Python has it: no links out, no absolute paths)
            tar.extractall(d, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        return outputs.source_digest(d)


def _in_tree(rev: str, path: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:{path}"],
                          capture_output=True).returncode == 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("revs", nargs="*", help="commits (default: none, this checkout's files as they are)")
    ap.add_argument("--record", help="a JSON record: say which of the commits its provenance's source digest matches")
    a = ap.parse_args(argv)
    outputs = _outputs()
    want = None
    if a.record:
        try:
            want = (json.loads(Path(a.record).read_text()).get("provenance") or {}).get("source")
        except (OSError, ValueError) as e:
            ap.error(f"--record: cannot read {a.record}: {e}")
        if not want:
            ap.error(f"--record: {a.record} names no source digest (records before it was recorded do not)")
        if not a.revs:
            ap.error("--record: give the commits to match it against")
    if not a.revs:
        print(f"{outputs.source_digest(ROOT)}  (this checkout's files)")
        return 0
    matched = False
    for rev in a.revs:
        try:
            d = digest_of(rev, outputs)
        except ValueError as e:
            print(f"source_digest: {e}", file=sys.stderr)
            return 2
        hit = want is not None and d == want
        matched |= hit
        print(f"{d}  {rev}" + ("  <- the record's" if hit else ""))
    if want is not None and not matched:
        print(f"the record's digest {want} matches none of these commits", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
