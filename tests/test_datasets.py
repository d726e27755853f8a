"""Data sets: synthetic presets (shape, determinism, learnability, cache) and the OGB reader."""

import dataclasses
import gzip
import os
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from torch_direct.gnn.graph import datasets, ogb, synthetic
from torch_direct.gnn.graph.datasets import PRESETS, NodeDataset, generate, load_dataset


def linear_accuracy(features, y, train, test, num_classes):
    """Test accuracy of a ridge-regression classifier (a stand-in for an MLP)."""
    a = torch.cat([features[train], torch.ones(len(train), 1)], 1).double()
    target = torch.nn.functional.one_hot(y[train], num_classes).double()
    w = torch.linalg.solve(a.T @ a + 1e-2 * torch.eye(a.size(1), dtype=torch.float64), a.T @ target)
    b = torch.cat([features[test], torch.ones(len(test), 1)], 1).double()
    return float(((b @ w).argmax(1) == y[test]).float().mean())


def same_dataset(test, a, b):
    test.assertEqual(a.graph.rowptr, b.graph.rowptr)
    test.assertEqual(a.graph.col, b.graph.col)
    test.assertEqual(a.x, b.x)
    test.assertEqual(a.y, b.y)
    for k in a.split:
        test.assertEqual(a.split[k], b.split[k])


