"""Sharing unified tensors across processes (spawn and fork)."""

import os
import subprocess
import sys
import textwrap
import unittest

import torch
import torch.multiprocessing as mp
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import HAS_GPU, IS_FORK, NO_GPU_REASON


def _child_write(u, q_out, use_gpu):
    import torch_direct  # noqa: F401  (spawned children import it themselves)

    # A fork()ed child must not enter the parent's OpenMP team (libgomp hangs);
    # DataLoader workers do the same.
    torch.set_num_threads(1)

    ok = u.is_unified
    if use_gpu:
        idx = torch.arange(0, u.shape[0], 7, device="cuda")
        rows = u[idx].cpu()
    else:
        rows = u[::7].cpu()
    # Plain lists travel back: the check is on what the child read, not on
    # sending tensors through a queue.
    q_out.put((ok, rows.tolist(), u.data_ptr()))
    # A copy from a CPU tensor runs on the CPU over the same pages: a fork()ed
    # child may not be able to use CUDA when its parent already asked the driver.
    u[0].copy_(torch.full(u[0].shape, -42.0))  # visible to the parent: same pages
    q_out.put(torch_direct.memory_stats()["allocated_bytes"])


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


class TestIPC(TestCase):
    def run_child(self, method, use_gpu, u):
        # spawn pickles the arguments (the tensor travels as its block's fd);
        # fork inherits them (the child maps the same MAP_SHARED pages).
        ctx = mp.get_context(method)
        q_out = ctx.Queue()
        p = ctx.Process(target=_child_write, args=(u, q_out, use_gpu))
        p.start()
        ok, rows, _ptr = q_out.get(timeout=300)
        child_bytes = q_out.get(timeout=300)
        p.join(timeout=300)
        self.assertEqual(p.exitcode, 0)
        return ok, torch.tensor(rows), child_bytes

    def check(self, method, use_gpu):
        src = torch.randn(40000, 16)  # 2.5 MB: a large (shareable) block
        u = src.to("unified")
        fds = _open_fds()
        ok, rows, child_bytes = self.run_child(method, use_gpu, u)
        self.assertTrue(ok)
        self.assertEqual(rows, src[::7])
        self.assertEqual(u[0].cpu(), torch.full((16,), -42.0))  # written by the child
        self.assertEqual(torch_direct._C._block_kind(u), "exact")
        # No copy of the table: the child maps our block, it allocates nothing new.
        self.assertGreaterEqual(child_bytes, u.untyped_storage().nbytes())
        self.assertLessEqual(child_bytes, u.untyped_storage().nbytes() * 1.01 + 65536)
        self.assertLessEqual(_open_fds(), fds + 2)  # nothing leaks per transfer

    def test_spawn_cpu_reader(self):
        self.check("spawn", False)

    def test_fork_cpu_reader(self):
        # fork() from a process that ran other tests' thread pools can hang in
        # the child's OpenMP runtime; run the scenario from a fresh process.
        code = textwrap.dedent("""
            import sys, unittest
            sys.path.insert(0, %r)
            import test_ipc
            t = test_ipc.TestIPC("test_fork_cpu_reader")
            t.check("fork", False)
            print("fork-ok")
        """ % os.path.dirname(os.path.abspath(__file__)))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("fork-ok", r.stdout)

    @unittest.skipUnless(HAS_GPU, NO_GPU_REASON)
    def test_spawn_gpu_reader(self):
        self.check("spawn", True)

    def test_small_tensor_moves_to_shared_memory_once(self):
        u = torch.arange(10.0).to("unified")
        self.assertEqual(torch_direct._C._block_kind(u), "cached")
        ptr_before = u.data_ptr()
        ok, rows, _ = self.run_child("spawn", False, u)
        self.assertTrue(ok)
        self.assertEqual(torch_direct._C._block_kind(u), "exact")
        self.assertNotEqual(u.data_ptr(), ptr_before)
        self.assertEqual(u[0].item(), -42.0)

    def test_pinned_in_place_needs_shared_cpu_memory(self):
        if IS_FORK:   # the fork's pickler of unified tensors lives in torch itself
            from torch.unified._reductions import reduce_unified
        else:
            from torch_direct._reductions import reduce_unified
        t = torch.randn(100)
        u = torch_direct.pin_inplace(t)
        with self.assertRaisesRegex(RuntimeError, "share_memory_"):
            reduce_unified(u)
        shared = torch.randn(100).share_memory_()
        u2 = torch_direct.pin_inplace(shared)
        fn, args = reduce_unified(u2)
        self.assertEqual(args[0].data_ptr(), shared.data_ptr())  # the CPU tensor itself
        self.assertEqual(fn(*args).cpu(), shared)


if __name__ == "__main__":
    run_tests()
