"""The fused mean aggregation of the built-in GraphSAGE layer: the same means and gradients
as index_select + index_add_, for any edge order, dtype and width; its errors; the layer."""

import unittest

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from torch_direct.gnn.pipeline.aggregate import (fused_applies, index_add_mean, mean_aggregate, relu_dropout,
                                                 sage_input, sage_input_width)
from torch_direct.gnn.pipeline.models import GNN, SAGELayer


def block(n_src, n_dst, fanout, *, grouped=True, seed=0, dtype=torch.int64, device="cpu"):
    """A sampled-block-like edge list: up to ``fanout`` sources per target (some targets none),
    grouped by target as the samplers emit them, or shuffled."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, fanout + 1, (n_dst,), generator=g)
    dst = torch.repeat_interleave(torch.arange(n_dst), counts)
    src = torch.randint(0, n_src, (dst.numel(),), generator=g)
    if not grouped:
        perm = torch.randperm(dst.numel(), generator=g)
        src, dst = src[perm], dst[perm]
    return src.to(dtype=dtype, device=device), dst.to(dtype=dtype, device=device)


class _Cases:
    device = "cpu"

    def check(self, n_src, n_dst, fanout, features, *, dtype=torch.float32, index=torch.int64, grouped=True,
              seed=0):
        src, dst = block(n_src, n_dst, fanout, grouped=grouped, seed=seed, dtype=index, device=self.device)
        x = torch.randn(n_src, features, generator=torch.Generator().manual_seed(seed + 1)).to(self.device, dtype)
        x_ref = x.clone().requires_grad_()
        x_new = x.clone().requires_grad_()
        self.assertTrue(fused_applies(x_new, src))
        ref = index_add_mean(x_ref.float(), src.long(), dst.long(), n_dst)
        out = mean_aggregate(x_new, src, dst, n_dst)
        self.assertEqual(out.dtype, dtype)
        self.assertEqual(out.shape, (n_dst, features))
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        self.assertEqual(out.float(), ref, **tol)
        grad = torch.randn(n_dst, features, generator=torch.Generator().manual_seed(seed + 2)).to(self.device, dtype)
        ref.backward(grad.float())
        out.backward(grad)
        self.assertEqual(x_new.grad.dtype, dtype)
        self.assertEqual(x_new.grad.float(), x_ref.grad.float(), **tol)

    def test_grouped_edges_of_a_sampled_block(self):
        self.check(300, 100, 15, 128)

    def test_shuffled_edges_give_the_same_means(self):
        self.check(300, 100, 15, 128, grouped=False)

    def test_runs_across_chunk_boundaries_and_lone_targets(self):
        # fanout 70: a target's run spans up to three 32-edge chunks; fanout 1: a run per edge
        self.check(500, 40, 70, 64, seed=3)
        self.check(500, 400, 1, 64, seed=4)

    def test_widths_not_a_multiple_of_a_tile(self):
        for features in (1, 3, 33, 130, 300):
            with self.subTest(features=features):
                self.check(200, 60, 9, features, seed=features)

    def test_half_bfloat16_and_int32_edges(self):
        self.check(200, 60, 9, 96, dtype=torch.float16)
        self.check(200, 60, 9, 96, dtype=torch.bfloat16)
        self.check(200, 60, 9, 96, index=torch.int32)

    def test_float16_rows_give_float32_means(self):
        src, dst = block(200, 60, 9, device=self.device)
        x = torch.randn(200, 64).half().to(self.device).requires_grad_()
        out = mean_aggregate(x, src, dst, 60, dtype=torch.float32)
        self.assertEqual(out.dtype, torch.float32)
        self.assertEqual(out, index_add_mean(x.detach().float(), src, dst, 60), atol=1e-5, rtol=1e-5)
        out.sum().backward()
        self.assertEqual(x.grad.dtype, torch.float16)
        ref = x.detach().float().requires_grad_()
        index_add_mean(ref, src, dst, 60).sum().backward()
        self.assertEqual(x.grad.float(), ref.grad, atol=1e-3, rtol=1e-3)
        # the layer takes float16 rows as the float32 rows they equal
        torch.manual_seed(0)
        layer = SAGELayer(64, 16).to(self.device)
        edge_index = torch.stack([src, dst])
        self.assertEqual(layer(x.detach(), edge_index, (200, 60)), layer(x.detach().float(), edge_index, (200, 60)),
                         atol=1e-5, rtol=1e-5)

    def test_no_edges_gives_zeros(self):
        x = torch.randn(10, 8, device=self.device, requires_grad=True)
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        out = mean_aggregate(x, empty, empty, 5)
        self.assertEqual(out, torch.zeros(5, 8, device=self.device))
        out.sum().backward()
        self.assertEqual(x.grad, torch.zeros_like(x))

    def test_no_gradient_asked_for_x(self):
        src, dst = block(50, 20, 5, device=self.device)
        w = torch.ones(8, device=self.device, requires_grad=True)
        x = torch.randn(50, 8, device=self.device)
        (mean_aggregate(x, src, dst, 20) * w).sum().backward()
        self.assertEqual(w.grad, (index_add_mean(x, src, dst, 20)).sum(0))

    def test_the_layer_computes_graphsage(self):
        torch.manual_seed(0)
        layer = SAGELayer(32, 16).to(self.device)
        src, dst = block(120, 40, 10, device=self.device)
        x = torch.randn(120, 32, device=self.device, requires_grad=True)
        out = layer(x, torch.stack([src, dst]), (120, 40))
        ref_x = x.detach().clone().requires_grad_()
        w_l, b_l, w_r = (t.detach().clone().requires_grad_() for t in (layer.lin_l.weight, layer.lin_l.bias,
                                                                        layer.lin_r.weight))
        ref = index_add_mean(ref_x, src, dst, 40) @ w_l.t() + b_l + ref_x[:40] @ w_r.t()
        self.assertEqual(out, ref, atol=1e-5, rtol=1e-5)
        out.square().sum().backward()
        ref.square().sum().backward()
        self.assertEqual(x.grad, ref_x.grad, atol=1e-4, rtol=1e-4)
        for p, q in ((layer.lin_l.weight, w_l), (layer.lin_l.bias, b_l), (layer.lin_r.weight, w_r)):
            self.assertEqual(p.grad, q.grad, atol=1e-4, rtol=1e-4)

    def test_sage_input_holds_means_own_rows_and_ones(self):
        # odd widths too: the zero columns pad each row to a multiple of 8
        for features, width in ((32, 72), (3, 8), (5, 16)):
            src, dst = block(90, 30, 6, device=self.device)
            x = torch.randn(90, features, device=self.device, requires_grad=True)
            a = sage_input(x, src, dst, 30)
            self.assertEqual(sage_input_width(features), width)
            self.assertEqual(a.shape, (30, width))
            ref_x = x.detach().clone().requires_grad_()
            ref = torch.cat([index_add_mean(ref_x, src, dst, 30), ref_x[:30], torch.ones(30, 1, device=self.device),
                             torch.zeros(30, width - 2 * features - 1, device=self.device)], 1)
            self.assertEqual(a, ref, atol=1e-5, rtol=1e-5)
            g = torch.randn_like(a)
            a.backward(g)
            ref.backward(g)
            self.assertEqual(x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)

    def test_sage_input_casts_rows_and_refuses_bad_shapes(self):
        src, dst = block(40, 10, 4, device=self.device)
        x = torch.randn(40, 16, device=self.device, dtype=torch.float16, requires_grad=True)
        a = sage_input(x, src, dst, 10, torch.bfloat16)
        self.assertEqual(a.dtype, torch.bfloat16)
        self.assertEqual(a[:, 16:32], x.detach()[:10].to(torch.bfloat16))
        a.float().sum().backward()
        self.assertEqual(x.grad.dtype, torch.float16)
        with self.assertRaisesRegex(ValueError, "n_dst \\(41\\) is more than x's 40 rows"):
            sage_input(x, src, dst, 41)
        with self.assertRaisesRegex(ValueError, "needs float32/float16/bfloat16 rows"):
            sage_input(x.detach().double(), src, dst, 10)

    def test_the_layer_in_bfloat16_autocast_follows_float32(self):
        torch.manual_seed(0)
        layer = SAGELayer(64, 32).to(self.device)
        src, dst = block(300, 100, 8, device=self.device)
        x = torch.randn(300, 64, device=self.device)
        edge_index = torch.stack([src, dst])
        with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16, cache_enabled=False):
            low = layer(x, edge_index, (300, 100))
        self.assertEqual(low.dtype, torch.bfloat16)
        full = layer(x, edge_index, (300, 100))
        self.assertEqual(low.float(), full, atol=5e-2, rtol=5e-2)
        low.float().square().sum().backward()
        grads = [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad()
        full.square().sum().backward()
        for g, p in zip(grads, layer.parameters()):
            self.assertEqual(g, p.grad, atol=0.1, rtol=5e-2)

    def test_the_layer_is_the_same_with_either_aggregation(self):
        torch.manual_seed(0)
        fused = SAGELayer(32, 16).to(self.device)
        plain = SAGELayer(32, 16, aggregate="index_add").to(self.device)
        plain.load_state_dict(fused.state_dict())
        src, dst = block(120, 40, 10, device=self.device)
        x = torch.randn(120, 32, device=self.device)
        edge_index = torch.stack([src, dst])
        a, b = fused(x, edge_index, (120, 40)), plain(x, edge_index, (120, 40))
        self.assertEqual(a, b, atol=1e-5, rtol=1e-5)
        a.square().sum().backward()
        b.square().sum().backward()
        for p, q in zip(fused.parameters(), plain.parameters()):
            self.assertEqual(p.grad, q.grad, atol=1e-4, rtol=1e-4)


class TestAggregateCPU(_Cases, TestCase):
    device = "cpu"

    def test_bad_input_is_refused_before_any_work(self):
        x = torch.randn(10, 4)
        src, dst = block(10, 5, 3)
        with self.assertRaisesRegex(IndexError, "src holds 10, outside"):
            mean_aggregate(x, src.clone().fill_(10), dst, 5)
        with self.assertRaisesRegex(IndexError, "dst holds -1, outside"):
            mean_aggregate(x, src, dst.clone().fill_(-1), 5)
        with self.assertRaisesRegex(ValueError, "must be one-dimensional and of one length"):
            mean_aggregate(x, src[:-1], dst, 5)
        with self.assertRaisesRegex(TypeError, "must both be int64 or both int32"):
            mean_aggregate(x, src.int(), dst, 5)
        with self.assertRaisesRegex(ValueError, "n_dst must be >= 0"):
            mean_aggregate(x, src[:0], dst[:0], -1)
        with self.assertRaisesRegex(ValueError, "implementation must be one of"):
            mean_aggregate(x, src, dst, 5, implementation="scatter")
        with self.assertRaisesRegex(ValueError, "aggregate must be one of"):
            SAGELayer(4, 4, aggregate="sum")

    def test_relu_dropout_off_the_gpu_is_relu_then_dropout(self):
        x = torch.randn(50, 20)
        torch.manual_seed(3)
        a = relu_dropout(x, 0.4, True)
        torch.manual_seed(3)
        self.assertEqual(a, torch.nn.functional.dropout(torch.relu(x), 0.4, True))
        self.assertEqual(relu_dropout(x, 0.4, False), torch.relu(x))
        with self.assertRaisesRegex(ValueError, "p must be in \\[0, 1\\]"):
            relu_dropout(x, 1.5, True)

    def test_other_dtypes_take_the_stock_ops(self):
        x = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
        src, dst = block(10, 5, 3)
        self.assertFalse(fused_applies(x, src))
        self.assertTrue(torch.autograd.gradcheck(lambda t: mean_aggregate(t, src, dst, 5), (x,)))

    def test_a_model_trains_the_same_with_either_aggregation(self):
        src, dst = block(64, 16, 4)
        src2, dst2 = block(16, 4, 4, seed=1)
        adjs = [(torch.stack([src, dst]), None, (64, 16)), (torch.stack([src2, dst2]), None, (16, 4))]
        x = torch.randn(64, 12)
        outs = []
        for aggregate in ("fused", "index_add"):
            torch.manual_seed(0)
            model = GNN("sage", 12, 8, 3, 2, dropout=0.0, use_pyg=False)
            for layer in model.layers:
                layer.aggregate = aggregate
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                model(x, adjs).sum().backward()
                opt.step()
            outs.append(model(x, adjs))
        self.assertEqual(outs[0], outs[1], atol=1e-5, rtol=1e-5)


@unittest.skipUnless(torch.cuda.is_available(),
                     "needs a CUDA GPU for the fused kernels' CUDA path (torch.cuda.is_available() is False)")
class TestAggregateCUDA(_Cases, TestCase):
    device = "cuda"

    def test_papers_sized_first_layer(self):
        # a first block of papers100M-like's size class: ~150k targets, fanout 5, 128 features
        self.check(700_000, 150_000, 5, 128)

    def test_relu_dropout_keeps_positives_at_rate_one_minus_p(self):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.randn(1000, 257, device="cuda", dtype=dtype, requires_grad=True)   # odd size: a tail
            torch.manual_seed(0)
            out = relu_dropout(x, 0.3, True)
            kept = out != 0
            # every output is 0 or relu(x) / 0.7, and only positive inputs pass
            self.assertEqual(out[kept], (x.detach()[kept].float() / 0.7).to(dtype))
            self.assertTrue(bool((x.detach()[kept] > 0).all()))
            rate = kept.sum().item() / (x.detach() > 0).sum().item()
            self.assertLess(abs(rate - 0.7), 0.01)   # ~128K positives: the binomial sd is 0.0013
            g = torch.randn_like(out)
            out.backward(g)
            self.assertEqual(x.grad, torch.where(kept, (g.float() / 0.7).to(dtype), torch.zeros_like(g)))
            torch.manual_seed(0)   # the seed repeats the draws; the next call draws new ones
            again = relu_dropout(x.detach(), 0.3, True)
            self.assertEqual(again, out.detach())
            self.assertNotEqual(relu_dropout(x.detach(), 0.3, True), out.detach())

    def test_relu_dropout_same_draws_for_any_alignment(self):
        # a view one element in is not aligned for four-element accesses: the kernels' scalar
        # path, which must draw and scale as the vector path does
        base = torch.randn(4 * 1001 + 3, device="cuda", requires_grad=True)
        view = base[1:]
        torch.manual_seed(5)
        a = relu_dropout(view, 0.5, True)
        torch.manual_seed(5)
        b = relu_dropout(view.detach().clone(), 0.5, True)
        self.assertEqual(a, b)
        g = torch.randn_like(a)
        a.backward(g)
        self.assertEqual(base.grad[1:], torch.where(b != 0, g / 0.5, torch.zeros_like(g)))

    def test_relu_dropout_draws_anew_on_each_replay(self):
        x = torch.rand(64, 512, device="cuda") + 0.1   # all positive: the mask alone decides
        relu_dropout(x, 0.5, True)   # first use off the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = relu_dropout(x, 0.5, True)
        graph.replay()
        first = out.clone()
        graph.replay()
        self.assertNotEqual(first != 0, out != 0)
        for o in (first, out):
            self.assertLess(abs((o != 0).float().mean().item() - 0.5), 0.02)

    def test_captured_in_a_cuda_graph(self):
        src, dst = block(400, 100, 12, device="cuda")
        x = torch.randn(400, 64, device="cuda", requires_grad=True)
        grad = torch.randn(100, 64, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):   # warm up off the capture, as torch's docs ask
            mean_aggregate(x, src, dst, 100).backward(grad)
        torch.cuda.current_stream().wait_stream(stream)
        x.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mean_aggregate(x, src, dst, 100)
            out.backward(grad)
        x.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        self.assertEqual(out, index_add_mean(x.detach(), src, dst, 100), atol=1e-5, rtol=1e-5)
        ref = x.detach().clone().requires_grad_()
        index_add_mean(ref, src, dst, 100).backward(grad)
        self.assertEqual(x.grad, ref.grad, atol=1e-5, rtol=1e-5)


if __name__ == "__main__":
    run_tests()
