"""Fidelity metrics of a token-credit map against true token advantages, with prompt-group bootstrap CIs.

The metrics of the credit-fidelity analysis (:mod:`creditlab.analysis.credit_fidelity`, "Metrics"), on the tokens of
the truth's rollouts: Spearman(credit, truth); ``spearman_w``, the same rank correlation weighted by each token's
uncertainty w_t = 1 - pi(o_t | s_t) [ours, issue 29 item 5]: a weighted Pearson correlation of the (unweighted,
average-tie) ranks,

    rho_w = sum_t w_t (r_c,t - m_c)(r_A,t - m_A) / sqrt(sum_t w_t (r_c,t - m_c)^2 * sum_t w_t (r_A,t - m_A)^2),
    m = sum_t w_t r_t / sum_t w_t,

so that tokens the policy is sure of (p ~ 1: the bulk of a warmed-up model's tokens, where the update moves nothing
and the truth is ~0) do not decide the score; precision / recall of the top decile; the credit share on tokens of
~0 truth. Pure numpy (scipy for ranks).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, method="average")


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant or has < 2 values."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2:
        return float("nan")
    return _pearson(_ranks(x), _ranks(y))


def top_set(x: np.ndarray, frac: float) -> np.ndarray:
    """The top ``frac`` of |x|: |x| >= the (1 - frac) quantile of |x| (numpy's linear interpolation; ties at the
    threshold all in) and |x| > 0. Bool array."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    if a.size == 0:
        return np.zeros(0, dtype=bool)
    return (a >= np.quantile(a, 1.0 - frac)) & (a > 0)


def fidelity_metrics(
    credit: np.ndarray,
    truth: np.ndarray,
    *,
    top_frac: float = 0.1,
    null_eps: float = 0.05,
    weights: np.ndarray | None = None,
) -> dict[str, float]:
    """Fidelity of one credit map to the true token advantages (module docstring, "Metrics").

    credit, truth: float arrays over the same tokens. spearman: Spearman(credit, truth); precision / recall:
    P = top_set(credit), T = top_set(truth), |P & T| / |P| and |P & T| / |T| (NaN when empty); null_share: the
    share of sum |credit| on tokens with |truth| < null_eps (NaN when sum |credit| = 0); n_top, n_pred: |T|, |P|;
    spearman_w: the uncertainty-weighted rank correlation (module docstring) with ``weights`` (NaN without).
    """
    tv = _truth_view(truth, top_frac, null_eps, weights)
    return _metrics(np.asarray(credit, dtype=np.float64), tv, top_frac)


def _truth_view(
    truth: np.ndarray, top_frac: float, null_eps: float, weights: np.ndarray | None = None
) -> dict[str, Any]:
    """What every credit map's metrics need of the truth, computed once: centred ranks, top set, null mask, and
    with ``weights`` (w_t >= 0 per token) the weights and the weighted-centred ranks of the truth."""
    a = np.asarray(truth, dtype=np.float64)
    r = _ranks(a) - (a.size + 1) / 2.0 if a.size else a
    out = {
        "ranks": r,
        "norm": math.sqrt(float((r * r).sum())),
        "top": top_set(a, top_frac),
        "null": np.abs(a) < null_eps,
        "n": a.size,
        "w": None,
    }
    if weights is not None and a.size:
        w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
        if w.sum() > 0:
            rw = r - float((w * r).sum() / w.sum())
            out |= {"w": w, "ranks_w": rw, "norm_w": math.sqrt(float((w * rw * rw).sum()))}
    return out


