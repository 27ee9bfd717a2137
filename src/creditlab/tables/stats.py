"""The statistics of tables and ledgers: a cell's value and 95% CI, and the tests that decide a comparison of rows.

Pure numpy on values already read (creditlab.tables.load); no files. Cells: a percentile bootstrap over questions
(suites resampled independently, creditlab.stats), over RL steps (step_time, train_mean) or over seeds (steps_to, the
RL steps until the EMA of the training reward reaches a threshold); a relative cell is the ratio of two runs' means with
the CI of the ratio of independent bootstrap means. Comparisons (the ledger's claims, a table's versus cells): paired
bootstraps over seeds and questions, unpaired over steps, one-sided bounds and p-values, Holm's correction, and the
comparison of curves at matched x (matched_order claims). creditlab.tables.ledger describes the tests and verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from creditlab.stats import bootstrap_average, bootstrap_ci

N_BOOT = 2000
ALPHA = 0.05
BOOT_SEED = 0

HOLDS = "holds"
CONTRADICTED = "contradicted"
NOISE = "not resolved (noise)"
"""The verdicts of one comparison A > B or of a claim of several (single_verdict, combined_verdict)."""


class Sample(Protocol):
    """The values of one run a training cell summarises (creditlab.tables.load: StepTimes, one per step; StepsTo, one
    per seed)."""

    values: np.ndarray

    @property
    def mean(self) -> float: ...


MATCHED_POINTS = 11
"""Matched x values of a matched_order claim: evenly spaced over the series' common measured range, ends included."""

PAIRED_TEST = (
    "paired bootstrap over training seeds and questions (a draw resamples the seeds, seed s of both rows "
    "together, and per suite the question indices, jointly for both rows; suites independently), "
    "one-sided alpha 0.05"
)
UNPAIRED_TEST = (
    "unpaired bootstrap over RL steps (steps of all seeds pooled, each run resampled "
    "independently), one-sided alpha 0.05"
)
MATCHED_TOWARD = (
    "; closeness to {t}: the statistic per link is instead the mean over the matched values of |{y} - {t}'s "
    "{y}| of the second series minus that of the first (each curve interpolated, then its distance to {t}'s cell "
    "taken, the row resampled with the same draws): the first series reaches {t} with fewer {x}"
)
MATCHED_TEST = (
    "accuracy at matched {x}: per series, {y} interpolated linearly in the measured {x} (its rows' cells) "
    "at {g} evenly spaced {x} values over the common range of the series' measured {x} (inside every "
    "series' range); statistic per link: the mean over those values of the accuracy difference; paired "
    "bootstrap over training seeds and questions (a draw resamples the seeds and, per suite, the questions "
    "jointly for every row, recomputes every row's {x} and {y} and re-interpolates at the same matched "
    "values), one-sided alpha 0.05"
)

VERSUS_TEST = (
    "paired bootstrap over training seeds and questions (a draw resamples the seeds, seed s of the row "
    "and of the reference together, and per suite the question indices, jointly for both rows; suites "
    "independently), two-sided "
    "p = min(1, 2 min(p+, p-)) from the one-sided bootstrap p-values (1 + #) / (1 + B), Holm-corrected "
    "over every versus cell of the table (family-wise alpha 0.05)"
)

# ----------------------------------------------------------------------------------------------
# cells


def ema(values: Sequence[float], smoothing: float) -> list[float]:
    """Exponential moving average, debiased as in TensorBoard (smoothing 0 = the raw values)."""
    out, acc = [], 0.0
    for i, value in enumerate(values, start=1):
        acc = smoothing * acc + (1.0 - smoothing) * value
        out.append(acc / (1.0 - smoothing**i) if smoothing > 0 else value)
    return out


def steps_to_threshold(
    steps: Sequence[int], values: Sequence[float], threshold: float, smoothing: float
) -> tuple[int, bool, int]:
    """(steps, censored, trained): the RL steps run until the EMA of `values` (ema, `smoothing`)
    first reaches `threshold` (1 + the 0-based step where it does), or the steps trained N = 1 + the
    last step, censored, if it never does."""
    trained = int(max(steps)) + 1
    for step, value in zip(steps, ema(list(values), smoothing)):
        if value >= threshold:
            return int(step) + 1, False, trained
    return trained, True, trained


