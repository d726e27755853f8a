"""An SVG of a training record (``python -m torch_direct train --plot run.svg``), with no
plotting library: per epoch, a stacked bar of the training step and each loader stage's
exposed time, and the train/valid accuracy curves."""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

_COLORS = {"train_step": "#4477aa", "sample": "#ee6677", "gather": "#228833", "transfer": "#ccbb44",
           "train_acc": "#4477aa", "valid_acc": "#ee6677"}


def _text(x, y, s, anchor="middle", size=11):
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">{escape(str(s))}</text>'


def record_svg(record: dict) -> str:
    """The SVG text for a record as ``train.run`` returns (and ``--json`` writes) it."""
    epochs = record.get("epochs") or []
    if not epochs:
        raise ValueError("plot: the record has no epochs")
    w, h, pad, gap = 360, 240, 44, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w + gap}" height="{h + 60}" '
             f'font-family="sans-serif">', '<rect width="100%" height="100%" fill="white"/>']
    a = record.get("args", {})
    parts.append(_text(w + gap / 2, 16, f"{a.get('dataset', '')} {a.get('model', '')} "
                                        f"{a.get('pipeline', '')} on {record.get('device', '')}", size=13))
    # Left: stacked seconds per epoch.
    keys = ["train_step", "sample", "gather", "transfer"]
    vals = [[e["train_step_s"]] + [e["exposed_s"][k] for k in keys[1:]] for e in epochs]
    top = max(sum(v) for v in vals) or 1.0
    x0, y0, pw, ph = pad, 30, w - pad - 10, h - 40
    bw = pw / len(epochs)
    for i, v in enumerate(vals):
        y = y0 + ph
        for k, s in zip(keys, v):
            bh = ph * s / top
            y -= bh
            parts.append(f'<rect x="{x0 + i * bw + bw * 0.15:.1f}" y="{y:.1f}" width="{bw * 0.7:.1f}" '
                         f'height="{bh:.1f}" fill="{_COLORS[k]}"/>')
        parts.append(_text(x0 + (i + 0.5) * bw, y0 + ph + 14, epochs[i]["epoch"], size=9))
    parts.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw}" y2="{y0 + ph}" stroke="black"/>')
    parts.append(_text(x0 - 4, y0 + 8, f"{top:.3g} s", "end", 9))
    parts.append(_text(x0 + pw / 2, y0 + ph + 30, "epoch: step + exposed loader stages (s)"))
    for j, k in enumerate(keys):
        parts.append(f'<rect x="{x0 + j * 80}" y="{h + 36}" width="10" height="10" fill="{_COLORS[k]}"/>')
        parts.append(_text(x0 + j * 80 + 14, h + 45, k.replace("_", "-"), "start", 10))
    # Right: accuracy.
    x0 = w + gap + pad
    n = len(epochs)
    for k in ("train_acc", "valid_acc"):
        pts = " ".join(f"{x0 + (pw * i / max(1, n - 1)):.1f},{y0 + ph * (1 - e[k]):.1f}"
                       for i, e in enumerate(epochs))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{_COLORS[k]}" stroke-width="2"/>')
    parts.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    parts.append(_text(x0 - 4, y0 + 8, "1.0", "end", 9))
    parts.append(_text(x0 - 4, y0 + ph, "0", "end", 9))
    parts.append(_text(x0 + pw / 2, y0 + ph + 30, "accuracy: train (blue), valid (red)"))
    if "test_acc" in record:
        parts.append(_text(x0 + pw / 2, h + 45, f"test acc {record['test_acc']:.4f}"))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_plot(record: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record_svg(record))
    return path


# -- the end-to-end benchmark (python -m torch_direct.gnn.bench train --plot) ---------------------------

_BENCH_KEYS = ("rest", "sample", "gather", "transfer")
_BENCH_COLORS = {"rest": "#4477aa", "sample": "#ee6677", "gather": "#228833", "transfer": "#ccbb44"}
_BENCH_LABELS = {"rest": "training (incl. overlapped loading)", "sample": "exposed sample",
                 "gather": "exposed gather", "transfer": "exposed transfer"}


