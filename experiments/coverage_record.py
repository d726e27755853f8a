"""A results/ record of a device-coverage run: the counts of an op_db or
module_db outcomes file (TORCH_DIRECT_OP_DB_OUTCOMES /
TORCH_DIRECT_MODULE_DB_OUTCOMES) or of a ``run_upstream_tests --device``
record, with every job or test that did not pass, and the provenance of the
run (given here: the run may have been made on another machine).

    python experiments/coverage_record.py op_db OUTCOMES.json --commit C --machine "NVIDIA H200" \\
        --command "..." --out results/op_db_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def db_summary(data: dict, name_keys: tuple[str, ...], group_key: str) -> dict:
    counts: dict[str, int] = {}
    groups: dict[str, dict[str, int]] = {}
    not_passed = []
    for o in data["outcomes"]:
        counts[o["status"]] = counts.get(o["status"], 0) + 1
        g = groups.setdefault(str(o.get(group_key)), {})
        g[o["status"]] = g.get(o["status"], 0) + 1
        if o["status"] not in ("passed", "skipped"):
            name = ".".join(str(o[k]) for k in name_keys if o.get(k))
            not_passed.append({"name": name, "status": o["status"],
                               "cause": str(o.get("cause") or o.get("message", ""))[:300]})
    skipped = {}
    for o in data["outcomes"]:
        if o["status"] == "skipped":
            why = str(o.get("message") or o.get("cause") or "")[:200]
            skipped[why] = skipped.get(why, 0) + 1
    return {"reference_device": data.get("reference_device"), "jobs": len(data["outcomes"]),
            "counts": counts, f"counts_by_{group_key}": groups, "not_passed": not_passed,
            "skipped_by_reason": skipped}


def upstream_summary(data: dict) -> dict:
    files = {f: {k: v.get(k) for k in ("pairs", "selected_pairs", "both_passed", "differences",
                                          "known_differences", "pairs_by_reference_and_unified_outcome",
                                          "timed_out", "collection_error") if k in v}
             for f, v in data["files"].items()}
    return {k: data.get(k) for k in ("vehicle", "torch", "reference_device", "sample_pairs_per_file",
                                     "totals")} | {"files": files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["op_db", "module_db", "upstream_device"])
    ap.add_argument("source", help="the outcomes file or run_upstream_tests record")
    ap.add_argument("--commit", required=True, help="the commit the run's tree was")
    ap.add_argument("--dirty-note", default="", help="what the run's tree had beyond that commit")
    ap.add_argument("--machine", required=True, help="the machine, e.g. 'NVIDIA H200, torch 2.11'")
    ap.add_argument("--command", required=True, help="the command that ran")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not os.path.isfile(args.source):
        ap.error(f"no such file: {args.source}")
    if os.path.isdir(args.out):
        ap.error(f"--out: {args.out} is a directory")
    data = json.load(open(args.source))
    if args.kind == "op_db":
        body = db_summary(data, ("op", "variant", "dtype"), "dtype")
    elif args.kind == "module_db":
        body = db_summary(data, ("module", "mode"), "mode")
    else:
        body = upstream_summary(data)
    provenance = {"commit": args.commit, "dirty": bool(args.dirty_note), "machine": {"description": args.machine},
                  "command": args.command}
    if args.dirty_note:
        provenance["dirty_note"] = args.dirty_note
    from torch_direct.gnn.outputs import write_json
    write_json(args.out, {"provenance": provenance, "kind": args.kind, **body})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
