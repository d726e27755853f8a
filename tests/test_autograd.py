"""Unified tensors under autograd: data sources for training, and leaves."""

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import HAS_GPU, compute_device


class TestAutograd(TestCase):
    def test_gather_feeding_a_model_trains(self):
        torch.manual_seed(0)
        dev = compute_device()
        feats = torch.randn(512, 16)
        labels = (feats[:, 0] > 0).long()
        table = feats.to("unified")
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        first = None
        for step in range(60):
            idx = torch.randint(0, 512, (64,), device=dev)
            x = table[idx]
            self.assertEqual(x.device, dev)
            loss = F.cross_entropy(model(x), labels.to(dev)[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = loss.item() if first is None else first
        self.assertLess(loss.item(), first * 0.7)

    def test_requires_grad_on_a_unified_tensor_is_a_clear_error(self):
        u = torch.randn(10, 4).to("unified").requires_grad_()
        idx = torch.tensor([1, 3], device=compute_device())
        for use in (lambda: u[idx], lambda: u * 3, lambda: u.sum(), lambda: u.to(compute_device())):
            with self.assertRaisesRegex(RuntimeError, "unified tensor that requires grad"):
                use()
        with torch.no_grad():  # as data, under no_grad, it works
            self.assertEqual(u[idx].shape, (2, 4))
        self.assertEqual(u.detach()[idx].shape, (2, 4))
        u.requires_grad_(False)
        self.assertEqual((u * 2).shape, (10, 4))

    def test_gathered_rows_can_require_grad(self):
        src = torch.randn(10, 4, dtype=torch.float64)
        u = src.to("unified")
        rows = u[torch.tensor([1, 3, 3], device=compute_device())].requires_grad_()
        (rows * 2).sum().backward()
        self.assertEqual(rows.grad.cpu(), torch.full((3, 4), 2.0, dtype=torch.float64))


if __name__ == "__main__":
    run_tests()
