"""The unified device itself: names, factories, views, repr, device module."""

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import extension_only


class TestDevice(TestCase):
    @extension_only("asserts PrivateUse1's name; the fork's device needs no PrivateUse1 (verify's C++ test parses and prints it)")
    def test_device_parses_and_prints(self):
        d = torch.device("unified")
        self.assertEqual(d.type, "unified")
        self.assertEqual(str(torch.device("unified:0")), "unified:0")
        self.assertEqual(torch._C._get_privateuse1_backend_name(), "unified")

    def test_to_unified_keeps_values_and_dtype(self):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8,
                      torch.bool, torch.complex64):
            src = torch.arange(24).reshape(4, 6).to(dtype)
            u = src.to("unified")
            self.assertTrue(u.is_unified)
            self.assertTrue(torch_direct.is_unified(u))
            self.assertEqual(u.dtype, dtype)
            self.assertEqual(u.shape, src.shape)
            self.assertEqual(u.cpu(), src)
            self.assertFalse(src.is_unified)

    def test_to_unified_of_unified_is_identity(self):
        u = torch.ones(3).to("unified")
        self.assertIs(u.to("unified"), u)

    def test_empty_and_factories(self):
        e = torch.empty(2, 3, device="unified")
        self.assertTrue(e.is_unified)
        self.assertEqual(e.shape, (2, 3))
        z = torch.zeros(4, device="unified", dtype=torch.int32)
        self.assertEqual(z.cpu(), torch.zeros(4, dtype=torch.int32))
        f = torch.full((2, 2), 7.5, device="unified")
        self.assertEqual(f.cpu(), torch.full((2, 2), 7.5))
        a = torch.arange(6, device="unified")
        self.assertTrue(a.is_unified)
        self.assertEqual(a.cpu(), torch.arange(6))
        s = torch.empty_strided((2, 3), (1, 2), device="unified")
        self.assertEqual(s.stride(), (1, 2))
        self.assertTrue(torch.empty(0, device="unified").is_unified)

    def test_repr_names_the_device(self):
        u = torch.tensor([1.0, 2.0]).to("unified")
        self.assertIn("device='unified:0'", repr(u))

    def test_views_are_unified_over_same_storage(self):
        u = torch.arange(24.0).reshape(4, 6).to("unified")
        base = u.untyped_storage().data_ptr()
        for v in (u.view(6, 4), u[1:3], u.t(), u.select(0, 2), u.narrow(1, 2, 3),
                  u.reshape(24), u[:, ::2], u.unfold(1, 2, 2), u.unsqueeze(0), u.expand(2, 4, 6),
                  u.view(torch.int32), u.permute(1, 0), u.diagonal()):
            self.assertTrue(v.is_unified, v)
            self.assertEqual(v.untyped_storage().data_ptr(), base)
        v = u[1]
        v.fill_(-1)
        self.assertEqual(u.cpu()[1], torch.full((6,), -1.0))
        parts = torch.split(u, 2)
        self.assertTrue(all(p.is_unified for p in parts))

    def test_bad_device_strings(self):
        with self.assertRaisesRegex(RuntimeError, "single index"):
            torch.empty(3, device="unified:1")
        with self.assertRaises(RuntimeError):
            torch.device("unifed")
        with self.assertRaisesRegex(RuntimeError, "pinned"):
            torch.empty(3, device="unified", pin_memory=True)

    def test_device_module(self):
        self.assertIs(torch.unified.is_available(), True)
        self.assertEqual(torch.unified.device_count(), 1)
        self.assertEqual(torch.unified.current_device(), 0)
        with self.assertRaisesRegex(ValueError, "single index"):
            torch.unified.set_device(1)
        torch.unified.synchronize()

    def test_generated_methods(self):
        t = torch.ones(2)
        u = t.unified()
        self.assertTrue(u.is_unified)
        m = torch.nn.Linear(2, 2).unified()
        self.assertTrue(m.weight.is_unified)
        self.assertTrue(u.untyped_storage().is_unified)

    def test_item_and_scalar(self):
        u = torch.tensor([3.5, 4.0]).to("unified")
        self.assertEqual(u[0].item(), 3.5)
        self.assertEqual(float(u[1]), 4.0)
        self.assertTrue(bool((u > 3).all()))

    def test_resize_and_set(self):
        u = torch.arange(4.0).to("unified")
        u.resize_(10)
        self.assertEqual(u.shape, (10,))
        self.assertEqual(u[:4].cpu(), torch.arange(4.0))
        v = torch.empty(0, device="unified").set_(u.untyped_storage(), 2, (2,), (1,))
        self.assertEqual(v.cpu(), torch.tensor([2.0, 3.0]))
        with self.assertRaisesRegex(RuntimeError, "unified"):
            torch.empty(0, device="unified").set_(torch.ones(3).untyped_storage())

    def test_is_set_to(self):
        t1 = torch.zeros(3, 4).to("unified")
        t2 = torch.tensor([], device="unified").set_(t1)
        self.assertTrue(t1.is_set_to(t2))
        self.assertTrue(t2.is_set_to(t1))
        self.assertFalse(t1.is_set_to(torch.zeros(3, 4).to("unified")))
        self.assertFalse(t1.is_set_to(t1.view(4, 3)))
        self.assertFalse(t1.is_set_to(t1[1:]))

    def test_deterministic_mode_fills_new_memory(self):
        # As on the CPU and CUDA: with deterministic algorithms and fill_uninitialized_memory,
        # empty* gives NaN (or the integer maximum), and resize_ fills the elements it adds.
        from torch.testing._internal.common_utils import DeterministicGuard
        with DeterministicGuard(True, fill_uninitialized_memory=True):
            made = {"empty": torch.empty(10, 9, device="unified"),
                    "empty_like": torch.empty_like(torch.zeros(10, 9).to("unified")),
                    "empty_strided": torch.empty_strided((10, 9), (1, 5), device="unified"),
                    "new_empty": torch.zeros(3).to("unified").new_empty(4, 5)}
            ints = torch.empty(7, dtype=torch.int32, device="unified")
            u = torch.arange(4.0).to("unified")
            u.resize_(10)
        for name, t in made.items():
            self.assertTrue(t.is_unified, msg=name)
            self.assertTrue(t.cpu().isnan().all(), msg=name)
        self.assertTrue(ints.cpu().eq(torch.iinfo(torch.int32).max).all())
        self.assertEqual(u[:4].cpu(), torch.arange(4.0))
        self.assertTrue(u[4:].cpu().isnan().all())


if __name__ == "__main__":
    run_tests()
