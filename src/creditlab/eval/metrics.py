"""Evaluation metrics of a suite (pure numpy): greedy accuracy, avg@k and pass@j per question, with bootstrap CIs.

All accuracies are fractions in [0, 1]. The estimators themselves (unbiased pass@k, percentile bootstrap over
questions) are creditlab.stats, shared with the tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from creditlab.stats import as_1d, bootstrap_ci, pass_at_k_per_question


def greedy_accuracy(correct: Sequence[float] | np.ndarray) -> float:
    """Mean of a [Q] vector of 0/1 greedy correctness."""
    x = as_1d(correct, "correct")
    return float(x.mean())


def avg_at_k(correct: np.ndarray) -> float:
    """avg@k: accuracy averaged over the k samples of each question, then over questions. [Q, k] -> float."""
    x = np.asarray(correct, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"correct must be a non-empty [Q, k] array, got shape {x.shape}")
    return float(x.mean(axis=1).mean())


def per_question_metrics(
    greedy: Sequence[float] | np.ndarray, samples: np.ndarray, ks: Sequence[int]
) -> dict[str, np.ndarray]:
    """Per-question values [Q] of each metric: ``greedy``, ``avg@k`` and ``pass@j`` for j in ``ks``.

    greedy: [Q] 0/1; samples: [Q, k] 0/1. ``avg@k`` is a question's fraction of correct samples;
    ``pass@j`` its unbiased pass@j with n = k samples (so every j must be <= k). Each metric's value
    on the benchmark is the mean of its vector.
    """
    g = as_1d(greedy, "greedy")
    s = np.asarray(samples, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != len(g) or s.shape[1] == 0:
        raise ValueError(f"samples must be [Q={len(g)}, k>=1], got shape {s.shape}")
    k = s.shape[1]
    out = {"greedy": g, f"avg@{k}": s.mean(axis=1)}
    counts = s.sum(axis=1).round().astype(int)
    for j in ks:
        out[f"pass@{j}"] = pass_at_k_per_question(k, counts, j)
    return out


def summarize_suite(
    greedy: Sequence[float] | np.ndarray,
    samples: np.ndarray,
    ks: Sequence[int],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Greedy accuracy, avg@k and pass@j (j in ``ks``) of one benchmark, each with a bootstrap CI.

    greedy: [Q] 0/1; samples: [Q, k] 0/1. Returns ``{"greedy": {...}, "avg@k": {...},
    "pass@j": {...}}`` where each value is ``{"mean", "lo", "hi"}`` as fractions in [0, 1]
    (see :func:`per_question_metrics` and :func:`bootstrap_ci`).
    """
    out = {}
    for name, values in per_question_metrics(greedy, samples, ks).items():
        mean, lo, hi = bootstrap_ci(values, n_boot=n_boot, alpha=alpha, seed=seed)
        out[name] = {"mean": mean, "lo": lo, "hi": hi}
    return out
