"""Loaders of paper-scale Hugging Face evaluation sets into the normalised record (see ``schema``).

Each loader reads what the Hub exports -- a parquet file, a JSON-lines file (``.jsonl``/``.json``),
several of them -- or an iterable of row dicts (e.g. a ``datasets.Dataset``), and returns validated
records. Nothing here downloads: the machines we build on cannot reach the Hub, so the loaders are
tested on fixture files of the real schemas under ``tests/fixtures/hub/``.

* :func:`load_gpqa_diamond` -- ``Idavidrein/gpqa``, config ``gpqa_diamond`` (198 questions, split
  ``train``): ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``Record ID``.
* :func:`load_mmlu_pro` -- ``TIGER-Lab/MMLU-Pro`` (split ``test``): ``question_id``, ``question``,
  ``options`` (up to 10), ``answer`` (letter), ``answer_index``, ``category``, ``src``.
* :func:`load_livecodebench` -- ``livecodebench/code_generation_lite``: ``question_title``,
  ``question_content``, ``platform``, ``question_id``, ``contest_id``, ``contest_date``,
  ``starter_code``, ``difficulty``, ``public_test_cases`` (JSON), ``private_test_cases``
  (base64 of zlib of a pickled JSON string), ``metadata`` (JSON, ``func_name`` for LeetCode).

Record formats [ours unless marked]
-----------------------------------
Multiple choice (GPQA-Diamond, MMLU-Pro): ``question`` = the question text, a blank line, then one
line per option ``"A) ..."`` (:func:`creditlab.rewards.multiple_choice.render_mc_question`);
``answer`` = the gold letter; ``meta`` keeps the source ids, the option texts in the rendered
order and ``n_options``. GPQA's options are shuffled per question with a fixed seed
(:func:`~creditlab.rewards.multiple_choice.shuffle_options`) [paper: GPQA's practice; ours: the
per-question seeding]; MMLU-Pro's keep the dataset order (its gold letter refers to it) [paper].
Texts are stripped of surrounding whitespace (the GPQA files carry trailing newlines), as
lm-evaluation-harness does.

LiveCodeBench: ``question`` = ``question_content``; ``answer`` = a JSON string of the list of test
cases, public ones first then private ones, each ``{"input": str, "output": str, "testtype":
"stdin" | "functional"}`` exactly as LCB stores them (the format agreed with
:mod:`creditlab.rewards.code.cases`); ``meta`` has ``func_name`` (None for stdin problems),
``starter_code``, the split ``num_public_tests`` / ``num_private_tests`` (the first
``num_public_tests`` entries of ``answer`` are LCB's public tests), the source ids, ``contest_date``,
``platform``, ``difficulty`` and LCB's raw ``metadata`` dict as ``lcb_metadata``.

Release window: LiveCodeBench v6 as commonly reported = problems whose ``contest_date`` lies in
[2025-02-01, 2025-05-01), i.e. February-April 2025 [ours: our sources (SPEC.md, the DFPO text) name
no dates; start inclusive, end exclusive]. LCB's own runner compares ``start <= date <= end``; the
two differ only for a contest dated exactly 2025-05-01T00:00:00.

Private test decoding: the real dataset stores ``private_test_cases`` as
``base64(zlib(pickle.dumps(json_string)))``. Unpickling untrusted data can run arbitrary code, so
:func:`decode_private_test_cases` uses :class:`StrictStrUnpickler`, which resolves no global except
the two that pickle protocols 0-2 need for ``bytes`` (and refuses everything else), and accepts
only a ``str`` or ``bytes`` result.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from pathlib import Path
from typing import Any

from creditlab.data.schema import make_record
from creditlab.rewards.multiple_choice import (
    LETTERS,
    render_mc_question,
    shuffle_options,
)

Row = Mapping[str, Any]
Records = list[dict[str, Any]]

GPQA_SHUFFLE_SEED = 0
"""Default seed of GPQA's option shuffle (simple-evals uses ``random.Random(0)``) [ours]."""
LCB_V6_START = "2025-02-01"
LCB_V6_END = "2025-05-01"
"""LiveCodeBench v6 window, start inclusive and end exclusive [ours]."""
LCB_TEST_TYPES = ("stdin", "functional")
MAX_PRIVATE_TESTS_BYTES = 1 << 30
"""Refuse a private-test blob that decompresses past 1 GiB (a zlib bomb) [ours]."""


