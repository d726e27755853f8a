"""Register the ``unified`` device with stock PyTorch (PrivateUse1)."""

from __future__ import annotations

from collections import OrderedDict

import torch

from . import _coexist

BACKEND_NAME = "unified"

# How many libtorch call slots of at::getAccelerator() were rebound so that
# PyTorch keeps reporting the accelerator it had before (csrc/runtime/
# AcceleratorHook.h); 0 means only the Python-level shim is active.
ACCELERATOR_HOOK_SLOTS = 0

# What torch.accelerator answered before PrivateUse1 got a name: renaming it
# makes PyTorch report the new backend as "the accelerator" (see _coexist).
_previous_accelerator = _coexist.current_accelerator_before_registration()

from . import _C  # noqa: E402  (loads kernels, fallback, hooks and guard)
from . import _device_module  # noqa: E402


def _register() -> None:
    name = torch._C._get_privateuse1_backend_name()
    if name == "privateuseone":
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    elif name != BACKEND_NAME:
        raise ImportError(
            f"torch_direct needs PyTorch's PrivateUse1 backend, but another package "
            f"already registered it as {name!r}; only one PrivateUse1 backend can be "
            f"loaded per process")
    if not hasattr(torch, BACKEND_NAME):
        torch._register_device_module(BACKEND_NAME, _device_module)
    if not hasattr(torch.Tensor, "is_" + BACKEND_NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=False)
    global ACCELERATOR_HOOK_SLOTS
    previous = None if _previous_accelerator is None else torch.device(_previous_accelerator).type
    ACCELERATOR_HOOK_SLOTS = _C._install_accelerator_hook(previous)
    if ACCELERATOR_HOOK_SLOTS == 0:
        # The C++ answer could not be kept: at least keep the Python API's.
        _coexist.install(_previous_accelerator)
    from . import _reductions

    _reductions.install()


_register()


def is_unified(t: torch.Tensor) -> bool:
    """True if ``t`` is a unified tensor (also ``t.is_unified``)."""
    return isinstance(t, torch.Tensor) and t.device.type == BACKEND_NAME


def built_with_cuda() -> bool:
    """Whether the extension was compiled with CUDA support."""
    return bool(_C._built_with_cuda())


def cuda_available() -> bool:
    """Whether unified tensors can be read by a GPU in this process."""
    return bool(_C._cuda_available())


def pin_inplace(t: torch.Tensor) -> torch.Tensor:
    """Return a unified tensor over ``t``'s own pages, with no copy.

    ``t`` must be a CPU tensor (ordinary or shared memory). Its whole storage is
    page-locked and mapped for every GPU (in chunks below the driver's per-call
    limit) and stays so while any alias lives; ``t`` keeps working as a CPU
    tensor over the same bytes. Pinning the same pages twice is allowed. A
    unified tensor is returned as is.

    Do not call ``t.share_memory_()`` afterwards: it moves ``t`` to new pages
    and the alias would keep the old ones. Share first, then pin.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"pin_inplace() expects a torch.Tensor, got {type(t).__name__}")
    if t.device.type == BACKEND_NAME:
        return t
    if t.requires_grad and t.grad_fn is not None:
        raise RuntimeError("pin_inplace() needs a leaf tensor: pin the data, not a result "
                           "of autograd (use t.detach())")
    out = _C._pin_inplace(t.detach())
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def memory_stats() -> "OrderedDict[str, int]":
    """Counters of the unified allocator.

    ``allocated_bytes`` (live, as asked), ``allocated_bytes.peak``,
    ``reserved_bytes`` (mapped, cache included), ``pinned_bytes`` (page-locked
    for GPUs by this process), ``pinned_in_place_bytes`` (pin_inplace aliases),
    ``pinned_registrations``, ``active_blocks``, ``cached_blocks``,
    ``pending_free_blocks`` (freed, waiting for GPU work), ``num_alloc``,
    ``num_free``, ``num_shared_migrations``.
    """
    return OrderedDict(sorted(_C._memory_stats().items()))


def empty_cache() -> None:
    """Release cached small blocks that no GPU work still uses."""
    _C._empty_cache()


def reset_peak_memory_stats() -> None:
    _C._reset_peak()
