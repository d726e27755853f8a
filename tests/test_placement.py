"""Placement rules R1-R6 (docs/placement.md) and bad input."""

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

from common import HAS_GPU, compute_device, requires_gpu


def table(n=64, d=8, dtype=torch.float32):
    src = torch.randn(n, d).to(dtype)
    return src, src.to("unified")


class TestPlacementCPU(TestCase):
    """Rules whose outcome does not need a GPU (R2, R4 on the CPU, R5, R6)."""

    def test_r2_cpu_operand_runs_on_cpu(self):
        src, u = table()
        w = torch.randn(8, 3)
        out = u @ w
        self.assertEqual(out.device.type, "cpu")
        self.assertEqual(out, src @ w)
        idx = torch.tensor([3, 0, 63, 3])
        y = u[idx]
        self.assertEqual(y.device.type, "cpu")
        self.assertEqual(y, src[idx])
        self.assertEqual(torch.index_select(u, 0, idx), src[idx])
        self.assertEqual(F.embedding(idx, u), src[idx])
        g = torch.gather(u, 0, idx.view(-1, 1).expand(-1, 8))
        self.assertEqual(g, torch.gather(src, 0, idx.view(-1, 1).expand(-1, 8)))

    def test_r3_only_unified_runs_on_compute_device(self):
        src, u = table()
        for out, ref in ((u + 1, src + 1), (u.sum(), src.sum()), (u * u, src * src),
                         (torch.relu(u), torch.relu(src)), (u.max(dim=1).values, src.max(dim=1).values)):
            self.assertEqual(out.device, compute_device())
            self.assertEqual(out.cpu(), ref)

    def test_r3_composites_over_out_kernels_run_on_compute_device(self):
        # abs, logical_not, mean, nan_to_num: composites that allocate like self and call
        # an out= kernel; their results land where neg's does, so torch._refs, which
        # compares its operands' devices, can combine them.
        src, u = table()
        for name, out, ref in (("abs", torch.abs(u), torch.abs(src)),
                               ("logical_not", torch.logical_not(u), torch.logical_not(src)),
                               ("mean", u.mean(), src.mean()),
                               ("nan_to_num", torch.nan_to_num(u), torch.nan_to_num(src)),
                               ("neg", torch.neg(u), torch.neg(src))):
            self.assertEqual(out.device, compute_device(), msg=name)
            self.assertEqual(out.cpu(), ref, msg=name)
        a = torch.randint(0, 10, (1026,), dtype=torch.uint8)
        b = torch.randint(0, 10, (1026,), dtype=torch.uint8)
        out = torch._refs.copysign(a.to("unified")[::2], b.to("unified")[::2])
        self.assertEqual(out.cpu(), torch.copysign(a[::2], b[::2]))

    def test_zero_dim_cpu_tensor_counts_as_scalar(self):
        src, u = table()
        out = u * torch.tensor(2.0)
        self.assertEqual(out.device, compute_device())
        self.assertEqual(out.cpu(), src * 2)

    def test_r4_inplace_writes_through(self):
        src, u = table()
        ptr = u.data_ptr()
        u.add_(torch.ones(64, 8))  # CPU operand: runs on the CPU, writes host pages
        self.assertEqual(u.data_ptr(), ptr)
        self.assertEqual(u.cpu(), src + 1)
        u.mul_(2)
        self.assertEqual(u.cpu(), (src + 1) * 2)
        self.assertTrue(u.is_unified)

    def test_r4_out_with_unified_destination(self):
        a, b = torch.randn(5), torch.randn(5)
        out = torch.empty(5, device="unified")
        ptr = out.data_ptr()
        r = torch.add(a, b, out=out)
        self.assertIs(r, out)
        self.assertEqual(out.data_ptr(), ptr)
        self.assertEqual(out.cpu(), a + b)
        grow = torch.empty(0, device="unified")
        torch.mul(a.view(5, 1), b.view(1, 5), out=grow)  # the kernel resizes its output
        self.assertTrue(grow.is_unified)
        self.assertEqual(grow.shape, (5, 5))
        self.assertEqual(grow.cpu(), a.view(5, 1) * b.view(1, 5))

    def test_factories_of_a_unified_tensor_make_unified_tensors(self):
        # new_* and *_like allocate where their device argument says, by default
        # their input's device: not on the device that computes from it.
        _, u = table()
        made = {
            "new_empty": u.new_empty(2, 3),
            "new_zeros": u.new_zeros(2, 3),
            "new_full": u.new_full((2, 3), 1.5),
            "new_empty_strided": u.new_empty_strided((2, 3, 4), (2, 4, 6)),
            "new_empty_strided zero strides": u.new_empty_strided((2, 3), (0, 0)),
            "empty_like": torch.empty_like(u),
            "zeros_like": torch.zeros_like(u),
        }
        for name, t in made.items():
            self.assertTrue(t.is_unified, msg=name)
        self.assertEqual(made["new_empty_strided"].stride(), (2, 4, 6))
        self.assertEqual(made["new_full"].cpu(), torch.full((2, 3), 1.5))
        self.assertEqual(u.new_empty_strided((2, 3), (3, 1), device="cpu").device, torch.device("cpu"))

    def test_r5_copies(self):
        src, u = table()
        self.assertEqual(u.cpu(), src)
        self.assertEqual(u.to("cpu"), src)
        c = torch.empty_like(src)
        c.copy_(u)
        self.assertEqual(c, src)
        u2 = torch.empty(64, 8, device="unified")
        u2.copy_(u)
        self.assertEqual(u2.cpu(), src)
        u3 = torch.empty(8, 64, device="unified")
        u3.copy_(u.t())  # strided source
        self.assertEqual(u3.cpu(), src.t())
        u4 = torch.empty(64, 8, device="unified", dtype=torch.float16)
        u4.copy_(src)  # dtype conversion into unified
        self.assertEqual(u4.cpu(), src.half())
        u5 = torch.empty(3, 64, 8, device="unified")
        u5.copy_(u)  # broadcast
        self.assertEqual(u5.cpu(), src.expand(3, 64, 8))

    def test_clone_and_contiguous_stay_unified(self):
        src, u = table()
        c = u.t().contiguous()
        self.assertTrue(c.is_unified)
        self.assertNotEqual(c.data_ptr(), u.data_ptr())
        self.assertEqual(c.cpu(), src.t().contiguous())

    def test_bad_input_is_a_clear_error_and_changes_nothing(self):
        src, u = table()
        with self.assertRaisesRegex(RuntimeError, "size|shape|match"):
            u.add_(torch.ones(3))
        with self.assertRaisesRegex(RuntimeError, "int|Long|dtype"):
            torch.index_select(u, 0, torch.tensor([1.0]))  # float index
        with self.assertRaisesRegex(RuntimeError, "dtype|type|Float|Long|same"):
            torch.add(u, u, out=torch.empty(64, 8, device="unified", dtype=torch.int64))
        self.assertEqual(u.cpu(), src)
        with self.assertRaises(IndexError):
            u[torch.tensor([64])]
        self.assertEqual(u.cpu(), src)
        # the process and other tensors are intact
        self.assertEqual((u + 0).cpu(), src)


