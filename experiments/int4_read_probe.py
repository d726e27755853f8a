"""Device-side experiment: the GPU time of a cached 4-bit feature store's batch, part by part.

A batch of BATCH rows, HIT_RATE of them in a cache of CACHE_ROWS packed rows (ROW_BYTES bytes a
row: 64 for papers100M-like's 128 features), the rest read by the wrapped store. Two ways to
turn the parts into the batch's rows, each timed with CUDA events (the median of REPEATS):

- bytes first: the hits' bytes gathered from the cache (``index_select``), the misses' bytes
  scattered among them (``index_put_``), then the whole batch unpacked;
- in place: the hits unpacked straight from the cache (``unpack_int4``'s ``rows_at``), the
  misses from their own rows to their places (``out_at``): each row written once.

Both give the same rows, bit for bit (checked before timing). A float8 cache of the same rows
(twice the bytes a row) is timed beside them for reference: its hits gathered and upcast in one
pass (``torch_direct.gather``), its misses' upcast rows scattered. The per-batch figures times
BATCHES give an epoch's GPU time beside the training step.

    python experiments/int4_read_probe.py [--out OUT.json] [--batch 940000] [--hit-rate 0.66]
        [--cache-rows 52000000] [--row-bytes 64] [--repeats 30] [--batches 1179] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys

from _cli import finish, median_seconds, run  # experiments/ is on sys.path when run as python3 experiments/int4_read_probe.py


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON file to write (default: print only)")
    ap.add_argument("--batch", type=int, default=940_000, help="rows a batch (default 940000)")
    ap.add_argument("--hit-rate", type=float, default=0.66, help="share of a batch's rows in the cache (default 0.66)")
    ap.add_argument("--cache-rows", type=int, default=52_000_000, help="packed rows in the cache (default 52000000)")
    ap.add_argument("--row-bytes", type=int, default=64, help="packed bytes a row (default 64: 128 features)")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls of each part (default 30)")
    ap.add_argument("--batches", type=int, default=1179, help="batches an epoch, for the epoch figures (default 1179)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the plumbing only)")
    args = ap.parse_args(argv)
    if min(args.batch, args.cache_rows, args.row_bytes, args.repeats, args.batches) < 1:
        raise ValueError("--batch, --cache-rows, --row-bytes, --repeats and --batches must be >= 1")
    if not 0.0 < args.hit_rate < 1.0:
        raise ValueError(f"--hit-rate must lie strictly between 0 and 1, got {args.hit_rate}")

    import torch

    import torch_direct
    from torch_direct.gnn.pipeline import _features
    device = torch.device(args.device)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device must be cuda or cpu, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda needs a CUDA GPU (--device cpu runs the plumbing)")
    gen = torch.Generator(device=device).manual_seed(0)
    n, m, c = args.batch, args.row_bytes, args.cache_rows
    table_rows = 2 * c   # the table's other rows: the misses' row numbers
    cache = torch.randint(0, 256, (c, m), dtype=torch.uint8, device=device, generator=gen)
    scale = torch.rand(table_rows, device=device, generator=gen) + 0.5
    idx = torch.randint(0, table_rows, (n,), device=device, generator=gen)
    hit = torch.rand(n, device=device, generator=gen) < args.hit_rate
    slot = torch.where(hit, torch.randint(0, c, (n,), device=device, generator=gen), -1)
    miss = torch.nonzero(slot < 0).squeeze(1)
    at = idx[miss]
    miss_rows = torch.randint(0, 256, (miss.numel(), m), dtype=torch.uint8, device=device, generator=gen)
    dim = 2 * m
    out = torch.empty(n, dim, dtype=torch.bfloat16, device=device)
    packed = torch.empty(n, m, dtype=torch.uint8, device=device)

    def hits_bytes():
        torch.index_select(cache, 0, slot.clamp(min=0), out=packed)

    def misses_bytes():
        packed[miss] = miss_rows

    def unpack_all():
        _features.unpack_int4(packed, scale, idx, out)

    def hits_in_place():
        _features.unpack_int4(cache, scale, idx, out, rows_at=slot)

    def misses_in_place():
        _features.unpack_int4(miss_rows, scale, at, out, out_at=miss)

    # the two ways agree, bit for bit
    hits_bytes(), misses_bytes(), unpack_all()
    want = out.clone()
    out.fill_(float("nan"))
    hits_in_place(), misses_in_place()
    if not torch.equal(out, want):
        raise RuntimeError("the in-place unpacking differs from unpacking the gathered bytes")
    del want

    def timed(fn) -> float:   # microseconds
        return 1e6 * median_seconds(device, fn, args.repeats)

    parts = {"bytes_first": {"hits_index_select": timed(hits_bytes), "misses_index_put": timed(misses_bytes),
                             "unpack_batch": timed(unpack_all)},
             "in_place": {"hits_unpacked_from_cache": timed(hits_in_place),
                          "misses_unpacked_to_place": timed(misses_in_place)}}
    del packed
    # float8 for reference: the same rows at twice the bytes, a float32 scale a cached row
    del cache
    cache8 = torch.randint(0, 256, (c, 2 * m), dtype=torch.uint8, device=device, generator=gen).view(torch.float8_e4m3fn)
    cache_scale = torch.rand(c, device=device, generator=gen) + 0.5
    miss_up = torch.randn(miss.numel(), dim, device=device, generator=gen).to(torch.bfloat16)
    at_slot = slot.clamp(min=0)

    def hits_fp8():
        torch_direct.gather(cache8, at_slot, dtype=torch.bfloat16, scale=cache_scale, order="as_is",
                            index_bounds=(0, c - 1))

    def misses_fp8():
        out[miss] = miss_up

    parts["float8"] = {"hits_gather_upcast": timed(hits_fp8), "misses_index_put": timed(misses_fp8)}
    totals = {k: sum(v.values()) for k, v in parts.items()}
    record = {"device": str(device),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "batch": n, "hit_rate": args.hit_rate, "misses": miss.numel(), "cache_rows": c, "row_bytes": m,
              "repeats": args.repeats, "batches": args.batches, "parts_us": parts, "batch_us": totals,
              "epoch_s": {k: v * args.batches / 1e6 for k, v in totals.items()},
              "bytes_first_over_in_place": totals["bytes_first"] / totals["in_place"],
              "float8_over_in_place": totals["float8"] / totals["in_place"]}
    for k, v in parts.items():
        print(f"{k:12s} " + "  ".join(f"{p} {us:8.1f} us" for p, us in v.items())
              + f"  | batch {totals[k]:8.1f} us, epoch {record['epoch_s'][k]:.3f} s")
    print(f"bytes first / in place: {record['bytes_first_over_in_place']:.2f}x; "
          f"float8 / 4-bit in place: {record['float8_over_in_place']:.2f}x")
    return finish(args.out, record)


if __name__ == "__main__":
    run("int4_read_probe", lambda: main(sys.argv[1:]))
