"""torch_direct.gather: values, casts, index forms, out buffers, bounds."""

import os
import re
import unittest
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import extension_only, fp8_reference, requires_gpu


class GatherChecks:
    device = "cpu"

    def idx(self, values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def test_values_for_table_dtypes(self):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8):
            src = (torch.randn(50, 7) * 10).to(dtype)
            u = src.to("unified")
            i = self.idx([3, 0, 49, 3, 17])
            y = torch_direct.gather(u, i)
            self.assertEqual(y.device.type, self.device)
            self.assertEqual(y.cpu(), src[i.cpu()])

    def test_index_bounds_given_by_the_caller(self):
        # Bounds the caller states (an index it made itself) give the same rows; bad bounds are
        # refused before anything is written, and on the CPU every index is still checked.
        src = torch.randn(60, 9)
        u = src.to("unified")
        i = self.idx([5, 0, 59, 5, 31])
        for bounds in ((0, 59), [0, 59], (5, 59)):
            self.assertEqual(torch_direct.gather(u, i, index_bounds=bounds).cpu(), src[i.cpu()])
        self.assertEqual(torch_direct.gather(u, i, dtype=torch.float16, index_bounds=(0, 59)).cpu(),
                         src[i.cpu()].half())
        q, scale = torch_direct.quantize_rows_fp8(src, compute="cpu")
        got = torch_direct.gather(q.to("unified"), i, scale=scale.to("unified"), index_bounds=(0, 59))
        self.assertEqual(got.cpu(), fp8_reference(q, scale, i.cpu()), atol=0, rtol=0)
        out = torch.full((5, 9), 7.0, device=self.device)
        for bad, err, msg in (((-1, 3), ValueError, r"0 <= lo <= hi, got \(-1, 3\)"),
                              ((4, 3), ValueError, r"0 <= lo <= hi, got \(4, 3\)"),
                              ((0, 60), IndexError, "hi 60 is out of bounds for a table of 60 rows"),
                              ((0,), TypeError, "a pair of ints"), ((0.0, 3), TypeError, "a pair of ints"),
                              ((True, 3), TypeError, "a pair of ints")):
            with self.subTest(bounds=bad), self.assertRaisesRegex(err, msg):
                torch_direct.gather(u, i, out=out, index_bounds=bad)
            self.assertTrue(bool((out == 7).all()))
        if self.device == "cpu":
            with self.assertRaisesRegex(IndexError, "out of bounds"):
                torch_direct.gather(u, self.idx([3, 60]), index_bounds=(0, 59))

    def test_fused_cast(self):
        src = torch.randn(40, 5).half()
        u = src.to("unified")
        i = self.idx([1, 39, 2])
        y = torch_direct.gather(u, i, dtype=torch.float32)
        self.assertEqual(y.dtype, torch.float32)
        self.assertEqual(y.cpu(), src[i.cpu()].float())

    def test_index_forms(self):
        src = torch.randn(30, 4)
        u = src.to("unified")
        i32 = self.idx([5, -1, -30], dtype=torch.int32)
        self.assertEqual(torch_direct.gather(u, i32).cpu(), src[i32.cpu().long()])
        nc = self.idx(list(range(20)))[::3]
        self.assertFalse(nc.is_contiguous())
        self.assertEqual(torch_direct.gather(u, nc).cpu(), src[nc.cpu()])
        two_d = self.idx([[1, 2], [3, 4]])
        self.assertEqual(torch_direct.gather(u, two_d).shape, (2, 2, 4))
        self.assertEqual(torch_direct.gather(u, two_d).cpu(), src[two_d.cpu()])
        empty = self.idx([])
        self.assertEqual(torch_direct.gather(u, empty).shape, (0, 4))
        one_d = torch.arange(10.0).to("unified")
        self.assertEqual(torch_direct.gather(one_d, self.idx([9, 0])).cpu(), torch.tensor([9.0, 0.0]))

    def test_out_buffer_is_reused(self):
        src = torch.randn(20, 3)
        u = src.to("unified")
        out = torch.empty(4, 3, device=self.device)
        ptr = out.data_ptr()
        r = torch_direct.gather(u, self.idx([0, 1, 2, 19]), out=out)
        self.assertIs(r, out)
        self.assertEqual(out.data_ptr(), ptr)
        self.assertEqual(out.cpu(), src[[0, 1, 2, 19]])
        with self.assertRaisesRegex(ValueError, "shape"):
            torch_direct.gather(u, self.idx([0, 1]), out=out)
        with self.assertRaisesRegex(ValueError, "dtype"):
            torch_direct.gather(u, self.idx([0, 1, 2, 3]), dtype=torch.float16, out=out)

    def test_bad_input(self):
        src = torch.randn(10, 2)
        u = src.to("unified")
        with self.assertRaisesRegex(IndexError, "10"):
            torch_direct.gather(u, self.idx([0, 10]))
        with self.assertRaisesRegex(IndexError, "-11"):
            torch_direct.gather(u, self.idx([-11]))
        with self.assertRaisesRegex(TypeError, "int32 or int64"):
            torch_direct.gather(u, torch.tensor([1.0], device=self.device))
        with self.assertRaisesRegex(TypeError, "tensors"):
            torch_direct.gather(u, [1, 2])
        self.assertEqual(u.cpu(), src)  # nothing changed
        self.assertEqual(torch_direct.gather(u, self.idx([9])).cpu(), src[[9]])


    def test_fp8_rows_with_scales(self):
        # quantize_rows_fp8 then a scaled gather: x[i] to e4m3's precision, as float32 by
        # default or the dtype asked, the same on either device; zero rows stay zero.
        x = torch.randn(300, 19) * torch.rand(300, 1) * 1000
        x[4] = 0
        q, scale = torch_direct.quantize_rows_fp8(x, device="unified")
        self.assertEqual((q.dtype, q.device.type, scale.dtype, scale.shape), (torch.float8_e4m3fn, "unified",
                                                                            torch.float32, (300,)))
        i = self.idx([4, 0, 299, 4, -1, 150])
        want = fp8_reference(q.cpu(), scale.cpu(), i.cpu())
        y = torch_direct.gather(q, i, scale=scale)
        self.assertEqual((y.dtype, y.device.type), (torch.float32, self.device))
        self.assertEqual(y.cpu(), want, atol=0, rtol=0)
        self.assertEqual(y.cpu()[0], torch.zeros(19))
        xi = x[i.cpu()]
        bound = xi.abs() / 16 + xi.abs().amax(1, keepdim=True) * 2.0 ** -18
        self.assertTrue(bool(((y.cpu() - xi).abs() <= bound).all()))
        for dtype in (torch.float16, torch.bfloat16):
            self.assertEqual(torch_direct.gather(q, i, scale=scale, dtype=dtype).cpu(), want.to(dtype),
                             atol=0, rtol=0)
        two_d = self.idx([[1, 2], [3, 299]])
        self.assertEqual(torch_direct.gather(q, two_d, scale=scale).shape, (2, 2, 19))

    def test_fp8_bad_input(self):
        q, scale = torch_direct.quantize_rows_fp8(torch.randn(20, 4), device="unified")
        i = self.idx([1, 2])
        with self.assertRaisesRegex(ValueError, "one entry per table row"):
            torch_direct.gather(q, i, scale=scale[:-1])
        with self.assertRaisesRegex(TypeError, "float8_e4m3fn table"):
            torch_direct.gather(torch.randn(20, 4).to("unified"), i, scale=scale)
        with self.assertRaisesRegex(TypeError, "float32, float16 or bfloat16"):
            torch_direct.gather(q, i, scale=scale, dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, "cpu_threads"):
            torch_direct.gather(q, i, scale=scale, cpu_threads=2)
        with self.assertRaises(IndexError):
            torch_direct.gather(q, self.idx([20]), scale=scale)