def _boot_means(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """N_BOOT means of resamples (with replacement) of x."""
    return x[rng.integers(0, len(x), size=(N_BOOT, len(x)))].mean(axis=1)


def _as_relative(ratio: float | np.ndarray, relative: str) -> float | np.ndarray:
    """A ratio x / x_ref as the cell shows it: itself (`ratio`) or 100 (ratio - 1) (`percent`)."""
    if relative not in ("percent", "ratio"):
        raise ValueError(f"unknown relative mode {relative!r}; choices: ['percent', 'ratio']")
    return ratio if relative == "ratio" else 100.0 * (ratio - 1.0)


def _ratio_stats(row: np.ndarray, ref: np.ndarray, relative: str) -> tuple[float, float, float]:
    """(value, lo, hi) of mean(row) / mean(ref) as `relative`; CI: percentiles of the ratio of independent
    bootstrap means of both (NaN when either has a single value: nothing to resample)."""
    value = float(_as_relative(row.mean() / ref.mean(), relative))
    if len(row) < 2 or len(ref) < 2:
        return value, float("nan"), float("nan")
    rng = np.random.default_rng(BOOT_SEED)
    ratio = _boot_means(row, rng) / _boot_means(ref, rng)
    lo, hi = np.quantile(_as_relative(ratio, relative), [ALPHA / 2, 1 - ALPHA / 2])
    return value, float(lo), float(hi)


def step_time_stats(row: Sample, ref: Sample | None = None, relative: str = "percent") -> tuple[float, float, float]:
    """(mean, lo, hi): seconds per step with a bootstrap CI over steps; with `ref`, the % difference
    100 (mean / mean_ref - 1) (`relative="ratio"`: mean / mean_ref) with the CI of that ratio over
    independent bootstraps of both runs."""
    if ref is None:
        return bootstrap_ci(row.values, n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)
    return _ratio_stats(row.values, ref.values, relative)


def steps_to_stats(row: Sample, ref: Sample | None = None, relative: str = "percent") -> tuple[float, float, float]:
    """(mean, lo, hi): the mean over seeds of the steps to the threshold (censored seeds counted at N) with
    a percentile bootstrap CI over seeds (NaN with one seed); with `ref`, the ratio of the means as
    `relative` (percent / ratio), CI from independent bootstraps over both runs' seeds."""
    if ref is not None:
        return _ratio_stats(row.values, ref.values, relative)
    if len(row.values) < 2:
        return row.mean, float("nan"), float("nan")
    return bootstrap_ci(row.values, n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)


def cell_stats(per_suite: list[np.ndarray], weighting: str) -> tuple[float, float, float]:
    """(mean, lo, hi) in percent: bootstrap over questions, suites resampled independently."""
    if len(per_suite) == 1:
        mean, lo, hi = bootstrap_ci(per_suite[0], n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)
    else:
        mean, lo, hi = bootstrap_average(per_suite, weighting=weighting, n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)
    return 100.0 * mean, 100.0 * lo, 100.0 * hi


# ----------------------------------------------------------------------------------------------
# comparisons


def suite_means(
    per_suite: Sequence[np.ndarray], idx: Sequence[np.ndarray], weighting: str, seed_idx: np.ndarray | None = None
) -> np.ndarray:
    """Bootstrap means over suites: per suite the mean of x[idx] (idx: n_boot x n), then the plain or
    question-count-weighted mean over suites. A per-suite array [n, S] (one column per seed) is resampled in its
    seeds too: x[idx, seed_idx] (seed_idx: n_boot x S, the same for every suite: a seed is one training run)."""

    def mean(x: np.ndarray, i: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if x.ndim == 1:
            return x[i].mean(axis=1)
        return x[i[:, :, None], seed_idx[:, None, :]].mean(axis=(1, 2))

    means = np.stack([mean(x, i) for x, i in zip(per_suite, idx)])
    weights = np.array([len(x) for x in per_suite], dtype=float) if weighting == "count" else np.ones(len(per_suite))
    return (weights[:, None] * means).sum(axis=0) / weights.sum()


def point_mean(per_suite: Sequence[np.ndarray], weighting: str) -> float:
    means = np.array([np.mean(x) for x in per_suite], dtype=float)
    weights = np.array([len(x) for x in per_suite], dtype=float) if weighting == "count" else np.ones(len(means))
    return float((weights * means).sum() / weights.sum())


def _bounds(diff: float, boots: np.ndarray, alpha: float) -> tuple[float, float, float, float, float]:
    """(diff, lo, hi, p, p_reverse): one-sided bounds (alpha and 1 - alpha quantiles) and one-sided p-values."""
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    n = len(boots)
    p = (1 + int((boots <= 0).sum())) / (1 + n)
    p_rev = (1 + int((boots >= 0).sum())) / (1 + n)
    return float(diff), float(lo), float(hi), float(p), float(p_rev)


def paired_bootstrap_diff_suites(
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    weighting: str = "plain",
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
    alpha: float = ALPHA,
) -> tuple[float, float, float, float, float]:
    """Paired bootstrap of mean(A) - mean(B) over several suites (one per-question array per suite, the
    same questions in A and B): per suite the question indices are resampled jointly for A and B, suites
    independently. Per-suite arrays of shape [n_questions, S] hold one column per training seed (seed s of A
    paired with seed s of B): a draw then also resamples the S seeds, jointly for A and B and the same for every
    suite, so the spread between training runs is in the test, not only the spread between questions (with one
    seed this is the questions-only bootstrap). Returns (diff, lo, hi, p, p_reverse): lo / hi the one-sided
    (1 - alpha) bounds (the alpha and 1 - alpha quantiles), p = P*(diff <= 0), p_reverse = P*(diff >= 0), each
    (1 + count) / (1 + n_boot)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired bootstrap needs the same suites on both sides, got {len(a)} and {len(b)}")
    shapes = {np.shape(x)[1:] for x in [*a, *b]}
    if len(shapes) != 1:
        raise ValueError(
            f"paired bootstrap needs the same seeds in every suite on both sides, got shapes "
            f"{[np.shape(x) for x in [*a, *b]]}"
        )
    for x, y in zip(a, b):
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"paired bootstrap needs the same questions on both sides, got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)
    idx = [rng.integers(0, len(x), size=(n_boot, len(x))) for x in a]
    n_seeds = shapes.pop()
    seed_idx = rng.integers(0, n_seeds[0], size=(n_boot, n_seeds[0])) if n_seeds else None
    boots = suite_means(a, idx, weighting, seed_idx) - suite_means(b, idx, weighting, seed_idx)
    return _bounds(point_mean(a, weighting) - point_mean(b, weighting), boots, alpha)


def paired_bootstrap_diff(
    a_per_question: np.ndarray,
    b_per_question: np.ndarray,
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
    alpha: float = ALPHA,
) -> tuple[float, float, float]:
    """(mean, lo, hi) of mean(A) - mean(B) by a paired bootstrap over questions (indices resampled jointly);
    lo / hi: the one-sided (1 - alpha) lower and upper bounds."""
    diff, lo, hi, _, _ = paired_bootstrap_diff_suites(
        [np.asarray(a_per_question, dtype=float)],
        [np.asarray(b_per_question, dtype=float)],
        n_boot=n_boot,
        seed=seed,
        alpha=alpha,
    )
    return diff, lo, hi


def unpaired_bootstrap_diff(
    a: np.ndarray, b: np.ndarray, n_boot: int = N_BOOT, seed: int = BOOT_SEED, alpha: float = ALPHA
) -> tuple[float, float, float, float, float]:
    """(diff, lo, hi, p, p_reverse) of mean(A) - mean(B), A and B resampled independently (e.g. RL steps)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("unpaired bootstrap needs values on both sides")
    rng = np.random.default_rng(seed)
    boots = a[rng.integers(0, len(a), size=(n_boot, len(a)))].mean(axis=1) - b[
        rng.integers(0, len(b), size=(n_boot, len(b)))
    ].mean(axis=1)
    return _bounds(float(a.mean() - b.mean()), boots, alpha)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1), in the input order."""
    p = np.asarray(pvalues, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def two_sided_p(p: float, p_reverse: float) -> float:
    """The two-sided p-value of a difference from its two one-sided bootstrap p-values: min(1, 2 min(p, p_rev))."""
    return min(1.0, 2.0 * min(p, p_reverse))


BEATS, WORSE, TIED = "beats", "worse than", "noise"
"""The verdicts of a versus cell (row vs reference, two-sided, Holm over the table's versus cells)."""


def versus_verdicts(
    diffs: Sequence[float], pvalues: Sequence[float], reverse_pvalues: Sequence[float], alpha: float = ALPHA
) -> list[tuple[float, float, str]]:
    """A family of "row vs reference" comparisons (one per versus cell of a table): per comparison (two-sided p,
    Holm-adjusted p over the family, verdict): BEATS if adjusted p < alpha and the difference is positive, WORSE if
    adjusted p < alpha and it is negative, else TIED (noise)."""
    p2 = [two_sided_p(p, q) for p, q in zip(pvalues, reverse_pvalues)]
    adj = holm(p2) if p2 else []
    return [(p, a, (BEATS if d > 0 else WORSE) if a < alpha and d != 0 else TIED) for d, p, a in zip(diffs, p2, adj)]


def single_verdict(lo: float, hi: float) -> str:
    """The verdict of one comparison A > B from the one-sided bounds of A - B."""
    if lo > 0:
        return HOLDS
    if hi < 0:
        return CONTRADICTED
    return NOISE


def combined_verdict(pvalues: Sequence[float], reverse_pvalues: Sequence[float], alpha: float = ALPHA) -> str:
    """A claim of several comparisons: holds if every Holm-adjusted p < alpha; contradicted if any
    Holm-adjusted reverse p < alpha; else not resolved."""
    if all(p < alpha for p in holm(pvalues)):
        return HOLDS
    if any(p < alpha for p in holm(reverse_pvalues)):
        return CONTRADICTED
    return NOISE


def interpolate_curve(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """y of a curve through the points (x, y) at the values `at`: linear between the points sorted by x (points of
    equal x averaged), held at the end values outside [min x, max x]."""
    xs, inverse = np.unique(np.asarray(x, dtype=float), return_inverse=True)
    ys = np.bincount(inverse, weights=np.asarray(y, dtype=float)) / np.bincount(inverse)
    return np.interp(np.asarray(at, dtype=float), xs, ys)


def matched_range(xs: Sequence[np.ndarray]) -> tuple[float, float] | None:
    """The common range [max of the minima, min of the maxima] of several series' measured x; None when they do
    not overlap."""
    lo, hi = max(float(np.min(x)) for x in xs), min(float(np.max(x)) for x in xs)
    return (lo, hi) if lo <= hi else None


def matched_grid(lo: float, hi: float, n: int = MATCHED_POINTS) -> np.ndarray:
    """The matched x values: `n` evenly spaced over [lo, hi], ends included (one value when lo == hi)."""
    return np.array([lo]) if hi == lo else np.linspace(lo, hi, n)


def matched_gap_bootstrap(
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    grid: np.ndarray,
    alpha: float = ALPHA,
    target: np.ndarray | None = None,
) -> tuple[float, float, float, float, float]:
    """(diff, lo, hi, p, p_reverse) of the mean over `grid` of y_A(x) - y_B(x), each series given as (x, y): point
    values [T] (one per row) and bootstrap values [B, T] (the same draws for both series) stacked as (x [B+1, T],
    y [B+1, T]) with the point estimate first. Bounds and p-values as `paired_bootstrap_diff_suites`.

    With `target` [B+1] (a row's value, the same draws): the mean of |y_B(x) - t| - |y_A(x) - t|, how much closer
    to the target A's interpolated curve is than B's (each curve interpolated first, then its distance taken)."""
    (xa, ya), (xb, yb) = a, b

    def gap(i: int) -> float:
        ia, ib = interpolate_curve(xa[i], ya[i], grid), interpolate_curve(xb[i], yb[i], grid)
        if target is not None:
            return float(np.mean(np.abs(ib - target[i]) - np.abs(ia - target[i])))
        return float(np.mean(ia - ib))

    boots = np.array([gap(i) for i in range(1, len(xa))])
    return _bounds(gap(0), boots, alpha)
