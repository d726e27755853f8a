"""The ``unified`` device: native on a fork wheel, else registered on stock PyTorch.

Two vehicles give the same device (docs/fork.md):

- **fork**: a torch wheel built from ``patches/`` has ``DeviceType::Unified``
  natively (``torch._C._unified``, ``torch.unified``, ``Tensor.is_unified``).
  ``import torch_direct`` then registers nothing: its helpers call the native
  runtime, and ``torch_direct._C`` is a small stand-in (``_ForkC``) over
  ``torch._C._unified`` for the names the fork binds.
- **extension**: on stock PyTorch the compiled extension ``torch_direct._C``
  takes PrivateUse1 and renames it ``unified``.
"""

from __future__ import annotations

import sys
import types
from collections import OrderedDict

import torch

BACKEND_NAME = "unified"

# How many libtorch call slots of at::getAccelerator() were rebound so that
# PyTorch keeps reporting the accelerator it had before (csrc/runtime/
# AcceleratorHook.h); 0 means only the Python-level shim is active (and on
# the fork, which needs no hook).
ACCELERATOR_HOOK_SLOTS = 0


def native_unified_device(torch_module=torch) -> bool:
    """Whether ``torch_module`` has the Unified device natively (a fork wheel).

    True when its C module has the ``_unified`` runtime and ``"unified"`` parses
    as a device type while PrivateUse1 is not named ``unified`` (so the name is
    not the extension's). Checked before anything is registered.
    """
    c = getattr(torch_module, "_C", None)
    if c is None or not hasattr(c, "_unified"):
        return False
    try:
        device = torch_module.device(BACKEND_NAME)
    except (RuntimeError, TypeError, ValueError):
        return False
    if getattr(device, "type", None) != BACKEND_NAME:
        return False
    privateuse1 = getattr(c, "_get_privateuse1_backend_name", None)
    return privateuse1 is None or privateuse1() != BACKEND_NAME


VEHICLE = "fork" if native_unified_device() else "extension"


def vehicle() -> str:
    """``"fork"`` on a torch wheel with the native Unified device, else ``"extension"``."""
    return VEHICLE


class _ForkC(types.ModuleType):
    """``torch_direct._C`` on a fork wheel: the extension's private names that
    the fork binds, from ``torch._C._unified``. A name only the extension has
    raises AttributeError saying so (callers check ``vehicle()`` first)."""

    _NATIVE = ("_memory_stats", "_empty_cache", "_reset_peak", "_cuda_available",
               "_pin_inplace", "_pinned_owner", "_share", "_from_shared", "_block_kind",
               "_is_mapped", "_map_for_gpu", "_as_cuda_alias", "_as_cpu_alias",
               "_gather_rows_cpu",
               "_claimed_structured_ops", "_claimed_sparse_ops", "_claimed_autograd_ops")
    # Bound by the fork only when it is built with CUDA (USE_CUDA; patch 0006).
    _NATIVE_CUDA = ("_gather_rows_cuda", "_gather_rows_scaled_cuda", "_gather_rows_hybrid", "_hybrid_cpu_fraction")

    def __init__(self, native):
        super().__init__(__name__.rpartition(".")[0] + "._C")
        for name in self._NATIVE:
            setattr(self, name, getattr(native, name))
        self._cuda_gather = all(hasattr(native, name) for name in self._NATIVE_CUDA)
        if self._cuda_gather:
            for name in self._NATIVE_CUDA:
                setattr(self, name, getattr(native, name))
        else:
            # As the extension built without CUDA answers.
            self._hybrid_cpu_fraction = lambda device, row_bytes, table_bytes: 0.0

    def _built_with_cuda(self) -> bool:
        # Whether the fork binds the ordered/hybrid CUDA gather kernels, which
        # torch_direct.gather uses for a CUDA index; without them it takes its
        # generic path (index_select, run by the fork's Unified kernels on the
        # index's device).
        return self._cuda_gather

    def __getattr__(self, name):
        raise AttributeError(
            f"torch_direct._C.{name} is part of the torch_direct extension, which a fork "
            f"wheel does not load (torch has the unified device natively); "
            f"torch_direct.vehicle() is {VEHICLE!r}")


if VEHICLE == "fork":
    _C = _ForkC(torch._C._unified)
    sys.modules[_C.__name__] = _C
    setattr(sys.modules[__name__.rpartition(".")[0]], "_C", _C)
else:
    from . import _coexist

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


if VEHICLE == "extension":
    _register()


def is_unified(t: torch.Tensor) -> bool:
    """True if ``t`` is a unified tensor (also ``t.is_unified``)."""
    return isinstance(t, torch.Tensor) and t.device.type == BACKEND_NAME


