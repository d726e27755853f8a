"""Gather micro-benchmark: B rows of an N x D host table landed on the GPU.

Sweeps row size, table size, index count, index order and dtype, and times,
in the same run: `ours` (torch_direct.gather, GPU-centric), `ours_hybrid` (the
same with CPU threads taking a measured share of the rows), `memcpy` (contiguous pinned
host-to-device copy of the same bytes: the PCIe limit), `cpu_centric` (CPU
threads gather into a pinned buffer, then one DMA), `naive_uva` (stock
index_select on a CUDA alias of the mapped table), `naive_uva_sorted` (the same
with sorted indices, rows scattered back to the requested order) and
`gpu_resident` (the table in GPU memory, where it fits). Prints GB/s, million
rows/s, each reference's ratio and CPU seconds per GB moved; writes JSON and a
PNG. At every point the rows of `ours` and `ours_hybrid` are compared with a CPU
gather of the same index; a mismatch is reported and the run exits with status 1.
Without a usable GPU it says so and times the CPU paths (`ours` and
`cpu_centric`, both gathering into host memory).
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import torch

from .common import check_writable, default_out, machine_record, time_it, track, write_json

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
ROW_BYTES = (64, 128, 200, 256, 400, 512, 1024, 2048)


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


def add_arguments(ap) -> None:
    ap.add_argument("--table-gb", default=None,
                    help="table sizes in GB, comma-separated (default: 1,32 with a GPU; 0.25 without)")
    ap.add_argument("--row-bytes", default=",".join(map(str, ROW_BYTES)),
                    help="row sizes in bytes (default: %(default)s)")
    ap.add_argument("--indices", default=None,
                    help="index counts (default: 400000,2000000 with a GPU; 100000 without)")
    ap.add_argument("--orders", default="random,sorted", help="index orders (default: %(default)s)")
    ap.add_argument("--dtypes", default="fp32,fp16", help="table dtypes (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per point (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON record to write (default: gather.json in the user's cache, "
                         "~/.cache/torch_direct/results)")
    ap.add_argument("--plot", type=Path, default=None,
                    help="chart to draw, .png/.svg/.pdf, with matplotlib (default: the JSON path with .png "
                         "when matplotlib is installed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=None,
                    help="comma-separated methods to time beside ours (default: all of "
                         + ", ".join(METHODS[1:]) + "); ours is always timed, the ratios are to it")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="CPU threads of the hybrid mode and of cpu_centric (default: all cores)")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress bar (for logs), as in the other benchmarks")


def _check_sizes(tables: list[float], rows: list[int], dtypes: list) -> str:
    """A one-line problem with the sizes asked for, or "" (a point that cannot be
    measured is refused before any table is made, not skipped in silence)."""
    if not tables or any(gb <= 0 for gb in tables):
        return f"--table-gb: sizes must be positive, got {','.join(map(str, tables)) or 'none'}"
    if not dtypes:
        return "--dtypes: give at least one of " + ", ".join(DTYPES)
    for r in rows:
        for d in dtypes:
            es = torch.tensor([], dtype=d).element_size()
            if r % es:
                return (f"--row-bytes: {r} is not a whole number of {str(d).split('.')[-1]} elements "
                        f"({es} bytes each)")
    for gb in tables:
        if int(gb * 1e9) < max(rows):
            return f"--table-gb: {gb} GB holds no row of {max(rows)} bytes"
    return ""


METHODS = ("ours", "memcpy", "cpu_centric", "ours_hybrid", "naive_uva", "naive_uva_sorted", "gpu_resident")


def _methods(table, idx, gpu: bool, resident, cpu_threads: int):
    """name -> zero-argument callable doing one gather of `idx` rows."""
    import torch_direct

    n, width = idx.numel(), table.shape[1]
    host = torch_direct.cpu_alias(table)
    idx_cpu = idx.cpu()
    m = {"ours": lambda: torch_direct.gather(table, idx)}
    if not gpu:
        buf = torch.empty(n, width, dtype=table.dtype)
        m["cpu_centric"] = lambda: torch.index_select(host, 0, idx_cpu, out=buf)
        return m
    nbytes = n * width * table.element_size()
    flat = table.view(-1).view(torch.uint8)
    dst_bytes = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    # The same number of bytes, contiguous; from the table's start again when
    # it is smaller than what is moved.
    spans = [(o, min(flat.numel(), nbytes - o)) for o in range(0, nbytes, flat.numel())]

    def memcpy():
        for o, k in spans:
            dst_bytes[o:o + k].copy_(flat[:k], non_blocking=True)

    m["memcpy"] = memcpy
    pinned = torch.empty(n, width, dtype=table.dtype, pin_memory=True)
    dst = torch.empty(n, width, dtype=table.dtype, device="cuda")

    def cpu_centric():
        torch.index_select(host, 0, idx_cpu, out=pinned)
        dst.copy_(pinned, non_blocking=True)

    m["cpu_centric"] = cpu_centric
    m["ours_hybrid"] = lambda: torch_direct.gather(table, idx, cpu_threads=cpu_threads)
    alias = torch_direct.cuda_alias(table, idx.device.index or 0)
    m["naive_uva"] = lambda: torch.index_select(alias, 0, idx)
    out = torch.empty(n, width, dtype=table.dtype, device="cuda")

    def naive_uva_sorted():
        s, perm = torch.sort(idx)
        out[perm] = torch.index_select(alias, 0, s)

    m["naive_uva_sorted"] = naive_uva_sorted
    if resident is not None:
        m["gpu_resident"] = lambda: torch.index_select(resident, 0, idx)
    return m


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, bit for bit: a gather copies bits, and the fp16 views of
    the random fp32 table hold NaNs, which torch.equal counts as different from themselves."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(ints), b.contiguous().view(ints)))


def run(args) -> int:
    import torch_direct

    gpu = torch.cuda.is_available() and torch_direct.cuda_available()
    if not gpu:
        print("gather bench: no usable GPU here: timing the CPU paths (ours, cpu_centric) only",
              file=sys.stderr)
    try:
        tables = [float(x) for x in (args.table_gb or ("1,32" if gpu else "0.25")).split(",")]
        rows = _ints(args.row_bytes)
        counts = _ints(args.indices or ("400000,2000000" if gpu else "100000"))
        orders = [o for o in args.orders.split(",") if o]
        dtypes = [DTYPES[d] for d in args.dtypes.split(",") if d]
    except (KeyError, ValueError) as e:
        print(f"gather bench: bad option value: {e}", file=sys.stderr)
        return 2
    methods = None
    if args.methods:
        methods = {"ours"} | {m for m in args.methods.split(",") if m}
        unknown = sorted(methods - set(METHODS))
        if unknown:
            print(f"gather bench: unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}",
                  file=sys.stderr)
            return 2
    bad = [o for o in orders if o not in ("random", "sorted")]
    if bad or any(r <= 0 for r in rows) or any(c <= 0 for c in counts) or args.repeats <= 0:
        print("gather bench: orders must be random/sorted; sizes and repeats positive", file=sys.stderr)
        return 2
    problem = _check_sizes(tables, rows, dtypes)
    if problem:
        print(f"gather bench: {problem}", file=sys.stderr)
        return 2
    args.out = args.out or default_out("gather")
    plot = args.plot or args.out.with_suffix(".png")
    try:
        check_writable(args.out, "--out")
        check_writable(plot, "--plot")
        if plot.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise ValueError(f"--plot: give a .png, .svg or .pdf path (matplotlib writes the format "
                             f"its suffix names), got {str(plot)!r}")
        if args.plot:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ValueError("--plot: the gather chart needs matplotlib (pip install matplotlib)") from None
    except ValueError as e:
        print(f"gather bench: {e}", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(args.seed)
    record = {"benchmark": "gather", "machine": machine_record(), "config": vars(args) | {
        "out": str(args.out), "plot": str(args.plot)}, "points": []}
    dev = torch.device("cuda") if gpu else torch.device("cpu")
    cpu_threads = args.cpu_threads or os.cpu_count() or 1
    torch.set_num_threads(cpu_threads)  # cpu_centric and the CPU gathers use as many
    bad_points: list[str] = []
    for gb in tables:
        nbytes = int(gb * 1e9)
        base = torch.empty(nbytes // 4, dtype=torch.float32, device="unified")
        base.uniform_(-1, 1)  # random data: zeros would hide unwritten rows and run faster
        grid = list(itertools.product(dtypes, rows, counts, orders))
        points = grid if args.no_progress else track(grid, len(grid), f"table {gb} GB")
        for dtype, row_bytes, count, order in points:
            es = torch.tensor([], dtype=dtype).element_size()
            if row_bytes % es:
                continue
            width = row_bytes // es
            n_rows = nbytes // row_bytes
            table = base.view(torch.uint8)[: n_rows * row_bytes].view(dtype).view(n_rows, width)
            idx = torch.randint(0, n_rows, (count,), generator=gen)
            if order == "sorted":
                idx = idx.sort().values
            idx = idx.to(dev)
            resident = None
            if gpu and nbytes < 0.4 * torch.cuda.mem_get_info()[0]:
                resident = table.to("cuda")
            moved = count * row_bytes
            point = {"table_gb": gb, "dtype": str(dtype).split(".")[-1], "row_bytes": row_bytes,
                     "indices": count, "order": order, "bytes": moved, "times": {}}
            for name, fn in _methods(table, idx, gpu, resident, cpu_threads).items():
                if methods is not None and name not in methods:
                    continue
                t = time_it(fn, args.repeats, args.warmup, gpu)
                t["GBps"] = moved / t["median_s"] / 1e9
                t["Mrows_per_s"] = count / t["median_s"] / 1e6
                t["cpu_s_per_GB"] = t["cpu_s"] / (moved / 1e9)
                point["times"][name] = t
            # The timed paths' rows against a CPU gather of the same index (a fast wrong kernel
            # must not pass for a fast kernel).
            host = torch_direct.cpu_alias(table)
            want = torch.index_select(host, 0, idx.cpu())
            point["checked"] = {}
            for name in ("ours", "ours_hybrid"):
                if name in point["times"]:
                    got = (torch_direct.gather(table, idx, cpu_threads=cpu_threads) if name == "ours_hybrid"
                           else torch_direct.gather(table, idx))
                    point["checked"][name] = _same_bits(got.cpu(), want)
            del host, want
            wrong = [k for k, ok in point["checked"].items() if not ok]
            if wrong:
                bad_points.append(f"{gb} GB {point['dtype']} {row_bytes} B {count} {order}: {', '.join(wrong)}")
            ours = point["times"]["ours"]["median_s"]
            # time(reference) / time(ours): above 1, ours is faster
            point["speedup_vs"] = {k: v["median_s"] / ours
                                   for k, v in point["times"].items() if k != "ours"}
            record["points"].append(point)
            write_json(args.out, record)  # a stopped run keeps what it measured
            del resident
        del base
    record["targets"] = targets(record)
    write_json(args.out, record)
    _print_table(record)
    for t in record["targets"]:
        print(f"target {t['name']}: {t['ratio']:.2f} (want >= {t['want']}) "
              f"{'met' if t['met'] else 'MISSED'} at {t['point']}")
    if draw(record, plot):
        print(f"wrote {args.out} and {plot}")
    else:
        print(f"wrote {args.out} (no plot: matplotlib is not installed)")
    if bad_points:
        print("gather bench: rows differ from a CPU gather of the same index at " + "; ".join(bad_points),
              file=sys.stderr)
        return 1
    return 0


def targets(record: dict) -> list[dict]:
    """The gather's targets, each at its worst point in this run."""
    def worst(name, want, select, ratio):
        pts = [p for p in record["points"] if select(p)]
        if not pts:
            return None
        vals = [(ratio(p), p) for p in pts]
        r, p = min(vals, key=lambda v: v[0])
        where = f"{p['table_gb']} GB {p['dtype']} {p['row_bytes']} B {p['indices']} {p['order']}"
        return {"name": name, "want": want, "ratio": r, "met": r >= want, "point": where,
                "points": len(pts)}

    def gbps(p, k):
        return p["times"][k]["GBps"] if k in p["times"] else float("nan")

    big = lambda p: p["table_gb"] >= 32 and p["order"] == "random"  # noqa: E731
    out = [
        worst("1 GB, rows >= 128 B, random: ours / memcpy", 0.90,
              lambda p: p["table_gb"] <= 1 and p["row_bytes"] >= 128 and p["order"] == "random"
              and "memcpy" in p["times"], lambda p: gbps(p, "ours") / gbps(p, "memcpy")),
        worst(">= 32 GB, 400K random, 128-1024 B: ours / naive_uva_sorted", 1.0,
              lambda p: big(p) and p["indices"] == 400000 and 128 <= p["row_bytes"] <= 1024
              and "naive_uva_sorted" in p["times"],
              lambda p: gbps(p, "ours") / gbps(p, "naive_uva_sorted")),
        worst(">= 32 GB, 400K random, 128-1024 B: ours_hybrid / max(naive_uva_sorted, cpu_centric)",
              1.5, lambda p: big(p) and p["indices"] == 400000 and 128 <= p["row_bytes"] <= 1024
              and "ours_hybrid" in p["times"],
              lambda p: gbps(p, "ours_hybrid") / max(gbps(p, "naive_uva_sorted"),
                                                     gbps(p, "cpu_centric"))),
        worst(">= 32 GB, 2M random, rows >= 512 B: ours / memcpy", 0.90,
              lambda p: big(p) and p["indices"] == 2000000 and p["row_bytes"] >= 512
              and "memcpy" in p["times"], lambda p: gbps(p, "ours") / gbps(p, "memcpy")),
        worst("CPU s/GB: cpu_centric / ours", 10.0,
              lambda p: "cpu_centric" in p["times"] and "memcpy" in p["times"],
              lambda p: p["times"]["cpu_centric"]["cpu_s_per_GB"]
              / max(p["times"]["ours"]["cpu_s_per_GB"], 1e-9)),
    ]
    return [t for t in out if t is not None]


