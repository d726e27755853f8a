"""The unified allocator: sizing, caching, stream safety, pin_inplace."""

import os
import subprocess
import sys
import textwrap

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from common import HAS_GPU, requires_gpu


def stats():
    return torch_direct.memory_stats()


class TestAllocator(TestCase):
    def test_large_blocks_are_sized_exactly(self):
        torch_direct.empty_cache()
        before = stats()["reserved_bytes"]
        n = 64 * 1024 * 1024 + 12345  # not a power of two
        u = torch.empty(n, dtype=torch.uint8, device="unified")
        grown = stats()["reserved_bytes"] - before
        self.assertGreaterEqual(grown, n)
        self.assertLessEqual(grown, n * 1.01)
        self.assertEqual(torch_direct._C._block_kind(u), "exact")
        del u
        self.assertEqual(stats()["cached_large_bytes"], grown)  # kept for reuse
        torch_direct.empty_cache()
        self.assertEqual(stats()["reserved_bytes"], before)
        self.assertEqual(stats()["cached_large_bytes"], 0)

    def test_freed_large_block_serves_a_request_of_about_its_size(self):
        torch_direct.empty_cache()
        n = 8 << 20
        u = torch.empty(n, dtype=torch.uint8, device="unified")
        reserved = stats()["reserved_bytes"]
        del u
        # Up to 1/8 smaller: the cached block, no new pages.
        v = torch.empty(n - n // 9, dtype=torch.uint8, device="unified")
        self.assertEqual(stats()["reserved_bytes"], reserved)
        self.assertEqual(stats()["cached_large_bytes"], 0)
        v.fill_(7)
        self.assertTrue(bool((v.cpu() == 7).all()))
        del v
        # Larger, or far smaller: fresh pages sized exactly; the cached block stays.
        for size in (n + 4096, n // 2):
            reserved = stats()["reserved_bytes"]
            w = torch.empty(size, dtype=torch.uint8, device="unified")
            self.assertGreaterEqual(stats()["reserved_bytes"] - reserved, size)
            self.assertLessEqual(stats()["reserved_bytes"] - reserved, size * 1.01)
            self.assertGreaterEqual(stats()["cached_large_bytes"], n)
            del w
        torch_direct.empty_cache()
        self.assertEqual(stats()["cached_large_bytes"], 0)

    def test_large_cache_is_bounded(self):
        code = textwrap.dedent("""
            import torch, torch_direct
            stats = torch_direct.memory_stats
            base = stats()["reserved_bytes"]
            u = torch.empty(8 << 20, dtype=torch.uint8, device="unified")
            del u
            print(stats()["reserved_bytes"] - base, stats()["cached_large_bytes"])
        """)
        for limit_mb, cached in (("0", 0), ("4", 0), ("16", 8 << 20)):
            env = dict(os.environ, TORCH_DIRECT_UNIFIED_CACHE_MB=limit_mb)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.split(), [str(cached), str(cached)], limit_mb)

    def test_block_shared_with_a_forked_child_is_not_reused(self):
        # The child maps the parent's pages (MAP_SHARED): after the parent frees
        # its tensor, a new one must not land on pages the child still reads.
        code = textwrap.dedent("""
            import os, torch, torch_direct
            torch.set_num_threads(1)
            u = torch.full((4 << 20,), 1.0, device="unified")  # (on the GPU where there is one)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                os.read(r, 1)  # the parent has freed u and filled a new tensor
                try:  # a CPU read: the child cannot use the parent's CUDA context
                    os._exit(0 if bool((u.cpu() == 1.0).all()) else 3)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    os._exit(4)
            os.close(r)
            del u
            v = torch.full((4 << 20,), 2.0, device="unified")
            os.write(w, b"x")
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), torch_direct.memory_stats()["cached_large_bytes"])
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["0", "0"])

    def test_block_sent_to_another_process_is_not_reused(self):
        from multiprocessing.reduction import ForkingPickler
        torch_direct.empty_cache()
        u = torch.ones(4 << 20, device="unified")
        data = ForkingPickler.dumps(u)  # what a queue sends: the block's memfd
        del u, data
        self.assertEqual(stats()["cached_large_bytes"], 0)

    def test_small_blocks_are_cached_and_reused(self):
        a = torch.empty(100, device="unified")
        self.assertEqual(torch_direct._C._block_kind(a), "cached")
        ptr = a.data_ptr()
        del a
        b = torch.empty(90, device="unified")  # same size class
        self.assertEqual(b.data_ptr(), ptr)
        s = stats()
        self.assertGreaterEqual(s["num_alloc"], 2)
        torch_direct.empty_cache()

    def test_stats_track_allocations(self):
        torch_direct.reset_peak_memory_stats()
        base = stats()["allocated_bytes"]
        u = torch.empty(1000, dtype=torch.float64, device="unified")
        self.assertEqual(stats()["allocated_bytes"] - base, 8000)
        del u
        self.assertEqual(stats()["allocated_bytes"], base)
        self.assertGreaterEqual(stats()["allocated_bytes.peak"] - base, 8000)

    def test_impossible_size_is_a_clear_error(self):
        with self.assertRaisesRegex(RuntimeError, r"cannot allocate \d+ bytes .*unified memory"):
            torch.empty(1 << 50, dtype=torch.uint8, device="unified")  # 1 PiB
        u = torch.ones(3).to("unified")  # the allocator still works
        self.assertEqual(u.cpu(), torch.ones(3))


class TestPinInplace(TestCase):
    def test_alias_without_copy(self):
        t = torch.arange(20.0).view(4, 5)
        u = torch_direct.pin_inplace(t)
        self.assertTrue(u.is_unified)
        self.assertEqual(u.data_ptr(), t.data_ptr())
        self.assertEqual(u.cpu(), t)
        t[0, 0] = 100.0
        self.assertEqual(u[0, 0].item(), 100.0)
        u[1].fill_(-1.0)
        self.assertEqual(t[1], torch.full((5,), -1.0))
        self.assertEqual(torch_direct._C._block_kind(u), "foreign")

    def test_view_keeps_offset(self):
        t = torch.arange(10.0)
        u = torch_direct.pin_inplace(t[3:7])
        self.assertEqual(u.cpu(), torch.tensor([3.0, 4.0, 5.0, 6.0]))
        self.assertEqual(u.data_ptr(), t[3:].data_ptr())

    def test_twice_and_overlapping(self):
        t = torch.randn(1 << 18)
        a = torch_direct.pin_inplace(t)
        b = torch_direct.pin_inplace(t)
        c = torch_direct.pin_inplace(t[1000:5000])
        self.assertEqual(a.cpu(), b.cpu())
        self.assertEqual(c.cpu(), t[1000:5000])

    def test_shared_memory_tensor(self):
        t = torch.randn(1000).share_memory_()
        u = torch_direct.pin_inplace(t)
        self.assertEqual(u.cpu(), t)

    def test_unified_is_returned_as_is(self):
        u = torch.ones(3).to("unified")
        self.assertIs(torch_direct.pin_inplace(u), u)

    def test_bad_input(self):
        with self.assertRaisesRegex(TypeError, "torch.Tensor"):
            torch_direct.pin_inplace([1, 2, 3])
        sparse = torch.eye(3).to_sparse()   # made outside: its own errors are not pin_inplace's
        with self.assertRaisesRegex(RuntimeError, "strided"):
            torch_direct.pin_inplace(sparse)
        if torch.cuda.is_available():
            with self.assertRaisesRegex(RuntimeError, "CPU tensor"):
                torch_direct.pin_inplace(torch.ones(3, device="cuda"))

    def test_alias_of_a_moved_tensor_is_a_clear_error(self):
        t = torch.arange(8.0)
        u = torch_direct.pin_inplace(t)
        t.resize_(1 << 20)  # the CPU storage moves to new pages; the old ones are freed
        t.fill_(1.0)
        for use in (lambda: u + 1, lambda: u.cpu(), lambda: u[0].item()):
            with self.assertRaisesRegex(RuntimeError, "resized or moved"):
                use()
        self.assertEqual(t[:3], torch.ones(3))  # the CPU tensor is intact
        again = torch_direct.pin_inplace(t)
        self.assertEqual(again[:3].cpu(), torch.ones(3))

    def test_original_outlives_or_dies_first(self):
        t = torch.arange(6.0)
        u = torch_direct.pin_inplace(t)
        del t  # the alias keeps the pages alive
        self.assertEqual(u.cpu(), torch.arange(6.0))


@requires_gpu
class TestAllocatorGPU(TestCase):
    def test_pinned_bytes_within_one_percent(self):
        n = (256 << 20) + 4096 * 3 + 17
        torch_direct.empty_cache()
        before = stats()["pinned_bytes"]
        u = torch.empty(n, dtype=torch.uint8, device="unified")
        torch_direct._C._map_for_gpu(u)  # (mapped at allocation once CUDA is in use)
        self.assertTrue(torch_direct._C._is_mapped(u))
        pinned = stats()["pinned_bytes"] - before
        self.assertGreaterEqual(pinned, n)
        self.assertLessEqual(pinned, n * 1.01)
        del u
        # Cached for reuse, still registered; released by empty_cache().
        self.assertGreaterEqual(stats()["pinned_bytes"] - before, n)
        torch_direct.empty_cache()
        self.assertEqual(stats()["pinned_bytes"], before)

    def test_pin_inplace_registers_and_unregisters(self):
        t = torch.randn(1 << 20)
        before = stats()["pinned_bytes"]
        u = torch_direct.pin_inplace(t)
        self.assertGreaterEqual(stats()["pinned_bytes"] - before, t.numel() * 4)
        self.assertTrue(torch_direct._C._is_mapped(u))
        idx = torch.tensor([0, 5, 1 << 19], device="cuda")
        self.assertEqual(u[idx].cpu(), t[idx.cpu()])
        u2 = torch_direct.pin_inplace(t)  # same pages again: no driver error
        del u
        self.assertEqual(u2[idx].cpu(), t[idx.cpu()])  # still mapped for u2
        del u2
        self.assertEqual(stats()["pinned_bytes"], before)

    def test_alias_read_by_the_gpu_unregisters_when_it_dies(self):
        # Once the GPU has finished with it, a dead alias must not leave its
        # pages registered until some later allocation: they would still
        # report pinned, and so would any small tensor sharing a page.
        t = torch.randn(4 << 20)
        u = torch_direct.pin_inplace(t)
        idx = torch.tensor([0, 5, (4 << 20) - 1], device="cuda")
        self.assertEqual(u[idx].cpu(), t[idx.cpu()])  # a GPU read, finished
        self.assertTrue(t.is_pinned())
        del u
        self.assertFalse(t.is_pinned())
        # Still-running GPU work keeps the alias registered until it ends.
        u = torch_direct.pin_inplace(t)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(1_000_000_000)
            y = u * 2  # an elementwise read (a gather would wait for its bounds check)
        del u
        self.assertTrue(t.is_pinned())
        s.synchronize()
        self.assertEqual(y.cpu(), t * 2)
        torch.empty(1, device="unified")  # the next allocation releases it
        self.assertFalse(t.is_pinned())

    def test_graph_capture_beside_the_allocators_bookkeeping(self):
        # Allocations and frees query events and streams; during a capture in
        # global mode (torch.cuda.graph's default) that must not break it.
        src = torch.randn(1 << 12)
        u = src.to("unified")
        self.assertEqual((u + 0).cpu(), src)   # mapped before the timed part
        busy = torch.cuda.Stream()
        with torch.cuda.stream(busy):
            torch.cuda._sleep(200_000_000)
            y = u + 0
        del u
        self.assertGreaterEqual(stats()["pending_free_blocks"], 1)   # waits on busy's event
        keep = torch.ones(8).to("unified")
        self.assertEqual((keep + 0).cpu(), torch.ones(8))   # mapped
        spare = torch.empty(8, device="unified")
        del spare   # cached: the capture's allocation below registers nothing
        x = torch.zeros(8, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            t = torch.empty(8, device="unified")   # an allocation: the pending list is looked at
            c = t.to("cuda", non_blocking=True)    # a use on the capturing stream
            del t, c                               # a free with that stream among its users
            x.add_(keep)
        self.assertEqual(y.cpu(), src)
        torch.empty(16, device="unified")          # bookkeeping after the capture: no error left
        self.assertEqual(stats()["pending_free_blocks"], 0)
        g.replay()
        g.replay()
        self.assertEqual(x.cpu(), torch.full((8,), 2.0))

    def test_registration_is_split_in_chunks(self):
        code = textwrap.dedent("""
            import torch, torch_direct
            t = torch.randn(10 << 20)  # 40 MiB
            u = torch_direct.pin_inplace(t)
            s = torch_direct.memory_stats()
            idx = torch.tensor([0, (10 << 20) - 1], device="cuda")
            assert torch.equal(u[idx].cpu(), t[idx.cpu()])
            # DMA copies across registrations, both ways, for owned and pinned-in-place blocks.
            assert torch.equal(u.to("cuda").cpu(), t)
            big = torch.empty(10 << 20, device="unified")
            big.copy_(t.clone().cuda())  # (t itself: see docs/allocator.md on chunks)
            assert torch.equal(big.cpu(), t)
            assert torch.equal(big[1:].to("cuda").cpu(), t[1:])
            print(s["pinned_registrations"])
        """)
        env = dict(os.environ, TORCH_DIRECT_REGISTER_CHUNK_MB="8")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertGreaterEqual(int(out.stdout.strip().splitlines()[-1]), 5)

    def test_freed_block_not_reused_while_gpu_reads(self):
        src = torch.randn(1 << 12)
        u = src.to("unified")
        ptr = u.data_ptr()
        # Map the pages for the GPU first: registering host memory with the
        # driver may wait for the device, which would end the sleep below.
        self.assertEqual((u + 0).cpu(), src)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(2_000_000_000)  # keep the stream busy for about a second
            # An elementwise read (a gather would wait for its bounds check).
            y = u + 0
        del u
        self.assertGreaterEqual(stats()["pending_free_blocks"], 1)
        v = torch.empty(1 << 12, device="unified")
        self.assertNotEqual(v.data_ptr(), ptr)
        s.synchronize()
        self.assertEqual(y.cpu(), src)
        self.assertEqual(stats()["pending_free_blocks"], 0)


if __name__ == "__main__":
    run_tests()
