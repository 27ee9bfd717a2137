"""Pre-registered mechanism verdicts on a tiny world (issue 29, item 3; protocol: docs/papers/mechanisms.md).

Each test compares per-seed scores of trained runs (:func:`creditlab.analysis.noise.measure`: exact probe scores by
token kind, Paper A's ranking precision, sampled accuracy) with a stated test:

* ``two_sample`` -- run ``arm`` against run ``ref`` on ``metric``: Welch's two-sided t test over seeds (seeds
  unpaired), effect = mean(arm) - mean(ref);
* ``one_sample`` -- ``metric`` of run ``arm`` against 0 (a within-run contrast, e.g. Δlog p's precision minus the
  entropy's): two-sided one-sample t test over seeds;
* ``matched`` (``matched_over``; protocol v5) -- a paired test whose reference is a curve, not a run: per seed, the
  runs ``matched_over`` (one arm at several budgets, e.g. dynamic sampling capped at 2, 3, 4 generation rounds) give
  points (``matched_at``, ``metric``), and the reference is their piecewise-linear interpolation at the arm's own
  ``matched_at`` (:func:`matched_reference`): the arm against the curve at equal cost. A seed whose arm lies outside
  the curve's range at that seed, or misses a point, has no pair (counted, not extrapolated);
* ``paired`` (``paired=True``; protocol v3) -- run ``arm`` against run ``ref`` on the seeds both ran: two-sided paired
  t test of the per-seed differences (the arms of one seed share their prompts and sampling seed, and in protocol v2
  their scores correlated, e.g. 0.91 in the decisive p). Its power is stated at a correlation of 0 between the arms
  (the differences' sd = sqrt(2) x the seed sd; a negative correlation, which shared seeds give no reason to expect,
  would lower it); the measured correlation is reported beside it.

The family (``family: true``) is Holm-corrected at alpha 0.05. A test **holds** when its Holm-adjusted p < 0.05 and
the effect has the predicted sign, is **contradicted** when p < 0.05 with the other sign, and is otherwise a **null**.
Beside each verdict: the smallest effect of interest (SESOI = ``sesoi_sds`` x the seed sd of ``metric`` in the noise
runs, measured before the verdict runs) and the power the test had to detect it with the seeds it used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from creditlab.analysis.noise import ALPHA, power_one_sample, power_two_sample


@dataclass(frozen=True)
class MechanismTest:
    """One pre-registered test (module docstring)."""

    id: str
    paper: str
    claim: str
    metric: str
    arm: str
    ref: str | None  # None: a one-sample test of ``arm``'s metric against 0
    sign: int = 1  # the predicted sign of the effect
    family: bool = True
    paired: bool = False  # a paired t test over the seeds both arms ran (module docstring), else Welch's
    matched_over: tuple[str, ...] = ()  # matched: ``ref`` names the curve of these runs read at the arm's matched_at
    matched_at: str = "train/gen_rounds"  # the cost the curve is matched on (module docstring: ``matched``)


V1: tuple[MechanismTest, ...] = (
    MechanismTest(
        "M1",
        "delta",
        "DelTA learns the rule (p of the true operator at rule letters) better than DAPO",
        "probe/decisive_p",
        "delta",
        "dapo",
    ),
    MechanismTest(
        "M2",
        "cancellation",
        "QB drifts less on ignorable tokens (separator entropy) than the baseline",
        "probe/separator_entropy",
        "qb",
        "dapo",
    ),
    MechanismTest(
        "M3",
        "dfpo",
        "DFPO drifts less on ignorable tokens (separator entropy) than GRPO",
        "probe/separator_entropy",
        "dfpo",
        "grpo",
    ),
    MechanismTest(
        "M4",
        "dlogp",
        "Δlog p (RL vs base) ranks decisive tokens above the base entropy (precision@k)",
        "rank/dlogp_minus_entropy",
        "dapo",
        None,
    ),
    MechanismTest(
        "S1", "delta", "accuracy: DelTA vs DAPO (avg@8, medium + hard, pp)", "avg_sampled", "delta", "dapo", 1, False
    ),
    MechanismTest(
        "S2",
        "cancellation",
        "accuracy: QB vs baseline (avg@8, medium + hard, pp)",
        "avg_sampled",
        "qb",
        "dapo",
        1,
        False,
    ),
    MechanismTest(
        "S3", "dfpo", "accuracy: DFPO vs GRPO (avg@8, medium + hard, pp)", "avg_sampled", "dfpo", "grpo", 1, False
    ),
)
"""Protocol v1 of docs/papers/mechanisms.md (M: the Holm family; S: secondary, reported without a verdict family):
the tiny scale's lr 3e-5."""