def cpu_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same host bytes as the unified tensor ``t``, with no copy:
    CPU code (index_select, numpy) reads and writes ``t``'s memory in place. It keeps ``t``'s
    storage alive. ``t.cpu()`` copies instead, as for any device.

    The host bytes are page-locked in pieces of at most ``TORCH_DIRECT_REGISTER_CHUNK_MB``
    (default 1024 MiB), and one CUDA copy may not span two of them: stock torch's copy of a
    larger alias to a GPU (``cpu_alias(t).cuda()``) fails with "invalid argument". Copy ``t``
    itself (``t.to("cuda")``), which is split at those bounds."""
    if not is_unified(t):
        raise TypeError(f"cpu_alias: expected a unified tensor, got one on {t.device}"
                        if isinstance(t, torch.Tensor) else f"cpu_alias: expected a tensor, got {type(t).__name__}")
    return _C._as_cpu_alias(t)


def cuda_alias(t: torch.Tensor, device: int = 0) -> torch.Tensor:
    """A CUDA tensor on GPU ``device`` over the same mapped host bytes as the unified tensor
    ``t``, with no copy: any CUDA kernel reads them over the bus (what torch_direct.gather
    does with its own kernels, ordered and windowed)."""
    if not is_unified(t):
        raise TypeError(f"cuda_alias: expected a unified tensor, got one on {t.device}"
                        if isinstance(t, torch.Tensor) else f"cuda_alias: expected a tensor, got {type(t).__name__}")
    return _C._as_cuda_alias(t, int(device))


def built_with_cuda() -> bool:
    """Whether the extension (on a fork wheel: torch) was compiled with CUDA support."""
    if VEHICLE == "fork":
        return torch.backends.cuda.is_built()
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

    Copy a ``t`` larger than one chunk (``TORCH_DIRECT_REGISTER_CHUNK_MB``, default 1024
    MiB) to a GPU through the returned tensor (``u.to("cuda")``, split at the chunks): the
    driver refuses stock torch's ``t.cuda()`` across two of them ("invalid argument").

    Do not call ``t.share_memory_()`` afterwards: it moves ``t`` to new pages
    and the alias would keep the old ones. Share first, then pin.

    The registration covers whole pages: a small CPU tensor that shares a page
    with ``t`` (the heap packs them together) also reports ``is_pinned()`` while
    an alias lives, and torch's sparse constructors, which check that indices
    and values agree on pinning, can then refuse it. A large tensor shares at
    most its first and last page.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"pin_inplace() expects a torch.Tensor, got {type(t).__name__}")
    if t.device.type == BACKEND_NAME:
        return t
    if t.requires_grad and t.grad_fn is not None:
        raise RuntimeError("pin_inplace() needs a leaf tensor: pin the data, not a result "
                           "of autograd (use t.detach())")
    if VEHICLE == "fork":
        return torch.unified.pin_inplace(t)
    out = _C._pin_inplace(t.detach())
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def driver_mapped(t: torch.Tensor) -> torch.Tensor:
    """A unified copy of ``t`` in pinned host memory that the CUDA driver allocates and maps
    itself, for the CPU and every GPU at one address, in pieces of its allocation granularity
    (2 MiB where the driver says so) rather than the kernel's 4 KiB pages.

    A GPU reading random rows of a large table pays one address translation per page the
    rows fall in; on 2 MiB pieces a table needs 512 times fewer. Otherwise the result is an
    ordinary unified tensor (CPU code and GPU kernels read and write it in place), except that
    it cannot be shared with another process or used in a ``fork()``ed child (clear errors),
    and it is never cached: its memory returns to the driver when the last reference goes.

    Needs a CUDA GPU whose driver makes host NUMA allocations through its virtual memory
    management (CUDA 12.2 or later); RuntimeError saying why otherwise. ``t`` is any strided
    CPU, unified or CUDA tensor; it is left as it is.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"driver_mapped() expects a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"driver_mapped() expects a strided tensor, got layout {t.layout}")
    if VEHICLE == "fork":
        native = getattr(getattr(torch, "unified", None), "driver_mapped", None)
        if native is None:   # a fork wheel built before patch 0006 gave it
            raise RuntimeError("driver_mapped(): this torch wheel was built from a fork older than it; "
                               "rebuild the wheel (build_scripts/build_wheel)")
        return native(t)
    out = _C._driver_mapped_empty(list(t.shape), torch.empty(0, dtype=t.dtype))
    return out.copy_(t.detach())


def memory_stats() -> "OrderedDict[str, int]":
    """Counters of the unified allocator.

    ``allocated_bytes`` (live, as asked), ``allocated_bytes.peak``,
    ``reserved_bytes`` (mapped, cache included), ``pinned_bytes`` (page-locked
    for GPUs by this process), ``pinned_in_place_bytes`` (pin_inplace aliases),
    ``pinned_registrations``, ``active_blocks``, ``cached_blocks``,
    ``cached_large_bytes`` (freed large blocks kept for reuse),
    ``pending_free_blocks`` (freed, waiting for GPU work), ``num_alloc``,
    ``num_free``, ``num_shared_migrations``.
    """
    return OrderedDict(sorted(_C._memory_stats().items()))


def empty_cache() -> None:
    """Release the cached blocks (small and large) that no GPU work still uses."""
    _C._empty_cache()


def reset_peak_memory_stats() -> None:
    _C._reset_peak()