# ----------------------------------------------------------------------------------------------
# Reading Hub exports
# ----------------------------------------------------------------------------------------------


def read_rows(path_or_rows: str | Path | Iterable[Any]) -> list[dict[str, Any]]:
    """Rows of a Hub export: a ``.parquet`` / ``.jsonl`` / ``.json`` file, several, or row dicts.

    An iterable may mix row dicts and file paths (LiveCodeBench ships ``test.jsonl`` ..
    ``test6.jsonl``). A ``.json`` file is read as JSON lines unless it holds one JSON array.
    """
    if isinstance(path_or_rows, (str, Path)):
        return _read_file(Path(path_or_rows))
    rows: list[dict[str, Any]] = []
    for item in path_or_rows:
        if isinstance(item, (str, Path)):
            rows.extend(_read_file(Path(item)))
        elif isinstance(item, Mapping):
            rows.append(dict(item))
        else:
            raise TypeError(f"expected a row dict or a file path, got {type(item).__name__}")
    return rows


def _read_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8")
        if suffix == ".json" and text.lstrip().startswith("["):
            return list(json.loads(text))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    raise ValueError(f"{path}: unsupported file type {suffix!r} (expected .parquet, .jsonl or .json)")


def _text(row: Row, field: str, where: str) -> str:
    """A required, non-empty text field, stripped."""
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: field {field!r} must be a non-empty string, got {value!r}")
    return value.strip()


def _check_unique(records: Records, name: str) -> Records:
    seen: set[str] = set()
    for rec in records:
        if rec["id"] in seen:
            raise ValueError(f"{name}: duplicate record id {rec['id']!r}")
        seen.add(rec["id"])
    return records


# ----------------------------------------------------------------------------------------------
# GPQA-Diamond
# ----------------------------------------------------------------------------------------------


def load_gpqa_diamond(
    path_or_rows: str | Path | Iterable[Any],
    seed: int = GPQA_SHUFFLE_SEED,
    split: str = "gpqa-diamond",
) -> Records:
    """GPQA-Diamond rows -> MC records with the options shuffled per question (fixed ``seed``).

    Options ``[Correct Answer, Incorrect Answer 1, 2, 3]`` are permuted by
    ``shuffle_options(..., correct_index=0, seed, question_id=Record ID)``; ``answer`` is the
    letter the correct answer lands on. ``meta``: ``record_id``, ``options`` (rendered order),
    ``n_options`` (4), ``shuffle_seed``, ``correct_answer`` (text), ``subdomain``,
    ``high_level_domain``. Id: ``gpqa-diamond/<Record ID>``.
    """
    records = []
    for i, row in enumerate(read_rows(path_or_rows)):
        where = f"gpqa_diamond row {i}"
        record_id = _text(row, "Record ID", where)
        question = _text(row, "Question", where)
        correct = _text(row, "Correct Answer", where)
        incorrect = [_text(row, f"Incorrect Answer {k}", where) for k in (1, 2, 3)]
        options, letter = shuffle_options([correct, *incorrect], 0, seed, record_id)
        meta = {
            "record_id": record_id,
            "options": options,
            "n_options": len(options),
            "shuffle_seed": seed,
            "correct_answer": correct,
            "subdomain": row.get("Subdomain"),
            "high_level_domain": row.get("High-level domain"),
        }
        records.append(
            make_record(
                id=f"gpqa-diamond/{record_id}",
                source="gpqa-diamond",
                split=split,
                question=render_mc_question(question, options),
                answer=letter,
                meta=meta,
            )
        )
    return _check_unique(records, "gpqa_diamond")


# ----------------------------------------------------------------------------------------------
# MMLU-Pro
# ----------------------------------------------------------------------------------------------