V2: tuple[MechanismTest, ...] = (
    *V1[:4],
    MechanismTest(
        "M5",
        "cancellation",
        "RB drifts less on ignorable tokens (separator entropy) than the baseline",
        "probe/separator_entropy",
        "rb",
        "dapo",
    ),
    *V1[4:],
    MechanismTest(
        "S4",
        "cancellation",
        "accuracy: RB vs baseline (avg@8, medium + hard, pp)",
        "avg_sampled",
        "rb",
        "dapo",
        1,
        False,
    ),
)
"""Protocol v2 (docs/papers/mechanisms.md section 5): tiny_rule with its own RL budget (lr 2e-4, design note 57);
v1's tests and RB's drift (M5), which binds there."""

V3: tuple[MechanismTest, ...] = tuple(replace(t, paired=t.ref is not None) for t in V2)
"""Protocol v3 (docs/papers/mechanisms.md section 8): v2's tests on tiny_rule with its RL prompts drawn 0 : 50 : 50 by
rule letters (so that RB binds), every two-arm test paired by seed (v2's exploratory finding, pre-registered here)."""

V4: tuple[MechanismTest, ...] = (
    *V3,
    MechanismTest(
        "S5",
        "cancellation",
        "accuracy: RB vs the baseline with dynamic sampling (both draw up to 4 generation rounds per update, pp)",
        "avg_sampled",
        "rb",
        "dapo-ds4",
        1,
        False,
        True,
    ),
)
"""Protocol v4 (docs/papers/mechanisms.md section 9): v3's tests on tiny_rule with one rule letter per operator, and
RB against the baseline given the same cap on generation rounds through dynamic sampling (S5: does balancing add to
filtering out uninformative groups?)."""

V5: tuple[MechanismTest, ...] = (
    V4[-1],
    MechanismTest(
        "S6",
        "cancellation",
        "accuracy: RB vs the baseline with dynamic sampling at RB's own generation rounds per update (the curve of "
        "the baseline, 1 round, and dynamic sampling capped at 2, 3 and 4 rounds, interpolated; pp)",
        "avg_sampled",
        "rb",
        "dapo-ds@rb-rounds",
        1,
        False,
        True,
        matched_over=("dapo", "dapo-ds2", "dapo-ds3", "dapo-ds4"),  # dapo: 1 round (amended, mechanisms.md 12.1)
    ),
)
"""Protocol v5 (docs/papers/mechanisms.md section 12): v4's S5 again on the current code, and S6, RB against dynamic
sampling at matched generation compute (v4's S5 let dynamic sampling draw 3.05 rounds per update against RB's 2.34)."""

PROTOCOLS: dict[str, tuple[MechanismTest, ...]] = {"v1": V1, "v2": V2, "v3": V3, "v4": V4, "v5": V5}
PROTOCOL = V5
"""The current protocol."""
SUITES = ("medium", "hard")
"""The suites of the sampled accuracy: those every run's evaluation has (DFPO's tables read no ``easy``)."""


