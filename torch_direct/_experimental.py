"""The one switch for settings that exist only for experiments.

The C++ core reads ``TORCH_DIRECT_EXPERIMENTAL``, a comma-separated list of
``name=value`` pairs, each time a setting is asked for; :func:`experimental`
sets it for the duration of a ``with`` block:

    >>> with torch_direct.experimental(gather_kernel="grid", gather_window_rows=2048):
    ...     y = torch_direct.gather(table, idx)

None of these settings is needed to use the device; the defaults are the measured best.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

VARIABLE = "TORCH_DIRECT_EXPERIMENTAL"

# name -> what it does; the same names as kSettings in csrc/aten/Experimental.h.
SETTINGS = {
    "gather_kernel": "rowblock | grid: the CUDA gather's read kernel on any table, capped to max_sms or not "
                     "(default: rowblock on tables of 8 GiB and more in host memory read without a cap, grid "
                     "on others)",
    "gather_window_rows": "int >= 0: distinct rows the grid-stride kernel keeps in flight "
                          "(default: 2048 on tables of 8 GiB and more in host memory, none on others)",
    "gather_max_unit": "int >= 1: cap on the bytes of each load, 16/8/4/2/1 (default: 16)",
    "gather_own_pool": "0 | 1: the CPU gather uses a thread pool of its own instead of ATen's (default: 0)",
    "cpu_gather_prefetch": "int >= 0: rows ahead whose cache lines the CPU gather requests early (default: 0)",
    "cpu_gather_stores": "plain | streaming: streaming = the CPU gather writes rows whose size and address are "
                         "multiples of 16 bytes with non-temporal stores, which do not read the lines they write "
                         "(default: plain)",
    "sampler_waits": "default | fewer: fewer = one host wait per hop in the GPU sampler instead of two",
    "sampler_relabel": "hash | sort: sort = the GPU sampler numbers each hop's new nodes by sorting them "
                       "instead of through a hash table (the same numbering; default: hash)",
    "feature_pages": "small | huge | driver: huge = the GNN stack's unified feature store copies its table into "
                     "anonymous memory advised MADV_HUGEPAGE (transparent huge pages) and pins it in place; "
                     "driver = into memory the CUDA driver allocates and maps itself at its own granularity "
                     "(torch_direct.driver_mapped; needs a GPU), instead of unified memory on small pages "
                     "(neither is shareable between processes)",
    "cached_gather": "fused | split: split = the GNN stack's cached feature store gathers a batch as a lookup, "
                     "a wait for the misses' count, a gather of each part and a scatter (default: fused: hits "
                     "from its GPU cache and misses from the table in one kernel, without waiting for the device)",
    "hybrid_split": "index | address: address = the GNN stack's unified feature store, gathering with CPU threads "
                    "(train --gather-cpu-threads), sorts each gather's rows farthest first, so that the CPU "
                    "threads take the rows at the table's far end and the GPU reads the rest, a narrower span "
                    "of addresses (default: index: the CPU threads take the first part of the index as it comes)",
    "cpu_pool_nice": "int 0-19: the CPU thread pool's workers (the hybrid gather's CPU threads, the CPU samplers') "
                     "run this much nicer than the thread that calls them, so that the scheduler gives a core to "
                     "the process's other threads, such as the training loop, first (default: unset, their "
                     "niceness left as it is; making them less nice again needs CAP_SYS_NICE)",
    "cpu_pool_size": "concurrent | largest: largest = the CPU thread pool holds as many threads as the largest "
                     "single call asked for, so that calls running at once (two gathering threads' CPU "
                     "shares) queue on it (default: concurrent: as many as the running calls asked for together)",
    "gil_switch_us": "int >= 1: the GIL's switch interval, in microseconds, while `train` and `bench train` train "
                     "(how long a thread that wants the GIL waits before it asks the holder to drop it; default: "
                     "unset, Python's 5000)",
    "store_index_bounds": "checked | known: known = the GNN feature stores pass gather the bounds of the indices "
                          "they make themselves (the cache's slots, the hybrid gather's reordering), which spares "
                          "the CUDA gather its pass over them and its wait for the stream; checked = gather checks "
                          "them as any index (default: known)",
    "step_host": "fused | fused_waits | aten | python: python = the graphed step's copy of each batch into its "
                 "padded buffers and the training loop's loss and accuracy tally issue their ATen ops one Python "
                 "call at a time; aten = one C++ call each, without the GIL, issuing the ATen ops; fused_waits = "
                 "as fused, and with two sets of buffers the copy's stream waits in the copy's call (default: "
                 "fused: on a GPU the copy a memcpy, a memset and one kernel)",
    "hybrid_copies": "wait | ordered: ordered = a hybrid gather (gather with cpu_threads) returns once its CPU rows' "
                     "copies to the GPU are queued, the current stream ordered after them and their pinned "
                     "staging kept until they are done, instead of waiting for them (default: wait)",
    "gather_turns": "wait | deposit: deposit = the GNN loader's gathering threads (train --gather-workers) leave a "
                    "gather done before an earlier one to be queued in its turn and go on to the next, at most "
                    "twice as many gathers as threads taken ahead, instead of each waiting for its turn to "
                    "queue its own (the same batches in the same order; default: wait)",
    "hybrid_piece_kb": "int >= 16: the KiB of rows each of a hybrid gather's CPU threads (on the extension's own "
                       "pool) writes before it starts their copy to the GPU: larger = fewer, larger copies, fewer "
                       "calls into the CUDA driver beside the training loop's; smaller = more of the copies "
                       "overlapped with the gathering (default: 1024)",
}


def parse(text: str | None) -> dict[str, str]:
    """The settings in a ``TORCH_DIRECT_EXPERIMENTAL`` value (ValueError on a bad one)."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item:
            continue
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"{VARIABLE}: {item!r} is not name=value (names: {', '.join(SETTINGS)})")
        _check_name(name, VARIABLE)
        if name in out:
            raise ValueError(f"{VARIABLE}: {name} is given twice")
        out[name] = value
    return out


