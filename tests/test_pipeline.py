"""Feature stores and the pipelined loader."""

import gc
import os
import tempfile
import threading
import time
import unittest
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from common import HAS_GPU, fp8_reference, requires_gpu
from torch_direct.gnn.graph import NeighborSampler, load_dataset
from torch_direct.gnn.pipeline import KINDS, CachedFeatureStore, PipelinedLoader, make_feature_store, to_pyg, to_pyg_graph_store

try:
    import torch_geometric  # noqa: F401
    HAS_PYG = True
except ImportError:
    HAS_PYG = False


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith(("torch_direct-loader", "torch_direct-sampler"))]


class _Data:
    ds = None

    @classmethod
    def get(cls):
        if cls.ds is None:
            cls.tmp = tempfile.TemporaryDirectory()
            cls.ds = load_dataset("tiny", root=cls.tmp.name, show_progress=False)
        return cls.ds


class TestFeatureStores(TestCase):
    def setUp(self):
        self.x = torch.randn(500, 12, generator=torch.Generator().manual_seed(0))
        self.idx = torch.tensor([7, 0, 499, 7, 123])

    def test_every_kind_gathers_rows_on_cpu(self):
        for kind in KINDS:
            store = make_feature_store(kind, self.x, "cpu")
            for idx in (self.idx, self.idx.int(), torch.empty(0, dtype=torch.long)):
                self.assertEqual(store.gather(idx), self.x[idx.long()], msg=kind)
            self.assertEqual(store.kind, kind)

    def test_cast_from_half(self):
        xh = self.x.half()
        for kind in KINDS:
            out = make_feature_store(kind, xh, "cpu", torch.float32).gather(self.idx)
            self.assertEqual(out.dtype, torch.float32)
            self.assertEqual(out, xh[self.idx].float(), msg=kind)

    def test_unified_table_is_used_in_place(self):
        u = self.x.to("unified")
        store = make_feature_store("unified", u, "cpu")
        self.assertIs(store.table, u)
        self.assertEqual(store.gather(self.idx), self.x[self.idx])
        # The other stores accept a unified table too.
        for kind in ("cpu_centric", "gpu_resident"):
            self.assertEqual(make_feature_store(kind, u, "cpu").gather(self.idx), self.x[self.idx])

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "unknown feature store"):
            make_feature_store("nvme", self.x, "cpu")
        with self.assertRaisesRegex(ValueError, "whole table in device memory"):
            make_feature_store("gpu_resident", self.x, "cpu", cache_bytes=1024, degree=torch.arange(500))
        with self.assertRaisesRegex(ValueError, "needs degree"):
            make_feature_store("cpu_centric", self.x, "cpu", cache_bytes=1024)
        with self.assertRaisesRegex(ValueError, "degree has 3 entries for 500 rows"):
            make_feature_store("unified", self.x, "cpu", cache_bytes=1024, degree=torch.arange(3))
        with self.assertRaisesRegex(TypeError, "uncached FeatureStore"):
            CachedFeatureStore(self.x, 1024, torch.arange(500))
        with self.assertRaisesRegex(TypeError, "2-D"):
            make_feature_store("unified", self.x[0], "cpu")
        with self.assertRaisesRegex(ValueError, "cpu' or a CUDA"):
            make_feature_store("unified", self.x, "meta")
        with self.assertRaisesRegex(ValueError, "cache_bytes"):
            make_feature_store("unified", self.x, "cpu", cache_bytes=-1)
        with self.assertRaisesRegex(ValueError, "max_sms applies to the 'unified' store only"):
            make_feature_store("gpu_resident", self.x, "cpu", max_sms=4)
        for bad in (0, -2, 1.5, True):
            with self.assertRaisesRegex(ValueError, "max_sms must be a positive int"):
                make_feature_store("unified", self.x, "cpu", max_sms=bad)
        with self.assertRaisesRegex(ValueError, "cpu_threads applies to the 'unified' store only"):
            make_feature_store("cpu_centric", self.x, "cpu", cpu_threads=2)
        for bad in (-1, 1.5, True):
            with self.assertRaisesRegex(ValueError, "cpu_threads must be an int >= 0"):
                make_feature_store("unified", self.x, "cpu", cpu_threads=bad)
        # On the CPU the rows are all gathered there: no hybrid share, the same rows.
        store = make_feature_store("unified", self.x, "cpu", cpu_threads=2)
        self.assertNotIn("cpu_threads", store.stats())
        self.assertEqual(store.gather(self.idx), self.x[self.idx])
        for kind in KINDS:
            store = make_feature_store(kind, self.x, "cpu")
            with self.assertRaisesRegex(TypeError, "1-D int32/int64"):
                store.gather(torch.tensor([0.5]))
            with self.assertRaises(IndexError):
                store.gather(torch.tensor([500]))

    def test_cache_wraps_any_store(self):
        # The cache of hot rows over either store, on the CPU: same rows, counted hits, and a
        # budget counted in the table's own bytes (the cache keeps rows as the table does).
        degree = torch.arange(500)                 # rows 400.. are the hottest
        idx = torch.tensor([450, 3, 499, 400, 399, 0, 450])
        for kind in ("unified", "cpu_centric"):
            for x, dtype, elem in ((self.x, None, 4), (self.x, torch.float64, 4), (self.x.half(), torch.float32, 2)):
                store = make_feature_store(kind, x, "cpu", dtype, cache_bytes=100 * 12 * elem, degree=degree)
                self.assertIsInstance(store, CachedFeatureStore)
                self.assertEqual((store.kind, store.cache_rows), (kind, 100))
                self.assertEqual(store.cache.dtype, x.dtype)
                got = store.gather(idx)
                self.assertEqual(got, x[idx].to(dtype or x.dtype), msg=kind)
                self.assertEqual(store.stats()["cache_hit_rate"], 4 / 7)
                self.assertEqual(store.gather(torch.tensor([], dtype=torch.long)).shape, (0, 12))
                with self.assertRaises(IndexError):
                    store.gather(torch.tensor([500]))
        # Cached rows are served from the cache: change the cache and a hit shows it, a miss not.
        store = make_feature_store("unified", self.x, "cpu", cache_bytes=100 * 12 * 4, degree=degree)
        store.cache.fill_(7.0)
        got = store.gather(torch.tensor([450, 3]))
        self.assertEqual(got[0], torch.full((12,), 7.0))
        self.assertEqual(got[1], self.x[3])
        # A budget below one row: no cache, every row from the store.
        store = make_feature_store("unified", self.x, "cpu", cache_bytes=10, degree=degree)
        self.assertEqual(store.cache_rows, 0)
        self.assertEqual(store.gather(idx), self.x[idx])
        self.assertNotIn("cache_hit_rate", store.stats())

    def test_a_cache_of_the_first_rows(self):
        # Scores that never rise with the row number (a table in --reorder frequency order): the
        # cache holds the first rows (a tie at the edge taken in row order), and the split gather
        # finds a row's slot from its number, with no table of slots; the fused pass keeps its
        # table. The rows are the table's either way.
        degree = torch.arange(500, 0, -1).float()
        degree[95:110] = degree[95]                 # a tie across the cache's edge
        idx = torch.tensor([450, 3, 99, 100, 0, 450, 105])
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        for x, kw, want in ((self.x, {}, self.x[idx]), (q, {"scale": scale}, fp8_reference(q, scale, idx))):
            row_bytes = 12 * x.element_size() + (4 if kw else 0)
            for mode in ("split", "fused"):
                with torch_direct.experimental(cached_gather=mode):
                    store = make_feature_store("unified", x, "cpu", cache_bytes=100 * row_bytes, degree=degree, **kw)
                self.assertTrue(store.prefix)
                self.assertEqual(store.cache_rows, 100)
                self.assertEqual(store.slot is None, mode == "split")
                msg = str((x.dtype, mode))
                for i in (idx, idx.int()):
                    self.assertEqual(store.gather(i), want, atol=0, rtol=0, msg=msg)
                self.assertEqual(store.stats()["cache_hit_rate"], 3 / 7, msg=msg)   # rows 3, 99 and 0
                # on the CPU the store's scales are not device memory: the cache counts its own copy
                self.assertEqual(store.device_bytes, 100 * row_bytes, msg=msg)
        # a score that rises anywhere ranks by topk as before: the hottest rows, not the first
        store = make_feature_store("unified", self.x, "cpu", cache_bytes=100 * 48, degree=torch.arange(500))
        self.assertFalse(store.prefix)
        self.assertIsNotNone(store.slot)

    def test_a_cache_sized_by_its_share_of_the_table(self):
        # cache_share: the most rows whose bytes, with what the store holds on its device
        # already, stay within that share of the table's bytes
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        degree = torch.arange(500)
        for x, kw in ((self.x, {}), (self.x.half(), {}), (q, {"scale": scale})):
            for share in (0.5, 0.3, 1.0):
                store = make_feature_store("unified", x, "cpu", cache_share=share, degree=degree, **kw)
                self.assertLessEqual(store.device_share, share)
                self.assertGreater(store.device_share + store.row_bytes / store.table_bytes, share)
                self.assertEqual(store.cache_rows, int(share * store.table_bytes) // store.row_bytes)
        # less than a row: no row cached, as with a cache_bytes below one row
        self.assertEqual(make_feature_store("unified", self.x, "cpu", cache_share=0.001, degree=degree).cache_rows, 0)
        for kw, err, msg in (({"cache_share": 0.5, "cache_bytes": 100}, ValueError, "not both"),
                             ({"cache_share": 0.0}, ValueError, r"cache_share must be a number in \(0, 1\]"),
                             ({"cache_share": 1.5}, ValueError, "cache_share must be"),
                             ({"cache_share": True}, ValueError, "cache_share must be")):
            with self.assertRaisesRegex(err, msg):
                make_feature_store("unified", self.x, "cpu", degree=degree, **kw)
        with self.assertRaisesRegex(ValueError, "a cache needs degree="):
            make_feature_store("unified", self.x, "cpu", cache_share=0.5)
        with self.assertRaisesRegex(ValueError, "gpu_resident store holds its whole table"):
            make_feature_store("gpu_resident", self.x, "cpu", cache_share=0.5, degree=degree)

    def test_fp8_tables(self):
        # A float8 table with its row scales in every kind, cached or not: the rows come back
        # as q * scale in the dtype asked (float32 by default); a cache row costs its 12 bytes
        # and a 4-byte scale, so 16 bytes a row.
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        idx = torch.tensor([450, 3, 499, 400, 399, 0, 450])
        want = fp8_reference(q, scale, idx)
        for kind in KINDS:
            for dtype in (None, torch.float16):
                store = make_feature_store(kind, q, "cpu", dtype, scale=scale)
                self.assertEqual((store.scaled, store.row_bytes, store.dtype), (True, 16, dtype or torch.float32))
                self.assertEqual(store.gather(idx), want.to(dtype or torch.float32), atol=0, rtol=0, msg=kind)
        for kind in ("unified", "cpu_centric"):
            store = make_feature_store(kind, q, "cpu", scale=scale, cache_bytes=100 * 16, degree=torch.arange(500))
            self.assertEqual((store.cache_rows, store.cache.dtype), (100, torch.float8_e4m3fn))
            self.assertEqual(store.gather(idx), want, atol=0, rtol=0, msg=kind)
            self.assertEqual(store.stats()["cache_hit_rate"], 4 / 7)
            # of the table's 500 * 16 bytes the cache holds 100 rows and their scales; on the CPU
            # the stores copy no scales of their own
            self.assertEqual((store.table_bytes, store.device_bytes), (8000, 1600))
            self.assertEqual(store.stats()["device_share"], 0.2)
        with self.assertRaisesRegex(ValueError, "per-row scale"):
            make_feature_store("unified", q, "cpu")
        with self.assertRaisesRegex(TypeError, "float8_e4m3fn table"):
            make_feature_store("unified", self.x, "cpu", scale=scale)
        with self.assertRaisesRegex(ValueError, "one entry per row"):
            make_feature_store("gpu_resident", q, "cpu", scale=scale[:10])
        with self.assertRaisesRegex(TypeError, "float32, float16 or bfloat16"):
            make_feature_store("cpu_centric", q, "cpu", torch.int64, scale=scale)

    def _cases(self):
        """(table, dtype asked, scale) for every table type the fused pass serves."""
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        return [(self.x, None, None), (self.x, torch.bfloat16, None), (self.x.half(), torch.float32, None),
                (self.x.bfloat16(), torch.float16, None), (q, None, scale), (q, torch.float16, scale)]

    def test_fused_cached_gather_gives_the_split_gathers_rows(self):
        # The one-pass cached gather (the default) against the split one
        # (TORCH_DIRECT_EXPERIMENTAL=cached_gather=split), on the CPU: the same rows, bit for
        # bit, and the same hit rate.
        degree = torch.arange(500)
        idx = torch.tensor([450, 3, 499, 400, 399, 0, 450])
        for kind in ("unified", "cpu_centric"):
            for x, dtype, scale in self._cases():
                kw = dict(scale=scale, cache_bytes=100 * (12 * x.element_size() + (4 if scale is not None else 0)),
                          degree=degree)
                with torch_direct.experimental(cached_gather="split"):
                    split = make_feature_store(kind, x, "cpu", dtype, **kw)
                fused = make_feature_store(kind, x, "cpu", dtype, **kw)
                self.assertIsNotNone(fused._fused)
                self.assertIsNone(split._fused)
                msg = str((kind, x.dtype, dtype))
                for i in (idx, idx.int()):
                    self.assertEqual(fused.gather(i), split.gather(i), atol=0, rtol=0, msg=msg)
                self.assertEqual(fused.stats()["cache_hit_rate"], 4 / 7, msg=msg)
                self.assertEqual(fused.gather(torch.tensor([], dtype=torch.long)).shape, (0, 12))
                for bad in (500, -1):
                    with self.assertRaisesRegex(IndexError, f"index {bad} is out of bounds"):
                        fused.gather(torch.tensor([3, bad]))
        with torch_direct.experimental(cached_gather="fused"):
            # Cached rows are served from the cache: change it and a hit shows it, a miss not.
            store = make_feature_store("unified", self.x, "cpu", cache_bytes=100 * 12 * 4, degree=degree)
            store.cache.fill_(7.0)
            got = store.gather(torch.tensor([450, 3]))
            self.assertEqual(got[0], torch.full((12,), 7.0))
            self.assertEqual(got[1], self.x[3])
            # Without a cache (a budget below one row) there is nothing to fuse.
            self.assertIsNone(make_feature_store("unified", self.x, "cpu", cache_bytes=10, degree=degree)._fused)
        # Types the pass does not cast between (a float64 table) take the split form.
        x64 = self.x.double()
        store = make_feature_store("unified", x64, "cpu", cache_bytes=100 * 12 * 8, degree=degree)
        self.assertIsNone(store._fused)
        self.assertEqual(store.gather(idx), x64[idx], atol=0, rtol=0)
        with torch_direct.experimental(cached_gather="both"):
            with self.assertRaisesRegex(ValueError, "cached_gather must be split or fused"):
                make_feature_store("unified", self.x, "cpu", cache_bytes=1000, degree=degree)

    def test_split_gather_reads_misses_in_address_order(self):
        # The split cached gather hands the store it wraps its misses sorted (rows of host memory
        # read in address order), each row still written at its own place in the batch; a
        # unified store under hybrid_split=address sorts them itself, an all-in-GPU one needs
        # no order. The rows are those of the table either way (4-bit rows included).
        from torch_direct.gnn.pipeline.packed import make_int4_store
        degree = torch.arange(500)   # rows 400-499 cached
        idx = torch.tensor([450, 399, 3, 499, 250, 0, 450, 3])
        q, qscale = torch_direct.quantize_rows_int4(self.x)
        from torch_direct.gnn.pipeline import cache
        for kind, setting, sorted_ in (("unified", None, True), ("cpu_centric", None, True),
                                       ("unified", "address", False), ("unified", "batch", False)):
            with torch_direct.experimental(cached_gather="split", hybrid_split=setting if setting != "batch" else None), \
                    mock.patch.object(cache, "SORT_MISSES", setting != "batch"):   # batch: as before, for comparisons
                store = make_feature_store(kind, self.x, "cpu", cache_bytes=100 * 12 * 4, degree=degree)
                packed = make_int4_store(kind, q, qscale, "cpu", cache_bytes=100 * 6, degree=degree)
            for s, want in ((store, self.x[idx]),
                            (packed, torch_direct.dequantize_rows_int4(q, qscale)[idx])):
                cached = s.packed if s is packed else s
                seen = []
                read = cached.store.read
                with mock.patch.object(cached.store, "read", lambda at, device: seen.append(at) or read(at, device)):
                    got = s.gather(idx)
                msg = str((kind, setting, s is packed))
                self.assertEqual(got, want, atol=0, rtol=0, msg=msg)
                self.assertEqual(len(seen), 1, msg=msg)
                self.assertEqual(seen[0].tolist(), [0, 3, 3, 250, 399] if sorted_ else [399, 3, 250, 0, 3], msg=msg)

    def test_cached_gather_pass(self):
        # The pass itself: entry j's row written at pos[j], misses and bad rows counted (a slot
        # past the cache: written as zeros), its arguments checked before anything is written.
        from torch_direct.gnn.pipeline import _features
        table = torch.randn(50, 8)
        cache = torch.randn(4, 8)
        slot = torch.full((50,), -1, dtype=torch.int32)
        slot[torch.tensor([5, 9, 11])] = torch.tensor([0, 1, 2], dtype=torch.int32)
        slot[20] = 4                                   # past the cache's 4 rows
        keys = torch.tensor([5, 6, 9, 20, 49, 11])
        pos = torch.tensor([3, 0, 5, 1, 2, 4])
        out = torch.full((6, 8), float("nan"))
        counts = torch.zeros(2, dtype=torch.int64)
        _features.cached_gather(table, cache, slot, keys, pos, out, None, None, counts, 0)
        want = torch.stack([cache[0], table[6], cache[1], torch.zeros(8), table[49], cache[2]])
        self.assertEqual(out[pos], want, atol=0, rtol=0)
        self.assertEqual(counts.tolist(), [2, 1])
        _features.cached_gather(table, cache, slot, keys, None, out, None, None, counts, 0)
        self.assertEqual(out, want, atol=0, rtol=0)
        self.assertEqual(counts.tolist(), [4, 2])      # counts accumulate
        bad_pos = torch.tensor([0, 1, 2, 3, 4, 6])      # a position past out: nothing written there
        _features.cached_gather(table, cache, slot, keys, bad_pos, out.clone(), None, None, counts, 0)
        self.assertEqual(counts.tolist(), [6, 4])
        before = out.clone()
        for args, msg in (
                ((table, cache, slot.long(), keys, None, out, None, None, counts, 0), "slot must be"),
                ((table, cache.half(), slot, keys, None, out, None, None, counts, 0), "cache must be"),
                ((table, cache, slot, keys.float(), None, out, None, None, counts, 0), "index must be"),
                ((table, cache, slot, keys, pos[:3], out, None, None, counts, 0), "pos must be"),
                ((table, cache, slot, keys, None, out[:3], None, None, counts, 0), "out must be"),
                ((table, cache, slot, keys, None, out, torch.ones(50), torch.ones(4), counts, 0), "float8 table only"),
                ((table, cache, slot, keys, None, out, None, None, counts[:1], 0), "counters must be"),
                ((table, cache, slot, keys, None, out, None, None, counts, -1), "max_sms"),
                ((table.long(), cache.long(), slot, keys, None, out, None, None, counts, 0), "table must be")):
            with self.assertRaisesRegex(RuntimeError, msg):
                _features.cached_gather(*args)
        self.assertEqual(out, before)
        self.assertEqual(counts.tolist(), [6, 4])

    def test_table_on_huge_pages(self):
        # The experimental setting feature_pages=huge: the unified store's table is a copy on
        # anonymous memory advised for huge pages, pinned in place; it outlives every local
        # reference to the mapping, and gathers the same rows (float8 too).
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        for x, sc in ((self.x, None), (self.x.half(), None), (q, scale)):
            with torch_direct.experimental(feature_pages="huge"):
                store = make_feature_store("unified", x, "cpu", scale=sc)
            gc.collect()
            self.assertEqual(store.table.device.type, "unified")
            self.assertEqual(store.table.dtype, x.dtype)
            self.assertNotEqual(store.table.data_ptr(), x.data_ptr())
            self.assertEqual(store.table.cpu().view(torch.uint8), x.view(torch.uint8))
            plain = make_feature_store("unified", x, "cpu", scale=sc)
            self.assertEqual(store.gather(self.idx), plain.gather(self.idx), atol=0, rtol=0)
            # what the kernel granted is reported (it may refuse: 0 is a valid answer), only there
            self.assertTrue(0.0 <= store.stats()["huge_page_share"] <= 1.0, store.stats())
            self.assertNotIn("huge_page_share", plain.stats())
        # a table already in unified memory (train's float8 table is made there) moves too
        u = self.x.to("unified")
        with torch_direct.experimental(feature_pages="huge"):
            store = make_feature_store("unified", u, "cpu")
        self.assertNotEqual(store.table.data_ptr(), u.data_ptr())
        self.assertEqual(store.table.cpu(), self.x, atol=0, rtol=0)
        self.assertEqual(make_feature_store("unified", u, "cpu").table.data_ptr(), u.data_ptr())
        with torch_direct.experimental(feature_pages="giant"):
            with self.assertRaisesRegex(ValueError, "feature_pages must be small, huge or driver, not 'giant'"):
                make_feature_store("unified", self.x, "cpu")

    def test_huge_page_share_reads_the_tables_mappings(self):
        # The share comes from the AnonHugePages of the mappings the tensor's bytes lie in, and
        # only those; a file that cannot be read gives None.
        from torch_direct.gnn.pipeline.pages import huge_page_share
        t = torch.zeros(1 << 20, dtype=torch.uint8)
        lo = t.data_ptr()
        with tempfile.TemporaryDirectory() as d:
            smaps = os.path.join(d, "smaps")
            with open(smaps, "w") as f:
                f.write(f"{lo - 4096:x}-{lo + (1 << 20):x} rw-p 00000000 00:00 0\n"
                        "Size:               1028 kB\nAnonHugePages:       512 kB\nVmFlags: rd wr mr mw me ac\n"
                        f"{lo + (4 << 20):x}-{lo + (8 << 20):x} rw-p 00000000 00:00 0\n"
                        "AnonHugePages:      4096 kB\n\n")   # a blank line is skipped
            self.assertEqual(huge_page_share(t, smaps), 0.5)
            self.assertIsNone(huge_page_share(t, os.path.join(d, "absent")))
        self.assertIsNone(huge_page_share(t[:0]))

    def test_hybrid_split_setting(self):
        # hybrid_split=address changes only which rows a hybrid gather's CPU threads take (GPU
        # only): on the CPU the same rows, and a value that is not a split is refused.
        with torch_direct.experimental(hybrid_split="address"):
            store = make_feature_store("unified", self.x, "cpu", cpu_threads=2)
            self.assertEqual(store.hybrid_split, "address")
            self.assertEqual(store.gather(self.idx), self.x[self.idx])
        self.assertEqual(make_feature_store("unified", self.x, "cpu").hybrid_split, "index")
        with torch_direct.experimental(hybrid_split="nearest"):
            with self.assertRaisesRegex(ValueError, "hybrid_split must be index or address, not 'nearest'"):
                make_feature_store("unified", self.x, "cpu")

    def test_hybrid_cpu_share(self):
        # a fixed CPU share of each hybrid gather's rows (GPU only): kept by the store, the same
        # rows on the CPU, and a share outside [0, 1] or for another store refused
        store = make_feature_store("unified", self.x, "cpu", cpu_threads=2, cpu_share=1)
        self.assertEqual(store.cpu_share, 1.0)
        self.assertEqual(store.gather(self.idx), self.x[self.idx])
        self.assertIsNone(make_feature_store("unified", self.x, "cpu").cpu_share)
        for bad in (1.5, -0.1, float("nan"), "half", True):
            with self.assertRaisesRegex(ValueError, "cpu_share must be a number from 0 to 1 or None"):
                make_feature_store("unified", self.x, "cpu", cpu_share=bad)
        with self.assertRaisesRegex(ValueError, "cpu_share applies to the 'unified' store only"):
            make_feature_store("gpu_resident", self.x, "cpu", cpu_share=0.0)

    @unittest.skipUnless(HAS_GPU, "the hybrid gather's CPU share applies to a GPU gather")
    def test_hybrid_cpu_share_on_the_gpu(self):
        for share in (0.0, 0.5, 1.0):
            store = make_feature_store("unified", self.x, "cuda", cpu_threads=2, cpu_share=share)
            self.assertEqual(store.stats()["cpu_share"], share)
            self.assertEqual(store.gather(self.idx.cuda()).cpu(), self.x[self.idx])

    @unittest.skipIf(HAS_GPU, "checks the CPU-only message")
    def test_cuda_device_without_gpu(self):
        with self.assertRaisesRegex(RuntimeError, "no usable CUDA GPU"):
            make_feature_store("unified", self.x, "cuda")

    @unittest.skipUnless(HAS_PYG, "torch_geometric is not installed")
    def test_pyg_adapter(self):
        fs = to_pyg(make_feature_store("unified", self.x, "cpu"), group_name="paper")
        self.assertEqual(fs.get_tensor(group_name="paper", attr_name="x", index=self.idx), self.x[self.idx])
        self.assertEqual(fs.get_tensor(group_name="paper", attr_name="x", index=None), self.x)
        self.assertEqual(tuple(fs.get_tensor_size(group_name="paper", attr_name="x")), (500, 12))
        self.assertEqual(len(fs.get_all_tensor_attrs()), 1)
        with self.assertRaises(Exception):
            fs.put_tensor(self.x, group_name="paper", attr_name="y")

    @unittest.skipUnless(HAS_PYG, "torch_geometric is not installed")
    def test_pyg_graph_store(self):
        from torch_direct.gnn.graph import CSRGraph
        ei = torch.tensor([[0, 1, 2, 2, 3, 4], [1, 2, 0, 1, 0, 3]])
        g = CSRGraph.from_edge_index(ei, 5)
        for graph in (g, g.to("unified")):
            gs = to_pyg_graph_store(graph)
            row, colptr = gs.get_edge_index(edge_type=None, layout="csc")
            self.assertEqual(colptr, g.rowptr)
            self.assertEqual(row, g.col.long())
            src, dst = gs.get_edge_index(edge_type=None, layout="coo")
            self.assertEqual(torch.stack([src, dst]), g.to_edge_index())
            rowptr, col = gs.get_edge_index(edge_type=None, layout="csr")
            pairs = sorted(zip(src.tolist(), dst.tolist()))
            got = [(s, int(c)) for s in range(5) for c in col[rowptr[s]:rowptr[s + 1]]]
            self.assertEqual(sorted(got), pairs)
            self.assertEqual([a.size for a in gs.get_all_edge_attrs()], [(5, 5)])
        with self.assertRaisesRegex(TypeError, "CSRGraph"):
            to_pyg_graph_store(ei)

    @unittest.skipIf(HAS_PYG, "checks the message without torch_geometric")
    def test_pyg_adapter_without_pyg(self):
        with self.assertRaisesRegex(ImportError, "torch_geometric"):
            to_pyg(make_feature_store("unified", self.x, "cpu"))
        with self.assertRaisesRegex(ImportError, "torch_geometric"):
            to_pyg_graph_store(None)

    @requires_gpu
    def test_every_kind_gathers_onto_the_gpu_on_a_side_stream(self):
        s = torch.cuda.Stream()
        idx = self.idx.cuda()
        for kind in KINDS:
            store = make_feature_store(kind, self.x, "cuda")
            out = store.gather(idx, stream=s)
            s.synchronize()
            self.assertEqual(out.device.type, "cuda")
            self.assertEqual(out.cpu(), self.x[self.idx], msg=kind)

    @requires_gpu
    def test_gpu_cache_of_hot_rows(self):
        degree = torch.arange(500)                 # rows 400.. are the hottest
        row_bytes = 12 * 4
        store = make_feature_store("unified", self.x, "cuda", cache_bytes=100 * row_bytes, degree=degree)
        self.assertEqual(store.cache_rows, 100)
        idx = torch.tensor([450, 3, 499, 400, 399, 0, 450]).cuda()
        self.assertEqual(store.gather(idx).cpu(), self.x[idx.cpu()])
        self.assertEqual(store.stats()["cache_hit_rate"], 4 / 7)
        with self.assertRaisesRegex(ValueError, "degree"):
            make_feature_store("unified", self.x, "cuda", cache_bytes=1024)

    def test_hybrid_read_puts_rows_back_and_casts_them(self):
        # The hybrid read's own steps (the split's sort and its inverse, the bytes of float8 rows
        # viewed back, the one cast and scale of the rows read) driven on the CPU, where the
        # device's gather stands in for the CPU threads and the kernel (which need a GPU; the
        # test above runs them): every split gives a plain read's rows, bit for bit.
        cpu = torch.device("cpu")
        idx = torch.randint(0, 500, (30, 100))
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        for x, dtype, kw in ((self.x, None, {}), (self.x.half(), torch.float32, {}),
                             (q, None, {"scale": scale}), (q, torch.bfloat16, {"scale": scale})):
            store = make_feature_store("unified", x, "cpu", dtype, **kw)
            want = store.gather(idx.reshape(-1)).view(30, 100, -1)
            for split in ("index", "address"):
                store.hybrid_split = split
                got = store._read_hybrid(idx, cpu)
                self.assertEqual(got.dtype, want.dtype)
                self.assertEqual(got, want, atol=0, rtol=0, msg=str((x.dtype, dtype, split)))
                self.assertEqual(store._read_hybrid(idx[:0], cpu).shape, (0, 100, x.shape[1]))

    def test_store_index_bounds_setting(self):
        # store_index_bounds=known (the default) passes the bounds of the stores' own indices to
        # gather (the cache's slots, the hybrid read's permutation): the same rows, bit for bit,
        # as checked; a value that is not a mode is refused.
        cpu = torch.device("cpu")
        idx = torch.randint(0, 500, (30, 100))
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        for x, kw in ((self.x, {}), (q, {"scale": scale})):
            with torch_direct.experimental(store_index_bounds="checked"):
                checked = make_feature_store("unified", x, "cpu", **kw)
            self.assertFalse(checked.known_bounds)
            want = checked.gather(idx.reshape(-1)).view(30, 100, -1)
            with torch_direct.experimental(store_index_bounds="known"):
                store = make_feature_store("unified", x, "cpu", **kw)
                cached = make_feature_store("unified", x, "cpu", cache_bytes=100 * 64, degree=torch.arange(500), **kw)
            self.assertTrue(store.known_bounds)
            self.assertEqual(cached._slot_bounds, (0, cached.cache_rows - 1))
            self.assertEqual(store._read_hybrid(idx, cpu), want, atol=0, rtol=0)
            self.assertEqual(cached.gather(idx.reshape(-1)), want.view(3000, -1), atol=0, rtol=0)
        self.assertTrue(make_feature_store("unified", self.x, "cpu").known_bounds)   # the default
        with torch_direct.experimental(store_index_bounds="trusted"):
            with self.assertRaisesRegex(ValueError, "store_index_bounds must be checked or known, not 'trusted'"):
                make_feature_store("unified", self.x, "cpu")

    @requires_gpu
    def test_a_gpu_cache_of_the_first_rows_shares_the_stores_scales(self):
        # a float8 store's scales sit on the GPU for every row; a cache of the first rows reads
        # theirs from there (a view, counted once) and finds slots without a table of them
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        idx = torch.tensor([450, 3, 99, 100, 0, 499, 450]).cuda()
        degree = torch.arange(500, 0, -1)
        store = make_feature_store("unified", q, "cuda", torch.float32, scale=scale, cpu_threads=2,
                                   cache_bytes=100 * 16, degree=degree)
        self.assertTrue(store.prefix)
        self.assertIsNone(store.slot)
        self.assertEqual(store.cache_scale.data_ptr(), store.store.scale.data_ptr())
        self.assertEqual(store.device_bytes, 100 * 12 + 500 * 4)   # the cache's rows, every row's scale once
        for _ in range(2):
            self.assertEqual(store.gather(idx).cpu(), fp8_reference(q, scale, idx.cpu()), atol=0, rtol=0)

    @requires_gpu
    def test_store_index_bounds_on_the_gpu(self):
        # the cache's hits and the hybrid read's cast gathered with the bounds the stores know,
        # without a pass over those indices: the same rows as checked gathers
        idx = torch.randint(0, 500, (3000,)).cuda()
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        cache = {"cache_bytes": 100 * 16, "degree": torch.arange(500)}
        for x, kw, want in ((self.x.half(), {}, self.x.half()[idx.cpu()].float()),
                            (q, {"scale": scale}, fp8_reference(q, scale, idx.cpu()))):
            for split in ("index", "address"):
                with torch_direct.experimental(store_index_bounds="known", hybrid_split=split):
                    store = make_feature_store("unified", x, "cuda", torch.float32, cpu_threads=2, **kw, **cache)
                self.assertEqual(store._slot_bounds, (0, store.cache_rows - 1))
                for _ in range(3):
                    self.assertEqual(store.gather(idx).cpu(), want, atol=0, rtol=0, msg=str((x.dtype, split)))

    @requires_gpu
    def test_hybrid_gathers_keep_rows(self):
        # CPU threads take a share of each gather (with and without the cache, with a cast from
        # fp16 done on the GPU after the hybrid gather): the same rows.
        # Each split: the CPU threads on the first part of the index as it comes, or on the
        # farthest rows (hybrid_split=address, the index sorted and the rows put back).
        idx = torch.randint(0, 500, (3000,)).cuda()
        half = self.x.half()
        for split in ("index", "address"):
            for kw in ({}, {"cache_bytes": 100 * 12 * 2, "degree": torch.arange(500)}):
                for x, dtype in ((self.x, None), (half, torch.float32)):
                    with torch_direct.experimental(hybrid_split=split):
                        store = make_feature_store("unified", x, "cuda", dtype, cpu_threads=2, **kw)
                    self.assertEqual(getattr(store, "store", store).hybrid_split, split)  # under a cache too
                    self.assertEqual(store.stats()["cpu_threads"], 2)
                    for _ in range(3):   # the first calls at the default share, then measured ones
                        got = store.gather(idx)
                        self.assertEqual(got.dtype, dtype or x.dtype)
                        self.assertEqual(got.cpu(), x[idx.cpu()].to(got.dtype), msg=str((split, kw.keys(), x.dtype)))
                    self.assertEqual(store.gather(idx[:0]).shape, (0, x.shape[1]))
        # a float8 table: the CPU share copies the rows' bytes, scaled on the GPU as the kernel would
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        want = fp8_reference(q, scale, idx.cpu())
        for split in ("index", "address"):
            for kw in ({}, {"cache_bytes": 100 * 16, "degree": torch.arange(500)}):
                with torch_direct.experimental(hybrid_split=split):
                    store = make_feature_store("unified", q, "cuda", scale=scale, cpu_threads=2, **kw)
                for _ in range(3):
                    got = store.gather(idx)
                    self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=str((split, kw.keys())))
                self.assertEqual(store.gather(idx[:0]).shape, (0, q.shape[1]))

    @requires_gpu
    def test_fp8_tables_on_the_gpu(self):
        # Every kind onto the GPU, on a side stream, with and without the cache: the same rows
        # as the CPU's q * scale.
        q, scale = torch_direct.quantize_rows_fp8(self.x, compute="cpu")
        idx = torch.randint(0, 500, (3000,))
        want = fp8_reference(q, scale, idx)
        s = torch.cuda.Stream()
        for kind in KINDS:
            kws = [{}] if kind == "gpu_resident" else [{}, {"cache_bytes": 100 * 16, "degree": torch.arange(500)}]
            for kw in kws:
                store = make_feature_store(kind, q, "cuda", scale=scale, **kw)
                out = store.gather(idx.cuda(), stream=s)
                s.synchronize()
                self.assertEqual(out.cpu(), want, atol=0, rtol=0, msg=str((kind, kw.keys())))

    @requires_gpu
    def test_fused_cached_gather_on_the_gpu(self):
        # The one-pass cached gather against the split one on a GPU, on a side stream: the same
        # rows bit for bit and the same hit rate, for every table type, with the index read as
        # given and sorted first (as on tables of 8 GiB and more), on all SMs and on one.
        from torch_direct.gnn.pipeline import cache
        degree = torch.arange(500)
        idx = torch.randint(0, 500, (3000,), generator=torch.Generator().manual_seed(1)).cuda()
        s = torch.cuda.Stream()
        for x, dtype, scale in self._cases():
            kw = dict(scale=scale, cache_bytes=100 * (12 * x.element_size() + (4 if scale is not None else 0)),
                      degree=degree)
            with torch_direct.experimental(cached_gather="split"):
                split = make_feature_store("unified", x, "cuda", dtype, **kw)
            self.assertIsNone(split._fused)
            want = split.gather(idx, stream=s)
            s.synchronize()
            # (index sorted first as on a large table, SM cap, read kernel: None = the choice by
            # table size, the grid-stride loop here; rowblock = one block per row, a large table's,
            # under a cap each block looping over rows)
            for large, sms, kernel in ((False, None, None), (True, None, "rowblock"), (False, 1, None),
                                       (False, None, "rowblock"), (True, 1, "rowblock")):
                with torch_direct.experimental(cached_gather="fused"), \
                        mock.patch.object(cache, "LARGE_TABLE_BYTES", 0 if large else cache.LARGE_TABLE_BYTES):
                    fused = make_feature_store("unified", x, "cuda", dtype, max_sms=sms, **kw)
                msg = str((x.dtype, dtype, large, sms, kernel))
                self.assertEqual(fused._fused[2], large, msg=msg)
                with torch_direct.experimental(gather_kernel=kernel):   # read by each pass
                    got = fused.gather(idx, stream=s)
                s.synchronize()
                self.assertEqual(got, want, atol=0, rtol=0, msg=msg)
                self.assertEqual(fused.stats()["cache_hit_rate"], split.stats()["cache_hit_rate"], msg=msg)
        # A width no vector load divides (13 columns), and int32 indices.
        x13 = torch.randn(500, 13)
        with torch_direct.experimental(cached_gather="fused"):
            fused = make_feature_store("unified", x13, "cuda", cache_bytes=100 * 13 * 4, degree=degree)
        self.assertEqual(fused.gather(idx.int()).cpu(), x13[idx.cpu()])
        # Rows outside the table: never read, written as zeros, and refused when the device is
        # next waited for.
        with torch_direct.experimental(cached_gather="fused"):
            fused = make_feature_store("unified", self.x, "cuda", cache_bytes=100 * 12 * 4, degree=degree)
        for kernel in (None, "rowblock"):
            with torch_direct.experimental(gather_kernel=kernel):
                got = fused.gather(torch.tensor([3, 500, -1, 450]).cuda()).cpu()
            self.assertEqual(got[0], self.x[3])
            self.assertEqual(got[3], self.x[450])
            self.assertEqual(got[1:3], torch.zeros(2, 12))
        with self.assertRaisesRegex(IndexError, "4 gathered rows lay outside the table"):
            fused.stats()
        # The hybrid gather's CPU threads read the table themselves: that store stays split.
        with torch_direct.experimental(cached_gather="fused"):
            hybrid = make_feature_store("unified", self.x, "cuda", cpu_threads=2, cache_bytes=100 * 48,
                                        degree=degree)
        self.assertIsNone(hybrid._fused)

    @requires_gpu
    def test_gather_capped_to_a_few_sms(self):
        # The same rows with the kernel on one or a few SMs, with and without the cache.
        idx = torch.randint(0, 500, (3000,)).cuda()
        for kw in ({}, {"cache_bytes": 100 * 12 * 4, "degree": torch.arange(500)}):
            for sms in (1, 3):
                store = make_feature_store("unified", self.x, "cuda", max_sms=sms, **kw)
                self.assertEqual(store.stats()["max_sms"], sms)
                self.assertEqual(store.gather(idx).cpu(), self.x[idx.cpu()], msg=str((kw.keys(), sms)))


