"""The package's shape: modules that stay small, no module reaching into another's private
names, one timer and one way to batch seeds."""

import ast
import pathlib
import unittest

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401
from torch_direct.gnn.graph.sampler import seed_batches, seeds_per_shard
from torch_direct.gnn.pipeline.timing import Timer, split_by_busy

PACKAGE = pathlib.Path(torch_direct.__file__).parent
MAX_LINES = 400


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def private_imports(path: pathlib.Path) -> list[str]:
    """``from X import _name`` and attribute uses ``_C._name`` of another module's private
    names; a package's own private modules (``from ._backend import``) are its business only
    when the importer lives in that same package folder. The device's own modules (the
    top-level ``torch_direct/*.py``) are one unit; the GNN stack takes nothing private."""
    tree = ast.parse(path.read_text(), str(path))
    here = path.parent
    if here == PACKAGE:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("torch_direct")):
            base = here
            for _ in range(max(node.level - 1, 0)):
                base = base.parent
            parts = (node.module or "").split(".") if node.level else (node.module or "").split(".")[1:]
            target = base if node.level else PACKAGE
            for part in parts:
                if part:
                    target = target / part
            private_module = any(p.startswith("_") and p != "__main__" for p in parts if p)
            if private_module and target.parent != here and target != here:
                found.append(f"{path.relative_to(PACKAGE)}: from {'.' * node.level}{node.module} import ...")
            own_internals = node.level == 1 and not node.module   # from . import _backend
            for alias in node.names:
                if alias.name.startswith("_") and alias.name != "__version__" and not own_internals:
                    found.append(f"{path.relative_to(PACKAGE)}: imports {alias.name}")
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "_C" and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "torch_direct"):
            found.append(f"{path.relative_to(PACKAGE)}: torch_direct._C.{node.attr}")
    return found


class TestShape(TestCase):
    def test_no_module_over_the_limit(self):
        long = {str(p.relative_to(PACKAGE)): n for p in modules()
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
        self.assertEqual(long, {}, f"modules over {MAX_LINES} lines")

    def test_no_private_names_across_modules(self):
        found = [f for p in modules() for f in private_imports(p)]
        self.assertEqual(found, [])

    def test_the_check_sees_a_private_import(self):
        # The check above can fail: a module taking another folder's private name is caught.
        probe = PACKAGE / "gnn" / "pipeline" / "_layout_probe_tmp.py"
        try:
            probe.write_text("from ..graph.csr import _host\nfrom .._backend import VEHICLE\n"
                             "from torch_direct import _C\nimport torch_direct\ntorch_direct._C._x\n")
            self.assertEqual(len(private_imports(probe)), 4)
        finally:
            probe.unlink()


class TestOneTimer(TestCase):
    def test_cpu_sections_sum_per_key(self):
        t = Timer(cuda=False, keys=("a", "b"))
        got = {"a": 0.0, "b": 0.0}
        for key in ("a", "a", "b"):
            got[key] += t.stop(key, t.start())   # each section's host seconds, as counted
        self.assertEqual(t.host_seconds, got)
        totals = t.totals()
        self.assertEqual(set(totals), {"a", "b"})
        self.assertTrue(all(v >= 0 for v in totals.values()))
        self.assertAlmostEqual(t.total(), totals["a"] + totals["b"])

    def test_split_by_busy(self):
        self.assertEqual(split_by_busy(3.0, {"sample": 1.0, "gather": 2.0, "transfer": 0.0}),
                         {"sample": 1.0, "gather": 2.0, "transfer": 0.0})
        self.assertEqual(split_by_busy(3.0, {"sample": 0.0, "gather": 0.0}), {"sample": 0.0, "gather": 0.0})


class TestSeedBatches(TestCase):
    def test_every_seed_once_in_order_or_shuffled(self):
        ids = torch.arange(10)
        self.assertEqual(torch.cat(seed_batches(ids, 4, shuffle=False)), ids)
        self.assertEqual([b.numel() for b in seed_batches(ids, 4, shuffle=False)], [4, 4, 2])
        self.assertEqual([b.numel() for b in seed_batches(ids, 4, shuffle=False, drop_last=True)], [4, 4])
        g = torch.Generator().manual_seed(3)
        shuffled = torch.cat(seed_batches(ids, 3, generator=g))
        self.assertEqual(shuffled.sort().values, ids)
        self.assertEqual(shuffled, torch.cat(seed_batches(ids, 3, generator=torch.Generator().manual_seed(3))))

    def test_shards_take_disjoint_equal_shares(self):
        ids = torch.arange(11)
        shares = [torch.cat(seed_batches(ids, 2, generator=torch.Generator().manual_seed(0), shard=(r, 3)))
                  for r in range(3)]
        self.assertEqual([s.numel() for s in shares], [3, 3, 3])          # 11 // 3, the same steps each
        self.assertEqual(torch.cat(shares).unique().numel(), 9)
        self.assertEqual(seeds_per_shard(11, (2, 3), shuffle=False), 3)   # every seed once in order
        self.assertEqual(seeds_per_shard(11, (0, 3), shuffle=False), 4)

    def test_bad_batch_size(self):
        with self.assertRaisesRegex(ValueError, "batch_size must be a positive int"):
            seed_batches(torch.arange(3), 0)


if __name__ == "__main__":
    run_tests()
