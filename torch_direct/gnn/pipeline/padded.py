"""A graphed step's padded buffers: :class:`PaddedBatch` holds one batch at a time in static
buffers of fixed capacities, padded as ``graphed.py`` explains, and copies each batch in.

The copy is one call into C++ without the GIL (``_aggregate.PaddedBuffers.fill``, which keeps
the buffers and what does not change between batches); on a GPU it is a memcpy of the features,
a memset of their padding and one kernel for every block's edges and the labels. Under the
experimental ``step_host=fused_waits``, with two sets of buffers (:meth:`PaddedBatch.fill_beside`)
the fill stream's waits and the training stream's wait for the copy are in that call too. The setting ``step_host`` picks the form (:func:`step_host`).
"""

from __future__ import annotations

import torch

import torch_direct

from . import _aggregate


STEP_HOSTS = ("fused", "fused_waits", "aten", "python")


def step_host() -> str:
    """The experimental setting ``step_host``: ``fused`` (default: a step's host-side copies and
    tally in one C++ call each, without the GIL; on a GPU the copy's edges and labels in one
    kernel), ``fused_waits`` (the same, and with two sets of buffers the copy's stream waits in
    its call), ``aten`` (the same calls, the copy as ATen ops) or ``python`` (one Python call an op)."""
    return torch_direct.experimental_setting("step_host", choices=STEP_HOSTS, default="fused")


def batch_sizes(b) -> tuple[tuple[int, int, int], ...]:
    """``(n_src, n_dst, edges)`` of each block of batch ``b``, in model order."""
    return tuple((int(size[0]), int(size[1]), int(ei.shape[1])) for ei, _, size in b.adjs)


class PaddedBatch:
    """Static buffers holding one batch at a time, padded to ``caps`` (``(n_src, n_dst, edges)``
    per block, as :func:`batch_sizes`) and ``seeds`` labels, on ``device``."""

    def __init__(self, caps, seeds: int, num_features: int, x_dtype, index_dtype, device):
        caps = tuple(tuple(int(v) for v in c) for c in caps)
        for i in range(len(caps) - 1):
            if caps[i][1] != caps[i + 1][0]:
                raise ValueError(f"PaddedBatch: block {i} has {caps[i][1]} targets but block {i + 1} "
                                 f"{caps[i + 1][0]} sources")
        if caps[-1][1] != seeds:
            raise ValueError(f"PaddedBatch: the last block has {caps[-1][1]} targets for {seeds} labels")
        self.caps, self.seeds = caps, seeds
        self.x = torch.zeros(caps[0][0], num_features, dtype=x_dtype, device=device)
        # padding edge j: source j mod n_src; targets counted down from the last row (see fill)
        self.ramps = [torch.arange(c[2], dtype=index_dtype, device=device) for c in caps]
        self.pad_src = [r % c[0] for r, c in zip(self.ramps, caps)]
        self.edges = [torch.stack([p, torch.full_like(p, c[1] - 1)]) for p, c in zip(self.pad_src, caps)]
        self.y = torch.full((seeds,), -1, dtype=torch.long, device=device)
        self.adjs = [(e, None, (c[0], c[1])) for e, c in zip(self.edges, caps)]
        host = step_host()   # read once: fill runs every step
        self.fused, self.kernel = host != "python", host in ("fused", "fused_waits")
        self.waits_in_call = host == "fused_waits"
        self.native = _aggregate.PaddedBuffers(self.x, self.edges, self.ramps, self.pad_src,
                                               [c[1] for c in caps], self.y)

    def fits(self, b):
        """Batch ``b``'s sizes (as :func:`batch_sizes`) where it fits, each size within its capacity
        with a padding target row left; else None."""
        sizes = batch_sizes(b)
        if len(sizes) != len(self.caps) or b.x.shape[0] != sizes[0][0] or b.x.shape[1] != self.x.shape[1]:
            return None
        return sizes if all(s[0] <= c[0] and s[1] < c[1] and s[2] <= c[2] for s, c in zip(sizes, self.caps)) else None

    @staticmethod
    def _batch(b) -> tuple:
        """The copy call's arguments for batch ``b``: features, each block's edges and target
        count, labels."""
        return b.x, [ei for ei, _, _ in b.adjs], [int(size[1]) for _, _, size in b.adjs], b.y

    def fill_beside(self, b, fill_stream, train_stream, waits, copied):
        """The copy on ``fill_stream`` after the events ``waits``, ``copied`` recorded after it and
        ``train_stream`` waiting for it: one call without the GIL (with the kernel: CUDA only).
        Returns the copy's own (wall, CPU) seconds, as :meth:`fill`."""
        return self.native.fill_beside(fill_stream.cuda_stream, train_stream.cuda_stream,
                                       [e.cuda_event for e in waits], copied.cuda_event, *self._batch(b))

    def fill(self, b):
        """Copy batch ``b`` (which :meth:`fits`) into the buffers, its padding reset. Fused, returns
        the copy call's own (wall, CPU) seconds, timed inside it; else None."""
        if self.fused:
            return self.native.fill(*self._batch(b), self.kernel)
        n = b.x.shape[0]
        self.x[:n].copy_(b.x)
        self.x[n:].zero_()
        for (ei, _, size), e, c, r, p in zip(b.adjs, self.edges, self.caps, self.ramps, self.pad_src):
            k = ei.shape[1]
            e[:, :k].copy_(ei)
            e[0, k:].copy_(p[k:])
            # over the padding target rows size[1] .. c[1] - 1, from the last one down, in runs of
            # at most ceil(padding / rows) edges: grouped by target as the sampler's own edges
            # are, which the fused mean aggregation sums a run at a time
            t = e[1, k:]
            per_row = max(1, -(-(c[2] - k) // (c[1] - int(size[1]))))
            torch.sub(r[k:], k, out=t)
            t.div_(per_row, rounding_mode="floor").neg_().add_(c[1] - 1)
        self.y[:b.batch_size].copy_(b.y)
        self.y[b.batch_size:].fill_(-1)
        return None
