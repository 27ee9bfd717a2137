"""The tiny world's transfer formats: a code task checked by execution and a multiple-choice suite.

They stand in for the papers' non-math benchmarks (code generation / LiveCodeBench v6, GPQA-Diamond,
MMLU-Pro) at tiny scale, judged by the same verifiers as at paper scale (:mod:`creditlab.rewards.routing`
routes the sources below: ``tiny_code`` -> ``code_exec``, ``tiny_choice`` -> ``multiple_choice``). The
tiny models see these formats only in the SFT warm-up (the data config's ``warmup_extra``); RL trains on
arithmetic, so the suites measure what RL on arithmetic does to them (transfer).

**Code** (source :data:`CODE_SOURCE`) [ours]: infer a linear function from two of its values and write it
as Python. Question ``code f: f(3)=29 f(4)=36``; solution ``36-29=7 3*7=21 29-21=8`` (the slope, then the
intercept, in the arithmetic task's step format) followed by a fenced block::

    ```python
    f=lambda x:7*x+8
    ```

The answer is the LiveCodeBench-format test spec (JSON) that :func:`creditlab.rewards.code.cases.parse_tests`
reads: ``functional`` tests calling ``f`` on held-out inputs, with a short per-test time limit. Any
program that computes the function passes (the tests never see the solution's text).

**Multiple choice** (source :data:`CHOICE_SOURCE`) [ours]: an arithmetic problem of the main task with
``n_options`` numeric options (the answer and near misses: answer + offsets from :data:`CHOICE_OFFSETS`),
shuffled by :func:`creditlab.rewards.multiple_choice.shuffle_options` (per question id, the paper-scale
rule) and rendered by :func:`~creditlab.rewards.multiple_choice.render_mc_question`; the answer is the
correct letter, the solution the problem's steps then ``\\boxed{letter}``.

Not learnt by the tiny models yet (measured, tiny-s, 400k parameters, 900-step warm-up with the default
``warmup_extra``, 200 questions per suite, greedy): 0.27 on ``choice4`` and 0.085 on ``choice10``, chance level,
while the value is computed right on 55% of the ``choice4`` questions: the value -> letter lookup is what fails.
The model answers mostly one or two letters (choice4: B 130, C 69, A 1 of 200). Two other layouts did no better:
options written value first, ``118 (C)``, with the letter after the value in the solution (its own 900-step
warm-up): 0.26 / 0.105 (choice4: B 156 of 200); that model trained 300 more steps on the MC
records alone: 0.23 / 0.10; consecutive options with the letter glued to the value, ``118C``, 300 MC-only steps
from the same model: 0.265 / 0.115. So the tiny OOD (multiple-choice) cells are chance-level numbers until a task
or model the tiny world learns is found; the code task is learnt (greedy 0.72-0.87 after the same warm-up).

Uniqueness and leakage: every record has a problem key (:func:`problem_key`): an MC record's arithmetic
expression (shared with the arithmetic task, so an MC suite problem never appears in arithmetic training
and vice versa), a code record's question (its function and shown points). Only 8 x 99 functions exist with
the default knobs, so a suite's function may be trained on with other points [ours: what is held out is the
inference from those two values; keying on the function alone would leave too few SFT examples].
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from creditlab.data.schema import boxed, make_record
from creditlab.data.synthetic import (
    DEFAULT_MAX_VALUE,
    DEFAULT_OPS,
    _inclusive,
    _unique_draws,
    canonical_question,
    count_problems,
    generate_problem,
)
from creditlab.rewards.multiple_choice import render_mc_question, shuffle_options

CODE_SOURCE = "tiny_code"
"""``source`` of the code records (routed to ``code_exec``)."""
CHOICE_SOURCE = "tiny_choice"
"""``source`` of the multiple-choice records (routed to ``multiple_choice``)."""

CODE_FUNC = "f"
"""Name of the function a code solution defines (the functional tests' ``func_name``)."""
CODE_TEST_INPUTS = 100
"""Test inputs are distinct integers in ``[0, CODE_TEST_INPUTS)`` other than the two shown points."""
CHOICE_OFFSETS: tuple[int, ...] = (-100, -30, -20, -11, -10, -9, -5, -3, -2, -1, 1, 2, 3, 5, 9, 10, 11, 20, 30, 100)
"""Distractor = answer + one of these (distinct, non-negative) [ours: off-by-one, carry and digit slips]; ten are
positive, so 10 options always exist."""
MAX_OPTIONS = sum(d > 0 for d in CHOICE_OFFSETS) + 1


def problem_key(rec: Mapping[str, Any]) -> str:
    """Canonical key of a record's underlying problem (uniqueness and overlap checks): ``meta.problem`` when the
    record has one (MC: its arithmetic expression), else the question (arithmetic, code)."""
    meta = rec.get("meta") or {}
    return canonical_question(str(meta.get("problem", rec["question"])))


# --- code -----------------------------------------------------------------------------------------------------


def code_solution(at: int, slope: int, intercept: int) -> tuple[str, str]:
    """(question, solution) of the function ``slope*x+intercept`` shown at ``at`` and ``at+1``."""
    y1, y2 = slope * at + intercept, slope * (at + 1) + intercept
    question = f"code f: f({at})={y1} f({at + 1})={y2}"
    steps = f"{y2}-{y1}={slope} {at}*{slope}={at * slope} {y1}-{at * slope}={intercept}"
    return question, f"{steps} ```python\n{CODE_FUNC}=lambda x:{slope}*x+{intercept}\n```"


def code_tests(slope: int, intercept: int, xs: Iterable[int], time_limit_s: float) -> str:
    """The gold test spec (JSON, LiveCodeBench's functional format) of ``slope*x+intercept`` on ``xs``."""
    tests = [
        {"input": json.dumps(int(x)), "output": json.dumps(slope * int(x) + intercept), "testtype": "functional"}
        for x in xs
    ]
    return json.dumps({"func_name": CODE_FUNC, "tests": tests, "time_limit_s": float(time_limit_s)}, sort_keys=True)


def generate_code_split(
    seed: int,
    n: int,
    at: Sequence[int],
    slope: Sequence[int],
    intercept: Sequence[int],
    n_tests: int,
    time_limit_s: float,
    exclude: Iterable[str] = frozenset(),
    *,
    split: str = "train",
) -> list[dict[str, Any]]:
    """``n`` code records with distinct questions (shown points and function), none in ``exclude``.

    ``at`` / ``slope`` / ``intercept``: inclusive ranges of the first shown point (>= 0), the slope (2-9: a
    single-digit ``*`` operand, as in the arithmetic task) and the intercept (>= 1); ``n_tests`` held-out test
    inputs, ``time_limit_s`` per test (code_exec's limit). Ids ``"tiny_code/{split}/{i:06d}"``.
    """
    at_lo, at_hi = _inclusive(at, "at")
    a_lo, a_hi = _inclusive(slope, "slope")
    b_lo, b_hi = _inclusive(intercept, "intercept")
    if at_lo < 0 or a_lo < 2 or a_hi > 9 or b_lo < 1:
        raise ValueError(
            f"code knobs out of range: at {[at_lo, at_hi]} (>= 0), slope {[a_lo, a_hi]} (2-9), "
            f"intercept {[b_lo, b_hi]} (>= 1)"
        )
    if not 1 <= n_tests <= CODE_TEST_INPUTS - 2 or time_limit_s <= 0:
        raise ValueError(
            f"tests must be in [1, {CODE_TEST_INPUTS - 2}] and time_limit_s > 0, got {n_tests}, {time_limit_s}"
        )
    rng = np.random.default_rng(seed)

    def draw() -> tuple[str, tuple[int, int, int, list[int]]]:
        x0 = int(rng.integers(at_lo, at_hi + 1))
        a, b = int(rng.integers(a_lo, a_hi + 1)), int(rng.integers(b_lo, b_hi + 1))
        pool = [x for x in range(CODE_TEST_INPUTS) if x not in (x0, x0 + 1)]
        xs = sorted(int(pool[i]) for i in rng.choice(len(pool), n_tests, replace=False))
        return code_solution(x0, a, b)[0], (x0, a, b, xs)

    available = (at_hi - at_lo + 1) * (a_hi - a_lo + 1) * (b_hi - b_lo + 1)
    knobs = f"at in [{at_lo}, {at_hi}], slope in [{a_lo}, {a_hi}], intercept in [{b_lo}, {b_hi}]"
    records = []
    for i, (x0, a, b, xs) in enumerate(_unique_draws(n, draw, exclude, split=split, available=available, knobs=knobs)):
        question, solution = code_solution(x0, a, b)
        records.append(
            make_record(
                id=f"{CODE_SOURCE}/{split}/{i:06d}",
                source=CODE_SOURCE,
                split=split,
                question=question,
                answer=code_tests(a, b, xs, time_limit_s),
                solution=solution,
                meta={"at": x0, "slope": a, "intercept": b, "n_tests": n_tests},
            )
        )
    return records


# --- multiple choice ------------------------------------------------------------------------------------------


def choice_options(rng: np.random.Generator, answer: int, n_options: int) -> list[str]:
    """``[answer, distractor, ...]``: ``n_options - 1`` distinct non-negative near misses, in offset order."""
    if not 2 <= n_options <= MAX_OPTIONS:
        raise ValueError(f"n_options must be in [2, {MAX_OPTIONS}], got {n_options}")
    offsets = [d for d in CHOICE_OFFSETS if answer + d >= 0]
    picks = sorted(int(i) for i in rng.choice(len(offsets), n_options - 1, replace=False))
    return [str(answer)] + [str(answer + offsets[i]) for i in picks]


def generate_choice_split(
    seed: int,
    n: int,
    n_ops_range: Sequence[int],
    digits_range: Sequence[int],
    options: int | Sequence[int],
    exclude: Iterable[str] = frozenset(),
    *,
    split: str = "train",
    ops: Sequence[str] = DEFAULT_OPS,
    max_value: int = DEFAULT_MAX_VALUE,
) -> list[dict[str, Any]]:
    """``n`` multiple-choice records over distinct arithmetic problems (keys: the expressions), none in
    ``exclude``. ``options``: the option count, or a list to draw it from per problem. The options are shuffled
    by :func:`shuffle_options` seeded with ``seed`` and the record id. Ids ``"tiny_choice/{split}/{i:06d}"``."""
    counts = [int(options)] if isinstance(options, int) else [int(k) for k in options]
    if not counts or any(not 2 <= k <= MAX_OPTIONS for k in counts):
        raise ValueError(f"options must be counts in [2, {MAX_OPTIONS}], got {options}")
    n_lo, n_hi = _inclusive(n_ops_range, "n_ops_range")
    d_lo, d_hi = _inclusive(digits_range, "digits_range")
    available = sum(count_problems(k, d_hi, ops, max_value) for k in range(n_lo, n_hi + 1))
    rng = np.random.default_rng(seed)

    def draw() -> tuple[str, tuple]:
        n_ops, digits = int(rng.integers(n_lo, n_hi + 1)), int(rng.integers(d_lo, d_hi + 1))
        expr, answer, solution = generate_problem(rng, n_ops, digits, ops, max_value)
        k = counts[int(rng.integers(len(counts)))]
        return expr, (n_ops, digits, expr, solution, choice_options(rng, int(answer), k))

    knobs = f"n_ops in [{n_lo}, {n_hi}], digits in [{d_lo}, {d_hi}], ops={list(ops)}, max_value={max_value}"
    records = []
    for i, (n_ops, digits, expr, solution, opts) in enumerate(
        _unique_draws(n, draw, exclude, split=split, available=available, knobs=knobs)
    ):
        rid = f"{CHOICE_SOURCE}/{split}/{i:06d}"
        shuffled, letter = shuffle_options(opts, 0, seed, rid)
        steps = solution[: solution.rindex(boxed(opts[0]))]  # the arithmetic steps, then the letter
        records.append(
            make_record(
                id=rid,
                source=CHOICE_SOURCE,
                split=split,
                question=render_mc_question(expr, shuffled),
                answer=letter,
                solution=steps + boxed(letter),
                meta={
                    "problem": expr,
                    "value": opts[0],
                    "n_options": len(opts),
                    "n_ops": n_ops,
                    "digits": digits,
                    "max_value": max_value,
                },
            )
        )
    return records
