"""Shared test helpers: when a GPU test can run and why not, and which vehicle
gives the unified device (the same tests run on the extension and on a fork
wheel; docs/fork.md)."""

from __future__ import annotations

import tempfile
import unittest

import torch
from torch.testing._internal.common_utils import TestCase

import torch_direct

HAS_GPU = torch.cuda.is_available() and torch_direct.cuda_available()
NO_GPU_REASON = (
    "needs a CUDA GPU: unified memory is read in place by GPU kernels, which this "
    "machine cannot run (torch.cuda.is_available() is False)"
)

requires_gpu = unittest.skipUnless(HAS_GPU, NO_GPU_REASON)

# "extension" (PrivateUse1 renamed on stock torch) or "fork" (native device).
VEHICLE = torch_direct.vehicle()
IS_FORK = VEHICLE == "fork"
# The dispatch key unified kernels are registered under.
UNIFIED_DISPATCH_KEY = "Unified" if IS_FORK else "PrivateUse1"
# Its autograd key (autograd through unified operands, csrc/aten/Autograd.cpp).
AUTOGRAD_KEY = "Autograd" + UNIFIED_DISPATCH_KEY


def extension_only(why: str):
    """Skip on a fork wheel a test of something only the extension has (`why`)."""
    return unittest.skipIf(IS_FORK, f"extension only: {why}")


def compute_device() -> torch.device:
    """Where rule R3 runs an op whose only tensor operands are unified."""
    return torch.device("cuda", torch.cuda.current_device()) if HAS_GPU else torch.device("cpu")


class TinyDatasetCase(TestCase):
    """The tiny preset in a temporary cache; torch's thread count restored afterwards."""

    @classmethod
    def setUpClass(cls):
        from torch_direct.gnn.graph import load_dataset
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ds = load_dataset("tiny", root=cls.tmp.name, show_progress=False)
        cls.threads = torch.get_num_threads()

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls.threads)
        cls.tmp.cleanup()


def fp8_reference(q: torch.Tensor, scale: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``q[idx].float() * scale[idx]`` of a float8 table, indexing its bytes (torch before 2.7
    indexes no float8 tensor on the CPU)."""
    rows = q.view(torch.uint8)[idx].view(q.dtype)
    return rows.float() * scale[idx].unsqueeze(1)