def protocol_runs(protocol: Sequence[MechanismTest]) -> list[str]:
    """The plan run names a protocol reads (cancellation's dapo / qb / rb, delta's delta, dfpo's grpo / dfpo), in
    order of first use (a matched test reads its curve's runs, not its ``ref``, which names the curve)."""
    return list(dict.fromkeys(r for t in protocol for r in (t.arm, *(t.matched_over or (t.ref,))) if r is not None))


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float, float]:
    """(effect = mean a - mean b, its standard error, Welch's t, two-sided p)."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = float(a.mean() - b.mean())
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    res = stats.ttest_ind(a, b, equal_var=False)
    return diff, se, float(res.statistic), float(res.pvalue)


def one_sample(a: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, its standard error, t, two-sided p) of the one-sample t test against 0."""
    from scipy import stats

    a = np.asarray(a, dtype=np.float64)
    res = stats.ttest_1samp(a, 0.0)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(a.size)), float(res.statistic), float(res.pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1), in the input order."""
    order = np.argsort(pvalues)
    m = len(pvalues)
    adj, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adj[i] = running
    return adj


def paired_seeds(scores: Mapping[str, Mapping[int, Mapping[str, float]]], t: MechanismTest) -> list[int]:
    """The seeds, sorted, in which both of ``t``'s arms have its metric: the pairs of a paired test."""
    arm, ref = scores[t.arm], scores[t.ref]
    return sorted(s for s in set(arm) & set(ref) if t.metric in arm[s] and t.metric in ref[s])


def matched_reference(
    scores: Mapping[str, Mapping[int, Mapping[str, float]]], t: MechanismTest
) -> dict[int, dict[str, float]]:
    """Per seed of ``t.arm``: the curve of ``t.matched_over``'s runs at that seed (points (x, y) = (``matched_at``,
    ``metric``), sorted by x) read by linear interpolation at the arm's x, as {metric: y, matched_at: x}. Seeds where
    the arm has no x, a curve run misses a point, or x lies outside [min x, max x] of the curve get no entry."""
    out: dict[int, dict[str, float]] = {}
    for seed, v in scores[t.arm].items():
        pts = [scores.get(run, {}).get(seed, {}) for run in t.matched_over]
        if t.matched_at not in v or not all(t.metric in p and t.matched_at in p for p in pts):
            continue
        xs, ys = zip(*sorted((float(p[t.matched_at]), float(p[t.metric])) for p in pts))
        x = float(v[t.matched_at])
        if xs[0] <= x <= xs[-1]:
            out[seed] = {t.metric: float(np.interp(x, xs, ys)), t.matched_at: x}
    return out


def with_matched(
    scores: Mapping[str, Mapping[int, Mapping[str, float]]], protocol: Sequence[MechanismTest]
) -> dict[str, Mapping[int, Mapping[str, float]]]:
    """``scores`` plus, for every matched test of ``protocol``, its reference curve under the name ``t.ref``."""
    out = dict(scores)
    for t in protocol:
        if t.matched_over:
            out[t.ref] = matched_reference(scores, t)
    return out


def gen_rounds(metrics_jsonl: str | Path) -> float | None:
    """A run's mean generation rounds per update over its steps (``rb_rounds`` under reward-balanced batching, else
    ``n_gen_batches``: dynamic sampling's batches, 1 without it), from its ``metrics.jsonl``; None without the file."""
    path = Path(metrics_jsonl)
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rounds = [r.get("rb_rounds", r.get("n_gen_batches")) for r in rows]
    rounds = [float(x) for x in rounds if x is not None]
    return float(np.mean(rounds)) if rounds else None


