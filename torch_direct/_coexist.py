"""Keep torch.accelerator what it was before the unified device was registered.

PyTorch treats a named PrivateUse1 backend as *the* accelerator of the process
(torch.accelerator.*, DataLoader's pin-memory thread, ...). The unified device
is not an accelerator: it is host memory served to CUDA. So torch_direct
records the accelerator PyTorch reported before the rename and routes the
Python entry points of torch.accelerator to that backend's own functions.
(pin_memory() and is_pinned(), which ask from C++, are answered by CUDA's
hooks: csrc/runtime/UnifiedHooks.cpp.)
"""

from __future__ import annotations

import functools

import torch

_NO_ACCELERATOR = "Cannot access accelerator device when none is available."


def current_accelerator_before_registration():
    get = getattr(torch._C, "_accelerator_getAccelerator", None)
    if get is None:
        return None
    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        return None if torch.version.cuda is None else torch.device("cuda")
    return get()


def _index(i) -> int:
    return torch.cuda.current_device() if i is None or i < 0 else int(i)


def _cuda_table() -> dict:
    C = torch._C
    return {
        "_accelerator_getAccelerator": lambda: torch.device("cuda"),
        "_accelerator_getDeviceIndex": lambda: torch.cuda.current_device(),
        "_accelerator_setDeviceIndex": lambda i: torch.cuda.set_device(i) if i >= 0 else None,
        "_accelerator_exchangeDevice": lambda i: C._cuda_exchangeDevice(i),
        "_accelerator_maybeExchangeDevice": lambda i: C._cuda_maybeExchangeDevice(i),
        "_accelerator_getStream": lambda i: torch.cuda.current_stream(_index(i)),
        "_accelerator_setStream": lambda s: torch.cuda.set_stream(s),
        "_accelerator_synchronizeDevice": lambda i: torch.cuda.synchronize(_index(i)),
        "_accelerator_isAllocatorInitialized": lambda: torch.cuda.is_initialized(),
        "_accelerator_emptyCache": lambda: torch.cuda.empty_cache(),
        "_accelerator_getDeviceStats": lambda i: C._cuda_memoryStats(_index(i)),
        "_accelerator_resetAccumulatedStats": lambda i: C._cuda_resetAccumulatedMemoryStats(_index(i)),
        "_accelerator_resetPeakStats": lambda i: C._cuda_resetPeakMemoryStats(_index(i)),
        "_accelerator_getMemoryInfo": lambda i: torch.cuda.mem_get_info(_index(i)),
        "_accelerator_getDefaultGenerator": lambda i: torch.cuda.default_generators[_index(i)],
        "_accelerator_hooks_device_count": lambda: torch.cuda.device_count(),
        "_accelerator_hooks_get_current_device": lambda: torch.cuda.current_device(),
        "_accelerator_hooks_set_current_device": lambda i: torch.cuda.set_device(i),
        "_accelerator_hooks_exchange_device": lambda i: C._cuda_exchangeDevice(i),
        "_accelerator_hooks_maybe_exchange_device": lambda i: C._cuda_maybeExchangeDevice(i),
    }


def _none(*_args, **_kwargs):
    raise RuntimeError(_NO_ACCELERATOR)


_installed = False


def install(previous) -> None:
    """Route torch._C._accelerator_* to the backend reported before the rename."""
    global _installed
    if _installed:
        return
    _installed = True
    names = [n for n in dir(torch._C) if n.startswith("_accelerator_")]
    if previous is not None and torch.device(previous).type == "cuda":
        table = _cuda_table()
        for name in names:
            if name in table:
                setattr(torch._C, name, functools.wraps(getattr(torch._C, name))(table[name]))
    elif previous is None:
        for name in names:
            if name == "_accelerator_getAccelerator":
                setattr(torch._C, name, lambda: None)
            elif name in ("_accelerator_isAllocatorInitialized",):
                setattr(torch._C, name, lambda: False)
            else:
                setattr(torch._C, name, _none)
    # Another accelerator (XPU, MPS, ...) is left as PyTorch reports it.
