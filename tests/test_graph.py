"""CSRGraph: building from edge lists, structure checks, devices, save and load."""

import tempfile

import numpy as np
import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from common import requires_gpu
from torch_direct.gnn.graph import CSRGraph

EDGES = torch.tensor([[0, 1, 2, 2, 3, 0],
                      [1, 2, 0, 1, 1, 1]])  # (0 -> 1) appears twice


def rows(g):
    return [g.neighbors(v).tolist() for v in range(g.num_nodes)]


class TestBuild(TestCase):
    def test_rows_list_sources_by_default(self):
        g = CSRGraph.from_edge_index(EDGES, 4)
        self.assertEqual(rows(g), [[2], [0, 0, 2, 3], [1], []])
        self.assertEqual(g.num_nodes, 4)
        self.assertEqual(g.num_edges, 6)
        self.assertEqual(g.degree(), torch.tensor([1, 4, 1, 0]))
        self.assertEqual(g.rowptr.dtype, torch.int64)

    def test_by_src(self):
        g = CSRGraph.from_edge_index(EDGES, 4, by="src")
        self.assertEqual(rows(g), [[1, 1], [2], [0, 1], [1]])

    def test_dedupe_symmetrize_self_loops(self):
        g = CSRGraph.from_edge_index(EDGES, dedupe=True)
        self.assertEqual(rows(g), [[2], [0, 2, 3], [1], []])
        s = CSRGraph.from_edge_index(EDGES, 4, symmetrize=True, dedupe=True)
        self.assertEqual(rows(s), [[1, 2], [0, 2, 3], [0, 1], [1]])
        loops = torch.tensor([[0, 1, 1], [0, 0, 1]])
        self.assertEqual(rows(CSRGraph.from_edge_index(loops, remove_self_loops=True)), [[1], []])

    def test_edge_ids_follow_slots(self):
        g = CSRGraph.from_edge_index(EDGES, 4, keep_edge_ids=True)
        src, dst = EDGES
        for v in range(4):
            lo, hi = int(g.rowptr[v]), int(g.rowptr[v + 1])
            for slot in range(lo, hi):
                e = int(g.edge_ids[slot])
                self.assertEqual((int(src[e]), int(dst[e])), (int(g.col[slot]), v))
        s = CSRGraph.from_edge_index(EDGES, 4, symmetrize=True, dedupe=True, keep_edge_ids=True)
        self.assertEqual(s.edge_ids.numel(), s.num_edges)

    def test_int32_and_numpy_input(self):
        g = CSRGraph.from_edge_index(EDGES.numpy().astype(np.int32), 4, col_dtype=torch.int32)
        self.assertEqual(g.col.dtype, torch.int32)
        self.assertEqual(rows(g), rows(CSRGraph.from_edge_index(EDGES, 4)))

    def test_round_trip_edge_index(self):
        gen = torch.Generator().manual_seed(0)
        ei = torch.randint(50, (2, 400), generator=gen)
        g = CSRGraph.from_edge_index(ei, 50)
        back = g.to_edge_index()
        key = lambda e: sorted(zip(e[0].tolist(), e[1].tolist()))  # noqa: E731
        self.assertEqual(key(back), key(ei))

    def test_isolated_and_empty(self):
        g = CSRGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long), 3)
        self.assertEqual(g.rowptr.tolist(), [0, 0, 0, 0])
        self.assertEqual(g.num_edges, 0)
        self.assertEqual(CSRGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long)).num_nodes, 0)


class TestChecks(TestCase):
    def test_bad_arrays(self):
        with self.assertRaisesRegex(TypeError, "rowptr must be int64"):
            CSRGraph(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0]))
        with self.assertRaisesRegex(ValueError, "start at 0 and end"):
            CSRGraph(torch.tensor([0, 2]), torch.tensor([0]))
        with self.assertRaisesRegex(ValueError, "decreases at node 1"):
            CSRGraph(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]))
        with self.assertRaisesRegex(ValueError, "out of range"):
            CSRGraph(torch.tensor([0, 1]), torch.tensor([1]))
        with self.assertRaisesRegex(TypeError, "must be a tensor"):
            CSRGraph([0, 1], torch.tensor([0]))
        with self.assertRaisesRegex(TypeError, "int32 or int64"):
            CSRGraph(torch.tensor([0, 1]), torch.tensor([0.0]))
        with self.assertRaisesRegex(ValueError, "edge_ids has 2 entries"):
            CSRGraph(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0, 1]))

    def test_bad_edge_index(self):
        with self.assertRaisesRegex(ValueError, r"shape \[2, E\]"):
            CSRGraph.from_edge_index(torch.zeros(3, 4, dtype=torch.long))
        with self.assertRaisesRegex(ValueError, "out of range for num_nodes=2"):
            CSRGraph.from_edge_index(EDGES, 2)
        with self.assertRaisesRegex(ValueError, "negative node id"):
            CSRGraph.from_edge_index(torch.tensor([[0], [-1]]))
        with self.assertRaisesRegex(ValueError, "by must be"):
            CSRGraph.from_edge_index(EDGES, by="row")
        with self.assertRaisesRegex(TypeError, "int32 or int64"):
            CSRGraph.from_edge_index(EDGES.float())
        with self.assertRaisesRegex(IndexError, "out of range"):
            CSRGraph.from_edge_index(EDGES, 4).neighbors(4)


class TestDevicesAndDisk(TestCase):
    def test_unified(self):
        g = CSRGraph.from_edge_index(EDGES, 4, keep_edge_ids=True)
        u = g.to("unified")
        self.assertEqual(u.device.type, "unified")
        self.assertTrue(u.col.is_unified and u.edge_ids.is_unified)
        self.assertEqual(u.degree(), g.degree())
        self.assertEqual(rows(u), rows(g))
        self.assertIs(u.to("unified"), u)
        self.assertEqual(u.cpu().col, g.col)
        self.assertIn("unified", repr(u))
        u.validate()
        p = g.pin_inplace()
        self.assertEqual(p.device.type, "unified")
        self.assertEqual(rows(p), rows(g))

    @requires_gpu
    def test_cuda(self):
        g = CSRGraph.from_edge_index(EDGES, 4)
        c = g.to("cuda")
        self.assertEqual(c.device.type, "cuda")
        self.assertEqual(c.degree().cpu(), g.degree())
        self.assertEqual(c.to("unified").cpu().col, g.col)

    def test_save_load(self):
        for keep in (False, True):
            g = CSRGraph.from_edge_index(EDGES, 4, keep_edge_ids=keep, col_dtype=torch.int32)
            with tempfile.TemporaryDirectory() as d:
                g.to("unified").save(d)
                for mmap in (True, False):
                    h = CSRGraph.load(d, mmap=mmap)
                    self.assertEqual(h.rowptr, g.rowptr)
                    self.assertEqual(h.col, g.col)
                    self.assertEqual(h.edge_ids, g.edge_ids)
                    h.col[0] = 3  # copy-on-write: the file keeps its values
                self.assertEqual(CSRGraph.load(d).col, g.col)
                self.assertEqual(CSRGraph.load(d, device="unified").device.type, "unified")

    def test_load_errors(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(FileNotFoundError, "not a saved CSRGraph"):
                CSRGraph.load(d)


if __name__ == "__main__":
    run_tests()
