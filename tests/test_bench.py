"""The gather benchmark runs, records what it measured, and rejects bad options."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests


def bench(*args):
    return subprocess.run([sys.executable, "-m", "torch_direct.gnn.bench", *args],
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
        from torch_direct.gnn.bench.gather import _same_bits

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

    def test_sizes_that_measure_nothing_are_refused_naming_the_option(self):
        for args, option in ((["--table-gb", "0"], "--table-gb"),
                             (["--row-bytes", "3", "--dtypes", "fp32"], "--row-bytes"),
                             (["--row-bytes", "6", "--dtypes", "fp16,fp32"], "--row-bytes"),
                             (["--table-gb", "0.000000001", "--row-bytes", "128"], "--table-gb")):
            with tempfile.TemporaryDirectory() as d:
                out = Path(d) / "g.json"
                r = bench("gather", *args, "--out", str(out))
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertIn(option, r.stderr)
                self.assertFalse(out.exists(), args)  # refused before any record is written


class TestOutputPaths(TestCase):
    """No benchmark writes into the repository by default, and a path it cannot
    write is refused before any work."""

    def test_defaults_go_to_the_user_cache(self):
        import os
        from unittest import mock

        from torch_direct.gnn.bench import common
        with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {"XDG_CACHE_HOME": d}):
            self.assertEqual(common.default_out("gather"), Path(d) / "torch_direct" / "results" / "gather.json")
            r = bench("gather", "--table-gb", "0.01", "--row-bytes", "128", "--indices", "1000",
                      "--dtypes", "fp32", "--orders", "random", "--repeats", "1", "--no-progress")
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertTrue((Path(d) / "torch_direct" / "results" / "gather.json").is_file())

    def test_a_plot_asked_for_without_matplotlib_is_refused_first(self):
        import os
        with tempfile.TemporaryDirectory() as d:
            stub = Path(d) / "stub" / "matplotlib"
            stub.mkdir(parents=True)
            (stub / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub.parent), os.environ.get("PYTHONPATH", "")]))
            r = subprocess.run([sys.executable, "-m", "torch_direct.gnn.bench", "gather", "--plot", str(Path(d) / "c.png"),
                                "--out", str(Path(d) / "g.json")], capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 2, r.stderr[-500:])
            self.assertIn("--plot: the gather chart needs matplotlib", r.stderr)
            self.assertFalse((Path(d) / "g.json").exists())

    def test_unwritable_paths_fail_before_work(self):
        from torch_direct.gnn.bench.common import check_writable
        with tempfile.TemporaryDirectory() as d:
            a_file = Path(d) / "file"
            a_file.write_text("x")
            for path, why in ((Path(d), "is a folder"), (a_file / "out.json", "is not a folder")):
                with self.assertRaisesRegex(ValueError, f"--out: .*{why}"):
                    check_writable(path, "--out")
            self.assertEqual(check_writable(Path(d) / "new" / "deeper" / "o.json", "--out"),
                             Path(d) / "new" / "deeper" / "o.json")
            for args in (["gather", "--out", d], ["gather", "--out", str(a_file / "x.json")],
                         ["gather", "--plot", str(Path(d) / "chart.txt"), "--out", str(Path(d) / "g.json")],
                         ["train", "--out", d], ["scaling", "--out", str(a_file / "x.json")],
                         ["train-ablation", "--out", d]):
                r = bench(*args)
                self.assertEqual(r.returncode, 2, (args, r.stderr[-500:]))
                self.assertTrue(r.stderr.strip().splitlines()[-1].count("--") >= 1, r.stderr)
                self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    run_tests()
