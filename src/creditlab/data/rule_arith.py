"""Rule arithmetic: the tiny task with structured credit (issue 29): decisive tokens left at chance, ignorable ones.

A problem is a chain of the synthetic task (:mod:`creditlab.data.synthetic`) in which some ``+`` / ``-`` operators
of the question are written as **rule letters**, e.g. ``(23a45b7)*3`` with the hidden rule ``a -> +, b -> -``
(``task.rules`` of the data config). The solution writes every step with its resolved operator, as before, and
joins the steps with a **separator** drawn uniformly from ``task.separators`` at every junction::

    question  "(23a45b7)*3"         answer "183"
    solution  "23+45=68;68-7=61 61*3=183 \\boxed{183}"     (the true rule; separators ";" and " " drawn)

Three kinds of response token, by construction:

* **decisive** -- the operator written for a rule letter. The SFT warm-up teaches the format but never the rule:
  its copy of the problem (``meta.sft_solution``, which :func:`creditlab.data.tokenizer.sft_examples` trains on)
  resolves each rule letter to ``+`` or ``-`` uniformly at random (its chain computed with that choice, so every
  SFT example is self-consistent arithmetic), so after the warm-up the policy writes either at chance. Only the true
  choice can reach the gold answer: the token decides the reward. A letter replaces an operator only where both
  readings keep the chain in ``[0, max_value]`` (otherwise the range would give the reading away).
* **ignorable** -- the separators: uniform in the warm-up data, in right and wrong rollouts alike, and invisible to
  the verifier (it reads ``\\boxed{}``), so they are truly uncertain (entropy ~log |separators| after the warm-up)
  and cannot change the reward.
* **determined** -- operands and results: copied or computed; uncertain only where the model's arithmetic is.

``rule_frac`` (per split) is the chance that an eligible ``+`` / ``-`` of a problem is written as a letter; with
``n_ops`` and ``digits`` ranges it mixes problems with no decisive token (informative only through arithmetic
errors), one, or several: groups are unevenly informative, which reward-balanced batching (Paper C) needs.
Records are unique by their question (letters included). Deterministic given the seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from creditlab.data.schema import boxed, make_record
from creditlab.data.synthetic import (
    DEFAULT_MAX_VALUE,
    DEFAULT_OPS,
    apply_op,
    draw_chains,
    generate_problem,
)

RULE_OPS = ("+", "-")
"""Operators a rule letter may stand for."""
DEFAULT_SEPARATORS: tuple[str, ...] = (" ",)


def check_rules(rules: Mapping[str, str], separators: Sequence[str]) -> None:
    """Raise ValueError for rules that are not single lowercase letters mapping to ``+``/``-`` or separators that
    are not single characters the task uses nowhere else."""
    for letter, op in rules.items():
        if len(letter) != 1 or not letter.isalpha() or not letter.islower() or letter in "x":
            raise ValueError(f"task.rules: key {letter!r} must be one lowercase letter (not x)")
        if op not in RULE_OPS:
            raise ValueError(f"task.rules.{letter}: {op!r} is not one of {list(RULE_OPS)}")
    if not separators:
        raise ValueError("task.separators must name at least one separator")
    for sep in separators:
        if len(sep) != 1 or sep.isalnum() or sep in "+-*=()\\{}":
            raise ValueError(f"task.separators: {sep!r} must be one character that is no digit, letter or operator")


RL_PROMPTS_KEYS = ("letters",)
"""The keys of a data config's ``rl_prompts`` block (:func:`select_rl_prompts`)."""


