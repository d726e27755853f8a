"""The fork's tooling that needs no PyTorch tree: the native_functions merge, the
patch series' form, the Dockerfile check, the upstream test list."""

import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock
from pathlib import Path

import yaml
from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_scripts"))
import merge_native_functions as merge  # noqa: E402

from scriptmod import load as load_script  # noqa: E402
from common import IS_FORK  # noqa: E402

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

- func: index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
  structured_delegate: index.Tensor_out
  variants: function, method
  dispatch:
    QuantizedCPU: quantized_index
  tags: [core, dynamic_output_shape]
  # NB: a trailing comment

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
            ({"func": "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
              "dispatch": {"CPU, Unified": "k"}},
             "add.Tensor: the addition also dispatches CPU; it has structured_delegate 'add.out'"),
            ({"func": "view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
              "dispatch": {"Unified": "k", "CUDA": "c"}},
             "view: the addition also dispatches CUDA; only the Unified entry"),
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
        with self.assertRaisesRegex(merge.MergeConflict, "view: listed twice"):
            merge.merge_text(ATEN, [add("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", "a")] * 2)

    def test_unified_overrides_a_structured_delegate_for_unified_only(self):
        index = "index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"
        add_t = "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
        text, report = merge.merge_text(ATEN, [add(index, "index_Tensor_unified"),
                                               add(add_t, "add_unified")])
        # into the existing dispatch table; a table is made for an op without one
        self.assertIn("    QuantizedCPU: quantized_index\n    Unified: index_Tensor_unified\n  tags:", text)
        self.assertIn("  structured_delegate: add.out\n  dispatch:\n    Unified: add_unified\n", text)
        self.assertIn("# NB: a trailing comment", text)
        parsed = {merge.op_name(e["func"]): e for e in yaml.safe_load(text)}
        self.assertEqual(parsed["index.Tensor"]["dispatch"],
                         {"QuantizedCPU": "quantized_index", "Unified": "index_Tensor_unified"})
        self.assertEqual(parsed["index.Tensor"]["structured_delegate"], "index.Tensor_out")
        self.assertEqual(parsed["add.Tensor"]["dispatch"], {"Unified": "add_unified"})
        self.assertEqual(parsed["add.Tensor"]["structured_delegate"], "add.out")
        self.assertEqual(report, [
            "add Unified: index_Tensor_unified to index.Tensor "
            "(overrides structured_delegate index.Tensor_out for Unified only)",
            "add Unified: add_unified to add.Tensor (overrides structured_delegate add.out for Unified only)"])
        again, report2 = merge.merge_text(text, [add(index, "index_Tensor_unified"),
                                                 add(add_t, "add_unified")])
        self.assertEqual((again, report2), (text, []))  # idempotent
        # still refused: a non-Unified key next to the delegate, another Unified kernel
        for extra in ("CPU", "CUDA", "QuantizedCPU", "CompositeExplicitAutograd"):
            with self.assertRaisesRegex(merge.MergeConflict, f"index.Tensor: the addition also dispatches "
                                        f"{extra}; it has structured_delegate 'index.Tensor_out'"):
                merge.merge_text(ATEN, [{"func": index, "dispatch": {"Unified": "k", extra: "k2"}}])
        with self.assertRaisesRegex(merge.MergeConflict, "add.Tensor: already dispatches Unified to 'add_unified'"):
            merge.merge_text(text, [add(add_t, "other_unified")])

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


