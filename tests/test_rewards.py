"""Tests of the verifiable rewards and the sandboxed, cached RewardScorer."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from creditlab.rewards import (
    RewardScorer,
    dapo_answer_score,
    extract_dapo_answer,
    extract_last_boxed,
    math_verify_score,
    normalize_dapo_answer,
    registry,
)
from creditlab.rewards.math_verify_reward import judge_math_verify

PATHOLOGICAL = "Let me compute. \\boxed{9^{9^{9^9}}}"


# ---------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{61}", "61"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last box wins
        ("\\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are content
        ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),  # unmatched escaped brace
        ("a\\\\{b} \\boxed{3\\\\}", "3\\\\"),  # \\ is a LaTeX line break, then a real closing brace
        ("\\boxed{}", ""),
        ("no box here: 61", None),
        ("\\boxed{61", None),  # never closed
        ("\\boxed{1} and \\boxed{\\frac{1}{2}", None),  # the last box is unbalanced
        ("\\boxed 61", None),
        ("", None),
    ],
)
def test_extract_last_boxed(text: str, expected: str | None) -> None:
    assert extract_last_boxed(text) == expected


def test_extract_dapo_answer_takes_last_answer_line_in_the_tail() -> None:
    assert extract_dapo_answer("Answer: 3\nwait\nanswer : 42\n") == "42"
    assert extract_dapo_answer("no answer line") is None
    assert extract_dapo_answer("Answer: 7" + " filler" * 100) is None  # beyond the last 300 chars


# ---------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    "response, gold",
    [
        ("\\boxed{61}", "61"),
        ("\\boxed{61.0}", "61"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\frac12}", "1/2"),
        ("\\boxed{-7}", "-7"),
        ("\\boxed{3\\sqrt{2}}", "\\sqrt{18}"),
        ("\\boxed{x=3}", "3"),
        ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}"),
        ("first \\boxed{5}, finally \\boxed{61}", "61"),
    ],
)
def test_math_verify_equivalent_answers_score_one(response: str, gold: str) -> None:
    assert math_verify_score(response, gold) == 1.0


@pytest.mark.parametrize(
    "response, gold",
    [
        ("\\boxed{62}", "61"),
        ("\\boxed{0.51}", "\\frac{1}{2}"),
        ("61", "61"),  # no box
        ("\\boxed{61", "61"),  # unbalanced
        ("\\boxed{61} then \\boxed{5}", "61"),  # only the last box counts
        ("\\boxed{}", "61"),
        ("\\boxed{x}", "61"),
    ],
)
def test_math_verify_wrong_answers_score_zero(response: str, gold: str) -> None:
    assert math_verify_score(response, gold) == 0.0


# Issue 21: math-verify's default tolerance (6 decimals for a float; evalf with chop elsewhere) paid all of these
# but the last two (kept: an expression with symbols and a matrix go through the same comparison).
NEAR_MISSES = [
    ("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2006!}"),
    ("\\boxed{0.0000002}", "0.0000001"),
    ("\\boxed{2^{-101}}", "2^{-100}"),
    ("\\boxed{10^{-401}}", "10^{-400}"),
    ("\\boxed{1.5000001}", "1.5"),
    ("\\boxed{0.1250001}", "\\frac{1}{8}"),
    ("\\boxed{0.3333331}", "\\frac{1}{3}"),  # 7 digits stated, the 7th wrong
    ("\\boxed{0.000000000999}", "\\frac{1}{3000000000}"),  # 6 decimals saw 0 == 0
    ("\\boxed{\\{\\frac{1}{2004!}, 1\\}}", "\\{\\frac{1}{2006!}, 1\\}"),
    ("\\boxed{[0, 0.5000001]}", "[0, \\frac{1}{2}]"),
    ("\\boxed{(\\frac{1}{2004!}, 1)}", "(\\frac{1}{2006!}, 1)"),
    ("\\boxed{\\frac{x}{2004!}}", "\\frac{x}{2006!}"),
    ("\\boxed{\\begin{pmatrix}2\\cdot 10^{-7}\\\\1\\end{pmatrix}}", "\\begin{pmatrix}10^{-7}\\\\1\\end{pmatrix}"),
]


@pytest.mark.parametrize("response, gold", NEAR_MISSES)
def test_math_verify_near_misses_score_zero(response: str, gold: str) -> None:
    assert math_verify_score(response, gold) == 0.0


EXACT_EQUIVALENTS = [
    ("\\boxed{1e308*10}", "10^{309}"),  # issue 21: "1e308" was read as 1 * e * 308 (Euler's e)
    ("\\boxed{1e309}", "10^{309}"),
    ("\\boxed{2.5e-3}", "\\frac{1}{400}"),
    ("\\boxed{602000000000000000000000}", "6.02\\times 10^{23}"),
    ("\\boxed{\\frac{1}{2006\\cdot 2005!}}", "\\frac{1}{2006!}"),
    ("\\boxed{4022030}", "\\frac{2006!}{2004!}"),
    ("\\boxed{0.333333}", "\\frac{1}{3}"),  # the gold's digits, rounded, at 6 significant digits
    ("\\boxed{0.666666}", "\\frac{2}{3}"),  # ... or cut
    ("\\boxed{3.141593}", "\\pi"),
    ("\\boxed{0.3}", "0.1+0.2"),  # decimals are exact, not binary doubles
    ("\\boxed{\\dfrac{1}{2}}", "0.5"),
    ("\\boxed{(3,4)\\cup(1,2)}", "(1,2)\\cup(3,4)"),
    ("\\boxed{[0, \\frac{1}{2}]}", "[0, 0.5]"),
    ("\\boxed{\\{\\frac{1}{2}, 1\\}}", "\\{0.5, 1\\}"),
    ("\\boxed{3x+2}", "2+3x"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{\\frac{\\sqrt{6}-\\sqrt{2}}{4}}", "\\sin\\frac{\\pi}{12}"),
]


@pytest.mark.parametrize("response, gold", EXACT_EQUIVALENTS)
def test_math_verify_exact_equivalents_score_one(response: str, gold: str) -> None:
    assert math_verify_score(response, gold) == 1.0


@pytest.mark.parametrize(
    "response, gold",
    [
        ("\\boxed{0.33}", "\\frac{1}{3}"),
        ("\\boxed{3.14}", "\\pi"),
        ("\\boxed{2.236070}", "\\sqrt{5}"),
        ("\\boxed{0.13}", "\\frac{1}{8}"),
        ("\\boxed{\\frac{1}{3}}", "0.3333"),
        ("\\boxed{0.333333x}", "\\frac{x}{3}"),
    ],
)
def test_math_verify_approximations_that_are_not_the_gold_score_zero(response: str, gold: str) -> None:
    """Too few digits, a stated trailing digit that is wrong (sqrt 5 = 2.2360680), a finite decimal gold
    (matched exactly), an exact answer to a decimal gold, a decimal inside an expression."""
    assert math_verify_score(response, gold) == 0.0


LABELLED = Path(__file__).parent / "fixtures" / "math_verify_labelled.jsonl"
KNOWN_MISJUDGED = {  # (gold, answer): what the parser reads differently, before and after issue 21
    ("50\\%", "50"),
    ("50\\%", "0.5"),
    ("100\\%", "1"),  # a boxed percentage parses as text
    ("5\\text{ m}", "5\\text{ cm}"),
    ("2\\text{ kg}", "2000\\text{ g}"),  # units are dropped
    ("-1", "i^2"),  # i is read as a symbol
    ("\\frac{\\sqrt{2}}{2}", "\\sin 45^\\circ"),  # the degree sign is dropped: sin(45)
    ("\\sqrt[3]{2+\\sqrt{5}}+\\sqrt[3]{2-\\sqrt{5}}", "1"),  # sympy's cube root of a negative is complex
}


def test_math_verify_labelled_set() -> None:
    """The labelled set of benchmarks/bench_math_verify.py: every pair judged as labelled, but the known
    parser limitations above (false-positive and false-negative rates: benchmarks/README.md)."""
    import json

    pairs = [json.loads(line) for line in LABELLED.read_text().splitlines() if line.strip()]
    assert len(pairs) >= 300 and {p["label"] for p in pairs} == {0, 1}
    assert {
        "near_miss",
        "factorial",
        "huge_power",
        "float_vs_fraction",
        "interval",
        "set",
        "units",
        "text",
        "equivalent",
    } <= {p["category"] for p in pairs}
    wrong = [
        (p["gold"], p["answer"], p["label"])
        for p in pairs
        if (p["gold"], p["answer"]) not in KNOWN_MISJUDGED
        and judge_math_verify(p["answer"], p["gold"], internal_timeout=5) != float(p["label"])
    ]
    assert wrong == []
    assert KNOWN_MISJUDGED <= {(p["gold"], p["answer"]) for p in pairs}


def test_exact_comparison_is_scoped_to_the_judge() -> None:
    """The reward swaps math-verify's numeric comparison only while it judges, and puts it back."""
    from math_verify import grader

    original = grader.sympy_numeric_eq
    assert judge_math_verify("0.0000002", "0.0000001") == 0.0
    assert grader.sympy_numeric_eq is original


