"""Where the unified feature store's table lives: small pages (the allocator's unified memory,
shareable between processes), transparent huge pages (``TORCH_DIRECT_EXPERIMENTAL=feature_pages=huge``)
or memory the CUDA driver allocates and maps itself at its own granularity
(``feature_pages=driver``, :func:`torch_direct.driver_mapped`)."""

from __future__ import annotations

import torch

import torch_direct


PAGES = ("small", "huge", "driver")


def feature_pages() -> str:
    """The experimental setting feature_pages: "small" (unset: the default), "huge" or "driver"."""
    return torch_direct.experimental_setting("feature_pages", choices=PAGES, default="small")


def huge_page_bytes(nbytes: int) -> torch.Tensor:
    """``nbytes`` of untouched anonymous memory advised MADV_HUGEPAGE, as a uint8 CPU tensor:
    advised before the first touch, so the kernel can fault 2 MiB pages in. The tensor holds a
    reference to the mapping, which lives as long as the storage. Huge pages are a request the
    kernel may refuse (``/sys/kernel/mm/transparent_hugepage/enabled``); the memory works either
    way. Private to the process."""
    import mmap
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(mm, dtype=torch.uint8)


def huge_page_table(x: torch.Tensor) -> torch.Tensor:
    """A unified copy of ``x`` on transparent huge pages (:func:`huge_page_bytes`), pinned in
    place (``torch_direct.pin_inplace``). The GPU then needs one translation per 2 MiB of the
    table instead of one per 4 KiB. Not shareable between processes (private memory)."""
    nbytes = x.numel() * x.element_size()
    if nbytes == 0:
        return x.contiguous().to("unified")
    # bytes first (frombuffer takes no float8), then the table's dtype
    host = huge_page_bytes(nbytes).view(x.dtype).view(x.shape)
    host.copy_(x)
    return torch_direct.pin_inplace(host)


def huge_page_share(t: torch.Tensor, smaps: str = "/proc/self/smaps"):
    """The share of ``t``'s bytes the kernel put on transparent huge pages: the AnonHugePages of
    the mappings its bytes lie in (``smaps``), over its bytes, at most 1. None where that file
    cannot be read (not Linux, say). Huge pages are a request (:func:`huge_page_bytes`): this says
    what the kernel granted."""
    nbytes = t.numel() * t.element_size()
    start = t.data_ptr()
    end = start + nbytes
    if nbytes == 0:
        return None
    huge, inside = 0, False
    try:
        with open(smaps) as f:
            for line in f:
                head = line.split(None, 1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):   # a mapping's first line: "lo-hi perms ..."
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo < end and start < hi
                elif inside and head == "AnonHugePages:":
                    huge += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return min(1.0, huge / nbytes)


def table_on_pages(x: torch.Tensor, pages: str) -> torch.Tensor:
    """A unified copy of ``x`` on ``pages`` (one of :data:`PAGES`)."""
    if pages == "huge":
        return huge_page_table(x)
    if pages == "driver":
        return torch_direct.driver_mapped(x)
    return x.contiguous().to("unified")