class TestSeries(TestCase):
    def test_series_lists_every_patch_in_order_with_a_header(self):
        listed = [l for l in (ROOT / "patches/series").read_text().splitlines()
                  if l and not l.startswith("#")]
        on_disk = sorted(p.name for p in (ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
        self.assertEqual(listed, on_disk)
        self.assertEqual([int(n[:4]) for n in listed], list(range(1, len(listed) + 1)))
        for name in listed:
            text = (ROOT / "patches" / name).read_text()
            self.assertTrue(text.startswith("From 0000000000000000000000000000000000000000"), name)
            header = text.split("\n---\n")[0]
            self.assertRegex(header, r"\nUpstream: ", f"{name} does not say whether it is meant for upstream")
            self.assertIn("diff --git", text)

    def test_series_adds_the_unified_backend_and_torchgen_entry(self):
        text = "".join(p.read_text() for p in (ROOT / "patches").glob("*.patch"))
        for needle in ("+  _(Unified, extra)", "DispatchKey.Unified", "TorchDirect.cmake",
                       "THPVariable_is_unified", "set_unified_operand_hook"):
            self.assertIn(needle, text)


REGISTER_UNIFIED = """\
namespace {
at::Tensor wrapper_Unified_Tensor_index(const at::Tensor & self, const c10::List<::std::optional<at::Tensor>> & indices) {
    // No device check
  // DeviceGuard omitted
  return at::native::index_Tensor_unified(self, indices);
}
} // anonymous namespace
namespace {
at::Tensor wrapper_Unified__gather(const at::Tensor & self, int64_t dim, const at::Tensor & index, bool sparse_grad) {
  return at::native::gather_unified(self, dim, index, sparse_grad);
}
} // anonymous namespace
TORCH_LIBRARY_IMPL(aten, Unified, m) {
m.impl("index.Tensor",
TORCH_FN(wrapper_Unified_Tensor_index));
m.impl("gather",
TORCH_FN(wrapper_Unified__gather));
}
"""


class TestVerify(TestCase):
    def test_registrations_follow_each_impl_into_its_wrapper(self):
        verify = load_script("verify")
        self.assertEqual(verify.unified_registrations(REGISTER_UNIFIED),
                         {"index.Tensor": "index_Tensor_unified", "gather": "gather_unified"})
        swapped = REGISTER_UNIFIED.replace("TORCH_FN(wrapper_Unified__gather)",
                                           "TORCH_FN(wrapper_Unified_Tensor_index)")
        self.assertEqual(verify.unified_registrations(swapped)["gather"], "index_Tensor_unified")
        with self.assertRaisesRegex(RuntimeError, "no TORCH_LIBRARY_IMPL"):
            verify.registrations(REGISTER_UNIFIED, "CPU")

    def test_expected_kernels_are_the_additions(self):
        verify = load_script("verify")
        additions = yaml.safe_load(merge.DEFAULT_ADDITIONS.read_text())
        self.assertEqual(verify.expected_unified_kernels(),
                         {merge.op_name(a["func"]): a["dispatch"]["Unified"] for a in additions})


    def test_export_check_names_symbols_hidden_in_the_library(self):
        # what left the first fork build unlinkable: c10 compiled with hidden
        # visibility, c10::unified functions called from another library
        verify = load_script("verify")
        lib_src = ("namespace c10::unified {\n"
                   "%s int shown();\n int hidden_one();\n"
                   "int shown() { return 1; }\n int hidden_one() { return 2; }\n}\n")
        user_src = ("namespace c10::unified { int shown(); int hidden_one(); }\n"
                    "namespace other { int g() { return 0; } }\n"
                    "int use() { return c10::unified::shown() + c10::unified::hidden_one() + other::g(); }\n")
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            (d / "lib.cpp").write_text(lib_src % '__attribute__((visibility("default")))')
            (d / "user.cpp").write_text(user_src)
            subprocess.run(["g++", "-shared", "-fPIC", "-fvisibility=hidden", str(d / "lib.cpp"),
                            "-o", str(d / "lib.so")], check=True)
            subprocess.run(["g++", "-c", "-fPIC", str(d / "user.cpp"), "-o", str(d / "user.o")], check=True)
            self.assertEqual(verify.unexported(d / "lib.so", [d / "user.o"]),
                             (2, ["c10::unified::hidden_one()"]))
            # default visibility: everything exported, nothing reported
            subprocess.run(["g++", "-shared", "-fPIC", str(d / "lib.cpp"), "-o", str(d / "lib.so")], check=True)
            self.assertEqual(verify.unexported(d / "lib.so", [d / "user.o"]), (2, []))


class TestUpstreamRunner(TestCase):
    def setUp(self):
        self.runner = load_script("run_upstream_tests")

    def test_list_is_read_as_files_and_deselected_ids(self):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "list.txt"
            p.write_text("# header\ntest_a.py\n\ntest_b.py  # why\n- test_a.py::T::t  # reason\n")
            self.assertEqual(self.runner.read_list(p), (["test_a.py", "test_b.py"], ["test_a.py::T::t"]))

    def test_a_file_with_nothing_selected_runs_nothing(self):
        # pytest given no ids would collect and run the whole folder
        with tempfile.TemporaryDirectory() as d, mock.patch.object(self.runner.subprocess, "run") as run:
            res = self.runner.run_file(Path(sys.executable), Path(d), "test_x.py", [], 60.0, {}, Path(d))
        run.assert_not_called()
        self.assertEqual((res["selected"], res["ran"], res["timed_out"]), (0, 0, False))

    def test_a_run_counts_outcomes_and_keeps_each_failure_message(self):
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            (work / self.runner.PLUGIN).with_suffix(".py").write_text(self.runner.PLUGIN_SOURCE)
            (work / "test_x.py").write_text(
                "import pytest\n"
                "def test_ok(): pass\n"
                "def test_bad(): raise ValueError('unified went wrong')\n"
                "@pytest.mark.skip(reason='not here')\n"
                "def test_skip(): pass\n")
            ids = ["test_x.py::test_ok", "test_x.py::test_bad", "test_x.py::test_skip"]
            env = dict(os.environ, PYTHONPATH=str(work))
            res = self.runner.run_file(Path(sys.executable), work, "test_x.py", ids, 120.0, env, work)
        self.assertEqual((res["passed"], res["failed"], res["skipped"]), (1, 1, 1))
        self.assertEqual(res["failed_ids"], ["test_x.py::test_bad"])
        self.assertIn("ValueError: unified went wrong", res["failure_messages"]["test_x.py::test_bad"])
        (reason, count), = res["skip_reasons"].items()
        self.assertEqual(count, 1)
        self.assertIn("not here", reason)

    def test_sample_is_spread_and_deterministic(self):
        ids = [f"t{i}" for i in range(10)]
        self.assertEqual(self.runner.spread(ids, 3), ["t0", "t3", "t6"])
        self.assertEqual(self.runner.spread(ids, 0), ids)
        self.assertEqual(self.runner.spread(ids, 50), ids)

    def test_compare_lists_what_passes_on_the_second_and_fails_on_the_first(self):
        def rec(label, passed, failed):
            return {"label": label, "files": {"test_x.py": {
                "selected": 3, "passed": len(passed), "failed": len(failed), "skipped": 0, "error": 0,
                "not_run": 3 - len(passed) - len(failed), "timed_out": False,
                "passed_ids": passed, "failed_ids": failed}}}
        out = self.runner.compare(rec("fork", ["a"], ["b", "c"]), rec("stock", ["a", "b"], ["c"]))
        self.assertEqual(out["regressions"], 1)
        self.assertEqual(out["files"]["test_x.py"]["pass_on_second_fail_on_first"], ["b"])
        self.assertEqual(out["files"]["test_x.py"]["ran_on_both"], 3)

    def test_device_generic_tests_are_paired_across_devices(self):
        ids = ["t.py::TestOpsCPU::test_add_cpu_float32",
               "t.py::TestOpsPRIVATEUSE1::test_add_unified_float32",
               "t.py::TestOpsCPU::test_cpu_to_x_cpu",           # the device name inside the test name
               "t.py::TestOpsUNIFIED::test_cpu_to_x_unified",
               "t.py::TestOpsCPU::test_only_here_cpu",          # no unified copy: not a pair
               "t.py::TestPlain::test_plain",                   # not device-generic
               "t.py::TestOpsCUDA::test_add_cuda_float32"]      # another device
        pairs = self.runner.pair_tests(ids, "cpu")
        self.assertEqual(pairs, [
            ("t.py::TestOps::test_add_{device}_float32", ids[0], ids[1]),
            ("t.py::TestOps::test_cpu_to_x_{device}", ids[2], ids[3])])
        self.assertEqual(self.runner.device_key(ids[6], ("cuda", "unified")),
                         ("cuda", "t.py::TestOps::test_add_{device}_float32"))
        self.assertIsNone(self.runner.device_key("t.py::TestPlain::test_plain", ("cpu", "unified")))

    def test_device_differences_are_classified_and_known_ones_keep_their_reason(self):
        pairs = [("k::A::a_{device}", "ra", "ua"), ("k::A::b_{device}", "rb", "ub"),
                 ("k::A::c_{device}_float32", "rc", "uc"), ("k::A::d_{device}", "rd", "ud")]
        res = {"passed_ids": ["ra", "ua", "rb", "rc", "ud"], "failed_ids": ["ub", "uc", "rd"],
               "failure_messages": {"ub": "RuntimeError: b broke", "uc": "c broke"}}
        out = self.runner.classify_pairs(pairs, res, [("k::A::c_{device}_*", "why c")])
        self.assertEqual(out["both_passed"], 1)
        self.assertEqual(out["differences"], ["k::A::b_{device}"])
        self.assertEqual(out["difference_messages"], {"k::A::b_{device}": "RuntimeError: b broke"})
        self.assertEqual(out["known_differences"], {"k::A::c_{device}_float32": "why c"})
        self.assertEqual(out["pass_on_unified_fail_on_reference"], ["k::A::d_{device}"])
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "known.txt"
            p.write_text("# comment\n\nf.py::T::t_{device}  # a reason\n")
            self.assertEqual(self.runner.read_known(p), [("f.py::T::t_{device}", "a reason")])

    def test_every_known_device_difference_names_a_listed_file_and_a_reason(self):
        files, _ = self.runner.read_list(self.runner.LIST)
        for line in self.runner.KNOWN.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                pattern, _, reason = line.partition("#")
                self.assertIn(pattern.split("::")[0].strip(), files, line)
                self.assertTrue(reason.strip(), f"no reason: {line}")

    def test_bad_arguments_are_refused_before_any_work(self):
        for args, msg in ((["--wheel", "/nonexistent.whl", "--label", "x"], "not a wheel file"),
                          (["--device", "unified", "--files", "test_nope.py"], "not in upstream_tests.txt"),
                          (["--device", "unified", "--compare", "a", "b"], "--device runs on its own"),
                          (["--label", "x"], "--wheel and --label are required"),
                          (["--compare", "/nonexistent1", "/nonexistent2"], "no such file")):
            r = subprocess.run([sys.executable, str(ROOT / "build_scripts/run_upstream_tests"), *args],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(msg, r.stderr)


class TestDocker(TestCase):
    @unittest.skipUnless((ROOT / ".dockerignore").is_file(),
                         "needs the build context (the whole repository), not an image's copy of part of it")
    def test_dockerfile_copies_only_what_exists(self):
        check = load_script("check_docker")
        self.assertEqual(check.check(ROOT / "docker/Dockerfile"), [])
        with tempfile.TemporaryDirectory() as d:
            bad = Path(d) / "Dockerfile"
            bad.write_text("FROM x AS builder\nCOPY no_such_dir/ /a/\nCOPY --from=builder /x /y\n"
                           "RUN build_scripts/build_wheel\n")
            problems = check.check(bad)
            self.assertTrue(any("no_such_dir/ does not exist" in p for p in problems), problems)
            self.assertTrue(any("no stage named experiments" in p for p in problems), problems)
            self.assertFalse(any("/x" in p for p in problems), problems)

    def test_continuation_lines_are_joined(self):
        check = load_script("check_docker")
        got = check.instructions("# c\nRUN a \\\n    b\nCOPY x y\n")
        self.assertEqual(got, [(2, "RUN", "a b"), (4, "COPY", "x y")])


class TestUpstreamTestList(TestCase):
    def test_every_skip_names_a_listed_file_and_a_reason(self):
        lines = [l.strip() for l in (ROOT / "build_scripts/upstream_tests.txt").read_text().splitlines()]
        files = {l for l in lines if l and not l.startswith(("#", "-"))}
        skips = [l for l in lines if l.startswith("- ")]
        self.assertTrue(files and skips)
        for s in skips:
            target, _, reason = s[2:].partition("#")
            self.assertIn(target.split("::")[0].strip(), files, s)
            self.assertTrue(reason.strip(), f"skip without a reason: {s}")


FAKE_FORK = """
import sys, types
import torch
# Stand in for a fork wheel: "unified" parses, torch._C._unified exists, and
# PrivateUse1 keeps its default name (the fork does not rename it).
torch.utils.rename_privateuse1_backend("unified")
calls = []
torch._C._unified = types.SimpleNamespace(**{
    n: (lambda n: lambda *a: calls.append(n) or {"allocated_bytes": 0})(n)
    for n in ("_memory_stats", "_empty_cache", "_reset_peak", "_cuda_available",
              "_pin_inplace", "_pinned_owner", "_share", "_from_shared", "_block_kind",
              "_is_mapped", "_map_for_gpu", "_as_cuda_alias", "_as_cpu_alias",
              "_gather_rows_cpu", "_claimed_structured_ops", "_claimed_sparse_ops",
              "_claimed_autograd_ops")})
real_name = torch._C._get_privateuse1_backend_name
torch._C._get_privateuse1_backend_name = lambda: "privateuseone"
import torch_direct
torch._C._get_privateuse1_backend_name = real_name
from torch_direct import _backend
assert torch_direct.vehicle() == "fork", torch_direct.vehicle()
assert isinstance(torch_direct._C, _backend._ForkC), type(torch_direct._C)
assert sys.modules["torch_direct._C"] is torch_direct._C
assert _backend.ACCELERATOR_HOOK_SLOTS == 0
assert not hasattr(torch.Tensor, "is_unified"), "registered PrivateUse1 methods on a fork"
assert dict(torch_direct.memory_stats()) == {"allocated_bytes": 0}
assert calls == ["_memory_stats"], calls
# The gathers are the fork's (torch._C._unified, patch 0006); the samplers are not the
# device's: the GNN stack builds its own module on either vehicle.
assert torch_direct._C._gather_rows_cpu is torch._C._unified._gather_rows_cpu
assert not hasattr(torch_direct._C.__class__, "_sample_neighbors")
try:
    torch_direct._C._parallel_threads_used  # a test hook of the extension's module
except AttributeError as e:
    assert "fork wheel" in str(e), e
else:
    raise AssertionError("an extension-only name resolved on the fork")
# A fork wheel built before driver_mapped was bound (this stand-in binds no _driver_mapped_empty)
try:
    torch_direct.driver_mapped(torch.zeros(2))
except RuntimeError as e:
    assert "older than it" in str(e), e
else:
    raise AssertionError("driver_mapped ran without the fork's binding")
print("fork-ok")
"""


class TestSetupOnFork(TestCase):
    """setup.py compiles the extension on stock torch and nothing on a fork wheel."""

    def native_unified(self, torch_module):
        src = (ROOT / "setup.py").read_text()
        body = src[src.index("def native_unified()"):src.index("def want_cuda()")]
        ns = {"torch": torch_module}
        exec(body, ns)  # just the detection function, against the given torch
        return ns["native_unified"]()

    @unittest.skipIf(IS_FORK, "the installed torch is a fork wheel, not stock torch")
    def test_stock_torch_builds_the_extension(self):
        import torch
        self.assertFalse(self.native_unified(torch))

    def test_fork_wheel_builds_nothing(self):
        import types
        fork = types.SimpleNamespace(
            _C=types.SimpleNamespace(_unified=object(),
                                     _get_privateuse1_backend_name=lambda: "privateuseone"),
            device=lambda s: types.SimpleNamespace(type=s))
        self.assertTrue(self.native_unified(fork))
        renamed = types.SimpleNamespace(  # the extension already loaded: not native
            _C=types.SimpleNamespace(_unified=object(),
                                     _get_privateuse1_backend_name=lambda: "unified"),
            device=lambda s: types.SimpleNamespace(type=s))
        self.assertFalse(self.native_unified(renamed))


class TestVehicle(TestCase):
    """torch_direct detects a native Unified device (fork wheel) before it registers anything."""

    def fake_torch(self, has_runtime=True, parses=True, privateuse1="privateuseone"):
        import types

        def device(name):
            if not parses:
                raise RuntimeError(f"Expected one of cpu, cuda, ... device type at start of {name}")
            return types.SimpleNamespace(type=name)

        c = types.SimpleNamespace(_get_privateuse1_backend_name=lambda: privateuse1)
        if has_runtime:
            c._unified = types.SimpleNamespace()
        return types.SimpleNamespace(_C=c, device=device)

    def test_detection(self):
        from torch_direct import _backend

        detect = _backend.native_unified_device
        self.assertTrue(detect(self.fake_torch()))
        self.assertFalse(detect(self.fake_torch(has_runtime=False)))
        self.assertFalse(detect(self.fake_torch(parses=False)))
        # "unified" parses because the extension renamed PrivateUse1: not native.
        self.assertFalse(detect(self.fake_torch(privateuse1="unified")))

    def test_this_process(self):
        import torch
        import torch_direct

        expected = "fork" if hasattr(torch._C, "_unified") else "extension"
        self.assertEqual(torch_direct.vehicle(), expected)

    @unittest.skipIf(IS_FORK, "a stand-in fork over stock torch; on a fork wheel "
                              "build_scripts/tests/fork_wheel_smoke.py checks the real one")
    def test_import_on_a_fork_registers_nothing(self):
        r = subprocess.run([sys.executable, "-c", FAKE_FORK], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("fork-ok", r.stdout)


if __name__ == "__main__":
    run_tests()