def weighted_spearman(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """rho_w of the module docstring: Spearman(x, y) with each pair weighted by w (NaN when undefined)."""
    tv = _truth_view(np.asarray(y, dtype=np.float64), 0.1, 0.0, weights=w)
    return _metrics(np.asarray(x, dtype=np.float64), tv, 0.1)["spearman_w"]


def _metrics(c: np.ndarray, tv: dict[str, Any], top_frac: float) -> dict[str, float]:
    nan = float("nan")
    rc = _ranks(c) - (c.size + 1) / 2.0 if c.size else c
    if tv["n"] >= 2:
        den = math.sqrt(float((rc * rc).sum())) * tv["norm"]
        rho = float((rc * tv["ranks"]).sum() / den) if den > 0 else nan
    else:
        rho = nan
    rho_w = nan
    if tv["w"] is not None and tv["n"] >= 2:
        rcw = rc - float((tv["w"] * rc).sum() / tv["w"].sum())
        den_w = math.sqrt(float((tv["w"] * rcw * rcw).sum())) * tv["norm_w"]
        rho_w = float((tv["w"] * rcw * tv["ranks_w"]).sum() / den_w) if den_w > 0 else nan
    T, P = tv["top"], top_set(c, top_frac)
    both = float((T & P).sum())
    mass = np.abs(c)
    total = float(mass.sum())
    return {
        "spearman": rho,
        "spearman_w": rho_w,
        "precision": both / P.sum() if P.any() else nan,
        "recall": both / T.sum() if T.any() else nan,
        "null_share": float(mass[tv["null"]].sum()) / total if total > 0 else nan,
        "n_top": int(T.sum()),
        "n_pred": int(P.sum()),
    }


METRICS = ("spearman", "spearman_w", "precision", "recall", "null_share")


def _ci(values: np.ndarray) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if v.size < 2:
        return float("nan"), float("nan")
    lo, hi = np.quantile(v, [0.025, 0.975])
    return float(lo), float(hi)


def _clean(c: np.ndarray) -> np.ndarray:
    c = np.asarray(c, dtype=np.float64)
    top = float(np.abs(c).max()) if c.size else 0.0
    return np.round(c / top, 6) if top > 0 else c


def bootstrap_fidelity(
    credits: dict[str, np.ndarray],
    truth: np.ndarray,
    clusters: np.ndarray,
    *,
    half1: np.ndarray | None = None,
    half2: np.ndarray | None = None,
    baseline: str | None = None,
    top_frac: float = 0.1,
    null_eps: float = 0.05,
    n_boot: int = 1000,
    seed: int = 0,
    weights: np.ndarray | None = None,
) -> dict[str, Any]:
    """Every credit map's :func:`fidelity_metrics` with 95% percentile bootstrap CIs resampling ``clusters`` (one
    id per token: its prompt group) with replacement; the same resamples for every map, so the differences to
    ``baseline`` are paired. ``weights``: per-token uncertainty weights of ``spearman_w``. With ``half1`` /
    ``half2`` (two independent estimates of ``truth``): the split-half Spearman r, its Spearman-Brown step-up
    2r / (1 + r) and the ceiling sqrt(2r / (1 + r)), with CIs.

    Returns {"methods": {label: {metric: value, metric_ci: [lo, hi], "delta_" + metric (vs baseline) and its
    CI}}, "ceiling": {...}, "n_clusters", "n_tokens"}."""
    # credit maps scaled to max |c| = 1 and rounded at 1e-6 (every metric is scale free): uniform credit's exact ties
    # survive the float32 rounding of an eps floor or a normaliser (ARCA's mean-1 weights of a zero residual: 1 +- 1e-7)
    credits = {m: _clean(c) for m, c in credits.items()}
    truth = np.round(np.asarray(truth, dtype=np.float64), 12)
    ids = np.unique(clusters)
    members = [np.nonzero(clusters == g)[0] for g in ids]
    rng = np.random.default_rng(seed)
    draws = [np.concatenate([members[k] for k in rng.integers(0, len(ids), len(ids))]) for _ in range(n_boot)]

    def ceil_of(h1: np.ndarray, h2: np.ndarray) -> dict[str, float]:
        r = spearman(h1, h2)
        sb = 2 * r / (1 + r) if np.isfinite(r) and r > -1 else float("nan")
        return {
            "split_half": r,
            "spearman_brown": sb,
            "ceiling": math.sqrt(sb) if np.isfinite(sb) and sb > 0 else float("nan"),
        }

    out: dict[str, Any] = {"methods": {}, "n_clusters": len(ids), "n_tokens": int(truth.size)}
    point = {
        m: fidelity_metrics(c, truth, top_frac=top_frac, null_eps=null_eps, weights=weights) for m, c in credits.items()
    }
    boot = {m: {k: np.full(n_boot, np.nan) for k in METRICS} for m in credits}
    for b, idx in enumerate(draws):
        tv = _truth_view(truth[idx], top_frac, null_eps, None if weights is None else weights[idx])
        for m, c in credits.items():
            r = _metrics(c[idx], tv, top_frac)
            for k in METRICS:
                boot[m][k][b] = r[k]
    for m in credits:
        row: dict[str, Any] = dict(point[m])
        for k in METRICS:
            row[f"{k}_ci"] = list(_ci(boot[m][k]))
            if baseline is not None and baseline in credits:
                row[f"delta_{k}"] = point[m][k] - point[baseline][k]
                row[f"delta_{k}_ci"] = list(_ci(boot[m][k] - boot[baseline][k]))
        out["methods"][m] = row
    if half1 is not None and half2 is not None:
        c0 = ceil_of(half1, half2)
        bc = [ceil_of(half1[idx], half2[idx]) for idx in draws]
        out["ceiling"] = c0 | {f"{k}_ci": list(_ci(np.array([x[k] for x in bc]))) for k in c0}
        sp = fidelity_metrics(half1, half2, top_frac=top_frac, null_eps=null_eps)
        out["ceiling"]["split_half_precision"] = sp["precision"]
    return out
