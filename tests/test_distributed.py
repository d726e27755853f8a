"""torchrun training with one host copy per node: CPU ranks over gloo here, NCCL on GPUs."""

import contextlib
import glob
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import HAS_GPU
from torch_direct.gnn.bench.__main__ import main
from torch_direct.gnn.graph import load_dataset
from torch_direct.gnn.pipeline import PipelinedLoader, make_feature_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--dataset", "tiny", "--threads", "1", "--layers", "builtin", "--hidden", "32", "--batch-size", "256",
        "--no-progress", "--fanouts", "5,3", "--eval-fanouts", "5,3"]
TWO_GPUS = HAS_GPU and torch.cuda.device_count() >= 2
requires_distributed = unittest.skipUnless(
    torch.distributed.is_available(), "this torch is built without torch.distributed (USE_DISTRIBUTED=0)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_files() -> set:
    return set(glob.glob("/dev/shm/torch_direct-*"))


@requires_distributed
class TestTorchrun(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = cls.tmp.name
        load_dataset("tiny", root=cls.root, show_progress=False)  # generated once, before any rank

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def torchrun(self, launcher_args, train_args, env=None, timeout=240):
        cmd = [sys.executable, "-m", "torch.distributed.run", *launcher_args, "-m", "torch_direct", "train",
               "--root", self.root, *FAST, *train_args]
        e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
        e.update(env or {})
        return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)

    def test_two_ranks_share_one_copy_and_agree_on_metrics(self):
        before = shm_files()
        path = os.path.join(self.root, "two.json")
        p = self.torchrun(["--standalone", "--nproc-per-node=2"],
                          ["--device", "cpu", "--epochs", "3", "--full-eval", "--json", path])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        rec = json.load(open(path))
        self.assertEqual(rec["world_size"], 2)
        self.assertEqual(len(rec["epochs"]), 3)
        # Rank 0 alone prints; the figures are the job's (all-reduced), not one rank's.
        self.assertEqual(p.stdout.count("epoch   1 "), 1)
        self.assertIn("2 processes (gloo), one host copy per node", p.stdout)
        self.assertIn("PSS over 2 processes", p.stdout)
        self.assertGreater(rec["host_pss_gb"], 0)
        for e in rec["epochs"]:
            self.assertTrue(0 <= e["train_acc"] <= 1 and 0 <= e["valid_acc"] <= 1)
        self.assertLess(rec["epochs"][-1]["loss"], rec["epochs"][0]["loss"])
        # Full-neighbourhood inference, each rank over half the test nodes, counts summed.
        self.assertTrue(0 <= rec["test_acc_full"] <= 1)
        self.assertIn("(full neighbourhoods)", p.stdout)
        self.assertEqual(shm_files(), before)  # the shared files are gone once every rank mapped them

    def test_close_frees_the_group_and_its_threads(self):
        # Were the group still alive after close (DDP's constructor imports torch.distributed.nn.functional,
        # whose defaults capture group.WORLD), gloo's worker threads would run into interpreter shutdown
        # and now and then abort the rank there ("terminate called without an active exception").
        # The cycle collector is off, so that close() alone must free what DDP's cycles hold.
        code = ("import gc, os, torch\n"
                "gc.disable()\n"
                "from torch_direct.gnn.pipeline import distributed\n"
                "tasks = lambda: len(os.listdir('/proc/self/task'))\n"
                "before = tasks()\n"
                "ctx = distributed.init('cpu')\n"
                "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))\n"
                "ctx.all_sum([1.0])\n"
                "del model\n"
                "ctx.close()\n"
                "assert tasks() == before, f'{tasks()} threads after close, {before} before init'\n")
        e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
                 RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                 TORCH_DIRECT_DISTRIBUTED="1")
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])

    def test_a_failing_rank_stops_the_job_with_its_error(self):
        before = shm_files()
        p = self.torchrun(["--standalone", "--nproc-per-node=2"], ["--device", "cpu", "--epochs", "3"],
                          env={"TORCH_DIRECT_FAIL_AT": "1:2"})
        self.assertNotEqual(p.returncode, 0)
        out = p.stdout + p.stderr
        self.assertIn("train: error (rank 1): injected failure on rank 1 at epoch 2", out)
        # The other rank names the failing rank and its error, whether a collective broke
        # under it or the launcher stopped it.
        self.assertRegex(out, r"rank 0: stopped: rank 1: RuntimeError: injected failure|"
                              r"\(rank 0\): stopped: rank 1: RuntimeError: injected failure")
        self.assertNotIn("epoch   2 ", p.stdout)
        self.assertEqual(shm_files(), before)

    def test_a_second_sigterm_does_not_cut_the_stop_short(self):
        # The first SIGTERM becomes SystemExit; one arriving while the rank is already stopping
        # (reading the failing rank's error, printing it) is let pass.
        code = ("import os, signal\n"
                "from torch_direct.gnn.pipeline import distributed as d\n"
                "d._stop_cleanly_on_sigterm()\n"
                "try:\n"
                "    os.kill(os.getpid(), signal.SIGTERM)\n"
                "    print('not stopped')\n"
                "except SystemExit as e:\n"
                "    print('first', e.code)\n"
                "os.kill(os.getpid(), signal.SIGTERM)\n"
                "print('still here')\n")
        e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertEqual(p.stdout.split("\n")[:2], ["first 143", "still here"])

    def test_two_nodes_over_loopback(self):
        port = free_port()
        path = os.path.join(self.root, "nodes.json")
        e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
        procs = []
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                   f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}",
                   "-m", "torch_direct", "train", "--root", self.root, *FAST, "--device", "cpu", "--epochs", "2",
                   "--json", path]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=240))
        finally:
            for p in procs:
                p.kill()
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("2 processes (gloo)", outs[0][0])  # node 0 holds global rank 0
        self.assertEqual(json.load(open(path))["world_size"], 2)

    def test_one_forced_process_takes_the_distributed_path(self):
        path = os.path.join(self.root, "one.json")
        p = self.torchrun(["--standalone", "--nproc-per-node=1"], ["--device", "cpu", "--epochs", "1", "--json", path],
                          env={"TORCH_DIRECT_DISTRIBUTED": "1"})
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("1 processes (gloo)", p.stdout)
        self.assertEqual(json.load(open(path))["world_size"], 1)

    def test_device_must_be_the_local_gpu(self):
        p = self.torchrun(["--standalone", "--nproc-per-node=2"], ["--device", "cuda:1", "--epochs", "1"])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("each rank takes cuda:LOCAL_RANK", p.stderr)

    @unittest.skipUnless(HAS_GPU, "needs a CUDA GPU: NCCL and page-locking the shared pages")
    def test_one_gpu_rank_over_nccl(self):
        path = os.path.join(self.root, "gpu1.json")
        p = self.torchrun(["--standalone", "--nproc-per-node=1"],
                          ["--device", "cuda", "--epochs", "2", "--cache-mb", "1", "--json", path],
                          env={"TORCH_DIRECT_DISTRIBUTED": "1"})
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("1 processes (nccl)", p.stdout)
        rec = json.load(open(path))
        self.assertEqual(rec["sampler"], "gpu")  # the GPU sampler over the pinned shared CSR
        self.assertGreater(rec["feature_store"]["cache_rows"], 0)  # the rank's own GPU cache

    @unittest.skipUnless(TWO_GPUS, "needs two GPUs: one NCCL rank per GPU")
    def test_two_gpu_ranks_over_nccl(self):
        before = shm_files()
        path = os.path.join(self.root, "gpu2.json")
        p = self.torchrun(["--standalone", "--nproc-per-node=2"],
                          ["--device", "cuda", "--epochs", "2", "--cache-mb", "1", "--json", path])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("2 processes (nccl)", p.stdout)
        rec = json.load(open(path))
        self.assertEqual(rec["world_size"], 2)
        self.assertGreater(rec["feature_store"]["cache_rows"], 0)  # each rank caches on its GPU
        self.assertEqual(shm_files(), before)


