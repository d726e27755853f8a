"""What the probes in experiments/ share: writing their JSON record, and running as a command with
bad input reported as one line and exit status 2 (as ``python -m torch_direct`` does)."""
import sys
from pathlib import Path


def write_record(path, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` as the package writes its records (atomically, its
    folder made first, with a provenance object: commit, machine, command)."""
    from torch_direct.gnn.outputs import write_json
    write_json(Path(path), record)


def seconds(device, fn) -> float:
    """Seconds of ``fn()``, the device synchronised before and after (the probes' one timer)."""
    import time

    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def median_seconds(device, fn, repeats: int) -> float:
    """The median seconds of ``repeats`` calls of ``fn()`` after one warm-up call: on a GPU
    timed with CUDA events around each call on the current stream (the device's time, not the
    launch's), elsewhere by wall clock."""
    import statistics
    import time

    import torch
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def finish(path, record: dict) -> dict:
    """The end of a probe: ``record`` written to ``path`` (when given, saying so), and returned."""
    if path:
        write_record(path, record)
        print(f"wrote {path}")
    return record


def run(name: str, main) -> None:
    """``main()``, with ValueError / RuntimeError / FileNotFoundError as ``name: error: ...``, exit 2."""
    try:
        main()
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
