"""Verifiable-answer rewards: math-verify on the last ``\\boxed{}`` and DAPO's ``Answer:`` check.

Each reward is split into two steps so that :class:`creditlab.rewards.scorer.RewardScorer` can cache
and sandbox it:

* ``extract(response) -> answer | None``: cheap, pure string work, run in the calling process;
* ``judge(answer, gold) -> float``: possibly slow (sympy), run in a worker process with a hard
  wall-clock timeout.

The score of a response depends only on ``(extracted answer, gold)``, which is the cache key.

Registered rewards (:mod:`creditlab.rewards.registry`), signature ``fn(response: str, gold: str) -> float``:

* ``math_verify`` -- :func:`math_verify_score`: 1.0 if math-verify judges the last boxed answer
  equal to the gold answer, else 0.0 (no boxed answer -> 0.0). The reward of the Δlog p, DelTA,
  cancellation, ARCA and DFPO papers.
* ``dapo_answer`` -- :func:`dapo_answer_score`: DAPO's own reward (verl ``math_dapo``): +1.0 if the
  text after the last ``Answer:`` (within the last 300 characters) equals the gold answer after
  Minerva-style normalisation, else -1.0.
"""

from __future__ import annotations

import logging
import re
import threading
from importlib.metadata import PackageNotFoundError, version

from creditlab.rewards.math_exact import exact_numbers, rewrite_scientific
from creditlab.rewards.registry import RewardSpec, add_spec, register

# ----------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------

BOXED = "\\boxed{"


