"""python -m torch_direct train."""

import contextlib
import io
import json
import os
import tempfile
import threading
import time
import unittest
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import requires_gpu
from torch_direct.__main__ import main
from torch_direct.gnn.graph import load_dataset
from torch_direct.gnn.pipeline import batches, evaluation, models, train
from torch_direct.gnn.pipeline.timing import STEP_MARK

try:
    import torch_geometric  # noqa: F401
    HAS_PYG = True
except ImportError:
    HAS_PYG = False

# Small and fast: one CPU thread (a busy 2-core CI machine oversubscribes torch's pool),
# the plain-torch layers, a narrow model, no progress bars.
FAST = ["--threads", "1", "--layers", "builtin", "--hidden", "64", "--batch-size", "256",
        "--no-progress"]


def train_sampled_batch(ds, fanouts, n: int = 64):
    """One CPU-sampled batch of ``n`` training seeds of ``ds``."""
    from torch_direct.gnn.graph import NeighborSampler
    return NeighborSampler(ds.graph, fanouts, seed=0).sample(ds.split["train"][:n])


class TestTrain(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = cls.tmp.name
        cls.ds = load_dataset("tiny", root=cls.root, show_progress=False)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.threads = torch.get_num_threads()

    def tearDown(self):
        torch.set_num_threads(self.threads)
        self.assertEqual([t for t in threading.enumerate()
                          if t.name in ("torch_direct-loader", "torch_direct-sampler")], [])

    def args(self, *extra):
        from argparse import ArgumentParser
        p = ArgumentParser()
        train.add_arguments(p)
        return p.parse_args(["--root", self.root, *FAST, *extra])

    def quiet_run(self, *extra):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rec = train.run(self.args(*extra))
        return rec, out.getvalue()

    def test_learns_tiny_well_above_chance(self):
        rec, out = self.quiet_run("--epochs", "8", "--seed", "0", "--full-eval")
        y = self.ds.y[self.ds.split["test"]]
        majority = torch.bincount(y).max().item() / y.numel()
        self.assertGreater(rec["test_acc"], max(0.6, 2 * majority))
        self.assertGreater(rec["epochs"][-1]["valid_acc"], max(0.6, 2 * majority))
        self.assertGreater(rec["epochs"][-1]["train_acc"], rec["epochs"][0]["train_acc"])
        self.assertLess(abs(rec["test_acc_full"] - rec["test_acc"]), 0.05)
        self.assertEqual(len(rec["epochs"]), 8)
        for line in ("epoch   1  total", "exposed: sample", "valid acc", "test acc", "full neighbourhoods"):
            self.assertIn(line, out)

    def test_pipelines_agree_for_a_seed(self):
        # On the CPU every step is deterministic: the three pipelines give the same numbers exactly.
        accs = {}
        for kind in ("unified", "cpu_centric", "gpu_resident"):
            rec, _ = self.quiet_run("--epochs", "1", "--pipeline", kind, "--device", "cpu")
            accs[kind] = (rec["epochs"][0]["loss"], rec["test_acc"])
        self.assertEqual(len(set(accs.values())), 1, msg=str(accs))

    def test_feature_dtype_fp8_learns_like_the_stored_table(self):
        # The three pipelines agree on a float8 table too; it learns tiny as well as the float32
        # one (e4m3 keeps 3 mantissa bits) and the record names the format.
        y = self.ds.y[self.ds.split["test"]]
        majority = torch.bincount(y).max().item() / y.numel()
        recs = {}
        for kind in ("unified", "cpu_centric", "gpu_resident"):
            recs[kind], out = self.quiet_run("--epochs", "8", "--seed", "0", "--pipeline", kind, "--device", "cpu",
                                             "--feature-dtype", "fp8")
            self.assertEqual(recs[kind]["feature_dtype"], "float8_e4m3fn with row scales")
            self.assertIn("features as float8_e4m3fn", out)
        self.assertEqual(len({(r["epochs"][0]["loss"], r["test_acc"]) for r in recs.values()}), 1, msg=str(recs))
        stored, _ = self.quiet_run("--epochs", "8", "--seed", "0", "--device", "cpu")
        self.assertGreater(recs["unified"]["test_acc"], max(0.6, 2 * majority))
        self.assertLess(abs(recs["unified"]["test_acc"] - stored["test_acc"]), 0.05)
        half, _ = self.quiet_run("--epochs", "1", "--device", "cpu", "--feature-dtype", "fp16")
        self.assertEqual(half["feature_dtype"], "float16")

    def test_builtin_layers_take_a_half_table_as_it_is(self):
        from types import SimpleNamespace as Args
        builtin, pyg = Args(layers="builtin", model="sage"), Args(layers="pyg", model="sage")
        for table in (torch.float16, torch.bfloat16):
            self.assertEqual(batches.batch_dtype(builtin, table, None), table)
            self.assertEqual(batches.batch_dtype(pyg, table, None), torch.float32)      # PyG's convs
        self.assertEqual(batches.batch_dtype(builtin, torch.float32, None), torch.float32)
        fp8, scale = torch.float8_e4m3fn, torch.ones(3)
        self.assertEqual(batches.batch_dtype(builtin, fp8, scale), torch.float32)
        self.assertEqual(batches.batch_dtype(builtin, fp8, scale, torch.float32), torch.float32)
        self.assertEqual(batches.batch_dtype(builtin, fp8, scale, torch.float16), torch.float16)   # its source's
        self.assertEqual(batches.batch_dtype(pyg, fp8, scale, torch.float16), torch.float32)
        self.assertEqual(batches.batch_dtype(Args(layers="builtin", model="gat"), torch.float16, None),
                         torch.float32)

    def test_sample_ahead_trains_the_same(self):
        # Sampling in its own thread changes when batches are made, not what they are; so does the
        # loader's stream priority (no stream on the CPU: recorded, no effect).
        recs = [self.quiet_run("--epochs", "1", "--device", "cpu", *extra)[0]
                for extra in ([], ["--sample-ahead"], ["--loader-priority", "high"], ["--step-priority", "high"])]
        for rec in recs[1:]:
            self.assertEqual(recs[0]["epochs"][0]["loss"], rec["epochs"][0]["loss"])
            self.assertEqual(recs[0]["test_acc"], rec["test_acc"])
        self.assertEqual(recs[2]["loader_priority"], "high")
        self.assertEqual(recs[3]["step_priority"], "high")
        with self.assertRaisesRegex(ValueError, "both at one priority"):
            self.quiet_run("--epochs", "1", "--device", "cpu", "--loader-priority", "high", "--step-priority", "high")
        with self.assertRaisesRegex(ValueError, "--sample-ahead 2 needs the GPU sampler"):
            self.quiet_run("--epochs", "1", "--device", "cpu", "--sample-ahead", "2")
        with self.assertRaisesRegex(ValueError, "--sampler-batches applies to the GPU sampler"):
            self.quiet_run("--epochs", "1", "--device", "cpu", "--sampler-batches", "4")

    def test_step_host_tallies_the_same(self):
        # The loop's loss and accuracy tally in one C++ call (the default) or op by op
        # (step_host=python): the same epoch record, bit for bit.
        recs = []
        for host in ("fused", "python"):
            with torch_direct.experimental(step_host=host):
                recs.append(self.quiet_run("--epochs", "2", "--device", "cpu")[0])
        for a, b in zip(recs[0]["epochs"], recs[1]["epochs"]):
            self.assertEqual((a["loss"], a["train_acc"]), (b["loss"], b["train_acc"]))
        self.assertGreater(recs[0]["epochs"][0]["train_acc"], 0.0)   # a tally that counted something

    def test_profile_writes_the_top_operators(self):
        n_train = self.ds.split["train"].numel()
        bs = max(1, n_train // 40)                      # about 40 steps: steps 10-29 are profiled
        path = os.path.join(self.root, "prof", "steps.txt")
        rec, out = self.quiet_run("--epochs", "2", "--device", "cpu", "--batch-size", str(bs), "--profile", path)
        text = open(path).read()
        self.assertTrue(text.startswith("20 training steps (from step 10 of epoch 1), sorted by self_cpu_time_total"))
        self.assertIn("aten::", text)
        self.assertIn(f"wrote {path} (20 profiled steps of epoch 1)", out)
        self.assertEqual(len(rec["epochs"]), 2)
        trace = os.path.join(self.root, "prof", "steps.json")
        self.quiet_run("--epochs", "1", "--device", "cpu", "--batch-size", str(bs), "--profile", trace)
        # Chrome's trace-event format: an object with traceEvents (kineto's profiler) or a bare
        # array of events (the legacy profiler of a torch built without kineto)
        events = json.load(open(trace))
        events = events["traceEvents"] if isinstance(events, dict) else events
        self.assertTrue(any(str(e.get("name", "")).startswith("aten::") for e in events))
        # each profiled step's call is marked, so a trace tells the step's work from the loader's
        self.assertEqual(sum(e.get("name") == STEP_MARK for e in events), 20)
        short = os.path.join(self.root, "prof", "short.txt")   # too few steps to reach step 10
        self.quiet_run("--epochs", "1", "--device", "cpu", "--profile", short)
        self.assertIn("no step profiled", open(short).read())

    def test_json_record(self):
        path = os.path.join(self.root, "out", "run.json")
        svg = os.path.join(self.root, "out", "run.svg")
        self.quiet_run("--epochs", "2", "--json", path, "--prefetch", "0", "--plot", svg, "--device", "cpu")
        self.assertTrue(open(svg).read().startswith("<svg"))
        rec = json.loads(open(path).read())
        self.assertEqual(rec["args"]["pipeline"], "unified")
        self.assertEqual(rec["device"], "cpu")
        self.assertEqual(rec["backend"], "builtin")
        e = rec["epochs"][0]
        for k in ("total_s", "train_step_s", "train_step_host_s", "train_step_cpu_s", "loader_wait_s", "loss",
                  "train_acc", "valid_acc"):
            self.assertIn(k, e)
        self.assertEqual(set(e["exposed_s"]), {"sample", "gather", "transfer"})
        self.assertIn("test_acc", rec)

    def test_step_host_time_and_cpu_time(self):
        # The step's host side: a step that waits (as for the GIL or a core) spends wall time
        # without CPU time; one that computes spends both.
        class B:
            batch_size = 2
            y = torch.tensor([0, 1])
        out = torch.tensor([[1.0, 0.0], [0.0, 1.0]])

        def waits(b):
            time.sleep(0.04)
            return torch.tensor(1.0), out

        def computes(b):
            t = time.thread_time()
            while time.thread_time() - t < 0.04:
                pass
            return torch.tensor(1.0), out
        model = torch.nn.Linear(1, 1)
        cpu = torch.device("cpu")
        ep = train.train_epoch(model, None, [B(), B(), B()], cpu, False, "t", step=waits)
        self.assertGreaterEqual(ep["step_host"], 0.12)
        self.assertLess(ep["step_cpu"], 0.06)
        self.assertEqual(ep["step"], ep["step_host"])   # on the CPU the step's time is its host time
        self.assertEqual((ep["correct"], ep["seen"]), (6.0, 6.0))
        ep = train.train_epoch(model, None, [B(), B(), B()], cpu, False, "t", step=computes)
        self.assertGreaterEqual(ep["step_cpu"], 0.12)
        self.assertGreaterEqual(ep["step_host"], ep["step_cpu"] * 0.9)
        rec = train.epoch_record(1, ep, {"wait": 0.0, "busy": {"sample": 0.0}, "batches": 3}, 0.5)
        self.assertEqual((rec["train_step_host_s"], rec["train_step_cpu_s"]), (ep["step_host"], ep["step_cpu"]))
        # no stream on the CPU: no step is counted as handed to one that ran dry
        self.assertEqual((rec["train_steps_dry"], rec["train_step_dry_host_s"]), (0, 0.0))
        # no captured step with two sets of buffers: no copies' wait to report
        self.assertIsNone(rec["train_step_copy_wait_s"])
        if os.path.exists("/proc/thread-self/schedstat"):
            self.assertGreaterEqual(ep["run_delay"], 0.0)
            self.assertEqual(rec["loop_run_delay_s"], ep["run_delay"])
        self.assertIsNone(rec["loop_gil_wait_ms"])   # 3 steps: no 8th step sampled
        ep = train.train_epoch(model, None, [B()] * 16, cpu, False, "t", step=lambda b: (torch.tensor(1.0), out))
        self.assertGreaterEqual(ep["gil_ms"], 0.0)   # steps 8 and 16 sampled
        self.assertEqual(train.epoch_record(1, ep, {"wait": 0.0, "busy": {}, "batches": 16}, 0.5)["loop_gil_wait_ms"],
                         ep["gil_ms"])

    @unittest.skipUnless(torch_direct.cuda_available(), "needs a CUDA GPU: the training stream's state")
    def test_steps_handed_to_a_dry_stream_are_counted(self):
        # A step whose stream still runs the previous one is not counted; one that a slow loader
        # hands over after the stream ran dry is, with the loop's time in its call.
        dev = torch.device("cuda", 0)

        class B:
            batch_size = 2
            y = torch.tensor([0, 1], device=dev)
        out = torch.tensor([[1.0, 0.0], [0.0, 1.0]], device=dev)
        loss = torch.tensor(1.0, device=dev)

        def busy(b):   # tens of milliseconds of GPU time a step, queued without a host wait
            torch.cuda._sleep(50_000_000)
            return loss, out

        class SlowLoader:   # as a loader: a length (the progress bar's) and batches
            def __init__(self, n):
                self.n = n

            def __len__(self):
                return self.n

            def __iter__(self):
                for _ in range(self.n):
                    time.sleep(0.05)   # the stream's short steps are long done by then
                    yield B()
        model = torch.nn.Linear(1, 1)
        ep = train.train_epoch(model, None, [B()] * 4, dev, False, "t", step=busy)
        self.assertEqual(ep["dry_steps"], 1)   # the first only: each later one queued behind the last
        ep = train.train_epoch(model, None, SlowLoader(4), dev, False, "t", step=lambda b: (loss, out))
        self.assertEqual(ep["dry_steps"], 4)
        self.assertGreater(ep["dry_step_host"], 0.0)
        self.assertEqual(ep["dry_step_host"], ep["step_host"])   # every step dry: the same host seconds
        rec = train.epoch_record(1, ep, {"wait": 0.0, "busy": {}, "batches": 4}, 0.5)
        self.assertEqual((rec["train_steps_dry"], rec["train_step_dry_host_s"]), (4, ep["dry_step_host"]))

    def test_gil_probe_times_getting_the_gil_back(self):
        # The probe lets the GIL go (time.sleep(0)) on every every-th tick and averages how long
        # that took: a release that takes 15 ms, as behind a thread that keeps the GIL for its
        # switch interval, reads as 15 ms; the other ticks release nothing. (Whether a spinning
        # thread takes the GIL in that instant is the scheduler's race, so the release is
        # slowed here rather than contended: a spinning thread made this flaky on 2 cores.)
        from torch_direct.gnn.pipeline import timing
        probe = timing.GilProbe(every=2)
        self.assertIsNone(probe.mean_ms())
        released, real_sleep = [], time.sleep

        def slow_release(seconds):
            released.append(seconds)
            real_sleep(0.015)
        with mock.patch.object(timing.time, "sleep", slow_release):
            for _ in range(6):
                probe.tick()
        self.assertEqual(released, [0, 0, 0])
        self.assertEqual((probe.ticks, probe.samples), (6, 3))
        self.assertGreater(probe.mean_ms(), 14.0)
        alone = timing.GilProbe(every=1)   # no other thread: about a system call
        for _ in range(20):
            alone.tick()
        self.assertLess(alone.mean_ms(), 10.0)

    def test_gil_switch_interval_for_the_run_only(self):
        import sys
        before = sys.getswitchinterval()
        seen = []
        with mock.patch.object(train, "_run", lambda *a: seen.append(sys.getswitchinterval()) or {}):
            with torch_direct.experimental(gil_switch_us=250):
                train.run(self.args("--device", "cpu"))
            train.run(self.args("--device", "cpu"))
            for bad in ("0", "x", "-5"):
                with torch_direct.experimental(gil_switch_us=bad), self.assertRaisesRegex(ValueError, "gil_switch_us"):
                    train.run(self.args("--device", "cpu"))
        self.assertAlmostEqual(seen[0], 250e-6)
        self.assertEqual(seen[1:], [before])   # unset: Python's own; a bad value runs nothing
        self.assertEqual(sys.getswitchinterval(), before)

    def test_run_delay_counts_waiting_for_a_core(self):
        # The loop's wait for a core: processes that keep every core busy make a busy thread wait.
        # (Processes, not threads: a thread would hold the GIL, which is not a wait for a core.)
        from torch_direct.gnn.pipeline.timing import thread_run_delay
        if thread_run_delay() is None:
            self.skipTest("the kernel gives no scheduler statistics here (/proc/thread-self/schedstat)")
        import subprocess
        import sys
        spin = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end:\n    pass\n"
        procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3 * (os.cpu_count() or 1))]
        time.sleep(0.3)
        d0, t0 = thread_run_delay(), time.thread_time()
        while time.thread_time() - t0 < 0.3:
            pass
        d1 = thread_run_delay()
        for p in procs:
            p.wait()
        self.assertGreater(d1 - d0, 0.05)

    def test_cli_help_and_bad_input(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as cm:
            main(["train", "--help"])
        self.assertEqual(cm.exception.code, 0)
        for opt in ("--pipeline", "--fanouts", "--model", "--json", "--plot", "--device", "--cache-mb", "--cache-share",
                    "--prefetch",
                    "--graph", "--gather-sms", "--gather-cpu-threads", "--gather-cpu-share", "--feature-dtype"):
            self.assertIn(opt, out.getvalue())
        for bad in (["--fanouts", "15,x"], ["--fanouts", "0"], ["--epochs", "0"], ["--model", "gcn"],
                    ["--pipeline", "nvme"], ["--batch-size", "-3"], ["--gather-cpu-share", "1.5"],
                    ["--gather-cpu-share", "nan"], ["--gather-cpu-share", "all"], ["--cache-share", "1.5"],
                    ["--cache-share", "half"]):
            with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as cm:
                main(["train", *bad])
            self.assertEqual(cm.exception.code, 2, msg=str(bad))
        for bad, msg in ((["--dataset", "nope"], "unknown data set"),
                         (["--eval-fanouts", "20,20"], "one per layer"),
                         (["--device", "tpu"], "not a device"),
                         (["--cache-mb", "8", "--pipeline", "gpu_resident"], "whole table is in GPU memory"),
                         (["--gather-sms", "8", "--pipeline", "gpu_resident"], "--gather-sms applies to --pipeline unified only"),
                         (["--gather-cpu-share", "0.5"], "--gather-cpu-share 0.5 sets the share of the hybrid "
                                                         "gather's CPU threads: give --gather-cpu-threads too"),
                         (["--gather-cpu-threads", "2", "--pipeline", "cpu_centric"],
                          "--gather-cpu-threads applies to --pipeline unified only"),
                         (["--graph", "gpu", "--device", "cpu"], "--graph gpu needs a CUDA device"),
                         (["--device", "cpu", "--cache-mb", "8"], "--cache-mb caches rows in GPU memory"),
                         (["--cache-share", "0.5", "--cache-mb", "8"], "--cache-mb and --cache-share both size"),
                         (["--cache-share", "0"], "--cache-share 0 holds no row"),
                         (["--cache-share", "0.5", "--pipeline", "gpu_resident"],
                          "--cache-share does not apply to --pipeline gpu_resident"),
                         (["--device", "cpu", "--cache-share", "0.5"], "--cache-share caches rows in GPU memory"),
                         (["--device", "cpu", "--gather-sms", "8"], "no effect with --device cpu"),
                         (["--device", "cpu", "--gather-cpu-threads", "2"], "no effect with --device cpu"),
                         (["--sample-ahead", "--prefetch", "0"], "--sample-ahead needs --prefetch > 0"),
                         (["--gather-workers", "2"], "--gather-workers 2 takes its batches from sampling threads"),
                         (["--gather-workers", "2", "--pipeline", "pyg"],
                          "--gather-workers does not apply to --pipeline pyg"),
                         (["--feature-dtype", "fp8", "--pipeline", "pyg"], "--feature-dtype does not apply"),
                         (["--graph", "gpu", "--sampler", "cpu", "--device", "cpu"], "needs a CUDA device")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(["train", "--root", self.root, *FAST, *bad])
            self.assertEqual(code, 2, msg=str(bad))
            self.assertIn(msg, err.getvalue())

    def test_bad_paths_are_refused_before_any_data_is_loaded(self):
        with tempfile.TemporaryDirectory() as d:
            a_file = os.path.join(d, "file")
            open(a_file, "w").close()
            empty_root = os.path.join(d, "never-made")
            for bad, msg in ((["--json", d], "--json: "), (["--json", os.path.join(a_file, "x.json")], "--json: "),
                             (["--plot", os.path.join(d, "x.png")], "give a .svg path"),
                             (["--profile", os.path.join(d, "p.csv")], "--profile: give a .txt"),
                             (["--root", a_file], "--root: ")):
                err = io.StringIO()
                root = [] if "--root" in bad else ["--root", empty_root]
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    code = main(["train", *root, *FAST, *bad])
                self.assertEqual(code, 2, msg=str(bad))
                self.assertIn(msg, err.getvalue())
                self.assertEqual(err.getvalue().count("\n"), 1, err.getvalue())  # one line
            self.assertFalse(os.path.exists(empty_root))  # nothing generated for a refused run
            # experimental settings, checked first too (driver pages need a GPU)
            refused = [({"feature_pages": "big"}, "feature_pages must be small, huge or driver, not 'big'"),
                       ({"hybrid_split": "nearest"}, "hybrid_split must be index or address, not 'nearest'"),
                       ({"gil_switch_us": "0"}, "gil_switch_us must be an integer >= 1, not '0'"),
                       ({"cpu_pool_nice": "25"}, "cpu_pool_nice must be an integer from 0 to 19, not '25'"),
                       ({"cpu_pool_nice": "-1"}, "cpu_pool_nice must be an integer from 0 to 19, not '-1'"),
                       ({"cpu_pool_size": "all"}, "cpu_pool_size must be concurrent or largest, not 'all'"),
                       ({"cpu_gather_stores": "nt"}, "cpu_gather_stores must be plain or streaming, not 'nt'"),
                       ({"hybrid_copies": "async"}, "hybrid_copies must be wait or ordered, not 'async'"),
                       ({"hybrid_piece_kb": "1"}, "hybrid_piece_kb must be an integer >= 16, not '1'"),
                       ({"gather_turns": "skip"}, "gather_turns must be wait or deposit, not 'skip'"),
                       ({"step_host": "cpp"}, "step_host must be fused, fused_waits, aten or python, not 'cpp'"),
                       ({"store_index_bounds": "trusted"}, "store_index_bounds must be checked or known, not 'trusted'")]
            if not torch_direct.cuda_available():
                refused.append(({"feature_pages": "driver"}, "feature_pages=driver needs a CUDA GPU"))
            for settings, msg in refused:
                with torch_direct.experimental(**settings):
                    err = io.StringIO()
                    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                        code = main(["train", "--root", empty_root, *FAST])
                self.assertEqual(code, 2)
                self.assertIn(msg, err.getvalue())
                self.assertFalse(os.path.exists(empty_root))

    def test_test_nodes_is_a_fixed_subset(self):
        test = self.ds.split["test"]
        some = evaluation.test_ids(self.ds, 50, seed=3)
        self.assertEqual(some.numel(), 50)
        self.assertTrue(bool(torch.isin(some, test).all()))
        self.assertEqual(some, evaluation.test_ids(self.ds, 50, seed=3))       # fixed for a seed
        self.assertNotEqual(some, evaluation.test_ids(self.ds, 50, seed=4))
        self.assertEqual(evaluation.test_ids(self.ds, 0), test)                 # 0: the whole split
        self.assertEqual(evaluation.test_ids(self.ds, test.numel() + 5), test)
        rec, out = self.quiet_run("--epochs", "1", "--device", "cpu", "--test-nodes", "50", "--full-eval")
        self.assertEqual(rec["test_nodes"], 50)
        self.assertIn("50 nodes", out)
        self.assertEqual(rec["test_acc"] * 50, round(rec["test_acc"] * 50))  # a count over 50 nodes
        self.assertEqual(rec["test_acc_full"] * 50, round(rec["test_acc_full"] * 50))

    def test_graph_copy_checks_free_gpu_memory_first(self):
        # The check runs before any CUDA allocation: with too little free memory reported, the
        # copy is refused with a clear error (on a machine without a GPU too).
        # No idle allocator blocks either: on a GPU, earlier tests leave some, which count as free.
        need = self.ds.graph.rowptr.nbytes + self.ds.graph.col.nbytes
        with mock.patch("torch.cuda.mem_get_info", return_value=(need, 10 * need)), \
                mock.patch("torch.cuda.memory_reserved", return_value=0), \
                mock.patch("torch.cuda.memory_allocated", return_value=0), \
                self.assertRaisesRegex(ValueError, "keep it in host memory \\(--graph unified\\)"):
            batches.graph_to_gpu(self.ds.graph, torch.device("cuda", 0))

    def test_graph_copy_counts_the_allocators_idle_blocks_as_free(self):
        # An earlier run in the same process (experiments/train_variants.py) leaves blocks in
        # torch's caching allocator that the driver reports as taken: whole idle segments count
        # as free; blocks that tensors still use, and free blocks split off them, do not.
        g, dev = self.ds.graph, torch.device("cuda", 0)
        need = sum(t.nbytes for t in (g.rowptr, g.col, g.edge_ids) if t is not None)
        with mock.patch("torch.cuda.mem_get_info", return_value=(need, 10 * need)), \
                mock.patch("torch.cuda.memory_reserved", return_value=5 * need), \
                mock.patch("torch.cuda.memory_allocated", return_value=2 * need), \
                mock.patch("torch.cuda.memory_stats", return_value={}):   # on a GPU: not this process's own
            self.assertEqual(batches.free_gpu_bytes(dev), 4 * need)
            with mock.patch("torch.cuda.memory_stats", return_value={"inactive_split_bytes.all.current": need}):
                self.assertEqual(batches.free_gpu_bytes(dev), 3 * need)
            with mock.patch.object(type(g), "to", return_value="copied") as to:
                self.assertEqual(batches.graph_to_gpu(g, dev), "copied")
            to.assert_called_once_with(dev)
        with mock.patch("torch.cuda.mem_get_info", return_value=(need, 10 * need)), \
                mock.patch("torch.cuda.memory_reserved", return_value=5 * need), \
                mock.patch("torch.cuda.memory_allocated", return_value=5 * need), \
                self.assertRaisesRegex(ValueError, "keep it in host memory \\(--graph unified\\)"):
            batches.graph_to_gpu(g, dev)

    def small_model(self, layers: int, store_kind: str):
        """A seeded built-in GraphSAGE of ``layers`` layers (eval mode) and a CPU feature store."""
        from torch_direct.gnn.pipeline import make_feature_store
        torch.manual_seed(0)
        ds = self.ds
        model = models.GNN("sage", ds.num_features, 16, ds.num_classes, layers, use_pyg=False).eval()
        return ds, model, make_feature_store(store_kind, ds.x, "cpu")

    def test_layerwise_inference_equals_full_neighbourhood_batches(self):
        from torch_direct.gnn.graph import NeighborSampler
        from torch_direct.gnn.pipeline import PipelinedLoader
        ds, model, store = self.small_model(2, "unified")
        logits = evaluation.layerwise_inference(model, ds.graph, store, torch.device("cpu"), chunk=700)
        ids = ds.split["test"][:300]
        with PipelinedLoader(NeighborSampler(ds.graph, [-1, -1]), store, ids, 100, shuffle=False) as ld:
            for b in ld:
                self.assertEqual(model(b.x, b.adjs), logits[b.n_id[:b.batch_size]], atol=1e-4, rtol=1e-4)

    def test_layerwise_inference_for_some_targets(self):
        # Only the targets' logits: the layers run for the nodes the next layer reads, and give
        # the same numbers as inference over every node.
        ds, model, store = self.small_model(3, "cpu_centric")
        every = evaluation.layerwise_inference(model, ds.graph, store, torch.device("cpu"), chunk=500)
        targets = torch.cat([ds.split["test"][:40].flip(0), ds.split["test"][:5]])  # unsorted, repeats
        some = evaluation.layerwise_inference(model, ds.graph, store, torch.device("cpu"), chunk=97, targets=targets)
        self.assertEqual(some, every[targets], atol=1e-5, rtol=1e-5)
        self.assertEqual(evaluation.layerwise_inference(model, ds.graph, store, torch.device("cpu"),
                                                   targets=torch.tensor([], dtype=torch.long)).shape[0], 0)
        with self.assertRaisesRegex(IndexError, "node ids in"):
            evaluation.layerwise_inference(model, ds.graph, store, torch.device("cpu"), targets=[ds.num_nodes])

    def test_bf16_autocasts_the_model_and_keeps_fp32_weights(self):
        # The layers compute in bfloat16; the logits come back float32, and the weights and their
        # gradients stay float32 (autocast, not a bfloat16 model).
        sb = train_sampled_batch(self.ds, [5, 5])
        x = self.ds.x[sb.n_id].float()
        y = self.ds.y[sb.n_id[:sb.batch_size]]
        for precision, inner in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            torch.manual_seed(0)
            model = models.GNN("sage", 32, 16, 8, 2, use_pyg=False, precision=precision)
            seen = []
            model.layers[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
            out = model(x, sb.adjs)
            self.assertEqual((seen, out.dtype), ([inner], torch.float32), msg=precision)
            torch.nn.functional.cross_entropy(out, y).backward()
            for name, w in model.named_parameters():
                self.assertEqual((w.dtype, w.grad.dtype), (torch.float32, torch.float32), msg=name)
        with self.assertRaisesRegex(ValueError, "precision must be one of"):
            models.GNN("sage", 32, 16, 8, 2, use_pyg=False, precision="fp8")

    def test_precision_option(self):
        # bf16 trains tiny as well as fp32 does (the same batches; rounding differs), and the record says so.
        recs = {p: self.quiet_run("--epochs", "8", "--seed", "0", "--device", "cpu", "--precision", p)
                for p in ("fp32", "bf16")}
        self.assertEqual(recs["bf16"][0]["precision"], "bf16")
        self.assertIn("precision bf16", recs["bf16"][1])
        self.assertNotIn("precision", recs["fp32"][1].splitlines()[1])
        accs = {p: r[0]["test_acc"] for p, r in recs.items()}
        self.assertLess(abs(accs["bf16"] - accs["fp32"]), 0.05, msg=str(accs))
        self.assertNotEqual(recs["bf16"][0]["epochs"][0]["loss"], recs["fp32"][0]["epochs"][0]["loss"])
        # TF32 is a GPU format: refused on the CPU before any work, with the matmul setting untouched.
        before = torch.get_float32_matmul_precision()
        with self.assertRaisesRegex(ValueError, "--precision tf32 needs a CUDA device"):
            self.quiet_run("--epochs", "1", "--device", "cpu", "--precision", "tf32")
        self.assertEqual(torch.get_float32_matmul_precision(), before)
        with self.assertRaisesRegex(ValueError, "precision must be one of"):
            with models.model_precision("fp8", "cpu"):
                pass
        # Every epoch trains on the current weights: bf16 learns over the epochs as fp32 does (an
        # autocast around the whole loop would cache the first bfloat16 copy of the weights).
        losses = [e["loss"] for e in recs["bf16"][0]["epochs"]]
        self.assertLess(losses[-1], 0.8 * losses[0], msg=str(losses))
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as cm:
            main(["train", "--precision", "fp16"])
        self.assertEqual(cm.exception.code, 2)

    @requires_gpu
    def test_gpu_precisions_learn_and_restore_the_matmul_setting(self):
        before = torch.get_float32_matmul_precision()
        accs = {}
        for p in models.PRECISIONS:
            rec, _ = self.quiet_run("--epochs", "8", "--seed", "0", "--device", "cuda", "--precision", p)
            accs[p] = rec["test_acc"]
            self.assertEqual(torch.get_float32_matmul_precision(), before, msg=p)
        for p in ("tf32", "bf16"):
            self.assertLess(abs(accs[p] - accs["fp32"]), 0.05, msg=str(accs))
        with models.model_precision("tf32", "cuda"):
            self.assertEqual(torch.get_float32_matmul_precision(), "high")
        self.assertEqual(torch.get_float32_matmul_precision(), before)

    def test_builtin_layers_need_sage(self):
        with self.assertRaisesRegex(RuntimeError, "torch_geometric"):
            models.make_layer("gat", 8, 8, False, use_pyg=False)
        with self.assertRaisesRegex(ValueError, "unknown model"):
            models.make_layer("gcn", 8, 8, False, use_pyg=False)

    def _check_builtin_sage_is_mean_aggregation(self, device):
        # W_l mean_{u in N(v)} x_u + W_r x_v, a target without neighbours aggregating zeros;
        # x_u repeated in N(v) counts as often as it is drawn
        torch.manual_seed(0)
        layer = models.SAGELayer(3, 2).to(device)
        x = torch.randn(6, 3, device=device)
        edge_index = torch.tensor([[3, 4, 4, 5, 2], [0, 0, 1, 1, 1]], device=device)
        out = layer(x, edge_index, (6, 3))
        mean = torch.stack([(x[3] + x[4]) / 2, (x[4] + x[5] + x[2]) / 3, torch.zeros(3, device=device)])
        self.assertEqual(out, layer.lin_l(mean) + layer.lin_r(x[:3]))

    def test_builtin_sage_is_mean_aggregation(self):
        self._check_builtin_sage_is_mean_aggregation("cpu")

    @requires_gpu
    def test_builtin_sage_is_mean_aggregation_on_gpu(self):
        self._check_builtin_sage_is_mean_aggregation("cuda")

    def test_optimizer_is_adam_fused_on_cuda_only(self):
        model = torch.nn.Linear(4, 2)
        opt = models.make_optimizer(model, 0.01)
        self.assertIsInstance(opt, torch.optim.Adam)
        self.assertFalse(opt.defaults["fused"])
        self.assertEqual(opt.defaults["lr"], 0.01)
        frozen = torch.nn.Linear(4, 2)
        frozen.bias.requires_grad_(False)
        self.assertEqual(len(models.make_optimizer(frozen, 0.01).param_groups[0]["params"]), 1)

    @requires_gpu
    def test_fused_adam_steps_as_the_default_one(self):
        torch.manual_seed(0)
        fused_model = torch.nn.Linear(8, 4).cuda()
        plain_model = torch.nn.Linear(8, 4).cuda()
        plain_model.load_state_dict(fused_model.state_dict())
        fused, plain = models.make_optimizer(fused_model, 0.01), torch.optim.Adam(plain_model.parameters(), lr=0.01)
        self.assertTrue(fused.defaults["fused"])
        x = torch.randn(16, 8, device="cuda")
        for _ in range(3):
            for m, o in ((fused_model, fused), (plain_model, plain)):
                o.zero_grad()
                m(x).square().sum().backward()
                o.step()
        for a, b in zip(fused_model.parameters(), plain_model.parameters()):
            self.assertEqual(a, b, atol=1e-5, rtol=1e-5)

    @unittest.skipUnless(HAS_PYG, "torch_geometric is not installed")
    def test_pyg_models_train(self):
        for model in models.MODELS:
            rec, _ = self.quiet_run("--epochs", "1", "--layers", "pyg", "--model", model, "--hidden", "16",
                                    "--fanouts", "5,5", "--batch-size", "512")
            self.assertEqual(rec["backend"], "pyg")
            self.assertGreater(rec["test_acc"], 0.0)

    @requires_gpu
    def test_gpu_pipelines_learn(self):
        # Each pipeline with its default sampler (the GPU sampler for unified and gpu_resident).
        # Two epochs leave tiny at the majority class (on the CPU too); eight learn it.
        y = self.ds.y[self.ds.split["test"]]
        majority = torch.bincount(y).max().item() / y.numel()
        for kind in ("unified", "cpu_centric", "gpu_resident"):
            extra = ["--cache-mb", "1"] if kind != "gpu_resident" else []   # the cache wraps either store
            rec, _ = self.quiet_run("--epochs", "8", "--seed", "0", "--pipeline", kind, "--device", "cuda", *extra)
            self.assertTrue(rec["device"].startswith("cuda"))
            if extra:
                self.assertGreater(rec["feature_store"]["cache_rows"], 0, msg=kind)
                self.assertGreater(rec["feature_store"]["cache_hit_rate"], 0.0, msg=kind)
            self.assertGreater(rec["test_acc"], max(0.6, 2 * majority), msg=kind)
            self.assertLess(rec["epochs"][-1]["loss"], rec["epochs"][0]["loss"], msg=kind)

    @requires_gpu
    def test_step_priority_changes_when_not_what(self):
        # The step on a high-priority stream, eager and graphed with two buffer sets: the same
        # batches and the same steps as on the current stream (dropout off: no random numbers).
        for graph in ([], ["--cuda-graph", "2"]):
            recs = [self.quiet_run("--epochs", "2", "--pipeline", "gpu_resident", "--device", "cuda", "--dropout", "0",
                                   "--layers", "builtin", *graph, *extra)[0]
                    for extra in ([], ["--step-priority", "high"])]
            for a, b in zip(recs[0]["epochs"], recs[1]["epochs"]):
                self.assertEqual(a["loss"], b["loss"], atol=1e-4, rtol=1e-4, msg=graph)
            self.assertEqual(recs[1]["step_priority"], "high")
            # two graphed sets time the training stream's wait for the copies (part of the step's time)
            for e in recs[0]["epochs"] + recs[1]["epochs"]:
                if graph:
                    self.assertTrue(0.0 <= e["train_step_copy_wait_s"] <= e["train_step_s"], msg=e)
                else:
                    self.assertIsNone(e["train_step_copy_wait_s"])

    @requires_gpu
    def test_fp8_hybrid_and_reordered_cache_train_the_same(self):
        # A float8 table read by the hybrid gather (the CPU threads' share as bytes, scaled on the
        # GPU) gives the unified pipeline the rows the kernel alone gives; with --reorder frequency
        # the cache holds the table's first rows and the run still learns (the same sampler seed
        # draws the relabelled batches).
        base = ["--epochs", "8", "--seed", "0", "--pipeline", "unified", "--device", "cuda", "--sampler", "cpu",
                "--feature-dtype", "fp8"]
        plain, _ = self.quiet_run(*base)
        hybrid, _ = self.quiet_run(*base, "--gather-cpu-threads", "2")
        self.assertEqual(hybrid["feature_store"]["cpu_threads"], 2)
        for a, b in zip(plain["epochs"], hybrid["epochs"]):
            self.assertEqual(a["loss"], b["loss"], atol=1e-4, rtol=1e-4)
        y = self.ds.y[self.ds.split["test"]]
        majority = torch.bincount(y).max().item() / y.numel()
        cached, _ = self.quiet_run(*base, "--gather-cpu-threads", "2", "--reorder", "frequency", "--cache-mb", "1")
        self.assertEqual(cached["reorder"], "frequency")
        self.assertGreater(cached["feature_store"]["cache_hit_rate"], 0.0)
        self.assertGreater(cached["test_acc"], max(0.6, 2 * majority))

    @requires_gpu
    def test_gpu_pipelines_agree_with_one_sampler(self):
        # Same sampler (the CPU one) and seed: the same batches and features reach the GPU, so the
        # pipelines agree up to the order of the GPU's floating-point atomics in the aggregation.
        recs = {}
        for kind in ("unified", "cpu_centric", "gpu_resident"):
            recs[kind], _ = self.quiet_run("--epochs", "1", "--pipeline", kind, "--device", "cuda",
                                           "--sampler", "cpu")
        base = recs["unified"]
        for kind, rec in recs.items():
            self.assertEqual(rec["epochs"][0]["loss"], base["epochs"][0]["loss"], atol=1e-4, rtol=1e-4, msg=kind)
            self.assertLess(abs(rec["test_acc"] - base["test_acc"]), 0.02, msg=kind)

    @requires_gpu
    def test_graph_on_the_gpu_samples_the_same_batches(self):
        # The GPU sampler draws the same neighbours from a GPU copy of the CSR as from the unified
        # one (same kernel, same seed); only the place the CSR is read from differs.
        recs = {}
        for where in ("unified", "gpu"):
            recs[where], _ = self.quiet_run("--epochs", "1", "--device", "cuda", "--graph", where)
        self.assertEqual(recs["unified"]["graph"], "unified")
        self.assertEqual(recs["gpu"]["graph"], "cuda")
        self.assertEqual(recs["gpu"]["sampler"], "gpu")
        self.assertEqual(recs["gpu"]["epochs"][0]["loss"], recs["unified"]["epochs"][0]["loss"], atol=1e-4, rtol=1e-4)
        # cpu_centric keeps its CPU slicing of features but samples on the GPU copy.
        rec, _ = self.quiet_run("--epochs", "1", "--device", "cuda", "--graph", "gpu", "--pipeline", "cpu_centric")
        self.assertEqual((rec["sampler"], rec["graph"]), ("gpu", "cuda"))
        with self.assertRaisesRegex(ValueError, "--sampler cpu reads the CSR in host memory"):
            self.quiet_run("--epochs", "1", "--device", "cuda", "--graph", "gpu", "--sampler", "cpu")
        # three sampling threads taking the batches in turn: the same batches, so the same loss
        ahead, _ = self.quiet_run("--epochs", "1", "--device", "cuda", "--graph", "gpu", "--sample-ahead", "3")
        self.assertEqual(ahead["epochs"][0]["loss"], recs["gpu"]["epochs"][0]["loss"], atol=1e-4, rtol=1e-4)
        # four batches a sampler call: the same batches too
        grouped, _ = self.quiet_run("--epochs", "1", "--device", "cuda", "--graph", "gpu", "--sampler-batches", "4")
        self.assertEqual(grouped["epochs"][0]["loss"], recs["gpu"]["epochs"][0]["loss"], atol=1e-4, rtol=1e-4)
        with self.assertRaisesRegex(ValueError, "do not go together"):
            self.quiet_run("--epochs", "1", "--device", "cuda", "--sampler-batches", "4", "--sample-ahead", "2")


if __name__ == "__main__":
    run_tests()