def load_mmlu_pro(path_or_rows: str | Path | Iterable[Any], split: str = "mmlu-pro") -> Records:
    """MMLU-Pro rows -> MC records, options in the dataset's order (the gold letter refers to it).

    Checks that ``answer`` is the letter of ``answer_index``. ``meta``: ``question_id``,
    ``category``, ``src``, ``options``, ``n_options``, ``answer_index``. Id:
    ``mmlu-pro/<question_id>``.
    """
    records = []
    for i, row in enumerate(read_rows(path_or_rows)):
        where = f"mmlu_pro row {i}"
        qid = row.get("question_id")
        if qid is None or isinstance(qid, bool):
            raise ValueError(f"{where}: missing question_id")
        question = _text(row, "question", where)
        raw_options = row.get("options")
        if not isinstance(raw_options, (list, tuple)) or not 2 <= len(raw_options) <= 10:
            raise ValueError(f"{where}: 'options' must be a list of 2..10 strings, got {raw_options!r}")
        options = [str(opt).strip() for opt in raw_options]
        answer = _text(row, "answer", where).upper()
        index = row.get("answer_index")
        if not isinstance(index, int) or not 0 <= index < len(options):
            raise ValueError(f"{where}: answer_index {index!r} out of range for {len(options)} options")
        if answer != LETTERS[index]:
            raise ValueError(f"{where}: answer {answer!r} disagrees with answer_index {index}")
        meta = {
            "question_id": qid if isinstance(qid, (int, str)) else str(qid),
            "category": row.get("category"),
            "src": row.get("src"),
            "options": options,
            "n_options": len(options),
            "answer_index": index,
        }
        records.append(
            make_record(
                id=f"mmlu-pro/{qid}",
                source="mmlu-pro",
                split=split,
                question=render_mc_question(question, options),
                answer=answer,
                meta=meta,
            )
        )
    return _check_unique(records, "mmlu_pro")


# ----------------------------------------------------------------------------------------------
# LiveCodeBench
# ----------------------------------------------------------------------------------------------


class StrictStrUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain data: it resolves no class or function by name.

    Strings, numbers, lists, dicts and protocol-3+ ``bytes`` need no global at all. The only
    globals allowed are the two pickle protocols 0-2 emit for ``bytes``: ``_codecs.encode`` (limited
    to ``latin1``, which is how those protocols spell a bytes object) and ``builtins.bytes`` (empty
    bytes). Anything else -- ``os.system``, ``builtins.eval``, any class -- raises
    :class:`pickle.UnpicklingError` before it is called.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_encode
        if name == "bytes" and module in ("builtins", "__builtin__"):  # protocols < 3 say __builtin__
            return _empty_bytes
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name} from untrusted data")


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("only latin1-encoded bytes are allowed")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    if args:
        raise pickle.UnpicklingError("bytes() with arguments is not allowed")
    return b""


def restricted_loads(data: bytes) -> str | bytes:
    """Unpickle ``data`` with :class:`StrictStrUnpickler`; the result must be a ``str`` or ``bytes``."""
    obj = StrictStrUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, (str, bytes)):
        raise pickle.UnpicklingError(f"expected a pickled str or bytes, got {type(obj).__name__}")
    return obj


def encode_private_test_cases(tests: list[dict[str, str]]) -> str:
    """The real dataset's encoding: ``base64(zlib.compress(pickle.dumps(json.dumps(tests))))``.

    The inverse of :func:`decode_private_test_cases` (used to write fixtures and in tests).
    """
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode("utf-8")


def decode_private_test_cases(value: str, max_bytes: int = MAX_PRIVATE_TESTS_BYTES) -> list[dict[str, Any]]:
    """LiveCodeBench ``private_test_cases`` -> list of test dicts.

    As LCB's own loader: a plain JSON list is accepted as is; otherwise the value is base64 ->
    zlib -> pickle -> JSON, with the pickle step done by :func:`restricted_loads` (never plain
    ``pickle.loads``) and the decompressed size capped at ``max_bytes``.

    Raises:
        ValueError: if the value is neither (bad base64, zlib, oversize or not JSON).
        pickle.UnpicklingError: if the pickle asks for anything but a str/bytes.
    """
    if not isinstance(value, str):
        raise ValueError(f"private_test_cases must be a string, got {type(value).__name__}")
    if not value.strip():
        return []
    if value.lstrip().startswith("["):
        return json.loads(value)
    try:
        compressed = base64.b64decode(value.encode("utf-8"), validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"private_test_cases is neither JSON nor base64: {err}") from err
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, max_bytes)
    except zlib.error as err:
        raise ValueError(f"private_test_cases: bad zlib stream: {err}") from err
    if inflater.unconsumed_tail:
        raise ValueError(f"private_test_cases decompresses past {max_bytes} bytes")
    payload = restricted_loads(raw)
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8")
    return json.loads(payload)


