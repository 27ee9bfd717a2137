"""Test cases, answer comparison and verdicts: LiveCodeBench's judging rules, run in the trusted parent.

Test cases follow LiveCodeBench (``lcb_runner/benchmarks/code_generation.py``)::

    {"input": str, "output": str, "testtype": "stdin" | "functional"}

plus, for ``functional`` tests, the name of the function to call (LCB's ``metadata["func_name"]``).
Judging re-implements LCB's ``lcb_runner/evaluation/testing_util.py`` rules:

* ``stdin``: the solution runs as a script (``__name__ == "__main__"``) with the input on stdin;
  its stdout and the expected output are each stripped, split on ``"\\n"``, every line stripped;
  the line counts must match and each line must be equal, or equal element-wise as ``Decimal``s
  after splitting on whitespace (``"1.50 2"`` matches ``"1.5 2.0"``). ``SystemExit`` ends the run
  normally.
* ``functional``: the code is executed as a module; if it contains ``class Solution`` the method
  is looked up on ``Solution()`` (a fresh instance per test; LCB reuses one), otherwise the
  function on the module. The input holds one JSON
  value per line (the positional arguments), the output is JSON; a returned tuple counts as a list
  and the prediction must ``==`` the expected value (so ``1 == 1.0``, but a nested tuple, a set or a
  non-string dict key never equals JSON).
* As LCB, the solution sees LCB's star-imports preamble (``from math import *`` ... and
  ``sys.setrecursionlimit(50000)``), the int->str digit limit is 50000, and grading stops at the
  first failing test (``stop_at_first_failure``; later tests read ``skipped``). Reward = 1.0 iff
  every test passes (pass@1).

Verdict per test: ``pass``, ``fail`` (wrong answer, no output, a return value nothing in JSON can
equal), ``timeout`` (wall clock or CPU limit), ``runtime_error`` (exception, output or file over the
size limit, signal, non-zero ``os._exit``, missing function), ``memory`` (``MemoryError`` under the
address-space limit), ``compile_error``
(every test, when the code does not compile), ``sandbox_error`` (the sandbox itself failed or
was disrupted, or its answers broke the protocol), ``skipped`` (not run after a failure).

Judging is linear in the output's size (at most ``max_output_mb``), whatever the output holds:
special decimal values (``sNaN`` ...) are wrong answers, huge integers compare as digit strings
(``int()`` of a 2-million-digit number is quadratic), a line is split into at most as many tokens as
the gold line has; the comparisons never raise.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

TESTTYPES = ("stdin", "functional")
VERDICTS = ("pass", "fail", "timeout", "runtime_error", "memory", "compile_error", "sandbox_error", "skipped")


@dataclass(frozen=True)
class TestCase:
    """One LiveCodeBench test: ``input``/``output`` strings, ``testtype`` and (functional) ``func_name``."""

    input: str
    output: str
    testtype: str = "stdin"
    func_name: str | None = None

    __test__ = False  # not a pytest test class

    def __post_init__(self) -> None:
        if self.testtype not in TESTTYPES:
            raise ValueError(f"testtype must be one of {TESTTYPES}, got {self.testtype!r}")
        if self.testtype == "functional" and not self.func_name:
            raise ValueError("a functional test needs func_name (LCB: metadata['func_name'])")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], func_name: str | None = None) -> TestCase:
        """From LCB's dict; ``func_name`` from the dict, its ``metadata``, or the argument."""
        meta = d.get("metadata") or {}
        if isinstance(meta, str):
            meta = json.loads(meta)
        name = d.get("func_name") or meta.get("func_name") or func_name
        testtype = d.get("testtype", "functional" if name else "stdin")
        return cls(str(d["input"]), str(d["output"]), testtype, name if testtype == "functional" else None)