def _print_table(record: dict) -> None:
    names = sorted({k for p in record["points"] for k in p["times"]}, key=lambda k: (k != "ours", k))
    head = f"{'table':>6} {'dtype':>8} {'row B':>6} {'idx':>8} {'order':>7} " + " ".join(
        f"{n + ' GB/s':>22}" for n in names) + f" {'ours Mrow/s':>12} {'ours CPU s/GB':>14}"
    print(head)
    for p in record["points"]:
        cells = [f"{p['times'][n]['GBps']:>22.2f}" if n in p["times"] else f"{'-':>22}" for n in names]
        o = p["times"]["ours"]
        print(f"{p['table_gb']:>6} {p['dtype']:>8} {p['row_bytes']:>6} {p['indices']:>8} {p['order']:>7} "
              + " ".join(cells) + f" {o['Mrows_per_s']:>12.1f} {o['cpu_s_per_GB']:>14.3f}")
    print("speedup of ours = time(reference) / time(ours); above 1, ours is faster")
    for p in record["points"]:
        print(f"  {p['table_gb']} GB {p['dtype']} {p['row_bytes']} B {p['indices']} {p['order']}: "
              + ", ".join(f"vs {k} {v:.2f}x" for k, v in p["speedup_vs"].items()))


def draw(record: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = sorted({(p["table_gb"], p["indices"], p["order"], p["dtype"]) for p in record["points"]})
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    for ax, g in zip(axes[:, 0], groups):
        pts = [p for p in record["points"] if (p["table_gb"], p["indices"], p["order"], p["dtype"]) == g]
        for name in sorted({k for p in pts for k in p["times"]}):
            xs = [p["row_bytes"] for p in pts if name in p["times"]]
            ys = [p["times"][name]["GBps"] for p in pts if name in p["times"]]
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{g[0]} GB table, {g[1]} {g[2]} indices, {g[3]}")
        ax.set_xlabel("row bytes")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
