"""Locality levers: node-ID reordering, merged gathers, the ablation."""

import contextlib
import io
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from torch_direct.gnn.graph import (CSRGraph, NeighborSampler, NodeDataset, Reordering, access_frequency,
                                load_dataset, reorder)
from torch_direct.gnn.graph.reorder import relabel_graph
from torch_direct.gnn.pipeline import PipelinedLoader, make_feature_store
from common import TinyDatasetCase, requires_gpu


def random_graph(n, e, seed, edge_ids=False):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(n, (2, e), generator=g)
    return CSRGraph.from_edge_index(ei, n, dedupe=True, keep_edge_ids=edge_ids)


def varied_graph(seed, n=200):
    """Rows of 0 to 12 neighbours (about a third empty) and one of 150, drawn with repeats:
    rows shorter and longer than a fanout, weights of many denominators."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 13, (n,), generator=g)
    lens[torch.rand(n, generator=g) < 0.3] = 0
    lens[n // 3] = 150
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(lens, 0, out=rowptr[1:])
    return CSRGraph(rowptr, torch.randint(n, (int(rowptr[-1]),), generator=g))


def bits(t):
    """A float32 tensor's bit patterns: equal only if bit for bit the same."""
    return t.view(torch.int32)


def brute_force_relabel(graph, perm):
    """Row by row in Python: new row r = old row perm[r], each neighbour renamed."""
    inv = {int(old): new for new, old in enumerate(perm.tolist())}
    rowptr, cols, eids = [0], [], []
    for r in range(graph.num_nodes):
        old = int(perm[r])
        a, b = int(graph.rowptr[old]), int(graph.rowptr[old + 1])
        cols += [inv[int(c)] for c in graph.col[a:b]]
        if graph.edge_ids is not None:
            eids += graph.edge_ids[a:b].tolist()
        rowptr.append(len(cols))
    return rowptr, cols, eids


def edge_set(graph, to_old=None):
    ei = graph.to_edge_index()
    if to_old is not None:
        ei = to_old[ei]
    return set(map(tuple, ei.t().tolist()))


