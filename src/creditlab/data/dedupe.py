"""Deduplication of a training set and its contamination check against evaluation sets.

Text normalisation [ours] (:func:`normalize_text`), used by both:

1. Unicode NFKC, then case folding;
2. math delimiters ``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]`` removed;
3. LaTeX spacing and sizing removed -- ``\\,`` ``\\;`` ``\\:`` ``\\!`` ``\\ `` ``~`` ``\\quad``
   ``\\qquad`` ``\\left`` ``\\right`` -- and ``\\dfrac`` / ``\\tfrac`` written ``\\frac``;
4. whitespace next to a non-alphanumeric character removed (``x + 1`` == ``x+1``,
   ``\\frac {1}{2}`` == ``\\frac{1}{2}``); other runs of whitespace become one space; ends stripped.

Deduplication (:class:`Deduper`, :func:`dedupe`): two records are duplicates when their questions
are equal (*exact*) or equal after :func:`normalize_text` (*normalised*); the first one is kept.
Counted: exact and normalised duplicates, answer conflicts (a duplicate whose normalised answer
differs from the kept one's: the kept answer wins), the largest number of copies of one question.

Contamination (:func:`check_contamination`) of a training item against an evaluation set [ours]:

* *exact*: its normalised question equals an evaluation question's;
* *n-gram*: it shares at least ``min_overlap`` distinct word ``n``-grams (default n = 13, the
  GPT-3 / PaLM decontamination length) with one evaluation question, words being the maximal runs
  of letters and digits of the normalised text (so LaTeX commands count as words: ``\\frac{1}{2}``
  gives ``frac 1 2``). A question shorter than ``n`` words can only match exactly.

The report counts, per evaluation set, the training items that hit it (by exact match, by n-grams),
the evaluation items that were hit, and a few examples; the action ``drop`` removes the flagged
training items, ``flag`` keeps them with ``meta["contaminated_with"]`` = the sorted evaluation
set names.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Record = dict[str, Any]

DEFAULT_NGRAM = 13
MAX_EXAMPLES = 10
CONTAMINATION_ACTIONS = ("drop", "flag")

_DELIMITERS = re.compile(r"\$|\\\(|\\\)|\\\[|\\\]")
_SPACING = re.compile(r"\\[,;:! ]|~|\\q?quad(?![a-z])|\\left(?![a-z])|\\right(?![a-z])")
_FRAC = re.compile(r"\\[dt]frac(?![a-z])")
_SPACE_AROUND_SYMBOL = re.compile(r"\s+(?=[^\w\s])|(?<=[^\w\s])\s+")
_SPACES = re.compile(r"\s+")
_WORD = re.compile(r"[^\W_]+")


def normalize_text(text: str) -> str:
    """The normalised form of a question or answer (see the module docstring)."""
    out = unicodedata.normalize("NFKC", text).casefold()
    out = _DELIMITERS.sub(" ", out)
    out = _SPACING.sub(" ", out)
    out = _FRAC.sub(r"\\frac", out)
    out = _SPACE_AROUND_SYMBOL.sub("", out)
    return _SPACES.sub(" ", out).strip()


def words(text: str) -> list[str]:
    """The words of ``normalize_text(text)``: maximal runs of letters and digits."""
    return _WORD.findall(normalize_text(text))


def ngrams(text: str, n: int = DEFAULT_NGRAM) -> set[str]:
    """The distinct word ``n``-grams of ``text`` (space-joined); empty when it has fewer than ``n`` words."""
    toks = words(text)
    return {" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)}


# ----------------------------------------------------------------------------------------------
# Deduplication
# ----------------------------------------------------------------------------------------------


class Deduper:
    """Streaming deduplication by question: :meth:`add` returns whether a record is new (keep it)."""

    def __init__(self) -> None:
        self._exact: dict[str, str] = {}  # question as given -> its normalised form
        self._first: dict[str, tuple[str, str]] = {}  # normalised question -> (kept id, kept answer)
        self._copies: dict[str, int] = {}
        self.n_in = 0
        self.exact_duplicates = 0
        self.normalized_duplicates = 0
        self.answer_conflicts = 0
        self.examples: list[dict[str, str]] = []
        self.conflict_examples: list[dict[str, str]] = []

    def add(self, rec: Mapping[str, Any]) -> bool:
        self.n_in += 1
        question, answer = rec["question"], str(rec["answer"])
        key = self._exact.get(question)
        kind = "exact"
        if key is None:  # the fast path above skips normalising the ~99% exact copies of DAPO-Math-17k
            key = normalize_text(question)
            self._exact[question] = key
            if key not in self._first:
                self._first[key] = (rec["id"], answer)
                self._copies[key] = 1
                return True
            kind = "normalized"
        self._copies[key] += 1
        if kind == "exact":
            self.exact_duplicates += 1
        else:
            self.normalized_duplicates += 1
        kept_id, kept_answer = self._first[key]
        if len(self.examples) < MAX_EXAMPLES and (kind == "normalized" or len(self.examples) < MAX_EXAMPLES // 2):
            self.examples.append({"kept": kept_id, "dropped": rec["id"], "kind": kind})
        if answer != kept_answer and normalize_text(answer) != normalize_text(kept_answer):
            self.answer_conflicts += 1
            if len(self.conflict_examples) < MAX_EXAMPLES:
                self.conflict_examples.append(
                    {"kept": kept_id, "dropped": rec["id"], "kept_answer": kept_answer, "dropped_answer": answer}
                )
        return False

    def report(self) -> dict[str, Any]:
        n_kept = len(self._first)
        return {
            "n_in": self.n_in,
            "n_kept": n_kept,
            "n_dropped": self.n_in - n_kept,
            "exact_duplicates": self.exact_duplicates,
            "normalized_duplicates": self.normalized_duplicates,
            "answer_conflicts": self.answer_conflicts,
            "max_copies": max(self._copies.values(), default=0),
            "duplication_factor": round(self.n_in / n_kept, 3) if n_kept else None,
            "examples": self.examples,
            "conflict_examples": self.conflict_examples,
        }


def dedupe(records: Iterable[Record]) -> tuple[list[Record], dict[str, Any]]:
    """Keep the first record of each question (exact or normalised duplicates dropped); return (kept, report)."""
    deduper = Deduper()
    kept = [rec for rec in records if deduper.add(rec)]
    return kept, deduper.report()


# ----------------------------------------------------------------------------------------------
# Contamination
# ----------------------------------------------------------------------------------------------


class ContaminationIndex:
    """Normalised questions and word n-grams of named evaluation sets, for :meth:`hits` look-ups."""

    def __init__(
        self, eval_sets: Mapping[str, Iterable[Mapping[str, Any]]], n: int = DEFAULT_NGRAM, min_overlap: int = 1
    ) -> None:
        if n < 1:
            raise ValueError(f"n-gram length must be >= 1, got {n}")
        if min_overlap < 1:
            raise ValueError(f"min_overlap must be >= 1, got {min_overlap}")
        self.n, self.min_overlap = n, min_overlap
        self.sizes: dict[str, int] = {}
        self._exact: dict[str, list[tuple[str, str]]] = {}  # normalised question -> [(eval set, eval id)]
        self._grams: dict[str, list[tuple[str, str]]] = {}  # n-gram -> [(eval set, eval id)]
        for name, records in eval_sets.items():
            count = 0
            for rec in records:
                count += 1
                ref = (name, rec["id"])
                self._exact.setdefault(normalize_text(rec["question"]), []).append(ref)
                for gram in ngrams(rec["question"], n):
                    self._grams.setdefault(gram, []).append(ref)
            self.sizes[name] = count

    def hits(self, question: str) -> list[dict[str, Any]]:
        """The evaluation items ``question`` collides with: ``{eval, eval_id, kind, shared_ngrams}``."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for ref in self._exact.get(normalize_text(question), []):
            found[ref] = {"eval": ref[0], "eval_id": ref[1], "kind": "exact", "shared_ngrams": None}
        shared: dict[tuple[str, str], int] = {}
        for gram in ngrams(question, self.n):
            for ref in self._grams.get(gram, ()):
                shared[ref] = shared.get(ref, 0) + 1
        for ref, count in shared.items():
            if ref in found:
                found[ref]["shared_ngrams"] = count
            elif count >= self.min_overlap:
                found[ref] = {"eval": ref[0], "eval_id": ref[1], "kind": "ngram", "shared_ngrams": count}
        return sorted(found.values(), key=lambda h: (h["eval"], str(h["eval_id"])))