class TestPresets(TestCase):
    def test_sizes_follow_ogb(self):
        # OGB's node counts, feature widths, dtypes, classes and split sizes; CSR entries
        # of the graph made undirected, as GNN training reads it.
        want = {"arxiv-like": (169_343, 2_315_598, 128, torch.float32, 40, [90_941, 29_799, 48_603]),
                "products-like": (2_449_029, 123_718_280, 100, torch.float32, 47, [196_615, 39_323, 2_213_091]),
                "papers100M-like": (111_059_956, 3.23e9, 128, torch.float16, 172, [1_207_179, 125_265, 214_338])}
        for name, (n, e, f, dtype, c, split) in want.items():
            p = PRESETS[name]
            self.assertEqual((p.num_nodes, p.num_features, p.dtype, p.num_classes), (n, f, dtype, c))
            self.assertLess(abs(p.num_edges - e) / e, 0.005, msg=name)
            self.assertEqual(p.num_edges % 2, 0, msg=name)
            self.assertEqual(datasets.split_sizes(p), split, msg=name)

    def test_tiny_shape(self):
        ds = generate("tiny", seed=0, show_progress=False)
        p = PRESETS["tiny"]
        g = ds.graph
        self.assertEqual((g.num_nodes, ds.num_features, ds.num_classes), (p.num_nodes, p.num_features, p.num_classes))
        self.assertLess(abs(g.num_edges - p.num_edges) / p.num_edges, 0.05)
        g.validate()
        deg = g.degree()
        self.assertGreater(int(deg.max()), 5 * float(deg.float().mean()))  # heavy tail
        ei = g.to_edge_index()
        self.assertFalse(bool((ei[0] == ei[1]).any()))
        key = ei[1] * g.num_nodes + ei[0]
        self.assertTrue(bool((key[1:] > key[:-1]).all()))  # rows sorted, no repeats
        # symmetric: the reversed edges are the same set
        self.assertEqual(key.sort().values, (ei[0] * g.num_nodes + ei[1]).sort().values)
        self.assertEqual([ds.split[k].numel() for k in ("train", "valid", "test")], list(p.split))
        every = torch.cat(list(ds.split.values()))
        self.assertEqual(every.unique().numel(), every.numel())
        self.assertEqual(int(ds.y.min()), 0)
        self.assertEqual(int(ds.y.max()), p.num_classes - 1)

    def test_entry_count_and_degree_tail_on_target(self):
        p = dataclasses.replace(PRESETS["products-like"], num_nodes=40_000, num_edges=2_000_000,
                                max_degree=2_000, split=(4_000, 1_000, 10_000))
        with mock.patch.object(synthetic, "NODE_CHUNK", 8_192):
            g = generate("products-like", seed=0, preset=p, show_progress=False, workers=2).graph
        self.assertLess(abs(g.num_edges - p.num_edges) / p.num_edges, 0.01)
        deg = g.degree().float()
        self.assertGreater(float(deg.max()), 0.5 * p.max_degree)
        self.assertLess(float(deg.max()), 1.5 * p.max_degree)
        self.assertLess(float(deg.median()), float(deg.mean()))   # skewed: most nodes below the mean
        self.assertEqual(g.col.dtype, torch.int32)

    def test_label_noise_caps_accuracy(self):
        clean = dataclasses.replace(PRESETS["tiny"], signal=3.0)
        noisy = dataclasses.replace(clean, label_noise=0.5)
        acc = []
        for p in (clean, noisy):
            ds = generate("tiny", seed=0, preset=p, show_progress=False)
            acc.append(linear_accuracy(ds.x, ds.y, ds.split["train"], ds.split["test"], ds.num_classes))
        self.assertGreater(acc[0], 0.95)
        cap = 0.5 + 0.5 / clean.num_classes
        self.assertLess(acc[1], cap + 0.06)
        self.assertGreater(acc[1], cap - 0.1)

    def test_bad_presets_are_refused(self):
        tiny = PRESETS["tiny"]
        for bad, msg in [(dict(split=(2_000, 1_000, 1_000)), "at most num_nodes"),
                         (dict(split=(1, 2)), "3 entries"),
                         (dict(homophily=1.5), "homophily"),
                         (dict(label_noise=-0.1), "label_noise"),
                         (dict(dtype=torch.int32), "dtype"),
                         (dict(num_edges=3_000 * 3_000), "mean degree"),
                         (dict(max_degree=5), "mean degree")]:
            with self.assertRaisesRegex(ValueError, msg):
                dataclasses.replace(tiny, **bad)

    def test_graph_and_features_predict_labels(self):
        ds = generate("tiny", seed=1, show_progress=False)
        g, x, y = ds.graph, ds.x, ds.y
        ei = g.to_edge_index()
        mean = torch.zeros_like(x).index_add_(0, ei[1], x[ei[0]]) / g.degree().clamp(min=1)[:, None]
        args = (y, ds.split["train"], ds.split["test"], ds.num_classes)
        alone = linear_accuracy(x, *args)
        with_graph = linear_accuracy(torch.cat([x, mean], 1), *args)
        self.assertGreater(alone, 2.0 / ds.num_classes)
        self.assertGreater(with_graph, alone + 0.15)
        same_class = (y[ei[0]] == y[ei[1]]).float().mean()
        self.assertGreater(float(same_class), 0.6)

    def test_deterministic_for_a_seed_and_any_worker_count(self):
        p = dataclasses.replace(PRESETS["tiny"], num_nodes=1100, num_edges=9000, split=(500, 200, 300))
        with mock.patch.object(synthetic, "NODE_CHUNK", 128):
            a = generate("tiny", seed=3, preset=p, workers=1, show_progress=False)
            b = generate("tiny", seed=3, preset=p, workers=3, show_progress=False)
            c = generate("tiny", seed=4, preset=p, workers=3, show_progress=False)
        same_dataset(self, a, b)
        self.assertNotEqual(a.x, c.x)
        self.assertFalse(torch.equal(a.graph.rowptr, c.graph.rowptr))

    def test_fp16_preset_written_to_disk(self):
        p = dataclasses.replace(PRESETS["papers100M-like"], num_nodes=5000, num_edges=60000, max_degree=400,
                                split=(500, 100, 200))
        with tempfile.TemporaryDirectory() as d:
            ds = generate("papers100M-like", seed=0, preset=p, path=d, show_progress=False)
            self.assertEqual(ds.x.dtype, torch.float16)
            self.assertEqual(ds.graph.col.dtype, torch.int32)
            self.assertTrue(bool(torch.isfinite(ds.x.float()).all()))
            self.assertEqual(ds.split["train"].numel(), datasets.split_sizes(p)[0])
            same_dataset(self, ds, generate("papers100M-like", seed=0, preset=p, show_progress=False))

    def test_bad_names_and_seeds(self):
        with self.assertRaisesRegex(ValueError, "unknown data set"):
            load_dataset("nope")
        with self.assertRaisesRegex(ValueError, "unknown preset"):
            generate("nope")
        with self.assertRaisesRegex(ValueError, "non-negative int"):
            generate("tiny", seed=-1)


