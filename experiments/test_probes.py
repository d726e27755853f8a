"""The device probes in experiments/ that the device steps run: their plumbing works on the CPU, so a
device call is not spent finding a broken option (the measurements themselves need the GPU)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

REPO = Path(__file__).resolve().parent.parent


def script(name, *args, timeout=600):
    """experiments/``name`` run with ``args`` in a process of its own (output captured)."""
    return subprocess.run([sys.executable, str(REPO / "experiments" / name), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def probe(*args):
    return script("step_floor_probe.py", *args)


def assert_refused(test, run, cases):
    """Each ``(args, msg)`` of ``cases``: ``run(*args)`` exits with argparse's status 2 and says ``msg``."""
    for args, msg in cases:
        r = run(*args)
        test.assertEqual(r.returncode, 2, (args, r.stderr[-1000:]))
        test.assertIn(msg, r.stderr)


class TestStepFloorProbe(TestCase):
    def test_runs_every_part_and_writes_json(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "probe" / "p.json"
            r = probe("--root", d, "--device", "cpu", "--batches", "3", "--cached", "2", "--batch-size", "128",
                      "--hidden", "16", "--fanouts", "5,5", "--no-progress", "--precision", "bf16",
                      "--layers", "builtin", "--sampler-waits", "default,fewer", "--loader-priority", "high",
                      "--step-priority", "normal",
                      "--sampler-relabel", "hash", "--feature-dtype", "fp8", "--aggregate", "fused,index_add",
                      "--sampler-batches", "2",
                      "--store", "unified", "--profile-sample", str(Path(d) / "sample.txt"), "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads(out.read_text())
            self.assertEqual(rec["batches"], 3)
            self.assertEqual([(run["sampler_waits"], run["sampler_relabel"], run["loader_priority"], run["layers"],
                               run["aggregate"], run["precision"]) for run in rec["runs"]],
                             [(waits, "hash", "high", "builtin", aggregate, "bf16")
                              for waits in ("default", "fewer") for aggregate in ("fused", "index_add")])
            for run in rec["runs"]:
                ms = run["ms_per_batch"]
                self.assertEqual(set(ms), {"sample", "gather", "sample_gather", "step", "together", "together_ahead"})
                self.assertEqual(run["store_stats"]["kind"], "unified")
                self.assertTrue(all(v > 0 for v in ms.values()), ms)
                parts = [ms[k] for k in ("sample", "gather", "step")]
                self.assertAlmostEqual(run["max_part_over_sum"], max(parts) / sum(parts))
            self.assertEqual({(run["step_priority"], run["sample_ahead"]) for run in rec["runs"]}, {("normal", 1)})
            self.assertEqual(r.stdout.count("together / (sample + gather + step)"), 4)
            self.assertIn("batches sampled in", (Path(d) / "sample.txt").read_text())
            self.assertEqual(rec["store"], "unified")

    def test_each_form_of_the_cached_gather(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "p.json"
            r = probe("--root", d, "--device", "cpu", "--batches", "2", "--cached", "2", "--batch-size", "128",
                      "--hidden", "16", "--fanouts", "5,5", "--no-progress", "--layers", "builtin",
                      "--store", "unified", "--cache-mb", "1", "--cached-gather", "split,fused", "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            runs = json.loads(out.read_text())["runs"]
            self.assertEqual([run["cached_gather"] for run in runs], ["split", "fused"])
            for run in runs:
                self.assertGreater(run["store_stats"]["cache_rows"], 0)
                self.assertGreater(run["store_stats"]["cache_hit_rate"], 0)
            self.assertIn("cached gather fused:", r.stdout)
            r = probe("--root", d, "--device", "cpu", "--cached-gather", "fused", "--no-progress")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("give --store unified and --cache-mb", r.stderr)

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as d:
            assert_refused(self, lambda *args: probe("--root", d, "--no-progress", *args), (
                              (["--dataset", "nope"], "unknown data set"),
                              (["--device", "cpu", "--precision", "tf32"], "needs a CUDA device"),
                              (["--batches", "0"], "--batches must be positive"),
                              (["--precision", "fp32,fp8"], "expected comma-separated precisions"),
                              (["--layers", "dgl"], "expected comma-separated layers"),
                              (["--aggregate", "sum"], "expected comma-separated aggregations"),
                              (["--sampler-batches", "0"], "--sampler-batches must be positive"),
                              (["--device", "cpu", "--cuda-graph"], "--cuda-graph needs a CUDA device"),
                              (["--sampler-waits", "none"], "expected comma-separated settings"),
                              (["--sampler-relabel", "radix"], "expected comma-separated settings"),
                              (["--loader-priority", "low"], "expected comma-separated priorities"),
                              (["--step-priority", "low"], "expected comma-separated priorities"),
                              (["--sample-ahead", "0"], "--sample-ahead must be positive"),
                              (["--device", "cpu", "--sample-ahead", "2"], "needs the GPU sampler"),
                              (["--device", "cpu", "--loader-priority", "high", "--step-priority", "high"],
                               "both at one priority"),
                              (["--device", "cpu", "--batch-size", "100000"], "make no batch of 100000"),
                              (["--cache-mb", "64"], "--cache-mb applies to --store unified only"),
                              (["--store", "unified", "--gather-sms", "-1"], "--gather-sms must be >= 0")))
            self.assertEqual(list(Path(d).glob("*.json")), [])


class TestCacheRankProbe(TestCase):
    def test_shares_of_the_reads(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "c.json"
            r = script("cache_rank_probe.py", "--root", d, "--dataset", "tiny", "--batch-size", "64",
                       "--batches", "5", "--fractions", "0.1,0.5,1", "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads(out.read_text())
            self.assertEqual(set(rec["held"]), {"0.1", "0.5", "1.0"})
            for frac, held in rec["held"].items():
                self.assertEqual(set(held), {"degree", "frequency", "access", "presampled", "oracle"})
                for name, v in held.items():   # no ranking beats the reads themselves
                    self.assertLessEqual(v, held["oracle"] + 1e-12, msg=f"{frac} {name}")
                    self.assertGreater(v, 0.0)
            self.assertEqual(rec["held"]["1.0"], {k: 1.0 for k in rec["held"]["1.0"]})   # every row cached
            r = script("cache_rank_probe.py", "--fractions", "0,2")
            self.assertEqual(r.returncode, 2)
            self.assertIn("each must be in (0, 1]", r.stderr)


class TestHugepageGatherProbe(TestCase):
    def run_probe(self, *args):
        return script("hugepage_gather_probe.py", *args)

    def test_gathers_from_both_tables(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "h.json"
            r = self.run_probe("--device", "cpu", "--table-gb", "0.05", "--indices", "5000", "--repeats", "2",
                               "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads(out.read_text())
            self.assertEqual(set(rec["tables"]), {"unified", "thp"})
            self.assertEqual(rec["skipped"], {t: "needs a CUDA device" for t in ("vmm_host", "driver")})  # the driver maps: GPU only
            for t in rec["tables"].values():
                self.assertEqual(len(t["all_s"]), 2)
                self.assertGreater(t["Mrows_per_s"], 0)
                self.assertTrue(0.0 <= t["huge_page_share"] <= 1.0)   # of the table's own mappings
            self.assertEqual(rec["tables"]["unified"]["huge_page_kb"], 0)
            self.assertAlmostEqual(rec["thp_speedup"],
                                   rec["tables"]["unified"]["median_s"] / rec["tables"]["thp"]["median_s"])

    def test_bad_input(self):
        assert_refused(self, self.run_probe, ((["--table-gb", "0"], "--table-gb must be positive"),
                                              (["--row-bytes", "6"], "multiple of 4"),
                                              (["--repeats", "0"], "--repeats must be positive")))


class TestCpuRowOrderProbe(TestCase):
    def test_times_both_orders_on_each_thread_count(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "order.json"
            r = script("cpu_row_order_probe.py", "--table-gb", "0.01", "--rows", "500", "--repeats", "2",
                       "--threads", "1,2", "--pages", "small,huge", "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr)
            rec = json.loads(out.read_text())
            self.assertEqual([(p["pages"], p["threads"]) for p in rec["points"]],
                             [("small", 1), ("small", 2), ("huge", 1), ("huge", 2)])
            for p in rec["points"]:
                self.assertTrue(0 <= p["huge_share"] <= 1, p)   # the kernel may refuse huge pages
                self.assertGreater(p["random_ms"], 0)
                self.assertGreater(p["sorted_ms"], 0)
                self.assertAlmostEqual(p["sorted_speedup"], p["random_ms"] / p["sorted_ms"])
            self.assertEqual(r.stdout.count(" threads: random "), 4)   # a line a page kind and thread count

    def test_bad_input(self):
        assert_refused(self, lambda *args: script("cpu_row_order_probe.py", *args), (
            (["--threads", "1,0"], "--threads must list positive counts"),
            (["--rows", "0"], "--rows: must be positive"),
            (["--table-gb", "1e-9", "--row-bytes", "64"], "holds no row"),
            (["--pages", "small,giant"], "--pages lists small and/or huge")))


class TestTrainVariants(TestCase):
    def variants(self, *args):
        return script("train_variants.py", *args)

    def test_variants_share_one_reorder_and_write_a_record_each(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "records"
            common = ["--root", d, "--dataset", "tiny", "--device", "cpu", "--pipelines", "unified", "--epochs", "2",
                      "--threads", "1", "--layers", "builtin", "--hidden", "16", "--batch-size", "256",
                      "--no-progress", "--reorder", "frequency", "--sample-ahead", "--test-nodes", "200"]
            r = self.variants("--out-dir", str(out), "--name", "tiny", "--oom-report", "--variant", "one=",
                              "--variant", "two=--gather-workers 2",
                              "--experimental", "two=cached_gather=split", "--misses-in-batch-order", "two",
                              "--", *common)
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            one = json.loads((out / "train_tiny_one.json").read_text())
            two = json.loads((out / "train_tiny_two.json").read_text())
            # gpu_memory_before / _peak: None where CUDA was never initialised; on a machine with
            # a GPU, --oom-report's watch initialises it after the first variant's start, and these
            # runs on the CPU hold nothing there
            import torch
            for v in (one["variant"], two["variant"]):
                for key in ("gpu_memory_before", "gpu_memory_peak"):
                    got = v.pop(key)
                    if got is not None or (key, v["name"]) != ("gpu_memory_before", "one"):
                        self.assertEqual(got is None, not torch.cuda.is_available(), (key, got))
                    if got is not None:
                        self.assertEqual(got["allocated_gib"], 0.0, (key, got))
            # no loader or sampling thread of an earlier run still alive
            # cuda_alloc_conf: the allocator's settings the process inherited (this one's)
            conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
            self.assertEqual(one["variant"], {"name": "one", "options": "", "experimental": {},
                                              "threads_before": [], "cuda_sync": None,
                                              "misses_in_batch_order": False, "cuda_alloc_conf": conf})
            self.assertEqual(two["variant"], {"name": "two", "options": "--gather-workers 2",
                                              "experimental": {"cached_gather": "split"}, "threads_before": [],
                                              "cuda_sync": None, "misses_in_batch_order": True,
                                              "cuda_alloc_conf": conf})
            self.assertEqual((one["args"]["gather_workers"], two["args"]["gather_workers"]), (1, 2))
            u1, u2 = one["rows"][0], two["rows"][0]
            self.assertGreater(u1["reorder_s"], 0)     # the first variant made the relabelled copy
            self.assertEqual(u2["reorder_s"], 0.0)     # the second used it
            self.assertEqual(u1["losses"], u2["losses"])   # the same batches, so the same training
            self.assertEqual(r.stdout.count("wrote "), 2)
            self.assertEqual(sorted(p.name for p in out.iterdir()), ["train_tiny_one.json", "train_tiny_two.json"])

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as d:
            assert_refused(self, self.variants, (
                              (["--out-dir", d, "--name", "x", "--", "--dataset", "tiny"], "at least one --variant"),
                              (["--out-dir", d, "--name", "x", "--variant", "a"], "give NAME=VALUE"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--variant", "a=--epochs 1"],
                               "a is given twice"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--experimental", "b=k=v"],
                               "names no variant: b"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--experimental", "a=k"],
                               "give k=v"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=--json x.json"], "give no --json"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--cuda-sync", "b=spin"],
                               "--cuda-sync names no variant: b"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--cuda-sync", "a=fast"],
                               "a mode is one of auto, spin, yield, blocking"),
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--misses-in-batch-order", "b"],
                               "--misses-in-batch-order names no variant: b"),
                              # a later variant's option that bench train refuses: no run starts
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--variant", "b=--cache-mb 8",
                                "--", "--root", d, "--dataset", "tiny", "--device", "cpu", "--pipelines", "unified"],
                               "--cache-mb caches rows in GPU memory"),
                              # and a later variant's experimental setting that train refuses
                              (["--out-dir", d, "--name", "x", "--variant", "a=", "--variant", "b=",
                                "--experimental", "b=gil_switch_us=0",
                                "--", "--root", d, "--dataset", "tiny", "--device", "cpu", "--pipelines", "unified"],
                               "gil_switch_us must be an integer >= 1")))
            self.assertEqual(list(Path(d).iterdir()), [])   # nothing written for a refused command

    def test_cuda_sync_needs_a_gpu(self):
        import torch
        if torch.cuda.is_available():
            self.skipTest("a GPU is here: the refusal is for a machine without one")
        with tempfile.TemporaryDirectory() as d:
            r = self.variants("--out-dir", d, "--name", "x", "--variant", "a=", "--cuda-sync", "a=blocking", "--",
                              "--root", d, "--dataset", "tiny", "--device", "cpu", "--pipelines", "unified")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--cuda-sync sets how the host waits for a GPU, and CUDA is not available here", r.stderr)
            self.assertEqual(list(Path(d).iterdir()), [])


class TestGpuMemoryReport(TestCase):
    def test_summary_of_a_snapshot(self):
        sys.path.insert(0, str(REPO / "experiments"))
        from gpu_memory_report import site_of, summarise
        gib = 2**30
        ours = [{"filename": "/x/torch/nn/functional.py", "line": 9, "name": "linear"},
                {"filename": "/r/torch_direct/gnn/pipeline/stages.py", "line": 120, "name": "make"}]
        theirs = [{"filename": "/x/torch/cuda/graphs.py", "line": 5, "name": "capture"}]
        snap = {"segments": [
            {"stream": 7, "total_size": 4 * gib, "blocks": [
                {"size": 2 * gib, "state": "active_allocated", "frames": ours},
                {"size": gib, "state": "active_allocated", "frames": ours},
                {"size": gib, "state": "inactive", "frames": ours}]},
            {"stream": 0, "total_size": 2 * gib, "blocks": [
                {"size": gib, "state": "active_allocated", "frames": theirs},
                {"size": gib // 2, "state": "active_pending_free", "frames": []},
                {"size": gib // 2, "state": "active_allocated"}]}]}
        got = summarise(snap, top=2)
        self.assertEqual((got["allocated_gib"], got["reserved_gib"]), (4.5, 6.0))
        self.assertEqual(got["by_stream_gib"], {"7": 3.0, "0": 1.5})
        self.assertEqual(got["sites"], [
            {"site": "torch_direct/gnn/pipeline/stages.py:120 make", "gib": 3.0, "blocks": 2},
            {"site": "/x/torch/cuda/graphs.py:5 capture", "gib": 1.0, "blocks": 1}])
        self.assertEqual(got["other_sites_gib"], 0.5)   # the block without frames
        self.assertEqual(site_of([]), "unknown")
        self.assertEqual(summarise({})["allocated_gib"], 0.0)


class TestTraceOverlap(TestCase):
    """The step's span, busy time, gaps and overlap on a small trace whose figures are known."""

    @staticmethod
    def trace(kernels, marks=((0, 100), (200, 300))):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "train_step", "pid": 1, "tid": 1, "ts": a, "dur": b - a}
              for a, b in marks]
        for corr, tid, launch, cat, name, stream, ts, dur in kernels:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                       "ts": launch, "dur": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                       "args": {"correlation": corr, "stream": stream}})
        return {"traceEvents": ev}

    def run_tool(self, d, doc, *extra):
        path = Path(d) / "t.json"
        path.write_text(json.dumps(doc))
        return script("trace_overlap.py", str(path), *extra, timeout=120)

    def test_figures(self):
        doc = self.trace([
            (1, 1, 10, "kernel", "gemm", 7, 20, 30),         # step 1: two kernels, a 10 us gap between
            (2, 1, 50, "kernel", "gemm", 7, 60, 20),
            (3, 1, 210, "kernel", "relu", 7, 220, 10),       # step 2: a graph's two kernels, one launch
            (3, 1, 210, "kernel", "gemm", 7, 240, 30),
            (9, 2, 5, "kernel", "sample", 13, 30, 40),       # the loader's, another thread: 30 us beside the step
            (10, 1, 150, "gpu_memcpy", "Memcpy HtoD", 13, 230, 20)])  # launched between steps: 10 us beside
        other = self.trace([(1, 1, 10, "kernel", "gemm", 7, 20, 20)], marks=((0, 100),))
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "o.json").write_text(json.dumps(other))
            r = self.run_tool(d, doc, "--compare", str(Path(d) / "o.json"), "--json", str(Path(d) / "r.json"))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads((Path(d) / "r.json").read_text())
        self.assertEqual((rec["steps"], list(rec["step_streams"])), (2, ["7"]))
        self.assertAlmostEqual(rec["step_busy_ms"], 0.090)
        s7 = rec["step_streams"]["7"]
        self.assertEqual(s7["steps"], 2)
        self.assertAlmostEqual(s7["busy_ms"], 0.090)
        self.assertAlmostEqual(s7["idle_inside_steps_ms"], 0.020)    # 10 us inside each step
        self.assertAlmostEqual(s7["idle_between_steps_ms"], 0.140)   # from 80 to 220
        self.assertAlmostEqual(s7["period_ms"], 0.200)               # first starts at 20 and 220
        self.assertAlmostEqual(rec["step_busy_beside_other_ms"], 0.040)
        self.assertEqual([(b["name"], round(b["ms"] * 1e3)) for b in rec["beside_step_ms"]],
                         [("sample", 30), ("Memcpy HtoD", 10)])
        gemm, relu = rec["step_kernels"]
        self.assertEqual((gemm["name"], gemm["count"], relu["name"], relu["count"]), ("gemm", 3, "relu", 1))
        self.assertAlmostEqual(gemm["stretch"], 80 / 3 / 20)
        self.assertIsNone(relu["stretch"])
        self.assertIn("(not in the other)", r.stdout)

    def test_clear_errors(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_tool(d, self.trace([], marks=()))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no train_step ranges", r.stderr)
            r = self.run_tool(d, self.trace([(9, 2, 5, "kernel", "sample", 13, 30, 40)]))
            self.assertIn("no device work launched in them", r.stderr)
            path = Path(d) / "bad.json"
            path.write_text("{")
            r = script("trace_overlap.py", str(path), timeout=120)
            self.assertIn("is not a Chrome trace", r.stderr)


class TestLaunchContentionProbe(TestCase):
    def run_probe(self, *args):
        return script("launch_contention_probe.py", *args, timeout=300)

    def test_bad_input(self):
        for args, msg in ((["--pieces", "1024,x"], "--pieces must be integers"),
                          (["--pieces", "8"], "each >= 16"),
                          (["--threads", "0"], "must be >= 1"),
                          (["--seconds", "0"], "must be positive")):
            with tempfile.TemporaryDirectory() as d:
                r = self.run_probe(str(Path(d) / "out.json"), *args)
                self.assertEqual(r.returncode, 2, msg=f"{args}: {r.stderr[-500:]}")
                self.assertIn(msg, r.stderr)
                self.assertFalse((Path(d) / "out.json").exists())

    def test_without_a_gpu_says_so(self):
        import torch
        if torch.cuda.is_available():
            self.skipTest("this machine has a GPU: the probe would run for real")
        with tempfile.TemporaryDirectory() as d:
            r = self.run_probe(str(Path(d) / "out.json"), "--seconds", "0.1")
            self.assertEqual(r.returncode, 2, r.stderr[-500:])
            self.assertIn("needs a CUDA GPU", r.stderr)


class TestFeatureBitsProbe(TestCase):
    def probe(self, *args):
        return script("feature_bits_probe.py", *args)

    def test_each_form_trains_on_its_own_rounded_copy(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "r.json"
            r = self.probe("--dataset", "tiny", "--root", d, "--bits", "4,fp8,2", "--out", str(out), "--",
                           "--epochs", "1", "--no-progress", "--threads", "1", "--hidden", "16", "--test-nodes", "200")
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads(out.read_text())
            self.assertIn("provenance", rec)
            self.assertEqual([row["form"] for row in rec["rows"]], ["stored (float32)", "4", "fp8", "2"])
            err = {row["form"]: row["relative_error"] for row in rec["rows"]}
            # the stored run reads the features as they are; fewer levels, larger error
            self.assertEqual(err["stored (float32)"], 0.0)
            self.assertGreater(err["fp8"], 0.0)
            self.assertGreater(err["4"], err["fp8"])
            self.assertGreater(err["2"], err["4"])
            for row in rec["rows"]:
                self.assertTrue(0.0 <= row["test_acc"] <= 1.0, row)
            self.assertEqual(rec["rows"][0]["test_acc_vs_stored"], 0.0)
            # the rounded copies are gone; the data set's own cache and the record stay
            self.assertEqual(sorted(p.name for p in Path(d).iterdir()), ["r.json", "tiny-seed0"])

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as d:
            assert_refused(self, lambda *args: self.probe("--root", d, *args), (
                              (["--bits", "9"], "fp8 or an integer from 2 to 8, got '9'"),
                              (["--bits", "4,4"], "4 is given twice"),
                              (["--dataset", "ogbn-arxiv"], "--dataset: one of"),
                              (["--", "--root", d], "give --root to the probe"),
                              (["--", "--json=x.json"], "give --json to the probe"),
                              (["--", "--epochs", "0"], "--epochs")))
            self.assertEqual(list(Path(d).iterdir()), [])   # nothing generated before the checks


class TestInt4ReadProbe(TestCase):
    def test_both_ways_agree_and_every_part_is_timed(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "r.json"
            r = script("int4_read_probe.py", "--device", "cpu", "--batch", "3000", "--cache-rows", "5000",
                       "--repeats", "2", "--batches", "10", "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            rec = json.loads(out.read_text())
            self.assertIn("provenance", rec)
            self.assertEqual(set(rec["parts_us"]), {"bytes_first", "in_place", "float8"})
            for way, parts in rec["parts_us"].items():
                self.assertEqual(rec["batch_us"][way], sum(parts.values()))
                self.assertTrue(all(us > 0 for us in parts.values()), parts)
                self.assertAlmostEqual(rec["epoch_s"][way], rec["batch_us"][way] * 10 / 1e6)
            self.assertTrue(0 < rec["misses"] < 3000)

    def test_bad_input(self):
        assert_refused(self, lambda *args: script("int4_read_probe.py", *args), (
            (["--hit-rate", "1"], "--hit-rate must lie strictly between 0 and 1"),
            (["--batch", "0"], "must be >= 1"),
            (["--device", "meta"], "--device must be cuda or cpu")))


if __name__ == "__main__":
    run_tests()
