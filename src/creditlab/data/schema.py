"""The normalised problem record shared by every data source (synthetic and hub datasets).

A record is a plain ``dict`` with exactly these fields:

- ``id`` (str): unique identifier, e.g. ``"tiny_arith/train/000042"``.
- ``source`` (str): dataset name, e.g. ``"tiny_arith"``, ``"deepmath"``, ``"math500"``.
- ``split`` (str): ``"train"``, ``"val"`` or the evaluation suite name.
- ``question`` (str): the problem text, without any prompt template.
- ``answer`` (str): the gold final answer, as math-verify compares it; for a multiple-choice record the
  correct letter; for a code record (verifier kind ``code``) the test spec (JSON) that
  :func:`creditlab.rewards.code.cases.parse_tests` reads.
- ``solution`` (str | None): a step-by-step target (used by SFT) ending in ``\\boxed{answer}``, for a code
  record in a closed fenced code block (the program the verifier extracts), or None when the source has no
  usable solution.
- ``meta`` (dict): JSON-serialisable knobs describing the problem (e.g. ``n_ops``, ``digits``).

Prompt templates (:func:`render_prompt`) turn a question into model input; the matching response
prefix (:func:`render_response`) turns a solution into the SFT target (EOS is appended by the
caller, at token level).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

FIELDS: tuple[str, ...] = ("id", "source", "split", "question", "answer", "solution", "meta")
"""Record fields, in their canonical (column) order."""

_BOXED_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."

TEMPLATES: dict[str, Callable[[str], str]] = {
    "tiny": lambda question: f"Q: {question}\nA:",
    "boxed": lambda question: question + _BOXED_INSTRUCTION,
}
"""Prompt templates by name: ``tiny`` for the tiny models, ``boxed`` for paper-scale base models."""

RESPONSE_PREFIX: dict[str, str] = {"tiny": " ", "boxed": "\n"}
"""What separates a rendered prompt from the solution text, per template."""

_REQUIRED_STR_FIELDS: tuple[str, ...] = ("id", "source", "split", "question", "answer")


def boxed(answer: str) -> str:
    """Return ``\\boxed{answer}``, the final-answer marker every solution ends with."""
    return "\\boxed{" + answer + "}"


def make_record(
    id: str,
    source: str,
    split: str,
    question: str,
    answer: str,
    solution: str | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a record with the canonical field order and validate it.

    Raises:
        ValueError: if any field is invalid (the message names the field).
    """
    record = {
        "id": id,
        "source": source,
        "split": split,
        "question": question,
        "answer": answer,
        "solution": solution,
        "meta": {} if meta is None else dict(meta),
    }
    validate_record(record)
    return record


def validate_record(rec: Any) -> None:
    """Check that ``rec`` follows the record schema.

    Raises:
        ValueError: naming the first offending field (missing, unexpected, wrong type, empty
            string, a solution that does not end with ``\\boxed{answer}``, or non-JSON ``meta``).
    """
    if not isinstance(rec, dict):
        raise ValueError(f"record must be a dict, got {type(rec).__name__}")
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise ValueError(f"record is missing field(s) {missing}")
    unexpected = sorted(set(rec) - set(FIELDS))
    if unexpected:
        raise ValueError(f"record has unexpected field(s) {unexpected}; allowed: {list(FIELDS)}")
    for field in _REQUIRED_STR_FIELDS:
        value = rec[field]
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"field {field!r} must be a non-empty string, got {value!r}")
    if _is_code(rec["source"]):
        _validate_code(rec["solution"], rec["answer"])
    else:
        _validate_solution(rec["solution"], rec["answer"])
    _validate_meta(rec["meta"])


def _is_code(source: str) -> bool:
    """Whether records of ``source`` are code problems (:func:`creditlab.rewards.routing.data_source_kind`); an
    unrouted source keeps the boxed-answer rule here (scoring it still raises: nothing routes it)."""
    from creditlab.rewards.routing import data_source_kind

    try:
        return data_source_kind(source) == "code"
    except ValueError:
        return False