class _ListSampler:
    """Counts calls; raises on call ``fail_at`` (to test error propagation)."""

    def __init__(self, inner, fail_at=None, delay=0.0):
        self.inner, self.fail_at, self.delay = inner, fail_at, delay
        self.calls = 0

    def sample(self, seeds):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyError("sampler broke on purpose")
        time.sleep(self.delay)
        return self.inner.sample(seeds)


class TestPipelinedLoader(TestCase):
    def setUp(self):
        self.ds = _Data.get()
        self.sampler = NeighborSampler(self.ds.graph, [5, 3])
        self.store = make_feature_store("unified", self.ds.x, "cpu")
        self.ids = self.ds.split["train"]

    def tearDown(self):
        self.assertEqual(_loader_threads(), [])

    def loader(self, sampler=None, **kw):
        kw.setdefault("labels", self.ds.y)
        return PipelinedLoader(sampler or self.sampler, self.store, self.ids, 128, **kw)

    def test_batches_are_complete_and_correct(self):
        for prefetch, ahead, merge in ((0, False, 1), (1, False, 1), (3, False, 1), (1, True, 1), (3, True, 1),
                                       (2, True, 3)):
            with self.loader(prefetch=prefetch, sample_ahead=ahead, merge_gathers=merge) as loader:
                seen = []
                for b in loader:
                    self.assertEqual(b.x, self.ds.x[b.n_id])
                    self.assertEqual(b.y, self.ds.y[b.n_id[:b.batch_size]])
                    self.assertEqual(b.adjs[-1][2][1], b.batch_size)
                    seen.append(b.n_id[:b.batch_size])
                self.assertEqual(torch.cat(seen).sort().values, self.ids.sort().values)
                self.assertEqual(len(seen), len(loader))
                st = loader.stats()
                self.assertEqual(st["batches"], len(seen))
                self.assertEqual(set(st["busy"]), {"sample", "gather", "transfer"})
                self.assertGreater(st["busy"]["sample"], 0)
                self.assertLessEqual(sum(st["exposed"].values()), st["wait"] + 1e-9)
                # the loader's threads, per role: how many, their CPU time and their wait for a core
                want = {} if prefetch == 0 else ({"sample": 1, "loader": 1} if ahead else {"loader": 1})
                self.assertEqual({r: u["threads"] for r, u in st["threads"].items()}, want)
                for role, use in st["threads"].items():
                    self.assertGreater(use["cpu_s"], 0, msg=role)   # each sampled or gathered batches
                    if os.path.exists("/proc/thread-self/schedstat"):
                        self.assertGreaterEqual(use["run_delay_s"], 0.0)

    def test_gather_parts_of_an_epoch(self):
        # The split cached gather's host wait for its misses and its read of them, per epoch,
        # summed over two gathering threads: one lookup a gather, one read of misses where any;
        # with two, the threads' waits too: for a sampled batch (a take each, the end's and the
        # last ones' included), for their turn (each gather, the end's too), for the queue.
        rows, dim = self.ds.x.shape
        with torch_direct.experimental(cached_gather="split"):   # a quarter of the rows cached
            store = make_feature_store("unified", self.ds.x, "cpu", cache_bytes=rows // 4 * dim * 4,
                                       degree=torch.arange(rows))
        for workers in (1, 2):
            with PipelinedLoader(self.sampler, store, self.ids, 128, labels=self.ds.y, prefetch=2,
                                 sample_ahead=True, gather_workers=workers) as loader:
                for _ in range(2):   # each epoch counts its own gathers
                    n = 0
                    for b in loader:
                        self.assertEqual(b.x, self.ds.x[b.n_id])
                        n += 1
                    parts = loader.stats()["gather_parts"]
                    waits = {"thread_wait_sampled", "thread_wait_turn", "thread_wait_queue"}
                    self.assertEqual(set(parts), {"lookup_wait", "hits", "misses"} | (waits if workers > 1 else set()),
                                     msg=workers)
                    if workers > 1:
                        self.assertEqual(parts["thread_wait_queue"]["calls"], n)
                        self.assertEqual(parts["thread_wait_turn"]["calls"], n + 1)
                        self.assertGreaterEqual(parts["thread_wait_sampled"]["calls"], n + 1)
                    self.assertEqual(parts["lookup_wait"]["calls"], n)        # merge_gathers=1: a gather a batch
                    self.assertEqual(parts["hits"]["calls"], n)
                    self.assertTrue(0 < parts["misses"]["calls"] <= n)
                    self.assertTrue(all(p["s"] >= 0 for p in parts.values()))
        with self.loader(prefetch=1) as loader:   # no cache: no parts to report
            list(loader)
            self.assertEqual(loader.stats()["gather_parts"], {})

    def test_same_batches_with_and_without_prefetch(self):
        def epoch(prefetch, ahead=False):
            sampler = NeighborSampler(self.ds.graph, [5, 3], seed=3)
            with self.loader(sampler, prefetch=prefetch, generator=torch.Generator().manual_seed(1),
                             sample_ahead=ahead) as ld:
                return [b.n_id for b in ld]
        a, b, c = epoch(0), epoch(2), epoch(2, ahead=True)
        self.assertEqual(len(a), len(b))
        self.assertEqual(len(a), len(c))
        for u, v, w in zip(a, b, c):
            self.assertEqual(u, v)
            self.assertEqual(u, w)

    def test_stopping_an_epoch_early_leaves_no_thread(self):
        loader = self.loader(prefetch=2)
        for i, _ in enumerate(loader):
            if i == 1:
                break
        self.assertEqual(len(_loader_threads()), 1)   # still prefetching until stopped
        loader.close()
        self.assertEqual(_loader_threads(), [])
        # A new epoch stops the previous one as well.
        it = iter(loader)
        next(it)
        it2 = iter(loader)
        self.assertTrue(it.done)
        self.assertEqual(len(list(it2)), len(loader))
        self.assertEqual(_loader_threads(), [])
        with self.loader(prefetch=2) as ld:
            next(iter(ld))
        self.assertEqual(_loader_threads(), [])

    def test_dropping_the_loader_stops_its_thread(self):
        for ahead in (False, True):
            loader = self.loader(prefetch=2, sample_ahead=ahead)
            it = iter(loader)
            next(it)
            del it, loader
            gc.collect()
            deadline = time.monotonic() + 5
            while _loader_threads() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(_loader_threads(), [], msg=f"sample_ahead={ahead}")

    def test_sample_ahead_thread_stops_with_the_epoch(self):
        loader = self.loader(prefetch=2, sample_ahead=True)
        for i, _ in enumerate(loader):
            if i == 1:
                break
        self.assertEqual(sorted(t.name for t in _loader_threads()),
                         ["torch_direct-loader", "torch_direct-sampler"])
        loader.close()
        self.assertEqual(_loader_threads(), [])
        # Sampling is timed in its own thread, gathering in the producer.
        with self.loader(prefetch=2, sample_ahead=True) as ld:
            n = sum(1 for _ in ld)
            st = ld.stats()
        self.assertEqual(st["batches"], n)
        self.assertGreater(st["busy"]["sample"], 0)
        self.assertGreater(st["busy"]["gather"], 0)

    def test_several_sampling_threads_give_the_same_batches_in_order(self):
        from torch_direct.gnn.graph import GPUNeighborSampler

        def epochs(threads):
            gs = GPUNeighborSampler(self.ds.graph, [5, 3], seed=2, device="cpu")   # the GPU steps, on the CPU
            out = []
            with self.loader(gs, prefetch=2, sample_ahead=threads,
                             generator=torch.Generator().manual_seed(1)) as loader:
                for _ in range(2):   # the second epoch's streams follow the first's
                    batches = []
                    for i, b in enumerate(loader):
                        if i == 0 and threads > 1:
                            self.assertEqual(sorted(t.name for t in _loader_threads()),
                                             ["torch_direct-loader"] + [f"torch_direct-sampler-{k}"
                                                                        for k in range(threads)])
                        self.assertEqual(b.x, self.ds.x[b.n_id])
                        batches.append((b.n_id, [ei for ei, _, _ in b.adjs]))
                    out.append(batches)
                    self.assertGreater(loader.stats()["busy"]["sample"], 0)
            return out

        one = epochs(1)
        for threads in (2, 3):
            many = epochs(threads)
            for e1, e2 in zip(one, many):
                self.assertEqual(len(e1), len(e2))
                for (n1, a1), (n2, a2) in zip(e1, e2):
                    self.assertEqual(n1, n2)
                    self.assertEqual(a1, a2)
        self.assertNotEqual(one[0][0][0], one[1][0][0])   # each epoch its own batches

    def test_batches_sampled_together_are_the_same(self):
        from torch_direct.gnn.graph import GPUNeighborSampler
        epochs = {}
        for per_call in (1, 3):
            gs = GPUNeighborSampler(self.ds.graph, [5, 3], seed=2, device="cpu", batches_per_call=per_call)
            with self.loader(gs, prefetch=2, sample_ahead=True, generator=torch.Generator().manual_seed(1)) as ld:
                epochs[per_call] = [(b.n_id, b.adjs[0][0]) for b in ld]
        self.assertEqual(len(epochs[1]), len(epochs[3]))
        for (n1, e1), (n3, e3) in zip(epochs[1], epochs[3]):
            self.assertEqual(n1, n3)
            self.assertEqual(e1, e3)
        gs = GPUNeighborSampler(self.ds.graph, [5, 3], device="cpu", batches_per_call=2)
        with self.assertRaisesRegex(ValueError, "sample_ahead > 1 takes one batch per sampler call"):
            self.loader(gs, prefetch=2, sample_ahead=2)

    def test_sampling_thread_errors_surface_and_stop_the_others(self):
        from torch_direct.gnn.graph import GPUNeighborSampler

        class Failing(GPUNeighborSampler):
            def sample(self, seeds, *, stream=None):
                if stream == 4:
                    raise KeyError("sampler broke on purpose")
                return super().sample(seeds, stream=stream)

        gs = Failing(self.ds.graph, [5, 3], device="cpu")
        with self.loader(gs, prefetch=2, sample_ahead=3, shuffle=False) as loader:
            got = 0
            with self.assertRaisesRegex(KeyError, "on purpose"):
                for _ in loader:
                    got += 1
            self.assertEqual(got, 4)
        self.assertEqual(_loader_threads(), [])

    def test_gathering_threads_give_the_same_batches_in_order(self):
        from torch_direct.gnn.graph import GPUNeighborSampler

        def epochs(workers, ahead, merge):
            gs = GPUNeighborSampler(self.ds.graph, [5, 3], seed=2, device="cpu")   # the GPU steps, on the CPU
            out = []
            with self.loader(gs, prefetch=2, sample_ahead=ahead, merge_gathers=merge, gather_workers=workers,
                             generator=torch.Generator().manual_seed(1)) as loader:
                for _ in range(2):
                    batches = []
                    for i, b in enumerate(loader):
                        if i == 0 and workers > 1:
                            self.assertEqual(sorted(t.name for t in _loader_threads()
                                                    if t.name.startswith("torch_direct-loader")),
                                             [f"torch_direct-loader-{k}" for k in range(workers)])
                        self.assertEqual(b.x, self.ds.x[b.n_id])
                        self.assertEqual(b.y, self.ds.y[b.n_id[:b.batch_size]])
                        batches.append((b.n_id, [ei for ei, _, _ in b.adjs]))
                    out.append(batches)
                    st = loader.stats()
                    self.assertEqual(st["batches"], len(batches))
                    self.assertGreater(st["busy"]["gather"], 0)
            return out

        for ahead, merge in ((1, 1), (2, 1), (1, 2)):
            one = epochs(1, ahead, merge)
            self.assertGreater(len(one[0]), 8)   # more gathers than threads and queue places
            for workers, turns in ((2, "wait"), (3, "wait"), (2, "deposit"), (3, "deposit")):
                with torch_direct.experimental(gather_turns=turns):
                    many = epochs(workers, ahead, merge)
                for e1, e2 in zip(one, many, strict=True):
                    self.assertEqual(len(e1), len(e2))
                    for (n1, a1), (n2, a2) in zip(e1, e2):
                        self.assertEqual(n1, n2, msg=f"workers={workers} {turns} sample_ahead={ahead} merge={merge}")
                        self.assertEqual(a1, a2)

    def test_deposited_gathers_let_a_thread_go_on(self):
        # gather_turns=deposit: the first gather waits (up to 5 s) until two later ones are done.
        # Only a thread that left its finished gather to be queued in its turn and took another
        # can do both while the first is still inside its gather; the batches still come in order.
        store = make_feature_store("unified", self.ds.x, "cpu")
        inner, lock, two_more = store.read, threading.Lock(), threading.Event()
        state = {"reads": 0, "done": 0, "met": None}

        def read(idx, device):
            with lock:
                state["reads"] += 1
                first = state["reads"] == 1
            if first:
                state["met"] = two_more.wait(5)   # False: no other gather got done meanwhile
            out = inner(idx, device)
            with lock:
                state["done"] += 1
                if state["done"] >= 2 and not first:
                    two_more.set()
            return out

        store.read = read
        with torch_direct.experimental(gather_turns="deposit"):
            with PipelinedLoader(self.sampler, store, self.ids, 128, labels=self.ds.y, prefetch=2, sample_ahead=True,
                                 gather_workers=2, shuffle=False) as loader:
                got = [b.n_id[:b.batch_size] for b in loader]
                waits = loader.stats()["gather_parts"]
        self.assertTrue(state["met"])
        self.assertEqual(torch.cat(got), self.ids)   # in the epoch's order all the same
        self.assertEqual(waits["thread_wait_queue"]["calls"], len(got))   # one a batch put into the queue
        self.assertEqual(_loader_threads(), [])

    def test_gathering_threads_gather_at_once(self):
        # The first read waits (up to 5 s) for a second one to start: only a second gathering
        # thread can start it, while the first thread is inside its gather.
        store = make_feature_store("unified", self.ds.x, "cpu")
        inner, lock, met = store.read, threading.Lock(), threading.Event()
        state = {"now": 0, "most": 0, "reads": 0}

        def read(idx, device):
            with lock:
                state["now"] += 1
                state["reads"] += 1
                first = state["reads"] == 1
                state["most"] = max(state["most"], state["now"])
                if state["now"] >= 2:
                    met.set()
            try:
                if first:
                    met.wait(5)
                return inner(idx, device)
            finally:
                with lock:
                    state["now"] -= 1

        store.read = read
        with PipelinedLoader(self.sampler, store, self.ids, 128, labels=self.ds.y, prefetch=2, sample_ahead=True,
                             gather_workers=2, shuffle=False) as loader:
            got = [b.n_id[:b.batch_size] for b in loader]
        self.assertTrue(met.is_set())
        self.assertEqual(state["most"], 2)
        self.assertEqual(torch.cat(got), self.ids)   # in the epoch's order all the same

    def test_gathering_threads_count_a_caches_hits_once(self):
        # Gathers of several threads at once count into one store: the hit rate is the one
        # thread's, for the one-pass cached gather and the split one.
        from torch_direct.gnn.graph import access_frequency
        degree = access_frequency(self.ds.graph, 3)
        for mode in ("fused", "split"):
            rates = {}
            for workers in (1, 3):
                with torch_direct.experimental(cached_gather=mode):
                    store = make_feature_store("unified", self.ds.x, "cpu", cache_bytes=self.ds.x[0].nbytes * 300,
                                               degree=degree)
                self.assertEqual(store._fused is None, mode == "split")
                sampler = NeighborSampler(self.ds.graph, [5, 3], seed=3)
                with PipelinedLoader(sampler, store, self.ids, 64, prefetch=2, sample_ahead=True,
                                     gather_workers=workers, generator=torch.Generator().manual_seed(5)) as loader:
                    for _ in range(3):
                        for b in loader:
                            self.assertEqual(b.x, self.ds.x[b.n_id])
                    self.assertEqual(loader.stats()["threads"]["loader"]["threads"], workers)   # one a gatherer
                rates[workers] = (store.lookups, store.stats()["cache_hit_rate"])
            self.assertEqual(rates[1], rates[3], msg=mode)
            self.assertGreater(rates[1][1], 0.0)

    def test_gathering_thread_errors_surface_in_their_turn(self):
        store = make_feature_store("unified", self.ds.x, "cpu")
        inner, third = store.read, int(self.ids[256])

        def read(idx, device):
            if int(idx[0]) == third:   # the third batch's first seed
                raise KeyError("gather broke on purpose")
            return inner(idx, device)

        store.read = read
        for workers, turns in ((2, "wait"), (3, "wait"), (2, "deposit"), (3, "deposit")):
            with torch_direct.experimental(gather_turns=turns), \
                    PipelinedLoader(self.sampler, store, self.ids, 128, labels=self.ds.y, prefetch=2, shuffle=False,
                                    sample_ahead=True, gather_workers=workers) as loader:
                got = []
                with self.assertRaisesRegex(KeyError, "on purpose"):
                    for b in loader:
                        got.append(b.n_id[:b.batch_size])
                self.assertEqual(torch.cat(got), self.ids[:256], msg=turns)   # the two before it, in order
            self.assertEqual(_loader_threads(), [])

    def test_worker_error_surfaces_in_the_loop(self):
        for prefetch, ahead, workers, turns in ((0, False, 1, "wait"), (2, False, 1, "wait"), (2, True, 1, "wait"),
                                                (2, True, 2, "wait"), (2, True, 3, "wait"), (2, True, 3, "deposit")):
            sampler = _ListSampler(self.sampler, fail_at=3)
            with torch_direct.experimental(gather_turns=turns), \
                    self.loader(sampler, prefetch=prefetch, sample_ahead=ahead, gather_workers=workers) as loader:
                got = 0
                with self.assertRaisesRegex(KeyError, "on purpose"):
                    for _ in loader:
                        got += 1
                self.assertEqual(got, 2)
            self.assertEqual(_loader_threads(), [])

    def test_queue_is_bounded(self):
        sampler = _ListSampler(self.sampler)
        with self.loader(sampler, prefetch=2) as loader:
            it = iter(loader)
            next(it)
            time.sleep(0.3)
            self.assertLessEqual(sampler.calls, 1 + 2 + 1)   # in hand + queued + one being put
            self.assertLess(sampler.calls, len(loader))

    def test_slow_sampler_is_exposed(self):
        sampler = _ListSampler(self.sampler, delay=0.02)
        with self.loader(sampler, prefetch=1) as loader:
            n = sum(1 for _ in loader)
            st = loader.stats()
        self.assertGreaterEqual(st["busy"]["sample"], 0.02 * n * 0.9)
        self.assertGreater(st["exposed"]["sample"], st["exposed"]["transfer"])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "batch_size"):
            PipelinedLoader(self.sampler, self.store, self.ids, 0)
        with self.assertRaisesRegex(ValueError, "prefetch"):
            PipelinedLoader(self.sampler, self.store, self.ids, 8, prefetch=-1)
        with self.assertRaisesRegex(ValueError, "sample_ahead needs prefetch > 0"):
            PipelinedLoader(self.sampler, self.store, self.ids, 8, prefetch=0, sample_ahead=True)
        with self.assertRaisesRegex(ValueError, "sample_ahead must be a bool or an int >= 0"):
            PipelinedLoader(self.sampler, self.store, self.ids, 8, sample_ahead=-1)
        with self.assertRaisesRegex(ValueError, "sample_ahead=2 needs a GPUNeighborSampler"):
            PipelinedLoader(self.sampler, self.store, self.ids, 8, sample_ahead=2)
        for bad in (0, -1, True, 1.5):
            with self.assertRaisesRegex(ValueError, "gather_workers must be an int >= 1"):
                PipelinedLoader(self.sampler, self.store, self.ids, 8, sample_ahead=True, gather_workers=bad)
        with self.assertRaisesRegex(ValueError, "gather_workers=2 takes its batches from sampling threads"):
            PipelinedLoader(self.sampler, self.store, self.ids, 8, gather_workers=2)
        with self.assertRaisesRegex(TypeError, "FeatureStore"):
            PipelinedLoader(self.sampler, self.ds.x, self.ids, 8)
        with self.assertRaisesRegex(TypeError, "sample"):
            PipelinedLoader(object(), self.store, self.ids, 8)
        with self.assertRaisesRegex(TypeError, "node_ids"):
            PipelinedLoader(self.sampler, self.store, self.ids.float(), 8)
        with self.assertRaisesRegex(ValueError, "stream_priority must be one of normal, high, got 'low'"):
            PipelinedLoader(self.sampler, self.store, self.ids, 8, stream_priority="low")
        with self.loader(stream_priority="high") as loader:   # no CUDA stream on the CPU: no effect
            self.assertIsNone(loader.stream)
            self.assertEqual(sum(b.batch_size for b in loader), self.ids.numel())

    def test_evaluation_gathers_on_one_thread(self):
        # Evaluation batches are many times a training batch: several gathering threads would each
        # hold one gather's rows at once (what ran a GPU out of memory), so evaluation takes one.
        import argparse
        from torch_direct.gnn.graph import load_dataset
        from torch_direct.gnn.pipeline.batches import PipelinedBatches
        from torch_direct.gnn.pipeline.options import add_arguments
        p = argparse.ArgumentParser()
        add_arguments(p)
        with tempfile.TemporaryDirectory() as d:
            args = p.parse_args(["--root", d, "--dataset", "tiny", "--device", "cpu", "--pipeline", "unified",
                                 "--sample-ahead", "--gather-workers", "3", "--no-progress"])
            ds = load_dataset("tiny", root=d, seed=0, show_progress=False)
            batches = PipelinedBatches(args, ds, torch.device("cpu"), say=lambda *a, **k: None)
            with batches.train as train, batches.evaluation(ds.split["valid"], [5, 5], 1) as valid:
                self.assertEqual((train.gather_workers, valid.gather_workers), (3, 1))
                self.assertEqual(sum(b.batch_size for b in valid), ds.split["valid"].numel())

    @requires_gpu
    def test_high_priority_streams_give_the_same_batches(self):
        from torch_direct.gnn.graph import GPUNeighborSampler
        store = make_feature_store("unified", self.ds.x, "cuda")
        for ahead in (False, True):
            epochs = {}
            for priority in ("normal", "high"):
                gs = GPUNeighborSampler(self.ds.graph.to("unified"), [5, 3], seed=4)
                with PipelinedLoader(gs, store, self.ids, 128, labels=self.ds.y.cuda(), prefetch=2, shuffle=False,
                                     sample_ahead=ahead, stream_priority=priority) as loader:
                    # CUDA: a lower number is a higher priority; torch maps the request into its range
                    streams = [loader.stream] + loader._stages.sample_streams
                    for st in streams:
                        if priority == "high":
                            self.assertLess(st.priority, 0)
                        else:
                            self.assertEqual(st.priority, 0)
                    epochs[priority] = [(b.n_id.cpu(), b.x.cpu()) for b in loader]
            self.assertEqual(len(epochs["normal"]), len(epochs["high"]))
            for (n_a, x_a), (n_b, x_b) in zip(epochs["normal"], epochs["high"]):
                self.assertEqual(n_a, n_b)
                self.assertEqual(x_a, x_b)

    @requires_gpu
    def test_gathering_threads_on_the_gpu(self):
        from torch_direct.gnn.graph import GPUNeighborSampler, access_frequency
        stores = {kind: (lambda kind=kind: make_feature_store(kind, self.ds.x, "cuda")) for kind in KINDS}
        # the split cached gather (a count of the misses waits for the device) over the hybrid one
        # (its CPU share waits for its index): the gathers that make a thread wait
        stores["unified, cached, hybrid"] = lambda: make_feature_store(
            "unified", self.ds.x, "cuda", cache_bytes=self.ds.x[0].nbytes * 200,
            degree=access_frequency(self.ds.graph, 3), cpu_threads=2)
        for name, make in stores.items():
            epochs, hits = {}, {}
            for workers in (1, 2):
                store = make()
                gs = GPUNeighborSampler(self.ds.graph.to("unified"), [5, 3], seed=4)
                with PipelinedLoader(gs, store, self.ids, 128, labels=self.ds.y.cuda(), prefetch=2, shuffle=False,
                                     sample_ahead=2, gather_workers=workers) as loader:
                    self.assertEqual(len(set(map(id, loader._stages.gather_streams))), workers)
                    epochs[workers] = [(b.n_id.cpu(), b.x.cpu(), b.y.cpu()) for b in loader]
                hits[workers] = store.stats().get("cache_hit_rate")
            self.assertEqual(len(epochs[1]), len(epochs[2]), msg=name)
            for (n1, x1, y1), (n2, x2, y2) in zip(epochs[1], epochs[2]):
                self.assertEqual(n1, n2, msg=name)
                self.assertEqual(x2, self.ds.x[n2], msg=name)
                self.assertEqual(x1, x2, msg=name)
                self.assertEqual(y1, y2, msg=name)
            self.assertEqual(hits[1], hits[2], msg=name)

    @requires_gpu
    def test_gpu_batches_on_a_side_stream(self):
        from torch_direct.gnn.graph import GPUNeighborSampler
        for kind in KINDS:
            store = make_feature_store(kind, self.ds.x, "cuda")
            for ahead in (False, True):   # sampling on the producer's stream, or on a stream of its own
                gs = GPUNeighborSampler(self.ds.graph.to("unified"), [5, 3])
                with PipelinedLoader(gs, store, self.ids, 128, labels=self.ds.y.cuda(), prefetch=2,
                                     sample_ahead=ahead) as loader:
                    self.assertIsNotNone(loader.stream)
                    n = 0
                    for b in loader:
                        self.assertEqual(b.x.device.type, "cuda")
                        self.assertEqual(b.x.cpu(), self.ds.x[b.n_id.cpu()])
                        self.assertEqual(b.y.cpu(), self.ds.y[b.n_id[:b.batch_size].cpu()])
                        n += 1
                    self.assertEqual(n, len(loader))
                    self.assertGreater(loader.stats()["busy"]["gather"], 0)
                    self.assertGreater(loader.stats()["busy"]["sample"], 0)


if __name__ == "__main__":
    run_tests()
