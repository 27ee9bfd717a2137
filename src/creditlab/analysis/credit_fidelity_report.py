"""The outputs of the credit-fidelity analysis (:mod:`creditlab.analysis.credit_fidelity`): MLflow scalars, the
Markdown report and the PNG of an analysis result."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from creditlab.analysis.fidelity_metrics import METRICS


def metrics(result: dict[str, Any]) -> dict[str, float]:
    """Scalars for MLflow: the ceiling and every method's metrics (keys ``<metric>/<label>``)."""
    out: dict[str, float] = {}
    for k in ("split_half", "spearman_brown", "ceiling"):
        v = (result.get("ceiling") or {}).get(k)
        if v is not None:
            out[f"ceiling/{k}"] = float(v)
    for m in result["methods"] + ([result["realised"]] if result.get("realised") else []):
        for k in METRICS:
            out[f"{k}/{m['label']}"] = float(m.get(k, float("nan")))
        if "delta_spearman" in m:
            out[f"delta_spearman/{m['label']}"] = float(m["delta_spearman"])
    for name, m in result["planted"]["methods"].items():
        out[f"planted_spearman/{name}"] = float(m["spearman"])
    out["truth/se_mean"] = float(result["truth"]["se_mean"])
    out["seconds/total"] = float(result["seconds"]["total"])
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _f(x: float, nd: int = 3, signed: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:+.{nd}f}" if signed else f"{x:.{nd}f}"


def _fci(m: dict, k: str, signed: bool = False) -> str:
    lo, hi = m.get(f"{k}_ci", [float("nan")] * 2)
    if not np.isfinite(m.get(k, float("nan"))):
        return "n/a"
    return f"{_f(m[k], signed=signed)} [{_f(lo, signed=signed)}, {_f(hi, signed=signed)}]"


def _verdict(m: dict) -> str:
    lo, hi = m.get("delta_spearman_ci", [float("nan")] * 2)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "n/a"
    return "beats" if lo > 0 else "worse" if hi < 0 else "no difference"