def check_rl_prompts(spec: Mapping[str, Any] | None) -> list[float] | None:
    """The shares of a data config's ``rl_prompts.letters`` (index k: the share of RL prompts with k rule letters),
    None for no block (every train record is an RL prompt). ValueError naming the key for anything else: unknown
    keys, a share that is no number or negative, shares that do not sum to a positive number."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ValueError(f"data config rl_prompts: must be a mapping with keys {list(RL_PROMPTS_KEYS)}, got {spec!r}")
    unknown = sorted(set(spec) - set(RL_PROMPTS_KEYS))
    if unknown:
        raise ValueError(f"data config rl_prompts: unknown key(s) {unknown}; expected {list(RL_PROMPTS_KEYS)}")
    letters = spec.get("letters")
    if not isinstance(letters, Sequence) or isinstance(letters, str) or not letters:
        raise ValueError(
            f"data config rl_prompts.letters: a list of shares by letter count (0, 1, 2, ...), got {letters!r}"
        )
    shares = []
    for k, share in enumerate(letters):
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not share >= 0:
            raise ValueError(f"data config rl_prompts.letters[{k}]: {share!r} is no share >= 0")
        shares.append(float(share))
    if sum(shares) <= 0:
        raise ValueError(f"data config rl_prompts.letters: the shares {letters} sum to 0")
    return shares


def select_rl_prompts(records: Sequence[dict[str, Any]], spec: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The RL prompts of a world: ``records`` (the train split, which the warm-up trains on whole) drawn to the shares
    of ``spec["letters"]`` by each record's count of rule letters (``meta.letters``), or all of them without ``spec``.

    With shares s_k (normalised to sum 1) and c_k train records of k letters, the set holds m_k = floor(n s_k) of them,
    n = min over s_k > 0 of c_k / s_k: the largest set with those shares. Within a count the records keep their
    train order (itself a seeded draw), and the set keeps the train order: deterministic, no RNG. E.g. tiny_rule's
    20000 train records hold 8% with two letters, so ``letters: [0, 0.5, 0.5]`` selects ~1600 + ~1600 prompts.
    ValueError when a count with a positive share has no record (a split without rule letters, or none that long)."""
    shares = check_rl_prompts(spec)
    if shares is None:
        return list(records)
    total = sum(shares)
    shares = [s / total for s in shares]
    by_count: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
        by_count.setdefault(int((rec.get("meta") or {}).get("letters", 0)), []).append(i)
    empty = [k for k, s in enumerate(shares) if s > 0 and not by_count.get(k)]
    if empty:
        have = {k: len(v) for k, v in sorted(by_count.items())}
        raise ValueError(
            f"data config rl_prompts.letters: no train record has {empty[0]} rule letter(s) (records by letter count: "
            f"{have}); give that count share 0 or change the train split"
        )
    n = min(len(by_count[k]) / s for k, s in enumerate(shares) if s > 0)
    keep = sorted(i for k, s in enumerate(shares) if s > 0 for i in by_count[k][: int(n * s + 1e-9)])
    return [records[i] for i in keep]


def _chain(first: int, ops: Sequence[str], operands: Sequence[int], max_value: int) -> list[int] | None:
    """Running values of ``first <op_1> x_1 <op_2> x_2 ...`` (left to right), None when one leaves [0, max_value]."""
    values = [first]
    for op, x in zip(ops, operands):
        v = apply_op(values[-1], op, x)
        if not 0 <= v <= max_value:
            return None
        values.append(v)
    return values


def _solution(values: Sequence[int], ops: Sequence[str], operands: Sequence[int], seps: Sequence[str]) -> str:
    steps = [f"{values[k]}{op}{x}={values[k + 1]}" for k, (op, x) in enumerate(zip(ops, operands))]
    text = steps[0]
    for sep, step in zip(seps, steps[1:]):
        text += sep + step
    return text + " " + boxed(str(values[-1]))


