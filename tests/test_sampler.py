"""CPU neighbour sampler: block layout, correctness against a reference, unbiasedness, determinism."""

import itertools
import os
import unittest
from unittest import mock

import numpy as np

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import requires_gpu
from torch_direct.gnn.graph import CSRGraph, GPUNeighborSampler, NeighborSampler, _sampler


# Upper 0.1% points of the chi-square distribution (df: value).
CHI2_999 = {6: 22.458, 34: 65.247, 99: 148.230}


def chi_square(counts, expected):
    counts = np.asarray(counts, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def random_graph(num_nodes=300, num_edges=3000, seed=0, col_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    # A few hubs so some nodes have degree far above the fanouts, and some none.
    src = torch.randint(num_nodes, (num_edges,), generator=g)
    dst = (torch.rand(num_edges, generator=g) ** 3 * num_nodes).long()
    return CSRGraph.from_edge_index(torch.stack([src, dst]), num_nodes, dedupe=True,
                                    remove_self_loops=True, col_dtype=col_dtype)


def star_graph(degree):
    """Node 0 aggregates from nodes 1..degree."""
    src = torch.arange(1, degree + 1)
    return CSRGraph.from_edge_index(torch.stack([src, torch.zeros_like(src)]), degree + 1)


def floyd_reference(n, k, trials, draw_below, rng):
    """Floyd's k-of-n selection, vectorized over trials, with a caller-supplied
    bounded draw: the shape of the sampler's algorithm, for a biased twin."""
    picks = np.empty((trials, k), dtype=np.int64)
    for i, j in enumerate(range(n - k, n)):
        t = draw_below(j + 1, trials, rng)
        seen = (picks[:, :i] == t[:, None]).any(axis=1)
        picks[:, i] = np.where(seen, j, t)
    return picks


def modulo_draw(bound, size, rng):
    """`rand() % bound`, the draw of PyG's and SALIENT's samplers, with a 5-bit
    rand(): the same modulo bias, enlarged so that a test of this size sees it
    (its expected chi-square here is about 530, against 65 for p = 0.001)."""
    return rng.integers(0, 32, size=size) % bound


def unbiased_draw(bound, size, rng):
    return rng.integers(0, bound, size=size)


def subset_counts(picks, n):
    index = {s: i for i, s in enumerate(itertools.combinations(range(n), picks.shape[1]))}
    counts = np.zeros(len(index), dtype=np.int64)
    for row in np.sort(picks, axis=1):
        counts[index[tuple(row)]] += 1
    return counts


class TestBlocks(TestCase):
    def check_batch(self, graph, seeds, fanouts, batch):
        """Everything the block layout promises, checked against the graph."""
        rowptr, col = graph.rowptr, graph.col.long()
        n_id = batch.n_id
        self.assertEqual(batch.batch_size, len(seeds))
        self.assertEqual(n_id[:len(seeds)], torch.as_tensor(seeds, dtype=torch.long))
        self.assertEqual(n_id.unique().numel(), n_id.numel())
        self.assertEqual(len(batch.hops), len(fanouts))
        self.assertEqual(batch.adjs, batch.hops[::-1])
        n_dst = len(seeds)
        for fanout, (edge_index, _, (n_src, nd)) in zip(fanouts, batch.hops):
            self.assertEqual(nd, n_dst)
            self.assertGreaterEqual(n_src, n_dst)
            src, dst = edge_index
            if edge_index.numel():
                self.assertTrue(bool((src >= 0).all() and (src < n_src).all()))
                self.assertTrue(bool((dst >= 0).all() and (dst < n_dst).all()))
            # Edges come grouped by target, and new nodes are numbered in the
            # order the edges discover them (the reference's hash-map walk).
            self.assertTrue(bool((dst[1:] >= dst[:-1]).all()))
            seen = {int(v): i for i, v in enumerate(n_id[:n_dst].tolist())}
            for u in n_id[src].tolist():
                seen.setdefault(u, len(seen))
            self.assertEqual(len(seen), n_src)
            self.assertEqual(n_id[:n_src].tolist(), sorted(seen, key=seen.get))
            for t in range(n_dst):
                v = int(n_id[t])
                nbrs = col[rowptr[v]:rowptr[v + 1]].tolist()
                got = n_id[src[dst == t]].tolist()
                self.assertEqual(len(got), len(set(got)), f"duplicate neighbour of {v}")
                self.assertTrue(set(got) <= set(nbrs), f"a sampled edge into {v} does not exist")
                expect = len(nbrs) if fanout < 0 else min(fanout, len(nbrs))
                self.assertEqual(len(got), expect)
                if fanout < 0 or len(nbrs) <= fanout:
                    self.assertEqual(sorted(got), sorted(nbrs))
            n_dst = n_src
        self.assertEqual(n_dst, n_id.numel())

    def test_blocks_match_the_graph(self):
        for col_dtype in (torch.int64, torch.int32):
            graph = random_graph(col_dtype=col_dtype)
            sampler = NeighborSampler(graph, [4, 3, 2], seed=1)
            for seeds in ([0, 5, 7, 299], [3], list(range(100, 160, 3))):
                self.check_batch(graph, seeds, [4, 3, 2], sampler.sample(seeds))

    def test_all_and_zero_fanouts(self):
        graph = random_graph()
        seeds = [1, 2, 250]
        self.check_batch(graph, seeds, [-1, 2], NeighborSampler(graph, [-1, 2]).sample(seeds))
        batch = NeighborSampler(graph, [0, 3]).sample(seeds)
        self.assertEqual(batch.hops[0].edge_index.shape, (2, 0))
        self.assertEqual(batch.hops[0].size, (3, 3))
        self.check_batch(graph, seeds, [0, 3], batch)

    def test_large_fanout_uses_the_hash_set_path(self):
        graph = star_graph(100)
        batch = NeighborSampler(graph, [40]).sample([0])
        self.check_batch(graph, [0], [40], batch)

    def test_unified_graph(self):
        graph = random_graph()
        seeds = [0, 5, 9]
        want = NeighborSampler(graph, [3, 3], seed=4).sample(seeds)
        got = NeighborSampler(graph.to("unified"), [3, 3], seed=4).sample(seeds)
        self.assertEqual(got.n_id, want.n_id)
        for a, b in zip(got.hops, want.hops):
            self.assertEqual(a.edge_index, b.edge_index)
            self.assertEqual(a.size, b.size)

    def test_edge_ids(self):
        graph = CSRGraph.from_edge_index(torch.tensor([[1, 2, 3, 0, 0], [0, 0, 0, 1, 2]]), 4,
                                         keep_edge_ids=True)
        batch = NeighborSampler(graph, [-1], return_edge_ids=True).sample([0])
        src = batch.n_id[batch.hops[0].edge_index[0]]
        self.assertEqual(batch.hops[0].e_id, src - 1)  # edge k is (k+1 -> 0)
        no_ids = NeighborSampler(graph, [-1]).sample([0])
        self.assertIsNone(no_ids.hops[0].e_id)

    def test_blocks_drive_message_passing(self):
        """With every neighbour kept, layers over the blocks give the full-graph result at the seeds."""
        graph = random_graph(num_nodes=120, num_edges=700, seed=3)
        x = torch.randn(graph.num_nodes, 4, dtype=torch.float64)
        ei = graph.to_edge_index()

        def mean_layer(x_src, x_dst, edge_index):
            agg = torch.zeros(x_dst.size(0), x_src.size(1), dtype=x_src.dtype)
            agg.index_add_(0, edge_index[1], x_src[edge_index[0]])
            deg = torch.bincount(edge_index[1], minlength=x_dst.size(0)).clamp(min=1)
            return x_dst + agg / deg[:, None]

        full = x
        for _ in range(2):
            full = mean_layer(full, full, ei)
        seeds = torch.tensor([3, 50, 7, 119])
        batch = NeighborSampler(graph, [-1, -1]).sample(seeds)
        h = x[batch.n_id]
        for edge_index, _, size in batch.adjs:
            self.assertEqual(h.size(0), size[0])
            h = mean_layer(h, h[:size[1]], edge_index)
        self.assertEqual(h, full[seeds])

    def test_batch_to_and_repr(self):
        batch = NeighborSampler(random_graph(), [2, 2]).sample([0, 1])
        moved = batch.to("cpu")
        self.assertEqual(moved.n_id, batch.n_id)
        self.assertIn("batch_size=2", repr(batch))
        self.assertEqual(len(batch.num_sampled_edges), 2)


class TestDistribution(TestCase):
    def test_uniform_below_is_uniform(self):
        for bound in (7, 3 * 2**62 // 3 + 1):  # small, and one where modulo bias would be huge
            draws = _sampler._sampler_uniform_below(5, 0, bound, 70000)
            self.assertTrue(bool((draws >= 0).all()) and bool((draws < bound).all()))
            bins = (draws.double() / bound * 7).long().clamp(max=6) if bound > 7 else draws
            counts = torch.bincount(bins, minlength=7).numpy()
            self.assertLess(chi_square(counts, [len(draws) / 7] * 7), CHI2_999[6])

    def test_every_subset_equally_likely(self):
        # degree 7, fanout 3: 35 subsets. One batch per trial, all in one call.
        trials = 35000
        sampler = NeighborSampler(star_graph(7), [3], seed=11)
        batches = sampler.sample_batches([torch.tensor([0])] * trials)
        picks = np.stack([b.n_id[1:].numpy() - 1 for b in batches])
        counts = subset_counts(picks, 7)
        stat = chi_square(counts, [trials / 35] * 35)
        self.assertLess(stat, CHI2_999[34], f"subset frequencies are not uniform: chi2={stat:.1f}")
        inclusion = np.bincount(picks.ravel(), minlength=7)
        self.assertLess(chi_square(inclusion, [trials * 3 / 7] * 7) / (1 - 3 / 7), CHI2_999[6])

    def test_the_test_detects_modulo_bias(self):
        """The same statistic, same trial count, on Floyd with `rand() % j`: rejected."""
        trials = 35000
        rng = np.random.default_rng(0)
        fair = subset_counts(floyd_reference(7, 3, trials, unbiased_draw, rng), 7)
        biased = subset_counts(floyd_reference(7, 3, trials, modulo_draw, rng), 7)
        self.assertLess(chi_square(fair, [trials / 35] * 35), CHI2_999[34])
        self.assertGreater(chi_square(biased, [trials / 35] * 35), 2 * CHI2_999[34])

    def test_inclusion_uniform_for_large_fanout(self):
        trials, degree, fanout = 4000, 100, 40
        sampler = NeighborSampler(star_graph(degree), [fanout], seed=2)
        batches = sampler.sample_batches([torch.tensor([0])] * trials)
        picks = torch.cat([b.n_id[1:] for b in batches]) - 1
        counts = torch.bincount(picks, minlength=degree).numpy()
        p = fanout / degree
        stat = float((((counts - trials * p) ** 2) / (trials * p * (1 - p))).sum())
        self.assertLess(stat, CHI2_999[99])


class TestDeterminism(TestCase):
    def sample_all(self, graph, seed, threads):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            sampler = NeighborSampler(graph, [5, 3], seed=seed)
            return sampler.sample_batches([torch.arange(i, i + 20) for i in range(0, 200, 20)])
        finally:
            torch.set_num_threads(old)

    def test_same_seed_same_batches_any_thread_count(self):
        graph = random_graph()
        a = self.sample_all(graph, 7, 1)
        b = self.sample_all(graph, 7, 2)
        c = self.sample_all(graph, 8, 2)
        for x, y in zip(a, b):
            self.assertEqual(x.n_id, y.n_id)
            for hx, hy in zip(x.hops, y.hops):
                self.assertEqual(hx.edge_index, hy.edge_index)
        self.assertFalse(all(torch.equal(x.n_id, z.n_id) for x, z in zip(a, c)))

    def test_reseed_restarts_the_sequence(self):
        sampler = NeighborSampler(random_graph(), [5], seed=3)
        first = [sampler.sample([0, 1, 2]).n_id for _ in range(3)]
        self.assertFalse(torch.equal(first[0], first[1]) and torch.equal(first[1], first[2]))
        sampler.reseed(3)
        again = [sampler.sample([0, 1, 2]).n_id for _ in range(3)]
        for x, y in zip(first, again):
            self.assertEqual(x, y)

    def test_loader_covers_every_seed_once(self):
        graph = random_graph()
        sampler = NeighborSampler(graph, [2, 2], seed=0)
        ids = torch.arange(0, 300, 2)
        batches = list(sampler.loader(ids, 16, generator=torch.Generator().manual_seed(0)))
        self.assertEqual(len(batches), 10)
        seeds = torch.cat([b.n_id[:b.batch_size] for b in batches])
        self.assertEqual(seeds.sort().values, ids)
        self.assertEqual(len(list(sampler.loader(ids, 16, shuffle=False, drop_last=True))), 9)


class TestErrors(TestCase):
    def test_bad_input(self):
        graph = random_graph()
        sampler = NeighborSampler(graph, [2])
        with self.assertRaisesRegex(IndexError, "out of range"):
            sampler.sample([0, graph.num_nodes])
        with self.assertRaisesRegex(IndexError, "out of range"):
            sampler.sample([-1])
        with self.assertRaisesRegex(ValueError, "appears twice"):
            sampler.sample([3, 4, 3])
        with self.assertRaisesRegex(TypeError, "1-D int32/int64"):
            sampler.sample(torch.tensor([0.5]))
        with self.assertRaisesRegex(ValueError, "non-empty list"):
            NeighborSampler(graph, [])
        with self.assertRaisesRegex(ValueError, ">= 0, or -1"):
            NeighborSampler(graph, [3, -2])
        with self.assertRaisesRegex(TypeError, "hold ints"):
            NeighborSampler(graph, [2.5])
        with self.assertRaisesRegex(TypeError, "CSRGraph"):
            NeighborSampler(graph.rowptr, [2])
        with self.assertRaisesRegex(ValueError, "positive int"):
            next(sampler.loader(torch.arange(4), 0))

    @unittest.skipIf(torch.cuda.is_available(), "checks the error without CUDA; the GPU test pins")
    def test_pin_memory_needs_cuda(self):
        with self.assertRaisesRegex(ValueError, "pin_memory=True needs CUDA"):
            NeighborSampler(random_graph(), [2], pin_memory=True)

    @requires_gpu
    def test_pinned_results_equal_pageable_ones(self):
        graph = random_graph()
        seeds = [torch.arange(i, i + 20) for i in range(0, 100, 20)]
        plain = NeighborSampler(graph, [5, 3], seed=1, return_edge_ids=True).sample_batches(seeds)
        pinned = NeighborSampler(graph, [5, 3], seed=1, return_edge_ids=True, pin_memory=True).sample_batches(seeds)
        for x, y in zip(plain, pinned):
            self.assertTrue(y.n_id.is_pinned())
            self.assertFalse(x.n_id.is_pinned())
            self.assertEqual(x.n_id, y.n_id)
            for hx, hy in zip(x.hops, y.hops):
                self.assertTrue(hy.edge_index.is_pinned())
                self.assertEqual(hx.edge_index, hy.edge_index)
                self.assertEqual(hx.e_id, hy.e_id)
                self.assertEqual(hy.edge_index.to("cuda", non_blocking=True).cpu(), hx.edge_index)

    def test_empty_batch(self):
        batch = NeighborSampler(random_graph(), [2, 2]).sample(torch.empty(0, dtype=torch.long))
        self.assertEqual(batch.n_id.numel(), 0)
        self.assertEqual([h.size for h in batch.hops], [(0, 0), (0, 0)])


def uniform_rows_graph(targets, degree):
    """Nodes 0..targets-1 each aggregate from `degree` distinct other nodes: one
    batch of all of them is `targets` independent trials of a degree-`degree` draw."""
    dst = torch.arange(targets).repeat_interleave(degree)
    src = targets + (torch.arange(targets * degree) * 7919) % (4 * degree)
    return CSRGraph.from_edge_index(torch.stack([src, dst]), targets + 4 * degree, dedupe=True)


class BlockSamplerChecks:
    """The whole-batch (GPU) sampler; `device` picks where its steps run."""

    device = "cpu"

    def graph(self, graph):
        return graph if self.device == "cpu" else graph.to("unified")

    def check_same_batches_as(self, **baseline):
        """The batches (numbering, edges, slots) under the settings in force equal those under the
        experimental settings ``baseline``."""
        for col_dtype in (torch.int64, torch.int32):
            graph = random_graph(num_nodes=2000, num_edges=40000, col_dtype=col_dtype)
            seeds = torch.randperm(2000, generator=torch.Generator().manual_seed(0))[:256]
            for fanouts in ([15, 10, 5], [-1, 3], [0, 4], [3], [200, 2]):   # 200: above the padding limit
                got = self.sampler(graph, fanouts, seed=3, return_edge_ids=True).sample(seeds).to("cpu")
                with torch_direct.experimental(**baseline):
                    base = self.sampler(graph, fanouts, seed=3, return_edge_ids=True).sample(seeds).to("cpu")
                self.assertEqual(got.n_id, base.n_id, msg=str(fanouts))
                for a, b in zip(got.hops, base.hops):
                    self.assertEqual(a.edge_index, b.edge_index, msg=str(fanouts))
                    self.assertEqual(a.size, b.size)
                    self.assertEqual(a.e_id, b.e_id)
                    if a.e_id is not None:
                        self.assertEqual(a.e_id.numel(), a.edge_index.size(1))

    def sampler(self, graph, fanouts, **kw):
        return GPUNeighborSampler(self.graph(graph), fanouts, device=self.device, **kw)

    def test_blocks_match_the_graph(self):
        for col_dtype in (torch.int64, torch.int32):
            graph = random_graph(col_dtype=col_dtype)
            sampler = self.sampler(graph, [4, 3, 2], seed=1)
            for seeds in ([0, 5, 7, 299], [3], list(range(100, 160, 3)), []):
                batch = sampler.sample(torch.tensor(seeds, dtype=torch.long)).to("cpu")
                TestBlocks.check_batch(self, graph, seeds, [4, 3, 2], batch)
            for fanouts in ([-1, 2], [0, 3], [40]):
                batch = self.sampler(graph, fanouts).sample([1, 2, 250]).to("cpu")
                TestBlocks.check_batch(self, graph, [1, 2, 250], fanouts, batch)

    def test_blocks_drive_message_passing(self):
        graph = random_graph(num_nodes=120, num_edges=700, seed=3)
        x = torch.randn(graph.num_nodes, 4, dtype=torch.float64)
        seeds = torch.tensor([3, 50, 7, 119])
        want = NeighborSampler(graph, [-1, -1]).sample(seeds)
        got = self.sampler(graph, [-1, -1]).sample(seeds).to("cpu")
        self.assertEqual(got.n_id, want.n_id)  # with nothing random, the numbering is the CPU sampler's
        for a, b in zip(got.hops, want.hops):
            self.assertEqual(a.edge_index, b.edge_index)
            self.assertEqual(a.size, b.size)

    def test_every_subset_equally_likely(self):
        targets, calls = 5000, 7
        graph = uniform_rows_graph(targets, 7)
        sampler = self.sampler(graph, [3], seed=5, return_edge_ids=True)
        picks = []
        for _ in range(calls):
            hop = sampler.sample(torch.arange(targets)).hops[0]
            slots = hop.e_id.cpu() - graph.rowptr[hop.edge_index[1].cpu()]
            picks.append(slots.view(targets, 3).numpy())
        counts = subset_counts(np.concatenate(picks), 7)
        stat = chi_square(counts, [targets * calls / 35] * 35)
        self.assertLess(stat, CHI2_999[34], f"subset frequencies are not uniform: chi2={stat:.1f}")

    def test_deterministic_for_a_seed(self):
        graph = random_graph()
        a = self.sampler(graph, [5, 3], seed=9)
        b = self.sampler(graph, [5, 3], seed=9)
        c = self.sampler(graph, [5, 3], seed=10)
        seeds = torch.arange(0, 60, 3)
        same = lambda p, q: torch.equal(p.n_id.cpu(), q.n_id.cpu())  # noqa: E731
        x, y, z = a.sample(seeds), b.sample(seeds), c.sample(seeds)
        self.assertTrue(same(x, y))
        self.assertEqual(x.hops[1].edge_index, y.hops[1].edge_index)
        self.assertFalse(same(x, z))
        self.assertFalse(same(x, a.sample(seeds)))  # each batch draws from a new stream
        a.reseed(9)
        self.assertTrue(same(x, a.sample(seeds)))
        # streams reserved up front and used out of order: each batch the one it is in turn
        d, e = self.sampler(graph, [5, 3], seed=9), self.sampler(graph, [5, 3], seed=9)
        in_turn = [d.sample(seeds) for _ in range(4)]
        first = e.take_streams(3)
        self.assertEqual(first, 0)
        for j in (2, 0, 1):
            got = e.sample(seeds, stream=first + j)
            self.assertTrue(same(got, in_turn[j]))
            self.assertEqual(got.hops[0].edge_index, in_turn[j].hops[0].edge_index)
        self.assertTrue(same(e.sample(seeds), in_turn[3]))   # the next one after those reserved
        with self.assertRaisesRegex(ValueError, "stream must be an int that take_streams reserved"):
            e.sample(seeds, stream=4)
        with self.assertRaisesRegex(ValueError, "take_streams: n must be an int >= 0"):
            e.take_streams(-1)

    def test_many_batches_at_once_are_the_batches_one_at_a_time(self):
        for col_dtype in (torch.int64, torch.int32):
            graph = random_graph(num_nodes=2000, num_edges=40000, col_dtype=col_dtype)
            gen = torch.Generator().manual_seed(1)
            batches = [torch.randperm(2000, generator=gen)[:n] for n in (256, 1, 0, 100, 256)]
            for fanouts in ([15, 10, 5], [-1, 3], [0, 4], [200, 2]):
                one = self.sampler(graph, fanouts, seed=3, return_edge_ids=True)
                many = self.sampler(graph, fanouts, seed=3, return_edge_ids=True, batches_per_call=5)
                singles = [one.sample(b).to("cpu") for b in batches]
                together = [b.to("cpu") for b in many.sample_batches(batches)]
                self.assertEqual(len(together), len(batches))
                for a, b in zip(singles, together):
                    self.assertEqual(a.n_id, b.n_id, msg=str(fanouts))
                    self.assertEqual(a.batch_size, b.batch_size)
                    for x, y in zip(a.hops, b.hops):
                        self.assertEqual(x.edge_index, y.edge_index, msg=str(fanouts))
                        self.assertEqual(x.size, y.size)
                        self.assertEqual(x.e_id, y.e_id)
                # the streams continue where the batches left them
                self.assertEqual(one.sample(batches[0]).n_id.cpu(), many.sample(batches[0]).n_id.cpu())
        sampler = self.sampler(random_graph(), [2], batches_per_call=2)
        with self.assertRaisesRegex(IndexError, "seed node -1 is out of range"):
            sampler.sample_batches([[0, 1], [-1, 5]])
        with self.assertRaisesRegex(ValueError, "appears twice"):
            sampler.sample_batches([[0, 1], [3, 4, 3]])
        self.assertEqual(sampler.sample_batches([[0, 1], [0, 1]])[1].n_id[:2].tolist(), [0, 1])  # per batch
        self.assertEqual(sampler.sample_batches([]), [])
        with self.assertRaisesRegex(ValueError, "batches_per_call must be an int >= 1"):
            self.sampler(random_graph(), [2], batches_per_call=0)

    def test_loader_and_edge_ids(self):
        graph = CSRGraph.from_edge_index(torch.tensor([[1, 2, 3, 0, 0], [0, 0, 0, 1, 2]]), 4,
                                         keep_edge_ids=True)
        batch = self.sampler(graph, [-1], return_edge_ids=True).sample([0]).to("cpu")
        self.assertEqual(batch.hops[0].e_id, batch.n_id[batch.hops[0].edge_index[0]] - 1)
        sampler = self.sampler(random_graph(), [2])
        seen = torch.cat([b.n_id[:b.batch_size].cpu() for b in sampler.loader(torch.arange(50), 8)])
        self.assertEqual(seen.sort().values, torch.arange(50))

    def test_bad_input(self):
        graph = random_graph()
        sampler = self.sampler(graph, [2])
        with self.assertRaisesRegex(IndexError, f"seed node {graph.num_nodes} is out of range.*{graph.num_nodes} nodes"):
            sampler.sample([0, graph.num_nodes])
        with self.assertRaisesRegex(IndexError, "seed node -1 is out of range"):
            sampler.sample([-1, 5, graph.num_nodes])   # the low end is named first
        with self.assertRaisesRegex(ValueError, "appears twice"):
            sampler.sample([3, 4, 3])
        with self.assertRaisesRegex(TypeError, "1-D int32/int64"):
            sampler.sample(torch.tensor([[1]]))
        self.assertEqual(sampler.sample([4]).n_id[0].item(), 4)   # and still works
        with self.assertRaisesRegex(ValueError, "CUDA device"):
            GPUNeighborSampler(graph, [2], device="meta")


class TestBlockSamplerCpu(BlockSamplerChecks, TestCase):
    device = "cpu"

    def test_graph_elsewhere(self):
        with self.assertRaisesRegex(ValueError, "unified memory"):
            GPUNeighborSampler(random_graph(), [2], device="cuda:0")


class WithSettings:
    """Every test of the class runs under the experimental ``settings``."""

    settings: dict = {}

    def setUp(self):
        super().setUp()
        self._settings = torch_direct.experimental(**self.settings)
        self._settings.__enter__()

    def tearDown(self):
        self._settings.__exit__(None, None, None)
        super().tearDown()


class FewerWaits(WithSettings):
    """The same checks with the experimental setting sampler_waits=fewer (one wait per hop, seeds
    checked after the first hop): every promise of the block layout, the distribution and the errors."""

    settings = {"sampler_waits": "fewer"}

    def test_same_batches_as_the_default_waits(self):
        # Only when the host waits changes: the batches (numbering, edges, slots) are the same.
        self.check_same_batches_as(sampler_waits="default")

    def test_bad_setting(self):
        with torch_direct.experimental(sampler_waits="some"):
            with self.assertRaisesRegex(RuntimeError, "sampler_waits must be fewer or default, not 'some'"):
                self.sampler(random_graph(), [2]).sample([1, 2])
        # A name the core does not know is refused where it is read (the variable set by hand).
        with mock.patch.dict(os.environ, {"TORCH_DIRECT_EXPERIMENTAL": "sampler_wait=fewer"}):
            with self.assertRaisesRegex(RuntimeError, "unknown setting 'sampler_wait'"):
                self.sampler(random_graph(), [2]).sample([1, 2])


class TestBlockSamplerCpuFewerWaits(FewerWaits, BlockSamplerChecks, TestCase):
    device = "cpu"


@requires_gpu
class TestBlockSamplerGpuFewerWaits(FewerWaits, BlockSamplerChecks, TestCase):
    device = "cuda"


class SortRelabel(WithSettings):
    """The same checks with the experimental setting sampler_relabel=sort (each hop's new nodes
    numbered by sorting instead of through the default hash table): the same batches, every
    promise kept."""

    settings = {"sampler_relabel": "sort"}

    def test_same_batches_as_the_hash_table(self):
        self.check_same_batches_as(sampler_relabel="hash")

    def test_relabel_of_many_repeats(self):
        # Hubs: most sampled sources are a few nodes, read again and again (long probe chains
        # and many threads on one hash slot on the GPU); both numberings stay first-occurrence order.
        n = 3000
        dst = torch.arange(n).repeat_interleave(8)
        src = torch.randint(0, 12, (n * 8,), generator=torch.Generator().manual_seed(1)) * 97 % n
        graph = CSRGraph.from_edge_index(torch.stack([src, dst]), n, dedupe=True)
        seeds = torch.arange(0, n, 5)
        base = self.sampler(graph, [5, 5], seed=2).sample(seeds).to("cpu")
        with torch_direct.experimental(sampler_relabel="hash"):
            hashed = self.sampler(graph, [5, 5], seed=2).sample(seeds).to("cpu")
        self.assertEqual(hashed.n_id, base.n_id)
        for a, b in zip(hashed.hops, base.hops):
            self.assertEqual(a.edge_index, b.edge_index)
        self.assertEqual(hashed.n_id[:seeds.numel()], seeds)

    def test_bad_setting(self):
        with torch_direct.experimental(sampler_relabel="radix"):
            with self.assertRaisesRegex(RuntimeError, "sampler_relabel must be hash or sort, not 'radix'"):
                self.sampler(random_graph(), [2]).sample([1, 2])


class TestBlockSamplerCpuSortRelabel(SortRelabel, BlockSamplerChecks, TestCase):
    device = "cpu"


class TestBlockSamplerCpuSortRelabelFewerWaits(SortRelabel, BlockSamplerChecks, TestCase):
    device = "cpu"
    settings = {"sampler_relabel": "sort", "sampler_waits": "fewer"}


@requires_gpu
class TestBlockSamplerGpuSortRelabel(SortRelabel, BlockSamplerChecks, TestCase):
    device = "cuda"


@requires_gpu
class TestBlockSamplerGpuSortRelabelFewerWaits(SortRelabel, BlockSamplerChecks, TestCase):
    device = "cuda"
    settings = {"sampler_relabel": "sort", "sampler_waits": "fewer"}


@requires_gpu
class TestBlockSamplerGpu(BlockSamplerChecks, TestCase):
    """On the GPU, over a CSR in unified memory (read in place)."""

    device = "cuda"

    def test_same_batches_as_the_cpu_steps(self):
        # The draw uses the same per-target streams on both devices: identical batches.
        for col_dtype in (torch.int64, torch.int32):
            graph = random_graph(num_nodes=2000, num_edges=40000, col_dtype=col_dtype)
            seeds = torch.randperm(2000, generator=torch.Generator().manual_seed(0))[:256]
            cpu = GPUNeighborSampler(graph, [15, 10, 5], seed=3, device="cpu").sample(seeds)
            for g in (graph.to("unified"), graph.to("cuda")):
                gpu = GPUNeighborSampler(g, [15, 10, 5], seed=3).sample(seeds.cuda())
                self.assertEqual(gpu.n_id.device.type, "cuda")
                self.assertEqual(gpu.n_id.cpu(), cpu.n_id)
                for a, b in zip(gpu.hops, cpu.hops):
                    self.assertEqual(a.edge_index.cpu(), b.edge_index)
                    self.assertEqual(a.size, b.size)

    def test_graph_stays_in_host_memory(self):
        graph = random_graph(num_nodes=2000, num_edges=40000).to("unified")
        before = torch.cuda.memory_allocated()
        sampler = GPUNeighborSampler(graph, [10, 10], seed=0)
        batch = sampler.sample(torch.arange(64, device="cuda"))
        del batch
        torch.cuda.synchronize()
        self.assertLess(torch.cuda.memory_allocated() - before, graph.num_edges * 8)
        self.assertTrue(graph.col.is_unified)

    def test_cpu_graph_is_refused(self):
        with self.assertRaisesRegex(ValueError, "unified memory"):
            GPUNeighborSampler(random_graph(), [2])


if __name__ == "__main__":
    run_tests()