class TestGatherOpsCPU(TestCase):
    """The gather-family ops on a unified table with a CPU index (rule R2)."""

    def test_ops_match_stock(self):
        src = torch.randn(60, 9)
        u = src.to("unified")
        i = torch.tensor([4, 59, 0, 4, -1])
        self.assertEqual(u[i], src[i])
        self.assertEqual(u[i].device.type, "cpu")
        with self.assertRaisesRegex(IndexError, "-1"):  # as stock index_select
            torch.index_select(u, 0, i)
        i = i.abs()
        self.assertEqual(torch.index_select(u, 0, i), src.index_select(0, i))
        out = torch.empty(0)
        torch.index_select(u, 0, i[:3], out=out)
        self.assertEqual(out, src[i[:3]])
        self.assertEqual(torch.nn.functional.embedding(i[:4], u), src[i[:4]])
        g = torch.tensor([[1, 2], [0, 59]])
        self.assertEqual(u[g], src[g])
        # Forms the row kernels do not take go through the fallback.
        self.assertEqual(torch.index_select(u, 1, torch.tensor([8, 0])), src[:, [8, 0]])
        mask = src[:, 0] > 0
        self.assertEqual(u[mask], src[mask])
        gi = torch.randint(0, 60, (5, 9))
        self.assertEqual(torch.gather(u, 0, gi), torch.gather(src, 0, gi))
        with self.assertRaisesRegex(IndexError, "60"):
            u[torch.tensor([60])]
        # A table without rows: every index is out of bounds (not a shape error).
        empty_table = torch.empty(0, 4).to("unified")
        self.assertEqual(torch_direct.gather(empty_table, torch.empty(0, dtype=torch.long)).shape,
                         (0, 4))
        with self.assertRaisesRegex(IndexError, "index 0 is out of bounds.*size 0"):
            torch_direct.gather(empty_table, torch.tensor([0]))


class TestHybridParts(TestCase):
    @unittest.skipIf(torch_direct.cuda_available(), "checks the answer without CUDA")
    def test_no_parts_without_cuda(self):
        self.assertEqual(torch_direct.hybrid_gather_parts(), {})


