"""The gather benchmark runs, records what it measured, and rejects bad options."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests


def bench(*args):
    return subprocess.run([sys.executable, "-m", "torch_direct.bench", *args],
                          capture_output=True, text=True, timeout=600)


class TestGatherBench(TestCase):
    def test_small_run_writes_a_complete_record(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "g.json"
            # fp16 views of the random fp32 table hold NaNs: the row check compares bits
            r = bench("gather", "--table-gb", "0.01", "--row-bytes", "128,200", "--indices", "3000",
                      "--dtypes", "fp32,fp16", "--orders", "random", "--repeats", "2", "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads(out.read_text())
            self.assertEqual(rec["benchmark"], "gather")
            self.assertIn("torch", rec["machine"])
            self.assertEqual(len(rec["points"]), 4)
            for p in rec["points"]:
                self.assertIn("ours", p["times"])
                self.assertIn("cpu_centric", p["times"])
                t = p["times"]["ours"]
                self.assertEqual(t["repeats"], 2)
                self.assertGreater(t["GBps"], 0)
                self.assertAlmostEqual(t["GBps"], p["bytes"] / t["median_s"] / 1e9)
                self.assertIn("cpu_centric", p["speedup_vs"])
                # the rows of ours (and on a GPU of ours_hybrid) against a CPU gather
                self.assertTrue(p["checked"]["ours"])
                self.assertTrue(all(p["checked"].values()), p["checked"])
            self.assertIn("speedup", r.stdout)

    def test_row_check_compares_bits(self):
        import torch
        from torch_direct.bench.gather import _same_bits

        a = torch.tensor([1.0, float("nan"), -0.0], dtype=torch.float16)
        self.assertTrue(_same_bits(a, a.clone()))
        self.assertFalse(_same_bits(a, torch.tensor([1.0, float("nan"), 0.0], dtype=torch.float16)))
        self.assertFalse(_same_bits(a, a.float()))
        self.assertFalse(_same_bits(a, a[:2]))

    def test_methods_option_times_ours_and_the_named_ones(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "g.json"
            r = bench("gather", "--table-gb", "0.01", "--row-bytes", "128", "--indices", "2000",
                      "--dtypes", "fp32", "--orders", "random", "--repeats", "1", "--methods",
                      "naive_uva_sorted", "--no-progress", "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertNotIn("table 0.01 GB", r.stderr)  # --no-progress: no bar
            (p,) = json.loads(out.read_text())["points"]
            # on a machine without CUDA only the CPU methods exist: cpu_centric is left out
            self.assertEqual(set(p["times"]) - {"naive_uva_sorted"}, {"ours"})

    def test_bad_options(self):
        r = bench("gather", "--methods", "ours,fastest")
        self.assertEqual(r.returncode, 2)
        self.assertIn("fastest", r.stderr)
        self.assertEqual(bench("gather", "--orders", "shuffled").returncode, 2)
        self.assertEqual(bench("gather", "--indices", "0").returncode, 2)
        self.assertEqual(bench("gather", "--dtypes", "fp8").returncode, 2)
        self.assertIn("gather", bench("--help").stdout)


if __name__ == "__main__":
    run_tests()