def _bench_bars(record: dict):
    """``[(pipeline, epoch_s, {key: seconds})]`` of the rows that ran: each bar is the epoch
    time, its exposed stages stacked on the rest (training, with loading overlapped)."""
    bars = []
    for r in record.get("rows", []):
        if r.get("status") != "ok":
            continue
        ex = r.get("exposed_s") or {}
        parts = {k: max(0.0, float(ex.get(k, 0.0))) for k in _BENCH_KEYS[1:]}
        scale = min(1.0, r["epoch_s"] / sum(parts.values())) if sum(parts.values()) > 0 else 1.0
        parts = {k: v * scale for k, v in parts.items()}    # medians need not add up: never exceed the bar
        parts["rest"] = max(0.0, r["epoch_s"] - sum(parts.values()))
        bars.append((r["pipeline"], r["epoch_s"], parts))
    if not bars:
        raise ValueError("plot: no pipeline ran, nothing to draw")
    return bars


def bench_svg(record: dict) -> str:
    """The SVG text of a ``bench train`` record: a bar per pipeline of its epoch time, stacked by
    exposed loader stage; skipped pipelines are listed under the chart."""
    bars = _bench_bars(record)
    skipped = [f"{r['pipeline']}: {r.get('reason', '')}" for r in record.get("rows", []) if r.get("status") != "ok"]
    w, h, pad = max(360, 110 * len(bars) + 80), 300, 54
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 70 + 14 * len(skipped)}" '
             f'font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>']
    a = record.get("args", {})
    parts.append(_text(w / 2, 16, f"epoch time per pipeline: {a.get('dataset', '')} {a.get('model', '')} "
                                  f"on {record.get('device', '')}", size=13))
    top = max(e for _, e, _ in bars) or 1.0
    x0, y0, pw, ph = pad, 30, w - pad - 16, h - 70
    bw = pw / len(bars)
    for i, (name, epoch_s, segs) in enumerate(bars):
        y = y0 + ph
        for k in _BENCH_KEYS:
            bh = ph * segs[k] / top
            y -= bh
            parts.append(f'<rect x="{x0 + i * bw + bw * 0.2:.1f}" y="{y:.1f}" width="{bw * 0.6:.1f}" '
                         f'height="{bh:.1f}" fill="{_BENCH_COLORS[k]}"/>')
        parts.append(_text(x0 + (i + 0.5) * bw, y - 4, f"{epoch_s:.3g} s", size=10))
        parts.append(_text(x0 + (i + 0.5) * bw, y0 + ph + 14, name, size=11))
    parts.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw}" y2="{y0 + ph}" stroke="black"/>')
    parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + ph}" stroke="black"/>')
    parts.append(_text(x0 - 4, y0 + 8, f"{top:.3g} s", "end", 9))
    parts.append(_text(x0 - 4, y0 + ph, "0", "end", 9))
    ly = y0 + ph + 32
    for j, k in enumerate(_BENCH_KEYS):
        lx = x0 + (j % 2) * 220
        yy = ly + (j // 2) * 16
        parts.append(f'<rect x="{lx}" y="{yy - 9}" width="10" height="10" fill="{_BENCH_COLORS[k]}"/>')
        parts.append(_text(lx + 14, yy, _BENCH_LABELS[k], "start", 10))
    for j, s in enumerate(skipped):
        parts.append(_text(x0, ly + 36 + 14 * j, f"not run: {s}", "start", 10))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _bench_png(record: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bars = _bench_bars(record)
    fig, ax = plt.subplots(figsize=(1.6 * len(bars) + 2.5, 4))
    names = [b[0] for b in bars]
    bottom = [0.0] * len(bars)
    for k in _BENCH_KEYS:
        vals = [b[2][k] for b in bars]
        ax.bar(names, vals, bottom=bottom, color=_BENCH_COLORS[k], label=_BENCH_LABELS[k])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, (_, e, _) in enumerate(bars):
        ax.annotate(f"{e:.3g} s", (i, e), ha="center", va="bottom", fontsize=9)
    a = record.get("args", {})
    ax.set_ylabel("epoch time (s)")
    ax.set_title(f"{a.get('dataset', '')} {a.get('model', '')} on {record.get('device', '')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_bench_plot_path(path) -> None:
    """Raise ValueError for a ``--plot`` path that :func:`write_bench_plot` cannot write."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ValueError(f"--plot: give a .svg or .png path, got {str(path)!r}")
    if suffix == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("--plot: a PNG needs matplotlib (not installed); give a .svg path") from None


def write_bench_plot(record: dict, path) -> Path:
    """Write the bar chart of a ``bench train`` record as SVG (no plotting library) or PNG
    (matplotlib), by the path's suffix."""
    check_bench_plot_path(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".svg":
        path.write_text(bench_svg(record))
    else:
        _bench_png(record, path)
    return path