class TestCpuThreads(TestCase):
    @extension_only("_parallel_threads_used is a test hook of the extension's module")
    def test_cpu_gather_runs_on_several_threads(self):
        # at::parallel_for's OpenMP body is inline: compiled into an extension
        # without -fopenmp it runs on one thread. Ours must not.
        self.assertGreaterEqual(torch_direct._C._parallel_threads_used(2), 2)
        self.assertEqual(torch_direct._C._parallel_threads_used(1), 1)

    @extension_only("_parallel_threads_used is a test hook of the extension's module")
    def test_as_many_threads_as_asked_beyond_the_interop_pool(self):
        # PyTorch's inter-op pool is sized to the physical cores; a gather asked
        # for more threads must still get them all at once.
        want = torch.get_num_interop_threads() + 3
        self.assertEqual(torch_direct._C._parallel_threads_used(want), want)
        self.assertEqual(torch_direct._C._parallel_threads_used(3), 3)  # a grown pool serves fewer too

    @extension_only("_parallel_threads_used is a test hook of the extension's module")
    def test_forked_child_gets_threads_of_its_own(self):
        import multiprocessing as mp
        # The parent's pool exists before the fork; its threads do not exist in the child.
        torch_direct._C._parallel_threads_used(4)
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(torch_direct._C._parallel_threads_used, (4,)).get(timeout=60)
        self.assertEqual(got, 4)

    def test_streaming_stores_write_the_same_rows(self):
        # 128 B rows take the streaming stores; 12 B rows, not a multiple of 16, the plain copy.
        for width, dtype in ((32, torch.float32), (3, torch.float32), (64, torch.float16)):
            src = torch.randn(5000, width).to(dtype)
            u = src.to("unified")
            idx = torch.randint(-5000, 5000, (70000,))
            with torch_direct.experimental(cpu_gather_stores="streaming", gather_own_pool=1):
                got = torch_direct.gather(u, idx)
            self.assertEqual(got, src[idx], msg=f"width {width}")
        with torch_direct.experimental(cpu_gather_stores="nt"):
            with self.assertRaisesRegex(RuntimeError, "cpu_gather_stores must be plain or streaming, not 'nt'"):
                torch_direct.gather(u, idx)
        with torch_direct.experimental(hybrid_copies="async"):   # checked by every gather, the CPU's too
            with self.assertRaisesRegex(RuntimeError, "hybrid_copies must be wait or ordered, not 'async'"):
                torch_direct.gather(u, idx)
        with torch_direct.experimental(hybrid_piece_kb="8"):   # checked by every gather too
            with self.assertRaisesRegex(RuntimeError, "hybrid_piece_kb must be an integer >= 16, not '8'"):
                torch_direct.gather(u, idx)

    @extension_only("_parallel_concurrent_peak is a test hook of the extension's module")
    def test_calls_at_once_each_get_the_threads_they_asked_for(self):
        # Two loader threads that each gather on 6 threads must run on 12, not on
        # one pool sized for one of them. In a fresh process, so that no earlier
        # call has grown the pool already.
        import json
        import subprocess
        import sys
        code = """
import json, torch_direct
out = {}
with torch_direct.experimental(cpu_pool_size="largest"):
    out["largest"] = torch_direct._C._parallel_concurrent_peak(3, 4)
out["concurrent"] = torch_direct._C._parallel_concurrent_peak(3, 4)
out["again"] = torch_direct._C._parallel_concurrent_peak(2, 4)
with torch_direct.experimental(cpu_pool_size="all"):
    try:
        torch_direct._C._parallel_concurrent_peak(2, 2)
        out["bad"] = "ran"
    except RuntimeError as e:
        out["bad"] = str(e)
print(json.dumps(out))
"""
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        out = json.loads(run.stdout.strip().splitlines()[-1])
        # one pool of 3 threads for calls of 4 chunks: the 3 callers' own chunks and 3 more
        self.assertEqual(out["largest"], 6)
        self.assertEqual(out["concurrent"], 12)
        self.assertEqual(out["again"], 8)
        self.assertIn("cpu_pool_size must be concurrent or largest, not 'all'", out["bad"])

    @extension_only("_parallel_concurrent_peak is a test hook of the extension's module")
    def test_outgrown_pools_give_their_threads_back(self):
        # The pool grows as more calls run at once (3, then 6, then 9 threads for three callers
        # of 4 chunks; 12 for four): each pool it outgrew is shut down once its calls end, so the
        # process keeps one pool's threads, not every size it went through. In a fresh process.
        import json
        import subprocess
        import sys
        code = """
import json, os, time, torch_direct
def threads():
    # a joined thread can stay listed a moment after its join: the count settles first
    n, end = len(os.listdir("/proc/self/task")), time.monotonic() + 2
    while time.monotonic() < end:
        time.sleep(0.02)
        n, before = len(os.listdir("/proc/self/task")), n
        if n == before:
            break
    return n
base = threads()
peaks = [torch_direct._C._parallel_concurrent_peak(c, 4) for c in (1, 2, 3, 4)]
grown = threads()
again = torch_direct._C._parallel_concurrent_peak(2, 4)   # the 12-thread pool serves a smaller load
print(json.dumps({"peaks": peaks, "again": again, "added": grown - base, "after": threads() - base}))
"""
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        out = json.loads(run.stdout.strip().splitlines()[-1])
        self.assertEqual(out["peaks"], [4, 8, 12, 16])   # every call got its threads
        self.assertEqual(out["again"], 8)
        # the newest pool's 12 threads; keeping the outgrown ones would add 3 + 3 + 6 + 3 + 6 + 9 more
        self.assertEqual(out["added"], 12)
        self.assertEqual(out["after"], 12)

    @extension_only("_parallel_thread_nices is a test hook of the extension's module")
    def test_cpu_pool_nice_makes_the_pool_threads_nicer_than_their_caller(self):
        # In a process of its own: the pool's threads keep a niceness once given.
        import json
        import subprocess
        import sys
        code = """
import json, os, torch, torch_direct
# the gather below asks for as many threads as the probes: with more (a machine's cores), the pool
# would grow to new threads, some of which run no chunk under the setting and keep the base niceness
torch.set_num_threads(3)
out = {"base": os.getpriority(os.PRIO_PROCESS, 0), "plain": torch_direct._C._parallel_thread_nices(3)}
src = torch.randn(150000, 4)
u = src.to("unified")
idx = torch.randint(0, 150000, (200000,))
with torch_direct.experimental(cpu_pool_nice=4, gather_own_pool=1):
    out["nice4"] = torch_direct._C._parallel_thread_nices(3)
    out["rows"] = bool(torch.equal(torch_direct.gather(u, idx), src[idx]))
out["after"] = torch_direct._C._parallel_thread_nices(3)
for bad in ("20", "x"):
    with torch_direct.experimental(cpu_pool_nice=bad):
        try:
            torch_direct._C._parallel_thread_nices(3)
            out[bad] = "ran"
        except RuntimeError as e:
            out[bad] = str(e)
print(json.dumps(out))
"""
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        out = json.loads(run.stdout.strip().splitlines()[-1])
        base = out["base"]
        nicer = min(19, base + 4)
        self.assertEqual(out["plain"], [base, base, base])           # unset: as the threads were made
        self.assertEqual(out["nice4"], [base, nicer, nicer])         # the caller keeps its own
        self.assertTrue(out["rows"])
        self.assertEqual(out["after"], [base, nicer, nicer])         # unset again: left as it is
        self.assertIn("from 0 to 19", out["20"])
        self.assertIn("cpu_pool_nice must be an integer", out["x"])

    def test_prefetch_experiment_keeps_rows(self):
        # The experimental cpu_gather_prefetch asks for rows ahead of the copy in our loop (which
        # gather_own_pool keeps for rows copied as they are); the rows are the same
        # with any distance, including one past the end of a chunk and the negative indices.
        src = torch.randn(50000, 37)
        u = src.to("unified")
        idx = torch.randint(-50000, 50000, (120000,))
        for d in ("1", "16", "100000"):
            with self.subTest(distance=d), torch_direct.experimental(cpu_gather_prefetch=d, gather_own_pool=1):
                self.assertEqual(torch_direct.gather(u, idx), src[idx], atol=0, rtol=0)
                self.assertEqual(torch_direct.gather(u[:, :32], idx), src[:, :32][idx], atol=0, rtol=0)
        for bad, msg in (({"gather_own_pool": 2}, "gather_own_pool must be 0 or 1, not '2'"),
                         ({"cpu_gather_prefetch": "x"}, "cpu_gather_prefetch must be an integer >= 0, not 'x'")):
            with self.subTest(bad=bad), torch_direct.experimental(**bad):
                with self.assertRaisesRegex(RuntimeError, msg):
                    torch_direct.gather(u, idx)

    def test_rows_as_they_are_through_index_select(self):
        # Same-dtype rows and non-negative indices go to index_select on torch's threads: int32
        # and int64 indices, rows of a strided view (offset into the storage), a 1-D table, and
        # a bad index raises our IndexError before any row is written.
        src = torch.randn(30000, 37)
        u = src.to("unified")
        for dtype in (torch.int64, torch.int32):
            idx = torch.randint(0, 30000, (70000,), dtype=dtype)
            with self.subTest(index=dtype):
                self.assertEqual(torch_direct.gather(u, idx), src[idx.long()], atol=0, rtol=0)
                self.assertEqual(torch_direct.gather(u[:, 3:35], idx), src[:, 3:35][idx.long()], atol=0, rtol=0)
                for env in ({}, {"gather_own_pool": 1}):   # index_select + copy_, our loop
                    with torch_direct.experimental(**env):
                        self.assertEqual(torch_direct.gather(u, idx, dtype=torch.float16), src[idx.long()].half())
                        self.assertEqual(torch_direct.gather(u.half(), idx, dtype=torch.float32),
                                         src.half()[idx.long()].float())
        line = torch.randn(1000)
        self.assertEqual(torch_direct.gather(line.to("unified"), torch.tensor([5, 0, 999])), line[[5, 0, 999]])
        idx = torch.randint(0, 30000, (70000,))
        idx[50000] = 30000
        out = torch.full((70000, 37), 7.0)
        with self.assertRaisesRegex(IndexError, "index 30000 is out of bounds.*30000"):
            torch_direct.gather(u, idx, out=out)
        self.assertTrue(bool((out == 7.0).all()), msg="rows written before the check")

    def test_bad_index_in_any_chunk(self):
        # The bounds check (on torch's threads, or on our pool's in chunks for our loop): a bad
        # index is found in the first, a middle or the last chunk, too large or too negative,
        # before any row is read.
        src = torch.randn(100000, 4)
        u = src.to("unified")
        good = torch.randint(-100000, 100000, (200000,))
        for env in ({}, {"gather_own_pool": 1}):
            with self.subTest(env=env), torch_direct.experimental(**env):
                for pos in (0, 131071, 199999):
                    for bad in (100000, -100001):
                        idx = good.clone()
                        idx[pos] = bad
                        out = torch.full((200000, 4), 7.0)
                        with self.assertRaisesRegex(IndexError, f"index {bad} is out of bounds"):
                            torch_direct.gather(u, idx, out=out)
                        self.assertTrue(bool((out == 7.0).all()), msg="rows written before the check")
                self.assertEqual(torch_direct.gather(u, good), src[good])
                self.assertEqual(torch_direct.gather(u, good.int()), src[good])


