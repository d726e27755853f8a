"""The fork wheel's device, checked from Python right after installing it.

    python build_scripts/tests/fork_wheel_smoke.py [--json FILE]

Runs in an interpreter whose torch is the fork wheel (a CPU build is enough:
placement falls to its CPU branch). Each check prints "ok NAME" or
"FAILED NAME: why"; the exit code is the number of failures.
"""

from __future__ import annotations

import io
import json
import sys
import traceback


def check_device(torch):
    d = torch.device("unified")
    assert d.type == "unified" and str(d) == "unified", d
    assert torch.device("unified:0").index == 0


def check_factories(torch):
    for t in (torch.empty(3, 4, device="unified"), torch.zeros(5, device="unified"),
              torch.ones(2, 2, device="unified", dtype=torch.float16),
              torch.full((3,), 7.0, device="unified"), torch.arange(6, device="unified")):
        assert t.is_unified and t.device.type == "unified", t.device
    assert torch.zeros(5, device="unified").cpu().eq(0).all()
    assert torch.arange(6, device="unified").cpu().tolist() == list(range(6))


def check_to_unified(torch):
    x = torch.randn(100, 8)
    u = x.to("unified")
    assert u.is_unified and not x.is_unified
    assert torch.equal(u.cpu(), x)
    assert u.to("unified") is u  # R5: identity
    v = u[10:20]  # R6: a view stays unified, over the same storage
    assert v.is_unified and v.untyped_storage().data_ptr() == u.untyped_storage().data_ptr()


def check_memory_stats_and_pin_inplace(torch):
    before = torch.unified.memory_stats()
    u = torch.empty(1 << 20, device="unified")
    after = torch.unified.memory_stats()
    assert isinstance(before, dict) and after != before, (before, after)
    del u
    x = torch.arange(1000, dtype=torch.float32)
    p = torch.unified.pin_inplace(x)
    assert p.is_unified and p.data_ptr() == x.data_ptr()
    x[0] = 42.0  # no copy: the alias sees the write
    assert p.cpu()[0].item() == 42.0
    assert torch.unified.is_available() and torch.unified.device_count() == 1


def check_placement_cpu_branch(torch):
    u = torch.arange(4.0).to("unified")
    c = torch.ones(4)
    r = u + c  # R2: a CPU operand runs the op on the CPU
    assert r.device.type == "cpu" and r.tolist() == [1.0, 2.0, 3.0, 4.0], r
    if not torch.cuda.is_available():
        r = u * 2  # R3 without CUDA: CPU, output on the CPU
        assert r.device.type == "cpu" and r.tolist() == [0.0, 2.0, 4.0, 6.0], r
    u.add_(1)  # R4: in place writes through to the unified bytes
    assert u.is_unified and u.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert u[torch.tensor([3, 0])].tolist() == [4.0, 1.0]


def check_save_load(torch):
    u = torch.randn(7, 3).to("unified")
    buf = io.BytesIO()
    torch.save({"u": u}, buf)
    buf.seek(0)
    back = torch.load(buf)["u"]
    assert back.is_unified and torch.equal(back.cpu(), u.cpu())
    buf = io.BytesIO()
    torch.save(u.cpu(), buf)
    buf.seek(0)
    mapped = torch.load(buf, map_location="unified")
    assert mapped.is_unified and torch.equal(mapped.cpu(), u.cpu())


def _child(q_in, q_out):
    t = q_in.get()
    t.add_(1)  # writes into the shared pages
    q_out.put(bool(t.is_unified))


def check_multiprocessing(torch):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    u = torch.zeros(1 << 18, device="unified")  # a large block: shared through its fd
    p = ctx.Process(target=_child, args=(q_in, q_out))
    p.start()
    q_in.put(u)
    child_saw_unified = q_out.get(timeout=120)
    p.join(timeout=120)
    assert p.exitcode == 0, p.exitcode
    assert child_saw_unified
    assert u.cpu().eq(1).all(), "the child's write is not visible: the pages were copied, not shared"


def check_torch_direct_vehicle(torch):
    import torch_direct
    assert torch_direct.vehicle() == "fork", torch_direct.vehicle()
    x = torch.arange(12.0).reshape(4, 3)
    u = torch_direct.pin_inplace(x)
    assert u.is_unified
    assert torch.equal(torch_direct.gather(u, torch.tensor([2, 0])), x[[2, 0]])


CHECKS = [check_device, check_factories, check_to_unified, check_memory_stats_and_pin_inplace,
          check_placement_cpu_branch, check_save_load, check_multiprocessing, check_torch_direct_vehicle]


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--extension", action="store_true",
                    help="run the same checks on stock torch with the torch_direct extension")
    args = ap.parse_args(argv)
    import torch
    checks = CHECKS
    if args.extension:
        import torch_direct  # noqa: F401  (registers the device on stock torch)
        checks = [c for c in CHECKS if c is not check_torch_direct_vehicle]
    results = {}
    for check in checks:
        name = check.__name__[len("check_"):]
        try:
            check(torch)
            results[name] = "ok"
            print(f"ok {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the rest
            results[name] = f"FAILED: {type(e).__name__}: {e}"
            print(f"FAILED {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)
    failures = sum(1 for v in results.values() if v != "ok")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "checks": results, "failures": failures}, f, indent=1)
    return failures


if __name__ == "__main__":
    sys.exit(main())
