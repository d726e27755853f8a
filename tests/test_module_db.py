"""PyTorch's whole ModuleInfo database (``module_db``) on the unified device:
every module with its parameters and buffers in unified memory, forward in
eval and train mode equal to the reference device's (the CPU here, CUDA where
``torch.cuda.is_available()``), and in train mode the gradients of its
parameters (accumulated in unified memory) and inputs equal too.

The modules run in child processes (tests/module_db_runner.py), so one that
crashes the interpreter fails as that module's test.
"""

import torch

import torch_direct  # noqa: F401  (before common_device_type, which lists the device types it tests)
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import TrainEvalMode, module_db, modules
from torch.testing._internal.common_utils import TestCase, run_tests

import module_db_runner as runner
from common import extension_only

# Modules still known not to match the reference: (module name, mode) -> reason,
# as measured where the rules take their CPU branch (no GPU). Each must fail
# the way its reason says (a clear exception unless it starts with
# "wrong result:" or "crashes:").
_LAZY = ("RuntimeError: stock Module.to() keeps a parameter's class only when "
         "TensorImpl::has_compatible_shallow_copy_type calls both devices dense, and its list of dense "
         "backends lacks PrivateUse1: the UninitializedParameter becomes a plain empty Parameter and is "
         "never materialized")
_IN_PLACE = ("RuntimeError: the composite writes in place into a new tensor of its input's (unified) device "
             "from the input that requires grad ({}), which the unified autograd kernel refuses")
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ("nn.LazyConv1d", "train"): _LAZY,
    ("nn.LazyConv2d", "train"): _LAZY,
    ("nn.LazyConv3d", "train"): _LAZY,
    ("nn.LazyConvTranspose1d", "train"): _LAZY,
    ("nn.LazyConvTranspose2d", "train"): _LAZY,
    ("nn.LazyConvTranspose3d", "train"): _LAZY,
    ("nn.CircularPad1d", "train"): _IN_PLACE.format("copy_"),
    ("nn.CircularPad2d", "train"): _IN_PLACE.format("copy_"),
    ("nn.CircularPad3d", "train"): _IN_PLACE.format("copy_"),
    ("nn.HingeEmbeddingLoss", "train"): _IN_PLACE.format("sub_"),
    ("nn.LinearCrossEntropyLoss", "train"): (
        "RuntimeError: its chunked loss is a torch.library custom op, not an aten op: the unified autograd "
        "kernels do not cover it, so its formula is recorded against the unified input and returns a "
        "gradient on the compute device, which the engine rejects"),
}

# The torch release whose module_db the list was measured with.
MEASURED_ON = "2.14."

STORE = runner.OutcomeStore()


def describe(outcome: dict) -> str:
    return f"{outcome['status']}: {outcome.get('message', '')}"


def expected_status(reason: str) -> str:
    for prefix, status in (("wrong result:", "failed"), ("crashes:", "crashed")):
        if reason.startswith(prefix):
            return status
    return "raised"


@extension_only("the module_db tests are instantiated for PrivateUse1 (the extension's unified device) "
                "and need autograd kernels for unified operands, which the fork's Unified key lacks yet")
class TestUnifiedModuleDb(TestCase):
    @modules(module_db, allowed_dtypes=(runner.DTYPE,), train_eval_mode=TrainEvalMode.train_and_eval)
    def test_matches_reference(self, device, dtype, module_info, training):
        self.assertEqual(torch.device(device), torch.device(runner.UNIFIED_DEVICE))
        outcome = STORE.get(module_info, training)
        if outcome["status"] == "skipped":
            self.skipTest(outcome["message"])
        reason = KNOWN_FAILURES.get((module_info.name, runner.mode_name(training)))
        if reason is None:
            if outcome["status"] != "passed":
                self.fail(describe(outcome))
            return
        self.assertNotEqual(outcome["status"], "passed",
                            msg=f"{module_info.name} now passes: remove it from KNOWN_FAILURES ({reason})")
        self.assertEqual(outcome["status"], expected_status(reason),
                         msg=f"known failure ({reason}) now ends {describe(outcome)}")
        self.skipTest(f"known failure: {reason}")

    def test_known_failures_name_modules(self, device):
        names = {info.name for info in module_db}
        absent = [k for k in KNOWN_FAILURES if k[0] not in names]
        if absent and not torch.__version__.startswith(MEASURED_ON):
            self.skipTest(f"torch {torch.__version__}'s module_db lacks {absent}; the list was measured on "
                          f"torch {MEASURED_ON}")
        self.assertEqual(absent, [])

    def test_the_jobs_are_the_instantiated_tests(self, device):
        jobs = {(module_db[i].name, training) for i, training in runner.JOBS}
        expected = {(info.name, training) for info in module_db for training in runner.modes(info)}
        self.assertEqual(jobs, expected)
        self.assertGreater(len(jobs), 100)


instantiate_device_type_tests(TestUnifiedModuleDb, globals(), only_for="privateuse1")


if __name__ == "__main__":
    run_tests()
