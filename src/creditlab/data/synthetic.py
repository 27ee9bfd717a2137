"""Synthetic verifiable arithmetic, the task of the tiny world.

A problem is a chain of ``n_ops`` binary operations applied to a running value, e.g.
``(23+45-7)*3`` with the step-by-step solution ``23+45=68 68-7=61 61*3=183 \\boxed{183}``.

Conventions (chosen so that the task is unambiguous, verifiable and learnable by a tiny model):

- **Evaluation order.** The chain is evaluated left to right. The question string is written so
  that ordinary operator precedence gives the same value: whenever ``*`` follows a ``+`` or ``-``,
  the expression so far is wrapped in parentheses (``(5+3)*2``, never ``5+3*2``). Any standard
  math parser (or math-verify) therefore agrees with the gold answer.
- **Operands.** The first operand and every ``+``/``-`` operand are integers in
  ``[1, 10**digits - 1]`` (``digits`` is the *maximum* operand length); a ``*`` operand is a single
  digit in ``[2, 9]``.
- **Range.** Every intermediate value and the answer stay in ``[0, max_value]`` (default 999):
  answers are non-negative integers of at most three digits by default. At each step the
  operation is drawn uniformly among those in ``ops`` that admit at least one operand keeping the
  value in range, then the operand uniformly among those admissible. ``ops`` must contain ``+`` and
  ``-`` so that some operation is always admissible.
- **Solution.** Every step is written out as ``a<op>b=c``, steps separated by single spaces, then
  `` \\boxed{answer}``.

Everything is deterministic given the seed (numpy ``Generator``). Records are unique by their
canonical question string (:func:`canonical_question`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from creditlab.data.schema import boxed, make_record

DEFAULT_OPS: tuple[str, ...] = ("+", "-", "*")
DEFAULT_MAX_VALUE = 999
MUL_OPERANDS: tuple[int, int] = (2, 9)
"""Inclusive range of the single-digit ``*`` operand."""

_KNOWN_OPS = frozenset(DEFAULT_OPS)


def canonical_question(question: str) -> str:
    """Canonical form of a question used for uniqueness and overlap checks (whitespace removed)."""
    return "".join(question.split())


def _check_knobs(n_ops: int, digits: int, ops: Sequence[str], max_value: int) -> None:
    """Raise ValueError for knob values outside the supported domain."""
    if n_ops < 1:
        raise ValueError(f"n_ops must be >= 1, got {n_ops}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if max_value < 2:
        raise ValueError(f"max_value must be >= 2, got {max_value}")
    unknown = sorted(set(ops) - _KNOWN_OPS)
    if unknown:
        raise ValueError(f"unknown operator(s) {unknown}; valid: {sorted(_KNOWN_OPS)}")
    if "+" not in ops or "-" not in ops:
        raise ValueError(f"ops must contain '+' and '-', got {list(ops)}")


def operand_range(value: int, op: str, digits: int, max_value: int) -> tuple[int, int]:
    """Inclusive range of operands for ``value <op> x`` that keep the result in ``[0, max_value]``.

    The range is empty when ``lo > hi``.
    """
    top = 10**digits - 1
    if op == "+":
        return 1, min(top, max_value - value)
    if op == "-":
        return 1, min(top, value)
    if op == "*":
        lo, hi = MUL_OPERANDS
        return lo, hi if value == 0 else min(hi, max_value // value)
    raise ValueError(f"unknown operator {op!r}")


def apply_op(value: int, op: str, operand: int) -> int:
    """Apply one binary operation."""
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    raise ValueError(f"unknown operator {op!r}")


def _admissible_ops(value: int, digits: int, ops: Sequence[str], max_value: int) -> list[str]:
    """Operators in ``ops`` with at least one operand keeping the value in range."""
    admissible = []
    for op in ops:
        lo, hi = operand_range(value, op, digits, max_value)
        if lo <= hi:
            admissible.append(op)
    return admissible


def _append_op(expr: str, last_op: str | None, op: str, operand: int) -> str:
    """Extend the question string, parenthesising so precedence matches left-to-right order."""
    if op == "*" and last_op in ("+", "-"):
        expr = f"({expr})"
    return f"{expr}{op}{operand}"


def generate_problem(
    rng: np.random.Generator,
    n_ops: int,
    digits: int,
    ops: Sequence[str] = DEFAULT_OPS,
    max_value: int = DEFAULT_MAX_VALUE,
) -> tuple[str, str, str]:
    """Draw one problem and return ``(question, answer, solution)``.

    Example: ``("(23+45-7)*3", "183", "23+45=68 68-7=61 61*3=183 \\boxed{183}")``.
    See the module docstring for the conventions.
    """
    _check_knobs(n_ops, digits, ops, max_value)
    value = int(rng.integers(1, min(10**digits - 1, max_value) + 1))
    expr, last_op, steps = str(value), None, []
    for _ in range(n_ops):
        candidates = _admissible_ops(value, digits, ops, max_value)
        op = candidates[int(rng.integers(len(candidates)))]
        lo, hi = operand_range(value, op, digits, max_value)
        operand = int(rng.integers(lo, hi + 1))
        result = apply_op(value, op, operand)
        steps.append(f"{value}{op}{operand}={result}")
        expr, last_op, value = _append_op(expr, last_op, op, operand), op, result
    answer = str(value)
    return expr, answer, " ".join(steps) + " " + boxed(answer)


def count_problems(
    n_ops: int,
    digits: int,
    ops: Sequence[str] = DEFAULT_OPS,
    max_value: int = DEFAULT_MAX_VALUE,
) -> int:
    """Exact number of distinct questions :func:`generate_problem` can produce for these knobs.

    Questions correspond one-to-one to operand/operator sequences, so this counts the admissible
    sequences with a dynamic programme over the running value.
    """
    _check_knobs(n_ops, digits, ops, max_value)
    counts = [0] * (max_value + 1)
    for v in range(1, min(10**digits - 1, max_value) + 1):
        counts[v] = 1
    for _ in range(n_ops):
        nxt = [0] * (max_value + 1)
        for value, count in enumerate(counts):
            if not count:
                continue
            for op in ops:
                lo, hi = operand_range(value, op, digits, max_value)
                for operand in range(lo, hi + 1):
                    nxt[apply_op(value, op, operand)] += count
        counts = nxt
    return sum(counts)


def _inclusive(bounds: Sequence[int], name: str) -> tuple[int, int]:
    """Validate a ``[lo, hi]`` knob range."""
    if len(bounds) != 2 or int(bounds[0]) > int(bounds[1]):
        raise ValueError(f"{name} must be [lo, hi] with lo <= hi, got {list(bounds)}")
    return int(bounds[0]), int(bounds[1])


def _unique_draws(
    n: int,
    draw: Callable[[], tuple[str, Any]],
    exclude: Iterable[str],
    *,
    split: str,
    available: int,
    knobs: str,
) -> list[Any]:
    """``n`` items from ``draw()`` (which returns ``(key, item)``) with unique keys, none of them in ``exclude``.

    Keys are compared canonically (:func:`canonical_question`). Duplicates and excluded keys are redrawn.

    Raises:
        ValueError: if fewer than ``n`` distinct problems exist (``available``), or if the generator stalls
            (the unexcluded part of the space is too small for ``n``); ``knobs`` describes the space.
    """
    if n > available:
        raise ValueError(
            f"cannot draw {n} unique problems for split {split!r}: only {available} exist with {knobs}; "
            f"lower n or widen the ranges"
        )
    taken = {canonical_question(q) for q in exclude}
    items: list[Any] = []
    max_stall, stall = max(10_000, 50 * n), 0
    while len(items) < n:
        if stall >= max_stall:
            raise ValueError(
                f"split {split!r}: found only {len(items)} of {n} unique problems, then {max_stall} draws in a "
                f"row gave no new one ({knobs}: {available} problems exist, {len(taken)} are excluded or taken); "
                f"lower n, widen the ranges or exclude less"
            )
        key, item = draw()
        key = canonical_question(key)
        if key in taken:
            stall += 1
            continue
        stall = 0
        taken.add(key)
        items.append(item)
    return items


def draw_chains(
    seed: int,
    n: int,
    n_ops_range: Sequence[int],
    digits_range: Sequence[int],
    exclude: Iterable[str],
    make: Callable[[np.random.Generator, int, int], tuple[str, Any]],
    *,
    split: str,
    ops: Sequence[str],
    max_value: int,
) -> list[tuple[int, int, Any]]:
    """``n`` problems of unique questions (none in ``exclude``): per draw ``n_ops`` and ``digits`` uniform in their
    inclusive ranges, then ``make(rng, n_ops, digits) -> (question, problem)``. Returns (n_ops, digits, problem) per
    problem. The space's size is bounded by :func:`count_problems` (ValueError as :func:`_unique_draws`)."""
    n_lo, n_hi = _inclusive(n_ops_range, "n_ops_range")
    d_lo, d_hi = _inclusive(digits_range, "digits_range")
    available = sum(count_problems(k, d_hi, ops, max_value) for k in range(n_lo, n_hi + 1))
    rng = np.random.default_rng(seed)

    def draw() -> tuple[str, tuple]:
        n_ops = int(rng.integers(n_lo, n_hi + 1))
        digits = int(rng.integers(d_lo, d_hi + 1))
        question, problem = make(rng, n_ops, digits)
        return question, (n_ops, digits, problem)

    knobs = f"n_ops in [{n_lo}, {n_hi}], digits in [{d_lo}, {d_hi}], ops={list(ops)}, max_value={max_value}"
    return _unique_draws(n, draw, exclude, split=split, available=available, knobs=knobs)


