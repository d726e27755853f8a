"""What holds a process's GPU memory when an allocation fails: a short summary of the caching
allocator's snapshot, written as JSON at the moment of a CUDA out-of-memory error.

    watch = OomReport(Path("oom.json"))   # records each live block's Python stack from now on
    ...                                   # a run that may run out of GPU memory
    watch.close()                         # stops recording; oom.json exists if an OOM happened

The summary (``summarise``) gives the bytes of live blocks per CUDA stream, and per allocation
site: the innermost frame of this repository's code (``torch_direct`` or ``experiments``) on
the block's stack, else its innermost frame. A full snapshot of a papers100M-sized run is far
too large to carry back from the GPU machine; this is a few kilobytes.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

OWN_CODE = ("torch_direct", "experiments")


def site_of(frames: list) -> str:
    """``file:line function`` of the innermost frame of this repository's code, else of the
    innermost frame ('unknown' without frames)."""
    if not frames:
        return "unknown"
    pick = next((f for f in frames if any(part in f.get("filename", "") for part in OWN_CODE)), frames[0])
    name = pick.get("filename", "?")
    for part in OWN_CODE:   # the path from the package or folder on
        cut = name.find(part)
        if cut >= 0:
            name = name[cut:]
            break
    return f"{name}:{pick.get('line', '?')} {pick.get('name', '?')}"


def summarise(snapshot: dict, top: int = 15) -> dict:
    """Live (allocated) bytes of a ``torch.cuda.memory._snapshot()`` per stream and per site,
    the ``top`` largest sites first, with the segments' reserved bytes."""
    by_stream: dict = defaultdict(int)
    sites: dict = defaultdict(lambda: [0, 0])
    reserved = allocated = 0
    for seg in snapshot.get("segments", []):
        reserved += int(seg.get("total_size", 0))
        for block in seg.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            size = int(block.get("size", 0))
            allocated += size
            by_stream[str(seg.get("stream", "?"))] += size
            s = sites[site_of(block.get("frames") or [])]
            s[0] += size
            s[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])
    return {
        "allocated_gib": allocated / 2**30,
        "reserved_gib": reserved / 2**30,
        "by_stream_gib": {k: v / 2**30 for k, v in sorted(by_stream.items(), key=lambda kv: -kv[1])},
        "sites": [{"site": k, "gib": v[0] / 2**30, "blocks": v[1]} for k, v in ranked[:top]],
        "other_sites_gib": sum(v[0] for _, v in ranked[top:]) / 2**30,
    }


class OomReport:
    """Record live blocks' Python stacks and write ``summarise`` of the snapshot to ``path``
    at the first CUDA out-of-memory error (later ones are left: the first says most)."""

    def __init__(self, path: Path):
        import torch
        self.path = Path(path)
        self.written = False
        self._torch = torch
        torch.cuda.memory._record_memory_history("state", context="alloc", stacks="python")
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)

    def _on_oom(self, device, alloc, device_allocated, device_free) -> None:
        if self.written:
            return
        report = summarise(self._torch.cuda.memory._snapshot())
        report["failed_request_gib"] = alloc / 2**30
        report["device_free_gib"] = device_free / 2**30
        self.path.write_text(json.dumps(report, indent=1) + "\n")
        self.written = True

    def close(self) -> None:
        self._torch.cuda.memory._record_memory_history(None)
