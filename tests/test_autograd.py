"""Unified tensors under autograd: data sources for training, and leaves."""

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import compute_device


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

    def test_graphsage_with_unified_parameters_trains_like_the_compute_device(self):
        import tempfile
        from torch_direct.gnn.graph import NeighborSampler
        from torch_direct.gnn.graph.datasets import load_dataset
        from torch_direct.gnn.pipeline.models import GNN
        dev = compute_device()
        with tempfile.TemporaryDirectory() as root:
            ds = load_dataset("tiny", root)
            sampler = NeighborSampler(ds.graph, [5, 5], seed=0)
            train = ds.split["train"]
            batches = [sampler.sample(train[i * 64:(i + 1) * 64]) for i in range(4)]

            def trained(where):
                torch.manual_seed(0)
                model = GNN("sage", ds.x.size(1), 16, ds.num_classes, 2, dropout=0.0, use_pyg=False)
                model.to(where)
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
                losses = []
                for sb in batches:
                    x = ds.x[sb.n_id].to(dev)
                    out = model(x, [b.to(dev) for b in sb.adjs])[:sb.batch_size]
                    loss = F.cross_entropy(out, ds.y[sb.n_id[:sb.batch_size]].to(dev))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                return model, losses

            m_u, l_u = trained("unified")
            m_d, l_d = trained(dev)
        self.assertTrue(all(p.device.type == "unified" for p in m_u.parameters()))
        self.assertEqual(l_u, l_d)
        self.assertNotEqual(l_u[0], l_u[-1])  # it trained
        for pu, pd in zip(m_u.parameters(), m_d.parameters()):
            self.assertEqual(pu.detach().cpu(), pd.detach().cpu())

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

    def test_sparse_embedding_in_unified_memory_trains_in_place(self):
        dev = compute_device()
        rows, dim = 1000, 8
        cases = {
            "SGD": lambda p: torch.optim.SGD(p, lr=0.5),
            "SGD momentum": lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
            "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.5),
            "SparseAdam": lambda p: torch.optim.SparseAdam(p, lr=0.05),
        }
        batches = [torch.randint(0, 100, (32,), generator=torch.Generator().manual_seed(s)) for s in range(3)]
        for name, make_opt in cases.items():
            torch.manual_seed(0)
            ref = torch.nn.Embedding(rows, dim, sparse=True).to(dev)
            emb = torch.nn.Embedding(rows, dim, sparse=True)
            emb.load_state_dict(ref.state_dict())
            emb.to("unified")
            table = emb.weight
            ptr, before = table.data_ptr(), table.detach().cpu().clone()
            opt_u, opt_r = make_opt(emb.parameters()), make_opt(ref.parameters())
            torch_direct.reset_peak_memory_stats()
            base = torch_direct.memory_stats()["allocated_bytes"]
            for idx in batches:
                for m, opt in ((emb, opt_u), (ref, opt_r)):
                    opt.zero_grad()
                    out = m(idx.to(dev))
                    self.assertEqual(out.device, dev, msg=name)
                    (out * out).sum().backward()
                    if m is emb:
                        self.assertEqual(m.weight.grad.layout, torch.sparse_coo, msg=name)
                        self.assertEqual(m.weight.grad.device.type, "unified", msg=name)
                    opt.step()
            # The same rows as on the compute device, updated in place: the
            # table was neither replaced nor copied (no unified allocation of
            # its size), and rows no batch touched are unchanged.
            self.assertIs(emb.weight, table)
            self.assertEqual(table.device.type, "unified")
            self.assertEqual(table.data_ptr(), ptr, msg=name)
            self.assertEqual(table.detach().cpu(), ref.weight.detach().cpu(), msg=name)
            touched = torch.zeros(rows, dtype=torch.bool)
            for idx in batches:
                touched[idx] = True
            self.assertEqual(table.detach().cpu()[~touched], before[~touched], msg=name)
            self.assertFalse(torch.equal(table.detach().cpu()[touched], before[touched]), msg=name)
            # Unified memory allocated beyond the table: the rows' gradients and
            # the optimizer's dense state (Adagrad's sum, SparseAdam's two
            # moments), never a second table.
            table_bytes = table.numel() * table.element_size()
            state = {"Adagrad": 1, "SparseAdam": 2}.get(name, 0) * table_bytes
            extra = torch_direct.memory_stats()["allocated_bytes.peak"] - base
            self.assertLess(extra, state + table_bytes // 2, msg=name)

    def test_two_lookups_into_one_sparse_unified_table_sum_their_gradients(self):
        # Autograd sums the two sparse gradients of the table before its
        # AccumulateGrad: that sum stays in unified memory.
        dev = compute_device()
        torch.manual_seed(0)
        ref = torch.nn.Embedding(50, 4, sparse=True).to(dev)
        emb = torch.nn.Embedding(50, 4, sparse=True)
        emb.load_state_dict(ref.state_dict())
        emb.to("unified")
        a, b = torch.tensor([1, 2, 3, 2]), torch.tensor([3, 4, 1])
        for m in (emb, ref):
            (m(a.to(dev)).sum(0) * m(b.to(dev)).pow(2).sum(0)).sum().backward()
        grad = emb.weight.grad
        self.assertEqual(grad.device.type, "unified")
        self.assertEqual(grad.layout, torch.sparse_coo)
        self.assertEqual(grad.to_dense().cpu(), ref.weight.grad.to_dense().cpu())
        # A dense unified operand summed with a sparse one stays unified too;
        # beside a CPU or CUDA operand the sum is on the compute device (R1-R3).
        dense = torch.ones(50, 4).to("unified")
        self.assertEqual((dense + grad).device.type, "unified")
        self.assertEqual((dense + grad).cpu(), 1 + ref.weight.grad.to_dense().cpu())
        self.assertEqual((torch.ones(50, 4, device=dev) + grad).device, dev)

    def test_a_function_returning_kept_unified_gradients_sums_them_in_unified_memory(self):
        # A Python autograd.Function whose backward returns a unified tensor it
        # also keeps, used twice on one unified leaf: autograd cannot add into
        # either gradient in place, so it computes `old + new`, which stays in
        # unified memory and so becomes the leaf's .grad there. Outside a
        # backward the same sum is on the compute device (R3).
        dev = compute_device()

        class FixedGradient(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, g):
                ctx.save_for_backward(g)
                return x.clone()

            @staticmethod
            def backward(ctx, grad):
                (g,) = ctx.saved_tensors
                return g, None

        torch.manual_seed(0)
        g1 = torch.randn(6, 3, dtype=torch.float64).to("unified")
        g2 = torch.randn(6, 3, dtype=torch.float64).to("unified")
        i = torch.tensor([[0, 4, 5], [1, 1, 2]])
        s = torch.sparse_coo_tensor(i, torch.randn(3, dtype=torch.float64), (6, 3)).to("unified")
        for grads in ([g1, g2], [g1, g1], [g1, s, g2], [s, g1]):
            x = torch.zeros(6, 3, dtype=torch.float64).to("unified").requires_grad_()
            sum(FixedGradient.apply(x, g) for g in grads).sum().backward()
            self.assertEqual(x.grad.device.type, "unified")
            self.assertEqual(x.grad.cpu(), sum(g.cpu().to_dense() for g in grads))
        self.assertEqual((g1 + g2).device, dev)

    def test_sparse_unified_tensors_compute_and_check_their_indices(self):
        dev = compute_device()
        i = torch.tensor([[0, 2, 2], [1, 0, 1]])
        v = torch.tensor([1.0, 2.0, 3.0])
        s = torch.sparse_coo_tensor(i, v, (3, 2)).to(dev)
        su = s.to("unified")
        self.assertEqual(su.device.type, "unified")
        self.assertEqual(su.layout, torch.sparse_coo)
        self.assertEqual(su._nnz(), 3)
        self.assertEqual(su._indices().device.type, "unified")
        self.assertEqual(su.to_dense().cpu(), s.to_dense().cpu())
        self.assertEqual(su.coalesce().to_dense().cpu(), s.coalesce().to_dense().cpu())
        d = torch.zeros(3, 2).to("unified")
        d.add_(su, alpha=2)
        self.assertEqual(d.cpu(), 2 * s.to_dense().cpu())
        # an in-place op on the sparse tensor itself keeps it unified
        su.add_(su)
        self.assertEqual(su.device.type, "unified")
        self.assertEqual(su._values().device.type, "unified")
        self.assertEqual(su.to_dense().cpu(), 2 * s.to_dense().cpu())
        # ops with a sparse kernel of their own run it (unsqueeze's composite would as_strided)
        for dim in (0, 2):
            e = su.unsqueeze(dim)
            self.assertEqual((e.device.type, e.layout), ("unified", torch.sparse_coo))
            self.assertEqual(e.to_dense().cpu(), 2 * s.to_dense().cpu().unsqueeze(dim))
        if dev.type == "cuda":
            # GPU kernels write through a sparse tensor's indices: a bad one is
            # an IndexError before any kernel runs, not a device-side assert.
            bad = torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.ones(2), (3,),
                                          check_invariants=False).to("unified")
            small = torch.zeros(3).to("unified")
            with self.assertRaisesRegex(IndexError, "index 5 is out of bounds"):
                small.add_(bad)
            self.assertEqual(small.cpu(), torch.zeros(3))

    def test_a_leaf_given_new_sizes_by_set_gets_gradients_of_those_sizes(self):
        p = torch.nn.Parameter(torch.ones(16, dtype=torch.double).to("unified"))
        for n in (15, 14):
            with torch.no_grad():
                p.set_(p[1:])
                p.grad = None
            m = torch.cat((p, p))  # the previous step's graph is still alive here
            m.sum().backward()
            self.assertEqual(p.grad.device.type, "unified")
            self.assertEqual(p.grad.cpu(), torch.full((n,), 2.0, dtype=torch.double))


if __name__ == "__main__":
    run_tests()
