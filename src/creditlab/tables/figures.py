"""Draw a paper's figures as PNG files: training curves, replacement curves, bars, scatter, token credit, token
histograms."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

from creditlab.tables.load import curve, read_jsonl
from creditlab.tables.stats import ema

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

log = logging.getLogger(__name__)

DEFAULT_KEYS = ("reward_mean", "response_len_mean", "entropy_mean")
DPI = 120


def _warn(message: str) -> None:
    """Warn through both `warnings` (visible in tests) and logging (visible in job logs)."""
    warnings.warn(message, stacklevel=3)
    log.warning(message)


def plot_training_curves(
    series: Mapping[str, Path],
    out_png: Path,
    keys: Sequence[str] = DEFAULT_KEYS,
    title: str | None = None,
    smoothing: float = 0.6,
) -> Path:
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
                _warn(f"{series[label]}: no {key!r} values with a step; {label!r} left out of that plot")
                continue
            color = f"C{i % 10}" if len(runs) <= 10 else plt.cm.tab20(i % 20)
            if smoothing > 0:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1.0)
            ax.plot(steps, ema(values, smoothing), color=color, linewidth=1.6, label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    # one legend for the figure, right of the plots (per-axis legends hide the curves when runs are many)
    handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
    if handles:
        fig.legend(list(handles.values()), list(handles), fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=DPI, format="png", bbox_inches="tight")
    plt.close(fig)
    return out_png


def plot_replacement_curves(df, paper, figure, out_png: Path) -> Path:
    """Accuracy vs replacement rate: column ``figure.y`` against ``figure.x`` of ``figure.table``.

    ``df`` is the table's long frame (tables.build.build_table). Rows with a decoding are grouped into
    one line per criterion (sorted by x); rows without one (base model, RL model) are horizontal
    reference lines. Error bars are the cells' 95% bootstrap CIs.
    """
    table = paper.table(figure.table)
    cell = {
        (r, c): (m, lo, hi)
        for r, c, m, lo, hi in df[["row", "column", "ours_mean", "ours_lo", "ours_hi"]].itertuples(index=False)
    }
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    lines: dict[str, list[tuple]] = {}
    for row in table.rows:
        if row.decode is None:
            y, lo, hi = cell[(row.label, figure.y)]
            is_base = row.run == "base"
            ax.axhline(y, ls="--", lw=1, color="grey" if is_base else "black")
            ax.annotate(
                row.label,
                (0.01 if is_base else 0.99, y),
                xycoords=("axes fraction", "data"),
                ha="left" if is_base else "right",
                va="bottom",
                fontsize=8,
            )
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


def _y_label(column: str, unit: str) -> str:
    """Axis label of a table column from its long-frame unit."""
    if unit == "s":
        return f"{column} (s per RL step)"
    if unit == "steps":
        return f"{column} (RL steps to the threshold)"
    if unit.startswith("x vs"):
        return f"{column} (ratio {unit.removeprefix('x ')})"
    if unit.startswith("% vs"):
        return f"{column} ({unit})"
    return f"{column} (%)"


def plot_bars(df, paper, figure, out_png: Path) -> Path:
    """One bar per row of ``figure.table`` for column ``figure.y``, with the cells' 95% CIs as error bars.

    ``df`` is the table's long frame (tables.build.build_table, or its CSV). Bars are labelled by row
    (and paper backbone when the table has several) and coloured by backbone; a row without a value
    (e.g. the base model in a step_time column) is left out with a warning. At scale ``paper`` the
    paper's number is drawn as a black tick on its bar; at other scales it is not (not comparable).
    A steps_to cell with censored seeds is hatched and its value annotated with the bound it is (``>``: a
    lower bound, ``<``: an upper one, ``?``: none; see tables.render._ours_cell).
    """
    import pandas as pd

    table = paper.table(figure.table)
    sub = df[df["column"] == figure.y]
    if sub.empty:
        raise ValueError(
            f"figure {figure.name!r}: column {figure.y!r} is not in the table frame of "
            f"{figure.table!r} (omitted at this scale?); columns: {sorted(set(df['column']))}"
        )
    backbones = list(dict.fromkeys(r.backbone for r in table.rows))
    several = len(backbones) > 1
    unit = str(sub["unit"].iloc[0]) if "unit" in sub else "%"
    scale = str(sub["scale"].iloc[0]) if "scale" in sub else ""
    bars = []
    for row in table.rows:
        cell = sub[sub["row"] == row.label]
        if several and "paper_backbone" in cell:
            cell = cell[cell["paper_backbone"] == row.backbone]
        if cell.empty or pd.isna(cell["ours_mean"].iloc[0]):
            _warn(f"figure {figure.name!r}: row {row.label!r} ({row.backbone}) has no {figure.y!r} value; no bar")
            continue
        line = cell.iloc[0]
        label = f"{row.label}\n{row.backbone}" if several else row.label
        paper_value = line["paper"] if "paper" in cell else float("nan")
        own, ref = (int(line[c]) if c in cell and not pd.isna(line[c]) else 0 for c in ("censored", "ref_censored"))
        bound = "?" if own and ref else ">" if own else "<" if ref else ""
        if str(line.get("detail", "")).startswith("reference"):
            bound = ""  # the reference rows of a relative column: 1x / 0% by definition
        bars.append(
            (
                label,
                row.backbone,
                float(line["ours_mean"]),
                float(line["ours_lo"]),
                float(line["ours_hi"]),
                float(paper_value),
                bound,
            )
        )
    if not bars:
        raise ValueError(f"figure {figure.name!r}: no row of table {figure.table!r} has a {figure.y!r} value")
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(bars) + 1.5), 4.2))
    xs = np.arange(len(bars))
    means = np.array([b[2] for b in bars])
    lo = np.array([b[3] for b in bars])
    hi = np.array([b[4] for b in bars])
    err = np.nan_to_num(np.vstack([means - lo, hi - means]), nan=0.0).clip(min=0.0)
    colors = [f"C{backbones.index(b[1]) % 10}" for b in bars]
    for patch, b in zip(ax.bar(xs, means, yerr=err, capsize=4, color=colors, alpha=0.85), bars):
        if b[6]:
            patch.set_hatch("//")
    for x, m, h, b in zip(xs, means, np.where(np.isnan(hi), means, hi), bars):
        ax.annotate(
            f"{b[6]}{m:.2f}",
            (x, max(m, h)),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )
    if scale == "paper":
        paper_pts = [(x, b[5]) for x, b in zip(xs, bars) if math.isfinite(b[5])]
        if paper_pts:
            ax.scatter(*zip(*paper_pts), marker="_", s=400, color="black", zorder=3, label="paper")
            ax.legend(fontsize=8)
    if unit.startswith("% vs"):
        ax.axhline(0.0, color="black", lw=0.8)
    elif unit.startswith("x vs"):
        ax.axhline(1.0, color="black", lw=0.8)
    if any(b[6] for b in bars):
        ax.text(
            0.01,
            0.99,
            "hatched: censored seeds (> lower bound, < upper bound, ? none)",
            transform=ax.transAxes,
            ha="left",
            va="top",
            fontsize=7,
        )
    crowded = len(bars) > 4
    ax.set_xticks(
        xs, [b[0] for b in bars], rotation=30 if crowded else 0, ha="right" if crowded else "center", fontsize=8
    )
    ax.set_ylabel(_y_label(figure.y, unit))
    ax.grid(axis="y", alpha=0.3)
    title = f"{paper.title.split(':')[0]}: {figure.name}"
    if scale and scale != "paper":
        title += f"\n(scale {scale}: tiny models, not the paper's numbers)"
    ax.set_title(title, fontsize=10)
    return save_figure(fig, out_png)


def plot_scatter(df, paper, figure, out_png: Path) -> Path:
    """One point per row of ``figure.table``: column ``figure.y`` against column ``figure.x`` (e.g. accuracy vs cost
    per step), each with its 95% CIs as error bars in both directions, labelled by row; coloured by the row's verdict
    when the table has a versus column (claims: beats / worse than / noise / reference). Rows without a value in either
    column (the base model's cost) are left out with a warning."""
    import pandas as pd

    table = paper.table(figure.table)
    cells = {
        (r, b, c): line
        for r, b, c, line in zip(df["row"], df["paper_backbone"], df["column"], df.itertuples(index=False))
    }
    versus = [c.name for c in table.columns if c.is_comparison and c.name in set(df["column"])]
    scale = str(df["scale"].iloc[0]) if len(df) else ""
    colors = {"beats": "C2", "worse": "C3", "noise": "C7", "reference": "black"}
    pts = []
    for row in table.rows:
        x, y = cells.get((row.label, row.backbone, figure.x)), cells.get((row.label, row.backbone, figure.y))
        if x is None or y is None or pd.isna(x.ours_mean) or pd.isna(y.ours_mean):
            _warn(
                f"figure {figure.name!r}: row {row.label!r} ({row.backbone}) has no {figure.x!r} / {figure.y!r} "
                f"value; no point"
            )
            continue
        verdict = str(getattr(cells.get((row.label, row.backbone, versus[0])), "verdict", "")) if versus else ""
        pts.append((row.label, x, y, next((v for k, v in colors.items() if verdict.startswith(k)), "C0")))
    if not pts:
        raise ValueError(
            f"figure {figure.name!r}: no row of table {figure.table!r} has both {figure.x!r} and {figure.y!r}"
        )
    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    for label, x, y, color in pts:
        xerr = np.nan_to_num([[x.ours_mean - x.ours_lo], [x.ours_hi - x.ours_mean]], nan=0.0).clip(min=0.0)
        yerr = np.nan_to_num([[y.ours_mean - y.ours_lo], [y.ours_hi - y.ours_mean]], nan=0.0).clip(min=0.0)
        ax.errorbar(
            [x.ours_mean],
            [y.ours_mean],
            xerr=xerr,
            yerr=yerr,
            fmt="o",
            color=color,
            capsize=2,
            ms=5,
            elinewidth=0.8,
            alpha=0.8,
        )
        ax.annotate(label, (x.ours_mean, y.ours_mean), xytext=(4, 3), textcoords="offset points", fontsize=7)
    if versus:
        from matplotlib.lines import Line2D

        ax.legend(
            handles=[Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in colors.items()],
            title=f"{versus[0]}",
            fontsize=7,
            title_fontsize=7,
            loc="best",
        )
    unit_x = str(pts[0][1].unit)
    if unit_x.startswith("x vs") or unit_x.startswith("% vs"):  # the reference's cost
        ax.axvline(1.0 if unit_x.startswith("x vs") else 0.0, color="black", lw=0.8, ls=":")
    ax.set_xlabel(_y_label(figure.x, unit_x))
    ax.set_ylabel(_y_label(figure.y, str(pts[0][2].unit)))
    ax.grid(alpha=0.3)
    title = f"{paper.title.split(':')[0]}: {figure.name}"
    if scale and scale != "paper":
        title += f"\n(scale {scale}: tiny models, not the paper's numbers)"
    ax.set_title(title, fontsize=10)
    return save_figure(fig, out_png)


def plot_token_credit(
    ranking, out_png: Path, title: str, weight: str = "credit", reference: float | None = None
) -> Path:
    """Two horizontal bar panels: the token strings with the highest and the lowest mean weight.

    ``ranking`` is tables.token_credit.rank_tokens' frame (side, rank, shown, count, mean). Tokens are
    shown with visible whitespace; each bar is annotated with its count; ``reference`` (the mean over
    all tokens) is drawn as a dashed line.
    """
    panels = [("top", "highest mean weight"), ("bottom", "lowest mean weight")]
    n = max(1, int(ranking.groupby("side").size().max()) if len(ranking) else 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, max(2.5, 0.32 * n + 1.4)), sharex=True)
    values = ranking["mean"].to_numpy(dtype=float)
    if reference is not None and math.isfinite(reference):
        values = np.append(values, reference)
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = 0.15 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1.0)
    for ax, (side, label) in zip(axes, panels):
        part = ranking[ranking["side"] == side]
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f"mean {weight} weight")
        ax.grid(axis="x", alpha=0.3)
        if reference is not None and math.isfinite(reference):
            ax.axvline(reference, ls="--", lw=1, color="grey")
        if part.empty:
            ax.text(
                0.5,
                0.5,
                "no token with enough occurrences",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=9,
            )
            ax.set_yticks([])
            continue
        ys = np.arange(len(part))
        ax.barh(ys, part["mean"], left=0.0, color="C2" if side == "top" else "C3", alpha=0.8)
        ax.set_yticks(ys, [str(s) for s in part["shown"]], fontsize=10, family="DejaVu Sans Mono")
        ax.invert_yaxis()
        for y, (m, c) in enumerate(zip(part["mean"], part["count"])):
            ax.annotate(f"n={c}", (m, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    axes[0].set_xlim(lo - pad, hi + 2 * pad)  # shared: room for the count labels
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, out_png)


def plot_token_histograms(values: Mapping[str, Mapping[str, np.ndarray]], out_png: Path, title: str) -> Path:
    """Paper A diagnostics: Δlog p, base entropy and KL(π_RL‖π_base) histograms, base vs RL outputs.

    ``values``: source ("base"/"rl") -> statistic -> per-token values (decoding.diagnostics).
    """
    panels = [
        ("dlogp", "Δlog p = log π_RL(y) − log π_base(y)", True),
        ("entropy_base", "entropy of π_base", True),
        ("kl_rl_base", "KL(π_RL ‖ π_base)", True),
    ]
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
