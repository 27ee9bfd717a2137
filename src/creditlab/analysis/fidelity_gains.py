"""Does credit fidelity predict training gains? (issue 23, part 3)

Reads what is built, trains nothing: the credit_fidelity analyses named in ``fidelity`` (their JSON) and a table of
the same paper (its CSV: the head-to-head ``main`` table), and pairs, method by method, the fidelity of a method's
token credit (``metric`` of the analysis' entry naming a run of the table, default Spearman ρ with the true token
advantage) with the table's accuracy difference of that run against its reference (``column``, a versus column: the
paired difference in percentage points vs DAPO, LoRA rows vs the LoRA baseline; the reference rows count as 0).
The test: Spearman's rank correlation across the methods with a two-sided permutation p-value (``n_perm`` seeded
permutations of the gains), and Pearson's r with scipy's p. Reported as found: a null is a result, and the gains
themselves carry the table's own uncertainty (their intervals and Holm-adjusted p are listed).

When the table or an analysis is not built, the result says so ("not built", the missing path) and has no numbers.
In the DAG the job waits for both (``workflow/rules/common.smk``: analysis_inputs); ``python -m creditlab analyze``
runs it on whatever exists.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

NEEDS_MODEL = False
"""The job reads built results: the runner loads no model (`creditlab.jobs.analyze`)."""


def permutation_spearman(x: np.ndarray, y: np.ndarray, n_perm: int, seed: int) -> tuple[float, float]:
    """(Spearman ρ(x, y), two-sided permutation p = (1 + #{|ρ(x, perm y)| >= |ρ|}) / (1 + n_perm))."""
    from creditlab.analysis.fidelity_metrics import spearman

    rho = spearman(x, y)
    if not np.isfinite(rho):
        return rho, float("nan")
    rng = np.random.default_rng(seed)
    hits = sum(abs(spearman(x, y[rng.permutation(y.size)])) >= abs(rho) - 1e-12 for _ in range(n_perm))
    return rho, (1 + hits) / (1 + n_perm)


def analyze(
    ctx,
    *,
    fidelity: list = ["credit_fidelity"],
    table: str = "main",
    column: str = "Claim vs DAPO",
    metric: str = "spearman",
    n_perm: int = 10000,
) -> dict[str, Any]:
    """The fidelity of each method (``metric`` of each analysis in ``fidelity``) against its accuracy difference in
    ``column`` of ``table`` (see the module docstring)."""
    import pandas as pd
    from scipy.stats import pearsonr

    from creditlab import paths

    fill = dict(results=ctx.results, scale=ctx.scale, paper=ctx.paper)
    csv = paths.fmt(paths.TABLE_CSV, table=table, **fill)
    out: dict[str, Any] = {
        "kind": "fidelity_gains",
        "table": f"{ctx.paper}/{table}",
        "column": column,
        "metric": metric,
        "n_perm": n_perm,
        "table_csv": str(csv),
        "studies": [],
    }
    if not csv.is_file():
        out["status"] = (
            f"not built: the table {ctx.paper}/{table} has no results at {csv} (build it, e.g. "
            f"`snakemake --cores 2 --config papers=[{ctx.paper}]`): no gain to compare with"
        )
        return out
    df = pd.read_csv(csv)
    sub = df[df["column"] == column]
    if sub.empty:
        out["status"] = f"not built: {csv} has no column {column!r} (columns: {sorted(df['column'].unique())})"
        return out
    gains: dict[str, dict[str, Any]] = {}
    for r in sub.itertuples(index=False):
        ref = str(getattr(r, "verdict", "")) == "reference"
        mean = 0.0 if ref else float(r.ours_mean)
        if math.isfinite(mean):
            gains[str(r.run)] = {
                "row": str(r.row),
                "gain": mean,
                "gain_lo": 0.0 if ref else float(r.ours_lo),
                "gain_hi": 0.0 if ref else float(r.ours_hi),
                "reference": ref,
                "p_adj": float(getattr(r, "p_adj", float("nan"))),
                "unit": str(r.unit),
            }
    out["status"] = "built"
    for k, name in enumerate(fidelity):
        js = paths.fmt(paths.ANALYSIS_JSON, analysis=name, **fill)
        study: dict[str, Any] = {"fidelity": name, "json": str(js)}
        if not js.is_file():
            out["studies"].append(study | {"status": f"not built: {js} does not exist"})
            continue
        res = json.loads(js.read_text())
        pts = []
        for m in res["methods"]:
            if m.get("kind") != "run" or m["name"] not in gains or m.get("policy", "rollout") != "rollout":
                continue
            x = m.get(metric)
            if x is None or not math.isfinite(float(x)):
                continue
            pts.append(
                {
                    "label": m["label"],
                    "run": m["name"],
                    "fidelity": float(x),
                    "fidelity_ci": m.get(f"{metric}_ci"),
                    **gains[m["name"]],
                }
            )
        study |= {"start": (res.get("provenance") or {}).get("start"), "points": pts, "n": len(pts)}
        if len(pts) < 3:
            study["status"] = f"too few methods with both a fidelity and a gain ({len(pts)} < 3): no test"
        else:
            x = np.array([p["fidelity"] for p in pts])
            y = np.array([p["gain"] for p in pts])
            rho, p_rho = permutation_spearman(x, y, n_perm, seed=k)
            r, p_r = pearsonr(x, y) if np.ptp(x) > 0 and np.ptp(y) > 0 else (float("nan"), float("nan"))
            study |= {
                "status": "tested",
                "spearman": rho,
                "p_spearman": p_rho,
                "pearson": float(r),
                "p_pearson": float(p_r),
            }
        out["studies"].append(study)
    return out


def metrics(result: dict[str, Any]) -> dict[str, float]:
    out = {}
    for s in result.get("studies", []):
        for k in ("spearman", "p_spearman", "pearson", "p_pearson", "n"):
            if k in s and s[k] is not None and math.isfinite(float(s[k])):
                out[f"{k}/{s['fidelity']}"] = float(s[k])
    return out


def _f(x, nd=3, signed=False) -> str:
    if x is None or not math.isfinite(float(x)):
        return "n/a"
    return f"{x:+.{nd}f}" if signed else f"{x:.{nd}f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Fidelity (`{result['metric']}` of each method's token credit against Monte Carlo token advantages) "
        f"against the accuracy difference in column `{result['column']}` of table `{result['table']}`."
    ]
    if result["status"] != "built":
        return "\n".join(lines + ["", f"**{result['status']}**"]) + "\n"
    for s in result["studies"]:
        lines += ["", f"### {s['fidelity']}" + (f" (start: {s['start']})" if s.get("start") else "")]
        if "points" not in s:
            lines.append(f"**{s['status']}**")
            continue
        if s["status"] == "tested":
            lines.append(
                f"n = {s['n']} methods: Spearman ρ = {_f(s['spearman'], signed=True)} (permutation p = "
                f"{_f(s['p_spearman'])}, {result['n_perm']} permutations); Pearson r = "
                f"{_f(s['pearson'], signed=True)} (p = {_f(s['p_pearson'])})."
            )
        else:
            lines.append(f"**{s['status']}**")
        lines += [
            "",
            "| method | run | fidelity | accuracy difference (table interval) | p_adj |",
            "|---|---|---|---|---|",
        ]
        for p in s["points"]:
            ci = p.get("fidelity_ci") or [float("nan")] * 2
            lines.append(
                f"| {p['label']} | {p['run']} | {_f(p['fidelity'])} [{_f(ci[0])}, {_f(ci[1])}] | "
                + (
                    "reference (0)"
                    if p["reference"]
                    else f"{_f(p['gain'], 2, True)} [{_f(p['gain_lo'], 2, True)}, {_f(p['gain_hi'], 2, True)}] "
                    f"{p['unit']}"
                )
                + f" | {_f(p['p_adj'])} |"
            )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = [s for s in result.get("studies", []) if s.get("points")]
    fig, axes = plt.subplots(1, max(1, len(studies)), figsize=(5.5 * max(1, len(studies)), 4.2), squeeze=False)
    if not studies:
        axes[0][0].text(
            0.5,
            0.5,
            result.get("status", "not built") if result.get("status") != "built" else "no study has points",
            ha="center",
            va="center",
            wrap=True,
            fontsize=9,
        )
        axes[0][0].set_axis_off()
    for ax, s in zip(axes[0], studies):
        for p in s["points"]:
            ci = p.get("fidelity_ci") or [p["fidelity"]] * 2
            ax.errorbar(
                p["fidelity"],
                p["gain"],
                xerr=[[p["fidelity"] - ci[0]], [ci[1] - p["fidelity"]]],
                yerr=[[p["gain"] - p["gain_lo"]], [p["gain_hi"] - p["gain"]]],
                fmt="o",
                capsize=3,
                color="#264653",
            )
            ax.annotate(p["label"], (p["fidelity"], p["gain"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.6)
        title = s["fidelity"]
        if s.get("status") == "tested":
            title += f": ρ = {s['spearman']:+.2f} (p = {s['p_spearman']:.2f}), n = {s['n']}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"credit fidelity ({result['metric']})")
        ax.set_ylabel(f"{result['column']} ({s['points'][0]['unit']})")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
