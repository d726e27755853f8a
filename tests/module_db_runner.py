"""Runs PyTorch's ModuleInfo database (``module_db``) on the unified device,
in child processes as tests/op_db_runner.py runs op_db (same protocol: an op
that kills the interpreter fails as that module's job).

A *job* is one ModuleInfo in one mode: eval and train where the ModuleInfo
says they differ, else train. For each of its module inputs the module is
built from the constructor input, moved to the unified device (parameters and
buffers in unified memory), and a deep copy of it to the reference device
(CUDA where ``torch.cuda.is_available()``, else the CPU). Both run the
forward input (built on the unified device by the ModuleInfo; the reference
gets copies) under the same seed, and must agree by value (``assertEqual``,
upstream's per-dtype tolerances). In train mode both then run backward from
the sum of their floating-point outputs, and the gradients of every parameter
(unified ones accumulate in unified memory) and of the inputs must agree.

Used by tests/test_module_db.py. ``python tests/module_db_runner.py report
OUTCOMES.json`` prints an outcomes file written with
``TORCH_DIRECT_MODULE_DB_OUTCOMES=OUTCOMES.json``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import unittest

import torch

import torch_direct  # registers the unified device before module_db is built
from torch.testing._internal.common_modules import module_db
from torch.testing._internal.common_utils import TestCase

import op_db_runner as ops

DTYPE = torch.float32
OUTCOMES_ENV = "TORCH_DIRECT_MODULE_DB_OUTCOMES"
UNIFIED_DEVICE = ops.UNIFIED_DEVICE


def modes(info) -> list[bool]:
    """The training flags upstream's @modules instantiates for the ModuleInfo."""
    return [False, True] if info.train_and_eval_differ else [True]


def mode_name(training: bool) -> str:
    return "train" if training else "eval"


JOBS = [(i, training) for i, info in enumerate(module_db) for training in modes(info)]
JOB_INDEX = {job: j for j, job in enumerate(JOBS)}


def job_record(j: int) -> dict:
    i, training = JOBS[j]
    return {"job": j, "module": module_db[i].name, "mode": mode_name(training)}


def _floating(x) -> list[torch.Tensor]:
    return [t for t in ops._tensors(x) if t.is_floating_point() or t.is_complex()]


def _grads(module: torch.nn.Module, inputs, leaves: list[int]) -> dict:
    """The gradients of the module's parameters and of the inputs at positions ``leaves``."""
    found = {f"param {n}": p.grad for n, p in module.named_parameters() if p.grad is not None}
    tensors = ops._tensors(inputs)
    for k in leaves:
        if tensors[k].grad is not None:
            found[f"input {k}"] = tensors[k].grad
    return found


def check_module(tc, info, training: bool, device: str, ref_device: str, on_sample=lambda k: None) -> dict:
    """Runs every module input of ``info`` on ``device`` and on ``ref_device``
    and compares them (forward; in train mode also the gradients). Raises
    ops.UnifiedRaised, ops.WrongResult or unittest.SkipTest."""
    if DTYPE not in set(info.supported_dtypes(ref_device)):
        raise unittest.SkipTest(f"the ModuleInfo does not support {ops.dtype_name(DTYPE)} on {ref_device}")
    torch.manual_seed(0)
    try:
        inputs = list(info.module_inputs_func(info, device=device, dtype=DTYPE,
                                              requires_grad=training, training=training))
    except unittest.SkipTest:
        raise
    except Exception as e:
        raise ops.UnifiedRaised(f"building the module inputs on {device}", e) from e
    stats = {"samples": 0, "both_raised": 0, "backward": 0}
    for k, mi in enumerate(inputs):
        on_sample(k)
        if mi.forward_input is None:
            continue
        what = f"input {k} {ops.describe((mi.forward_input.args, mi.forward_input.kwargs))}"
        c_args, c_kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
        f_args, f_kwargs = mi.forward_input.args, mi.forward_input.kwargs
        try:
            torch.manual_seed(k)
            m = info.module_cls(*c_args, **c_kwargs)
            ref_m = copy.deepcopy(m).to(ref_device).to(DTYPE)
            m.to(device).to(DTYPE)
        except Exception as e:
            raise ops.UnifiedRaised(f"{what}: building the module", e) from e
        m.train(training)
        ref_m.train(training)
        r_args, r_kwargs = ops.to_reference((f_args, f_kwargs), ref_device)
        # Inputs that require grad: the reference's copies do too. Gradients are
        # compared for those that are leaves on the unified side (a ModuleInfo
        # may derive an input from a leaf, which then keeps no .grad).
        leaves = []
        if training:
            for k, (a, r) in enumerate(zip(ops._tensors((f_args, f_kwargs)), ops._tensors((r_args, r_kwargs)))):
                r.requires_grad_(a.requires_grad)
                if a.requires_grad and a.is_leaf:
                    leaves.append(k)
        def seeded(call):
            torch.manual_seed(1)
            return call()
        out, ref, unified_error, ref_error = ops.run_both(lambda: seeded(lambda: m(*f_args, **f_kwargs)),
                                                          lambda: seeded(lambda: ref_m(*r_args, **r_kwargs)))
        if unified_error is not None:
            if type(ref_error) is type(unified_error):
                stats["both_raised"] += 1
                continue
            raise ops.UnifiedRaised(f"{what}: forward", unified_error) from unified_error
        if ref_error is not None:
            raise ops.WrongResult(f"{what}: returned a result where {ref_device} raised "
                                  f"{type(ref_error).__name__}: {str(ref_error)[:300]}")
        try:
            operands = (f_args, f_kwargs, list(m.parameters()), list(m.buffers()))
            if training:
                # While history is recorded through unified tensors, their views
                # are views of aliases on the compute device (docs/placement.md).
                allowed = {ops.rule_device(operands, ref_device), torch_direct.BACKEND_NAME}
                for t in ops._tensors(out):
                    tc.assertIn(t.device.type, allowed, msg=f"{what}: an output is on {t.device}")
            else:
                ops.check_placement(tc, out, operands, ref_device, what)
            tc.assertEqual(ops.to_cpu(out), ops.to_cpu(ref), msg=f"{what}: forward")
            for name, b in m.named_buffers():
                tc.assertEqual(b.device.type, torch_direct.BACKEND_NAME, msg=f"{what}: buffer {name}")
            tc.assertEqual(ops.to_cpu(dict(m.named_buffers())), ops.to_cpu(dict(ref_m.named_buffers())),
                           msg=f"{what}: buffers after forward")
        except AssertionError as e:
            raise ops.WrongResult(str(e)) from e
        stats["samples"] += 1
        outs = [t for t in _floating(out) if t.requires_grad]
        ref_outs = [t for t in _floating(ref) if t.requires_grad]
        if not training or not outs or len(outs) != len(ref_outs):
            continue
        try:
            sum(o.sum() for o in outs).backward()
        except Exception as e:
            raise ops.UnifiedRaised(f"{what}: backward", e) from e
        sum(o.sum() for o in ref_outs).backward()
        try:
            grads = _grads(m, (f_args, f_kwargs), leaves)
            ref_grads = _grads(ref_m, (r_args, r_kwargs), leaves)
            tc.assertEqual(sorted(grads), sorted(ref_grads), msg=f"{what}: which gradients exist")
            for name, g in grads.items():
                if name.startswith("param"):
                    tc.assertEqual(g.device.type, torch_direct.BACKEND_NAME,
                                   msg=f"{what}: {name}'s gradient is on {g.device}")
            tc.assertEqual(ops.to_cpu(grads), ops.to_cpu(ref_grads), msg=f"{what}: gradients")
        except AssertionError as e:
            raise ops.WrongResult(str(e)) from e
        stats["backward"] += 1
    if stats["samples"] == 0 and stats["both_raised"] == 0:
        raise unittest.SkipTest("the ModuleInfo has no forward inputs")
    return stats


