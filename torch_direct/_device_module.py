"""``torch.unified``: the device module PyTorch looks up for the unified device.

There is one unified device (index 0): host memory that every GPU of the
machine reads in place. Random numbers and synchronisation belong to the
device an op runs on (placement rules R1-R3), so they delegate to CUDA.
"""

from __future__ import annotations

import torch


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    return None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def _check_index(device) -> int:
    index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
    if index not in (None, 0):
        raise ValueError(f"the unified device has a single index (unified:0); got {device!r}")
    return 0


def set_device(device) -> None:
    _check_index(device)


def synchronize(device=None) -> None:
    """Wait for GPU work that may read or write unified memory."""
    _check_index(device)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def manual_seed(seed: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def memory_stats(device=None):
    from . import memory_stats as stats

    _check_index(device)
    return stats()


def empty_cache() -> None:
    from . import empty_cache as empty

    empty()


def pin_inplace(t):
    from . import pin_inplace as pin

    return pin(t)


def driver_mapped(t):
    from . import driver_mapped as mapped

    return mapped(t)


class device:
    """Context manager selecting the unified device (there is only index 0)."""

    def __init__(self, device):
        _check_index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