class TestQuantizeRowsFp8(TestCase):
    def test_precision_chunks_and_devices(self):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(1000, 33, generator=g) * torch.logspace(-3, 4, 1000).unsqueeze(1)
        x[10] = 0
        q, scale = torch_direct.quantize_rows_fp8(x, compute="cpu")
        self.assertEqual((q.dtype, q.device.type, scale.shape), (torch.float8_e4m3fn, "cpu", (1000,)))
        self.assertEqual(scale[10], 1.0)
        self.assertEqual(scale, x.abs().amax(1).where(x.abs().amax(1) > 0, torch.tensor(448.0)) / 448)
        back = q.float() * scale.unsqueeze(1)
        bound = x.abs() / 16 + x.abs().amax(1, keepdim=True) * 2.0 ** -18
        self.assertTrue(bool(((back - x).abs() <= bound).all()))
        self.assertEqual(back.abs().amax(1), x.abs().amax(1))   # each row's largest is exact
        # the chunking changes nothing; a float16 or unified source gives the same rows
        q7, s7 = torch_direct.quantize_rows_fp8(x, compute="cpu", chunk_rows=7)
        self.assertEqual(q7.view(torch.uint8), q.view(torch.uint8))
        self.assertEqual(s7, scale)
        qu, su = torch_direct.quantize_rows_fp8(x.to("unified"), compute="cpu")
        self.assertEqual((qu.device.type, su.device.type), ("unified", "unified"))
        self.assertEqual(qu.cpu().view(torch.uint8), q.view(torch.uint8))
        seen = []
        torch_direct.quantize_rows_fp8(x.half(), compute="cpu", chunk_rows=300, progress=seen.append)
        self.assertEqual(seen, [300, 600, 900, 1000])

    @requires_gpu
    def test_on_the_gpu_as_on_the_cpu(self):
        x = torch.randn(5000, 100) * torch.rand(5000, 1) * 50
        q, scale = torch_direct.quantize_rows_fp8(x, compute="cpu")
        qg, sg = torch_direct.quantize_rows_fp8(x, compute="cuda", device="unified")
        self.assertEqual(qg.cpu().view(torch.uint8), q.view(torch.uint8))
        self.assertEqual(sg.cpu(), scale)


@extension_only("_hybrid_policy_replay is a test hook of the extension's module")
class TestHybridPolicy(TestCase):
    """The hybrid gather's split policy (csrc/aten/HybridSplit.h), replayed over given call
    timings: (rows, rows given to the CPU, CPU seconds, GPU seconds) per call."""

    replay = staticmethod(lambda calls: torch_direct._C._hybrid_policy_replay(calls))

    # The first call pays one-time costs (pinned staging, threads): a slow one, not folded in.
    WARM_UP = (1000, 250, 1.0, 0.01)

    def test_split_where_the_pair_beats_the_gpu_alone(self):
        picks = self.replay([
            self.WARM_UP,
            (1000, 250, 0.01, 0.01),   # together: CPU 25K rows/s, GPU 75K rows/s
            (1000, 0, 0.0, 0.0125),    # the GPU alone: 80K rows/s, less than the pair's 100K
        ])
        self.assertEqual(picks[:2], [0.25, 0.25])  # nothing measured (a warm-up only): the default
        self.assertEqual(picks[2], 0.0)    # both paths known: now the GPU alone, once
        self.assertAlmostEqual(picks[3], 0.25)  # both finish together at 25% on the CPU

    def test_first_call_is_not_folded_in(self):
        # Folded in, the warm-up's CPU rate (250 rows/s) would halve the CPU's estimate (a split
        # of 1/3); without it the split is the one the later calls show.
        picks = self.replay([self.WARM_UP, (1000, 500, 0.005, 0.005), (1000, 0, 0.0, 0.01)])
        self.assertAlmostEqual(picks[-1], 0.5)

    def test_gpu_alone_where_the_pair_is_slower(self):
        # A shared link: together 25K + 50K rows/s, the GPU alone 100K rows/s.
        calls = [self.WARM_UP, (1000, 250, 0.01, 0.015), (1000, 0, 0.0, 0.01)]
        picks = self.replay(calls + [(1000, 0, 0.0, 0.01)] * 30)
        self.assertEqual(picks[3:5], [0.0, 0.0])
        # One call in 16 tries the split again (1/3 of the rows to the CPU), the rest stay on the GPU.
        tries = [i for i, f in enumerate(picks) if i >= 3 and f > 0]
        self.assertEqual(len(tries), 2)
        self.assertEqual(tries[1] - tries[0], 16)
        self.assertAlmostEqual(picks[tries[0]], 1 / 3)
        # Should the pair get faster (the CPU path at 200K rows/s), the split comes back.
        picks = self.replay(calls + [(1000, 500, 0.0025, 0.0025)])
        self.assertGreater(picks[-1], 0.05)

    def test_fraction_query_rejects_bad_sizes(self):
        for kw in ({"row_bytes": 0}, {"row_bytes": 2.5}, {"row_bytes": True},
                   {"row_bytes": 64, "table_bytes": -1}):
            with self.subTest(**kw), self.assertRaisesRegex(ValueError, "hybrid_cpu_fraction"):
                torch_direct.hybrid_cpu_fraction(**kw)

    def test_split_stays_within_bounds(self):
        self.assertEqual(self.replay([self.WARM_UP, (1000, 500, 100.0, 1e-4), (1000, 0, 0.0, 1e-1)])[-1], 0.05)
        self.assertEqual(self.replay([self.WARM_UP, (1000, 500, 1e-4, 100.0), (1000, 0, 0.0, 100.0)])[-1], 0.95)


