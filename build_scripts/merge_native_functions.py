#!/usr/bin/env python3
"""Merge native_functions_additions.yaml into ATen's native_functions.yaml.

    build_scripts/merge_native_functions.py NATIVE_FUNCTIONS_YAML [--additions FILE] [--check]

Each addition is an entry in ATen's own format whose `dispatch:` has a
`Unified:` kernel. For an op the file already has, the schemas must be
identical and the `Unified:` line is added to its dispatch table; a new op is
appended (as written, other keys included). The file is edited as text (its
comments and layout stay as they are), guided by the parsed YAML, and parsed
again afterwards.

A functional op with a structured_delegate (`index.Tensor`, `gather`: its
kernels come from the structured out= variant) may take a `Unified:` entry: it
is an unstructured Unified kernel for that op alone, overriding the delegate
for the Unified key only (every other key still delegates; torchgen accepts
it, patches/0003). The entry is added to the op's dispatch table, which is
created if the op has none.

Conflicts are refused with a message naming the op, and the file is left
untouched:

- the same op with a different schema;
- an addition to an existing op with a key other than `Unified:` (only the
  Unified entry is merged; on a structured_delegate op any other key would
  contradict the delegation);
- an op with no dispatch table and no structured_delegate
  (CompositeImplicitAutograd: a backend kernel would never be called);
- a different Unified kernel already present.

--check reports what would change without writing. Re-running on a merged
file changes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ADDITIONS = ROOT / "native_functions_additions.yaml"
_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)\(")


class MergeConflict(ValueError):
    pass


def op_name(func: str) -> str:
    m = _NAME.match(func.strip())
    if m is None:
        raise MergeConflict(f"cannot read the op name of {func!r}")
    return m.group(1)


def dispatch_keys(dispatch: dict) -> dict[str, str]:
    """Expand 'CPU, CUDA: kernel' into one key per backend."""
    out = {}
    for keys, kernel in (dispatch or {}).items():
        for k in str(keys).split(","):
            out[k.strip()] = str(kernel)
    return out


def _entry_spans(lines: list[str]) -> dict[str, tuple[int, int]]:
    """op name -> (first line, end line) of its '- func:' block."""
    starts = [i for i, line in enumerate(lines) if line.startswith("- func:")]
    spans = {}
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        spans[op_name(lines[start][len("- func:"):])] = (start, end)
    return spans


def merge_text(text: str, additions: list[dict]) -> tuple[str, list[str]]:
    entries = yaml.safe_load(text) or []
    by_name = {op_name(e["func"]): e for e in entries if isinstance(e, dict) and "func" in e}
    lines = text.split("\n")
    spans = _entry_spans(lines)
    inserts: list[tuple[int, list[str]]] = []
    appended: list[str] = []
    report: list[str] = []
    seen: set[str] = set()
    for add in additions:
        name = op_name(add["func"])
        if name in seen:
            raise MergeConflict(f"{name}: listed twice in the additions")
        seen.add(name)
        kernel = dispatch_keys(add.get("dispatch")).get("Unified")
        if kernel is None:
            raise MergeConflict(f"{name}: the addition has no 'Unified:' kernel")
        have = by_name.get(name)
        if have is None:
            block = yaml.safe_dump([add], sort_keys=False, width=10_000).rstrip("\n")
            appended.append(block)
            report.append(f"append {name} (Unified: {kernel})")
            continue
        if " ".join(str(have["func"]).split()) != " ".join(str(add["func"]).split()):
            raise MergeConflict(f"{name}: schema differs from ATen's\n  ATen:     {have['func']}\n"
                                f"  addition: {add['func']}")
        delegate = have.get("structured_delegate")
        others = sorted(k for k in dispatch_keys(add.get("dispatch")) if k != "Unified")
        if others:
            why = (f"it has structured_delegate {delegate!r}, so its {', '.join(others)} kernels "
                   "come from that out= variant; only a Unified kernel may override it"
                   if delegate else "only the Unified entry of an addition to an existing op is merged")
            raise MergeConflict(f"{name}: the addition also dispatches {', '.join(others)}; {why}")
        existing = dispatch_keys(have.get("dispatch"))
        if not existing and not delegate:
            raise MergeConflict(f"{name}: has no dispatch table (CompositeImplicitAutograd), so a "
                                "Unified kernel would never be called")
        if "Unified" in existing:
            if existing["Unified"] != kernel:
                raise MergeConflict(f"{name}: already dispatches Unified to {existing['Unified']!r}, "
                                    f"not {kernel!r}")
            continue  # already merged
        start, end = spans[name]
        block = lines[start:end]
        at = next((i for i, line in enumerate(block) if line.strip() == "dispatch:"), None)
        where = f" (overrides structured_delegate {delegate} for Unified only)" if delegate else ""
        if at is None and not existing:
            # a structured_delegate op with no dispatch table: give it one,
            # after the structured_delegate line
            at = next((i for i, line in enumerate(block)
                       if line.lstrip().startswith("structured_delegate:")), None)
            if at is None:
                raise MergeConflict(f"{name}: its structured_delegate is not on a line of its own")
            pad = " " * (len(block[at]) - len(block[at].lstrip()))
            inserts.append((start + at + 1, [f"{pad}dispatch:", f"{pad}  Unified: {kernel}"]))
            report.append(f"add Unified: {kernel} to {name}{where}")
            continue
        if at is None:
            raise MergeConflict(f"{name}: its dispatch table is not in block form")
        indent = next((len(line) - len(line.lstrip()) for line in block[at + 1:] if line.strip()), 4)
        # after the last line of the dispatch table
        stop = at + 1
        while stop < len(block) and (len(block[stop]) - len(block[stop].lstrip()) >= indent
                                     and block[stop].strip()):
            stop += 1
        inserts.append((start + stop, [" " * indent + f"Unified: {kernel}"]))
        report.append(f"add Unified: {kernel} to {name}{where}")
    for pos, new in sorted(inserts, reverse=True):
        lines[pos:pos] = new
    text = "\n".join(lines)
    if appended:
        text = text.rstrip("\n") + "\n\n# Added by PyTorch-Direct (native_functions_additions.yaml)\n" \
            + "\n\n".join(appended) + "\n"
    merged = yaml.safe_load(text)  # still valid YAML, every addition present
    names = {op_name(e["func"]) for e in merged if isinstance(e, dict) and "func" in e}
    missing = [op_name(a["func"]) for a in additions if op_name(a["func"]) not in names]
    if missing:
        raise MergeConflict(f"internal error: {missing} missing after the merge")
    return text, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("native_functions", type=Path, help="ATen's native_functions.yaml (edited in place)")
    ap.add_argument("--additions", type=Path, default=DEFAULT_ADDITIONS, help="default: %(default)s")
    ap.add_argument("--check", action="store_true", help="report, do not write")
    args = ap.parse_args(argv)
    try:
        additions = yaml.safe_load(args.additions.read_text()) or []
        text, report = merge_text(args.native_functions.read_text(), additions)
    except (OSError, yaml.YAMLError, MergeConflict, KeyError) as e:
        print(f"merge_native_functions: {e}", file=sys.stderr)
        return 1
    for line in report or ["nothing to do: already merged"]:
        print(line)
    if not args.check and report:
        args.native_functions.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
