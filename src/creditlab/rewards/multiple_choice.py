"""Multiple-choice verifier (GPQA-Diamond, MMLU-Pro): letter extraction, option shuffling, reward.

Split like the math rewards (:mod:`creditlab.rewards.math_verify_reward`):

* ``extract(response) -> letter | None`` -- :func:`extract_choice`, pure string work;
* ``judge(letter, gold) -> float`` -- :func:`judge_choice`, exact letter comparison.

Registered function (kind ``"reward"``), signature ``fn(response: str, gold: str) -> float``:

* ``multiple_choice`` -- :func:`multiple_choice_score`: 1.0 iff the extracted letter equals the gold
  letter, else 0.0 (no answer, an ambiguous one or a letter beyond the options -> 0.0).

Extraction convention (what the references do, and what we follow)
-------------------------------------------------------------------
* OpenAI simple-evals (GPQA, MMLU) [paper-adjacent reference]: the prompt asks for a last line
  ``Answer: $LETTER``; extraction is the FIRST match of ``(?i)Answer[ \\t]*:[ \\t]*\\$?([A-D])\\$?``,
  nothing else counts.
* lm-evaluation-harness ``gpqa_*_cot_zeroshot`` [reference]: "strict-match" takes the text after
  ``The answer is``; "flexible-extract" takes the LAST ``(X)`` in the response.
* MMLU-Pro's official ``compute_accuracy`` [reference]: first ``answer is \\(?([A-J])\\)?``, else the
  last ``[aA]nswer:\\s*([A-J])``, else the last standalone letter ``\\b[A-J]\\b`` of the response.

We follow the MMLU-Pro cascade (explicit answer statements first, weaker letter forms only when
there is none), with the lm-eval / DAPO rule that the LAST occurrence wins inside a tier (a model
that corrects itself is scored on its final word; also the rule of our math rewards, last
``\\boxed{}``), and a stricter last tier than MMLU-Pro's "any standalone capital" [ours]:

* tier 1, explicit statements [ours: union of the three references' forms]: ``Answer: C``,
  ``the (final|correct) answer is (C)``, ``answer choice C``, ``the correct option is C``, ``I choose C``,
  ``\\boxed{C}`` (also ``\\boxed{\\text{C}}``, ``\\boxed{(C)}``, ``\\boxed{C) text}``), with markdown /
  LaTeX decoration (``**``, ``$``) around the letter.
* tier 2, letter forms without a statement [ours]: ``(C)``, ``**C**`` / ``**C) text**``, a line that
  starts with ``C.`` / ``C)`` / ``C:``, and a bare letter that is the last word of the response
  (``"A or B? I think B"``). Lines of an enumerated option list (``A) .. / B) ..`` restated by the model,
  two or more consecutive letters) are not answers and are skipped [ours].

Rules shared by both tiers [ours]:

* the last candidate of the first tier that has one decides; if that candidate is out of range
  (a letter at or beyond ``n_options``) or hedged (``A or B``, ``A/B``, ``A and B``, also decorated:
  ``\\boxed{A} or \\boxed{B}``, ``$A$ or \\text{B}``; two boxes with different letters and only
  punctuation between them, ``\\boxed{A}, \\boxed{B}``; one box with several letters, ``\\boxed{A or B}``)
  the response has no answer (None): we never fall back to an earlier letter the model moved away from;
  a box after a sentence (``\\boxed{A}. Wait, it is \\boxed{B}``) is a correction, not a hedge;
* extraction is linear in the response: one pass over its braces finds every ``\\boxed{}`` (700 KB of
  unclosed ``\\boxed{`` included), and only the deciding candidate is examined for hedges;
* lower case letters count only in tier 1 and only when unambiguous: directly after an answer
  statement and followed by punctuation or the end of the text (``answer: d``, ``answer is (c)``),
  never when a word follows (``the answer is a little tricky``); ``\\boxed{c}`` counts;
* ``I`` followed by a verb (``Answer: I think ...``) is the pronoun, not option I;
* no ``<think>`` stripping (as our math rewards); letters are returned upper case.

Option shuffling [paper: GPQA's own practice; ours: the per-question seed]
--------------------------------------------------------------------------
GPQA stores the correct answer first, so every evaluation shuffles the four options. simple-evals
draws one permutation per example from a single ``random.Random(0)`` in dataset order, lm-eval uses
the global ``random`` state: both make a question's letters depend on its position in the file. We
derive the permutation from ``sha256(f"{seed}:{question_id}")`` instead, so it is the same for a
question whatever subset or order it is loaded in, across processes and Python versions.
"""