class _Checks(TestCase):
    """The assertions (upstream's assertEqual and its tolerances) for the child's checks."""

    def runTest(self):
        pass


def run_job(tc, j: int, on_sample) -> dict:
    i, training = JOBS[j]
    record = job_record(j)
    start = time.monotonic()
    try:
        record.update(check_module(tc, module_db[i], training, UNIFIED_DEVICE, ops.reference_device(),
                                   on_sample))
        record["status"] = "passed"
    except unittest.SkipTest as e:
        record.update(status="skipped", message=str(e))
    except Exception as e:
        record.update(ops._classify(e))
    record["seconds"] = round(time.monotonic() - start, 3)
    return record


def run_jobs(first: int, end: int, **kw) -> dict[int, dict]:
    return ops.run_jobs_split(first, end, ops.workers(), script=__file__, record=job_record, **kw)


class OutcomeStore:
    """Outcomes of every job, computed in child processes on first use."""

    def __init__(self):
        self.outcomes: dict[int, dict] | None = None
        self.error: str | None = None
        self.seconds = 0.0

    def get(self, info, training: bool) -> dict:
        if self.outcomes is None and self.error is None:
            start = time.monotonic()
            try:
                self.outcomes = run_jobs(0, len(JOBS), log=lambda msg: print(msg, file=sys.stderr))
            except RuntimeError as e:
                self.error = str(e)
            self.seconds = time.monotonic() - start
            self.dump()
        if self.error is not None:
            raise RuntimeError(self.error)
        return self.outcomes[JOB_INDEX[(module_db.index(info), training)]]

    def dump(self) -> None:
        path = os.environ.get(OUTCOMES_ENV)
        if path and self.outcomes is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"seconds": round(self.seconds, 1), "reference_device": ops.reference_device(),
                           "outcomes": [self.outcomes[j] for j in sorted(self.outcomes)]}, f, indent=1)


def report(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    outcomes = data["outcomes"]
    counts = {s: sum(r["status"] == s for r in outcomes) for s in ops.STATUSES}
    print(f"{len(outcomes)} jobs (module x mode), reference device {data['reference_device']}, "
          f"{data['seconds']} s in children")
    print("  " + ", ".join(f"{s} {n}" for s, n in counts.items()))
    for r in outcomes:
        if r["status"] not in ("passed", "skipped"):
            print(f"  {r['status']:8s} {r['module']} ({r['mode']}): {r.get('cause', '')[:200]}")


def child_main(first: int, end: int, progress: str, results: str) -> None:
    tc = _Checks()
    ops.child_loop(first, end, progress, results, lambda j, on_sample: run_job(tc, j, on_sample))


def main(argv=None) -> None:
    ops.cli(argv, __doc__.splitlines()[0], child_main, report)


if __name__ == "__main__":
    main()
