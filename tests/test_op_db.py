"""PyTorch's whole OpInfo database (``op_db``: every op and named variant) run
on the unified device.

For each op at float32, bfloat16 and int64 (where its OpInfo supports them),
every sample input is built on the unified device by the OpInfo itself, run
there (rules R1-R6 decide where it computes), and compared with the same
sample run on the reference device: the CPU here, CUDA where
``torch.cuda.is_available()``. Results are compared by value with
``assertEqual`` (upstream's per-dtype tolerances); ops whose OpInfo says their
output is uninitialised or random are compared by contract (structure, shape,
dtype, layout). Every output must be on the compute device or unified, and one
over the bytes of a unified operand must be unified (R4, R6).

The samples run in child processes (tests/op_db_runner.py), a chunk of ops per
process, so an op that crashes the interpreter fails as that op's test. The
first test of each chunk runs the whole chunk; the others read its outcomes.
"""

import os
import unittest.mock

import torch

import torch_direct  # noqa: F401  (before common_device_type, which lists the device types it tests)
from torch.testing._internal.common_device_type import (
    OpDTypes,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests

import op_db_runner as runner
from common import extension_only

# Ops still known not to match the reference: (op name, variant) -> reason,
# as measured where the rules take their CPU branch (no GPU). Each must raise
# a clear Python exception at every dtype where it does not pass; an entry
# that instead gives a wrong result or crashes says so by starting its reason
# with "wrong result:" or "crashes:" (test_known_failure checks which).
_LCE = ("wrong result: at bfloat16: LinearCrossEntropyOptions picks the accumulation dtype by "
        "device.type, and 'unified' is not 'cpu', so it accumulates in bfloat16")
KNOWN_FAILURES = {
    ("nn.functional.linear_cross_entropy", "chunked"): _LCE,
    ("nn.functional.linear_cross_entropy", "chunked_none"): _LCE,
}

# The torch release whose op_db the list was measured with (other releases' databases differ).
MEASURED_ON = "2.14."

NOT_RAISING = {"wrong result:": "failed", "crashes:": "crashed"}


def expected_status(reason: str) -> str:
    for prefix, status in NOT_RAISING.items():
        if reason.startswith(prefix):
            return status
    return "raised"


def clear_exception(outcome: dict) -> bool:
    """Whether a raised outcome is an ordinary Python exception with a message:
    not an assertion of the check, not a C++ internal assert."""
    message = outcome.get("message", "")
    return (outcome.get("error_type") not in (None, "AssertionError", "SystemError")
            and outcome.get("phase") != "check"
            and ": " in message and message.split(": ", 2)[-1].strip() != ""
            and "INTERNAL ASSERT FAILED" not in message)


KNOWN_OPS = [op for op in op_db if runner.op_key(op) in KNOWN_FAILURES]
STORE = runner.OutcomeStore()


def describe(outcome: dict) -> str:
    return f"{outcome['status']}: {outcome.get('message', '')}"


# The child processes run the same tests under the same class and test names
# (op_db_runner.checks_class), so that the OpInfos' decorators act alike.
class TestUnifiedOpDb(TestCase):
    def outcome_of(self, device, op, dtype) -> dict:
        self.assertEqual(torch.device(device).type, torch_direct.BACKEND_NAME)
        self.assertEqual(torch.device(device), torch.device(runner.UNIFIED_DEVICE))
        return STORE.get(op, dtype)

    @ops(op_db, dtypes=OpDTypes.supported, allowed_dtypes=runner.DTYPES)
    def test_matches_reference(self, device, dtype, op):
        outcome = self.outcome_of(device, op, dtype)
        if outcome["status"] == "skipped":
            self.skipTest(outcome["message"])
        reason = KNOWN_FAILURES.get(runner.op_key(op))
        if reason is None:
            if outcome["status"] != "passed":
                self.fail(describe(outcome))
            return
        if outcome["status"] == "passed":
            return
        self.assertEqual(outcome["status"], expected_status(reason),
                         msg=f"known failure ({reason}) now ends {describe(outcome)}")
        self.skipTest(f"known failure, checked by test_known_failure: {reason}")

    def test_known_failures_name_ops(self, device):
        keys = {runner.op_key(op) for op in op_db}
        absent = [k for k in KNOWN_FAILURES if k not in keys]
        if absent and not torch.__version__.startswith(MEASURED_ON):
            self.skipTest(f"torch {torch.__version__}'s op_db lacks {absent}; the list was measured on "
                          f"torch {MEASURED_ON}")
        self.assertEqual(absent, [], msg="KNOWN_FAILURES entries that name no op_db OpInfo")

    if KNOWN_OPS:  # @ops refuses an empty list
        @ops(KNOWN_OPS, dtypes=OpDTypes.none)
        def test_known_failure(self, device, op):
            """Each KNOWN_FAILURES entry still fails, and the way its reason says:
            a clear exception unless the reason says otherwise."""
            reason = KNOWN_FAILURES[runner.op_key(op)]
            expected = expected_status(reason)
            outcomes = {d: self.outcome_of(device, op, d) for d in runner.job_dtypes(op)}
            failing = {d: o for d, o in outcomes.items() if o["status"] not in ("passed", "skipped")}
            self.assertTrue(failing, msg=f"{runner.op_key(op)} passes at every dtype: remove it "
                                         f"from KNOWN_FAILURES ({reason})")
            for dtype, outcome in failing.items():
                self.assertEqual(outcome["status"], expected,
                                 msg=f"{dtype}: {describe(outcome)} (known failure: {reason})")
                if expected == "raised":
                    self.assertTrue(clear_exception(outcome),
                                    msg=f"{dtype}: not a clear exception: {outcome.get('message')}")


instantiate_device_type_tests(TestUnifiedOpDb, globals(), only_for="privateuse1")


@extension_only("the op_db tests are instantiated for PrivateUse1, which the fork's native device is not")
class TestOpDbRunner(TestCase):
    """The harness itself: its checks can fail, and a dying op does not end the run."""

    def test_placement_check_rejects_a_cpu_view_of_a_unified_operand(self):
        u = torch.arange(6.0).to(runner.UNIFIED_DEVICE)
        ref = runner.reference_device()
        runner.check_placement(self, u.view(2, 3), (u,), ref, "view")
        runner.check_placement(self, u + 1, (u,), ref, "add")
        # A CPU alias breaks R4 everywhere; with CUDA as the compute device, the
        # CPU is not an allowed output device to begin with.
        with self.assertRaisesRegex(AssertionError, "view of .*unified operand|output 0 is on cpu"):
            runner.check_placement(self, torch_direct.cpu_alias(u), (u,), ref, "cpu alias")
        with self.assertRaisesRegex(AssertionError, "is on meta"):
            runner.check_placement(self, torch.empty(2, device="meta"), (u,), ref, "meta")

    def test_contract_check_rejects_other_shapes_and_dtypes(self):
        a = torch.zeros(2, 3)
        runner.check_contract(self, (torch.ones(2, 3),), (a,), "same")
        with self.assertRaises(AssertionError):
            runner.check_contract(self, torch.zeros(3, 2), a, "shape")
        with self.assertRaises(AssertionError):
            runner.check_contract(self, torch.zeros(2, 3, dtype=torch.float64), a, "dtype")
        with self.assertRaises(AssertionError):
            runner.check_contract(self, (a, a), (a,), "outputs")

    def test_reference_copy_keeps_storage_and_aliasing(self):
        u = torch.arange(10.0).to(runner.UNIFIED_DEVICE)
        view = u[2:6]
        ref_view, ref_u = runner.to_reference((view, u), "cpu")
        self.assertEqual(ref_view.device.type, "cpu")
        self.assertEqual(ref_view.storage_offset(), 2)
        # as_strided reads outside the view: the bytes of the whole storage came along.
        self.assertEqual(ref_view.as_strided((3,), (1,), 0), torch.arange(3.0))
        self.assertEqual(ref_view.untyped_storage().data_ptr(), ref_u.untyped_storage().data_ptr())
        self.assertNotEqual(ref_u.untyped_storage().data_ptr(), u.untyped_storage().data_ptr())
        self.assertEqual(runner.to_reference({"device": runner.UNIFIED_DEVICE}, "cpu"),
                         {"device": torch.device("cpu")})

    def test_children_run_the_jobs_of_these_tests(self):
        # Named after the PrivateUse1 test base's device type: PRIVATEUSE1, or UNIFIED once
        # another device-type test file of the run has set the base up.
        (instantiated,) = [v for k, v in globals().items() if k.startswith("TestUnifiedOpDb") and isinstance(v, type)]
        names = {n for n in dir(instantiated) if n.startswith(runner.TEST_NAME + "_")}
        self.assertEqual(names, {runner.job_test_name(j) for j in range(len(runner.JOBS))})

    def test_a_crashing_or_hanging_op_fails_alone(self):
        abs_op = next(op for op in op_db if runner.op_key(op) == ("abs", ""))
        j = runner.JOB_INDEX[(runner.OP_INDEX[id(abs_op)], torch.float32)]
        outcomes = runner.run_jobs(j, j + 3, timeout_s=5,
                                   extra_env={runner.FAULT_ENV: f"crash:{j},hang:{j + 1}"})
        self.assertEqual(sorted(outcomes), [j, j + 1, j + 2])
        self.assertEqual((outcomes[j]["status"], outcomes[j]["cause"]), ("crashed", "SIGSEGV"))
        self.assertIn("Segmentation fault", outcomes[j]["message"])
        self.assertEqual((outcomes[j + 1]["status"], outcomes[j + 1]["cause"]), ("crashed", "hung"))
        self.assertEqual(outcomes[j + 2]["status"], "passed")
        self.assertGreater(outcomes[j + 2]["samples"], 0)

    def test_split_run_gives_each_job_one_outcome(self):
        abs_op = next(op for op in op_db if runner.op_key(op) == ("abs", ""))
        j = runner.JOB_INDEX[(runner.OP_INDEX[id(abs_op)], torch.float32)]
        outcomes = runner.run_jobs_split(j, j + 4, 2, timeout_s=30,
                                         extra_env={runner.FAULT_ENV: f"crash:{j + 2}"})
        self.assertEqual(sorted(outcomes), [j, j + 1, j + 2, j + 3])
        self.assertEqual([outcomes[k]["job"] for k in sorted(outcomes)], [j, j + 1, j + 2, j + 3])
        self.assertEqual((outcomes[j + 2]["status"], outcomes[j + 2]["cause"]), ("crashed", "SIGSEGV"))
        self.assertEqual(outcomes[j + 3]["status"], "passed")

    def test_workers_setting_is_checked(self):
        for bad in ("0", "-2", "two"):
            with unittest.mock.patch.dict(os.environ, {runner.WORKERS_ENV: bad}):
                with self.assertRaisesRegex(ValueError, runner.WORKERS_ENV):
                    runner.workers()


if __name__ == "__main__":
    run_tests()
