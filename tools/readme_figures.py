"""The README's table of measured figures, rebuilt from the records under results/.

Each row of the table between the README's `<!-- figures:begin -->` and
`<!-- figures:end -->` lines says what was measured, the figure(s) as the
records give them, rounded as the README shows them, and the records they come
from with the commit of the code that ran (each record's `provenance`).

    python tools/readme_figures.py            # rewrite that part of README.md (nothing else)
    python tools/readme_figures.py --check    # exit 1, with one line, when README.md differs

A new measurement that replaces a figure: commit its record under results/ (the
benchmarks write `provenance` themselves), point the row below at it, and run
this without --check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


def epoch(rec: dict, which) -> float:
    """A record's epoch time (s): the row of pipeline ``which`` (bench train) or of ``which``
    processes (bench scaling)."""
    for row in rec["rows"]:
        if row.get("pipeline") == which or row.get("nproc") == which:
            return row["epoch_s"]
    raise KeyError(f"no row {which!r}")


def s(x: float, digits: int) -> str:
    return f"{x:.{digits}f} s"


def x(r: float, digits: int) -> str:
    return f"{r:.{digits}f}x"


SCALING, SCALING_GPU = "scaling_papers100M-like.json", "scaling_papers100M-like_graph-gpu.json"


def _scaling(r):
    one, two, four = (epoch(r[SCALING], n) for n in (1, 2, 4))
    return f"{s(one, 1)} / {s(two, 1)} ({x(two / one, 2)}) / {s(four, 1)} ({x(four / one, 2)})"


PAPERS_GRAPHED = {"unified": "train_papers100M-like_hash-86c851a_unified_tf32_ahead3.json",
                  "gpu_resident": "train_papers100M-like_hash-86c851a_gpu-resident_tf32_ahead3.json"}


def _papers_graphed(r):
    u, g = (epoch(r[PAPERS_GRAPHED[p]], p) for p in ("unified", "gpu_resident"))
    acc = {r[PAPERS_GRAPHED[p]]["rows"][0]["test_acc"] for p in PAPERS_GRAPHED}
    return f"{s(u, 2)} / {s(g, 2)} ({x(u / g, 2)}); test accuracy {' / '.join(f'{a:.4f}' for a in sorted(acc))}"


PAPERS_BF16 = {"unified": "train_papers100M-like_graphed-3a84d0f_bf16_unified_buffers2_ahead2_cache13500.json",
               "gpu_resident": "train_papers100M-like_graphed-3a84d0f_bf16_gpu-resident_buffers2_ahead2_step-normal.json",
               "gpu_resident high": "train_papers100M-like_graphed-3a84d0f_bf16_gpu-resident_buffers2_ahead2_step-high.json"}


def first_rows(r, names):
    """The first row of each named record, and their test accuracies as the README writes them."""
    rows = [r[n]["rows"][0] for n in names]
    return rows, " / ".join(f"{row['test_acc']:.4f}" for row in rows)


def _papers_bf16(r):
    (u, g, h), accs = first_rows(r, PAPERS_BF16.values())
    return (f"{s(u['epoch_s'], 2)} / {s(g['epoch_s'], 2)} ({x(u['epoch_s'] / g['epoch_s'], 2)}) / "
            f"{s(h['epoch_s'], 2)}; test accuracy {accs}")


PRODUCTS_OGB = "train_products-like_median3-793ab2a_fp16_cache384.json"


def _products_ogb(r):
    rec = r[PRODUCTS_OGB]
    u, g, c = (epoch(rec, p) for p in ("unified", "gpu_resident", "cpu_centric"))
    return f"{s(u, 2)} / {s(g, 2)} ({x(u / g, 2)}) / {s(c, 2)} (unified {x(c / u, 2)} faster)"


FP8 = {"papers": ("train_papers100M-like_hash-86c851a_unified_tf32_fp16.json",
                  "train_papers100M-like_hash-86c851a_unified_tf32_fp8.json"),
       "products": ("train_products-like_cache192-3a84d0f_fp16.json", "train_products-like_cache192-3a84d0f_fp8.json")}


PRODUCTS_PLAIN = "train_products-like_pipelines-793ab2a.json"


def _products_plain(r):
    rec = r[PRODUCTS_PLAIN]
    order = ("unified", "cpu_centric", "pyg", "gpu_resident")
    u, c, p, g = (epoch(rec, n) for n in order)
    by = {row["pipeline"]: row["test_acc"] for row in rec["rows"]}
    acc = " / ".join(f"{by[n]:.4f}" for n in order)
    return (f"{s(u, 2)} / {s(c, 2)} / {s(p, 1)} / {s(g, 2)} (unified {x(p / u, 1)} faster than PyG's loader); "
            f"test accuracy {acc}")


def _fp8(r):
    out = []
    for name, (half, eight) in FP8.items():
        h, e = r[half]["rows"][0], r[eight]["rows"][0]
        out.append(f"{name}: {s(h['epoch_s'], 2)} / {s(e['epoch_s'], 2)}, test accuracy "
                   f"{h['test_acc']:.4f} / {e['test_acc']:.4f}")
    return "; ".join(out)


PAPERS_HOST = "train_papers100M-like_host-csr-5e7d4d2_h100.json"

PAPERS_H100 = {"float16": "train_papers100M-like_reorder-5e7d4d2_h100_bf16_frequency.json",
               "float8": "train_papers100M-like_reorder-23cea3f_h100_fp8_frequency_cache6990.json",
               "gpu_resident": "train_papers100M-like_graphed-23cea3f_h100_bf16_gpu-resident_buffers2_ahead2.json"}


def _papers_h100(r):
    (h, e, g), accs = first_rows(r, PAPERS_H100.values())
    return (f"{s(h['epoch_s'], 2)} / {s(e['epoch_s'], 2)} / {s(g['epoch_s'], 2)} (float8 against it: "
            f"{x(e['epoch_s'] / g['epoch_s'], 2)}); test accuracy {accs}")


PAPERS_VARIANTS = [f"train_papers100M-like_variants-74c6213_h100_fp8_{v}.json" for v in ("w1", "w2", "f66")]


def _papers_variants(r):
    (one, two, fused), accs = first_rows(r, PAPERS_VARIANTS)
    g = r[PAPERS_H100["gpu_resident"]]["rows"][0]
    reorders = " / ".join(s(row["reorder_s"], 1) for row in (one, two, fused))
    return (f"{s(one['epoch_s'], 2)} / {s(two['epoch_s'], 2)} ({x(two['epoch_s'] / g['epoch_s'], 2)} the "
            f"all-in-GPU epoch above) / {s(fused['epoch_s'], 2)}; reorder before training {reorders}; "
            f"test accuracy {accs}")


PAPERS_SHARE = [f"train_papers100M-like_variants-3dfb922_h100_fp8_{v}.json" for v in ("w2", "w2c1", "gr", "c1")]


def _papers_share(r):
    (measured, every, resident, again), accs = first_rows(r, PAPERS_SHARE)
    return (f"{s(measured['epoch_s'], 2)} / {s(every['epoch_s'], 2)} ({x(every['epoch_s'] / resident['epoch_s'], 2)}) / "
            f"{s(resident['epoch_s'], 2)}; the second call {s(again['epoch_s'], 2)} "
            f"({x(again['epoch_s'] / resident['epoch_s'], 2)}); test accuracy {accs}")


PAPERS_THREADS = [f"train_papers100M-like_variants-1ba42d0_h100_fp8_{v}.json" for v in ("t3", "c1", "c1b", "t8", "w1", "gr")]


def _papers_threads(r):
    (t3, c1, c1b, t8, w1, resident), accs = first_rows(r, PAPERS_THREADS)
    return (f"{s(t3['epoch_s'], 2)} / {s(c1['epoch_s'], 2)} and {s(c1b['epoch_s'], 2)} / {s(t8['epoch_s'], 2)} "
            f"({x(t8['epoch_s'] / resident['epoch_s'], 2)}) / {s(w1['epoch_s'], 2)} / {s(resident['epoch_s'], 2)}; "
            f"test accuracy {accs}")


PAPERS_MARGIN = [f"train_papers100M-like_variants-e14feda_h100_fp8_c{v}.json" for v in ("w3m", "w3", "gr", "grm")]


def _papers_margin(r):
    (tight, loose, resident, resident_tight), accs = first_rows(r, PAPERS_MARGIN)
    return (f"{s(tight['epoch_s'], 2)} ({x(tight['epoch_s'] / resident_tight['epoch_s'], 2)}) / "
            f"{s(loose['epoch_s'], 2)} / {s(resident['epoch_s'], 2)} / {s(resident_tight['epoch_s'], 2)}; "
            f"test accuracy {accs}")


PAPERS_AUTO = [f"train_papers100M-like_variants-ec80a50_h100_fp8_a{v}.json" for v in ("w4", "w3", "gr")]


def against_last(names):
    """A formatter: each record's epoch against the last one's (all-in-GPU), then the last's."""
    def figures(r):
        rows, accs = first_rows(r, names)
        base = rows[-1]["epoch_s"]
        return " / ".join([f"{s(row['epoch_s'], 2)} ({x(row['epoch_s'] / base, 2)})" for row in rows[:-1]]
                          + [s(base, 2)]) + f"; test accuracy {accs}"
    return figures