class TestReorder(TestCase):
    def test_matches_brute_force(self):
        for n, e, seed in ((1, 0, 0), (7, 20, 1), (40, 300, 2), (100, 50, 3)):
            g = random_graph(n, e, seed, edge_ids=True)
            for by in ("degree", "frequency", "none", torch.randperm(n, generator=torch.Generator().manual_seed(seed))):
                g2, ro = reorder(g, by)
                self.assertIsInstance(ro, Reordering)
                g2.validate()
                rowptr, cols, eids = brute_force_relabel(g, ro.perm)
                self.assertEqual(g2.rowptr.tolist(), rowptr)
                self.assertEqual(g2.col.tolist(), cols)
                self.assertEqual(g2.col.dtype, g.col.dtype)
                self.assertEqual(g2.edge_ids.tolist(), eids)
                self.assertEqual(edge_set(g2, ro.perm), edge_set(g))
                self.assertEqual(ro.perm[ro.inv], torch.arange(n))

    def test_chunked_relabel(self):
        mod = sys.modules["torch_direct.gnn.graph.reorder"]   # the module (the package exports the function)
        dense = random_graph(50, 400, 4, edge_ids=True)
        sparse = random_graph(60, 40, 5, edge_ids=True)   # runs of empty rows, some at a chunk's edge
        saved = mod._EDGE_CHUNK
        try:
            for g in (dense, sparse, CSRGraph(sparse.rowptr, sparse.col.int(), sparse.edge_ids)):
                mod._EDGE_CHUNK = saved
                whole, ro = reorder(g, "degree")
                rowptr, cols, eids = brute_force_relabel(g, ro.perm)
                self.assertEqual(whole.col.tolist(), cols)
                for chunk in (1, 2, 7, 64):
                    mod._EDGE_CHUNK = chunk
                    part = relabel_graph(g, ro.perm, ro.inv)
                    self.assertEqual(part.rowptr.tolist(), rowptr)
                    self.assertEqual(part.col, whole.col)
                    self.assertEqual(part.col.dtype, g.col.dtype)
                    self.assertEqual(part.edge_ids.tolist(), eids)
        finally:
            mod._EDGE_CHUNK = saved

    def test_relabel_kernel_on_threads_and_in_row_ranges(self):
        # The CPU threads share each range of rows by edges (a row of 150 beside rows of 0-12):
        # any thread count and any split into row ranges writes the same arrays.
        from torch_direct.gnn.graph import _sampler
        g = varied_graph(6, n=300)
        eids = torch.randperm(g.num_edges, generator=torch.Generator().manual_seed(1))
        g = CSRGraph(g.rowptr, g.col, eids)
        perm = torch.randperm(300, generator=torch.Generator().manual_seed(2))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(300)
        rowptr, cols, want_eids = brute_force_relabel(g, perm)
        rowptr_new = torch.tensor(rowptr)
        for col in (g.col, g.col.int()):
            for threads in (1, 2, 3, 8):
                for cuts in ((0, 300), (0, 100, 101, 300), (0, 0, 299, 300)):
                    col_new, eids_new = torch.full_like(col, -1), torch.full_like(eids, -1)
                    for a, b in zip(cuts[:-1], cuts[1:]):
                        _sampler._relabel_csr(g.rowptr, col, perm, inv.to(col.dtype), rowptr_new, col_new, eids, eids_new,
                                              a, b, threads)
                    with self.subTest(dtype=col.dtype, threads=threads, cuts=cuts):
                        self.assertEqual(col_new.tolist(), cols)
                        self.assertEqual(eids_new.tolist(), want_eids)

    def test_relabel_kernel_refuses_bad_ids(self):
        from torch_direct.gnn.graph import _sampler
        g = random_graph(30, 200, 7)
        perm = torch.randperm(30, generator=torch.Generator().manual_seed(3))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(30)
        rowptr_new = torch.tensor(brute_force_relabel(g, perm)[0])
        bad_col = g.col.clone()
        bad_col[5] = 30
        deg = g.rowptr[1:] - g.rowptr[:-1]
        other = int(torch.nonzero(deg[perm] != deg[perm[0]])[0])
        twice = perm.clone()
        twice[0] = perm[other]   # a node listed twice: its row's length is not the one rowptr_new gives
        for args, msg in (((g.rowptr, bad_col, perm), "outside"), ((g.rowptr, g.col, twice), "outside|lengths")):
            kept = [a.clone() for a in args]
            with self.assertRaisesRegex(RuntimeError, msg):
                _sampler._relabel_csr(*args, inv, rowptr_new, torch.empty_like(g.col), None, None, 0, 30, 2)
            for a, k in zip(args, kept):
                self.assertEqual(a, k)   # the inputs are untouched
        # row starts out of order: a row would lie outside the entries, refused before it is read
        shuffled = g.rowptr.clone()
        shuffled[3], shuffled[4] = int(g.rowptr[-1]) + 5, -7
        with self.assertRaisesRegex(RuntimeError, "outside"):
            _sampler._relabel_csr(shuffled, g.col, perm, inv, rowptr_new, torch.empty_like(g.col), None, None, 0, 30, 2)
        with self.assertRaisesRegex(RuntimeError, "not within"):
            _sampler._relabel_csr(g.rowptr, g.col, perm, inv, rowptr_new, torch.empty_like(g.col), None, None, 0, 31, 2)
        with self.assertRaisesRegex(RuntimeError, "col_new"):
            _sampler._relabel_csr(g.rowptr, g.col, perm, inv, rowptr_new, torch.empty(3, dtype=g.col.dtype), None, None,
                                  0, 30, 2)

    def test_degree_order_puts_hot_nodes_first(self):
        g = random_graph(200, 3000, 5)
        g2, ro = reorder(g, "degree")
        deg = g2.degree()
        self.assertTrue(bool((deg[1:] <= deg[:-1]).all()))
        g3, _ = reorder(g, "frequency")
        freq = torch.bincount(g3.col.long(), minlength=200)
        self.assertTrue(bool((freq[1:] <= freq[:-1]).all()))
        # with a fanout, ranked as a cache ranks its rows: the hottest rows become the first ones
        g4, ro4 = reorder(g, "frequency", fanout=2)
        score = access_frequency(g4, 2)
        self.assertTrue(bool((score[1:] <= score[:-1]).all()))
        self.assertEqual(score, access_frequency(g, 2)[ro4.perm])
        # that score is the reorder's own, kept for the graph it made: no second pass over the
        # edges (which begins by reading the CSR's arrays), and the same as such a pass gives
        mod = sys.modules["torch_direct.gnn.graph.reorder"]
        with mock.patch.object(mod, "_frequency_pass", side_effect=AssertionError("a second pass")):
            kept = access_frequency(g4, 2)
        self.assertEqual(kept, access_frequency(CSRGraph(g4.rowptr, g4.col), 2), atol=1e-5, rtol=1e-6)
        kept.fill_(-1)   # the caller's copy: what is kept stays
        self.assertEqual(access_frequency(g4, 2), score)
        with mock.patch.object(mod, "_frequency_pass", wraps=mod._frequency_pass) as passes:
            access_frequency(g4, 3)   # another fanout: computed
            access_frequency(g3, 2)   # the reorder kept fanout -1's only
        self.assertEqual(passes.call_count, 2)
        for bad in (0, -2, 1.5, True):
            with self.assertRaisesRegex(ValueError, "fanout"):
                reorder(g, "frequency", fanout=bad)

    def test_access_frequency(self):
        # rows: 0 -> [1, 2, 3, 4], 1 -> [2], 2 -> [1, 2 is not its own], 3 -> [], 4 -> [1]
        ei = torch.tensor([[1, 2, 3, 4, 2, 1, 1], [0, 0, 0, 0, 1, 2, 4]])
        g = CSRGraph.from_edge_index(ei, 5)
        self.assertEqual(g.degree(), torch.tensor([4, 1, 1, 0, 1]))
        self.assertEqual(access_frequency(g), torch.bincount(g.col.long(), minlength=5).float())
        # fanout 2: row 0 reads each of its 4 neighbours with chance 2/4; the short rows read theirs
        self.assertEqual(access_frequency(g, 2), torch.tensor([0.0, 2.5, 1.5, 0.5, 0.5]))
        sym = CSRGraph.from_edge_index(ei, 5, symmetrize=True, dedupe=True)
        self.assertEqual(access_frequency(sym), sym.degree().float())   # undirected: the degree
        mod = sys.modules["torch_direct.gnn.graph.reorder"]
        big = random_graph(300, 5000, 2)
        whole = access_frequency(big, 5)
        saved = mod._EDGE_CHUNK
        try:
            sparse = random_graph(60, 40, 5)   # runs of empty rows
            for chunk in (1, 13, 400):
                mod._EDGE_CHUNK = chunk
                self.assertEqual(access_frequency(big, 5), whole, atol=1e-4, rtol=1e-5)
                self.assertEqual(access_frequency(CSRGraph(big.rowptr, big.col.int()), 5), whole, atol=1e-4, rtol=1e-5)
                for fanout in (-1, 1):
                    want = torch.zeros(60)   # each row's neighbours, weighted min(1, fanout / its length)
                    for r in range(60):
                        nb = sparse.col[sparse.rowptr[r]:sparse.rowptr[r + 1]]
                        if nb.numel():
                            want[nb] += 1.0 if fanout < 0 else min(1.0, fanout / nb.numel())
                    self.assertEqual(access_frequency(sparse, fanout), want, atol=1e-6, rtol=1e-6)
        finally:
            mod._EDGE_CHUNK = saved
        self.assertEqual(access_frequency(big.to("unified") if torch.cuda.is_available() else big, 5), whole)
        for bad in (0, -2, 1.5, True):
            with self.assertRaisesRegex(ValueError, "fanout must be a positive int or -1"):
                access_frequency(g, bad)
        with self.assertRaisesRegex(TypeError, "CSRGraph"):
            access_frequency(ei, 2)

    def test_frequency_is_the_same_whatever_the_threads_and_chunks(self):
        # Exact integer sums: the same bits with 1, 2 or 3 threads (partial sums) and with any
        # chunking (of edges, and of nodes to convert), for int64 and int32 column ids.
        mod = sys.modules["torch_direct.gnn.graph.reorder"]
        g = varied_graph(0)
        graphs = (g, CSRGraph(g.rowptr, g.col.int()))
        pools = []

        def pool(workers):   # records how many threads (partials) a pass used
            pools.append(workers)
            return ThreadPoolExecutor(workers)

        saved = torch.get_num_threads()
        try:
            for fanout in (-1, 1, 3, 5):
                torch.set_num_threads(1)
                want = bits(access_frequency(g, fanout))
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    for chunk in (1, 5, 64, mod._EDGE_CHUNK):
                        with mock.patch.object(mod, "_EDGE_CHUNK", chunk), \
                                mock.patch.object(mod, "_ROW_CHUNK", chunk), \
                                mock.patch.object(mod, "ThreadPoolExecutor", side_effect=pool):
                            for graph in graphs:
                                got = access_frequency(graph, fanout)
                                self.assertEqual(got.dtype, torch.float32)
                                self.assertEqual(bits(got), want, atol=0, rtol=0,
                                                 msg=f"fanout {fanout}, {threads} threads, chunks of {chunk}")
        finally:
            torch.set_num_threads(saved)
        self.assertEqual(max(pools), 3)   # several partials were summed

    def test_frequency_is_the_exact_sum_rounded(self):
        # Against the exact sum (fractions): each edge's weight is low by less than 2^-40 (this
        # graph's weights add up to far less than 2^22), and the sum is rounded to float32 at the
        # end (through float64: rounding is monotone), so the result lies between the roundings
        # of the exact sum and of it less that deficit.
        g = varied_graph(1)
        n = g.num_nodes
        rowptr, col = g.rowptr.tolist(), g.col.tolist()
        reads = torch.bincount(g.col, minlength=n)
        self.assertGreater(int(reads.max()), 5)
        for fanout in (-1, 1, 2, 5):
            exact = [Fraction(0)] * n
            for r in range(n):
                a, b = rowptr[r], rowptr[r + 1]
                for c in col[a:b]:
                    exact[c] += 1 if fanout < 0 else min(Fraction(1), Fraction(fanout, b - a))
            got = access_frequency(g, fanout)
            deficit = [Fraction(int(k), 1 << 40) for k in reads]
            high = torch.tensor([float(f) for f in exact], dtype=torch.float64).float()
            low = torch.tensor([float(f - d) for f, d in zip(exact, deficit)], dtype=torch.float64).float()
            self.assertTrue(bool(((low <= got) & (got <= high)).all()),
                            msg=f"fanout {fanout}: {(got - high).abs().max()} off the exact sum")
            if fanout < 0:
                self.assertEqual(got, reads.float(), atol=0, rtol=0)   # counts

    def test_equal_frequencies_are_equal_scores(self):
        # Nodes 2k and 2k + 1 are each listed once by rows of the same lengths (six of 3 to 40),
        # rows in a shuffled order, at random places in them; the other slots hold nodes 20 and
        # up. Their frequencies are equal, so must their scores be, whatever the order of the
        # additions; then the reorder's stable sort puts 2k first.
        g_ = torch.Generator().manual_seed(3)
        n, rows = 200, []
        for k in range(10):
            for length in torch.randint(3, 41, (6,), generator=g_).tolist():
                for node in (2 * k, 2 * k + 1):
                    row = torch.randint(20, n, (length,), generator=g_)
                    row[int(torch.randint(length, (1,), generator=g_))] = node
                    rows.append(row)
        lists = [torch.zeros(0, dtype=torch.long)] * n
        for r, row in zip(torch.randperm(n, generator=g_).tolist(), rows):
            lists[r] = row
        rowptr = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(torch.tensor([len(x) for x in lists]), 0, out=rowptr[1:])
        g = CSRGraph(rowptr, torch.cat(lists))
        score = access_frequency(g, 2)
        self.assertEqual(bits(score[0:20:2]), bits(score[1:20:2]), atol=0, rtol=0)
        self.assertTrue(bool((score[:20] < 6).all()))   # some weights below 1: sums of fractions
        g2, ro = reorder(g, "frequency", fanout=2)
        self.assertTrue(bool((ro.inv[0:20:2] < ro.inv[1:20:2]).all()))
        # The relabelled graph's rows list each node at the same lengths: the same scores,
        # bit for bit, from a pass of its own as from the kept ones.
        fresh = access_frequency(CSRGraph(g2.rowptr, g2.col), 2)
        self.assertEqual(bits(fresh), bits(score[ro.perm]), atol=0, rtol=0)

    def test_cache_ranking_holds_the_rows_the_sampler_reads(self):
        # On a directed graph whose row lengths are unrelated to how popular a node is as a
        # neighbour, a cache of the longest rows holds about its own share of the reads; one
        # ranked by access frequency holds far more (what --cache-mb uses). (On a symmetric
        # graph, as the presets are, row length and popularity are the same thing.)
        n = 20_000
        g_ = torch.Generator().manual_seed(0)
        rowptr = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(torch.poisson(torch.full((n,), 10.0), generator=g_).long(), 0, out=rowptr[1:])
        popular = torch.randperm(n, generator=g_)     # neighbours skewed towards the front of this list
        col = popular[(torch.rand(int(rowptr[-1]), generator=g_).pow(3) * n).long()].int()
        rows = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
        keep = (col.long() != rows)
        g = CSRGraph.from_edge_index(torch.stack([col.long()[keep], rows[keep]]), n)
        sampler = NeighborSampler(g, [15, 10, 5], seed=0)
        seeds = torch.randperm(n, generator=g_)[:1280]
        reads = torch.zeros(g.num_nodes)
        for i in range(20):   # batches of 64: each reads a small part of the graph, as on the presets
            n_id = sampler.sample(seeds[i * 64:(i + 1) * 64]).n_id
            reads.index_add_(0, n_id, torch.ones(n_id.numel()))
        k = g.num_nodes // 5
        held = {name: float(reads[torch.topk(score.float(), k).indices].sum() / reads.sum())
                for name, score in (("degree", g.degree()), ("access", access_frequency(g, 5)))}
        self.assertLess(held["degree"], 0.3, msg=str(held))            # about its 20% share
        self.assertGreater(held["access"], 1.5 * held["degree"], msg=str(held))

    def test_dataset_follows_nodes_and_maps_back(self):
        with tempfile.TemporaryDirectory() as root:
            ds = load_dataset("tiny", root=root, show_progress=False)
            ds2, ro = reorder(ds, "degree")
            self.assertIsInstance(ds2, NodeDataset)
            v = torch.tensor([0, 5, 17, 2999])
            self.assertEqual(ds2.x[ro.to_new(v)], ds.x[v])
            self.assertEqual(ds2.y[ro.to_new(v)], ds.y[v])
            self.assertEqual(ro.to_old(ro.to_new(v)), v)
            for k in ds.split:
                self.assertEqual(ro.to_old(ds2.split[k]), ds.split[k])   # same nodes, same order
            self.assertEqual(ro.rows_to_original(ds2.x), ds.x)
            self.assertEqual(ro.rows_to_new(ds.y), ds2.y)
            # what each part took, the features' and labels' included
            self.assertEqual(set(ro.seconds), {"rank", "relabel", "rows"})
            self.assertTrue(all(v >= 0 for v in ro.seconds.values()))
            self.assertEqual(set(reorder(ds.graph, "degree")[1].seconds), {"rank", "relabel"})
            self.assertEqual(edge_set(ds2.graph, ro.perm), edge_set(ds.graph))
            # Same seeds (relabelled) -> the same sampled nodes: the sampler draws slots by position.
            seeds = ds.split["train"][:64]
            a = NeighborSampler(ds.graph, [5, 3], seed=7).sample(seeds)
            b = NeighborSampler(ds2.graph, [5, 3], seed=7).sample(ro.to_new(seeds))
            self.assertEqual(ro.to_old(b.n_id), a.n_id)
            for (ea, _, sa), (eb, _, sb) in zip(a.adjs, b.adjs):
                self.assertEqual(ea, eb)
                self.assertEqual(sa, sb)
            same, ro0 = reorder(ds, "none")
            self.assertIs(same, ds)
            self.assertEqual(ro0.perm, torch.arange(ds.num_nodes))
            # a table of more rows than a chunk is permuted a chunk at a time (with a bar): the same rows
            err = io.StringIO()
            with mock.patch.object(sys.modules["torch_direct.gnn.graph.reorder"], "_ROW_CHUNK", 7), \
                    contextlib.redirect_stderr(err):
                ds3, _ = reorder(ds, "degree", show_progress=True)
            self.assertEqual(ds3.x, ds2.x)
            self.assertIn("reorder: feature rows", err.getvalue())

    def test_bad_input(self):
        g = random_graph(5, 10, 0)
        with self.assertRaisesRegex(ValueError, "by must be one of"):
            reorder(g, "random")
        with self.assertRaisesRegex(ValueError, "not a permutation"):
            reorder(g, torch.tensor([0, 0, 1, 2, 3]))
        with self.assertRaisesRegex(ValueError, "outside"):
            reorder(g, torch.tensor([0, 1, 2, 3, 5]))
        with self.assertRaisesRegex(ValueError, "5 entries"):
            reorder(g, torch.arange(4))
        with self.assertRaisesRegex(TypeError, "NodeDataset or a CSRGraph"):
            reorder(torch.zeros(3), "degree")
        for device, msg in (("meta", "device must be the CPU or a CUDA GPU"), ("tpu", "device must be a torch.device"),
                            ("nonsense", "device must be a torch.device"), (3.5, "device must be a torch.device")):
            with self.assertRaisesRegex(ValueError, msg):
                reorder(g, "degree", device=device)
        if not torch.cuda.is_available():
            with self.assertRaisesRegex(ValueError, "device=cuda but torch sees no CUDA GPU here"):
                reorder(g, "degree", device="cuda")
        else:
            with self.assertRaisesRegex(ValueError, "this machine has"):
                reorder(g, "degree", device=f"cuda:{torch.cuda.device_count()}")
        _, ro = reorder(g, "degree", device="cpu")
        with self.assertRaisesRegex(ValueError, "expected 5 rows"):
            ro.rows_to_original(torch.zeros(4))
        self.assertEqual(relabel_graph(g, ro.perm, ro.inv).device, g.device)