class TestCache(TestCase):
    def test_generated_once_then_loaded(self):
        with tempfile.TemporaryDirectory() as d:
            first = load_dataset("tiny", root=d, seed=2, show_progress=False)
            self.assertTrue((Path(d) / "tiny-seed2" / "meta.json").exists())
            with mock.patch.object(datasets, "generate", side_effect=AssertionError("regenerated")):
                again = load_dataset("tiny", root=d, seed=2)
            same_dataset(self, first, again)
            self.assertEqual(again.info["seed"], 2)
            # A cache from an older generator is replaced.
            with mock.patch.object(datasets, "GENERATOR_VERSION", datasets.GENERATOR_VERSION + 1):
                with mock.patch.object(datasets, "generate", wraps=datasets.generate) as gen:
                    load_dataset("tiny", root=d, seed=2, show_progress=False)
                    self.assertEqual(gen.call_count, 1)
            self.assertEqual(sorted(os.listdir(d)), ["tiny-seed2"])  # no temporary left behind
            # So is one made with other knobs (the preset's labels recalibrated).
            harder = dataclasses.replace(datasets.PRESETS["tiny"], label_noise=0.5)
            with mock.patch.dict(datasets.PRESETS, {"tiny": harder}):
                with mock.patch.object(datasets, "generate", wraps=datasets.generate) as gen:
                    ds = load_dataset("tiny", root=d, seed=2, show_progress=False)
                    self.assertEqual(gen.call_count, 1)
                self.assertEqual(ds.info["label_noise"], 0.5)

    def test_env_root(self):
        with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {"TORCH_DIRECT_DATA": d}):
            self.assertEqual(datasets.default_root(), Path(d))
            load_dataset("tiny", show_progress=False)
            self.assertTrue((Path(d) / "tiny-seed0").is_dir())

    def test_save_load_round_trip(self):
        ds = generate("tiny", seed=0, show_progress=False)
        ds.x = ds.x.to(torch.bfloat16)
        with tempfile.TemporaryDirectory() as d:
            ds.save(d)
            back = NodeDataset.load(d, mmap=False)
            same_dataset(self, ds, back)
            self.assertEqual(back.x.dtype, torch.bfloat16)
            self.assertIn("tiny", repr(back))
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(FileNotFoundError, "no saved data set"):
                NodeDataset.load(d)


class TestCli(TestCase):
    def test_generate_and_errors(self):
        from contextlib import redirect_stderr, redirect_stdout
        from io import StringIO

        from torch_direct.gnn.graph.__main__ import main
        out, err = StringIO(), StringIO()
        with tempfile.TemporaryDirectory() as d, redirect_stdout(out), redirect_stderr(err):
            self.assertEqual(main(["tiny", "--root", d, "--quiet", "--seed", "5"]), 0)
            self.assertTrue((Path(d) / "tiny-seed5").is_dir())
            self.assertEqual(main(["nope", "--root", d]), 2)
        self.assertIn("NodeDataset('tiny'", out.getvalue())
        self.assertIn("unknown data set", err.getvalue())


def write_csv_gz(path, rows, fmt="%d"):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = np.asarray(rows)
    rows = rows.reshape(len(rows), -1)
    text = "\n".join(",".join(fmt % v for v in r) for r in rows) + "\n"
    with gzip.open(path, "wt") as f:
        f.write(text)