def test_dapo_answer_reward_is_plus_minus_one() -> None:
    assert dapo_answer_score("work...\nAnswer: 61", "61") == 1.0
    assert dapo_answer_score("Answer: $\\frac{1}{2}$", "\\frac{1}{2}") == 1.0
    assert dapo_answer_score("Answer: 1,000 dollars", "1000") == 1.0  # units and separators
    assert dapo_answer_score("Answer: x = 5", "5") == 1.0  # right-hand side of '='
    assert dapo_answer_score("Answer: \\text{(B)}", "(B)") == 1.0
    assert dapo_answer_score("Answer: 62", "61") == -1.0
    assert dapo_answer_score("Answer: 0.5", "\\frac{1}{2}") == -1.0  # string match, not math
    assert dapo_answer_score("\\boxed{61}", "61") == -1.0  # no Answer: line


def test_normalize_dapo_answer() -> None:
    assert normalize_dapo_answer("\\frac12") == "\\frac{1}{2}"
    assert normalize_dapo_answer("\\sqrt2") == "\\sqrt{2}"
    assert normalize_dapo_answer("90^\\circ") == "90"
    assert normalize_dapo_answer("$12,345$") == "12345"


def test_rewards_are_registered() -> None:
    assert registry.get("math_verify") is math_verify_score
    assert registry.get("dapo_answer") is dapo_answer_score
    assert {"math_verify", "dapo_answer"} <= set(registry.names())
    with pytest.raises(KeyError, match="valid choices"):
        registry.get("nope")


