"""The fork's tooling that needs no PyTorch tree: the native_functions merge."""

import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_scripts"))
import merge_native_functions as merge  # noqa: E402

ATEN = """\
# comment kept
- func: view(Tensor(a) self, SymInt[] size) -> Tensor(a)
  variants: method
  dispatch:
    ZeroTensor, CPU, CUDA: view
    MkldnnCPU: mkldnn_view
  tags: core

- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
  structured_delegate: add.out

- func: matmul(Tensor self, Tensor other) -> Tensor
  variants: function, method
"""


def add(func, kernel):
    return {"func": func, "dispatch": {"Unified": kernel}}


class TestMerge(TestCase):
    def test_adds_to_existing_and_appends_new(self):
        text, report = merge.merge_text(ATEN, [
            add("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "view_unified"),
            add("unified_only(Tensor self) -> Tensor", "unified_only_kernel"),
        ])
        self.assertIn("# comment kept", text)
        self.assertIn("    MkldnnCPU: mkldnn_view\n    Unified: view_unified\n  tags: core", text)
        parsed = yaml.safe_load(text)
        view = next(e for e in parsed if e["func"].startswith("view("))
        self.assertEqual(view["dispatch"]["Unified"], "view_unified")
        self.assertTrue(any(e["func"].startswith("unified_only(") for e in parsed))
        self.assertEqual(len(report), 2)
        again, report2 = merge.merge_text(text, [
            add("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "view_unified"),
            add("unified_only(Tensor self) -> Tensor", "unified_only_kernel"),
        ])
        self.assertEqual(again, text)  # idempotent
        self.assertEqual(report2, [])

    def test_conflicts_are_refused_with_the_op_named(self):
        cases = [
            (add("view(Tensor(a) self, int[] size) -> Tensor(a)", "k"), "view: schema differs"),
            (add("add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor", "k"),
             "add.Tensor: has structured_delegate"),
            (add("matmul(Tensor self, Tensor other) -> Tensor", "k"), "matmul: has no dispatch table"),
            ({"func": "view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "dispatch": {"CPU": "k"}},
             "no 'Unified:' kernel"),
        ]
        for addition, message in cases:
            with self.assertRaisesRegex(merge.MergeConflict, message):
                merge.merge_text(ATEN, [addition])
        merged, _ = merge.merge_text(ATEN, [add("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "a")])
        with self.assertRaisesRegex(merge.MergeConflict, "already dispatches Unified"):
            merge.merge_text(merged, [add("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "b")])

    def test_cli_leaves_the_file_untouched_on_conflict(self):
        with tempfile.TemporaryDirectory() as d:
            nf = Path(d) / "native_functions.yaml"
            nf.write_text(ATEN)
            bad = Path(d) / "add.yaml"
            bad.write_text(yaml.safe_dump([add("matmul(Tensor self, Tensor other) -> Tensor", "k")]))
            r = subprocess.run([sys.executable, str(ROOT / "build_scripts/merge_native_functions.py"),
                                str(nf), "--additions", str(bad)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("matmul", r.stderr)
            self.assertEqual(nf.read_text(), ATEN)

    def test_project_additions_have_unified_kernels(self):
        additions = yaml.safe_load(merge.DEFAULT_ADDITIONS.read_text())
        self.assertTrue(all("Unified" in merge.dispatch_keys(a["dispatch"]) for a in additions))


if __name__ == "__main__":
    run_tests()