def boxed_content_at(text: str, start: int, limit: int | None = None) -> str | None:
    """Content of the ``\\boxed{`` that begins at ``start``, with balanced (possibly nested) braces; None
    when it is not closed (within ``limit`` characters of content, if given). A backslash escapes the next
    character, so ``\\{`` and ``\\}`` inside the box are literal braces, not grouping ones."""
    depth = 1
    i = start + len(BOXED)
    stop = len(text) if limit is None else min(len(text), i + limit)
    while i < stop:
        ch = text[i]
        if ch == "\\":
            i += 2  # a backslash and the character it escapes (\{, \}, \\) are one unit
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(BOXED) : i]
        i += 1
    return None


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text``, with balanced (possibly nested) braces.

    ``"a \\boxed{1} b \\boxed{\\frac{1}{2}}"`` -> ``"\\frac{1}{2}"``. Returns None when there is no
    ``\\boxed{`` or when the last one is never closed (:func:`boxed_content_at`).
    """
    start = text.rfind(BOXED)
    return None if start < 0 else boxed_content_at(text, start)


# DAPO (verl math_dapo.compute_score) only looks at the tail of the response.
DAPO_TAIL_CHARS = 300
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def extract_dapo_answer(text: str) -> str | None:
    """Text after the last ``Answer:`` (case-insensitive) on its line, searched in the last 300 chars.

    Returns None when there is no such line (DAPO then scores -1).
    """
    matches = _DAPO_ANSWER.findall(text[-DAPO_TAIL_CHARS:])
    return matches[-1] if matches else None


# ----------------------------------------------------------------------------------------------
# DAPO / Minerva answer normalisation (the reading of verl's math_dapo.normalize_final_answer)
# ----------------------------------------------------------------------------------------------

_DAPO_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DAPO_REMOVED: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_DAPO_REGEX_RULES: tuple[tuple[str, str], ...] = (
    (r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$"),  # keep only the first $...$ span
    (r"(\\text\{)(.*?)(\})", r"\2"),
    (r"(\\textbf\{)(.*?)(\})", r"\2"),
    (r"(\\overline\{)(.*?)(\})", r"\2"),
    (r"(\\boxed\{)(.*)(\})", r"\2"),
    (r"(frac)([^{])(.)", r"frac{\2}{\3}"),  # \fracab -> \frac{a}{b}
    (r"(sqrt)([^{])", r"sqrt{\2}"),  # \sqrta -> \sqrt{a}
)


def normalize_dapo_answer(answer: str) -> str:
    """Minerva/DAPO normalisation of a final answer, as verl's ``math_dapo.normalize_final_answer``.

    Keeps the right-hand side of the last ``=``, drops spaces, units and ``\\text{}`` wrappers,
    rewrites shorthand ``\\fracab``/``\\sqrta``, removes ``$`` and thousands separators of integers.
    """
    out = answer.split("=")[-1]
    for before, after in _DAPO_SUBSTITUTIONS:
        out = out.replace(before, after)
    for expr in _DAPO_REMOVED:
        out = out.replace(expr, "")
    for pattern, repl in _DAPO_REGEX_RULES:
        out = re.sub(pattern, repl, out)
    out = out.replace("$", "")
    if out.replace(",", "").isdigit():
        out = out.replace(",", "")
    return out.strip()


# ----------------------------------------------------------------------------------------------
# Judges: (answer, gold) -> score
# ----------------------------------------------------------------------------------------------

MATH_VERIFY_CORRECT, MATH_VERIFY_WRONG = 1.0, 0.0
DAPO_CORRECT, DAPO_WRONG = 1.0, -1.0


def judge_math_verify(answer: str, gold: str, internal_timeout: int | None = None) -> float:
    """1.0 if math-verify judges ``answer`` equal to ``gold`` (both read as LaTeX), with exact numbers, else 0.0.

    Both sides are wrapped in ``\\boxed{}`` and parsed with math-verify's default extraction
    (LaTeX, then plain expressions), so ``61`` == ``61.0``, ``\\frac{1}{2}`` == ``0.5``, reordered sums,
    sets and intervals match. Numbers are compared exactly, not with math-verify's default tolerance
    (:mod:`creditlab.rewards.math_exact`): ``\\frac{1}{2004!}`` is not ``\\frac{1}{2006!}``, ``0.0000002`` is
    not ``0.0000001``; a decimal answer matches a gold without a finite decimal expansion (``\\pi``,
    ``\\frac{1}{3}``) only as its correct rounding to at least 6 significant digits. Scientific notation
    (``1e308``) is read as a power of ten, not as Euler's e.
    ``internal_timeout`` is math-verify's own ``signal.alarm`` timeout (seconds; None disables it).
    It only works in the main thread and cannot interrupt C-level big-number arithmetic: the
    :class:`~creditlab.rewards.scorer.RewardScorer` disables it and enforces a hard timeout instead.
    """
    from math_verify import parse, verify

    gold_parsed = parse(BOXED + rewrite_scientific(gold) + "}", parsing_timeout=internal_timeout)
    pred_parsed = parse(BOXED + rewrite_scientific(answer) + "}", parsing_timeout=internal_timeout)
    if not gold_parsed or not pred_parsed:
        return MATH_VERIFY_WRONG
    with exact_numbers(answer):
        ok = verify(gold_parsed, pred_parsed, timeout_seconds=internal_timeout)
    return MATH_VERIFY_CORRECT if ok else MATH_VERIFY_WRONG


def judge_dapo(answer: str, gold: str) -> float:
    """+1.0 if the normalised ``answer`` equals the normalised ``gold`` (exact string), else -1.0."""
    return DAPO_CORRECT if normalize_dapo_answer(answer) == normalize_dapo_answer(gold) else DAPO_WRONG


# ----------------------------------------------------------------------------------------------
# Registered rewards: (response, gold) -> score
# ----------------------------------------------------------------------------------------------


@register("math_verify")
def math_verify_score(response: str, gold: str) -> float:
    """Binary math-verify reward of a response: 1.0 if its last ``\\boxed{}`` equals ``gold``, else 0.0.

    No boxed answer (or an unbalanced one) scores 0.0. An in-process call: on the main thread with math-verify's
    own 5 s ``signal.alarm`` timeout (best effort: it cannot interrupt C-level arithmetic), on any other thread
    without one (``signal.alarm`` works on the main thread only; math-verify raises ``ValueError`` there). So it
    is correct on every thread but hang-proof on none: for untrusted model outputs use
    :class:`~creditlab.rewards.scorer.RewardScorer`, or from any thread :mod:`creditlab.rewards.service`.
    """
    answer = extract_last_boxed(response)
    if answer is None:
        return MATH_VERIFY_WRONG
    on_main = threading.current_thread() is threading.main_thread()
    return judge_math_verify(answer, gold, internal_timeout=5 if on_main else None)


@register("dapo_answer")
def dapo_answer_score(response: str, gold: str) -> float:
    """DAPO's reward: +1.0 if the last ``Answer:`` line matches ``gold`` after normalisation, else -1.0.

    Only the last 300 characters of the response are searched (as verl's ``math_dapo``); a
    response without an ``Answer:`` line scores -1.0.
    """
    answer = extract_dapo_answer(response)
    if answer is None:
        return DAPO_WRONG
    return judge_dapo(answer, gold)


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # pragma: no cover - only without installed metadata
        return "unknown"


add_spec(
    RewardSpec(
        name="math_verify",
        extract=extract_last_boxed,
        judge=judge_math_verify,
        failure=MATH_VERIFY_WRONG,
        cache_tag=f"math_verify/v2-exact/math-verify=={_package_version('math-verify')}",
    )
)
add_spec(
    RewardSpec(
        name="dapo_answer",
        extract=extract_dapo_answer,
        judge=judge_dapo,
        failure=DAPO_WRONG,
        cache_tag="dapo_answer/v1",
    )
)


def quiet_math_verify_logs() -> None:
    """Silence math-verify's per-call warnings (e.g. 'timeout disabled') in worker processes."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