# ---------------------------------------------------------------------------- scorer


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer("math_verify", timeout_s=2.0) as s:
        yield s


def test_scorer_matches_direct_scores(scorer: RewardScorer) -> None:
    responses = ["\\boxed{61}", "\\boxed{61.0}", "\\boxed{0.5}", "\\boxed{62}", "none", "\\boxed{1/3}"]
    golds = ["61", "61", "\\frac{1}{2}", "61", "61", "\\frac{1}{3}"]
    assert scorer.score(responses, golds) == [math_verify_score(r, g) for r, g in zip(responses, golds)]
    assert scorer.score([], []) == []
    with pytest.raises(ValueError):
        scorer.score(["a"], [])


def test_pathological_sample_times_out_without_blocking_the_batch(scorer: RewardScorer) -> None:
    before = scorer.stats
    responses = ["\\boxed{61}", PATHOLOGICAL, "\\boxed{\\frac{1}{2}}", "\\boxed{7}", "\\boxed{8}"]
    golds = ["61", "61", "0.5", "8", "8"]
    scores = scorer.score(responses, golds)  # bounded by the scorer's hard kill (and this test's pytest timeout)
    assert scores == [1.0, 0.0, 1.0, 0.0, 1.0]
    after = scorer.stats
    assert after["n_timeouts"] == before["n_timeouts"] + 1
    assert after["n_worker_restarts"] == before["n_worker_restarts"] + 1
    # The fresh worker keeps scoring; the timed-out answer is remembered, not re-run.
    assert scorer.score([PATHOLOGICAL, "\\boxed{5}"], ["61", "5"]) == [0.0, 1.0]
    assert scorer.stats["n_timeouts"] == after["n_timeouts"]  # from the cache: no second timeout