from __future__ import annotations

import random
import re
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from creditlab.rewards.math_verify_reward import BOXED as _BOXED
from creditlab.rewards.registry import RewardSpec, add_spec, register
from creditlab.seeds import derive_seed

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DEFAULT_N_OPTIONS = 10
"""Options assumed when the caller does not say [ours]: MMLU-Pro's maximum (A-J), GPQA's 4 inside it."""

MC_CORRECT, MC_WRONG = 1.0, 0.0

# ----------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------

# tier 1: an explicit answer statement, then connectors, then decoration, then the letter.
_MARKER = (
    r"(?:\banswers?\b"  # "Answer:", "the final answer is", "correct answer"
    r"|\b(?:correct|right|best|final)\s+(?:option|choice|letter)\b"  # "the correct option is"
    r"|\b(?:choose|chose|select|selected|pick|picked|go\s+with|going\s+with)\b)"  # "I choose"
)
_CONNECTOR = (
    r"(?:\s*(?:\bis\b|\bwas\b|\bwould\s+be\b|\bshould\s+be\b|\bmust\s+be\b|\bwill\s+be\b"
    r"|\bhere\b|\bthen\b|\btherefore\b|\bthus\b|\bclearly\b|\boption\b|\bchoice\b|\bletter\b"
    r"|:|=|-|–|—|>))*"
)
_DECORATION = r"(?:\s|[*_$(\[{]|\\boxed\{|\\text(?:bf)?\{|\\math(?:rm|bf)\{|\\\(|\\\[)*"
_TIER1_STATEMENT = re.compile(
    _MARKER + _CONNECTOR + _DECORATION + r"(?P<letter>[A-Za-z])(?![A-Za-z0-9])(?!['’][A-Za-z])",
    re.IGNORECASE,
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")
_BOXED_CHOICE = re.compile(r"^\(?(?P<letter>[A-Za-z])(?:\)|[.:])?(?:\s.*)?$", re.DOTALL)
_BOXED_BARE = re.compile(r"^\(?(?P<letter>[A-Za-z])\)?$")

# after a lower-case letter: only punctuation or the end (never a following word).
_LOWER_OK_AFTER = re.compile(r"\s*(?:$|[.,;:!?)\]}*$])")
# "I think", "I'm": the pronoun, not option I.
_PRONOUN_AFTER = re.compile(
    r"\s+(?:think|am|believe|would|will|guess|have|need|can|could|should|must|know|was|feel|"
    r"suspect|assume|chose|choose|pick|select|get|got|did|do|see|agree)\b",
    re.IGNORECASE,
)
# hedges around the candidate letter: "A or B", "(A)/(B)", "\\boxed{A} or \\boxed{B}", "A or \\boxed{B}"
_HEDGE_OPEN = r"(?:\s|[(*$\[{]|\\boxed\{|\\text(?:bf)?\{|\\math(?:rm|bf)\{|\\\(|\\\[)*"
_HEDGE_CLOSE = r"(?:\s|[)*$}\]]|\\\)|\\\])*"
_HEDGE_WORD = r"(?:\bor\b|\band\b|/)"
_HEDGE_AFTER = re.compile(_HEDGE_CLOSE + _HEDGE_WORD + _HEDGE_OPEN + r"[A-Z](?![A-Za-z0-9])", re.IGNORECASE)
_HEDGE_BEFORE = re.compile(r"(?<![A-Za-z0-9])[A-Z]" + _HEDGE_CLOSE + _HEDGE_WORD + _HEDGE_OPEN + "$", re.IGNORECASE)
# a box holding two or more option letters: "\\boxed{A or B}", "\\boxed{A/B}", "\\boxed{A, C}" (not "\\boxed{x, y}")
_BOXED_HEDGE = re.compile(r"^\(?[A-Z]\)?(?:\s*(?:,|/|&|\b(?i:or|and)\b)\s*\(?[A-Z]\)?)+$")
# what may separate two boxed letters that are both final answers: "\\boxed{A}, \\boxed{B}",
# "\\boxed{A}\\quad\\boxed{B}", "\\boxed{A} \\text{or} \\boxed{B}"
_BOX_GAP_HEDGE = re.compile(
    r"(?:[^A-Za-z0-9]|\bor\b|\band\b|\beither\b|\\quad|\\qquad|\\text|\\\w+space)*", re.IGNORECASE
)
_BOX_GAP_MAX = 48

# tier 2 (upper case only)
_PAREN_LETTER = re.compile(r"(?<![A-Za-z0-9])\((?P<letter>[A-Z])\)")
_BOLD_LETTER = re.compile(r"\*\*\s*\(?(?P<letter>[A-Z])(?:(?:\)|[.:])(?:\s[^*\n]*)?)?\s*\*\*")
_LINE_LABEL = re.compile(r"(?m)^[ \t>*_#-]*\(?(?P<letter>[A-Z])(?:\)|[.:])(?=\s|$)")
_FINAL_LETTER = re.compile(r"(?<![A-Za-z0-9'’])(?P<letter>[A-Z])(?![A-Za-z0-9'’])[^A-Za-z0-9]*\Z")
# a line of an enumerated option list: "A) text", "(B) text", "C. text", "D: text"
_ENUM_LINE = re.compile(r"^[ \t>*_#-]*[(\[]?(?P<letter>[A-Z])[)\].:]\s+\S")


class _Candidate(NamedTuple):
    pos: int  # where the letter is, for "last wins"
    letter: str  # as written (case kept)
    hedged: bool


_MAX_BOXED_CHARS = 256
"""A box holding an option is short: longer ones are not read as a letter [ours]."""

_BRACE_TOKENS = re.compile(r"\\boxed\{|\\.|[{}]", re.DOTALL)


class _Box(NamedTuple):
    start: int  # where ``\\boxed{`` begins
    end: int  # one past its closing brace
    content: str


def _boxed_contents(text: str) -> list[_Box]:
    """Every ``\\boxed{...}`` with balanced braces and content shorter than ``_MAX_BOXED_CHARS``, in order.

    One left-to-right pass over the braces (a stack of the open ones), so linear in the text whatever
    it holds, e.g. 100,000 unclosed ``\\boxed{`` [ours]. Brace rules of
    :func:`~creditlab.rewards.math_verify_reward.boxed_content_at`: a backslash escapes the next character.
    """
    out = []
    stack: list[int] = []  # open braces: the start of a box, or -1 for a plain brace
    for m in _BRACE_TOKENS.finditer(text):
        token = m.group()
        if token == "{":
            stack.append(-1)
        elif token == "}":
            if stack:
                start = stack.pop()
                content_start = start + len(_BOXED)
                if start >= 0 and m.start() - content_start < _MAX_BOXED_CHARS:
                    out.append(_Box(start, m.end(), text[content_start : m.start()]))
        elif token == _BOXED:
            stack.append(m.start())
        # else an escaped character: \{ and \} are content, not braces
    out.sort()  # an inner box closes before the box around it
    return out


def _unwrap_box(content: str) -> str:
    inner = content
    for _ in range(3):  # unwrap nested \text{\textbf{C}}
        inner = _TEXT_WRAPPER.sub(r"\1", inner)
    return inner.replace("$", "").replace("*", "").strip()


def _boxed_letter(content: str) -> str | None:
    """The option letter a ``\\boxed{}`` holds: ``C``, ``(C)``, ``\\text{C}``, ``C) text``; else None."""
    inner = _unwrap_box(content)
    m = _BOXED_BARE.match(inner)
    if m:  # "\boxed{c}": a lone letter, either case
        return m.group("letter")
    m = _BOXED_CHOICE.match(inner)
    if m and m.group("letter").isupper():  # "\boxed{C) 42 eV}"; never "\boxed{x + 1}"
        return m.group("letter")
    return None


def _boxed_hedge(content: str) -> bool:
    """True for a box that holds several letters: ``A or B``, ``A/B``, ``(A), (C)``."""
    return bool(_BOXED_HEDGE.match(_unwrap_box(content)))


def _hedged(text: str, start: int, end: int) -> bool:
    # lookbehinds see before ``pos`` and ``$`` matches at ``endpos``: search only the 24 chars before
    return bool(_HEDGE_AFTER.match(text, end) or _HEDGE_BEFORE.search(text, max(0, start - 24), start))


def _tier1(text: str) -> _Candidate | None:
    """The last explicit answer (statement or ``\\boxed{}``); only its hedging is examined (linear)."""
    last: tuple[int, str, int] | None = None  # (letter position, letter, end)
    for m in _TIER1_STATEMENT.finditer(text):
        letter, start, end = m.group("letter"), m.start("letter"), m.end("letter")
        if letter.islower() and not _LOWER_OK_AFTER.match(text, end):
            continue  # "the answer is a little tricky"
        if letter in "Ii" and _PRONOUN_AFTER.match(text, end):
            continue  # "Answer: I think it is B"
        last = (start, letter, end)
    box = _last_boxed_candidate(text)
    if last is not None and (box is None or last[0] > box.pos):
        return _Candidate(last[0], last[1], _hedged(text, last[0], last[2]))
    return box


def _last_boxed_candidate(text: str) -> _Candidate | None:
    """The last ``\\boxed{}`` that holds a letter (or several: a hedge), with its hedging."""
    boxes = _boxed_contents(text)
    for k in range(len(boxes) - 1, -1, -1):
        box = boxes[k]
        pos = box.start + len(_BOXED)
        if _boxed_hedge(box.content):  # "\boxed{A or B}": an answer, but two letters
            return _Candidate(pos, "?", True)
        letter = _boxed_letter(box.content)
        if letter is None:
            continue
        hedged = _hedged(text, pos, box.end) or (k > 0 and _boxes_hedge(text, boxes[k - 1], box, letter))
        return _Candidate(pos, letter, hedged)
    return None


def _boxes_hedge(text: str, prev: _Box, box: _Box, letter: str) -> bool:
    """``prev`` holds another letter and only punctuation or "or"/"and" stand between the two boxes."""
    if box.start < prev.end or box.start - prev.end > _BOX_GAP_MAX:
        return False
    prev_letter = _boxed_letter(prev.content)
    if prev_letter is None or prev_letter.upper() == letter.upper():
        return False
    return _BOX_GAP_HEDGE.fullmatch(text, prev.end, box.start) is not None


def _enumeration_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of lines that belong to a restated option list (>= 2 consecutive letters)."""
    labelled: list[tuple[int, int, int]] = []  # (letter index, line start, line end)
    pos = 0
    for line in text.splitlines(keepends=True):
        m = _ENUM_LINE.match(line)
        if m:
            labelled.append((LETTERS.index(m.group("letter")), pos, pos + len(line)))
        elif line.strip():
            labelled.append((-10, pos, pos + len(line)))  # a non-label line breaks a run
        pos += len(line)
    spans = []
    for k, (idx, lo, hi) in enumerate(labelled):
        if idx < 0:
            continue
        prev_ok = k > 0 and labelled[k - 1][0] == idx - 1
        next_ok = k + 1 < len(labelled) and labelled[k + 1][0] == idx + 1
        if prev_ok or next_ok:
            spans.append((lo, hi))
    return spans


def _tier2(text: str) -> _Candidate | None:
    """The last bare letter form outside a restated option list; only its hedging is examined."""
    enum_spans = _enumeration_spans(text)  # sorted, disjoint
    enum_starts = [lo for lo, _ in enum_spans]

    def in_enumeration(pos: int) -> bool:  # a bisection: linear overall even with many lines and letters
        k = bisect_right(enum_starts, pos) - 1
        return k >= 0 and pos < enum_spans[k][1]

    last: tuple[int, str, int] | None = None  # (letter position, letter, end); the first pattern wins ties
    for pattern in (_PAREN_LETTER, _BOLD_LETTER, _LINE_LABEL, _FINAL_LETTER):
        for m in pattern.finditer(text):
            start, end = m.start("letter"), m.end("letter")
            if last is not None and start <= last[0]:
                continue
            if in_enumeration(start):
                continue
            if m.group("letter") == "I" and _PRONOUN_AFTER.match(text, end):
                continue
            last = (start, m.group("letter"), end)
    return None if last is None else _Candidate(last[0], last[1], _hedged(text, last[0], last[2]))


def extract_choice(response: str, n_options: int = DEFAULT_N_OPTIONS) -> str | None:
    """The option letter (upper case) a response chooses among ``n_options`` options, or None.

    Tier 1 (explicit answer statements, ``\\boxed{}``) before tier 2 (bare letter forms); the last
    candidate of the first non-empty tier decides; None when it is hedged (``A or B``) or beyond
    the ``n_options`` letters (``Answer: E`` with 4 options). See the module docstring for the
    forms and the references they come from.

    >>> extract_choice("The answer is (C).", 4)
    'C'
    >>> extract_choice("A or B? I think B", 4)
    'B'
    >>> extract_choice("Answer: E", 4) is None
    True
    """
    if not 1 <= n_options <= len(LETTERS):
        raise ValueError(f"n_options must be in 1..{len(LETTERS)}, got {n_options}")
    if not response:
        return None
    for tier in (_tier1, _tier2):
        last = tier(response)
        if last is None:
            continue
        if last.hedged:
            return None
        letter = last.letter.upper()
        return letter if LETTERS.index(letter) < n_options else None
    return None


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------


def option_seed(seed: int, question_id: str) -> int:
    """A stable 63-bit seed for one question's permutation (independent of hash randomisation)."""
    return derive_seed(seed, question_id)


def shuffle_options(options: Sequence[str], correct_index: int, seed: int, question_id: str) -> tuple[list[str], str]:
    """Shuffle ``options`` deterministically per question; return them and the correct letter.

    The permutation is ``random.Random(option_seed(seed, question_id)).sample(range(n), n)`` (the
    same draw as simple-evals' ``rng.sample(range(4), 4)``, seeded per question [ours]). For GPQA,
    pass ``[correct, incorrect 1, incorrect 2, incorrect 3]`` and ``correct_index=0``.

    Raises:
        ValueError: on an empty option list, an index out of range, or more options than letters.
    """
    n = len(options)
    if n == 0 or n > len(LETTERS):
        raise ValueError(f"need 1..{len(LETTERS)} options, got {n}")
    if not 0 <= correct_index < n:
        raise ValueError(f"correct_index {correct_index} out of range for {n} options")
    perm = random.Random(option_seed(seed, question_id)).sample(range(n), n)
    shuffled = [options[i] for i in perm]
    return shuffled, LETTERS[perm.index(correct_index)]


def render_options(options: Sequence[str]) -> str:
    """``"A) first\\nB) second..."`` [ours: the option block of our MC question text]."""
    return "\n".join(f"{LETTERS[i]}) {opt}" for i, opt in enumerate(options))


def render_mc_question(question: str, options: Sequence[str]) -> str:
    """The question, a blank line, then the lettered options [ours]."""
    return f"{question.strip()}\n\n{render_options(options)}"


# ----------------------------------------------------------------------------------------------
# Judge and registered reward
# ----------------------------------------------------------------------------------------------


def judge_choice(letter: str, gold: str) -> float:
    """1.0 iff ``letter`` equals the gold letter (case-insensitive, surrounding spaces ignored)."""
    return MC_CORRECT if letter.strip().upper() == gold.strip().upper() else MC_WRONG


@register("multiple_choice")
def multiple_choice_score(response: str, gold: str, n_options: int = DEFAULT_N_OPTIONS) -> float:
    """Binary MC reward: 1.0 iff the letter :func:`extract_choice` finds equals ``gold`` (a letter).

    ``n_options`` defaults to 10 (A-J, MMLU-Pro's maximum) [ours]: the registered signature
    ``fn(response, gold)`` does not carry the option count; pass it when known (GPQA: 4) so that a
    final letter beyond the options is no answer rather than a wrong one (both score 0.0 anyway;
    it matters only when the gold letter is beyond the true count, which a valid record never has).
    """
    letter = extract_choice(response, n_options)
    if letter is None:
        return MC_WRONG
    return judge_choice(letter, gold)


MULTIPLE_CHOICE_SPEC = RewardSpec(
    name="multiple_choice",
    extract=extract_choice,
    judge=judge_choice,
    failure=MC_WRONG,
    cache_tag="multiple_choice/v1",
)
"""Extract/judge split of ``multiple_choice`` for :class:`~creditlab.rewards.scorer.RewardScorer`
(registered below; ``creditlab.rewards`` imports this module, so scorer workers see it)."""
add_spec(MULTIPLE_CHOICE_SPEC)