_papers_auto = against_last(PAPERS_AUTO)


PAPERS_HOSTS = [(f"train_papers100M-like_variants-{tree}_h100_fp8_{u}.json",
                 f"train_papers100M-like_variants-{tree}_h100_fp8_{g}.json")
                for tree, u, g in (("77b998c", "aw4", "agr"), ("2fdeff5", "w4", "gr"), ("77b998c", "bw4", "bgr"),
                                     ("ee5bf6f", "w4", "gr"))]


PAPERS_HALF = [f"train_papers100M-like_variants-88ff828_h100_fp8_{v}.json" for v in ("w4", "i4", "gr")]

_papers_half = against_last(PAPERS_HALF)


PAPERS_INT4 = {form: [f"train_papers100M-like_variants-70b7329_h100_fp8_{v}.json" for v in names]
               for form, names in (("4-bit", ("i4", "i4b", "i4c", "i4d")), ("float8", ("w4", "w4b")),
                                   ("all-in-GPU", ("gr", "grc")))}


def _papers_int4(r):
    epochs = {form: [r[n]["rows"][0]["epoch_s"] for n in names] for form, names in PAPERS_INT4.items()}
    mid = {form: statistics.median(e) for form, e in epochs.items()}
    _, accs = first_rows(r, [n for names in PAPERS_INT4.values() for n in names])
    four = epochs["4-bit"]
    return (" / ".join(s(e, 2) for e in four) + f", median {s(mid['4-bit'], 2)} "
            f"({x(mid['4-bit'] / mid['all-in-GPU'], 2)}; the best {x(min(four) / mid['all-in-GPU'], 2)}) / "
            + " / ".join(s(e, 2) for e in epochs["float8"]) + " / "
            + " / ".join(s(e, 2) for e in epochs["all-in-GPU"]) + f"; test accuracy {accs}")


