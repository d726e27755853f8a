"""Where the unified feature store's table lives: small pages (the allocator's unified memory,
shareable between processes) or transparent huge pages (``TORCH_DIRECT_EXPERIMENTAL=feature_pages=huge``)."""

from __future__ import annotations

import torch

import torch_direct


def feature_pages() -> str:
    """The experimental setting feature_pages: "small" (unset: the default) or "huge"."""
    pages = torch_direct.experimental_setting("feature_pages") or "small"
    if pages not in ("small", "huge"):
        raise ValueError(f"TORCH_DIRECT_EXPERIMENTAL: feature_pages must be small or huge, not {pages!r}")
    return pages


def huge_page_table(x: torch.Tensor) -> torch.Tensor:
    """A unified copy of ``x`` on transparent huge pages: anonymous memory advised
    MADV_HUGEPAGE before it is touched, so the kernel can back it with 2 MiB pages, then
    pinned in place (``torch_direct.pin_inplace``). The GPU then needs one translation per
    2 MiB of the table instead of one per 4 KiB. Huge pages are a request the kernel may
    refuse (``/sys/kernel/mm/transparent_hugepage/enabled``); the table works either way.
    Not shareable between processes (private memory)."""
    import mmap
    nbytes = x.numel() * x.element_size()
    if nbytes == 0:
        return x.contiguous().to("unified")
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    # bytes first (frombuffer takes no float8), then the table's dtype; the tensor holds a
    # reference to the mapping, which lives as long as the table's storage
    host = torch.frombuffer(mm, dtype=torch.uint8).view(x.dtype).view(x.shape)
    host.copy_(x)
    return torch_direct.pin_inplace(host)