def _by_kind_markdown(by_kind: dict[str, dict]) -> list[str]:
    """Where each credit map (and the truth) puts its mass by token kind (analysis/structure.py's kinds)."""
    from creditlab.analysis.structure import KINDS

    n = {k: v["n"] for k, v in next(iter(by_kind.values())).items()}
    lines = [
        "Credit by token kind (a rule world): share of Σ|credit| per kind, and the mean |credit| of a decisive token "
        "over that of a separator (decisive: the operator of a rule letter, the truth's credit; separator: "
        "ignorable, true advantage 0 by construction). Tokens: " + ", ".join(f"{k} {n[k]}" for k in KINDS) + ".",
        "",
        "| credit | " + " | ".join(f"{k} share" for k in KINDS) + " | mean decisive / mean separator |",
        "|---|" + "---|" * (len(KINDS) + 1),
    ]
    for label, v in by_kind.items():
        d, sep = v["decisive"]["abs_mean"], v["separator"]["abs_mean"]
        ratio = d / sep if np.isfinite(d) and np.isfinite(sep) and sep > 0 else float("nan")
        lines.append(f"| {label} | " + " | ".join(_f(v[k]["abs_share"]) for k in KINDS) + f" | {_f(ratio, 2)} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    tr, c, s = result["truth"], result.get("ceiling") or {}, result["seconds"]
    n_top = next((m["n_top"] for m in result["methods"]), 0)
    base_rate = f"{n_top} = {100 * n_top / tr['tokens']:.1f}%" if tr["tokens"] else "n/a"
    lines = [
        f"Truth: Monte Carlo token advantages A = V(prefix through t) - V(prefix before t) on **{tr['rollouts']} "
        f"rollouts** ({tr['groups']} informative prompt groups of rollout batch {result['step']}: "
        f"{result['batch']['rollouts']} rollouts, mean reward {result['batch']['reward_mean']:.3f}), "
        f"**{tr['tokens']} tokens**, **K = {result['K']}** coupled continuations per prefix "
        f"({tr['deviations']} of {tr['pairs']} (token, continuation) pairs resampled another token and were decoded: "
        f"{tr['decoded_tokens']} tokens). Per-token standard error (paired): mean {_f(tr['se_mean'])}, median "
        f"{_f(tr['se_median'])}, max {_f(tr['se_max'])}; mean over tokens with a non-zero estimate "
        f"{_f(tr['se_mean_nonzero'])}. {100 * tr['zero_frac']:.1f}% of the estimates are exactly 0 (no resample "
        f"changed the outcome); mean |A| {_f(tr['abs_adv_mean'])}; mean V(prompt) {_f(tr['value_prompt_mean'])}.",
        "",
        f"Noise ceiling (split halves of K/2 continuations): Spearman r = {_fci(c, 'split_half')}, Spearman-Brown "
        f"{_f(c.get('spearman_brown', float('nan')))}, **ceiling sqrt(2r/(1+r)) = {_fci(c, 'ceiling')}**; "
        f"half-vs-half top-decile precision {_f(c.get('split_half_precision', float('nan')))}.",
        "",
        f"Signed credit c = -dL/dlog p (the method's own advantage, credit functions, filters and loss at the rollout "
        f"policy; `moved`: after one update of the run's method). Reference pass: {result['reference']}. "
        f"95% CIs resample prompt groups ({result['n_boot']} resamples); Δ = paired difference to "
        f"**{result['baseline']}** (verdict: its 95% CI excludes 0; uncorrected for the number of methods). Top "
        f"decile: |x| at or above its 90th percentile and > 0 ({base_rate} of the tokens for the truth: a random "
        f"pick's precision); near-zero truth: |A| < {result['null_eps']} ({100 * tr['null_frac']:.1f}% of tokens).",
        "",
        "ρ_w: Spearman weighted by each token's uncertainty 1 - p (`fidelity_metrics`); mean 1 - p "
        f"{_f(result.get('uncertain', {}).get('mean_1_minus_p', float('nan')))}, tokens with p < 0.9: "
        f"{100 * result.get('uncertain', {}).get('share_p_below_0.9', float('nan')):.1f}%. Realised credit: the "
        "change of each token's log-probability after one update of the run's own method on this batch.",
        "",
        "| method | Spearman ρ | ρ_w (1 - p) | Δρ vs uniform | verdict | precision@top10% | recall@top10% | "
        "credit share on ~0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows_md = list(result["methods"]) + ([result["realised"]] if result.get("realised") else [])
    for m in rows_md:
        verdict = "baseline" if m["label"] == result["baseline"] else _verdict(m)
        lines.append(
            f"| {m['label']} | {_fci(m, 'spearman')} | {_fci(m, 'spearman_w')} | "
            f"{_fci(m, 'delta_spearman', signed=True)} | {verdict} | {_fci(m, 'precision')} | "
            f"{_fci(m, 'recall')} | {_fci(m, 'null_share')} |"
        )
    if result.get("by_kind"):
        lines += ["", *_by_kind_markdown(result["by_kind"])]
    p = result["planted"]
    pc = p.get("ceiling") or {}
    lines += [
        "",
        f"Planted check ({p['rollouts']} rollouts cut at their highest-entropy token, {p['length']} tokens, "
        f"reward = 1 iff the first token is the policy's mode there, mean p(mode) {_f(p['p_mark_mean'])}; same "
        f"estimator, K = {result['K']}): ceiling {_fci(pc, 'ceiling')}; max |A_hat| after the marked token "
        f"{_f(p['max_abs_after_first'])} (0 by construction); first-token error "
        f"{_f(p['first_token_error_mean'], signed=True)} "
        f"(z = {_f(p['first_token_z'], 2, signed=True)}).",
        "",
        "| planted credit | Spearman ρ | precision@top10% | credit share on ~0 |",
        "|---|---|---|---|",
    ]
    for name, m in p["methods"].items():
        lines.append(f"| {name} | {_fci(m, 'spearman')} | {_fci(m, 'precision')} | {_fci(m, 'null_share')} |")
    lines += ["", "Cost (s): " + ", ".join(f"{k} {v:.1f}" for k, v in s.items()) + "."]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = result["methods"]
    labels = [m["label"] for m in ms]
    y = np.arange(len(ms))[::-1]
    fig, axes = plt.subplots(1, 3, figsize=(14, 0.32 * len(ms) + 1.8), sharey=True)
    for ax, key, title in zip(
        axes,
        ("spearman", "precision", "null_share"),
        ("Spearman ρ(credit, true advantage)", "precision, top-decile tokens", "credit share on ~0-advantage tokens"),
    ):
        v = np.array([m[key] for m in ms], dtype=float)
        lo = np.array([m[f"{key}_ci"][0] for m in ms], dtype=float)
        hi = np.array([m[f"{key}_ci"][1] for m in ms], dtype=float)
        ok = np.isfinite(v) & np.isfinite(lo) & np.isfinite(hi)
        ax.errorbar(v[ok], y[ok], xerr=[v[ok] - lo[ok], hi[ok] - v[ok]], fmt="o", capsize=3, color="#2a9d8f")
        base = next((m for m in ms if m["label"] == result["baseline"]), None)
        if base is not None and np.isfinite(base[key]):
            ax.axvline(base[key], color="#e76f51", lw=1, ls="--", label="uniform")
        if key == "spearman":
            c = (result.get("ceiling") or {}).get("ceiling", float("nan"))
            if np.isfinite(c):
                ax.axvline(c, color="k", lw=1, label="noise ceiling")
            ax.axvline(0, color="grey", lw=0.6)
            ax.legend(loc="lower right", fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].set_yticks(y, labels, fontsize=8)
    fig.suptitle(
        f"Credit fidelity: {result['truth']['tokens']} tokens of {result['truth']['rollouts']} rollouts, "
        f"K = {result['K']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
