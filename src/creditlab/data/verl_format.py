"""Normalised records -> verl's RL parquet format (verl 0.9.1), and back for checks.

One row per record, as ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads it and verl's reward
managers consume it (``examples/data_preprocess/gsm8k.py`` writes the same columns):

* ``data_source`` (string): the record's ``source`` -- the key verl's reward manager passes to
  ``compute_score`` (``reward_fn_key`` = ``data_source``); it must be one
  :func:`creditlab.rewards.routing.data_source_kind` routes (checked on write);
* ``prompt`` (list of ``{role, content}``): ``[{"role": "user", "content": render_record_prompt(record,
  template)}]`` (code records: a fenced-program prompt) -- RLHFDataset applies the model's chat template to it,
  as the evaluator does at paper scale;
* ``ability`` (string): ``math``, ``multiple_choice`` or ``code`` (the verifier family);
* ``reward_model`` (struct): ``{"style": "rule", "ground_truth": answer}`` -- the reward managers
  read ``reward_model["ground_truth"]``;
* ``extra_info`` (struct): ``{"split", "index" (int64, the row number in this file: RLHFDataset
  copies it to the sample's ``index``), "id" (the record id), "meta" (the record's meta as a JSON
  string, where our ``compute_score`` looks up ``n_options`` / ``func_name``)}``.

"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from creditlab.data.io import write_rows
from creditlab.data.schema import FIELDS, render_code_prompt, render_prompt, render_record_prompt, validate_record
from creditlab.rewards.routing import KINDS, data_source_kind

VERL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct([("split", pa.string()), ("index", pa.int64()), ("id", pa.string()), ("meta", pa.string())]),
        ),
    ]
)
"""The columns and types of our verl parquet files."""

REWARD_STYLE = "rule"
WRITABLE_KINDS = KINDS


def verl_row(rec: dict[str, Any], index: int, template: str) -> dict[str, Any]:
    """The verl row of one validated record (see the module docstring).

    Raises:
        ValueError: for an invalid record or a ``source`` the verl reward cannot route.
    """
    validate_record(rec)
    try:
        kind = data_source_kind(rec["source"])
    except ValueError as err:
        raise ValueError(f"record {rec['id']!r}: {err}") from err
    return {
        "data_source": rec["source"],
        "prompt": [{"role": "user", "content": render_record_prompt(rec, template)}],
        "ability": kind,
        "reward_model": {"style": REWARD_STYLE, "ground_truth": rec["answer"]},
        "extra_info": {
            "split": rec["split"],
            "index": index,
            "id": rec["id"],
            "meta": json.dumps(rec["meta"], sort_keys=True),
        },
    }


def write_verl_parquet(records: Iterable[dict[str, Any]], path: str | Path, template: str = "boxed") -> Path:
    """Write ``records`` as a verl RL parquet file (parent folders created); ``index`` = row number.

    Raises:
        ValueError: see :func:`verl_row`; also for two records with the same id.
    """
    return write_rows(records, path, VERL_SCHEMA, lambda i, rec: verl_row(rec, i, template))


def read_verl_parquet(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a verl parquet file, as plain dicts (nested columns as lists / dicts)."""
    table = pq.read_table(path)
    missing = [c for c in VERL_SCHEMA.names if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a verl RL parquet file, lacks column(s) {missing}")
    return table.to_pylist()


def record_from_verl_row(row: dict[str, Any], template: str = "boxed") -> dict[str, Any]:
    """Invert :func:`verl_row` (the question is recovered by removing the template's instruction).

    Used to check a round trip; raises ValueError when the prompt was not rendered with ``template``.
    """
    content = row["prompt"][-1]["content"]
    extra = row["extra_info"]
    meta = json.loads(extra["meta"])
    code = template == "boxed" and data_source_kind(row["data_source"]) == "code"
    marker = render_code_prompt("\x00", "\x01") if code else render_prompt("\x00", template)
    if code and not str(meta.get("starter_code") or "").strip():
        marker = render_code_prompt("\x00")
    head, _, tail = marker.partition("\x00")
    if code:
        tail = tail.replace("\x01", str(meta.get("starter_code") or ""))
    if not (content.startswith(head) and content.endswith(tail)):
        raise ValueError(f"prompt of {row['extra_info']['id']!r} was not rendered with template {template!r}")
    question = content[len(head) : len(content) - len(tail)]
    rec = {
        "id": extra["id"],
        "source": row["data_source"],
        "split": extra["split"],
        "question": question,
        "answer": row["reward_model"]["ground_truth"],
        "solution": None,
        "meta": meta,
    }
    validate_record(rec)
    return {f: rec[f] for f in FIELDS}