PAPERS_H200 = {form: [f"train_papers100M-like_variants-5ffe42a_h200_fp8_{v}.json" for v in names]
               for form, names in (("4-bit alone", ("i4x", "i4y")), ("all-in-GPU beside a test", ("gr", "grb")),
                                   ("4-bit beside a test", ("i4", "i4b")))}


def _papers_h200(r):
    epochs = {form: [r[n]["rows"][0]["epoch_s"] for n in names] for form, names in PAPERS_H200.items()}
    _, accs = first_rows(r, [n for names in PAPERS_H200.values() for n in names])
    best, base = min(epochs["4-bit alone"]), min(epochs["all-in-GPU beside a test"])
    return (" / ".join(s(e, 2) for e in epochs["4-bit alone"]) + f" (the faster {x(best / base, 2)}) / "
            + " / ".join(s(e, 2) for e in epochs["all-in-GPU beside a test"] + epochs["4-bit beside a test"])
            + f"; test accuracy {accs}")


def _papers_hosts(r):
    pairs = [(r[u]["rows"][0], r[g]["rows"][0]) for u, g in PAPERS_HOSTS]
    accs = " / ".join(f"{row['test_acc']:.4f}" for pair in pairs for row in pair)
    return ("; ".join(f"{s(u['epoch_s'], 2)} / {s(g['epoch_s'], 2)} ({x(u['epoch_s'] / g['epoch_s'], 2)})"
                      for u, g in pairs) + f"; test accuracy {accs}")


