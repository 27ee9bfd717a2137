"""Figures: training curves of several runs from their metrics.jsonl files."""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

log = logging.getLogger(__name__)

DEFAULT_KEYS = ("reward_mean", "response_len_mean", "entropy_mean")
DPI = 120


def _warn(message: str) -> None:
    """Warn through both `warnings` (visible in tests) and logging (visible in job logs)."""
    warnings.warn(message, stacklevel=3)
    log.warning(message)


def read_jsonl(path: Path) -> list[dict]:
    """Read a metrics.jsonl; a non-JSON line (cut by a killed job) is skipped with a warning."""
    records = []
    with Path(path).open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                _warn(f"{path}:{lineno}: not valid JSON, line skipped")
    return records


def curve(records: Sequence[Mapping], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` by step; a step logged twice (resumed run) keeps its last value."""
    by_step: dict[int, float] = {}
    for rec in records:
        value = rec.get(key)
        if "step" in rec and isinstance(value, (int, float)) and math.isfinite(value):
            by_step[int(rec["step"])] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def ema(values: Sequence[float], smoothing: float) -> list[float]:
    """Exponential moving average, debiased as in TensorBoard (smoothing 0 = the raw values)."""
    out, acc = [], 0.0
    for i, value in enumerate(values, start=1):
        acc = smoothing * acc + (1.0 - smoothing) * value
        out.append(acc / (1.0 - smoothing**i) if smoothing > 0 else value)
    return out


def plot_training_curves(series: Mapping[str, Path], out_png: Path,
                         keys: Sequence[str] = DEFAULT_KEYS, title: str | None = None,
                         smoothing: float = 0.6) -> Path:
    """Plot one subplot per metric key, one line per run, against the training step.

    `series` maps a legend label to a run's metrics.jsonl (one JSON object per step with a
    "step" field). A run lacking a key is left out of that subplot with a warning. With
    `smoothing` > 0 the raw curve is drawn faint and its EMA on top. Returns `out_png`.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    runs = {label: read_jsonl(Path(path)) for label, path in series.items()}
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for i, (label, records) in enumerate(runs.items()):
            steps, values = curve(records, key)
            if not steps:
                _warn(f"{series[label]}: no {key!r} values with a step; "
                      f"{label!r} left out of that plot")
                continue
            color = f"C{i % 10}"
            if smoothing > 0:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1.0)
            ax.plot(steps, ema(values, smoothing), color=color, linewidth=1.6, label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=DPI, format="png")
    plt.close(fig)
    return out_png


def plot_replacement_curves(df, paper, figure, out_png: Path) -> Path:
    """Accuracy vs replacement rate: column ``figure.y`` against ``figure.x`` of ``figure.table``.

    ``df`` is the table's long frame (tables.build.build_table). Rows with a decoding are grouped into
    one line per criterion (sorted by x); rows without one (base model, RL model) are horizontal
    reference lines. Error bars are the cells' 95% bootstrap CIs.
    """
    table = paper.table(figure.table)
    cell = {(r, c): (m, lo, hi) for r, c, m, lo, hi in
            df[["row", "column", "ours_mean", "ours_lo", "ours_hi"]].itertuples(index=False)}
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    lines: dict[str, list[tuple]] = {}
    for row in table.rows:
        if row.decode is None:
            y, lo, hi = cell[(row.label, figure.y)]
            is_base = row.run == "base"
            ax.axhline(y, ls="--", lw=1, color="grey" if is_base else "black")
            ax.annotate(row.label, (0.01 if is_base else 0.99, y), xycoords=("axes fraction", "data"),
                        ha="left" if is_base else "right", va="bottom", fontsize=8)
            continue
        crit = paper.decodes[row.decode].criterion
        lines.setdefault(crit, []).append((cell[(row.label, figure.x)], cell[(row.label, figure.y)]))
    for crit, pts in sorted(lines.items()):
        pts.sort(key=lambda p: p[0][0])
        xs, ys = [p[0][0] for p in pts], [p[1][0] for p in pts]
        yerr = [[p[1][0] - p[1][1] for p in pts], [p[1][2] - p[1][0] for p in pts]]
        ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=3, label=crit)
    ax.set_xlabel(f"{figure.x} (% of generated tokens replaced)")
    ax.set_ylabel(f"{figure.y} (%)")
    ax.set_title(f"{paper.title.split(':')[0]}: {figure.name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="criterion", fontsize=8)
    return save_figure(fig, out_png)


def plot_token_histograms(values: Mapping[str, Mapping[str, np.ndarray]], out_png: Path, title: str) -> Path:
    """Paper A diagnostics: Δlog p, base entropy and KL(π_RL‖π_base) histograms, base vs RL outputs.

    ``values``: source ("base"/"rl") -> statistic -> per-token values (decoding.diagnostics).
    """
    panels = [("dlogp", "Δlog p = log π_RL(y) − log π_base(y)", True),
              ("entropy_base", "entropy of π_base", True), ("kl_rl_base", "KL(π_RL ‖ π_base)", True)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (key, label, logy) in zip(axes, panels):
        lo = min(np.quantile(v[key], 0.001) for v in values.values())
        hi = max(np.quantile(v[key], 0.999) for v in values.values())
        bins = np.linspace(lo, hi if hi > lo else lo + 1e-6, 60)
        for src, stats in values.items():
            ax.hist(stats[key], bins=bins, alpha=0.5, density=True, label=f"{src} outputs (n={stats[key].size})")
        ax.set_xlabel(label)
        if logy:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return save_figure(fig, out_png)


def save_figure(fig, out_png: Path, dpi: int = 120) -> Path:
    """tight_layout, write the PNG (parents created), close the figure."""
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)
    return out_png
