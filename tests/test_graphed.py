"""The CUDA-graphed training step: padding that changes nothing, capacities, and the runs."""

import contextlib
import copy
import io
import tempfile
import unittest

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import requires_gpu
from torch_direct.gnn.graph import NeighborSampler, load_dataset
from torch_direct.gnn.pipeline import PipelinedLoader, make_feature_store
from torch_direct.gnn.pipeline import _aggregate
from torch_direct.gnn.pipeline.graphed import GraphedStep, PaddedBatch, StepTally, auto_margins, batch_sizes, eager_step
from torch_direct.gnn.pipeline.models import GNN, have_pyg, make_optimizer
from torch_direct.gnn.pipeline.timing import Timer


class _Tiny(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ds = load_dataset("tiny", root=cls.tmp.name, show_progress=False)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def batches(self, n, batch_size=64, device="cpu"):
        ds = self.ds
        store = make_feature_store("unified", ds.x, device)
        labels = ds.y.to(device)
        with PipelinedLoader(NeighborSampler(ds.graph, [5, 3], seed=0), store, ds.split["train"], batch_size,
                             labels=labels, device=device, prefetch=0) as loader:
            out = []
            for b in loader:
                out.append(b)
                if len(out) == n:
                    break
        return out


class TestPadding(_Tiny):
    def padded(self, b, src_extra=7, edge_extra=11, seeds_extra=3, index_dtype=None):
        """Buffers for ``b`` with room to spare: ``src_extra`` more source rows a block (one is
        the padding target row the next block's targets need), ``edge_extra`` more edges."""
        sizes = batch_sizes(b)
        seeds = b.batch_size + seeds_extra
        caps, targets = [], seeds
        for s in reversed(sizes):
            sources = max(s[0] + src_extra, targets)
            caps.append((sources, targets, s[2] + edge_extra))
            targets = sources
        return PaddedBatch(list(reversed(caps)), seeds, b.x.shape[1], b.x.dtype, index_dtype or b.adjs[0][0].dtype,
                           b.x.device)

    def check_same(self, model_name, use_pyg):
        # The logits of the batch's seeds, the loss and every gradient are those of the batch alone.
        b = self.batches(1)[0]
        torch.manual_seed(0)
        model = GNN(model_name, self.ds.num_features, 16, self.ds.num_classes, 2, dropout=0.0, use_pyg=use_pyg)
        out = model(b.x, b.adjs)[:b.batch_size]
        loss = F.cross_entropy(out, b.y, ignore_index=-1)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        buf = self.padded(b)
        self.assertTrue(buf.fits(b))
        buf.fill(b)
        out_p = model(buf.x, buf.adjs)[:buf.seeds]
        loss_p = F.cross_entropy(out_p, buf.y, ignore_index=-1)
        grads_p = torch.autograd.grad(loss_p, list(model.parameters()))
        self.assertEqual(out_p[:b.batch_size], out)
        self.assertEqual(loss_p, loss)
        for g, gp in zip(grads, grads_p):
            self.assertEqual(gp, g)

    def test_builtin_sage(self):
        self.check_same("sage", False)

    @unittest.skipUnless(have_pyg(), "torch_geometric is not installed")
    def test_pyg_layers(self):
        for model in ("sage", "gat", "gin"):
            with self.subTest(model=model):
                self.check_same(model, True)

    def test_fill_resets_the_padding_and_fits_checks_every_size(self):
        big, small = sorted(self.batches(2, batch_size=48), key=lambda b: -b.x.shape[0])[:2]
        buf = self.padded(big)
        buf.fill(big)
        buf.fill(small)
        n, caps = small.x.shape[0], buf.caps
        self.assertEqual(buf.x[:n], small.x)
        self.assertEqual(buf.x[n:], torch.zeros_like(buf.x[n:]))
        for (ei, _, size), e, c in zip(small.adjs, buf.edges, caps):
            k, pad = ei.shape[1], c[2] - ei.shape[1]
            self.assertEqual(e[:, :k], ei)
            self.assertGreater(pad, 0)
            # padding edges end at padding target rows, spread over them (no row takes more than
            # its share: a scatter's atomics would queue on it) in runs, as a sampler groups its
            # edges by target, and spread over the sources
            targets = e[1, k:]
            self.assertTrue(bool((targets[1:] <= targets[:-1]).all()))
            self.assertTrue(bool(((targets >= size[1]) & (targets < c[1])).all()))
            self.assertEqual(int(targets.max()), c[1] - 1)
            spare = c[1] - size[1]
            self.assertLessEqual(int(torch.bincount(targets).max()), -(-pad // spare))
            self.assertEqual(e[0, k:], torch.arange(k, c[2]) % c[0])
        self.assertEqual(buf.y[:small.batch_size], small.y)
        self.assertTrue(bool((buf.y[small.batch_size:] == -1).all()))
        self.assertTrue(self.padded(big, src_extra=1, edge_extra=0, seeds_extra=1).fits(big))   # just room
        self.assertFalse(self.padded(big, src_extra=1, edge_extra=-1, seeds_extra=1).fits(big))  # an edge short
        self.assertFalse(self.padded(big, src_extra=0, edge_extra=0, seeds_extra=1).fits(big))   # no padding row
        self.assertFalse(self.padded(big, seeds_extra=0).fits(big))                               # no padding seed

    def check_fills_agree(self, device):
        # one C++ call (the default: on a GPU one kernel for the edges and labels; aten: ATen ops)
        # against the ops one Python call at a time, over buffers that held a larger batch first,
        # at every pair of buffer and batch index widths, the batch's edges contiguous or not
        big, small = sorted(self.batches(2, batch_size=48, device=device), key=lambda b: -b.x.shape[0])[:2]
        for buf_dtype in (torch.long, torch.int32):
            for dtype in (torch.long, torch.int32):
                for strided in (False, True):
                    with self.subTest(buffer=buf_dtype, index=dtype, strided=strided):
                        def cast(b):
                            b2 = copy.copy(b)
                            b2.adjs = [((ei.to(dtype).t().contiguous().t() if strided else ei.to(dtype)), eid, size)
                                       for ei, eid, size in b.adjs]
                            return b2
                        filled = []
                        for host in ("fused", "aten", "python"):
                            with torch_direct.experimental(step_host=host):
                                buf = self.padded(cast(big), edge_extra=23, index_dtype=buf_dtype)
                            self.assertEqual((buf.fused, buf.kernel), (host != "python", host == "fused"))
                            self.assertFalse(buf.waits_in_call)
                            buf.fill(cast(big))
                            timed = buf.fill(cast(small))
                            if host != "python":   # the call's own wall and CPU seconds, timed inside it
                                self.assertEqual(len(timed), 2)
                                self.assertTrue(all(isinstance(v, float) and 0 <= v < 60 for v in timed), timed)
                                self.assertGreater(timed[0], 0)
                            else:
                                self.assertIsNone(timed)
                            filled.append(buf)
                        for other in filled[1:]:
                            self.assertEqual(filled[0].x, other.x, atol=0, rtol=0)
                            self.assertEqual(filled[0].y, other.y, atol=0, rtol=0)
                            for e_f, e_p in zip(filled[0].edges, other.edges):
                                self.assertEqual(e_f.dtype, buf_dtype)
                                self.assertEqual(e_f, e_p, atol=0, rtol=0)

    def test_fused_fill_writes_what_the_python_ops_write(self):
        self.check_fills_agree("cpu")

    @requires_gpu
    def test_fused_fill_writes_what_the_python_ops_write_on_the_gpu(self):
        self.check_fills_agree("cuda")

    def check_refusal_writes_nothing(self, device):
        big, small = sorted(self.batches(2, batch_size=48, device=device), key=lambda b: -b.x.shape[0])[:2]
        buf = self.padded(small)
        buf.fill(small)
        before = [buf.x.clone(), buf.y.clone()] + [e.clone() for e in buf.edges]
        self.assertFalse(buf.fits(big))
        with self.assertRaisesRegex(RuntimeError, "PaddedBuffers.fill: .*do not fit"):
            buf.fill(big)
        # a block whose targets leave no padding row, after blocks that would fit
        adjs = [(ei, eid, size) for ei, eid, size in small.adjs]
        ei, eid, size = adjs[-1]
        with self.assertRaisesRegex(RuntimeError, "leaves no padding row"):
            buf.native.fill(small.x, [a[0] for a in adjs], [int(a[2][1]) for a in adjs[:-1]] + [buf.caps[-1][1]],
                            small.y, True)
        with self.assertRaisesRegex(RuntimeError, "one entry per block"):
            buf.native.fill(small.x, [a[0] for a in adjs[:-1]], [1] * len(adjs), small.y, True)
        after = [buf.x, buf.y] + list(buf.edges)
        for a, b in zip(after, before):
            self.assertEqual(a, b, atol=0, rtol=0)

    def test_fused_fill_refuses_a_batch_that_does_not_fit_before_writing(self):
        self.check_refusal_writes_nothing("cpu")

    @requires_gpu
    def test_fused_fill_refuses_a_batch_that_does_not_fit_before_writing_on_the_gpu(self):
        self.check_refusal_writes_nothing("cuda")

    def test_the_native_buffers_refuse_inconsistent_buffers(self):
        x, y = torch.zeros(10, 4), torch.full((3,), -1)
        ramp = torch.arange(6)
        edges = torch.zeros(2, 6, dtype=torch.long)
        native = _aggregate.PaddedBuffers(x, [edges], [ramp], [ramp % 10], [3], y)   # consistent: taken
        self.assertIsNotNone(native)
        with self.assertRaisesRegex(RuntimeError, "PaddedBuffers: one entry per block in each list"):
            _aggregate.PaddedBuffers(x, [edges, edges], [ramp], [ramp % 10], [3], y)
        with self.assertRaisesRegex(RuntimeError, r"block 0's edge buffer must be \[2, capacity\]"):
            _aggregate.PaddedBuffers(x, [torch.zeros(3, 6, dtype=torch.long)], [ramp], [ramp % 10], [3], y)
        with self.assertRaisesRegex(RuntimeError, "must have the buffer's 6 entries"):
            _aggregate.PaddedBuffers(x, [edges], [ramp[:5]], [ramp % 10], [3], y)
        with self.assertRaisesRegex(RuntimeError, "target capacity must be positive"):
            _aggregate.PaddedBuffers(x, [edges], [ramp], [ramp % 10], [0], y)
        with self.assertRaisesRegex(RuntimeError, "feature buffer must be 2-D"):
            _aggregate.PaddedBuffers(x[0], [edges], [ramp], [ramp % 10], [3], y)

    def test_mismatched_capacities_are_refused(self):
        with self.assertRaisesRegex(ValueError, "targets but block 1"):
            PaddedBatch([(10, 5, 3), (6, 2, 3)], 2, 4, torch.float32, torch.long, "cpu")
        with self.assertRaisesRegex(ValueError, "labels"):
            PaddedBatch([(10, 5, 3), (5, 2, 3)], 3, 4, torch.float32, torch.long, "cpu")


class TestStepTally(TestCase):
    def test_fused_tally_sums_what_the_python_ops_sum(self):
        g = torch.Generator().manual_seed(0)
        steps = [(torch.rand((), generator=g), torch.randn(n, 5, generator=g), torch.randint(-1, 5, (n,), generator=g))
                 for n in (7, 16, 3)]
        tallies = []
        for host in ("fused", "python"):
            with torch_direct.experimental(step_host=host):
                t = StepTally("cpu")
            self.assertEqual(t.fused, host == "fused")
            for loss, logits, y in steps:
                t.add(loss, logits, y, y.shape[0])
            tallies.append(t)
        fused, python = tallies
        self.assertEqual(fused.loss, python.loss, atol=0, rtol=0)
        self.assertEqual(fused.correct, python.correct, atol=0, rtol=0)
        by_hand = sum(int(((lg.argmax(1) == y) & (y >= 0)).sum()) for _, lg, y in steps)
        self.assertEqual(int(fused.correct), by_hand)
        self.assertAlmostEqual(float(fused.loss), sum(float(l) * y.shape[0] for l, _, y in steps), places=5)

    def test_fused_tally_refuses_logits_without_a_row_per_label(self):
        t = StepTally("cpu")
        with self.assertRaisesRegex(RuntimeError, "one row per label"):
            t.add(torch.tensor(1.0), torch.randn(4, 3), torch.zeros(5, dtype=torch.long), 5)
        self.assertEqual(int(t.correct), 0)
        self.assertEqual(float(t.loss), 0.0)

    def test_a_bad_setting_is_refused(self):
        with torch_direct.experimental(step_host="cpp"), self.assertRaisesRegex(ValueError, "step_host must be fused, fused_waits, aten or python, not 'cpp'"):
            StepTally("cpu")


class TestGraphedStep(_Tiny):
    def test_capacities(self):
        step = GraphedStep(None, None, 64, warmup=2, margin=0.1)
        step.seen = [((400, 120, 900), (120, 60, 300)), ((380, 130, 1000), (130, 64, 320))]
        caps = step.capacities()
        self.assertEqual(caps[1][1], 65)                 # the seeds plus a padding row
        self.assertEqual(caps[0][1], caps[1][0])         # block 0's targets are block 1's sources
        self.assertGreater(caps[1][0], 130)
        self.assertEqual(caps[0][0], int(400 * 1.1) + 1)
        self.assertEqual((caps[0][2], caps[1][2]), (int(1000 * 1.1) + 1, int(320 * 1.1) + 1))
        for c in caps:
            self.assertGreaterEqual(c[0], c[1])
        self.assertEqual(step.margin_used, [[0.1] * 3] * 2)
        # margin 0: the largest seen, plus a padding row where one is needed
        tight = GraphedStep(None, None, 64, warmup=2, margin=0.0)
        tight.seen = step.seen
        self.assertEqual(tight.capacities(), [(401, 131, 1001), (131, 65, 321)])
        with self.assertRaisesRegex(ValueError, "warmup"):
            GraphedStep(None, None, 64, warmup=0)
        for bad in (-1, "tight", float("nan")):
            with self.assertRaisesRegex(ValueError, "margin must be 'auto' or a number >= 0"):
                GraphedStep(None, None, 64, margin=bad)
        with self.assertRaisesRegex(ValueError, "buffers must be 1 or 2, got 3"):
            GraphedStep(None, None, 64, buffers=3)

    def test_auto_margins_follow_each_sizes_spread(self):
        # each size of each block: four times its relative spread over the warm-up batches,
        # from 0.02 to 0.1
        even = [((1000, 200, 3000), (200, 65, 600))] * 3
        self.assertEqual(auto_margins(even), [[0.02] * 3] * 2)            # one size: the floor
        seen = [((1000, 200, 3000), (200, 65, 600)), ((995, 190, 2400), (190, 65, 594))]
        m = auto_margins(seen)
        self.assertAlmostEqual(m[0][0], 0.02)     # sources 0.5% apart: 4 x 0.005
        self.assertAlmostEqual(m[0][1], 0.1)      # 5% apart: 0.2, capped
        self.assertAlmostEqual(m[0][2], 0.1)      # 20% apart: capped
        self.assertAlmostEqual(m[1][0], 0.1)
        self.assertEqual(m[1][1], 0.02)           # the seeds: one size
        self.assertAlmostEqual(m[1][2], 0.04)     # 1% apart
        step = GraphedStep(None, None, 64, warmup=2)                      # auto unless given
        self.assertEqual(step.margin, "auto")
        step.seen = seen
        caps = step.capacities()
        self.assertEqual(step.margin_used, m)
        self.assertEqual(caps[1], (int(200 * (1 + m[1][0])) + 1, 65, int(600 * (1 + m[1][2])) + 1))
        self.assertEqual(caps[0], (int(1000 * (1 + m[0][0])) + 1, caps[1][0], int(3000 * (1 + m[0][2])) + 1))

    def test_on_the_cpu_every_step_is_eager_and_the_same(self):
        batches = self.batches(5)
        runs = []
        for graphed in (False, True):
            torch.manual_seed(0)
            model = GNN("sage", self.ds.num_features, 16, self.ds.num_classes, 2, dropout=0.0, use_pyg=False)
            opt = make_optimizer(model, 1e-2)
            step = GraphedStep(model, opt, 64, warmup=2) if graphed else (lambda b: eager_step(model, opt, b))
            runs.append([float(step(b)[0].detach()) for b in batches])
            if graphed:
                self.assertEqual(step.stats()["replays"], 0)
                self.assertEqual(step.stats()["eager_steps"], 5)
                self.assertIsNone(step.stats()["host_parts"])   # nothing replayed: no parts to report
                self.assertIn("no CUDA graph on the CPU", step.note)
        self.assertEqual(runs[0], runs[1])

    def test_no_autograd_graph_outlives_its_step(self):
        # A graph kept alive by a step's outputs would keep the parameters' AccumulateGrad
        # nodes, made on the eager step's stream, into a later capture.
        torch.manual_seed(0)
        model = GNN("sage", self.ds.num_features, 16, self.ds.num_classes, 2, dropout=0.0, use_pyg=False)
        opt = make_optimizer(model, 1e-2)
        step = GraphedStep(model, opt, 64, warmup=2)
        for b in self.batches(3):
            for t in (*eager_step(model, opt, b), *step(b)):
                self.assertIsNone(t.grad_fn)
                self.assertFalse(t.requires_grad)

    @requires_gpu
    def test_two_buffer_sets_step_as_one(self):
        # The copies on the fill stream wait for the batch's ready event (the loader's), or, for a
        # batch without one, for the training stream; either way every loss is the one-set run's.
        batches = self.batches(12, device="cuda")
        self.assertTrue(all(isinstance(b.ready, torch.cuda.Event) for b in batches))
        runs = {}
        # (two sets: the copy's kernel and the waits from Python by default, the waits in the copy's
        # call with fused_waits, the ATen ops with aten)
        hosts = ((1, True, "fused"), (2, True, "fused"), (2, True, "fused_waits"), (2, True, "aten"),
                 (2, False, "fused"), (2, False, "fused_waits"))
        for buffers, events, host in hosts:
            if not events:
                for b in batches:
                    b.ready = None
            torch.manual_seed(0)
            model = GNN("sage", self.ds.num_features, 16, self.ds.num_classes, 2, dropout=0.0,
                        use_pyg=False).cuda()
            opt = make_optimizer(model, 1e-2, capturable=True)
            step = GraphedStep(model, opt, 64, warmup=2, buffers=buffers)
            step.timer = Timer(True)
            with torch_direct.experimental(step_host=host):
                runs[buffers, events, host] = [float(step(b)[0]) for b in batches]
            self.assertEqual((step.bufs[0].kernel, step.bufs[0].waits_in_call),
                             (host != "aten", host == "fused_waits"))
            st = step.stats()
            # with two sets, each replay times the training stream's wait for its batch's copy
            waits = [e for e in step.timer.events if e[0] == "copy_wait"]
            self.assertEqual(len(waits), st["replays"] if buffers == 2 else 0)
            self.assertGreaterEqual(step.timer.totals().get("copy_wait", 0.0), 0.0)
            self.assertEqual(st["note"], "")
            self.assertEqual(st["buffers"], buffers)
            self.assertGreater(st["replays"], st["eager_steps"])
            # the fill: each replayed batch's sources and edges over the capacities, averaged
            replayed = [batch_sizes(b) for b in batches[2:] if step.bufs[0].fits(b)]
            self.assertEqual(len(replayed), st["replays"])
            for i, (fill, cap) in enumerate(zip(st["fill"], st["capacities"])):
                want = [sum(s[i][0] for s in replayed) / (cap[0] * len(replayed)),
                        sum(s[i][2] for s in replayed) / (cap[2] * len(replayed))]
                self.assertEqual(fill, [round(w, 4) for w in want])
                self.assertTrue(all(0 < f <= 1 for f in fill))
            # the host side of the replayed steps, by part: every part of this set-up was timed
            timed = ("fits", "fill", "fill_inside", "replay") + (("record",) if buffers == 2 else ())
            for part, t in st["host_parts"].items():
                self.assertEqual(t["wall_s"] > 0, part in timed, part)
                self.assertGreaterEqual(t["cpu_s"], 0.0)
        for key in hosts[1:]:
            self.assertEqual(runs[key], runs[1, True, "fused"], atol=1e-4, rtol=1e-4, msg=str(key))  # atomics: sums in any order


class TestOption(_Tiny):
    def run_train(self, *argv):
        from torch_direct.__main__ import main
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(["train", "--root", self.tmp.name, "--no-progress", "--epochs", "1", *argv])
            except SystemExit as e:   # argparse's refusal of an option
                code = e.code
        return code, err.getvalue()

    def test_refused_where_it_cannot_run(self):
        for argv in (["--cuda-graph"], ["--cuda-graph", "2"]):
            code, err = self.run_train(*argv, "--device", "cpu")
            self.assertEqual(code, 2, msg=argv)
            self.assertIn("--cuda-graph needs a CUDA device", err)
        code, err = self.run_train("--cuda-graph", "3", "--device", "cpu")
        self.assertEqual(code, 2)
        self.assertIn("argument --cuda-graph: invalid choice: 3", err)
        code, err = self.run_train("--cuda-graph-margin", "0.05", "--device", "cpu")
        self.assertEqual(code, 2)
        self.assertIn("--cuda-graph-margin applies to the captured step: add --cuda-graph", err)
        for bad in ("1.5", "tight"):
            code, err = self.run_train("--cuda-graph", "--cuda-graph-margin", bad, "--device", "cpu")
            self.assertEqual(code, 2)
            self.assertIn(f"argument --cuda-graph-margin: expected auto or a number from 0 to 1, got '{bad}'", err)

    @requires_gpu
    def test_graphed_training_matches_eager(self):
        # Dropout off: the graphed run's losses are the eager run's to float rounding, and the
        # graph is replayed for most batches; under bfloat16 autocast too (the weights cast
        # inside the graph at each replay, not taken from a cache filled before the capture).
        from torch_direct.gnn.pipeline import train
        from argparse import ArgumentParser
        recs = {}
        # --cuda-graph 2: two sets of buffers and graphs used in turn, each batch copied in on a
        # stream of its own beside the other set's replay (the loader's batches carry their event).
        runs = [("builtin", "fp32", 1e-3), ("builtin", "bf16", 1e-2)] + ([("pyg", "fp32", 1e-3)] if have_pyg() else [])
        for layers, precision, tol in runs:
            for graphed in (False, True, 2):
                p = ArgumentParser()
                train.add_arguments(p)
                args = p.parse_args(["--root", self.tmp.name, "--no-progress", "--epochs", "3", "--dropout", "0",
                                     "--layers", layers, "--batch-size", "64", "--device", "cuda",
                                     "--precision", precision]
                                    + (["--cuda-graph"] if graphed is True else ["--cuda-graph", "2"] if graphed else []))
                with contextlib.redirect_stdout(io.StringIO()):
                    recs[layers, graphed] = train.run(args)
            for graphed, buffers in ((True, 1), (2, 2)):
                g = recs[layers, graphed]["cuda_graph"]
                what = f"{layers} {precision}, {buffers} buffer set(s)"
                self.assertEqual(g["note"], "", msg=what)
                self.assertEqual(g["buffers"], buffers, msg=what)
                self.assertGreater(g["replays"], g["eager_steps"], msg=what)
                losses = [(e0["loss"], e1["loss"]) for e0, e1 in zip(recs[layers, False]["epochs"],
                                                                     recs[layers, graphed]["epochs"])]
                for l0, l1 in losses:
                    self.assertEqual(l1, l0, atol=tol, rtol=tol, msg=what)
                self.assertLess(losses[-1][1], losses[0][1], msg=what)   # it learns: the weights move each replay


if __name__ == "__main__":
    run_tests()
