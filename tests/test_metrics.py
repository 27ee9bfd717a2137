"""Tests of creditlab.eval.metrics against direct readings of the formulas and brute force."""

from __future__ import annotations

import itertools
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from creditlab.eval.metrics import avg_at_k, greedy_accuracy, summarize_suite
from creditlab.stats import bootstrap_average, bootstrap_ci, pass_at_k, pass_at_k_per_question


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c of them correct) holding at least one correct one."""
    labels = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(labels[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_matches_brute_force_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_matches_binomial_formula_for_larger_n() -> None:
    for n, c, k in [(64, 3, 8), (100, 50, 10), (256, 1, 32), (16, 0, 4), (16, 16, 4)]:
        direct = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(direct, rel=1e-12, abs=1e-12)


def test_pass_at_1_is_fraction_correct() -> None:
    for n in (1, 4, 7, 32):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    value = pass_at_k(10_000, 1, 5_000)  # C(n, k) overflows floats; the product form does not
    assert value == pytest.approx(0.5, abs=1e-9)


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 5, 2), (-1, 0, 1), (4, -1, 1), (4, 1, -2), (4, 1, 0), (4.5, 1, 1)])
def test_pass_at_k_rejects_invalid_arguments(n, c, k) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k_and_greedy_accuracy() -> None:
    correct = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert avg_at_k(correct) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert greedy_accuracy([1, 0, 1, 1]) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        avg_at_k(np.zeros((3,)))


def test_bootstrap_ci_contains_mean_and_shrinks_with_more_questions() -> None:
    rng = np.random.default_rng(1)
    small = (rng.random(50) < 0.4).astype(float)
    large = (rng.random(5000) < 0.4).astype(float)
    mean_few, lo_few, hi_few = bootstrap_ci(small, n_boot=1000, seed=0)
    mean_many, lo_many, hi_many = bootstrap_ci(large, n_boot=1000, seed=0)
    assert mean_few == pytest.approx(small.mean()) and mean_many == pytest.approx(large.mean())
    assert lo_few <= mean_few <= hi_few and lo_many <= mean_many <= hi_many  # accuracies, not times
    assert (hi_many - lo_many) < 0.3 * (hi_few - lo_few)  # width ~ 1/sqrt(Q): 10x more questions -> ~3.2x narrower
    # The half-width matches the normal approximation 1.96 * sd / sqrt(Q) for large Q.
    expected_half = 1.96 * large.std() / np.sqrt(len(large))
    assert (hi_many - lo_many) / 2 == pytest.approx(expected_half, rel=0.15)


def test_bootstrap_ci_is_deterministic_and_degenerate_for_constant_data() -> None:
    x = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    assert bootstrap_ci(x, seed=3) == bootstrap_ci(x, seed=3)
    assert bootstrap_ci(np.ones(7)) == (1.0, 1.0, 1.0)


def test_bootstrap_average_plain_vs_count_weighting() -> None:
    # Suite A: 10 questions, all correct; suite B: 90 questions, none correct.
    a, b = np.ones(10), np.zeros(90)
    plain = bootstrap_average([a, b], weighting="plain", n_boot=500)
    count = bootstrap_average([a, b], weighting="count", n_boot=500)
    assert plain[0] == pytest.approx(0.5)  # (1.0 + 0.0) / 2
    assert count[0] == pytest.approx(0.1)  # (10 * 1.0 + 90 * 0.0) / 100
    # Within-suite resampling of constant suites cannot move either average.
    assert plain[1:] == pytest.approx((0.5, 0.5)) and count[1:] == pytest.approx((0.1, 0.1))


def test_bootstrap_average_count_weighting_equals_pooled_mean_and_ci_brackets_it() -> None:
    rng = np.random.default_rng(0)
    suites = [(rng.random(q) < p).astype(float) for q, p in [(30, 0.2), (200, 0.7), (60, 0.5)]]
    mean, lo, hi = bootstrap_average(suites, weighting="count", n_boot=1000)
    assert mean == pytest.approx(np.concatenate(suites).mean())
    assert lo < mean < hi
    plain_mean, p_lo, p_hi = bootstrap_average(suites, weighting="plain", n_boot=1000)
    assert plain_mean == pytest.approx(np.mean([s.mean() for s in suites]))
    assert p_lo < plain_mean < p_hi
    with pytest.raises(ValueError):
        bootstrap_average(suites, weighting="bogus")  # type: ignore[arg-type]


def test_summarize_suite_keys_values_and_fractions() -> None:
    greedy = np.array([1, 0, 1, 1])
    samples = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]])
    out = summarize_suite(greedy, samples, ks=[1, 2, 4], n_boot=200)
    assert set(out) == {"greedy", "avg@4", "pass@1", "pass@2", "pass@4"}
    assert out["greedy"]["mean"] == pytest.approx(0.75)
    assert out["avg@4"]["mean"] == pytest.approx(samples.mean())
    assert out["pass@1"]["mean"] == pytest.approx(samples.mean())
    expected_p2 = np.mean([brute_force_pass_at_k(4, int(c), 2) for c in samples.sum(1)])
    assert out["pass@2"]["mean"] == pytest.approx(expected_p2)
    assert out["pass@4"]["mean"] == pytest.approx(0.75)  # any correct among all 4
    for stats in out.values():
        assert set(stats) == {"mean", "lo", "hi"}
        assert 0.0 <= stats["lo"] <= stats["mean"] <= stats["hi"] <= 1.0


def test_pass_at_k_per_question_vector() -> None:
    np.testing.assert_allclose(pass_at_k_per_question(4, [0, 1, 4], 2), [0.0, 0.5, 1.0])