def _papers_host(r):
    row = r[PAPERS_HOST]["rows"][0]
    return f"{s(row['epoch_s'], 1)}; test accuracy {row['test_acc']:.4f}"


# (what was measured, the records, their figure(s) as the README writes them), on today's presets
ROWS = [
    ("papers100M-like as OGB's (3.23 billion CSR entries; 28.4 GB of float16 features in host "
     "memory), the step replayed as a CUDA graph in TF32, three sampling threads: unified with half "
     "of the table (13,500 MiB, 49.8%) cached on the GPU and 12 CPU threads gathering a share of the misses / "
     "all-in-GPU (unified against all-in-GPU)",
     list(PAPERS_GRAPHED.values()),
     _papers_graphed),
    ("papers100M-like, the step graphed in bfloat16 as one matmul a layer with ReLU and dropout in one "
     "kernel, two sets of graphed buffers, two sampling threads: unified with half of the table cached "
     "and 12 CPU threads / all-in-GPU (unified against it) / all-in-GPU with the training stream at "
     "high priority (`--step-priority high`)",
     list(PAPERS_BF16.values()),
     _papers_bf16),
    ("products-like as OGB's (123.7 million CSR entries), median of three runs each in one call, "
     "eager step, float16 features, 384 MiB GPU cache (82% of the rows): unified / all-in-GPU "
     "(unified against it) / CPU-centric",
     [PRODUCTS_OGB],
     _products_ogb),
    ("products-like, each pipeline in its plain form (float32 features, no GPU cache, eager float32 step; "
     "the CSR in host memory but for all-in-GPU's), PyG's `NeighborLoader` with 16 workers as a PyG user "
     "writes it: unified / CPU-centric / PyG `NeighborLoader` / all-in-GPU",
     [PRODUCTS_PLAIN],
     _products_plain),
    ("float16 / float8 (e4m3, a scale per row) feature tables, unified, the same GPU cache in bytes "
     "(float8: twice the rows; papers100M-like: 13,500 MiB, 50% / 97% of the rows, no CPU threads; "
     "products-like: 192 MiB, 41% / 79% of the rows)",
     [n for pair in FP8.values() for n in pair],
     _fp8),
    ("papers100M-like in its plain form on one **H100**: the CSR in host memory (the sampler reads it "
     "over PCIe), float16 features, no GPU cache, eager float32 step, PyG's layers",
     [PAPERS_HOST],
     _papers_host),
    ("papers100M-like on one **H100**, the bfloat16 graphed step, two sets of buffers, two sampling "
     "threads, the rows in `--reorder frequency` order, half of the table's bytes cached (float16: "
     "13,500 MiB, 49.8% of the rows; float8: 6,990 MiB, 50.0%, and every row's scale beside it: 53% of the "
     "table's bytes on the GPU), 12 CPU threads: unified float16 / "
     "unified float8 / all-in-GPU",
     list(PAPERS_H100.values()),
     _papers_h100),
    ("papers100M-like on one **H100**, unified float8 as in the row above (6,990 MiB cached), each "
     "variant in a call of its own on one machine (each reordering the rows anew): one gathering thread with 12 CPU threads / two "
     "gathering threads (`--gather-workers 2`), 6 CPU threads each / the one-pass cached gather on 66 "
     "SMs (`--gather-sms 66`, one block a row), no CPU threads",
     PAPERS_VARIANTS + [PAPERS_H100["gpu_resident"]],
     _papers_variants),
    ("papers100M-like on one **H100**, unified float8 as in the row above with two gathering threads of 6 CPU "
     "threads each, in one call over one relabelled copy: the CPU threads' share of the misses from the measured "
     "rates / every miss through the CPU threads (`--gather-cpu-share 1`; against all-in-GPU) / all-in-GPU "
     "(float8); the share-1 run again in a second call on the same machine",
     PAPERS_SHARE,
     _papers_share),
    ("papers100M-like on another **H100** machine, whose host CPU is slower (the data set generated in 163 s "
     "against 111 s), unified float8 as in the row above with every miss through the CPU threads, in calls over "
     "one relabelled copy: two gathering threads of 3 / 6 (two calls) / 8 CPU threads each (against all-in-GPU) / "
     "one gathering thread of 12 / all-in-GPU (float8)",
     PAPERS_THREADS,
     _papers_threads),
    ("papers100M-like on a third **H100** machine, whose host is as fast as the first (generated in 114 s), "
     "unified float8 as above with every miss through three gathering threads of 5 CPU threads each and the "
     "stores' own indices' bounds passed to the gather, in one call over one relabelled copy: the captured "
     "step's capacities 3% above the largest warm-up batch (`--cuda-graph-margin 0.03`; against all-in-GPU "
     "at 0.03) / 10% above / all-in-GPU (float8) at 10% / at 3%",
     PAPERS_MARGIN,
     _papers_margin),
    ("papers100M-like on a fourth **H100** machine, as fast (generated in 113 s), unified float8 as above with "
     "every miss through the CPU threads and the captured step's margin fitted to the warm-up batches' spread "
     "(the default, `--cuda-graph-margin auto`: 2-3% here), in one call over one relabelled copy: four gathering "
     "threads of 4 CPU threads each / three of 5 (each against all-in-GPU) / all-in-GPU (float8)",
     PAPERS_AUTO,
     _papers_auto),
    ("papers100M-like on four more **H100** machines, each one call: unified float8 as above with four "
     "gathering threads of 4 CPU threads each, against all-in-GPU (float8) in the same call, on the host "
     "whose CPU gathered the misses fastest (generated in 111 s) / slower ones (137 s, 152 s) / the slowest "
     "(219 s), the unified run first in its call on the last three: the unified epoch follows the host's "
     "random reads of the misses",
     [n for pair in PAPERS_HOSTS for n in pair],
     _papers_hosts),
    ("papers100M-like on another **H100** machine (generated in 133 s), held to half of the table's bytes on "
     "the GPU, the row scales counted (`device_share` 0.49995 in each record), four gathering threads of 4 CPU "
     "threads each, one call over one relabelled copy: unified float8 with a 6,566 MiB cache (47% of the rows) / "
     "unified 4-bit (`--feature-dtype int4`, a 3,177 MiB cache of packed rows, 47%) / all-in-GPU (float8), "
     "each unified run against all-in-GPU",
     PAPERS_HALF,
     _papers_half),
    ("papers100M-like on another **H100** machine (generated in 178 s), held to half of the table's bytes as "
     "in the row above, four calls on the machine kept warm, each 4-bit batch unpacked in place (the hits from "
     "the cache, the misses from their rows): unified 4-bit in four runs, with their median and best against "
     "all-in-GPU's median / unified float8 in two runs / all-in-GPU (float8) in two runs",
     [n for names in PAPERS_INT4.values() for n in names],
     _papers_int4),
    ("papers100M-like on one H200 (generated in 219 s), held to half of the table's bytes (`--cache-share "
     "0.5`), four gathering threads of 4 CPU threads each, each 4-bit batch unpacked in place: unified 4-bit "
     "alone on the machine under `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, two runs (the faster "
     "against all-in-GPU's faster) / all-in-GPU (float8) in two runs and unified 4-bit in two, in an earlier "
     "call on the machine with a GPU test running beside them (upper bounds)",
     [n for names in PAPERS_H200.values() for n in names],
     _papers_h200),
]

