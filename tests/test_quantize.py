"""Feature tables with fewer bytes a row: what both quantizers refuse, and 4-bit rows
(quantize_rows_int4, dequantize_rows_int4 and their store). The float8 rows' gathers are in
test_gather.py."""

import contextlib
import io
import json
import os
import tempfile

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import requires_gpu
from torch_direct.gnn.pipeline import KINDS, _features, make_feature_store
from torch_direct.gnn.pipeline.packed import Int4FeatureStore, make_int4_store


def reference(x: torch.Tensor):
    """The 4-bit rows of x as floats, written out value by value: scale = max|row| / 7 (1 for a
    row of zeros), each value rounded to the nearest multiple of it (ties to even)."""
    out = torch.empty_like(x, dtype=torch.float32)
    scales = torch.empty(x.shape[0])
    for i, row in enumerate(x.float()):
        m = float(row.abs().max())
        s = torch.tensor(m / 7 if m > 0 else 1.0, dtype=torch.float32)
        scales[i] = s
        out[i] = torch.round(row / s).clamp(-7, 7) * s
    return out, scales


class TestQuantize(TestCase):
    def test_layout_two_values_a_byte(self):
        # row 0: scale 1, values 7, -7, 0, 3.5 (ties to even: 4) -> nibbles 15, 1, 8, 12;
        # the even column in the low four bits. Row 1 is zeros: scale 1, every nibble 8.
        x = torch.tensor([[7.0, -7.0, 0.0, 3.5], [0.0, 0.0, 0.0, 0.0]])
        q, scale = torch_direct.quantize_rows_int4(x, compute="cpu")
        self.assertEqual(q.dtype, torch.uint8)
        self.assertEqual(q.tolist(), [[15 | 1 << 4, 8 | 12 << 4], [8 | 8 << 4, 8 | 8 << 4]])
        self.assertEqual(scale.tolist(), [1.0, 1.0])
        self.assertEqual(torch_direct.dequantize_rows_int4(q, scale),
                         torch.tensor([[7.0, -7.0, 0.0, 4.0], [0.0] * 4]), atol=0, rtol=0)

    def test_round_trip_is_within_half_a_step(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(300, 16, generator=g) * torch.logspace(-3, 3, 300).unsqueeze(1)
        q, scale = torch_direct.quantize_rows_int4(x, compute="cpu")
        self.assertEqual(q.shape, (300, 8))
        y = torch_direct.dequantize_rows_int4(q, scale)
        want, want_scale = reference(x)
        self.assertEqual(scale, want_scale, atol=0, rtol=0)
        self.assertEqual(y, want, atol=0, rtol=0)
        self.assertTrue(bool(((y - x).abs() <= scale.unsqueeze(1) / 2 * (1 + 1e-6)).all()))
        # each row's largest magnitude is kept exactly (it is 7 steps)
        self.assertEqual(y.abs().amax(1), x.abs().amax(1), atol=1e-6, rtol=1e-6)
        for dtype in (torch.float16, torch.bfloat16):
            self.assertEqual(torch_direct.dequantize_rows_int4(q, scale, dtype), y.to(dtype), atol=0, rtol=0)

    def test_chunks_sources_and_progress_do_not_change_the_result(self):
        x = torch.randn(50, 6)
        q, scale = torch_direct.quantize_rows_int4(x, compute="cpu")
        q7, s7 = torch_direct.quantize_rows_int4(x, compute="cpu", chunk_rows=7)
        self.assertEqual((q7, s7), (q, scale), atol=0, rtol=0)
        qu, su = torch_direct.quantize_rows_int4(x.to("unified"), compute="cpu", device="unified")
        self.assertEqual((qu.device.type, su.device.type), ("unified", "unified"))
        self.assertEqual(torch_direct.cpu_alias(qu), q, atol=0, rtol=0)
        self.assertEqual(torch_direct.cpu_alias(su), scale, atol=0, rtol=0)
        seen = []
        qh, _ = torch_direct.quantize_rows_int4(x.half(), compute="cpu", chunk_rows=20, progress=seen.append)
        self.assertEqual(seen, [20, 40, 50])
        self.assertEqual(qh, torch_direct.quantize_rows_int4(x.half().float(), compute="cpu")[0], atol=0, rtol=0)

    def test_bad_input_is_refused(self):
        for quantize in (torch_direct.quantize_rows_fp8, torch_direct.quantize_rows_int4):
            name = quantize.__name__
            for bad in (torch.ones(3, 2, dtype=torch.int32), torch.ones(4), [[1.0, 2.0]]):
                with self.assertRaisesRegex(TypeError, f"{name}: x must be a 2-D floating"):
                    quantize(bad)
            for chunk in (0, -1, True, 2.0):
                with self.assertRaisesRegex(ValueError, f"{name}: chunk_rows"):
                    quantize(torch.ones(2, 2), chunk_rows=chunk)
            with self.assertRaisesRegex(ValueError, f"{name}: compute must be"):
                quantize(torch.ones(2, 2), compute="meta")
            x = torch.ones(20, 4)
            x[13, 1] = float("nan")
            with self.assertRaisesRegex(ValueError, f"{name}: row 13 holds a non-finite value"):
                quantize(x, compute="cpu", chunk_rows=8)
            x[13, 1] = float("inf")
            with self.assertRaisesRegex(ValueError, "row 13"):
                quantize(x, compute="cpu", chunk_rows=8)
        with self.assertRaisesRegex(ValueError, "even number of values, got 3"):
            torch_direct.quantize_rows_int4(torch.ones(2, 3))
        q, scale = torch_direct.quantize_rows_int4(torch.ones(5, 4), compute="cpu")
        with self.assertRaisesRegex(TypeError, "2-D uint8"):
            torch_direct.dequantize_rows_int4(q.float(), scale)
        with self.assertRaisesRegex(ValueError, "one entry per row"):
            torch_direct.dequantize_rows_int4(q, scale[:4])
        with self.assertRaisesRegex(ValueError, "one entry per row"):
            torch_direct.dequantize_rows_int4(q, scale.double())
        with self.assertRaisesRegex(TypeError, "float32, float16 or bfloat16"):
            torch_direct.dequantize_rows_int4(q, scale, torch.int32)


class TestUnpack(TestCase):
    """_features.unpack_int4: the stores' one pass over gathered bytes."""

    def setUp(self):
        self.q, self.scale = torch_direct.quantize_rows_int4(torch.randn(40, 10) * 3, compute="cpu")
        # rows of 5 bytes take the kernel's one-byte runs; of 24 and 64 bytes, its 8-byte runs
        self.widths = {w: torch_direct.quantize_rows_int4(torch.randn(40, w) * 3, compute="cpu") for w in (10, 48, 128)}

    def unpack(self, rows, scale, index, dtype=torch.float32, device="cpu"):
        out = torch.full((rows.shape[0], 2 * rows.shape[1]), float("nan"), dtype=dtype, device=device)
        return _features.unpack_int4(rows, scale, index, out)

    def check(self, device):
        idx = torch.tensor([39, 0, 7, 7, 21])
        for width, (q, scale) in self.widths.items():
            for index in (idx, idx.int()):
                for dtype in (torch.float32, torch.float16, torch.bfloat16):
                    want = torch_direct.dequantize_rows_int4(q[idx], scale[idx], dtype)
                    got = self.unpack(q[idx].to(device), scale.to(device), index.to(device), dtype, device)
                    self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=str((device, width, index.dtype, dtype)))
            # a negative index names its scale from the end, as a gather reads its row; a row
            # whose index lies outside the scales either way is written as zeros
            got = self.unpack(q[1:5].to(device), scale.to(device), torch.tensor([1, 40, -1, -41], device=device),
                              device=device).cpu()
            self.assertEqual(got[0], torch_direct.dequantize_rows_int4(q[1:2], scale[1:2])[0], atol=0, rtol=0)
            self.assertEqual(got[2], torch_direct.dequantize_rows_int4(q[3:4], scale[39:40])[0], atol=0, rtol=0)
            self.assertEqual(got[[1, 3]], torch.zeros(2, width), atol=0, rtol=0)
        # more rows than the kernel's grid has threads (its loop goes round), and an output whose
        # address is not 16-byte aligned (the one-byte runs); each as the ATen ops give it
        q, scale = self.widths[128]
        many = torch.randint(-42, 42, (40000,))
        rows = q[many.clamp(0, 39)]
        at = torch.where(many < 0, many + 40, many)
        want = torch_direct.dequantize_rows_int4(rows, scale[at.clamp(0, 39)], torch.bfloat16)
        want[(at < 0) | (at >= 40)] = 0
        rows, scale, many = rows.to(device), scale.to(device), many.to(device)
        got = self.unpack(rows, scale, many, torch.bfloat16, device)
        self.assertEqual(got.cpu(), want, atol=0, rtol=0)
        shifted = torch.full((40000 * 128 + 1,), float("nan"), dtype=torch.bfloat16, device=device)[1:].view(40000, 128)
        _features.unpack_int4(rows, scale, many, shifted)
        self.assertEqual(shifted.cpu(), want, atol=0, rtol=0)
        empty = self.unpack(self.q[:0].to(device), self.scale.to(device), torch.zeros(0, dtype=torch.long, device=device),
                            device=device)
        self.assertEqual(empty.shape, (0, 10))
        self.check_maps(device)

    def check_maps(self, device):
        # a cache's hits read through rows_at, then the misses written through out_at: the batch
        # as unpacking the gathered rows gives it, each row written once
        idx = torch.tensor([39, 0, 7, 7, 21, 3, 30])
        hot = torch.tensor([0, 7, 21, 30])                       # the cache holds 4 rows
        slot = torch.full((40,), -1, dtype=torch.long)
        slot[hot] = torch.arange(4)
        at = slot[idx]
        miss = torch.nonzero(at < 0).squeeze(1)
        for width, (q, scale) in self.widths.items():
            for index in (idx, idx.int()):
                for dtype in (torch.float32, torch.bfloat16):
                    want = torch_direct.dequantize_rows_int4(q[idx], scale[idx], dtype)
                    d = lambda t: t.to(device)
                    out = torch.full((7, 2 * q.shape[1]), float("nan"), dtype=dtype, device=device)
                    _features.unpack_int4(d(q[hot]), d(scale), d(index), out, rows_at=d(at))
                    self.assertTrue(bool(out.cpu()[miss].isnan().all()))   # the misses are left alone
                    _features.unpack_int4(d(q[idx[miss]]), d(scale), d(index[miss]), out, out_at=d(miss))
                    self.assertEqual(out.cpu(), want, atol=0, rtol=0, msg=str((device, width, index.dtype, dtype)))
            # a slot past the cache writes zeros; a place outside out writes nothing
            out = torch.full((3, 2 * q.shape[1]), float("nan"), device=device)
            _features.unpack_int4(q[hot].to(device), scale.to(device), torch.tensor([0, 7, 21], device=device), out,
                                  rows_at=torch.tensor([0, 4, -1], device=device))
            self.assertEqual(out[0].cpu(), torch_direct.dequantize_rows_int4(q[:1], scale[:1])[0], atol=0, rtol=0)
            self.assertEqual(out[1].cpu(), torch.zeros(q.shape[1] * 2), atol=0, rtol=0)
            self.assertTrue(bool(out[2].isnan().all()))
            out = torch.full((2, 2 * q.shape[1]), float("nan"), device=device)
            _features.unpack_int4(q[:3].to(device), scale.to(device), torch.tensor([0, 1, 2], device=device), out,
                                  out_at=torch.tensor([5, 1, -1], device=device))
            self.assertTrue(bool(out[0].isnan().all()))
            self.assertEqual(out[1].cpu(), torch_direct.dequantize_rows_int4(q[1:2], scale[1:2])[0], atol=0, rtol=0)

    def test_matches_the_aten_arithmetic_on_the_cpu(self):
        self.check("cpu")

    @requires_gpu
    def test_matches_the_aten_arithmetic_on_the_gpu(self):
        self.check("cuda")

    def test_bad_arguments_are_refused(self):
        rows, idx = self.q[:4], torch.arange(4)   # 4 rows of 5 bytes: 10 values each
        out = torch.full((4, 10), float("nan"))
        for args, msg in (((rows.float(), self.scale, idx, out), "rows must be a contiguous 2-D uint8"),
                          ((self.q[:4, ::2], self.scale, idx, torch.empty(4, 6)), "rows must be a contiguous"),
                          ((rows, self.scale.double(), idx, out), "scale must be a contiguous 1-D float32"),
                          ((rows, self.scale, idx[:3], out), "index must be a contiguous 1-D int32/int64 tensor of 4"),
                          ((rows, self.scale, idx.float(), out), "index must be"),
                          ((rows, self.scale, idx, torch.empty(4, 20)), r"out must be a contiguous \[4, 10\]"),
                          ((rows, self.scale, idx, torch.empty(4, 10, dtype=torch.float64)), "out must be float32"),
                          ((rows, self.scale, idx, out, idx.int()), "rows_at must be a contiguous 1-D int64 tensor of 4"),
                          ((rows, self.scale, idx, out, idx[:3]), "rows_at must be"),
                          ((rows, self.scale, idx, out, None, idx.float()), "out_at must be a contiguous 1-D int64"),
                          ((rows, self.scale, idx[:2], out, idx[:2], idx[:3]), "out_at must be .* of 2 entries")):
            with self.assertRaisesRegex(RuntimeError, "unpack_int4: " + msg):
                _features.unpack_int4(*args)
        self.assertTrue(bool(out.isnan().all()))   # a refused call writes nothing