def generate_split(
    seed: int,
    n: int,
    n_ops_range: Sequence[int],
    digits_range: Sequence[int],
    exclude: Iterable[str] = frozenset(),
    *,
    source: str = "tiny_arith",
    split: str = "train",
    ops: Sequence[str] = DEFAULT_OPS,
    max_value: int = DEFAULT_MAX_VALUE,
) -> list[dict[str, Any]]:
    """Generate ``n`` records with unique questions, none of which is in ``exclude``.

    Each problem draws ``n_ops`` and ``digits`` uniformly from the inclusive ranges, then the
    problem itself; duplicates and excluded questions are rejected and redrawn. ``meta`` records
    ``n_ops``, ``digits`` and ``max_value``; ids are ``"{source}/{split}/{index:06d}"``.

    Raises:
        ValueError: if fewer than ``n`` distinct problems exist for the ranges, or if the
            generator stalls (the unexcluded part of the space is too small for ``n``).
    """
    draws = draw_chains(
        seed,
        n,
        n_ops_range,
        digits_range,
        exclude,
        lambda rng, n_ops, digits: (lambda p: (p[0], p))(generate_problem(rng, n_ops, digits, ops, max_value)),
        split=split,
        ops=ops,
        max_value=max_value,
    )
    draws = [(n_ops, digits, *problem) for n_ops, digits, problem in draws]
    return [
        make_record(
            id=f"{source}/{split}/{i:06d}",
            source=source,
            split=split,
            question=question,
            answer=answer,
            solution=solution,
            meta={"n_ops": n_ops, "digits": digits, "max_value": max_value},
        )
        for i, (n_ops, digits, question, answer, solution) in enumerate(draws)
    ]
