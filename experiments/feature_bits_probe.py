"""How few bits a feature row can keep before training notices, without a GPU: a preset's
features rounded row by row as a narrower table would store them, then GraphSAGE trained on each
copy with the same seeds and options, test accuracy beside the stored features' run.

    python experiments/feature_bits_probe.py --dataset arxiv-like --bits fp8,4,3 --out R.json \\
        -- --epochs 5

A width b rounds each row to symmetric b-bit integers with one scale a row (the row's largest
magnitude over 2^(b-1) - 1), as a b-bit table with a float scale per row would hold it; ``fp8``
is the package's float8 e4m3 table (``quantize_rows_fp8``). The rounded rows are written back in
the stored dtype, so only their values change: the probe measures accuracy, not speed. Options
after ``--`` go to ``python -m torch_direct train`` (default: the CPU, the cpu_centric pipeline).
Each copy is written beside the data set's cache folder (``--root``) for the run and removed
after it. Prints one line a form and writes a JSON record with ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import finish, run  # noqa: E402

CHUNK_ROWS = 1 << 20   # rows rounded at a time (bounded temporary memory)


def parse_widths(text: str) -> list:
    """``fp8`` and integer widths 2-8, in the order given, each once."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if item == "fp8":
            width = item
        elif item.isdigit() and 2 <= int(item) <= 8:
            width = int(item)
        else:
            raise ValueError(f"--bits: each entry must be fp8 or an integer from 2 to 8, got {item!r}")
        if width in out:
            raise ValueError(f"--bits: {item} is given twice")
        out.append(width)
    return out


def rounded(x, width):
    """``x``'s rows as a table of ``width`` holds them (see the module's doc), in ``x``'s dtype."""
    import torch
    import torch_direct
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], CHUNK_ROWS):
        rows = x[start:start + CHUNK_ROWS].float()
        if width == "fp8":
            q, scale = torch_direct.quantize_rows_fp8(rows)
            back = q.float() * scale.view(-1, 1)
        else:
            levels = 2 ** (width - 1) - 1
            scale = rows.abs().amax(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / levels
            back = (rows / scale).round_().clamp_(-levels, levels).mul_(scale)
        out[start:start + CHUNK_ROWS] = back.to(x.dtype)
    return out


def relative_error(x, y) -> float:
    """||y - x|| / ||x|| over the whole table (float64 sums, a chunk at a time)."""
    num = den = 0.0
    for start in range(0, x.shape[0], CHUNK_ROWS):
        a = x[start:start + CHUNK_ROWS].double()
        num += float((y[start:start + CHUNK_ROWS].double() - a).square().sum())
        den += float(a.square().sum())
    return (num / den) ** 0.5 if den > 0 else 0.0


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    own, common = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s [--dataset NAME] [--bits fp8,4,3] [--out JSON] -- [TRAIN_OPTIONS]")
    ap.add_argument("--dataset", default="arxiv-like", help="a preset (default: arxiv-like)")
    ap.add_argument("--bits", default="fp8,4,3", help="the forms to try, comma-separated: fp8 and integer "
                                                      "widths 2-8 (default: fp8,4,3)")
    ap.add_argument("--root", default=None, help="the data sets' cache folder (default: the package's)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    a = ap.parse_args(own)
    widths = parse_widths(a.bits)

    import torch
    from torch_direct.gnn.graph.datasets import PRESETS, NodeDataset, default_root, load_dataset
    from torch_direct.gnn.outputs import check_writable
    from torch_direct.gnn.pipeline import options
    from torch_direct.gnn.pipeline import train as training

    if a.dataset not in PRESETS:
        raise ValueError(f"--dataset: one of {', '.join(sorted(PRESETS))}, got {a.dataset!r}")
    if a.out is not None:
        check_writable(a.out, "--out")
    parser = argparse.ArgumentParser(prog="train")
    options.add_arguments(parser)
    for taken in ("--dataset", "--root", "--json"):
        if any(t == taken or t.startswith(taken + "=") for t in common):
            raise ValueError(f"give {taken} to the probe, not after --: it trains on its own copies")

    def train_args(root):
        return parser.parse_args(["--device", "cpu", "--pipeline", "cpu_centric", *common,
                                  "--dataset", a.dataset, "--root", str(root)])

    root = Path(a.root).expanduser() if a.root else default_root()
    first = train_args(root)   # the options are checked before the data set is loaded
    ds = load_dataset(a.dataset, root=root, seed=first.data_seed, mmap=False, show_progress=not first.no_progress)
    runs = [("stored", None)] + [(str(w), w) for w in widths]
    rows = []
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".feature_bits_", dir=root))
    try:
        for name, width in runs:
            if width is None:
                err, run_root = 0.0, root
            else:
                x = rounded(ds.x, width)
                err = relative_error(ds.x, x)
                run_root = work / name
                NodeDataset(ds.name, ds.graph, x, ds.y, ds.split, ds.num_classes, ds.info).save(
                    run_root / f"{a.dataset}-seed{first.data_seed}")
                del x
            print(f"feature_bits: {name}: relative error {err:.4f}: training", file=sys.stderr, flush=True)
            record = training.run(train_args(run_root))
            last = record["epochs"][-1]
            rows.append({"form": name if width is not None else f"stored ({str(ds.x.dtype).replace('torch.', '')})",
                         "relative_error": err, "test_acc": record["test_acc"], "valid_acc": last["valid_acc"],
                         "loss": last["loss"]})
            if width is not None:
                shutil.rmtree(run_root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]["test_acc"]
    for r in rows:
        r["test_acc_vs_stored"] = r["test_acc"] - base
        print(f"{r['form']:>16}  relative error {r['relative_error']:.4f}  test acc {r['test_acc']:.4f} "
              f"({100 * r['test_acc_vs_stored']:+.2f} points)  valid acc {r['valid_acc']:.4f}")
    return finish(a.out, {"probe": "feature_bits", "dataset": a.dataset, "train_options": common,
                          "threads": torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    run("feature_bits_probe", main)
