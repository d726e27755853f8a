"""Share unified tensors across processes (torch.multiprocessing, spawn and fork).

A unified tensor travels as the file descriptor of its shared-memory block:
the receiving process maps the same host pages (no copy of the table) and
registers them with its own CUDA context on first GPU use. A tensor pinned in
place travels as its CPU tensor (which must already be in shared memory) and
is pinned again on arrival.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import DupFd

import torch
from torch.multiprocessing import reductions as _torch_reductions

from . import _C


def _rebuild_unified(dupfd, storage_nbytes, dtype, size, stride, offset, requires_grad):
    fd = dupfd.detach() if dupfd is not None else -1
    try:
        flat = _C._from_shared(fd, storage_nbytes, torch.empty(storage_nbytes, dtype=torch.uint8,
                                                               device="meta"))
    finally:
        if fd >= 0:
            os.close(fd)
    t = torch.empty(0, dtype=dtype, device="unified")
    t.set_(flat.untyped_storage(), offset, size, stride)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_pinned(owner, requires_grad):
    from . import pin_inplace

    t = pin_inplace(owner)
    if requires_grad:
        t.requires_grad_(True)
    return t


def reduce_unified(t: torch.Tensor):
    if _C._block_kind(t) == "foreign":
        owner = _C._pinned_owner(t)
        if not owner.untyped_storage().is_shared():
            raise RuntimeError(
                "cannot send a tensor made by pin_inplace() to another process: its CPU "
                "tensor is not in shared memory, and moving it there would leave the "
                "pinned alias on the old pages. Call share_memory_() on the CPU tensor "
                "before pin_inplace(), or send the CPU tensor and pin it in the receiver.")
        return _rebuild_pinned, (owner, t.requires_grad)
    fd, _mapped, storage_nbytes = _C._share(t)
    dupfd = DupFd(fd) if fd >= 0 else None
    return _rebuild_unified, (dupfd, storage_nbytes, t.dtype, tuple(t.size()), tuple(t.stride()),
                              t.storage_offset(), t.requires_grad)


def install() -> None:
    from multiprocessing.reduction import ForkingPickler

    original = _torch_reductions.reduce_tensor

    def reduce_tensor(t):
        if t.device.type == "unified":
            return reduce_unified(t)
        return original(t)

    # torch registers its reducers when torch.multiprocessing is imported.
    _torch_reductions.init_reductions()
    ForkingPickler.register(torch.Tensor, reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, reduce_tensor)
