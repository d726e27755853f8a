"""Run the op_db jobs of the named OpInfos only (every dtype of each), as
tests/test_op_db.py runs them, and print their outcomes; --out writes them as
an outcomes file that ``tests/op_db_runner.py report`` reads.

    python experiments/op_db_jobs.py tensor_split empty_strided [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ops", nargs="+", help="OpInfo names (every variant of each)")
    ap.add_argument("--out", help="outcomes JSON to write")
    args = ap.parse_args(argv)
    import op_db_runner as runner
    names = set(args.ops)
    unknown = names - {op.name for op in runner.op_db}
    if unknown:
        ap.error(f"not in op_db: {', '.join(sorted(unknown))}")
    jobs = [j for j, (i, _) in enumerate(runner.JOBS) if runner.op_db[i].name in names]
    outcomes = {}
    start = 0
    while start < len(jobs):   # one child per run of consecutive jobs (an op's dtypes)
        end = start
        while end + 1 < len(jobs) and jobs[end + 1] == jobs[end] + 1:
            end += 1
        outcomes.update(runner.run_jobs(jobs[start], jobs[end] + 1))
        start = end + 1
    for j in jobs:
        o = outcomes[j]
        print(f"{o['op']}{'.' + o['variant'] if o['variant'] else ''}[{o['dtype']}]: {o['status']}"
              f"{' - ' + o.get('message', '')[:200] if o['status'] != 'passed' else ''}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seconds": 0, "max_samples_per_op": runner.MAX_SAMPLES_PER_OP,
                       "reference_device": runner.reference_device(),
                       "outcomes": [outcomes[j] for j in jobs]}, f, indent=1)
    return 0 if all(outcomes[j]["status"] in ("passed", "skipped") for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
