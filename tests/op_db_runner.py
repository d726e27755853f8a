"""Runs PyTorch's OpInfo database (``op_db``) on the unified device in child
processes, so that an op that crashes the interpreter is recorded as a crash
of that op instead of ending the run.

A *job* is one OpInfo (op and variant) at one dtype. Every process numbers the
jobs the same way (``JOBS``: op_db order, then dtype order). The ops are cut
into chunks of ``CHUNK_OPS``; a chunk's jobs run in one child process
(``python tests/op_db_runner.py child ...``) that, before each job and each
sample, appends a line to a progress file and, after each job, a JSON line
with the job's outcome to a results file (both written unbuffered). When the
child dies by a signal, exits abnormally, or makes no progress for
``JOB_TIMEOUT_S``, the job it was on is recorded as ``crashed`` (cause: the
signal, or ``hung``) and a new child resumes at the next job.

The child runs each job as a test of a device-type test class with the class
and test names of tests/test_op_db.py's (``checks_class``), so the OpInfos'
own decorators (skips, onlyCUDA, slowTest, tolerance overrides) act on the
job as on its test in the parent.

Outcomes (``status``): ``passed``; ``failed`` (the op ran on the unified
device but its result differs from the reference device's); ``raised`` (the
op, or building its samples, raised on the unified device where the
reference device did not); ``crashed``; ``skipped`` (with the reason).

The reference device is the one rule R3 runs an all-unified op on: CUDA when
``torch.cuda.is_available()``, else the CPU (docs/placement.md).

Used by tests/test_op_db.py (``OutcomeStore``). Also a command line tool:
``python tests/op_db_runner.py report OUTCOMES.json`` prints the counts and the
failures grouped by cause of an outcomes file written by a test run with
``TORCH_DIRECT_OP_DB_OUTCOMES=OUTCOMES.json``.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

import torch

import torch_direct  # registers the unified device before op_db is built
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import DecorateInfo

# The dtypes each op is run at, where its OpInfo supports them: the default
# float, one reduced-precision float and one integer type.
DTYPES = (torch.float32, torch.bfloat16, torch.int64)
# Sample inputs run per job (op x dtype), in the OpInfo's order; None for all.
MAX_SAMPLES_PER_OP = None
# OpInfos per child process (a child imports torch and op_db: a few seconds).
CHUNK_OPS = 120
# A job that shows no progress (no new sample) for this long is killed.
JOB_TIMEOUT_S = 180
# A child that has not started its first job after this long is killed.
STARTUP_TIMEOUT_S = 300
# Where the outcomes of a test run are written (JSON), when set.
OUTCOMES_ENV = "TORCH_DIRECT_OP_DB_OUTCOMES"
# How many child processes run a chunk's jobs side by side (default 1).
WORKERS_ENV = "TORCH_DIRECT_OP_DB_WORKERS"

STATUSES = ("passed", "failed", "raised", "crashed", "skipped")
UNIFIED_DEVICE = f"{torch_direct.BACKEND_NAME}:0"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def reference_device() -> str:
    """Where rule R3 computes an op whose tensor operands are all unified."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def op_key(op) -> tuple[str, str]:
    return (op.name, op.variant_test_name)


def job_dtypes(op) -> list[torch.dtype]:
    """The dtypes of DTYPES the OpInfo supports on the unified device, in
    DTYPES order (the same set ``@ops(dtypes=OpDTypes.supported,
    allowed_dtypes=DTYPES)`` instantiates)."""
    supported = set(op.supported_dtypes("privateuse1"))
    return [d for d in DTYPES if d in supported]


