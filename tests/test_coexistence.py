"""Importing torch_direct changes nothing for code that makes no unified tensor."""

import subprocess
import sys
import textwrap

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import extension_only, requires_gpu

PROBE = textwrap.dedent("""
    import json, sys, torch
    if sys.argv[1] == "with":
        import torch_direct
    try:
        acc = torch.accelerator.current_accelerator()
    except RuntimeError as e:   # torch 2.6 without an accelerator raises where newer ones say None
        acc = "raised: " + str(e).splitlines()[0]
    out = {"acc": None if acc is None else str(acc),
           "available": torch.accelerator.is_available(),
           "count": torch.accelerator.device_count()}
    if torch.cuda.is_available():
        out["index"] = torch.accelerator.current_device_index()
        out["stream"] = type(torch.accelerator.current_stream()).__name__
        out["pinned"] = torch.ones(4).pin_memory().is_pinned()
    print(json.dumps(out))
""")


def probe(mode):
    r = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


class TestCoexistence(TestCase):
    def test_accelerator_reports_as_before(self):
        self.assertEqual(probe("with"), probe("without"))
        try:
            acc = torch.accelerator.current_accelerator()
        except RuntimeError:   # torch 2.6 without an accelerator raises
            acc = None
        self.assertNotEqual(str(acc), "unified")

    @extension_only("the fork registers no PrivateUse1 backend, so it needs no accelerator hook")
    def test_accelerator_hook_installed(self):
        from torch_direct import _backend
        # x86-64 Linux builds of libtorch call getAccelerator() through PLT slots.
        self.assertGreaterEqual(_backend.ACCELERATOR_HOOK_SLOTS, 1)

    def test_cpu_tensors_untouched(self):
        t = torch.randn(3, 3)
        self.assertEqual(t.device.type, "cpu")
        self.assertEqual((t @ t).device.type, "cpu")
        self.assertFalse(t.is_unified)


@requires_gpu
class TestCoexistenceGPU(TestCase):
    def test_pin_memory(self):
        t = torch.randn(1000)
        p = t.pin_memory()
        self.assertTrue(p.is_pinned())
        self.assertFalse(t.is_pinned())
        self.assertEqual(p, t)
        self.assertEqual(p.device.type, "cpu")

    def test_dataloader_pin_memory(self):
        ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.arange(64))
        dl = torch.utils.data.DataLoader(ds, batch_size=16, pin_memory=True, num_workers=0)
        for x, y in dl:
            self.assertTrue(x.is_pinned() and y.is_pinned())
        dl = torch.utils.data.DataLoader(ds, batch_size=16, pin_memory=True, num_workers=2)
        n = sum(x.shape[0] for x, _ in dl)
        self.assertEqual(n, 64)

    def test_accelerator_api(self):
        self.assertEqual(torch.accelerator.current_accelerator().type, "cuda")
        self.assertEqual(torch.accelerator.device_count(), torch.cuda.device_count())
        torch.accelerator.set_device_index(0)
        self.assertEqual(torch.accelerator.current_device_index(), 0)
        s = torch.accelerator.current_stream()
        self.assertEqual(s.device.type, "cuda")
        torch.accelerator.synchronize()
        with torch.accelerator.device_index(0):
            pass

    def test_cuda_backward(self):
        # PyTorch >= 2.8 breaks this for any named PrivateUse1 backend unless
        # getAccelerator() keeps answering CUDA (csrc/runtime/AcceleratorHook.h).
        m = torch.nn.Linear(8, 2).cuda()
        x = torch.randn(4, 8, device="cuda", requires_grad=True)
        m(x).sum().backward()
        self.assertEqual(x.grad.shape, (4, 8))
        self.assertTrue(m.weight.grad.is_cuda)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = (x * 2).sum()
        y.backward()
        torch.cuda.synchronize()

    def test_default_stream_and_event_are_cuda(self):
        self.assertEqual(torch.Stream().device.type, "cuda")
        self.assertEqual(torch.Event().device.type, "cuda")

    def test_autocast_cuda(self):
        a = torch.randn(8, 8, device="cuda")
        with torch.autocast("cuda"):
            self.assertEqual((a @ a).dtype, torch.float16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            self.assertEqual((a @ a).dtype, torch.bfloat16)

    def test_streams_and_events(self):
        s = torch.cuda.Stream()
        e = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            x = torch.ones(1000, device="cuda") * 2
            e.record()
        e.synchronize()
        self.assertEqual(x.sum().item(), 2000.0)
        gs = torch.Stream("cuda")
        ge = torch.Event("cuda")
        ge.record(gs)
        ge.synchronize()
        self.assertTrue(gs.query())


if __name__ == "__main__":
    run_tests()
