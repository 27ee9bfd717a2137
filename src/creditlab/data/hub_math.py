"""Loaders of the paper-scale math datasets (SPEC.md, "Data at paper scale") into the normalised record.

Every loader reads local files as the Hub ships them -- parquet, JSON lines (``.jsonl``, or a
``.json`` holding JSON lines or one JSON array), CSV -- or an iterable of row dicts, and yields
validated records (:mod:`creditlab.data.schema`). Nothing downloads. Each record's ``meta`` carries
its provenance: ``hub_id`` (the Hugging Face id), ``hub_split``, ``file`` (the file name, None for
in-memory rows) and ``row`` (the row index within that file), plus the dataset's own useful columns.
A row that lacks a field, or whose field has the wrong type, raises a ``ValueError`` that names the
dataset, the file, the row and the field.

Field mapping (question <- / answer <-) [SPEC.md's table; the columns and types checked against the
dataset cards where we could read them -- see the notes]:

===================  =====================================  ===============  =========================
name (= source)      Hub id (split)                          question         answer
===================  =====================================  ===============  =========================
deepmath             zwhe99/DeepMath-103K (train)            question         final_answer
dapo-math-17k        BytedTsinghua-SIA/DAPO-Math-17k (train) prompt[user]     reward_model.ground_truth
math                 DigitalLearningGmbH/MATH-lighteval      problem          last \\boxed{} of solution
                     (train); ``math-test``: its test split
math500              HuggingFaceH4/MATH-500 (test)           problem          answer
aime24               HuggingFaceH4/aime_2024 (train)         problem          answer
aime25               math-ai/aime25 (test)                   problem          answer
aime25-matharena     MathArena/aime_2025 (train)             problem          answer (int64 there)
amc23                math-ai/amc23 (test)                    question         answer (float64 there)
minerva              math-ai/minervamath (test)              question         answer
olympiadbench        math-ai/olympiadbench (test)            question         final_answer (list)
                                                             (or problem)     (or answer)
hmmt-feb-2025        MathArena/hmmt_feb_2025 (train)         problem          answer
hmmt-feb-2026        MathArena/hmmt_feb_2026 (train)         problem          answer
hmmt-nov-2025        MathArena/hmmt_nov_2025 (train)         problem          answer
aime26               MathArena/aime_2026 (train)             problem          answer
brumo-2025           MathArena/brumo_2025 (train)            problem          answer
===================  =====================================  ===============  =========================

Conventions [ours]:

* Texts are stripped of surrounding whitespace. Numeric answers become strings: integers as
  ``str(int)``, integral floats without the ``.0`` (AMC23 stores ``27.0``), other floats by ``repr``.
* ``id`` is ``<name>/<native id>`` where the dataset has a native id (MATH-500 ``unique_id``,
  AIME 2024 / AIME25 / AMC23 / OlympiadBench ``id``, MathArena ``problem_idx``), else
  ``<name>/<hub split>/<row index over the files in order>``; ids must be unique within a load.
* DAPO-Math-17k: the question is the user message of the ``prompt`` chat list with DAPO's
  instruction wrapper (:data:`DAPO_PREFIX` ... :data:`DAPO_SUFFIX`) removed, so the prompt template
  of the config applies to it as to every other dataset; ``meta.dapo_wrapper`` says whether the
  wrapper was found. Its ~100x duplicated rows are all yielded (ids by row index): dedupe with
  :mod:`creditlab.data.dedupe`.
* MATH-lighteval: the answer is the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) of
  ``solution``, by the project's single balanced-brace scanner
  (:func:`creditlab.rewards.math_verify_reward.boxed_content_at`). A solution without one raises,
  unless ``skip_unboxed=True`` (then the row is skipped and counted in ``stats``).
* OlympiadBench: ``math-ai/olympiadbench`` carries OlympiadBench's own columns (``question``,
  ``final_answer`` a list of ``$...$`` strings, ``is_multiple_answer``, ``answer_type``, ``unit``,
  ``modality`` ...); SPEC's table names ``problem`` / ``answer``. Both are accepted: a list answer
  has its ``$`` delimiters removed and its items joined with ``", "`` [ours].
* The generated solution ``solution`` of a record is None throughout (no dataset's solution column
  ends with exactly ``\\boxed{answer}``).

Every loader takes ``stats`` (a dict, optional): it adds ``rows`` (rows read) and ``skipped``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditlab.data.schema import make_record
from creditlab.rewards.math_verify_reward import BOXED, extract_last_boxed

log = logging.getLogger(__name__)

Row = Mapping[str, Any]
Record = dict[str, Any]
Source = str | Path | Iterable[Any]
"""A file, several files, or row dicts (or a mix of paths and row dicts)."""

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
"""DAPO-Math-17k's instruction wrapper around each problem (the user message of ``prompt``)."""

