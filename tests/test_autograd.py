"""Unified tensors under autograd: data sources for training, and leaves."""

import unittest

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import IS_FORK, compute_device, extension_only


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

    @unittest.skipUnless(IS_FORK, "the fork's Unified key has no autograd kernels for unified operands yet "
                                  "(the extension's test_unified_leaves_* cover them)")
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

    @extension_only("autograd kernels for unified operands are registered by the extension")
    def test_unified_leaves_get_the_gradients_of_the_compute_device(self):
        torch.manual_seed(0)
        dev = compute_device()
        w0 = torch.randn(6, 4, dtype=torch.float64)
        x = torch.randn(5, 6, dtype=torch.float64, device=dev)
        idx = torch.tensor([0, 2, 2, 5], device=dev)
        uses = {
            "mm": lambda w: (x @ w).sin().sum(),
            "gather": lambda w: (w[idx] * 3).sum(),
            "index_select": lambda w: w.index_select(0, idx).pow(2).sum(),
            "embedding": lambda w: F.embedding(idx, w).sum(),
            "view and clone": lambda w: (w.view(4, 6).clone() * x[:4]).sum(),
            "to": lambda w: w.to(dev).exp().sum(),
            "two uses": lambda w: (x @ w).sum() + w.sum() * 2,
        }
        for name, use in uses.items():
            u = w0.to("unified").requires_grad_()
            ref = w0.clone().to(dev).requires_grad_()
            out = use(u)
            self.assertEqual(out.device, dev, msg=name)
            out.backward()
            use(ref).backward()
            self.assertTrue(u.is_leaf)
            self.assertEqual(u.grad.device.type, "unified", msg=name)
            self.assertEqual(u.grad.cpu(), ref.grad.cpu(), msg=name)
            # A second backward accumulates, into unified memory.
            use(u).backward()
            self.assertEqual(u.grad.device.type, "unified", msg=name)
            self.assertEqual(u.grad.cpu(), 2 * ref.grad.cpu(), msg=name)

    @extension_only("autograd kernels for unified operands are registered by the extension")
    def test_unified_leaves_in_a_model_train_like_the_compute_device(self):
        dev = compute_device()
        torch.manual_seed(0)
        feats = torch.randn(256, 8)
        labels = (feats[:, 0] + feats[:, 1] > 0).long()

        def trained(where, opt_cls, steps=15):
            torch.manual_seed(1)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            model.to(where)
            opt = opt_cls(model.parameters(), lr=0.05)
            losses = []
            for _ in range(steps):
                out = model(feats.to(dev))
                loss = F.cross_entropy(out, labels.to(dev))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return model, losses

        for opt_cls in (torch.optim.SGD, torch.optim.Adam):
            m_u, l_u = trained("unified", opt_cls)
            m_d, l_d = trained(dev, opt_cls)
            for p in m_u.parameters():
                self.assertEqual(p.device.type, "unified")
                self.assertEqual(p.grad.device.type, "unified")
            self.assertEqual(l_u, l_d, msg=opt_cls.__name__)
            for pu, pd in zip(m_u.parameters(), m_d.parameters()):
                self.assertEqual(pu.detach().cpu(), pd.detach().cpu(), msg=opt_cls.__name__)
            self.assertLess(l_u[-1], l_u[0])

    @extension_only("autograd kernels for unified operands are registered by the extension")
    def test_recording_history_into_a_unified_tensor_is_a_clear_error(self):
        dev = compute_device()
        u = torch.zeros(3, 4).to("unified")
        w = torch.randn(3, 4, device=dev, requires_grad=True)
        history = "writes into a unified tensor in place while autograd records history through it"
        with self.assertRaisesRegex(RuntimeError, history + r" \(an operand requires grad\)"):
            u.add_(w)
        self.assertEqual(u.cpu(), torch.zeros(3, 4))  # refused before writing
        v = torch.ones(3, 4).to("unified").requires_grad_()
        with self.assertRaisesRegex(RuntimeError, history):
            u.copy_(v)
        with self.assertRaisesRegex(RuntimeError, history):
            F.pad(v, (1, 1), mode="circular")  # copies into a new unified tensor from v
        self.assertIsNone(v.grad)
        with torch.no_grad():
            u.add_(w)
        self.assertEqual(u.cpu(), w.detach().cpu())
        e = torch.nn.Embedding(10, 4, sparse=True).to("unified")
        out = e(torch.tensor([1, 2], device=dev)).sum()
        with self.assertRaisesRegex(RuntimeError, "sparse gradient of a unified tensor"):
            out.backward()

    def test_gathered_rows_can_require_grad(self):
        src = torch.randn(10, 4, dtype=torch.float64)
        u = src.to("unified")
        rows = u[torch.tensor([1, 3, 3], device=compute_device())].requires_grad_()
        (rows * 2).sum().backward()
        self.assertEqual(rows.grad.cpu(), torch.full((3, 4), 2.0, dtype=torch.float64))


if __name__ == "__main__":
    run_tests()