def test_cache_hits_are_counted_and_cache_off_judges_everything(tmp_path: Path) -> None:
    responses = ["\\boxed{61}", "so \\boxed{61}", "\\boxed{62}", "\\boxed{61}", "nothing"]
    golds = ["61"] * 5
    with RewardScorer("math_verify", timeout_s=5.0) as s:
        assert s.score(responses, golds) == [1.0, 1.0, 0.0, 1.0, 0.0]
        st = s.stats
        assert (st["n_scored"], st["n_judged"], st["n_cache_hits"], st["n_no_answer"]) == (5, 2, 2, 1)
        s.score(responses, golds)
        st = s.stats
        assert (st["n_scored"], st["n_judged"], st["n_cache_hits"]) == (10, 2, 6)
    with RewardScorer("math_verify", timeout_s=5.0, cache=False) as s:
        assert s.score(responses, golds) == [1.0, 1.0, 0.0, 1.0, 0.0]
        assert (s.stats["n_judged"], s.stats["n_cache_hits"]) == (4, 0)


def test_persisted_cache_is_reused_by_a_new_scorer(tmp_path: Path) -> None:
    path = tmp_path / "reward_cache.sqlite"
    responses, golds = ["\\boxed{61}", "\\boxed{0.5}", "\\boxed{3}"], ["61", "\\frac{1}{2}", "4"]
    with RewardScorer("math_verify", cache_path=path) as s:
        first = s.score(responses, golds)
        assert s.stats["n_judged"] == 3
    with RewardScorer("math_verify", cache_path=path) as s:
        assert s.score(responses, golds) == first == [1.0, 1.0, 0.0]
        assert (s.stats["n_judged"], s.stats["n_cache_hits"]) == (0, 3)
    # Entries are keyed by reward: the DAPO reward does not read math-verify's verdicts.
    with RewardScorer("dapo_answer", cache_path=path) as s:
        assert s.score(["Answer: 61"], ["61"]) == [1.0]
        assert s.stats["n_judged"] == 1


def test_dapo_scorer_failure_value_is_minus_one() -> None:
    with RewardScorer("dapo_answer", timeout_s=2.0) as s:
        assert s.score(["Answer: 61", "Answer: 60", "no line"], ["61", "61", "61"]) == [1.0, -1.0, -1.0]
        assert s.spec.failure == -1.0


def test_crashed_worker_is_replaced_and_sample_scored_wrong(scorer: RewardScorer) -> None:
    before = scorer.stats
    victim = scorer._workers[0]
    victim.process.kill()  # the worker dies while idle: the next sample must not be blamed
    victim.process.join()
    assert scorer.score(["\\boxed{2}"], ["2"]) == [1.0]

    # Kill the worker mid-sample (from a timer thread) while it judges a slow answer.
    def kill_busy_worker() -> None:
        deadline = time.monotonic() + scorer.timeout_s / 2
        while time.monotonic() < deadline and scorer._workers[0].state != "busy":
            time.sleep(0.005)
        scorer._workers[0].process.kill()

    killer = threading.Thread(target=kill_busy_worker)
    killer.start()
    scores = scorer.score([PATHOLOGICAL, "\\boxed{4}"], ["3", "4"])
    killer.join()
    assert scores == [0.0, 1.0]
    after = scorer.stats
    assert after["n_crashes"] == before["n_crashes"] + 1
    assert after["n_timeouts"] == before["n_timeouts"]
    assert after["n_worker_restarts"] == before["n_worker_restarts"] + 2


def test_unknown_reward_and_bad_arguments() -> None:
    with pytest.raises(KeyError, match="valid choices"):
        RewardScorer("nope")
    with pytest.raises(ValueError):
        RewardScorer(timeout_s=0)