_FBOX = "\\fbox{"


# ----------------------------------------------------------------------------------------------
# Reading files with provenance
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowRef:
    """Where a row comes from: ``file`` (a path's display name, None in memory) and its ``row`` index."""

    file: str | None
    row: int
    index: int
    """The row's index over all files of the load, in order (the Hub dataset's row index)."""

    def where(self, dataset: str) -> str:
        return f"{dataset}: {self.file or '<rows>'} row {self.row}"


PARQUET_BATCH_ROWS = 65536


def _iter_file(path: Path) -> Iterator[dict[str, Any]]:
    suffix = path.suffix.lower()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS):
            yield from batch.to_pylist()
    elif suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as fh:
            head = fh.read(4096).lstrip()
        if suffix == ".json" and head.startswith("["):
            rows = json.loads(path.read_text(encoding="utf-8"))
            yield from rows
            return
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}: line {lineno} is not JSON: {err}") from err
    elif suffix == ".csv":
        import pyarrow.csv as pacsv

        yield from pacsv.read_csv(path).to_pylist()
    else:
        raise ValueError(f"{path}: unsupported file type {suffix!r} (expected .parquet, .jsonl, .json or .csv)")


def iter_hub_rows(source: Source) -> Iterator[tuple[RowRef, dict[str, Any]]]:
    """``(RowRef, row)`` for every row of ``source``: a file, a list of files and/or row dicts.

    Parquet files are streamed in batches (DAPO-Math-17k's file has 1.79M rows).
    """
    items: Iterable[Any] = [source] if isinstance(source, (str, Path)) else source
    index = 0
    loose = 0
    for item in items:
        if isinstance(item, (str, Path)):
            path = Path(item)
            for row_no, row in enumerate(_iter_file(path)):
                if not isinstance(row, Mapping):
                    raise ValueError(f"{path} row {row_no}: expected an object, got {type(row).__name__}")
                yield RowRef(str(path), row_no, index), dict(row)
                index += 1
        elif isinstance(item, Mapping):
            yield RowRef(None, loose, index), dict(item)
            loose += 1
            index += 1
        else:
            raise TypeError(f"expected a row dict or a file path, got {type(item).__name__}")


# ----------------------------------------------------------------------------------------------
# Field access with errors that name file, row and field
# ----------------------------------------------------------------------------------------------


def _missing(row: Row, field: str, where: str) -> ValueError:
    return ValueError(f"{where}: missing field {field!r} (row has {sorted(row)})")


def _text(row: Row, field: str, where: str) -> str:
    """A required non-empty string field, stripped."""
    if field not in row or row[field] is None:
        raise _missing(row, field, where)
    value = row[field]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: field {field!r} must be a non-empty string, got {value!r}")
    return value.strip()