JOBS = [(i, dtype) for i, op in enumerate(op_db) for dtype in job_dtypes(op)]
JOB_INDEX = {(i, dtype): j for j, (i, dtype) in enumerate(JOBS)}
OP_INDEX = {id(op): i for i, op in enumerate(op_db)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------
# What one job does (in the child).

class WrongResult(AssertionError):
    """The unified result differs from the reference device's."""


class UnifiedRaised(Exception):
    """The op raised on the unified device; ``error`` is its exception."""

    def __init__(self, phase: str, error: BaseException):
        super().__init__(phase, error)
        self.phase = phase
        self.error = error


def upstream_skip_reasons(op, dtype) -> list[str]:
    """Reasons of the skips the OpInfo puts, for every device type, on
    upstream's own comparison of a device with the CPU
    (TestCommon.test_compare_cpu)."""
    reasons = []
    for info in op.decorators:
        if not (isinstance(info, DecorateInfo) and info.test_name == "test_compare_cpu"
                and info.cls_name in (None, "TestCommon") and info.device_type is None
                and info.active_if and (info.dtypes is None or dtype in info.dtypes)):
            continue
        for decorator in info.decorators:
            try:
                why = getattr(decorator(lambda: None), "__unittest_skip_why__", None)
            except Exception:
                why = None
            if why:
                reasons.append(why)
    return reasons


def not_comparable_reason(op, dtype) -> str | None:
    """Why the op's results cannot be compared by value, from the OpInfo's own
    attributes (uninitialised or random output), or None."""
    if getattr(op, "has_nondeterministic_output", False):   # an attribute of newer releases' OpInfo
        return "OpInfo.has_nondeterministic_output"
    if op.name.startswith(("empty", "new_empty")):
        # Older releases' OpInfos for these lack the attribute, and some skip
        # test_compare_cpu with a bare "Skipped!".
        return "the op returns uninitialised memory"
    for why in upstream_skip_reasons(op, dtype):
        if "non-deterministic" in why or "not comparable" in why:
            return f"OpInfo skips test_compare_cpu: {why}"
    return None


def _map(x, f):
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        mapped = [_map(e, f) for e in x]
        return type(x)(*mapped) if hasattr(x, "_fields") else type(x)(mapped)
    if isinstance(x, dict):
        return {k: _map(v, f) for k, v in x.items()}
    return f(x)


def _is_unified_device(x) -> bool:
    if isinstance(x, torch.device):
        return x.type == torch_direct.BACKEND_NAME
    if isinstance(x, str):
        try:
            return torch.device(x).type == torch_direct.BACKEND_NAME
        except (RuntimeError, ValueError):
            return False
    return False


def to_reference(x, ref: str):
    """``x`` with every unified tensor copied to ``ref``, every other tensor
    copied on its own device, and the unified device named as ``ref`` (factory
    kwargs). A strided tensor is copied with its whole storage and keeps its
    size, strides and offset, so that ops reading storage outside a view
    (as_strided) see the same bytes; tensors that share a storage share the
    copy."""
    copies = {}

    def f(e):
        if isinstance(e, torch.Tensor):
            on = ref if e.device.type == torch_direct.BACKEND_NAME else e.device
            return _copy_tensor(e.detach(), on, copies)
        if _is_unified_device(e):
            return torch.device(ref)
        return e
    return _map(x, f)


def _copy_tensor(t: torch.Tensor, ref: str, copies: dict) -> torch.Tensor:
    ptr = _storage_ptr(t)
    if ptr == 0 or t.is_conj() or t.is_neg() or t.is_quantized:
        return t.to(ref, copy=True)
    key = (t.device, ptr)
    if key not in copies:
        flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        copies[key] = flat.to(ref, copy=True)
    out = torch.empty(0, dtype=t.dtype, device=ref)
    return out.set_(copies[key].untyped_storage(), t.storage_offset(), t.size(), t.stride())


def to_cpu(x):
    return _map(x, lambda e: e.detach().cpu() if isinstance(e, torch.Tensor) else e)


def describe(x) -> str:
    """A short description of a sample's arguments (shapes, not values)."""
    def f(e):
        if isinstance(e, torch.Tensor):
            return f"T{tuple(e.shape)}:{dtype_name(e.dtype)}@{e.device.type}"
        return e
    text = repr(_map(x, f))
    return text if len(text) <= 300 else text[:297] + "..."


def _tensors(x) -> list[torch.Tensor]:
    found = []
    _map(x, lambda e: found.append(e) if isinstance(e, torch.Tensor) else None)
    return found


def _storage_ptr(t: torch.Tensor) -> int:
    if t.layout != torch.strided:
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def rule_device(operands, ref_device: str) -> str:
    """The device type rules R1-R3 compute on, given the op's operands."""
    tensors = _tensors(operands)
    if any(t.device.type == "cuda" for t in tensors):
        return "cuda"  # R1
    if any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
        return "cpu"  # R2
    return torch.device(ref_device).type  # R3


def _devices(x) -> list:
    """The devices named in a call's arguments (torch.device objects and device= strings)."""
    found = []
    if isinstance(x, torch.device):
        found.append(x)
    elif isinstance(x, dict):
        for k, v in x.items():
            if k == "device" and isinstance(v, (str, int)):
                found.append(torch.device(v))
            else:
                found += _devices(v)
    elif isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        for e in x:
            found += _devices(e)
    return found


def check_placement(tc, out, operands, ref_device: str, what: str) -> None:
    """R1-R4/R6 on the outputs: every tensor is on the compute device or
    unified, and one over the bytes of a unified operand (a view, an in-place
    result) is a unified tensor."""
    unified_ptrs = {p for p in (_storage_ptr(t) for t in _tensors(operands)
                                if t.device.type == torch_direct.BACKEND_NAME) if p}
    allowed = {rule_device(operands, ref_device), torch_direct.BACKEND_NAME}
    # a device the call names (device="cpu"), and torch's default device when no operand is unified
    allowed |= {d.type for d in _devices(operands)}
    if not any(t.device.type == torch_direct.BACKEND_NAME for t in _tensors(operands)):
        allowed.add("cpu")
    for k, t in enumerate(_tensors(out)):
        tc.assertIn(t.device.type, allowed, msg=f"{what}: output {k} is on {t.device}")
        if _storage_ptr(t) in unified_ptrs:
            tc.assertEqual(t.device.type, torch_direct.BACKEND_NAME,
                           msg=f"{what}: output {k} is a view of (or written into) a unified "
                               f"operand but is a {t.device.type} tensor (rules R4/R6)")


def check_contract(tc, out, ref, what: str) -> None:
    """Same structure, and tensors of the same shape and dtype."""
    if isinstance(ref, torch.Tensor):
        tc.assertIsInstance(out, torch.Tensor, msg=what)
        tc.assertEqual(out.shape, ref.shape, msg=f"{what}: shape")
        tc.assertEqual(out.dtype, ref.dtype, msg=f"{what}: dtype")
        tc.assertEqual(out.layout, ref.layout, msg=f"{what}: layout")
    elif isinstance(ref, (list, tuple)):
        tc.assertIsInstance(out, (list, tuple), msg=what)
        tc.assertEqual(len(out), len(ref), msg=f"{what}: number of outputs")
        for k, (o, r) in enumerate(zip(out, ref)):
            check_contract(tc, o, r, f"{what}[{k}]")
    else:
        tc.assertEqual(type(out), type(ref), msg=f"{what}: type")


def run_both(unified, reference):
    """Calls ``unified()`` then ``reference()``: (its result, the reference's,
    the exception each raised or None)."""
    out = ref = unified_error = ref_error = None
    try:
        out = unified()
    except Exception as e:
        unified_error = e
    try:
        ref = reference()
    except Exception as e:
        ref_error = e
    return out, ref, unified_error, ref_error


def check_op(tc, op, dtype, device: str, ref_device: str, on_sample=lambda k: None) -> dict:
    """Runs every sample of ``op`` at ``dtype`` on ``device`` and on
    ``ref_device`` and compares them: by value (``tc.assertEqual``, upstream's
    per-dtype tolerances) or, for ops that are not comparable by value, by
    contract. Raises UnifiedRaised, WrongResult or unittest.SkipTest."""
    if dtype not in set(op.supported_dtypes(ref_device)):
        raise unittest.SkipTest(f"the OpInfo does not support {dtype_name(dtype)} on the "
                                f"reference device ({ref_device})")
    contract_only = not_comparable_reason(op, dtype)
    torch.manual_seed(0)
    samples = iter(op.sample_inputs(device, dtype, requires_grad=False))
    stats = {"samples": 0, "both_raised": 0, "by": "contract" if contract_only else "value"}
    if contract_only:
        stats["why_contract"] = contract_only
    k = 0
    while MAX_SAMPLES_PER_OP is None or k < MAX_SAMPLES_PER_OP:
        on_sample(k)
        try:
            sample = next(samples)
        except StopIteration:
            break
        except unittest.SkipTest:
            raise
        except Exception as e:
            raise UnifiedRaised(f"building sample {k} on {device}", e) from e
        args = (sample.input, *sample.args)
        # the device rules R1-R3 pick for this sample: a sample with a CPU
        # operand (tensor_split's indices) computes where the rules send it
        ref_args, ref_kwargs = to_reference((args, sample.kwargs),
                                            rule_device((args, sample.kwargs), ref_device))
        what = f"sample {k} {describe((args, sample.kwargs))}"
        out, ref, unified_error, ref_error = run_both(lambda: op(*args, **sample.kwargs),
                                                      lambda: op(*ref_args, **ref_kwargs))
        if unified_error is not None:
            if type(ref_error) is type(unified_error):
                stats["both_raised"] += 1
                k += 1
                continue
            raise UnifiedRaised(what, unified_error) from unified_error
        if ref_error is not None:
            raise WrongResult(f"{what}: returned a result where {ref_device} raised "
                              f"{type(ref_error).__name__}: {str(ref_error)[:300]}")
        try:
            check_placement(tc, out, (args, sample.kwargs), ref_device, what)
            if contract_only:
                check_contract(tc, out, ref, what)
            else:
                tc.assertEqual(to_cpu(out), to_cpu(ref), msg=what)
        except AssertionError as e:
            raise WrongResult(str(e)) from e
        stats["samples"] += 1
        k += 1
    if stats["samples"] == 0 and stats["both_raised"] == 0:
        raise unittest.SkipTest(f"the OpInfo has no sample inputs at {dtype_name(dtype)}")
    if MAX_SAMPLES_PER_OP is not None and k == MAX_SAMPLES_PER_OP:
        stats["capped"] = True
    return stats


def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


TEST_NAME = "test_matches_reference"


def checks_class():
    """The device-type test class whose instantiated tests run ``check_op``.
    It has the class and test names of tests/test_op_db.py's, so that each
    OpInfo's decorators (skips, onlyCUDA/onlyCPU, slowTest, precision and
    tolerance overrides) apply to a job here as to its test there."""
    from torch.testing._internal.common_device_type import (
        OpDTypes,
        instantiate_device_type_tests,
        ops,
    )
    from torch.testing._internal.common_utils import TestCase

    class TestUnifiedOpDb(TestCase):
        on_sample = staticmethod(lambda k: None)
        stats: dict = {}

        @ops(op_db, dtypes=OpDTypes.supported, allowed_dtypes=DTYPES)
        def test_matches_reference(self, device, dtype, op):
            self.stats = check_op(self, op, dtype, device, reference_device(), self.on_sample)

    scope = {"TestUnifiedOpDb": TestUnifiedOpDb}
    instantiate_device_type_tests(TestUnifiedOpDb, scope, only_for="privateuse1")
    (cls,) = scope.values()
    cls.setUpClass()
    return cls


def job_test_name(j: int) -> str:
    i, dtype = JOBS[j]
    return f"{TEST_NAME}_{op_db[i].formatted_name}_{torch_direct.BACKEND_NAME}_{dtype_name(dtype)}"


def _classify(e: Exception) -> dict:
    # The @ops wrapper re-raises a failure as a plain Exception naming the
    # sample (PRINT_REPRO_ON_FAILURE); the failure is its cause.
    while (not isinstance(e, (WrongResult, UnifiedRaised))
           and hasattr(e, "_tracked_input") and isinstance(e.__cause__, Exception)):
        e = e.__cause__
    if isinstance(e, WrongResult):
        return {"status": "failed", "message": str(e)[:3000], "cause": _first_line(e)}
    if isinstance(e, UnifiedRaised):
        err = e.error
        return {"status": "raised", "phase": e.phase, "error_type": type(err).__name__,
                "message": f"{e.phase}: {type(err).__name__}: {str(err)[:3000]}",
                "cause": f"{type(err).__name__}: {_first_line(err)}"}
    # A fault of the check itself, reported as raised.
    return {"status": "raised", "phase": "check", "error_type": type(e).__name__,
            "message": f"check: {type(e).__name__}: {str(e)[:3000]}",
            "cause": f"check: {type(e).__name__}: {_first_line(e)}"}


def run_job(cls, j: int, on_sample) -> dict:
    record = job_record(j)
    start = time.monotonic()
    try:
        name = job_test_name(j)
        if not hasattr(cls, name):
            raise RuntimeError(f"no instantiated test {name} for job {j}")
        test = cls(name)
        test.on_sample = on_sample
        test.setUp()
        try:
            getattr(test, name)()
        finally:
            test.tearDown()
        record.update(test.stats)
        record["status"] = "passed"
    except unittest.SkipTest as e:
        record.update(status="skipped", message=str(e))
    except Exception as e:
        record.update(_classify(e))
    record["seconds"] = round(time.monotonic() - start, 3)
    return record


# Test hook (tests/test_op_db.py checks the runner with it): "crash:J,hang:K"
# makes the child kill itself with SIGSEGV at job J and stop making progress
# at job K.
FAULT_ENV = "TORCH_DIRECT_OP_DB_FAULT"


def _injected_faults() -> dict[int, str]:
    faults = {}
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, _, job = item.partition(":")
        faults[int(job)] = kind
    return faults


def child_main(first: int, end: int, progress_path: str, results_path: str) -> None:
    cls = checks_class()
    child_loop(first, end, progress_path, results_path, lambda j, on_sample: run_job(cls, j, on_sample))


def child_loop(first: int, end: int, progress_path: str, results_path: str, run) -> None:
    """A child's work: ``run(j, on_sample)`` (the outcome record of job j) for
    jobs [first, end), with the progress and results files run_jobs reads."""
    warnings.simplefilter("ignore")
    faulthandler.enable(all_threads=False)
    torch.set_num_threads(1)
    faults = _injected_faults()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    progress = os.open(progress_path, flags)
    results = os.open(results_path, flags)
    for j in range(first, end):
        os.write(progress, f"job {j}\n".encode())
        if faults.get(j) == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif faults.get(j) == "hang":
            while True:
                time.sleep(60)
        record = run(j, lambda k, j=j: os.write(progress, f"sample {j} {k}\n".encode()))
        os.write(results, (json.dumps(record) + "\n").encode())
        os.write(progress, f"done {j}\n".encode())
    os.close(progress)
    os.close(results)


# ---------------------------------------------------------------------------
# The parent: runs chunks in children and collects their outcomes.

def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _tail(path: str, n: int = 25) -> str:
    """The end of a child's stderr (faulthandler's Python stack), without the
    list of loaded extension modules and known start-up warnings."""
    lines = [line for line in _read_lines(path)
             if not line.startswith("Extension modules:") and "No CUDA runtime is found" not in line]
    return "\n".join(lines[-n:])


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def job_record(j: int) -> dict:
    """What names job ``j`` in its outcome."""
    i, dtype = JOBS[j]
    op = op_db[i]
    return {"job": j, "op": op.name, "variant": op.variant_test_name, "dtype": dtype_name(dtype)}


def run_jobs(first: int, end: int, log=None, timeout_s: float = JOB_TIMEOUT_S,
             extra_env: dict | None = None, script: str | None = None,
             record=job_record) -> dict[int, dict]:
    """Outcomes of jobs [first, end), each run in a child process
    (``python SCRIPT child FIRST END PROGRESS RESULTS``: this file, or another
    runner with the same protocol whose jobs ``record`` names); a child that
    dies is replaced by one starting at the job after the one it died on."""
    outcomes: dict[int, dict] = {}
    env = dict(os.environ, **(extra_env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, HERE, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    with tempfile.TemporaryDirectory(prefix="op_db_") as tmp:
        start = first
        restarts = 0
        while start < end:
            progress = os.path.join(tmp, f"progress.{restarts}")
            results = os.path.join(tmp, f"results.{restarts}")
            stderr_path = os.path.join(tmp, f"stderr.{restarts}")
            cmd = [sys.executable, os.path.abspath(script or __file__), "child", str(start), str(end),
                   progress, results]
            with open(stderr_path, "wb") as err:
                proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                        stdout=err, stderr=err)
                returncode, hung = _wait(proc, progress, timeout_s)
            for line in _read_lines(results):
                record = json.loads(line)
                outcomes[record["job"]] = record
            done = [j for j in outcomes if start <= j < end]
            if returncode == 0 and not hung:
                missing = [j for j in range(start, end) if j not in outcomes]
                if missing:
                    raise RuntimeError(f"op_db child exited without outcomes for jobs {missing[:5]}")
                break
            lines = _read_lines(progress)
            started = [int(line.split()[1]) for line in lines if line.startswith("job ")]
            current = started[-1] if started else None
            if current is None or current in outcomes:
                # It died outside a job (import, exit): no op to blame.
                raise RuntimeError(
                    f"op_db child for jobs {start}..{end - 1} ended with "
                    f"{_signal_name(returncode)} outside any op (after {len(done)} jobs):\n"
                    f"{_tail(stderr_path)}")
            samples = [line.split()[2] for line in lines
                       if line.startswith(f"sample {current} ")]
            how = (f"no progress for {timeout_s} s: killed" if hung
                   else f"the process died: {_signal_name(returncode)}")
            outcomes[current] = dict(
                record(current), status="crashed",
                sample=int(samples[-1]) if samples else None,
                cause="hung" if hung else _signal_name(returncode),
                message=f"{how} at sample {samples[-1] if samples else '(building)'}\n"
                        f"{_tail(stderr_path)}")
            if log is not None:
                named = " ".join(str(v) for k, v in record(current).items() if k != "job" and v != "")
                log(f"{os.path.basename(script or __file__)}: {named} crashed ({how})")
            start = current + 1
            restarts += 1
    return outcomes


def workers() -> int:
    """Children a chunk is split over (``TORCH_DIRECT_OP_DB_WORKERS``, default 1)."""
    raw = os.environ.get(WORKERS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{WORKERS_ENV} must be a positive integer, not {raw!r}") from None
    if n < 1:
        raise ValueError(f"{WORKERS_ENV} must be a positive integer, not {raw!r}")
    return n


def run_jobs_split(first: int, end: int, n: int, **kw) -> dict[int, dict]:
    """``run_jobs`` over [first, end) cut into ``n`` contiguous ranges, each
    in its own child at the same time; the outcomes are the same as one
    child's. If a range fails outside any job, the first such error is raised
    after every range has ended."""
    n = max(1, min(n, end - first))
    if n == 1:
        return run_jobs(first, end, **kw)
    from concurrent.futures import ThreadPoolExecutor
    bounds = [first + (end - first) * k // n for k in range(n + 1)]
    outcomes: dict[int, dict] = {}
    errors: list[str] = []
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run_jobs, a, b, **kw) for a, b in zip(bounds, bounds[1:])]
        for f in futures:
            try:
                outcomes.update(f.result())
            except RuntimeError as e:
                errors.append(str(e))
    if errors:
        raise RuntimeError(errors[0])
    return outcomes


def _wait(proc: subprocess.Popen, progress: str, timeout_s: float) -> tuple[int, bool]:
    """Waits for the child; kills it when its progress file stops growing for
    ``timeout_s``. Returns (returncode, whether it was killed as hung)."""
    started = last_change = time.monotonic()
    last_size = -1
    while True:
        try:
            return proc.wait(timeout=1.0), False
        except subprocess.TimeoutExpired:
            pass
        try:
            size = os.path.getsize(progress)
        except FileNotFoundError:
            size = -1
        now = time.monotonic()
        if size != last_size:
            last_size, last_change = size, now
        elif size > 0 and now - last_change > timeout_s:
            lines = _read_lines(progress)
            # Between jobs (a job's "done" is the last line) the child is
            # starting the next one or exiting, which a loaded machine may
            # take long over: only a stall inside a job counts as a hang.
            between = bool(lines) and lines[-1].startswith("done ")
            if not between or now - last_change > STARTUP_TIMEOUT_S:
                proc.kill()
                return proc.wait(), True
        elif size <= 0 and now - started > STARTUP_TIMEOUT_S:   # still starting (imports, setup)
            proc.kill()
            proc.wait()
            raise RuntimeError(f"op_db child did not start a job within {STARTUP_TIMEOUT_S} s")


class OutcomeStore:
    """Outcomes of the jobs, computed a chunk of ops at a time on first use."""

    def __init__(self):
        self.outcomes: dict[int, dict] = {}
        self.chunks_done: set[int] = set()
        self.chunk_errors: dict[int, str] = {}
        self.seconds = 0.0

    def chunk_jobs(self, chunk: int) -> tuple[int, int]:
        lo, hi = chunk * CHUNK_OPS, (chunk + 1) * CHUNK_OPS
        js = [j for j, (i, _) in enumerate(JOBS) if lo <= i < hi]
        return (js[0], js[-1] + 1) if js else (0, 0)

    def get(self, op, dtype) -> dict:
        i = OP_INDEX[id(op)]
        j = JOB_INDEX.get((i, dtype))
        if j is None:
            raise KeyError(f"{op.name}.{op.variant_test_name} at {dtype} is not an op_db job")
        chunk = i // CHUNK_OPS
        if chunk not in self.chunks_done:
            first, end = self.chunk_jobs(chunk)
            start = time.monotonic()
            self.chunks_done.add(chunk)
            try:
                self.outcomes.update(run_jobs_split(first, end, workers(),
                                                    log=lambda m: print(m, file=sys.stderr)))
            except RuntimeError as e:
                self.chunk_errors[chunk] = str(e)
            finally:
                self.seconds += time.monotonic() - start
                self.dump()
        if chunk in self.chunk_errors:
            raise RuntimeError(self.chunk_errors[chunk])
        return self.outcomes[j]

    def for_op(self, op) -> dict[torch.dtype, dict]:
        return {dtype: self.get(op, dtype) for dtype in job_dtypes(op)}

    def dump(self) -> None:
        path = os.environ.get(OUTCOMES_ENV)
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"seconds": round(self.seconds, 1),
                           "max_samples_per_op": MAX_SAMPLES_PER_OP,
                           "reference_device": reference_device(),
                           "outcomes": [self.outcomes[j] for j in sorted(self.outcomes)]},
                          f, indent=1)