@requires_distributed
class TestScalingBench(TestCase):
    def test_runs_each_count_and_compares(self):
        with tempfile.TemporaryDirectory() as root:
            load_dataset("tiny", root=root, show_progress=False)
            path, svg = os.path.join(root, "s.json"), os.path.join(root, "s.svg")
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                rc = main(["scaling", "--root", root, *FAST, "--device", "cpu", "--epochs", "2", "--nproc", "1,2",
                           "--out", path, "--plot", svg])
            self.assertEqual(rc, 0, out.getvalue())
            rec = json.load(open(path))
            self.assertEqual([r["nproc"] for r in rec["rows"]], [1, 2])
            self.assertEqual([r["world_size"] for r in rec["rows"]], [1, 2])
            self.assertEqual(rec["rows"][0]["speed_ratio"], 1.0)
            self.assertGreater(rec["rows"][1]["memory_ratio"], 0)
            self.assertEqual({t["name"].split(" at ")[0] for t in rec["targets"]}, {"epoch", "host memory"})
            # the default targets are per count: 2 processes are held to 0.55x the baseline's epoch
            self.assertEqual([t["want"] for t in rec["targets"] if t["name"] == "epoch at 2 / at 1"], ["<= 0.55"])
            self.assertTrue(open(svg).read().startswith("<svg"))
            self.assertIn("| 2 |", out.getvalue())
            # The breakdown that explains each epoch: training step and the loader's exposed stages.
            self.assertIn("| train step s | exposed s sample/gather/transfer |", out.getvalue())
            r2 = rec["rows"][1]
            self.assertIn(f"| {r2['train_step_s']:.3f} | {r2['exposed_s']['sample']:.3f}/", out.getvalue())

    def test_speed_targets_per_count(self):
        from torch_direct.gnn.bench.scaling import _speed_targets
        self.assertEqual(_speed_targets("2:0.55,4:0.30,8:0.17"), {2: 0.55, 4: 0.30, 8: 0.17})
        self.assertEqual(_speed_targets("0.6"), {None: 0.6})
        for bad in ("x", "4:", "1:0.5", "2:0", "2:0.5,x"):
            with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as cm:
                main(["scaling", "--target-speed", bad])
            self.assertEqual(cm.exception.code, 2)

    def test_bad_counts(self):
        for bad in ("0", "1,1", "x", ""):
            with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as cm:
                main(["scaling", "--nproc", bad])
            self.assertEqual(cm.exception.code, 2)