# Measured on the presets of generator version 1 (half of OGB's edges, labels every pipeline
# learned to 0.99): a table of their own, below the first, until they are measured again.
ROWS_V1 = [
    ("papers100M-like on four H200, one scaling run: epoch on 1 / 2 / 4 GPUs (against 1)",
     [SCALING],
     _scaling),
    ("the same run on four GPUs with each rank's CSR on its GPU (against its 1-GPU run)",
     [SCALING_GPU],
     lambda r: f"{s(epoch(r[SCALING_GPU], 4), 1)} ({x(epoch(r[SCALING_GPU], 4) / epoch(r[SCALING_GPU], 1), 2)})"),
]


def load(results: Path, names) -> dict:
    out = {}
    for name in names:
        path = results / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a record the README's figures table needs is missing")
        out[name] = json.loads(path.read_text())
    return out


def commit_of(rec: dict) -> str:
    prov = rec.get("provenance") or {}
    commit = prov.get("commit")
    if not commit:
        return "commit unknown"
    # a run of a checkout with changes not yet committed: its record names the commit they are on
    return f"{commit[:7]} with changes" if prov.get("dirty") else commit[:7]


V1_HEADING = ("On the presets of generator version 1, with half of OGB's edges and labels every "
              "pipeline learned to 0.99 (not comparable with the figures above; to be measured again "
              "on today's presets; their cache, locality-lever and all-in-GPU figures, which the table "
              "above measures again, are in `docs/pipeline-measurements.md`):")