@requires_gpu
class TestPlacementGPU(TestCase):
    def test_r1_cuda_index_reads_in_place(self):
        src, u = table(1000, 16)
        idx = torch.randint(0, 1000, (300,), device="cuda")
        for y in (u[idx], torch.index_select(u, 0, idx), F.embedding(idx, u)):
            self.assertEqual(y.device, idx.device)
            self.assertEqual(y.cpu(), src[idx.cpu()])
        g = torch.gather(u, 0, idx.view(-1, 1).expand(-1, 16))
        self.assertTrue(g.is_cuda)
        self.assertEqual(g.cpu(), torch.gather(src, 0, idx.cpu().view(-1, 1).expand(-1, 16)))

    def test_r1_mixed_ops(self):
        src, u = table()
        w = torch.randn(8, 4, device="cuda")
        out = u @ w
        self.assertTrue(out.is_cuda)
        self.assertEqual(out.cpu(), src @ w.cpu(), atol=1e-4, rtol=1e-4)

    def test_r3_runs_on_current_cuda_device(self):
        src, u = table()
        out = u * 3
        self.assertEqual(out.device, torch.device("cuda", torch.cuda.current_device()))
        self.assertEqual(out.cpu(), src * 3)

    def test_r4_cuda_writes_through_to_host(self):
        src, u = table()
        u.add_(torch.ones(64, 8, device="cuda"))
        self.assertTrue(u.is_unified)
        self.assertEqual(u.cpu(), src + 1)
        out = torch.empty(64, 8, device="unified")
        torch.mul(u, torch.full((64, 8), 2.0, device="cuda"), out=out)
        self.assertEqual(out.cpu(), (src + 1) * 2)

    def test_r5_dma_both_ways(self):
        src, u = table(4096, 64)
        c = u.to("cuda")
        self.assertTrue(c.is_cuda)
        self.assertEqual(c.cpu(), src)
        c2 = u.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        self.assertEqual(c2.cpu(), src)
        back = torch.empty(4096, 64, device="unified")
        back.copy_(c * 2)
        self.assertEqual(back.cpu(), src * 2)
        strided = torch.empty(64, 4096, device="unified")
        strided.copy_(c.t())  # not DMA-compatible: a kernel writes host pages
        self.assertEqual(strided.cpu(), src.t())
        half = u.to("cuda", dtype=torch.float16)
        self.assertEqual(half.cpu(), src.half())

    def test_r6_view_of_unified_read_by_gpu(self):
        src, u = table()
        v = u[:, 2:5]
        idx = torch.tensor([1, 5, 9], device="cuda")
        self.assertEqual(v[idx].cpu(), src[:, 2:5][idx.cpu()])

    def test_bad_index_raises_index_error_and_context_survives(self):
        src, u = table()
        with self.assertRaises(IndexError):
            u[torch.tensor([64], device="cuda")]
        with self.assertRaises(IndexError):
            torch.index_select(u, 0, torch.tensor([-100], device="cuda"))
        idx = torch.tensor([1, 2], device="cuda")
        self.assertEqual(u[idx].cpu(), src[[1, 2]])

    def test_two_cuda_devices_error_like_stock(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("needs two GPUs to put CUDA operands on two devices")
        _, u = table()
        with self.assertRaisesRegex(RuntimeError, "same device"):
            u + torch.ones(64, 8, device="cuda:0") + torch.ones(64, 8, device="cuda:1")

    def test_streams_order_reads(self):
        src, u = table(1 << 16, 32)
        s = torch.cuda.Stream()
        idx = torch.randint(0, 1 << 16, (4096,), device="cuda")
        with torch.cuda.stream(s):
            y = u[idx]
        s.synchronize()
        self.assertEqual(y.cpu(), src[idx.cpu()])


if __name__ == "__main__":
    run_tests()
