"""Shared estimators of accuracy over questions (pure numpy): the unbiased pass@k and percentile-bootstrap CIs.

The evaluation (creditlab.eval) and the tables (creditlab.tables) both compute these, so they live below both. All
accuracies are fractions in [0, 1]. Confidence intervals are percentile bootstraps over questions (the unit that was
sampled from the benchmark); averages over several benchmarks resample questions within each benchmark independently
(stratified bootstrap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

# Resample in chunks of at most this many indices so that memory stays bounded for large Q.
_BOOT_CHUNK_ELEMS = 1 << 22


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: ``1 - C(n-c, k) / C(n, k)``.

    Computed in the numerically stable product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``
    (Chen et al. 2021). Raises ValueError unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if int(value) != value or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k={k} > n={n}: pass@k needs at least k samples")
    if c > n:
        raise ValueError(f"c={c} > n={n}")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def pass_at_k_per_question(n: int, correct_counts: Sequence[int] | np.ndarray, k: int) -> np.ndarray:
    """Vector of :func:`pass_at_k` (n, c_q, k) over questions q; shape [Q]."""
    return np.array([pass_at_k(n, int(c), k) for c in np.asarray(correct_counts)], dtype=np.float64)


def bootstrap_ci(
    per_question: Sequence[float] | np.ndarray, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of ``per_question`` [Q] and its percentile-bootstrap (1 - alpha) CI over questions.

    Returns ``(mean, lo, hi)``; the bounds are the alpha/2 and 1 - alpha/2 quantiles of the means of
    ``n_boot`` resamples (with replacement) of the Q questions.
    """
    x = as_1d(per_question, "per_question")
    _check_boot_args(n_boot, alpha)
    rng = np.random.default_rng(seed)
    means = _resampled_means(x, n_boot, rng)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(lo), float(hi)


def bootstrap_average(
    per_suite: Sequence[Sequence[float] | np.ndarray],
    weighting: Literal["plain", "count"] = "plain",
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Average over benchmarks with a stratified bootstrap CI.

    ``weighting="plain"``: the mean of the suite means (each benchmark counts once).
    ``weighting="count"``: suite means weighted by their question counts Q_s (= the mean over all
    pooled questions; DelTA's convention). The CI resamples questions within each suite
    independently and recomputes the same average. Returns ``(mean, lo, hi)``.
    """
    suites = [as_1d(x, f"per_suite[{i}]") for i, x in enumerate(per_suite)]
    if not suites:
        raise ValueError("per_suite is empty")
    if weighting not in ("plain", "count"):
        raise ValueError(f"weighting must be 'plain' or 'count', got {weighting!r}")
    _check_boot_args(n_boot, alpha)
    counts = np.array([len(x) for x in suites], dtype=np.float64)
    w = np.ones_like(counts) if weighting == "plain" else counts
    w = w / w.sum()
    rng = np.random.default_rng(seed)
    boot = np.stack([_resampled_means(x, n_boot, rng) for x in suites], axis=1)  # [n_boot, S]
    point = float(np.dot(w, [x.mean() for x in suites]))
    lo, hi = np.quantile(boot @ w, [alpha / 2, 1 - alpha / 2])
    return point, float(lo), float(hi)


def as_1d(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """`x` as a non-empty 1-D float array (ValueError naming `name` otherwise)."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    return arr


def _check_boot_args(n_boot: int, alpha: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _resampled_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_boot`` with-replacement resamples of ``x``; shape [n_boot]."""
    q = len(x)
    rows_per_chunk = max(1, _BOOT_CHUNK_ELEMS // q)
    means = np.empty(n_boot, dtype=np.float64)
    for start in range(0, n_boot, rows_per_chunk):
        stop = min(n_boot, start + rows_per_chunk)
        idx = rng.integers(0, q, size=(stop - start, q))
        means[start:stop] = x[idx].mean(axis=1)
    return means