def table(results: Path) -> list[str]:
    """The tables' lines, from the records in ``results``: today's presets, then generator
    version 1's under a line that says so."""
    lines = []
    for rows in (ROWS, ROWS_V1):
        if lines:
            lines += ["", V1_HEADING, ""]
        lines += ["| measured (GraphSAGE; H200 unless the row names another GPU) | figure | record (commit) |", "|---|---|---|"]
        for what, names, figure in rows:
            recs = load(results, names)
            cited = ", ".join(f"`results/{n}` ({commit_of(recs[n])})" for n in names)
            lines.append(f"| {what} | {figure(recs)} | {cited} |")
    return lines


def split(text: str, path: Path):
    """README text as (before, table lines, after) around the markers."""
    lines = text.split("\n")
    try:
        b, e = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise ValueError(f"{path}: no {BEGIN} / {END} lines") from None
    if e < b:
        raise ValueError(f"{path}: {END} comes before {BEGIN}")
    return lines[: b + 1], lines[b + 1: e], lines[e:]


def first_difference(have: list[str], want: list[str]) -> str:
    for i, (h, w) in enumerate(zip(have, want)):
        if h != w:
            hc, wc = [c.strip() for c in h.split("|")], [c.strip() for c in w.split("|")]
            if len(hc) == len(wc):
                for a, b in zip(hc, wc):
                    if a != b:
                        return f"table line {i + 1}: README has {a!r}, the records give {b!r}"
            return f"table line {i + 1}: README has {h!r}, the records give {w!r}"
    return f"the README's table has {len(have)} lines, the records give {len(want)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/readme_figures.py", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 with a one-line summary when the README's table differs")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the README (default: %(default)s)")
    ap.add_argument("--results", type=Path, default=ROOT / "results",
                    help="the folder of records (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        text = args.readme.read_text()
        before, have, after = split(text, args.readme)
        want = table(args.results)
    except (OSError, ValueError, KeyError) as e:
        print(f"readme_figures: error: {e}", file=sys.stderr)
        return 2
    if have == want:
        if not args.check:
            print(f"{args.readme}: figures table already as the records give it")
        return 0
    if args.check:
        print(f"readme_figures: {args.readme} differs from {args.results}: {first_difference(have, want)} "
              f"(python tools/readme_figures.py rewrites it)")
        return 1
    tmp = args.readme.with_name(args.readme.name + ".tmp")
    try:
        tmp.write_text("\n".join(before + want + after))
        os.replace(tmp, args.readme)  # never a half-written README
    finally:
        if tmp.exists():
            tmp.unlink()
    print(f"{args.readme}: figures table rewritten from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