class TestSharedMemoryCheck(TestCase):
    def test_too_little_shm_is_a_clear_error_and_leaves_nothing(self):
        from unittest import mock

        from torch_direct.gnn.pipeline import distributed
        ctx = distributed.Context(rank=0, world=2, local_rank=0, local_world=2, node=0,
                                  device=torch.device("cpu"), backend="gloo")
        with tempfile.TemporaryDirectory() as root:
            ds = load_dataset("tiny", root=root, show_progress=False)
            before = shm_files()
            small = os.statvfs_result((4096, 4096, 10, 1, 1, 10, 1, 1, 0, 255))  # 4 KiB free
            with mock.patch.object(distributed.os, "statvfs", return_value=small):
                with self.assertRaisesRegex(RuntimeError, r"needs .* GiB in /dev/shm, which has 0.00 GiB free"):
                    distributed._publish(ctx, ds)
            self.assertEqual(shm_files(), before)


class TestSharding(TestCase):
    def test_ranks_split_each_epoch_evenly_and_disjointly(self):
        ids = torch.arange(1000, 2003)  # 1003 seeds: 3 ranks get 334 each, one seed left out per epoch
        x = torch.randn(2003, 4)
        store = make_feature_store("cpu_centric", x, "cpu")

        class Sampler:
            def sample_batches(self, seed_batches):
                raise AssertionError("not sampled here")

            def sample(self, seeds):
                raise AssertionError("not sampled here")

        shards = []
        for rank in range(3):
            ld = PipelinedLoader(Sampler(), store, ids, 100, generator=torch.Generator().manual_seed(5),
                                 shard=(rank, 3))
            seeds = torch.cat(ld._seed_batches())
            self.assertEqual(len(ld), 4)
            shards.append(seeds)
        self.assertEqual({s.numel() for s in shards}, {334})
        allseeds = torch.cat(shards)
        self.assertEqual(allseeds.unique().numel(), allseeds.numel())  # disjoint
        self.assertTrue(bool(torch.isin(allseeds, ids).all()))
        # Evaluation (no shuffle): every seed exactly once over the ranks.
        ev = [torch.cat(PipelinedLoader(Sampler(), store, ids, 100, shuffle=False, shard=(r, 3))._seed_batches())
              for r in range(3)]
        self.assertEqual(torch.cat(ev).sort().values, ids)

    def test_bad_shard(self):
        store = make_feature_store("cpu_centric", torch.randn(10, 2), "cpu")
        for bad in ((3, 3), (-1, 2), (0,), "0,2", (0.0, 2)):
            with self.assertRaisesRegex(ValueError, "shard must be"):
                PipelinedLoader(object.__new__(type("S", (), {"sample": None})), store, torch.arange(10), 2,
                                shard=bad)


if __name__ == "__main__":
    run_tests()
