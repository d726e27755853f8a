"""Shared test helpers: one place that says when a GPU test can run and why not."""

from __future__ import annotations

import unittest

import torch

import torch_direct

HAS_GPU = torch.cuda.is_available() and torch_direct.cuda_available()
NO_GPU_REASON = (
    "needs a CUDA GPU: unified memory is read in place by GPU kernels, which this "
    "machine cannot run (torch.cuda.is_available() is False)"
)

requires_gpu = unittest.skipUnless(HAS_GPU, NO_GPU_REASON)


def compute_device() -> torch.device:
    """Where rule R3 runs an op whose only tensor operands are unified."""
    return torch.device("cuda", torch.cuda.current_device()) if HAS_GPU else torch.device("cpu")