def generate_rule_problem(
    rng: np.random.Generator,
    n_ops: int,
    digits: int,
    rules: Mapping[str, str],
    rule_frac: float,
    separators: Sequence[str] = DEFAULT_SEPARATORS,
    ops: Sequence[str] = DEFAULT_OPS,
    max_value: int = DEFAULT_MAX_VALUE,
) -> dict[str, Any]:
    """One problem (module docstring): ``{question, answer, solution, sft_solution, letters, decisive}`` where
    ``letters`` is the number of rule letters and ``decisive`` the step index of each."""
    _, _, sol = generate_problem(rng, n_ops, digits, ops, max_value)
    steps = sol.rsplit(" ", 1)[0].split(" ")
    true_ops, operands, values = [], [], []
    for s in steps:  # "a<op>b=c" with a, b, c non-negative integers
        lhs, c = s.split("=")
        k = next(i for i in range(1, len(lhs)) if lhs[i] in "+-*")
        values.append(int(lhs[:k]))
        true_ops.append(lhs[k])
        operands.append(int(lhs[k + 1 :]))
    values.append(int(c))
    by_op = {op: sorted(L for L, o in rules.items() if o == op) for op in RULE_OPS}
    symbols = list(true_ops)
    decisive = []
    for k, op in enumerate(true_ops):
        if op not in RULE_OPS or not by_op[op] or rng.random() >= rule_frac:
            continue
        other = "-" if op == "+" else "+"
        if not 0 <= apply_op(values[k], other, operands[k]) <= max_value:
            continue  # the range would tell the reading
        symbols[k] = by_op[op][int(rng.integers(len(by_op[op])))]
        decisive.append(k)
    expr, last = str(values[0]), None
    for sym, op, x in zip(symbols, true_ops, operands):  # synthetic._append_op's parentheses, the letter written
        expr = (f"({expr})" if op == "*" and last in RULE_OPS else expr) + f"{sym}{x}"
        last = op
    seps = [separators[int(rng.integers(len(separators)))] for _ in range(len(steps) - 1)]
    solution = _solution(values, true_ops, operands, seps)
    sft_solution = solution
    for _ in range(50):  # the warm-up's copy: each letter resolved at random, the chain recomputed (in range)
        sft_ops = [RULE_OPS[int(rng.integers(2))] if k in decisive else op for k, op in enumerate(true_ops)]
        sft_values = _chain(values[0], sft_ops, operands, max_value)
        if sft_values is not None:
            sft_seps = [separators[int(rng.integers(len(separators)))] for _ in range(len(steps) - 1)]
            sft_solution = _solution(sft_values, sft_ops, operands, sft_seps)
            break
    return {
        "question": expr,
        "answer": str(values[-1]),
        "solution": solution,
        "sft_solution": sft_solution,
        "letters": len(decisive),
        "decisive": decisive,
    }


def generate_rule_split(
    seed: int,
    n: int,
    n_ops_range: Sequence[int],
    digits_range: Sequence[int],
    rule_frac: float,
    rules: Mapping[str, str],
    separators: Sequence[str] = DEFAULT_SEPARATORS,
    exclude: Iterable[str] = frozenset(),
    *,
    source: str = "tiny_rule_arith",
    split: str = "train",
    ops: Sequence[str] = DEFAULT_OPS,
    max_value: int = DEFAULT_MAX_VALUE,
) -> list[dict[str, Any]]:
    """``n`` records of unique questions (none in ``exclude``); ``meta``: n_ops, digits, max_value, letters (rule
    letters in the question), decisive (their step indices), sft_solution (the warm-up's text)."""
    check_rules(rules, separators)
    if not 0.0 <= float(rule_frac) <= 1.0:
        raise ValueError(f"rule_frac must be in [0, 1], got {rule_frac}")

    def make(rng: np.random.Generator, n_ops: int, digits: int) -> tuple[str, dict[str, Any]]:
        p = generate_rule_problem(rng, n_ops, digits, rules, rule_frac, separators, ops, max_value)
        return p["question"], p

    draws = draw_chains(seed, n, n_ops_range, digits_range, exclude, make, split=split, ops=ops, max_value=max_value)
    return [
        make_record(
            id=f"{source}/{split}/{i:06d}",
            source=source,
            split=split,
            question=p["question"],
            answer=p["answer"],
            solution=p["solution"],
            meta={
                "n_ops": n_ops,
                "digits": digits,
                "max_value": max_value,
                "letters": p["letters"],
                "decisive": list(p["decisive"]),
                "sft_solution": p["sft_solution"],
            },
        )
        for i, (n_ops, digits, p) in enumerate(draws)
    ]