# ---------------------------------------------------------------------------
# Reports.

def _normalise(cause: str) -> str:
    cause = re.sub(r"0x[0-9a-f]+", "0x?", cause)
    cause = re.sub(r"\d+", "N", cause)
    return cause[:160]


def report(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    outcomes = data["outcomes"]
    print(f"{len(outcomes)} jobs (op x dtype), reference device {data['reference_device']}, "
          f"max samples per op {data['max_samples_per_op']}, {data['seconds']} s in children")
    counts = collections.Counter(r["status"] for r in outcomes)
    print("  " + ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES))
    by_dtype = collections.defaultdict(collections.Counter)
    for r in outcomes:
        by_dtype[r["dtype"]][r["status"]] += 1
    for d, c in sorted(by_dtype.items()):
        print(f"  {d:9s} " + ", ".join(f"{s} {c.get(s, 0)}" for s in STATUSES))
    skips = collections.Counter(_normalise(r["message"]) for r in outcomes if r["status"] == "skipped")
    print("\nskipped, by reason:")
    for why, n in skips.most_common():
        print(f"  {n:4d}  {why}")
    for status in ("raised", "failed", "crashed"):
        groups = collections.defaultdict(list)
        for r in outcomes:
            if r["status"] == status:
                groups[_normalise(r.get("cause", ""))].append(r)
        print(f"\n{status}, by cause:")
        for cause, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            names = sorted({f"{r['op']}{'.' + r['variant'] if r['variant'] else ''}"
                            f"[{r['dtype']}]" for r in rs})
            print(f"  {len(rs):4d}  {cause}\n        {' '.join(names)}")
    slow = sorted(outcomes, key=lambda r: -r.get("seconds", 0))[:15]
    print("\nslowest jobs: " + ", ".join(f"{r['op']}.{r['variant']}[{r['dtype']}] {r.get('seconds')} s"
                                         for r in slow))


def cli(argv, description: str, child, report_file) -> None:
    """A runner's command line: ``child FIRST END PROGRESS RESULTS`` (what
    run_jobs starts: ``child(first, end, progress, results)``) and ``report
    OUTCOMES`` (``report_file(path)``)."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    child_cmd = sub.add_parser("child", help="run jobs [first, end) (used by run_jobs)")
    child_cmd.add_argument("first", type=int)
    child_cmd.add_argument("end", type=int)
    child_cmd.add_argument("progress")
    child_cmd.add_argument("results")
    rep = sub.add_parser("report", help="counts and grouped failures of an outcomes file")
    rep.add_argument("outcomes")
    args = parser.parse_args(argv)
    if args.command == "child":
        child(args.first, args.end, args.progress, args.results)
    else:
        report_file(args.outcomes)


def main(argv=None) -> None:
    cli(argv, __doc__.splitlines()[0], child_main, report)


if __name__ == "__main__":
    main()
