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
