"""``python -m torch_direct.gnn.bench embedding``: GraphSAGE over a learned node embedding whose
table is in unified memory, on the compute device, or on the CPU with a CPU optimizer."""

import contextlib
import io
import json
import os
from argparse import ArgumentParser
from unittest import mock

import torch
from torch.testing._internal.common_utils import run_tests

import torch_direct
from torch_direct.gnn.bench import embedding as be
from common import TinyDatasetCase

FAST = ["--dataset", "tiny", "--layers", "builtin", "--hidden", "32", "--dim", "16", "--batch-size", "256",
        "--fanouts", "5,3", "--epochs", "2", "--max-batches", "3", "--eval-nodes", "300", "--threads", "1",
        "--no-progress", "--device", "cpu"]


def bench(*argv):
    from torch_direct.gnn.bench.__main__ import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["embedding", *argv])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def parse(*argv):
    p = ArgumentParser()
    be.add_arguments(p)
    return p.parse_args(list(argv))


class TestBenchEmbeddingCPU(TinyDatasetCase):
    """One run of every variant on the CPU, shared by the checks below."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.path = os.path.join(cls.tmp.name, "embedding.json")
        cls.svg = os.path.join(cls.tmp.name, "embedding.svg")
        cls.rc, cls.out, cls.err = bench("--root", cls.tmp.name, *FAST, "--out", cls.path, "--plot", cls.svg)
        with open(cls.path) as f:
            cls.rec = json.load(f)
        cls.rows = {r["variant"]: r for r in cls.rec["rows"]}

    def test_a_row_per_variant(self):
        self.assertEqual(self.rc, 0, self.err)
        self.assertEqual(list(self.rows), list(be.VARIANTS))
        self.assertEqual(self.rec["benchmark"], "embedding")
        self.assertIn("torch", self.rec["machine"])
        for name, r in self.rows.items():
            self.assertEqual(r["status"], "ok", r.get("reason"))
            self.assertGreater(r["epoch_s"], 0)
            self.assertEqual(len(r["epoch_times_s"]), 2)
            self.assertEqual(r["epoch_s"], r["epoch_times_s"][1])     # the epoch after the warm-up one
            self.assertEqual(set(r["split_s"]), set(be.SPLIT))
            self.assertEqual(r["batches"], 3)                         # --max-batches
            for k in ("valid_acc", "test_acc"):
                self.assertGreaterEqual(r[k], 0.0)
                self.assertLessEqual(r[k], 1.0)
        self.assertEqual(self.rows["unified"]["table_device"], "unified:0")
        self.assertEqual(self.rows["cpu_optimizer"]["table_device"], "cpu")
        self.assertEqual(self.rec["ratios"]["unified_vs_cpu_optimizer"],
                         self.rows["cpu_optimizer"]["epoch_s"] / self.rows["unified"]["epoch_s"])
        self.assertEqual(self.rec["ratios"]["gpu_vs_unified"],
                         self.rows["unified"]["epoch_s"] / self.rows["gpu"]["epoch_s"])
        self.assertEqual(self.rec["targets"], [])                     # the speed target is set on a GPU
        gap = self.rec["unified_minus_gpu_s"]
        self.assertEqual(set(gap), set(be.SPLIT))
        for k in be.SPLIT:
            self.assertAlmostEqual(gap[k], self.rows["unified"]["split_s"][k] - self.rows["gpu"]["split_s"][k])
        for text in ("| unified |", "| gpu |", "| cpu_optimizer |", "unified_vs_cpu_optimizer:", "gpu_vs_unified:",
                     "accuracy spread", "unified's epoch minus gpu's, per part: sample "):
            self.assertIn(text, self.out)
        with open(self.svg) as f:
            self.assertIn("cpu_optimizer", f.read())

    def test_the_variants_compute_the_same(self):
        ref = self.rows["unified"]
        for name in ("gpu", "cpu_optimizer"):
            r = self.rows[name]
            self.assertEqual(r["losses"], ref["losses"], atol=1e-5, rtol=1e-5)
            self.assertLessEqual(abs(r["valid_acc"] - ref["valid_acc"]), 1e-9)
            self.assertLessEqual(abs(r["test_acc"] - ref["test_acc"]), 1e-9)
        self.assertLessEqual(max(self.rec["accuracy_spread"].values()), 1e-9)

    def test_unified_table_updates_the_touched_rows_in_place(self):
        args = parse("--root", self.tmp.name, *FAST)
        init = be.initial_table(self.ds.num_nodes, args.dim, args.seed)
        with contextlib.redirect_stderr(io.StringIO()):
            runs = {name: be.train_variant(name, self.ds, init, args, torch.device("cpu"))
                    for name in be.VARIANTS}
        unified = runs["unified"]
        self.assertTrue(torch_direct.is_unified(unified.table))
        table = unified.table.cpu()
        touched = unified.touched
        self.assertGreater(int(touched.sum()), 0)
        self.assertLess(int(touched.sum()), self.ds.num_nodes)
        self.assertEqual(int(touched.sum()), unified.row["touched_rows"])
        self.assertEqual(table[~touched], init[~touched], atol=0, rtol=0)       # never-read rows untouched
        changed = (table != init).any(1)
        self.assertTrue(bool(changed[touched].all()))
        # The same update as the table on the device and the table on the CPU with a CPU optimizer.
        for name in ("gpu", "cpu_optimizer"):
            self.assertEqual(runs[name].touched, touched)
            self.assertEqual(runs[name].table.cpu(), table, atol=1e-5, rtol=1e-5)


class TestBenchEmbeddingInput(TinyDatasetCase):
    def assert_refused(self, argv, *messages):
        never = os.path.join(self.tmp.name, "never")
        out = os.path.join(never, "e.json") if "--out" not in argv else None
        rc, _, err = bench("--root", never, *FAST, *(["--out", out] if out else []), *argv)
        self.assertEqual(rc, 2, err)
        for m in messages:
            self.assertIn(m, err)
        self.assertFalse(os.path.exists(never))      # no data set made, no record written
        return err

    def test_unknown_variant(self):
        for bad, msg in (("unified,bogus", "'bogus'"), (",", "empty list")):
            self.assert_refused(["--variants", bad], "--variants", msg, "unified, gpu, cpu_optimizer")

    def test_unwritable_out(self):
        blocker = os.path.join(self.tmp.name, "a-file")
        open(blocker, "w").close()
        self.assert_refused(["--out", os.path.join(blocker, "e.json")], "--out", "is not a folder")
        self.assert_refused(["--out", self.tmp.name], "--out", "is a folder")
        self.assert_refused(["--plot", os.path.join(self.tmp.name, "chart.pdf")], "--plot", ".svg")

    def test_other_bad_input(self):
        self.assert_refused(["--device", "tpu"], "--device")
        self.assert_refused(["--max-batches", "0"], "--max-batches", "must be positive")
        self.assert_refused(["--fanouts", "5,x"], "--fanouts")

    def test_a_failing_variant_is_recorded_and_the_others_run(self):
        path = os.path.join(self.tmp.name, "failed.json")
        real = be.make_table

        def make_table(name, *a):
            if name == "gpu":
                raise RuntimeError("no table for you")
            return real(name, *a)
        with mock.patch.object(be, "make_table", make_table):
            rc, out, err = bench("--root", self.tmp.name, *FAST, "--out", path)
        self.assertEqual(rc, 1, err)
        rows = {r["variant"]: r for r in json.load(open(path))["rows"]}
        self.assertEqual(rows["gpu"]["status"], "failed")
        self.assertEqual(rows["gpu"]["reason"], "RuntimeError: no table for you")
        self.assertIn("no table for you", rows["gpu"]["traceback"])
        self.assertEqual((rows["unified"]["status"], rows["cpu_optimizer"]["status"]), ("ok", "ok"))
        self.assertIn("failed: RuntimeError: no table for you", out)

    def test_help(self):
        rc, out, _ = bench("--help")
        self.assertEqual(rc, 0)
        for opt in ("--dataset", "--epochs", "--dim", "--variants", "--batch-size", "--fanouts", "--lr",
                    "--max-batches", "--device", "--out", "--plot", "--seed", "cpu_optimizer", "SparseAdam"):
            self.assertIn(opt, out)

    def test_defaults(self):
        args = parse()
        self.assertEqual((args.dataset, args.epochs, args.dim, args.variants, args.max_batches),
                         ("products-like", 2, 128, list(be.VARIANTS), None))
        self.assertEqual((args.hidden, args.fanouts, args.batch_size, args.device), (256, [15, 10, 5], 1024, "auto"))
        from torch_direct.gnn.bench.common import results_dir
        self.assertEqual(be.out_path(args), results_dir() / "embedding_products-like.json")
        self.assertEqual(be.parse_variants("gpu, unified,gpu"), ["gpu", "unified"])


if __name__ == "__main__":
    run_tests()
