"""torch_direct.gather: values, casts, index forms, out buffers, bounds."""

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import requires_gpu


class GatherChecks:
    device = "cpu"

    def idx(self, values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def test_values_for_table_dtypes(self):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8):
            src = (torch.randn(50, 7) * 10).to(dtype)
            u = src.to("unified")
            i = self.idx([3, 0, 49, 3, 17])
            y = torch_direct.gather(u, i)
            self.assertEqual(y.device.type, self.device)
            self.assertEqual(y.cpu(), src[i.cpu()])

    def test_fused_cast(self):
        src = torch.randn(40, 5).half()
        u = src.to("unified")
        i = self.idx([1, 39, 2])
        y = torch_direct.gather(u, i, dtype=torch.float32)
        self.assertEqual(y.dtype, torch.float32)
        self.assertEqual(y.cpu(), src[i.cpu()].float())

    def test_index_forms(self):
        src = torch.randn(30, 4)
        u = src.to("unified")
        i32 = self.idx([5, -1, -30], dtype=torch.int32)
        self.assertEqual(torch_direct.gather(u, i32).cpu(), src[i32.cpu().long()])
        nc = self.idx(list(range(20)))[::3]
        self.assertFalse(nc.is_contiguous())
        self.assertEqual(torch_direct.gather(u, nc).cpu(), src[nc.cpu()])
        two_d = self.idx([[1, 2], [3, 4]])
        self.assertEqual(torch_direct.gather(u, two_d).shape, (2, 2, 4))
        self.assertEqual(torch_direct.gather(u, two_d).cpu(), src[two_d.cpu()])
        empty = self.idx([])
        self.assertEqual(torch_direct.gather(u, empty).shape, (0, 4))
        one_d = torch.arange(10.0).to("unified")
        self.assertEqual(torch_direct.gather(one_d, self.idx([9, 0])).cpu(), torch.tensor([9.0, 0.0]))

    def test_out_buffer_is_reused(self):
        src = torch.randn(20, 3)
        u = src.to("unified")
        out = torch.empty(4, 3, device=self.device)
        ptr = out.data_ptr()
        r = torch_direct.gather(u, self.idx([0, 1, 2, 19]), out=out)
        self.assertIs(r, out)
        self.assertEqual(out.data_ptr(), ptr)
        self.assertEqual(out.cpu(), src[[0, 1, 2, 19]])
        with self.assertRaisesRegex(ValueError, "shape"):
            torch_direct.gather(u, self.idx([0, 1]), out=out)
        with self.assertRaisesRegex(ValueError, "dtype"):
            torch_direct.gather(u, self.idx([0, 1, 2, 3]), dtype=torch.float16, out=out)

    def test_bad_input(self):
        src = torch.randn(10, 2)
        u = src.to("unified")
        with self.assertRaisesRegex(IndexError, "10"):
            torch_direct.gather(u, self.idx([0, 10]))
        with self.assertRaisesRegex(IndexError, "-11"):
            torch_direct.gather(u, self.idx([-11]))
        with self.assertRaisesRegex(TypeError, "int32 or int64"):
            torch_direct.gather(u, torch.tensor([1.0], device=self.device))
        with self.assertRaisesRegex(TypeError, "tensors"):
            torch_direct.gather(u, [1, 2])
        self.assertEqual(u.cpu(), src)  # nothing changed
        self.assertEqual(torch_direct.gather(u, self.idx([9])).cpu(), src[[9]])


class TestGatherCPU(GatherChecks, TestCase):
    device = "cpu"


@requires_gpu
class TestGatherCUDA(GatherChecks, TestCase):
    device = "cuda"


if __name__ == "__main__":
    run_tests()