def decide(
    scores: Mapping[str, Mapping[int, Mapping[str, float]]],
    noise_sd: Mapping[str, float],
    *,
    protocol: Sequence[MechanismTest] = PROTOCOL,
    sesoi_sds: float = 2.0,
) -> list[dict[str, Any]]:
    """Every test of ``protocol`` on ``scores`` (run -> seed -> metric -> value) with its SESOI from ``noise_sd``
    (metric -> seed sd of the noise runs). Returns one row per test: effect, se, t, p, Holm p (family), verdict, n,
    SESOI and the power to detect it (two-sample: the exact t test's with the smaller arm's n; one-sample: the
    noncentral t's with the seeds used; also at alpha / family size, Holm's worst case). A matched test pairs the
    arm with its curve (:func:`matched_reference`); ``unmatched`` counts the arm's seeds left without a pair."""

    scores = with_matched(scores, protocol)
    rows = []
    for t in protocol:
        a = [v[t.metric] for v in scores[t.arm].values() if t.metric in v]
        corr = None
        if t.ref is None:
            effect, se, tstat, p = one_sample(a)
            n = len(a)
        elif t.paired:
            both = paired_seeds(scores, t)
            x = [scores[t.arm][s_][t.metric] for s_ in both]
            y = [scores[t.ref][s_][t.metric] for s_ in both]
            effect, se, tstat, p = one_sample(np.subtract(x, y))
            n, corr = len(both), float(np.corrcoef(x, y)[0, 1])
        else:
            b = [v[t.metric] for v in scores[t.ref].values() if t.metric in v]
            effect, se, tstat, p = welch(a, b)
            n = min(len(a), len(b))
        sd = float(noise_sd.get(t.metric, float("nan")))
        sesoi = sesoi_sds * sd
        m = sum(x.family for x in protocol) if t.family else 1
        power_at = power_one_sample if t.ref is None or t.paired else power_two_sample
        sd_test = sd * math.sqrt(2.0) if t.paired else sd  # paired: the differences' sd at correlation 0
        power, power_holm = power_at(sesoi, sd_test, n), power_at(sesoi, sd_test, n, alpha=ALPHA / m)
        rows.append(
            {
                "id": t.id,
                "paper": t.paper,
                "claim": t.claim,
                "metric": t.metric,
                "arm": t.arm,
                "ref": t.ref,
                "sign": t.sign,
                "family": t.family,
                "n": n,
                "effect": effect,
                "se": se,
                "t": tstat,
                "p": p,
                "noise_sd": sd,
                "sesoi": sesoi,
                "power_at_sesoi": power,
                "power_at_sesoi_holm": power_holm,  # at alpha / (family size): the first step of Holm, its worst case
                "test": "one-sample t"
                if t.ref is None
                else f"paired t at matched {t.matched_at}"
                if t.matched_over
                else "paired t"
                if t.paired
                else "Welch t",
                "pair_corr": corr,  # paired: the arms' correlation over the seeds (the power assumes 0)
                "unmatched": len(scores[t.arm]) - n if t.matched_over else 0,
            }
        )
    fam = [r for r in rows if r["family"]]
    for r, adj in zip(fam, holm([r["p"] for r in fam])):
        r["p_holm"] = adj
    for r in rows:
        p = r.get("p_holm", r["p"])
        if p < ALPHA:
            r["verdict"] = "holds" if np.sign(r["effect"]) == r["sign"] else "contradicted"
        else:
            r["verdict"] = "null"
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The verdicts as a Markdown table."""
    lines = [
        "| test | paper | claim | metric | n/arm | t test | effect ± se | t | p | p (Holm) | verdict | SESOI | power "
        "at SESOI (alpha / m) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ph = f"{r['p_holm']:.3g}" if "p_holm" in r else "-"
        lines.append(
            f"| {r['id']} | {r['paper']} | {r['claim']} | `{r['metric']}` | {r['n']} | {r['test']}"
            + (f" (r {r['pair_corr']:.2f})" if r.get("pair_corr") is not None else "")
            + (f", {r['unmatched']} seed(s) outside the curve" if r.get("unmatched") else "")
            + f" | {r['effect']:+.4g} ± "
            f"{r['se']:.2g} | {r['t']:.2f} | {r['p']:.3g} | {ph} | **{r['verdict']}** | {r['sesoi']:.3g} | "
            f"{r['power_at_sesoi']:.2f} ({r['power_at_sesoi_holm']:.2f}) |"
        )
    return "\n".join(lines) + "\n"


def rounds_markdown(scores: Mapping[str, Mapping[int, Mapping[str, float]]]) -> str:
    """Generation rounds per update by run (``train/gen_rounds``: mean over seeds, min - max) as a Markdown table."""
    lines = ["| run | generation rounds / update, mean of seeds | min - max |", "|---|---|---|"]
    for run, per_seed in scores.items():
        g = [v["train/gen_rounds"] for v in per_seed.values() if "train/gen_rounds" in v]
        if g:
            lines.append(f"| {run} | {np.mean(g):.2f} | {min(g):.2f} - {max(g):.2f} |")
    return "\n".join(lines) + "\n"


def plot(
    scores: Mapping[str, Mapping[int, Mapping[str, float]]],
    rows: Sequence[Mapping[str, Any]],
    png,
    *,
    protocol: Sequence[MechanismTest] = PROTOCOL,
    title: str = "",
) -> None:
    """One panel per test of ``rows``: each seed's ``metric`` for the reference (left) and the arm (right), a seed's two
    values joined by a line (what a paired test compares), the SESOI as a bar from the reference's mean, and the verdict
    in the panel's title; a one-sample test shows its per-seed values against 0. Written to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tests = {t.id: t for t in protocol}
    cols = min(5, len(rows))
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.1 * cols, 2.9 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        t = tests[r["id"]]
        arm = scores[t.arm]
        if t.ref is None:
            v = [arm[s][t.metric] for s in sorted(arm) if t.metric in arm[s]]
            ax.scatter(np.zeros(len(v)), v, color="#2a9d8f", zorder=3)
            ax.axhline(0, color="grey", lw=0.8)
            ax.axhline(r["sesoi"], color="#e76f51", lw=1, ls="--", label="SESOI")
            ax.set_xticks([0], [t.arm], fontsize=8)
        else:
            ref = scores[t.ref]
            both = paired_seeds(scores, t)
            for s in both:
                ax.plot([0, 1], [ref[s][t.metric], arm[s][t.metric]], color="grey", lw=0.8, marker="o", ms=4)
            m = float(np.mean([ref[s][t.metric] for s in both])) if both else float("nan")
            ax.plot([1.15, 1.15], [m, m + t.sign * r["sesoi"]], color="#e76f51", lw=3, label="SESOI")
            ax.set_xticks([0, 1], [t.ref, t.arm], fontsize=8)
            ax.set_xlim(-0.3, 1.35)
        ph = r.get("p_holm", r["p"])
        ax.set_title(f"{r['id']}: {r['verdict']} (p {ph:.2g})", fontsize=9)
        ax.set_ylabel(t.metric, fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="best")
    fig.suptitle(title or "Mechanism verdicts: per-seed scores, seeds joined", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m creditlab.analysis.mechanisms --results R --seeds 10,...,15 --noise R/tiny/analyses/noise_...json``:
    a protocol's verdicts on the runs it reads under results root R (``R/<scale>/analyses/mechanisms_<protocol>``:
    JSON, Markdown and the PNG of :func:`plot`)."""
    import argparse

    import torch

    from creditlab import paths
    from creditlab.analysis.noise import measure

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--results", required=True)
    ap.add_argument("--scale", default="tiny")
    ap.add_argument("--backbone", default="tiny-s")
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--noise", required=True, help="the noise JSON (analysis/noise.py) the SESOIs come from")
    ap.add_argument("--probe-n", type=int, default=100)
    ap.add_argument("--protocol", default="v5", choices=sorted(PROTOCOLS))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(x) for x in a.seeds.split(",")]
    noise = json.loads(Path(a.noise).read_text())
    noise_sd = {m: v["sd"] for m, v in noise["summary"].items()}
    scores = {
        run: measure(a.results, a.scale, a.backbone, run, seeds, probe_n=a.probe_n, suites=SUITES)["per_seed"]
        for run in protocol_runs(PROTOCOLS[a.protocol])
    }
    for run, per_seed in scores.items():  # descriptive: the generation compute each run spent per update
        for seed, v in per_seed.items():
            kw = dict(results=a.results, scale=a.scale, backbone=a.backbone, run=run, seed=seed)
            if (g := gen_rounds(paths.fmt(paths.RUN_METRICS, **kw))) is not None:
                v["train/gen_rounds"] = g
    rows = decide(scores, noise_sd, protocol=PROTOCOLS[a.protocol])
    scores = with_matched(scores, PROTOCOLS[a.protocol])  # the curves, as the verdicts and the figure read them
    out = Path(a.results) / a.scale / "analyses" / f"mechanisms_{a.protocol}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"protocol": a.protocol, "seeds": seeds, "noise": a.noise, "scores": scores, "verdicts": rows}, indent=1
        )
    )
    out.with_suffix(".md").write_text(markdown(rows) + "\n" + rounds_markdown(scores))
    plot(
        scores,
        rows,
        out.with_suffix(".png"),
        protocol=PROTOCOLS[a.protocol],
        title=f"Protocol {a.protocol}, {a.backbone}, seeds {a.seeds}: per-seed scores, seeds joined",
    )
    print(markdown(rows) + "\n" + rounds_markdown(scores))


if __name__ == "__main__":
    main()