def _check_name(name: str, who: str) -> None:
    if name not in SETTINGS:
        raise ValueError(f"{who}: unknown setting {name!r} (names: {', '.join(SETTINGS)})")


def get(name: str, *, choices: tuple[str, ...] | None = None, default: str | None = None) -> str | None:
    """The value of setting ``name`` in ``TORCH_DIRECT_EXPERIMENTAL`` now (None when unset);
    ``default`` (when given) stands for an unset or empty one. With ``choices``, any other value
    is a ValueError naming them."""
    _check_name(name, "experimental")
    value = parse(os.environ.get(VARIABLE)).get(name)
    if not value:
        return value if default is None else default
    if choices is not None and value not in choices:
        allowed = " or ".join(filter(None, (", ".join(choices[:-1]), choices[-1])))
        raise ValueError(f"{VARIABLE}: {name} must be {allowed}, not {value!r}")
    return value


@contextmanager
def experimental(**settings):
    """Set experimental settings (see :data:`SETTINGS`) for the duration of the block, on top of
    those already in ``TORCH_DIRECT_EXPERIMENTAL``; a value of None removes a setting. The
    variable is restored afterwards. Not thread-safe: it changes the process's environment."""
    before = os.environ.get(VARIABLE)
    current = parse(before)
    for name, value in settings.items():
        _check_name(name, "experimental")
        if value is None:
            current.pop(name, None)
            continue
        value = str(int(value) if isinstance(value, bool) else value)
        if "," in value or "=" in value or not value:
            raise ValueError(f"experimental: {name}={value!r} must be non-empty, without ',' or '='")
        current[name] = value
    os.environ[VARIABLE] = ",".join(f"{k}={v}" for k, v in current.items())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before