def _validate_code(solution: Any, answer: str) -> None:
    """A code record: ``answer`` is a test spec with at least one test; ``solution`` is None or a string ending
    with a closed fenced block holding code (what :func:`creditlab.rewards.code.extract.extract_code` reads)."""
    from creditlab.rewards.code.cases import parse_tests
    from creditlab.rewards.code.extract import extract_code

    try:
        parse_tests(answer)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(
            f"field 'answer' of a code record must be a test spec (rewards.code.cases.parse_tests): {err}"
        ) from err
    if solution is None:
        return
    if not isinstance(solution, str):
        raise ValueError(f"field 'solution' must be a string or None, got {type(solution).__name__}")
    if not solution.rstrip().endswith("```") or extract_code(solution) is None:
        raise ValueError(
            f"field 'solution' of a code record must end with a closed fenced code block, got {solution!r}"
        )


def _validate_solution(solution: Any, answer: str) -> None:
    """Solution is None or a string ending with ``\\boxed{answer}``."""
    if solution is None:
        return
    if not isinstance(solution, str):
        raise ValueError(f"field 'solution' must be a string or None, got {type(solution).__name__}")
    if not solution.rstrip().endswith(boxed(answer)):
        raise ValueError(f"field 'solution' must end with {boxed(answer)!r}, got {solution!r}")


def _validate_meta(meta: Any) -> None:
    """Meta is a dict with string keys whose content survives a JSON round trip."""
    if not isinstance(meta, dict):
        raise ValueError(f"field 'meta' must be a dict, got {type(meta).__name__}")
    if not all(isinstance(k, str) for k in meta):
        raise ValueError(f"field 'meta' must have string keys, got {list(meta)}")
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"field 'meta' must be JSON-serialisable: {err}") from err


def check_template(template: str) -> None:
    """Raise a ValueError listing the valid names when ``template`` is unknown."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; valid: {sorted(TEMPLATES)}")


def render_prompt(question: str, template: str) -> str:
    """Render ``question`` with the named prompt template (``tiny`` or ``boxed``).

    ``tiny``: ``"Q: {question}\\nA:"``; ``boxed``: the question followed by the instruction
    ``"\\nPlease reason step by step, and put your final answer within \\boxed{}."``.
    """
    check_template(template)
    return TEMPLATES[template](question)


CODE_PREAMBLE = (
    "You will be given a question (problem specification) and will generate a correct Python program "
    "that matches the specification and passes all tests."
)
CODE_FORMAT_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose your "
    "code within delimiters."
)
CODE_FORMAT_STDIN = (
    "Read the inputs from stdin, solve the problem and write the answer to stdout (do not directly "
    "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the "
    "python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT."
)


def render_code_prompt(question: str, starter_code: str = "") -> str:
    """The prompt of a code problem for a hub model [ours: after LiveCodeBench's generic code-generation
    prompt]: the question, then the answer format -- the starter code to complete (LeetCode-style functional
    problems) or a stdin/stdout program -- in a ```python fenced block, which the code verifier extracts."""
    fmt = (
        f"{CODE_FORMAT_STARTER}\n```python\n{starter_code}\n```"
        if starter_code.strip()
        else f"{CODE_FORMAT_STDIN}\n```python\n# YOUR CODE HERE\n```"
    )
    answer = "### Answer: (use the provided format with backticks)"
    return f"{CODE_PREAMBLE}\n\n### Question:\n{question}\n\n### Format: {fmt}\n\n{answer}\n\n"


def render_record_prompt(rec: dict[str, Any], template: str) -> str:
    """The prompt of one record under ``template``: :func:`render_prompt` of its question, except a code record
    (verifier kind ``code``, :func:`creditlab.rewards.routing.data_source_kind` of its source) under ``boxed``,
    which asks for a fenced Python program (:func:`render_code_prompt`, with the record's ``meta.starter_code``)
    instead of a boxed answer. Every engine and the evaluator render prompts with this function."""
    from creditlab.rewards.routing import data_source_kind

    check_template(template)
    if template == "boxed" and data_source_kind(rec["source"]) == "code":
        return render_code_prompt(rec["question"], str((rec.get("meta") or {}).get("starter_code") or ""))
    return render_prompt(rec["question"], template)


def render_response(solution: str, template: str) -> str:
    """Render the SFT target text that follows a prompt of ``template`` (EOS not included).

    For ``tiny`` this is ``" " + solution``; the caller appends the tokenizer's EOS token.
    """
    check_template(template)
    return RESPONSE_PREFIX[template] + solution