class _Tiny(TinyDatasetCase):
    pass


class TestMergedGathers(_Tiny):

    def epoch(self, kind="unified", device="cpu", sampler_device=None, **kw):
        ds = self.ds
        store = make_feature_store(kind, ds.x, device)
        if sampler_device is None:
            sampler = NeighborSampler(ds.graph, [5, 3], seed=3)
        else:
            from torch_direct.gnn.graph import GPUNeighborSampler
            sampler = GPUNeighborSampler(ds.graph.to("unified"), [5, 3], seed=3, device=sampler_device)
        with PipelinedLoader(sampler, store, ds.split["train"], 200, labels=ds.y, device=device,
                             generator=torch.Generator().manual_seed(1), **kw) as loader:
            out = [(b.n_id.cpu(), b.x.cpu(), b.y.cpu(), [a[0].cpu() for a in b.adjs]) for b in loader]
            self.assertEqual(loader.stats()["batches"], len(out))
        return out

    def test_every_batch_gets_its_rows(self):
        base = self.epoch(merge_gathers=1)
        self.assertGreater(len(base), 3)
        for kind in ("unified", "cpu_centric", "gpu_resident"):
            for prefetch, merge in ((0, 3), (2, 2), (2, 100)):   # 100: the whole epoch in one gather
                got = self.epoch(kind, prefetch=prefetch, merge_gathers=merge)
                self.assertEqual(len(got), len(base))
                for (n_id, x, y, adjs), (n0, x0, y0, adjs0) in zip(got, base):
                    same = [torch.equal(n_id, n0), torch.equal(x, self.ds.x[n_id]), torch.equal(x, x0),
                            torch.equal(y, y0), len(adjs) == len(adjs0)]
                    same += [torch.equal(a, a0) for a, a0 in zip(adjs, adjs0)]
                    self.assertTrue(all(same), msg=f"{kind}, prefetch {prefetch}, merge {merge}: {same}")

    def test_bad_merge(self):
        store = make_feature_store("unified", self.ds.x, "cpu")
        for bad in (0, -1, True, 1.5):
            with self.assertRaisesRegex(ValueError, "merge_gathers"):
                PipelinedLoader(NeighborSampler(self.ds.graph, [2]), store, self.ds.split["train"], 10,
                                merge_gathers=bad)

    @requires_gpu
    def test_merged_gathers_on_the_gpu(self):
        base = self.epoch("unified", "cuda", "cuda")
        got = self.epoch("unified", "cuda", "cuda", merge_gathers=3)
        for (n_id, x, *_), (n0, x0, *_) in zip(got, base):
            self.assertEqual(n_id, n0)
            self.assertEqual(x, self.ds.x[n_id], atol=0, rtol=0)