def answer_text(value: Any, field: str, where: str) -> str:
    """An answer cell as a string: strings stripped, integers as is, integral floats without ``.0``."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: field {field!r} must be a string or a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}: field {field!r} is not a finite number: {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"{where}: field {field!r} must be a non-empty string or a number, got {value!r}")


def _answer(row: Row, field: str, where: str) -> str:
    if field not in row:
        raise _missing(row, field, where)
    return answer_text(row[field], field, where)


def _native_id(row: Row, field: str, where: str) -> str:
    value = row.get(field)
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{where}: field {field!r} (the row's id) is missing or empty")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _jsonable(value: Any) -> Any:
    """A cell as plain JSON data (numpy arrays / tuples to lists, NaN to None)."""
    if isinstance(value, float) and value != value:
        return None
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------------------------------
# The generic loader
# ----------------------------------------------------------------------------------------------

RowParser = Callable[[Row, str], tuple[str, str, dict[str, Any]] | None]
"""``(row, where) -> (question, answer, meta)``, or None to skip the row."""


def _iter_records(
    source: Source,
    *,
    name: str,
    hub_id: str,
    hub_split: str,
    split: str,
    parse: RowParser,
    id_field: str | None = None,
    id_optional: bool = False,
    stats: dict[str, int] | None = None,
) -> Iterator[Record]:
    """Parse each row of ``source`` into a validated record with provenance; ids must be unique.

    The id is ``<name>/<row[id_field]>``, or ``<name>/<hub_split>/<row index>`` without an
    ``id_field`` (or, with ``id_optional``, for a row that lacks it).
    """
    stats = stats if stats is not None else {}
    stats.setdefault("rows", 0)
    stats.setdefault("skipped", 0)
    seen: set[str] = set()
    for ref, row in iter_hub_rows(source):
        stats["rows"] += 1
        where = ref.where(name)
        parsed = parse(row, where)
        if parsed is None:
            stats["skipped"] += 1
            continue
        question, answer, meta = parsed
        if id_field and not (id_optional and row.get(id_field) is None):
            native = _native_id(row, id_field, where)
        else:
            native = f"{hub_split}/{ref.index:06d}"
        rec_id = f"{name}/{native}"
        if rec_id in seen:
            raise ValueError(f"{where}: duplicate record id {rec_id!r}")
        seen.add(rec_id)
        provenance = {
            "hub_id": hub_id,
            "hub_split": hub_split,
            "file": Path(ref.file).name if ref.file else None,
            "row": ref.row,
        }
        try:
            yield make_record(
                id=rec_id,
                source=name,
                split=split,
                question=question,
                answer=answer,
                solution=None,
                meta={**provenance, **{k: _jsonable(v) for k, v in meta.items()}},
            )
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err


# ----------------------------------------------------------------------------------------------
# Per-dataset row parsers
# ----------------------------------------------------------------------------------------------


def _parse_deepmath(row: Row, where: str) -> tuple[str, str, dict[str, Any]]:
    return (
        _text(row, "question", where),
        _answer(row, "final_answer", where),
        {"difficulty": row.get("difficulty"), "topic": row.get("topic")},
    )


_DAPO_LEAD = "Solve the following math problem step by step."
_DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:"'


def strip_dapo_wrapper(content: str) -> tuple[str, bool]:
    """DAPO's user message -> (problem text, whether DAPO's wrapper was found and removed).

    The exact wrapper (:data:`DAPO_PREFIX` + problem + :data:`DAPO_SUFFIX`) is removed first; failing
    that, a message opening with DAPO's first sentence loses everything up to its first blank line and
    from its closing reminder on [ours: tolerance for re-exports that touched the wrapper's wording].
    """
    text = content.strip()
    prefix, suffix = DAPO_PREFIX.strip(), DAPO_SUFFIX.strip()
    if text.startswith(prefix) and text.endswith(suffix):
        return text[len(prefix) : len(text) - len(suffix)].strip(), True
    if text.startswith(_DAPO_LEAD) and "\n\n" in text:
        body = text.split("\n\n", 1)[1]
        return body.split(_DAPO_TAIL, 1)[0].strip(), True
    return text, False


def _dapo_user_message(row: Row, where: str) -> str:
    if "prompt" not in row or row["prompt"] is None:
        raise _missing(row, "prompt", where)
    prompt = _jsonable(row["prompt"])
    if isinstance(prompt, str):
        try:
            prompt = json.loads(prompt)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: field 'prompt' must be a chat list, got a plain string") from None
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{where}: field 'prompt' must be a non-empty chat list, got {prompt!r}")
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise ValueError(f"{where}: field 'prompt' has no message with role 'user': {prompt!r}")
    content = users[-1].get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError(f"{where}: field 'prompt' user message has no text content")
    return content


def _parse_dapo(row: Row, where: str) -> tuple[str, str, dict[str, Any]]:
    question, wrapped = strip_dapo_wrapper(_dapo_user_message(row, where))
    if not question:
        raise ValueError(f"{where}: field 'prompt' holds an empty problem")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping):
        raise (
            _missing(row, "reward_model", where)
            if reward_model is None
            else ValueError(f"{where}: field 'reward_model' must be a dict, got {reward_model!r}")
        )
    if "ground_truth" not in reward_model:
        raise ValueError(
            f"{where}: missing field 'reward_model.ground_truth' (reward_model has {sorted(reward_model)})"
        )
    answer = answer_text(reward_model["ground_truth"], "reward_model.ground_truth", where)
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    meta = {
        "dapo_wrapper": wrapped,
        "index": extra.get("index"),
        "data_source": row.get("data_source"),
        "ability": row.get("ability"),
        "reward_style": reward_model.get("style"),
    }
    return question, answer, meta


def last_boxed_answer(solution: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``solution`` (balanced braces), or None."""
    content = extract_last_boxed(solution.replace(_FBOX, BOXED))
    return content.strip() if content and content.strip() else None


def _parse_math_lighteval(skip_unboxed: bool) -> RowParser:
    def parse(row: Row, where: str) -> tuple[str, str, dict[str, Any]] | None:
        question = _text(row, "problem", where)
        solution = _text(row, "solution", where)
        answer = last_boxed_answer(solution)
        if answer is None:
            if skip_unboxed:
                log.warning("%s: no \\boxed{} answer in 'solution'; skipped", where)
                return None
            raise ValueError(f"{where}: field 'solution' has no closed \\boxed{{...}} answer (skip_unboxed=False)")
        return question, answer, {"level": row.get("level"), "type": row.get("type")}

    return parse


def _parse_problem_answer(question_field: str, *meta_fields: str) -> RowParser:
    def parse(row: Row, where: str) -> tuple[str, str, dict[str, Any]]:
        meta = {f: row.get(f) for f in meta_fields}
        return _text(row, question_field, where), _answer(row, "answer", where), meta

    return parse


def _strip_dollars(text: str) -> str:
    text = text.strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


_OLYMPIAD_META = ("answer_type", "is_multiple_answer", "unit", "subfield", "subject", "language", "modality")


def _parse_olympiadbench(row: Row, where: str) -> tuple[str, str, dict[str, Any]]:
    q_field = "question" if row.get("question") is not None else "problem"
    if q_field not in row:
        raise _missing(row, "question", where)
    question = _text(row, q_field, where)
    if row.get("final_answer") is not None:
        a_field, raw = "final_answer", _jsonable(row["final_answer"])
    elif "answer" in row:
        a_field, raw = "answer", row["answer"]
    else:
        raise _missing(row, "final_answer", where)
    if isinstance(raw, list):
        parts = [_strip_dollars(answer_text(v, a_field, where)) for v in raw]
        parts = [p for p in parts if p]
        if not parts:
            raise ValueError(f"{where}: field {a_field!r} is an empty list")
        answer = ", ".join(parts)
    else:
        answer = _strip_dollars(answer_text(raw, a_field, where))
        if not answer:
            raise ValueError(f"{where}: field {a_field!r} is empty")
    return question, answer, {f: row.get(f) for f in _OLYMPIAD_META}


# ----------------------------------------------------------------------------------------------
# Public loaders (generators) and list-returning wrappers
# ----------------------------------------------------------------------------------------------


def iter_deepmath(source: Source, split: str = "train", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """DeepMath-103K: ``question`` / ``final_answer``; meta ``difficulty``, ``topic`` (R1 solutions dropped)."""
    return _iter_records(
        source,
        name="deepmath",
        hub_id="zwhe99/DeepMath-103K",
        hub_split="train",
        split=split,
        parse=_parse_deepmath,
        stats=stats,
    )


def iter_dapo_math_17k(source: Source, split: str = "train", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """DAPO-Math-17k: question from the user message of ``prompt`` (wrapper removed), answer from
    ``reward_model.ground_truth``; meta ``index`` (``extra_info.index``), ``data_source``, ``ability``,
    ``reward_style``, ``dapo_wrapper``. Duplicated rows are all yielded."""
    return _iter_records(
        source,
        name="dapo-math-17k",
        hub_id="BytedTsinghua-SIA/DAPO-Math-17k",
        hub_split="train",
        split=split,
        parse=_parse_dapo,
        stats=stats,
    )


def iter_math_lighteval(
    source: Source,
    split: str = "train",
    hub_split: str = "train",
    skip_unboxed: bool = False,
    stats: dict[str, int] | None = None,
) -> Iterator[Record]:
    """MATH-lighteval (``hub_split`` train or test): ``problem``; answer = last boxed answer of ``solution``.

    Meta ``level`` ("Level 3"), ``type`` ("Algebra"). Source/name ``math`` for the train split,
    ``math-test`` for the test split.
    """
    if hub_split not in ("train", "test"):
        raise ValueError(f"MATH-lighteval has splits 'train' and 'test', not {hub_split!r}")
    name = "math" if hub_split == "train" else "math-test"
    return _iter_records(
        source,
        name=name,
        hub_id="DigitalLearningGmbH/MATH-lighteval",
        hub_split=hub_split,
        split=split,
        parse=_parse_math_lighteval(skip_unboxed),
        stats=stats,
    )


def iter_math_lighteval_test(
    source: Source, split: str = "math-test", skip_unboxed: bool = False, stats: dict[str, int] | None = None
) -> Iterator[Record]:
    return iter_math_lighteval(source, split=split, hub_split="test", skip_unboxed=skip_unboxed, stats=stats)


def iter_math500(source: Source, split: str = "math500", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """MATH-500: ``problem`` / ``answer``; id ``math500/<unique_id>``; meta ``unique_id``, ``subject``, ``level``."""
    return _iter_records(
        source,
        name="math500",
        hub_id="HuggingFaceH4/MATH-500",
        hub_split="test",
        split=split,
        parse=_parse_problem_answer("problem", "unique_id", "subject", "level"),
        id_field="unique_id",
        stats=stats,
    )


def iter_aime24(source: Source, split: str = "aime24", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """AIME 2024 (HuggingFaceH4/aime_2024): ``problem`` / ``answer``; id ``aime24/<id>``; meta ``url``, ``year``."""
    return _iter_records(
        source,
        name="aime24",
        hub_id="HuggingFaceH4/aime_2024",
        hub_split="train",
        split=split,
        parse=_parse_problem_answer("problem", "url", "year"),
        id_field="id",
        stats=stats,
    )


def iter_aime25(source: Source, split: str = "aime25", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """AIME 2025 (math-ai/aime25, test.jsonl): ``problem`` / ``answer``; id ``aime25/<id>``."""
    return _iter_records(
        source,
        name="aime25",
        hub_id="math-ai/aime25",
        hub_split="test",
        split=split,
        parse=_parse_problem_answer("problem"),
        id_field="id",
        stats=stats,
    )


def _matharena(name: str, hub_id: str) -> Callable[..., Iterator[Record]]:
    def iter_matharena(source: Source, split: str = name, stats: dict[str, int] | None = None) -> Iterator[Record]:
        return _iter_records(
            source,
            name=name,
            hub_id=hub_id,
            hub_split="train",
            split=split,
            parse=_parse_problem_answer("problem", "problem_idx", "problem_type"),
            id_field="problem_idx",
            stats=stats,
        )

    iter_matharena.__name__ = f"iter_{name.replace('-', '_')}"
    iter_matharena.__doc__ = (
        f"{hub_id} (MathArena; split train): ``problem`` / ``answer`` (a string, or an "
        f"integer); id ``{name}/<problem_idx>``; meta ``problem_idx``, ``problem_type``."
    )
    return iter_matharena


iter_aime25_matharena = _matharena("aime25-matharena", "MathArena/aime_2025")
iter_hmmt_feb_2025 = _matharena("hmmt-feb-2025", "MathArena/hmmt_feb_2025")
iter_hmmt_feb_2026 = _matharena("hmmt-feb-2026", "MathArena/hmmt_feb_2026")
iter_brumo_2025 = _matharena("brumo-2025", "MathArena/brumo_2025")
# [ours] SPEC's data table names no AIME 2026 / HMMT Nov 2025 source; MathArena publishes both like its other
# competitions (configs/suites/paper.yaml aime26, hmmt25-nov)
iter_hmmt_nov_2025 = _matharena("hmmt-nov-2025", "MathArena/hmmt_nov_2025")
iter_aime26 = _matharena("aime26", "MathArena/aime_2026")


def iter_amc23(source: Source, split: str = "amc23", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """AMC 2023 (math-ai/amc23): ``question`` / ``answer`` (float64 on the Hub: 27.0 -> "27"); id ``amc23/<id>``."""
    return _iter_records(
        source,
        name="amc23",
        hub_id="math-ai/amc23",
        hub_split="test",
        split=split,
        parse=_parse_problem_answer("question", "url"),
        id_field="id",
        stats=stats,
    )


def iter_minerva(source: Source, split: str = "minerva", stats: dict[str, int] | None = None) -> Iterator[Record]:
    """Minerva math (math-ai/minervamath): ``question`` / ``answer``; ids by row index."""
    return _iter_records(
        source,
        name="minerva",
        hub_id="math-ai/minervamath",
        hub_split="test",
        split=split,
        parse=_parse_problem_answer("question"),
        stats=stats,
    )


def iter_olympiadbench(
    source: Source, split: str = "olympiadbench", stats: dict[str, int] | None = None
) -> Iterator[Record]:
    """OlympiadBench (math-ai/olympiadbench): ``question`` / ``final_answer`` (see the module docstring);
    id ``olympiadbench/<id>`` (by row index when the file has no ``id``)."""
    return _iter_records(
        source,
        name="olympiadbench",
        hub_id="math-ai/olympiadbench",
        hub_split="test",
        split=split,
        parse=_parse_olympiadbench,
        id_field="id",
        id_optional=True,
        stats=stats,
    )


def load_deepmath(source: Source, **kw: Any) -> list[Record]:
    return list(iter_deepmath(source, **kw))


def load_dapo_math_17k(source: Source, **kw: Any) -> list[Record]:
    return list(iter_dapo_math_17k(source, **kw))


def load_math_lighteval(source: Source, **kw: Any) -> list[Record]:
    return list(iter_math_lighteval(source, **kw))


def load_math500(source: Source, **kw: Any) -> list[Record]:
    return list(iter_math500(source, **kw))


def load_aime24(source: Source, **kw: Any) -> list[Record]:
    return list(iter_aime24(source, **kw))


def load_aime25(source: Source, **kw: Any) -> list[Record]:
    return list(iter_aime25(source, **kw))


def load_amc23(source: Source, **kw: Any) -> list[Record]:
    return list(iter_amc23(source, **kw))


def load_minerva(source: Source, **kw: Any) -> list[Record]:
    return list(iter_minerva(source, **kw))


def load_olympiadbench(source: Source, **kw: Any) -> list[Record]:
    return list(iter_olympiadbench(source, **kw))