class TestGatherCPU(GatherChecks, TestCase):
    device = "cpu"


@requires_gpu
class TestGatherCUDA(GatherChecks, TestCase):
    device = "cuda"


@requires_gpu
class TestGatherKernelCUDA(TestCase):
    """The locality-ordered CUDA kernel against a CPU reference, case by case."""

    def check(self, src, idx, **kw):
        u = src.to("unified")
        want = src[idx.long()].to(kw.get("dtype") or src.dtype)
        got = torch_direct.gather(u, idx.cuda(), **kw)
        self.assertEqual(got.device.type, "cuda")
        self.assertEqual(got.cpu(), want, atol=0, rtol=0)

    def test_dtypes_widths_orders(self):
        g = torch.Generator().manual_seed(0)
        dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                  torch.int16, torch.uint8)
        for dtype in dtypes:
            es = torch.tensor([], dtype=dtype).element_size()
            for row_bytes in (es, 6 if es <= 2 else 2 * es, 24, 64, 200, 400, 512, 2048 + es):
                width = max(1, row_bytes // es)
                src = (torch.randn(3000, width, generator=g) * 50).to(dtype)
                for n in (7, 5000):  # below and above the sort threshold
                    idx = torch.randint(-3000, 3000, (n,), generator=g)
                    for order in ("auto", "sort", "as_is"):
                        with self.subTest(dtype=dtype, row_bytes=row_bytes, n=n, order=order):
                            self.check(src, idx, order=order)

    def test_sorted_duplicates_and_index_kinds(self):
        src = torch.randn(1000, 50)
        idx = torch.randint(0, 40, (20000,))  # heavy repeats
        self.check(src, idx)
        self.check(src, idx.sort().values)
        self.check(src, idx.int())
        self.check(src, torch.full((9000,), 999))
        nc = torch.randint(0, 1000, (12000,))[::3]
        u = src.to("unified")
        self.assertEqual(torch_direct.gather(u, nc.cuda()).cpu(), src[nc])

    def test_tuning_overrides_keep_results(self):
        # The experiment knobs change the launch (rows in flight, load width), never the rows.
        src = torch.randn(3000, 128)
        idx = torch.randint(0, 3000, (7000,))
        for var, values in (("gather_window_rows", ("1", "64", "0")),
                            ("gather_max_unit", ("1", "2", "4", "8"))):
            for v in values:
                with self.subTest(var=var, value=v), torch_direct.experimental(**{var: v}):
                    self.check(src, idx)
                    self.check(src.half(), idx, dtype=torch.float32)

    def test_row_per_block_kernel(self):
        # The one-block-per-row kernel (the default on tables of 8 GiB and more), forced on small
        # tables by the experimental gather_kernel=rowblock: every load width, row size, order,
        # repeats, a strided table, fused casts (4 elements a load, and 1 where the row is odd).
        g = torch.Generator().manual_seed(1)
        with torch_direct.experimental(gather_kernel="rowblock"):
            for dtype in (torch.float32, torch.float16, torch.uint8):
                es = torch.tensor([], dtype=dtype).element_size()
                for row_bytes in (es, 6 if es <= 2 else 8, 200, 512, 4096 + 16, 8192 + es):
                    width = max(1, row_bytes // es)
                    src = (torch.randn(2000, width, generator=g) * 50).to(dtype)
                    for order in ("auto", "sort", "as_is"):
                        with self.subTest(dtype=dtype, row_bytes=row_bytes, order=order):
                            self.check(src, torch.randint(-2000, 2000, (5000,), generator=g), order=order)
            src = torch.randn(1000, 64)
            self.check(src, torch.randint(0, 30, (20000,), generator=g))  # long runs of repeats
            # capped to a few SMs: fewer blocks than entries, each looping over entries a grid
            # apart (runs of repeats then span blocks' turns)
            for sms in (1, 3):
                with self.subTest(max_sms=sms):
                    self.check(src, torch.randint(-1000, 1000, (20000,), generator=g), max_sms=sms)
                    self.check(src, torch.randint(0, 30, (20000,), generator=g), max_sms=sms)
                    self.check(src.half(), torch.randint(0, 1000, (5000,), generator=g), dtype=torch.float32,
                               max_sms=sms)
            self.check(src, torch.randint(0, 1000, (20000,), generator=g).sort().values.int())
            for width in (64, 1027):
                t = torch.randn(1000, width, generator=g)
                i = torch.randint(-1000, 1000, (3000,), generator=g)
                with self.subTest(cast_width=width):
                    self.check(t.half(), i, dtype=torch.float32)
                    self.check(t.bfloat16(), i, dtype=torch.float16)
                    self.check(t, i, dtype=torch.bfloat16)
            base = torch.randn(1001, 130)
            idx = torch.randint(0, 1000, (3000,), generator=g)
            self.assertEqual(torch_direct.gather(base.to("unified")[1:, 3:103], idx.cuda()).cpu(),
                             base[1:, 3:103][idx])
            # a table in GPU memory (the gpu_resident feature store's): the same kernel, cast fused
            for order in ("as_is", "sort"):
                with self.subTest(gpu_table=order):
                    got = torch_direct.gather(base.half().cuda(), idx.cuda(), dtype=torch.float32, order=order)
                    self.assertEqual(got.cpu(), base.half()[idx].float())
        u = torch.randn(100, 8).to("unified")
        for bad, msg in (({"gather_kernel": "fastest"}, "gather_kernel must be rowblock or grid, not 'fastest'"),
                         ({"gather_window_rows": "-3"}, "gather_window_rows must be an integer >= 0, not '-3'"),
                         ({"gather_max_unit": "0"}, "gather_max_unit must be an integer >= 1, not '0'")):
            with torch_direct.experimental(**bad), self.assertRaisesRegex(RuntimeError, msg):
                torch_direct.gather(u, torch.arange(10, device="cuda"))
        with mock.patch.dict(os.environ, {"TORCH_DIRECT_EXPERIMENTAL": "gather_kernal=grid"}):
            with self.assertRaisesRegex(RuntimeError, "unknown setting 'gather_kernal'"):
                torch_direct.gather(u, torch.arange(10, device="cuda"))
        with torch_direct.experimental(gather_kernel="grid"):
            self.assertEqual(torch_direct.gather(u, torch.arange(10, device="cuda")).cpu(), u.cpu()[:10])

    def test_large_tables_read_one_block_per_row(self):
        # A table of 8 GiB takes the one-block-per-row kernel; a gather capped to max_sms SMs,
        # or the experimental gather_kernel=grid, the grid-stride one; gather_kernel=rowblock
        # keeps one block a row under a cap. Same rows either way.
        rows = (8 << 30) // 256
        u = torch.empty(rows, 64, dtype=torch.int32, device="unified")
        g = torch.Generator().manual_seed(3)
        picks = torch.randint(0, rows, (300,), generator=g).unique()
        vals = torch.randint(-2**31, 2**31 - 1, (len(picks), 64), dtype=torch.int32, generator=g)
        for p, v in zip(picks.tolist(), vals):
            u[p] = v
        order = torch.randint(0, len(picks), (5000,), generator=g)
        idx = picks[order].cuda()

        def kernels_and_rows(table=u, **kw):
            activities = [torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                y = torch_direct.gather(table, idx, **kw)
                torch.cuda.synchronize()
            names = {e.name for e in prof.events()}
            # the index check's kernel: the profiler saw our kernels at all
            self.assertTrue(any("index_stats_kernel" in n for n in names), sorted(names))
            return {k for k in ("gather_row_per_block_kernel", "gather_kernel")
                    if any(re.search(r"(^|[\s:])" + k + "<", n) for n in names)}, y.cpu()

        for env, kw, want in (({}, {}, {"gather_row_per_block_kernel"}),
                              ({}, {"max_sms": 8}, {"gather_kernel"}),
                              ({"gather_kernel": "grid"}, {}, {"gather_kernel"}),
                              ({"gather_kernel": "rowblock"}, {"max_sms": 8}, {"gather_row_per_block_kernel"})):
            # settings not given are removed (not inherited from the caller's environment)
            env = {"gather_kernel": None, "gather_window_rows": None, **env}
            with self.subTest(env=env, kw=kw), torch_direct.experimental(**env):
                used, y = kernels_and_rows(**kw)
                self.assertEqual(used, want)
                self.assertEqual(y, vals[order])
        # The same table in GPU memory takes the grid-stride kernel: the one-block-per-row kernel
        # is for the address translation of host memory read over PCIe.
        with torch_direct.experimental(gather_kernel=None, gather_window_rows=None):
            d = u.to("cuda")  # split at the registrations (a stock copy of cpu_alias(u) may not span two)
            used, y = kernels_and_rows(table=d)
            del d
        self.assertEqual(used, {"gather_kernel"})
        self.assertEqual(y, vals[order])

    def test_fp8_scaled_kernel(self):
        # The scaled gather's kernel against the same arithmetic done by torch: every width
        # (16-element loads, 4, and 1 for odd rows), orders, repeats, both kernels, a table on
        # the GPU or unified, scales unified or on the GPU, each output dtype.
        g = torch.Generator().manual_seed(5)
        for kernel in ("grid", "rowblock"):
            for width in (1, 3, 4, 12, 16, 100, 128, 129):
                x = torch.randn(3000, width, generator=g) * torch.rand(3000, 1, generator=g) * 100
                q, scale = torch_direct.quantize_rows_fp8(x, compute="cpu")
                for n in (7, 5000):
                    idx = torch.randint(-3000, 3000, (n,), generator=g)
                    for order in ("auto", "as_is"):
                        for dtype in (torch.float32, torch.float16, torch.bfloat16):
                            want = fp8_reference(q, scale, idx).to(dtype)
                            for table, sc in ((q.to("unified"), scale.to("unified")), (q.cuda(), scale.cuda())):
                                with self.subTest(kernel=kernel, width=width, n=n, order=order, dtype=dtype,
                                                  table=table.device.type), \
                                        torch_direct.experimental(gather_kernel=kernel):
                                    got = torch_direct.gather(table, idx.cuda(), scale=sc, dtype=dtype, order=order)
                                    self.assertEqual(got.cpu(), want, atol=0, rtol=0)
        q, scale = torch_direct.quantize_rows_fp8(torch.randn(100, 8), compute="cpu")
        with self.assertRaisesRegex(ValueError, "unified or on cuda"):
            torch_direct.gather(q.to("unified"), torch.tensor([1]).cuda(), scale=scale)

    def test_unaligned_and_strided_tables(self):
        base = torch.randn(4001, 130)
        u_base = base.to("unified")
        idx = torch.randint(0, 4000, (6000,))
        # Rows start one element into the storage and are 100 of 130 columns wide.
        src = base[1:, 3:103]
        table = u_base[1:, 3:103]
        self.assertTrue(table.is_unified)
        self.assertEqual(torch_direct.gather(table, idx.cuda()).cpu(), src[idx])
        h = base.half()
        uh = h.to("unified")
        self.assertEqual(torch_direct.gather(uh[:, 1:], idx.cuda(), dtype=torch.float32).cpu(),
                         h[:, 1:][idx].float())

    def test_fused_casts(self):
        src = torch.randn(2000, 100)
        idx = torch.randint(0, 2000, (5000,))
        for t_in in (torch.float32, torch.float16, torch.bfloat16):
            for t_out in (torch.float32, torch.float16, torch.bfloat16):
                with self.subTest(t_in=t_in, t_out=t_out):
                    self.check(src.to(t_in), idx, dtype=t_out)
        self.check((src * 10).to(torch.int32), idx, dtype=torch.float32)  # not fused: cast after

    def test_one_dimensional_and_empty(self):
        src = torch.arange(100000, dtype=torch.float32)
        self.check(src, torch.randint(0, 100000, (50000,)))
        u = src.to("unified")
        self.assertEqual(torch_direct.gather(u, torch.tensor([], dtype=torch.long, device="cuda"))
                         .shape, (0,))
        empty_table = torch.empty(0, 4).to("unified")
        self.assertEqual(torch_direct.gather(empty_table, torch.empty(0, dtype=torch.long,
                                                                      device="cuda")).shape, (0, 4))
        with self.assertRaisesRegex(IndexError, "index 0 is out of bounds.*size 0"):
            torch_direct.gather(empty_table, torch.tensor([0], device="cuda"))

    def test_sm_cap_and_side_stream(self):
        src = torch.randn(5000, 64)
        u = src.to("unified")
        idx = torch.randint(0, 5000, (40000,), device="cuda")
        ref = src[idx.cpu()]
        self.assertEqual(torch_direct.gather(u, idx, max_sms=1).cpu(), ref)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = torch_direct.gather(u, idx)
        s.synchronize()
        self.assertEqual(y.cpu(), ref)
        with self.assertRaisesRegex(ValueError, "max_sms"):
            torch_direct.gather(u, idx, max_sms=0)
        with self.assertRaisesRegex(ValueError, "order"):
            torch_direct.gather(u, idx, order="random")

    def test_bad_index_leaves_context_working(self):
        src = torch.randn(10000, 32)
        u = src.to("unified")
        for bad in (10000, -10001, 2**40):
            idx = torch.randint(0, 10000, (8000,))
            idx[1234] = bad
            with self.assertRaisesRegex(IndexError, f"{bad}.*10000"):
                torch_direct.gather(u, idx.cuda())
            with self.assertRaisesRegex(IndexError, str(bad)):
                u[idx.cuda()]
        torch.cuda.synchronize()  # no sticky error
        idx = torch.randint(0, 10000, (8000,))
        self.assertEqual(torch_direct.gather(u, idx.cuda()).cpu(), src[idx])
        self.assertEqual(u.cpu(), src)

    def _sleep_cycles(self, seconds: float) -> int:
        """torch.cuda._sleep's argument for about ``seconds`` of GPU time on this GPU."""
        # A first launch loads the kernel's module (lazy loading) between the two events, which
        # would make the cycles look slow and the sleeps below far shorter than asked.
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(10**7)
        b.record()
        b.synchronize()
        return int(10**7 * seconds * 1e3 / max(a.elapsed_time(b), 1e-3))

    def test_gathers_let_go_of_the_gil(self):
        # A loader thread's gather waits for its stream (the bounds check) and, when hybrid, for
        # its CPU threads: other Python threads (the training loop launching kernels) must run
        # meanwhile. The gather's stream is held by a ~0.5 s kernel; 50 ms into the wait the main
        # thread must be running again, with the gather still waiting.
        import threading
        import time
        src = torch.randn(4096, 64)
        u = src.to("unified")
        idx = torch.randint(0, 4096, (20000,), device="cuda")
        cycles = self._sleep_cycles(0.5)
        for kw in ({}, {"cpu_threads": 2, "cpu_fraction": 0.5}):
            with self.subTest(**kw):
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                entered, done, result = threading.Event(), threading.Event(), {}

                def work():
                    with torch.cuda.stream(s):
                        torch.cuda._sleep(cycles)
                        entered.set()
                        result["y"] = torch_direct.gather(u, idx, **kw)
                        done.set()

                t = threading.Thread(target=work)
                t.start()
                entered.wait()
                time.sleep(0.05)  # returns once this thread has the GIL back
                still_waiting = not done.is_set()
                t.join()
                self.assertTrue(still_waiting, "the gather held the GIL while it waited for its stream")
                torch.cuda.synchronize()
                self.assertEqual(result["y"].cpu(), src[idx.cpu()])

    def test_hybrid_sees_writes_queued_on_its_stream(self):
        # Stream order: the CPU part reads the table after the work queued before the gather on
        # the current stream, here a write behind a ~0.2 s kernel.
        src = torch.zeros(1000, 32)
        u = src.to("unified")
        torch.cuda.synchronize()
        torch.cuda._sleep(self._sleep_cycles(0.2))
        u[:10] = torch.ones(10, 32, device="cuda")
        y = torch_direct.gather(u, torch.arange(20, device="cuda"), cpu_threads=2, cpu_fraction=1.0)
        expected = torch.zeros(20, 32)
        expected[:10] = 1
        self.assertEqual(y.cpu(), expected)

    @extension_only("the fork keeps no hybrid gather counters")
    def test_hybrid_ordered_copies(self):
        # hybrid_copies=ordered: the call returns with its CPU rows' copies queued and the stream
        # ordered after them, without waiting (its copy wait stays 0); their pinned staging goes back
        # to the host allocator only once they are done, so back-to-back gathers of one size, which
        # take the same cached staging block, each still get their own rows.
        src = torch.randn(40000, 32)
        u = src.to("unified")
        idxs = [torch.randint(0, 40000, (60000,)) for _ in range(6)]
        before = torch_direct.hybrid_gather_parts().get("hybrid_copy_wait", (0.0, 0))
        with torch_direct.experimental(hybrid_copies="ordered"):
            ys = [torch_direct.gather(u, i.cuda(), cpu_threads=2, cpu_fraction=frac)
                  for i, frac in zip(idxs, (1.0, 1.0, 0.5, 1.0, 1.0, 0.7))]
            got = [y.cpu() for y in ys]
        after = torch_direct.hybrid_gather_parts()["hybrid_copy_wait"]
        self.assertEqual(after[1] - before[1], 6)
        self.assertEqual(after[0], before[0])   # no call waited for its copies
        for k, (i, y) in enumerate(zip(idxs, got)):
            self.assertEqual(y, src[i], msg=f"gather {k}")
        # on a side stream, read there: the same rows
        s = torch.cuda.Stream()
        with torch.cuda.stream(s), torch_direct.experimental(hybrid_copies="ordered"):
            y = torch_direct.gather(u, idxs[0].cuda(), cpu_threads=2, cpu_fraction=1.0, dtype=torch.float16)
            doubled = (y * 2).cpu()   # a kernel on that stream after the copies, then a copy back
        self.assertEqual(doubled, src[idxs[0]].half() * 2)

    def test_hybrid_piece_sizes_give_the_same_rows(self):
        # hybrid_piece_kb: the CPU threads hand their rows to copies in pieces of that size (16 KiB:
        # many pieces a thread; 8 MiB: one), on the extension's own pool, float32 and float16 out.
        src = torch.randn(30000, 48)
        u = src.to("unified")
        idx = torch.randint(0, 30000, (50000,), device="cuda")
        for kb in ("16", "8192"):
            with torch_direct.experimental(hybrid_piece_kb=kb, gather_own_pool=1):
                y = torch_direct.gather(u, idx, cpu_threads=3, cpu_fraction=0.8)
                h = torch_direct.gather(u, idx, cpu_threads=3, cpu_fraction=1.0, dtype=torch.float16)
            self.assertEqual(y.cpu(), src[idx.cpu()], msg=f"{kb} KiB")
            self.assertEqual(h.cpu(), src[idx.cpu()].half(), msg=f"{kb} KiB, float16")

    @extension_only("the fork keeps no hybrid gather counters")
    def test_hybrid_parts_count_each_call(self):
        u = torch.randn(5000, 32).to("unified")
        idx = torch.randint(0, 5000, (20000,), device="cuda")
        before = torch_direct.hybrid_gather_parts()
        for frac in (1.0, 0.5):
            torch_direct.gather(u, idx, cpu_threads=2, cpu_fraction=frac)
        after = torch_direct.hybrid_gather_parts()
        self.assertEqual(set(after), {"hybrid_bounds_wait", "hybrid_cpu_rows", "hybrid_copy_wait", "hybrid_gpu_wait"})
        for name, (s, n) in after.items():
            s0, n0 = before.get(name, (0.0, 0))
            self.assertEqual(n - n0, 2, msg=name)
            self.assertGreaterEqual(s, s0, msg=name)
        self.assertGreater(after["hybrid_cpu_rows"][0], before.get("hybrid_cpu_rows", (0.0, 0))[0])

    def test_hybrid(self):
        src = torch.randn(20000, 100).half()
        u = src.to("unified")
        idx = torch.randint(-20000, 20000, (30000,))
        ref = src[idx]
        for frac in (0.0, 0.3, 1.0):
            with self.subTest(cpu_fraction=frac):
                y = torch_direct.gather(u, idx.cuda(), cpu_threads=2, cpu_fraction=frac)
                self.assertEqual(y.cpu(), ref)
        for _ in range(3):  # split from measured rates, fused cast
            y = torch_direct.gather(u, idx.cuda(), cpu_threads=2, dtype=torch.float32)
            self.assertEqual(y.cpu(), ref.float())
        # 64 B rows, non-negative indices: the CPU part in index_select pieces where its threads
        # are torch's, else on our pool, each thread's rows copied in several pieces
        narrow = torch.randn(50000, 16)
        un = narrow.to("unified")
        i2 = torch.randint(0, 50000, (300000,))
        for threads, env in ((torch.get_num_threads(), {}), (torch.get_num_threads(), {"gather_own_pool": 1}),
                             (max(1, torch.get_num_threads() - 1), {})):
            with self.subTest(threads=threads, env=env), torch_direct.experimental(**env):
                y = torch_direct.gather(un, i2.cuda(), cpu_threads=threads, cpu_fraction=0.7)
                self.assertEqual(y.cpu(), narrow[i2])
        self.assertEqual(torch_direct.hybrid_cpu_fraction(12344), 0.25)  # nothing measured yet
        f = torch_direct.hybrid_cpu_fraction(200)  # measured by the calls above
        self.assertNotEqual(f, 0.25)
        self.assertTrue(f == 0.0 or 0.05 <= f <= 0.95, f)  # 0: the GPU alone was faster
        self.assertEqual(torch_direct.hybrid_cpu_fraction(200, table_bytes=u.nbytes), f)
        # rates measured on a small table say nothing of a large one's (8 GiB and more)
        self.assertEqual(torch_direct.hybrid_cpu_fraction(200, table_bytes=8 << 30), 0.25)
        out = torch.empty(30000, 100, dtype=torch.float16, device="cuda")
        self.assertIs(torch_direct.gather(u, idx.cuda(), out=out, cpu_threads=1), out)
        self.assertEqual(out.cpu(), ref)
        bad = idx.clone()
        bad[0] = 20000  # in the CPU part
        with self.assertRaisesRegex(IndexError, "20000"):
            torch_direct.gather(u, bad.cuda(), cpu_threads=2, cpu_fraction=0.5)
        with self.assertRaisesRegex(ValueError, "cpu_fraction"):
            torch_direct.gather(u, idx.cuda(), cpu_threads=2, cpu_fraction=1.5)
        with self.assertRaisesRegex(ValueError, "cpu_threads"):
            torch_direct.gather(u, idx.cuda(), cpu_threads=-1)

    def test_ops_use_the_kernel_on_cuda(self):
        src = torch.randn(3000, 40)
        u = src.to("unified")
        i = torch.randint(-3000, 3000, (6000,))
        ic = i.cuda()
        self.assertEqual(u[ic].cpu(), src[i])
        self.assertEqual(u[ic].device, ic.device)
        with self.assertRaisesRegex(IndexError, "-"):  # as stock index_select
            torch.index_select(u, 0, ic)
        pos = i.remainder(3000)
        self.assertEqual(torch.index_select(u, 0, pos.cuda()).cpu(), src.index_select(0, pos))
        out = torch.empty(0, device="cuda")
        torch.index_select(u, 0, pos.cuda(), out=out)
        self.assertEqual(out.cpu(), src[pos])
        self.assertEqual(torch.nn.functional.embedding(pos.cuda().view(60, 100), u).cpu(),
                         torch.nn.functional.embedding(pos.view(60, 100), src))
        gi = torch.randint(0, 3000, (100, 40))
        self.assertEqual(torch.gather(u, 0, gi.cuda()).cpu(), torch.gather(src, 0, gi))
        with self.assertRaisesRegex(IndexError, "3000"):
            torch.gather(u, 0, torch.full((2, 40), 3000, device="cuda"))
        with self.assertRaisesRegex(IndexError, "-1"):
            torch.gather(u, 0, torch.full((2, 40), -1, device="cuda"))
        # Forms that go through the fallback's stock CUDA kernels: those take no
        # negative index either, and must raise instead of asserting on device.
        with self.assertRaisesRegex(IndexError, "-1"):
            torch.index_select(u, 1, torch.tensor([0, -1], device="cuda"))
        self.assertEqual(torch.index_select(u, 1, torch.tensor([39, 0], device="cuda")).cpu(),
                         src[:, [39, 0]])
        # The kernel reads a CUDA table too (the gpu_resident reference).
        d = src.cuda()
        self.assertEqual(torch_direct.gather(d, ic).cpu(), src[i])


if __name__ == "__main__":
    run_tests()
