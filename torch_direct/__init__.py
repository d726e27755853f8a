"""PyTorch-Direct: unified tensors (GPU-mapped host memory) for stock PyTorch.

``import torch_direct`` registers the ``unified`` device (on a torch wheel built
from the fork's patches the device is native and nothing is registered:
``torch_direct.vehicle()`` says which):

    >>> u = feats.to("unified")          # copy into mapped, pinned host memory
    >>> u = torch_direct.pin_inplace(t)  # no copy: map t's own pages
    >>> y = u[idx_on_cuda]               # runs on idx's GPU, reads host memory in place

Placement rules R1-R6 are in docs/placement.md.
"""

from __future__ import annotations

from ._backend import (  # noqa: F401  (on stock torch: registers the device on import)
    BACKEND_NAME,
    built_with_cuda,
    cpu_alias,
    cuda_alias,
    cuda_available,
    driver_mapped,
    empty_cache,
    is_unified,
    memory_stats,
    pin_inplace,
    reset_peak_memory_stats,
    vehicle,
)

from ._gather import gather, hybrid_cpu_fraction, hybrid_gather_parts  # noqa: E402
from ._quantize import dequantize_rows_int4, quantize_rows_fp8, quantize_rows_int4  # noqa: E402
from ._experimental import experimental, get as experimental_setting  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BACKEND_NAME",
    "built_with_cuda",
    "cpu_alias",
    "cuda_alias",
    "cuda_available",
    "dequantize_rows_int4",
    "driver_mapped",
    "empty_cache",
    "experimental",
    "experimental_setting",
    "gather",
    "quantize_rows_fp8",
    "quantize_rows_int4",
    "hybrid_cpu_fraction",
    "hybrid_gather_parts",
    "is_unified",
    "memory_stats",
    "pin_inplace",
    "reset_peak_memory_stats",
    "vehicle",
]