def _check_tests(tests: Any, where: str) -> list[dict[str, str]]:
    """Validate LCB test dicts and keep exactly ``input``, ``output``, ``testtype``."""
    if not isinstance(tests, list):
        raise ValueError(f"{where}: test cases must be a list, got {type(tests).__name__}")
    out = []
    for k, t in enumerate(tests):
        if not isinstance(t, Mapping):
            raise ValueError(f"{where}: test {k} must be a dict, got {type(t).__name__}")
        if not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
            raise ValueError(f"{where}: test {k} needs string 'input' and 'output'")
        if t.get("testtype") not in LCB_TEST_TYPES:
            raise ValueError(f"{where}: test {k} has testtype {t.get('testtype')!r}; valid: {LCB_TEST_TYPES}")
        out.append({"input": t["input"], "output": t["output"], "testtype": t["testtype"]})
    return out


def _as_datetime(value: Any, where: str) -> datetime:
    """A naive datetime from an ISO string, a date or a datetime (timezone dropped)."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError as err:
            raise ValueError(f"{where}: not an ISO date {value!r}") from err
    else:
        raise ValueError(f"{where}: expected a date, got {value!r}")
    return dt.replace(tzinfo=None)


def in_window(contest_date: Any, start_date: Any, end_date: Any) -> bool:
    """``start_date <= contest_date < end_date`` (None = unbounded on that side)."""
    when = _as_datetime(contest_date, "contest_date")
    if start_date is not None and when < _as_datetime(start_date, "start_date"):
        return False
    if end_date is not None and when >= _as_datetime(end_date, "end_date"):
        return False
    return True


def load_livecodebench(
    path_or_rows: str | Path | Iterable[Any],
    start_date: str | date | None = LCB_V6_START,
    end_date: str | date | None = LCB_V6_END,
    split: str = "livecodebench-v6",
) -> Records:
    """LiveCodeBench code-generation rows in ``[start_date, end_date)`` -> code records.

    Defaults: the v6 window (Feb-Apr 2025) [ours]. ``answer`` is the JSON list of all test cases,
    public first (see the module docstring); functional problems must name ``func_name`` in their
    ``metadata``. Id: ``livecodebench/<question_id>``.
    """
    records = []
    for i, row in enumerate(read_rows(path_or_rows)):
        where = f"livecodebench row {i}"
        qid = _text(row, "question_id", where)
        contest_date = _as_datetime(row.get("contest_date"), where)
        if not in_window(contest_date, start_date, end_date):
            continue
        where = f"livecodebench {qid}"
        public = _check_tests(json.loads(row.get("public_test_cases") or "[]"), where + " public")
        private = _check_tests(decode_private_test_cases(row.get("private_test_cases") or ""), where + " private")
        if not public and not private:
            raise ValueError(f"{where}: no test cases")
        raw_meta = row.get("metadata") or "{}"
        lcb_metadata = json.loads(raw_meta) if isinstance(raw_meta, str) else dict(raw_meta)
        func_name = lcb_metadata.get("func_name")
        if any(t["testtype"] == "functional" for t in public + private) and not func_name:
            raise ValueError(f"{where}: functional tests but no func_name in metadata")
        meta = {
            "question_id": qid,
            "question_title": row.get("question_title"),
            "contest_id": row.get("contest_id"),
            "contest_date": contest_date.isoformat(),
            "platform": row.get("platform"),
            "difficulty": row.get("difficulty"),
            "func_name": func_name,
            "starter_code": row.get("starter_code") or "",
            "num_public_tests": len(public),
            "num_private_tests": len(private),
            "lcb_metadata": lcb_metadata,
        }
        records.append(
            make_record(
                id=f"livecodebench/{qid}",
                source="livecodebench",
                split=split,
                question=_text(row, "question_content", where),
                # functional tests carry func_name: the gold alone says how to call a solution (the verifier
                # of both engines and the evaluator judges (code, gold) with nothing else)
                answer=json.dumps(
                    [t | {"func_name": func_name} if t["testtype"] == "functional" else t for t in public + private]
                ),
                meta=meta,
            )
        )
    return _check_unique(records, "livecodebench")