FAST = ["--threads", "1", "--layers", "builtin", "--hidden", "32", "--batch-size", "256", "--no-progress",
        "--fanouts", "5,3", "--eval-fanouts", "5,3", "--epochs", "2"]


class TestAblation(_Tiny):
    def bench(self, *extra):
        from torch_direct.gnn.bench.__main__ import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(["train-ablation", "--root", self.tmp.name, *FAST, *extra])
            except SystemExit as e:
                rc = e.code
        return rc, out.getvalue(), err.getvalue()

    def test_record_has_every_row_and_levers_keep_the_batches(self):
        # On the CPU (exact arithmetic order), where the GPU cache cannot apply.
        path = os.path.join(self.tmp.name, "ablation.json")
        rc, out, err = self.bench("--out", path, "--device", "cpu")
        self.assertEqual(rc, 0, err)
        rec = json.load(open(path))
        self.assertEqual(rec["benchmark"], "train-ablation")
        rows = {r["config"]: r for r in rec["rows"]}
        self.assertEqual(list(rows), ["baseline", "reorder", "merge", "cache", "graph", "all"])
        base = rows["baseline"]
        self.assertEqual((base["reorder"], base["merge_gathers"], base["cache_mb"], base["graph"]),
                         ("none", 1, 0, "cpu"))
        self.assertEqual(rows["reorder"]["reorder"], "frequency")
        self.assertEqual(rows["merge"]["merge_gathers"], 2)
        self.assertEqual(rows["all"]["reorder"], "frequency")
        self.assertIn("no GPU", rows["cache"]["note"])   # --device cpu: the cache cannot apply
        self.assertIn("no GPU", rows["graph"]["note"])   # nor the GPU copy of the CSR
        self.assertEqual(rows["graph"]["graph"], "cpu")  # the CPU sampler reads the host CSR
        for r in rec["rows"]:
            self.assertGreater(r["epoch_s"], 0)
            self.assertEqual(len(r["epoch_times_s"]), 2)
            self.assertIsNotNone(r["speedup"])
            # Same batches and features: the same losses and accuracies as the baseline, exactly.
            self.assertEqual(r["losses"], base["losses"], msg=r["config"])
            self.assertEqual(r["train_acc"], base["train_acc"], msg=r["config"])
            self.assertEqual(r["test_acc"], base["test_acc"], msg=r["config"])
            self.assertIn(f"| {r['config']} |", out)
        self.assertEqual(rows["baseline"]["speedup"], 1.0)

    @requires_gpu
    def test_cache_applies_on_the_gpu(self):
        path = os.path.join(self.tmp.name, "ablation_gpu.json")
        rc, out, err = self.bench("--out", path, "--device", "cuda", "--configs", "baseline,cache",
                                  "--cache-mb", "1")
        self.assertEqual(rc, 0, err)
        rows = {r["config"]: r for r in json.load(open(path))["rows"]}
        self.assertEqual(rows["cache"]["note"], "")
        self.assertEqual(rows["cache"]["cache_mb"], 1)
        self.assertGreater(rows["cache"]["feature_store"]["cache_rows"], 0)
        self.assertGreater(rows["cache"]["feature_store"]["cache_hit_rate"], 0.0)
        self.assertEqual(rows["baseline"]["feature_store"]["cache_rows"], 0)

    def test_train_with_reorder_and_full_inference(self):
        from argparse import ArgumentParser
        from torch_direct.gnn.pipeline import train
        p = ArgumentParser()
        train.add_arguments(p)
        recs = {}
        for opt in ("none", "degree"):
            args = p.parse_args(["--root", self.tmp.name, *FAST, "--full-eval", "--reorder", opt,
                                 "--merge-gathers"])
            with contextlib.redirect_stdout(io.StringIO()):
                recs[opt] = train.run(args)
        a, b = recs["none"], recs["degree"]
        self.assertEqual(b["reorder"], "degree")
        self.assertEqual([e["loss"] for e in a["epochs"]], [e["loss"] for e in b["epochs"]])
        self.assertEqual(a["test_acc"], b["test_acc"])
        # Layer-wise inference visits nodes in id order: the same logits up to float rounding.
        self.assertLessEqual(abs(a["test_acc_full"] - b["test_acc_full"]), 2 / 900)

    @requires_gpu
    def test_nodes_sorted_on_the_gpu_take_the_cpus_order(self):
        # a stable sort of the same scores: the same permutation, ties included, wherever it runs
        g = random_graph(3000, 20000, 5)
        for by, fanout in (("frequency", 3), ("frequency", -1), ("degree", -1)):
            cpu_graph, cpu = reorder(g, by, fanout=fanout)
            gpu_graph, gpu = reorder(g, by, fanout=fanout, device="cuda")
            self.assertEqual(gpu.perm, cpu.perm, msg=by)
            self.assertEqual(gpu.perm.device.type, "cpu")
            self.assertEqual(gpu_graph.col, cpu_graph.col)

    @requires_gpu
    def test_a_frequency_reorder_and_the_cache_rank_the_rows_once(self):
        # the cache ranks the reordered graph's rows by the score the reorder already computed
        from argparse import ArgumentParser
        from torch_direct.gnn.pipeline import train
        mod = sys.modules["torch_direct.gnn.graph.reorder"]
        p = ArgumentParser()
        train.add_arguments(p)
        args = p.parse_args(["--root", self.tmp.name, *FAST, "--device", "cuda", "--reorder", "frequency",
                             "--cache-mb", "1"])
        with mock.patch.object(mod, "_frequency_pass", wraps=mod._frequency_pass) as passes, \
                contextlib.redirect_stdout(io.StringIO()):
            rec = train.run(args)
        self.assertEqual(passes.call_count, 1)
        self.assertGreater(rec["feature_store"]["cache_rows"], 0)

    @requires_gpu
    def test_ablation_on_the_gpu_uses_the_cache(self):
        path = os.path.join(self.tmp.name, "gpu.json")
        rc, _, err = self.bench("--device", "cuda", "--cache-mb", "1", "--out", path)
        self.assertEqual(rc, 0, err)
        rows = {r["config"]: r for r in json.load(open(path))["rows"]}
        self.assertEqual(len(rows), 6)
        self.assertEqual(rows["baseline"]["graph"], "unified")  # the GPU sampler reads host memory
        for name in ("graph", "all"):
            self.assertEqual(rows[name]["graph"], "cuda")
            self.assertEqual(rows[name]["losses"][0], rows["baseline"]["losses"][0], atol=1e-4, rtol=1e-4)
        for name in ("cache", "all"):
            self.assertEqual(rows[name]["note"], "")
            self.assertEqual(rows[name]["cache_mb"], 1)
            self.assertGreater(rows[name]["feature_store"]["cache_rows"], 0)
            self.assertGreater(rows[name]["feature_store"]["cache_hit_rate"], 0)

    def test_subset_and_bad_options(self):
        path = os.path.join(self.tmp.name, "sub.json")
        rc, _, err = self.bench("--configs", "baseline,merge", "--merge-gathers", "3", "--epochs", "1",
                                "--out", path)
        self.assertEqual(rc, 0, err)
        rows = json.load(open(path))["rows"]
        self.assertEqual([(r["config"], r["merge_gathers"]) for r in rows], [("baseline", 1), ("merge", 3)])
        rc, _, err = self.bench("--configs", "baseline,turbo")
        self.assertEqual(rc, 2)
        self.assertIn("unknown ['turbo']", err)
        rc, _, err = self.bench("--reorder", "none")
        self.assertEqual(rc, 2)
        self.assertIn("nothing to ablate", err)
        rc, _, err = self.bench("--plot", os.path.join(self.tmp.name, "a.svg"))
        self.assertEqual(rc, 2)
        self.assertIn("draws no plot", err)
        rc, _, err = self.bench("--merge-gathers", "0")
        self.assertEqual(rc, 2)
        self.assertIn("must be positive", err)


if __name__ == "__main__":
    run_tests()