def check_contamination(
    train: Iterable[Record],
    eval_sets: Mapping[str, Iterable[Mapping[str, Any]]],
    n: int = DEFAULT_NGRAM,
    min_overlap: int = 1,
    action: str = "drop",
    report_path: str | Path | None = None,
) -> tuple[list[Record], dict[str, Any]]:
    """Check every training record against every evaluation set; drop or flag the contaminated ones.

    Returns ``(train records kept, report)``; the report (also written as JSON to ``report_path`` if
    given) has ``method``, ``n_train``, ``n_contaminated``, ``n_dropped``, and ``per_eval[name]`` =
    ``{n_eval, train_items, by_exact, by_ngram, eval_items_hit, examples}``.
    """
    if action not in CONTAMINATION_ACTIONS:
        raise ValueError(f"contamination action must be one of {CONTAMINATION_ACTIONS}, got {action!r}")
    eval_sets = {name: list(records) for name, records in eval_sets.items()}
    index = ContaminationIndex(eval_sets, n=n, min_overlap=min_overlap)
    per_eval = {
        name: {
            "n_eval": index.sizes[name],
            "train_items": 0,
            "by_exact": 0,
            "by_ngram": 0,
            "eval_items_hit": set(),
            "examples": [],
        }
        for name in eval_sets
    }
    kept: list[Record] = []
    n_train = n_contaminated = 0
    for rec in train:
        n_train += 1
        hits = index.hits(rec["question"])
        if not hits:
            kept.append(rec)
            continue
        n_contaminated += 1
        by_eval: dict[str, list[dict[str, Any]]] = {}
        for hit in hits:
            by_eval.setdefault(hit["eval"], []).append(hit)
        for name, eval_hits in by_eval.items():
            entry = per_eval[name]
            entry["train_items"] += 1
            entry["by_exact" if any(h["kind"] == "exact" for h in eval_hits) else "by_ngram"] += 1
            entry["eval_items_hit"].update(h["eval_id"] for h in eval_hits)
            if len(entry["examples"]) < MAX_EXAMPLES:
                entry["examples"].append({"train_id": rec["id"], "hits": eval_hits})
        if action == "flag":
            kept.append({**rec, "meta": {**rec["meta"], "contaminated_with": sorted(by_eval)}})
    report = {
        "method": {
            "exact": "normalize_text equality",
            "ngram": n,
            "ngram_unit": "words: maximal letter/digit runs of normalize_text",
            "min_overlap": min_overlap,
            "action": action,
        },
        "n_train": n_train,
        "n_contaminated": n_contaminated,
        "n_dropped": n_contaminated if action == "drop" else 0,
        "n_kept": len(kept),
        "per_eval": {
            name: {**entry, "eval_items_hit": len(entry["eval_items_hit"])} for name, entry in per_eval.items()
        },
    }
    if report_path is not None:
        write_json(report, report_path)
    return kept, report


def write_json(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` as indented JSON (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
    return path
