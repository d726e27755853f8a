"""torch_direct.driver_mapped: unified tables in memory the CUDA driver allocates and maps itself."""

import os
import pickle
import subprocess
import sys
import textwrap
import unittest

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import HAS_GPU, requires_gpu
from torch_direct.gnn.pipeline.features import make_feature_store


# What driver_mapped says where it cannot make a table (a fork wheel built before it was bound
# says that instead).
REFUSAL = ("driver-mapped unified memory: (no usable CUDA GPU|torch_direct was built without CUDA)"
           "|built from a fork older than it")


def driver_bytes():
    return torch_direct.memory_stats()["driver_mapped_bytes"]


class TestDriverMappedInput(TestCase):
    def test_bad_input(self):
        self.assertEqual(torch.unified.driver_mapped.__module__.split(".")[0], "torch_direct"
                      if torch_direct.vehicle() == "extension" else "torch")
        with self.assertRaisesRegex(TypeError, "expects a torch.Tensor, got list"):
            torch_direct.driver_mapped([1, 2])
        with self.assertRaisesRegex(TypeError, "expects a strided tensor"):
            torch_direct.driver_mapped(torch.eye(3).to_sparse())

    @unittest.skipIf(HAS_GPU, "checks the message on a machine without a usable GPU")
    def test_without_gpu_is_a_clear_error_and_changes_nothing(self):
        x = torch.randn(64, 8)
        before, stats = x.clone(), torch_direct.memory_stats()
        with self.assertRaisesRegex(RuntimeError, REFUSAL):
            torch_direct.driver_mapped(x)
        self.assertEqual(x, before, atol=0, rtol=0)
        self.assertEqual(torch_direct.memory_stats()["allocated_bytes"], stats["allocated_bytes"])
        self.assertEqual(driver_bytes(), 0)
        # The feature store's setting fails the same way, before any table is made.
        with torch_direct.experimental(feature_pages="driver"):
            with self.assertRaisesRegex(RuntimeError, REFUSAL):
                make_feature_store("unified", x, "cpu")
        self.assertEqual(x, before, atol=0, rtol=0)


def driver_refusal():
    """Why this machine's driver makes no driver-mapped table (None where it does): a GPU
    without host NUMA allocations through its virtual memory management is a machine this
    feature does not serve, not a failure. Any other refusal is left to fail the tests."""
    try:
        torch_direct.driver_mapped(torch.zeros(1))
    except RuntimeError as e:
        if "does not support host NUMA allocations" in str(e):
            return str(e)
    return None


@requires_gpu
class TestDriverMappedGPU(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        why = driver_refusal()
        if why:
            raise unittest.SkipTest(f"this GPU's driver cannot make driver-mapped memory: {why}")

    def test_copy_reads_writes_and_release(self):
        x = torch.randn(3000, 40)
        start = driver_bytes()
        u = torch_direct.driver_mapped(x)
        self.assertEqual(u.device.type, "unified")
        self.assertEqual(torch_direct._C._block_kind(u), "driver")
        self.assertTrue(torch_direct._C._is_mapped(u))
        mapped = driver_bytes() - start
        self.assertGreaterEqual(mapped, x.numel() * 4)   # whole pieces of the driver's granularity
        self.assertEqual(u.cpu(), x, atol=0, rtol=0)
        idx = torch.randint(0, 3000, (5000,), device="cuda")
        self.assertEqual(torch_direct.gather(u, idx).cpu(), x[idx.cpu()], atol=0, rtol=0)
        self.assertEqual(u[idx].cpu(), x[idx.cpu()], atol=0, rtol=0)
        # The CPU writes in place (no copy) and the GPU reads what it wrote, and back.
        torch_direct.cpu_alias(u)[7].fill_(5.0)
        self.assertEqual(torch_direct.gather(u, torch.tensor([7], device="cuda")).cpu(),
                         torch.full((1, 40), 5.0), atol=0, rtol=0)
        torch_direct.cuda_alias(u)[8].fill_(6.0)
        torch.cuda.synchronize()
        self.assertEqual(torch_direct.cpu_alias(u)[8], torch.full((40,), 6.0), atol=0, rtol=0)
        del u
        torch.cuda.synchronize()
        self.assertEqual(driver_bytes(), start)   # never cached: back to the driver

    def test_every_dtype_and_shape(self):
        q, _ = torch_direct.quantize_rows_fp8(torch.randn(100, 32), compute="cpu")
        for x in (torch.randn(100, 33).half(), torch.randint(0, 9, (7,)), q, torch.tensor(3.5),
                  torch.empty(0, 4), torch.randn(5, 6, device="cuda")):
            u = torch_direct.driver_mapped(x)
            self.assertEqual(u.shape, x.shape)
            self.assertEqual(u.dtype, x.dtype)
            self.assertEqual(u.cpu().view(torch.uint8) if x.numel() and x.dim() else u.cpu(),
                             x.cpu().view(torch.uint8) if x.numel() and x.dim() else x.cpu())

    def test_sharing_is_refused_clearly(self):
        u = torch_direct.driver_mapped(torch.randn(1000))
        from multiprocessing.reduction import ForkingPickler  # torch's reductions register here
        import io
        with self.assertRaisesRegex(RuntimeError, "cannot be shared with another process"):
            ForkingPickler(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(u)
        self.assertEqual(torch_direct._C._block_kind(u), "driver")

    def test_forked_child_gets_an_error_not_a_crash(self):
        code = textwrap.dedent("""
            import os, torch, torch_direct
            u = torch_direct.driver_mapped(torch.ones(1 << 16))
            torch.cuda.synchronize()
            pid = os.fork()
            if pid == 0:
                try:
                    u.sum()
                except RuntimeError as e:
                    os._exit(0 if "not inherited by a fork()ed child" in str(e) else 3)
                os._exit(4)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), float(u.sum()))
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["0", str(float(1 << 16))])

    def test_feature_store_on_driver_pages(self):
        # The experimental setting feature_pages=driver gathers the same rows as the plain
        # table, float8 included, and under the GPU cache.
        x = torch.randn(4000, 64)
        idx = torch.randint(0, 4000, (3000,))
        degree = torch.randint(1, 50, (4000,))
        q, scale = torch_direct.quantize_rows_fp8(x, compute="cpu")
        for table, sc in ((x, None), (x.half(), None), (q, scale)):
            for cache in (0, 64 * 128):
                with torch_direct.experimental(feature_pages="driver"):
                    store = make_feature_store("unified", table, "cuda", scale=sc, cache_bytes=cache,
                                               degree=degree)
                plain = make_feature_store("unified", table, "cuda", scale=sc, cache_bytes=cache, degree=degree)
                self.assertEqual(store.gather(idx.cuda()), plain.gather(idx.cuda()), atol=0, rtol=0)


if __name__ == "__main__":
    run_tests()