def test_persisted_cache_takes_lone_surrogates(tmp_path: Path) -> None:
    """Issue 21: a response holding a lone surrogate raised UnicodeEncodeError in the SQLite cache."""
    path = tmp_path / "reward_cache.sqlite"
    responses, golds = ["\\boxed{\ud800}", "\\boxed{3}"], ["3", "3\ud800"]
    with RewardScorer("math_verify", cache_path=path) as s:
        first = s.score(responses, golds)
        assert s.stats["n_judged"] == 2
    with RewardScorer("math_verify", cache_path=path) as s:
        assert s.score(responses, golds) == first
        assert (s.stats["n_judged"], s.stats["n_cache_hits"]) == (0, 2)  # read back from disk
    # A surrogate key never meets the text that spells it with a backslash ("\\ud800", 6 characters).
    with RewardScorer("dapo_answer", cache_path=path) as s:
        assert s.score(["Answer: \ud800"], ["\ud800"]) == [1.0]
    with RewardScorer("dapo_answer", cache_path=path) as s:
        assert s.score(["Answer: \\ud800", "Answer: \ud800"], ["\ud800", "\ud800"]) == [-1.0, 1.0]
        assert (s.stats["n_judged"], s.stats["n_cache_hits"]) == (1, 1)


def test_memory_cache_bound_empties_the_cache() -> None:
    with RewardScorer("dapo_answer", timeout_s=5.0, max_cached=2) as s:
        first = ["Answer: 1", "Answer: 2"]
        assert s.score(first, ["1", "1"]) == [1.0, -1.0]
        assert s.score(first, ["1", "1"]) == [1.0, -1.0]
        assert s.stats["n_judged"] == 2  # both cached
        assert s.score(["Answer: 3"], ["1"]) == [-1.0]  # 3 pairs > 2: the cache was emptied first
        assert s.score(first, ["1", "1"]) == [1.0, -1.0]
        assert s.stats["n_judged"] == 5


# ---------------------------------------------------------------------------- threads and the reward service


def _on_threads(fn, args: list[tuple]) -> list[object]:
    """``fn(*a)`` for every ``a`` on its own thread, all at once; an exception is returned as its value."""
    out: list[object] = [None] * len(args)

    def run(i: int) -> None:
        try:
            out[i] = fn(*args[i])
        except Exception as err:  # noqa: BLE001 - reported by the caller's assertion
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_math_verify_score_is_correct_off_the_main_thread() -> None:
    """Issue 28: math-verify's signal.alarm timeout raised ValueError on any thread but the main one."""
    pairs = [("so \\boxed{2}", "2"), ("so \\boxed{3}", "2"), ("\\boxed{\\frac{1}{2}}", "0.5")]
    assert _on_threads(math_verify_score, pairs) == [1.0, 0.0, 1.0]


@pytest.mark.timeout(300)
def test_reward_service_scores_concurrent_callers_and_times_out_a_hostile_answer() -> None:
    from creditlab.rewards import RewardService

    service = RewardService("math_verify", timeout_s=2.0, n_workers=1)
    try:
        pairs = [("\\boxed{61}", "61"), (PATHOLOGICAL, "61"), ("\\boxed{62}", "61"), ("\\boxed{0.5}", "\\frac{1}{2}")]
        pairs += [("no box", "61"), ("\\boxed{61}", "61")]
        got = _on_threads(service.score_one, pairs)  # bounded by the scorer's hard kill (and this pytest timeout)
        assert got == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        assert service.stats["n_timeouts"] == 1
        assert service.score([], []) == []
        with pytest.raises(ValueError):
            service.score(["a"], [])
        assert service.score(["\\boxed{7}", PATHOLOGICAL], ["7", "61"]) == [1.0, 0.0]  # a fresh worker; cached
    finally:
        service.close()
    service.close()  # idempotent
    assert service.closed
    with pytest.raises(RuntimeError, match="closed"):
        service.score_one("\\boxed{1}", "1")


@pytest.mark.timeout(300)
def test_reward_service_is_one_per_process_and_key() -> None:
    from creditlab.rewards import reward_service
    from creditlab.rewards.service import close_services

    first = reward_service("dapo_answer", timeout_s=3.0, n_workers=1)
    assert reward_service("dapo_answer", timeout_s=3.0, n_workers=1) is first
    assert _on_threads(first.score_one, [("Answer: 5", "5"), ("Answer: 4", "5")]) == [1.0, -1.0]  # DAPO's values
    close_services()
    assert first.closed
    second = reward_service("dapo_answer", timeout_s=3.0, n_workers=1)
    assert second is not first and second.score_one("Answer: 5", "5") == 1.0
    close_services()