# A 6-node graph in both of OGB's layouts.
EDGES = np.array([[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [0, 1]])
FEATS = np.arange(12, dtype=np.float32).reshape(6, 2) / 4
LABELS = np.array([0, 1, 2, 0, 1, 2])


class TestOgb(TestCase):
    def write_csv_layout(self, root):
        d = Path(root) / "ogbn_arxiv"
        write_csv_gz(d / "raw" / "edge.csv.gz", EDGES)
        write_csv_gz(d / "raw" / "num-node-list.csv.gz", [6])
        write_csv_gz(d / "raw" / "num-edge-list.csv.gz", [len(EDGES)])
        write_csv_gz(d / "raw" / "node-feat.csv.gz", FEATS, fmt="%.6f")
        write_csv_gz(d / "raw" / "node-label.csv.gz", LABELS)
        write_csv_gz(d / "split" / "time" / "train.csv.gz", [0, 3])
        write_csv_gz(d / "split" / "time" / "valid.csv.gz", [1])
        write_csv_gz(d / "split" / "time" / "test.csv.gz", [4, 5])
        return d

    def write_binary_layout(self, root):
        d = Path(root) / "ogbn_papers100M"
        (d / "raw").mkdir(parents=True)
        np.savez(d / "raw" / "data.npz", edge_index=EDGES.T.copy(), node_feat=FEATS.astype(np.float16),
                 num_nodes_list=np.array([6]), num_edges_list=np.array([len(EDGES)]))
        labels = LABELS.astype(np.float32)[:, None]
        labels[2] = np.nan
        np.savez(d / "raw" / "node-label.npz", node_label=labels)
        write_csv_gz(d / "split" / "time" / "train.csv.gz", [0, 1])
        write_csv_gz(d / "split" / "time" / "valid.csv.gz", [3])
        write_csv_gz(d / "split" / "time" / "test.csv.gz", [4])
        return d

    def check_graph(self, g):
        rows = [sorted(g.neighbors(v).tolist()) for v in range(6)]
        self.assertEqual(rows, [[1, 2], [0, 2], [0, 1], [4], [3, 5], [4]])  # symmetrized, deduped

    def test_csv_layout(self):
        with tempfile.TemporaryDirectory() as root:
            d = self.write_csv_layout(root)
            ds = load_dataset("ogbn-arxiv", root=root, show_progress=False)
            self.check_graph(ds.graph)
            self.assertEqual(ds.x, torch.from_numpy(FEATS))
            self.assertEqual(ds.y, torch.from_numpy(LABELS))
            self.assertEqual(ds.split["train"], torch.tensor([0, 3]))
            self.assertEqual(ds.split["test"], torch.tensor([4, 5]))
            self.assertEqual(ds.num_classes, 40)
            self.assertTrue((d / "processed" / "torch_direct" / "meta.json").exists())
            for f in (d / "raw").iterdir():
                f.unlink()
            cached = load_dataset("ogbn-arxiv", root=root)  # from the cache, raw files gone
            same_dataset(self, ds, cached)

    def test_directed_and_dataset_dir_as_root(self):
        with tempfile.TemporaryDirectory() as root:
            d = self.write_csv_layout(root)
            ds = ogb.load_ogb("ogbn-arxiv", d, symmetrize=False, show_progress=False)
            rows = [sorted(ds.graph.neighbors(v).tolist()) for v in range(6)]
            self.assertEqual(rows, [[2], [0], [1], [], [3], [4]])  # row v: sources of edges into v

    def test_binary_layout(self):
        with tempfile.TemporaryDirectory() as root:
            self.write_binary_layout(root)
            ds = load_dataset("ogbn-papers100M", root=root, show_progress=False)
            self.check_graph(ds.graph)
            self.assertEqual(ds.x.dtype, torch.float16)
            self.assertEqual(ds.y.tolist(), [0, 1, -1, 0, 1, 2])
            self.assertEqual(ds.num_classes, 172)
            self.assertEqual(ds.info["split_scheme"], "time")

    def test_missing_data(self):
        with tempfile.TemporaryDirectory() as root:
            with self.assertRaisesRegex(FileNotFoundError, "no OGB data"):
                load_dataset("ogbn-products", root=root)
            with self.assertRaisesRegex(ValueError, "pass root="):
                ogb.load_ogb("ogbn-products", None)

    def test_csv_blocks_cut_at_line_ends(self):
        rows = np.random.default_rng(0).integers(0, 10**9, size=(500, 3))
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "x.csv.gz"
            write_csv_gz(p, rows)
            with mock.patch.object(ogb, "_BLOCK", 97):
                got = ogb.read_csv_gz(p, np.int64)
            self.assertEqual(got, rows)
            bad = Path(d) / "bad.csv.gz"
            with gzip.open(bad, "wt") as f:
                f.write("1,2\n3\n")
            with self.assertRaisesRegex(ValueError, "rows of 2 columns"):
                ogb.read_csv_gz(bad, np.int64)


if __name__ == "__main__":
    run_tests()