class TestStore(TestCase):
    def setUp(self):
        self.x = torch.randn(500, 12, generator=torch.Generator().manual_seed(1))
        self.q, self.scale = torch_direct.quantize_rows_int4(self.x, compute="cpu")
        self.idx = torch.tensor([450, 3, 499, 400, 399, 0, 450])
        self.want = torch_direct.dequantize_rows_int4(self.q[self.idx], self.scale[self.idx])

    def test_every_kind_gives_the_unpacked_rows(self):
        for kind in KINDS:
            for dtype in (None, torch.bfloat16):
                store = make_int4_store(kind, self.q, self.scale, "cpu", dtype)
                self.assertIsInstance(store, Int4FeatureStore)
                self.assertEqual((store.kind, store.dim, store.row_bytes, store.dtype),
                                 (kind, 12, 6 + 4, dtype or torch.float32))
                for i in (self.idx, self.idx.int()):
                    self.assertEqual(store.gather(i), self.want.to(dtype or torch.float32), atol=0, rtol=0, msg=kind)
                self.assertEqual(store.gather(torch.tensor([], dtype=torch.long)).shape, (0, 12))
                with self.assertRaises(IndexError):
                    store.gather(torch.tensor([500]))
                self.assertEqual(store.stats()["feature_bits"], 4)

    def test_a_cache_holds_packed_rows_beside_every_rows_scale(self):
        # 100 rows of 6 packed bytes: 600 bytes hold 100 rows, 599 hold 99; the scales of all
        # 500 rows sit beside the cache, on the store's device
        degree = torch.arange(500)
        for kind in ("unified", "cpu_centric"):
            for budget, rows in ((600, 100), (599, 99)):
                store = make_int4_store(kind, self.q, self.scale, "cpu", cache_bytes=budget, degree=degree)
                self.assertEqual(store.packed.cache_rows, rows)
                self.assertEqual(store.packed.cache.dtype, torch.uint8)
                self.assertEqual(store.scale.shape, (500,))
                self.assertEqual(store.gather(self.idx), self.want, atol=0, rtol=0, msg=kind)
                # the hottest rows, 400 or 401 up: 450, 499, 450 and (with 100 rows) 400 hit
                self.assertEqual(store.stats()["cache_hit_rate"], (4 if rows == 100 else 3) / 7)
                # of the table's 500 * (6 + 4) bytes, the cache's packed rows (the scales stay
                # where they are on the CPU)
                self.assertEqual(store.stats()["device_share"], rows * 6 / 5000)

    def test_a_negative_index_reads_its_rows_scale(self):
        # the unified store's gather reads a negative index from the end; the scale the
        # unpacking reads through it is that row's too, cached (a table of slots, or the first
        # rows) or not
        idx = torch.tensor([-1, 2, -500, 450])
        want = torch_direct.dequantize_rows_int4(self.q[idx], self.scale[idx])
        for kw in ({}, {"cache_bytes": 600, "degree": torch.arange(500)},
                   {"cache_bytes": 600, "degree": torch.arange(500, 0, -1)}):
            store = make_int4_store("unified", self.q, self.scale, "cpu", **kw)
            self.assertEqual(store.gather(idx), want, atol=0, rtol=0, msg=str(kw))

    def test_a_cache_sized_by_its_share_of_the_table(self):
        # the packed rows a share of the table's bytes holds, the scales on the device counted
        # (on the CPU they are not device memory; on a GPU, tests below)
        degree = torch.arange(500)
        for share in (0.5, 0.2):
            store = make_int4_store("unified", self.q, self.scale, "cpu", cache_share=share, degree=degree)
            self.assertEqual(store.packed.cache_rows, int(share * 5000) // 6)
            self.assertLessEqual(store.device_share, share)
            self.assertEqual(store.gather(self.idx), self.want, atol=0, rtol=0)
        for kw, msg in (({"cache_share": 0.5, "cache_bytes": 60}, "not both"), ({"cache_share": 2}, "cache_share must be"),
                        ({"cache_share": 0.5, "degree": None}, "a cache needs degree="),
                        ({"cache_share": 0.5, "kind": "gpu_resident"}, "whole table in device memory")):
            kw = {"degree": degree, "kind": "unified", **kw}
            with self.assertRaisesRegex(ValueError, msg):
                make_int4_store(kw.pop("kind"), self.q, self.scale, "cpu", **kw)

    def test_bad_stores_and_scales_are_refused(self):
        with self.assertRaisesRegex(TypeError, "2-D uint8 table"):
            make_int4_store("unified", self.x, self.scale, "cpu")
        with self.assertRaisesRegex(ValueError, "one entry per row"):
            make_int4_store("unified", self.q, self.scale[:10], "cpu")
        with self.assertRaisesRegex(TypeError, "bytes as they are"):
            Int4FeatureStore(make_feature_store("unified", self.x, "cpu"), self.scale)
        with self.assertRaisesRegex(TypeError, "bytes as they are"):
            Int4FeatureStore(make_feature_store("unified", self.q, "cpu", torch.float32), self.scale)
        with self.assertRaisesRegex(TypeError, "float32, float16 or bfloat16"):
            make_int4_store("cpu_centric", self.q, self.scale, "cpu", torch.int64)

    @requires_gpu
    def test_gpu_stores_give_the_unpacked_rows(self):
        degree = torch.arange(500)
        want = self.want.to(torch.bfloat16).cuda()
        stores = [make_int4_store("unified", self.q, self.scale, "cuda", torch.bfloat16),
                  make_int4_store("unified", self.q, self.scale, "cuda", torch.bfloat16, cpu_threads=2, cpu_share=1.0),
                  make_int4_store("unified", self.q, self.scale, "cuda", torch.bfloat16, cache_bytes=1000,
                                  degree=degree),
                  make_int4_store("unified", self.q, self.scale, "cuda", torch.bfloat16, cache_bytes=1000,
                                  degree=degree, cpu_threads=2, cpu_share=1.0),
                  # a cache of the first rows (scores falling with the row number): no table of slots
                  make_int4_store("unified", self.q, self.scale, "cuda", torch.bfloat16, cache_bytes=1000,
                                  degree=degree.flip(0), cpu_threads=2, cpu_share=1.0),
                  make_int4_store("gpu_resident", self.q, self.scale, "cuda", torch.bfloat16)]
        for store in stores:
            for i in (self.idx, self.idx.cuda()):
                got = store.gather(i)
                self.assertEqual(got.device.type, "cuda")
                self.assertEqual(got, want, atol=0, rtol=0, msg=repr(store.packed))
        # on the GPU: every row's scale (500 * 4 bytes) besides what each store copied there
        shares = [s.stats()["device_share"] for s in stores]
        self.assertEqual(shares, [2000 / 5000, 2000 / 5000] + [(166 * 6 + 2000) / 5000] * 3 + [1.0])
        self.assertTrue(stores[4].packed.prefix)
        self.assertIsNone(stores[4].packed.slot)
        # half of the table's 5000 bytes, of which every row's scale on the GPU takes 2000
        half = make_int4_store("unified", self.q, self.scale, "cuda", torch.bfloat16, cache_share=0.5, degree=degree,
                               cpu_threads=2, cpu_share=1.0)
        self.assertEqual(half.packed.cache_rows, 500 // 6)
        self.assertLessEqual(half.device_share, 0.5)
        self.assertEqual(half.gather(self.idx.cuda()), want, atol=0, rtol=0)


class TestTrain(TestCase):
    def test_the_three_pipelines_agree_and_the_record_names_the_format(self):
        from torch_direct.__main__ import main
        with tempfile.TemporaryDirectory() as root:
            recs = {}
            for kind in ("unified", "cpu_centric", "gpu_resident"):
                path = os.path.join(root, f"{kind}.json")
                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                    rc = main(["train", "--dataset", "tiny", "--root", root, "--epochs", "2", "--device", "cpu",
                               "--pipeline", kind, "--feature-dtype", "int4", "--no-progress", "--json", path])
                self.assertEqual(rc, 0, out.getvalue())
                recs[kind] = json.load(open(path))
                self.assertEqual(recs[kind]["feature_dtype"], "4-bit integers with row scales")
                self.assertIn("features as 4-bit integers", out.getvalue())
                self.assertIn("features held as 4-bit integers", out.getvalue())
            self.assertEqual(len({(r["epochs"][-1]["loss"], r["test_acc"]) for r in recs.values()}), 1, msg=str(recs))


if __name__ == "__main__":
    run_tests()