def parse_tests(gold: str | Sequence[Any] | Mapping[str, Any]) -> tuple[list[TestCase], dict[str, Any]]:
    """Test cases and run options from a gold spec (JSON text or the decoded value).

    Accepted shapes: a list of LCB test dicts; ``{"tests": [...], "func_name": ..., "time_limit_s":
    ..., "memory_mb": ...}``; or an LCB problem row with ``public_test_cases`` /
    ``private_test_cases`` (lists or JSON text; LCB's compressed pickles must be decoded by the data
    preparation, never here) and ``metadata`` (dict or JSON text with ``func_name``). Options are the
    :func:`run_tests` keyword arguments found in the spec (``time_limit_s``, ``memory_mb``).
    Raises ValueError when ``gold`` describes no tests.
    """
    spec = json.loads(gold) if isinstance(gold, str) else gold
    options: dict[str, Any] = {}
    func_name = None
    if isinstance(spec, Mapping):
        meta = spec.get("metadata") or {}
        if isinstance(meta, str):
            meta = json.loads(meta)
        func_name = spec.get("func_name") or meta.get("func_name")
        options = {k: spec[k] for k in ("time_limit_s", "memory_mb") if k in spec}
        if "tests" in spec:
            raw = spec["tests"]
        elif "public_test_cases" in spec or "private_test_cases" in spec:
            raw = []
            for key in ("public_test_cases", "private_test_cases"):
                part = spec.get(key) or []
                if isinstance(part, str):
                    try:
                        part = json.loads(part)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{key} is not JSON (decode LCB's compressed tests first)") from e
                raw.extend(part)
        else:
            raise ValueError("gold has no 'tests' / 'public_test_cases' / 'private_test_cases'")
    elif isinstance(spec, list):
        raw = spec
    else:
        raise ValueError(f"gold must be a list of tests or a mapping, got {type(spec).__name__}")
    tests = [t if isinstance(t, TestCase) else TestCase.from_dict(t, func_name) for t in raw]
    if not tests:
        raise ValueError("gold has no test cases")
    return tests, options


# ----------------------------------------------------------------------------------------------
# Comparison (LiveCodeBench's rules, run in the trusted parent)
# ----------------------------------------------------------------------------------------------


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimal_line_equal(pred: str, gold: str) -> bool:
    """LCB's second chance for a line: both lines read as Decimals, element-wise equal.

    Never raises and stays linear in the line's length: the prediction is split into at most as many
    tokens as the gold has (plus the rest), a NaN (quiet or signalling, whose comparison raises
    ``InvalidOperation``) never equals anything (as ``NaN != NaN`` in LCB), and a token Decimal cannot
    read (e.g. an exponent past its range) makes the line a plain string, as in LCB.
    """
    gold_tokens = gold.split()
    pred_tokens = pred.split(maxsplit=len(gold_tokens))
    if len(pred_tokens) != len(gold_tokens):
        return False
    try:
        for p, g in zip(pred_tokens, gold_tokens):
            dp, dg = Decimal(p), Decimal(g)
            if dp.is_nan() or dg.is_nan() or dp != dg:
                return False
    except (ArithmeticError, ValueError, TypeError):
        return False
    return True


def stdout_matches(prediction: str, expected: str) -> bool:
    """LCB's stdin/stdout check: stripped lines equal, or equal as Decimals element-wise.

    Never raises; linear in the prediction's length (the line counts are compared before anything is
    split, a line is split into at most the gold line's token count).
    """
    pred_text, gold_text = prediction.strip(), expected.strip()
    if pred_text.count("\n") != gold_text.count("\n"):
        return False
    for p, g in zip(_stripped_lines(pred_text), _stripped_lines(gold_text)):
        if p != g and not _decimal_line_equal(p, g):
            return False
    return True


_INT_DIGITS_FAST = 4000  # str -> int is quadratic: above this many characters an integer is kept as its digits


class _BigInt:
    """A JSON integer literal too long to convert quickly, compared by its digits.

    ``int(s)`` and ``int(Decimal(s))`` are quadratic (2 million digits: minutes); a JSON integer
    literal is canonical (no leading zeros, no ``+``), so two such literals are equal iff their texts
    are; an integer of more than 4000 characters never equals a shorter one (its value would need as
    many digits) nor a float (at most about 1.8e308, or inf).
    """

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _BigInt):
            return self.digits == other.digits
        if isinstance(other, (int, float)):
            return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.digits)

    def __repr__(self) -> str:
        return f"_BigInt({truncate(self.digits, 40)})"


def _parse_int(s: str) -> int | _BigInt:
    return int(s) if len(s) <= _INT_DIGITS_FAST else _BigInt(s)


def _json_loads(s: str) -> Any:
    return json.loads(s, parse_int=_parse_int)


# The harness writes a return value as json.dumps(value): for a value equal to the gold that text is at most
# ~12x the gold's (a non-BMP character as two \u escapes; 0 as false), so a longer one is padding (whitespace,
# float digits, duplicate keys) that only a solution writing the file itself can produce; not parsed.
_JSON_BLOAT, _JSON_SLACK = 32, 1 << 20


def return_matches(prediction_json: str, expected: str) -> bool:
    """LCB's functional check: ``prediction == json.loads(expected)`` (tuples already made lists).

    Never raises; linear in the prediction's length (huge integers compare as digit strings), and a
    prediction over ``32 x len(expected) + 1 MB`` characters is a wrong answer without being parsed
    (so that millions of tiny containers cost neither seconds nor memory of the trusted parent).
    """
    if len(prediction_json) > _JSON_BLOAT * len(expected) + _JSON_SLACK:
        return False
    try:
        return bool(_json_loads(prediction_json) == _json_loads(expected))
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        return False


# ----------------------------------------------------------------------------------------------
# Verdicts
# ----------------------------------------------------------------------------------------------


@dataclass
class TestVerdict:
    """Outcome of one test: ``verdict`` (see :data:`VERDICTS`), times and a short detail."""

    index: int
    verdict: str
    wall_s: float | None = None
    cpu_s: float | None = None
    detail: str = ""

    __test__ = False


@dataclass
class Verdict:
    """Outcome of one solution: per-test verdicts and a summary.

    ``passed`` iff every test passed (LCB pass@1); ``status`` is ``"pass"`` or the first non-pass
    verdict; ``sandbox`` the tier used; ``scratch_dir`` the host scratch dir (removed; None with
    bwrap, whose scratch dir is a tmpfs inside the sandbox); ``wall_s`` the whole run.
    """

    tests: list[TestVerdict]
    sandbox: str
    wall_s: float
    scratch_dir: str | None = None
    detail: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.tests) and all(t.verdict == "pass" for t in self.tests)

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0

    @property
    def status(self) -> str:
        return next((t.verdict for t in self.tests if t.verdict != "pass"), "pass")

    def summary(self) -> dict[str, Any]:
        counts = {v: 0 for v in VERDICTS}
        for t in self.tests:
            counts[t.verdict] += 1
        return {
            "status": self.status,
            "passed": self.passed,
            "reward": self.reward,
            "n_tests": len(self.tests),
            "counts": {k: v for k, v in counts.items() if v},
            "wall_s": round(self.wall_s, 4),
            "sandbox": self.sandbox,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "tests": [dataclasses.asdict(t) for t in self.tests],
            "detail": self.detail,
            "scratch_dir": self.scratch_dir,
        }


def truncate(s: str, n: int = 200) -> str:
    """``s``, or its first and last ``n / 2`` characters around a ``...(truncated)...`` mark."""
    return s if len(s) <= n else s[: n // 2] + " ...(truncated)... " + s[-n // 2 :]
