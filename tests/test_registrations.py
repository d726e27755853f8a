"""native_functions_additions.yaml is the source of the extension's kernels."""

import tempfile
from pathlib import Path

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401

import sys
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gen_registrations  # noqa: E402
from common import AUTOGRAD_KEY, UNIFIED_DISPATCH_KEY, extension_only  # noqa: E402


class TestRegistrations(TestCase):
    @extension_only("checks the extension's PrivateUse1 registrations; build_scripts/verify checks the fork's RegisterUnified.cpp")
    def test_every_yaml_entry_is_registered_with_its_schema(self):
        entries = gen_registrations.load_entries(gen_registrations.DEFAULT_YAML)
        self.assertGreaterEqual(len(entries), 10)
        import yaml
        funcs = {e["func"].split("(")[0]: e["func"] for e in yaml.safe_load(gen_registrations.DEFAULT_YAML.read_text())}
        for name, kernel in entries:
            op, _, overload = name.partition(".")
            schema = torch._C._get_schema("aten::" + op, overload)
            self.assertEqual("aten::" + funcs[name], str(schema), name)
            self.assertTrue(torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"),
                            f"{name} has no unified kernel")

    def test_structured_ops_route_to_fallback(self):
        # Claimed once at init (the extension's module init; torch._C's on the fork): asking
        # again claims nothing more and answers the same count.
        n = torch_direct._C._claimed_structured_ops()
        self.assertGreater(n, 100)
        self.assertEqual(torch_direct._C._claimed_structured_ops(), n)
        self.assertTrue(torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", UNIFIED_DISPATCH_KEY))

    def test_ops_with_derivatives_get_unified_autograd_kernels(self):
        n = torch_direct._C._claimed_autograd_ops()
        self.assertGreater(n, 300)
        self.assertEqual(torch_direct._C._claimed_autograd_ops(), n)
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        for op in ("aten::mm", "aten::index_select", "aten::embedding", "aten::convolution", "aten::add.Tensor",
                   "aten::sum", "aten::clone", "aten::view", "aten::split.Tensor", "aten::lstm.input",
                   "aten::add_.Tensor", "aten::copy_"):
            self.assertTrue(has(op, AUTOGRAD_KEY), op)
        # Factories and detach keep PyTorch's own.
        for op in ("aten::_to_copy", "aten::empty.memory_format", "aten::zeros_like", "aten::detach"):
            self.assertFalse(has(op, AUTOGRAD_KEY), op)

    def test_sparse_ops_route_to_fallback(self):
        n = torch_direct._C._claimed_sparse_ops()
        self.assertGreater(n, 10)
        self.assertEqual(torch_direct._C._claimed_sparse_ops(), n)
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        for op in ("aten::_sparse_coo_tensor_with_dims_and_tensors", "aten::_values", "aten::unsqueeze"):
            self.assertTrue(has(op, "Sparse" + UNIFIED_DISPATCH_KEY), op)

    def test_generator_output_and_errors(self):
        with tempfile.TemporaryDirectory() as d:
            y = Path(d) / "a.yaml"
            y.write_text("- func: foo.bar(Tensor self) -> Tensor\n  dispatch:\n    Unified: foo_unified\n"
                         "- func: baz(Tensor self) -> Tensor\n  dispatch:\n    CPU: baz_cpu\n")
            out = gen_registrations.generate(y, Path(d) / "out.cpp")
            text = out.read_text()
            self.assertIn('m.impl("foo.bar", TORCH_FN(at::native::foo_unified));', text)
            self.assertNotIn("baz", text)
            y.write_text("- func: foo(Tensor self) -> Tensor\n  dispatch: {Unified: a}\n"
                         "- func: foo(Tensor self) -> Tensor\n  dispatch: {Unified: b}\n")
            with self.assertRaisesRegex(gen_registrations.YamlError, "listed twice"):
                gen_registrations.load_entries(y)
            y.write_text("- dispatch: {Unified: a}\n")
            with self.assertRaisesRegex(gen_registrations.YamlError, "no 'func:'"):
                gen_registrations.load_entries(y)


if __name__ == "__main__":
    run_tests()
