"""Parquet storage of normalised records (see :mod:`creditlab.data.schema`).

One row per record, columns in schema order; ``meta`` is stored as a JSON string (keys sorted) so
that records with different knobs share one column type. Both directions validate every record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from creditlab.data.schema import FIELDS, validate_record

PARQUET_SCHEMA = pa.schema([(field, pa.string()) for field in FIELDS])
"""Every column is a string: ``solution`` may be null, ``meta`` holds JSON."""


def write_rows(
    records: Iterable[dict[str, Any]],
    path: str | Path,
    schema: pa.Schema,
    to_row: Callable[[int, dict[str, Any]], dict[str, Any]],
) -> Path:
    """Write ``to_row(i, record)`` of every record to a parquet file of ``schema`` (parent folders created).

    Raises:
        ValueError: if two records share an id (and whatever ``to_row`` raises for an invalid record).
    """
    rows = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        if rec.get("id") in seen:
            raise ValueError(f"duplicate record id {rec['id']!r}")
        row = to_row(i, rec)
        seen.add(rec["id"])
        rows.append(row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_records(records: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Validate ``records`` and write them to a parquet file (parent folders are created).

    Raises:
        ValueError: if a record is invalid or two records share an id.
    """

    def to_row(_: int, rec: dict[str, Any]) -> dict[str, Any]:
        validate_record(rec)
        return {**rec, "meta": json.dumps(rec["meta"], sort_keys=True)}

    return write_rows(records, path, PARQUET_SCHEMA, to_row)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Read records written by :func:`write_records`, decoding ``meta`` and validating each."""
    table = pq.read_table(path)
    missing = [f for f in FIELDS if f not in table.column_names]
    if missing:
        raise ValueError(f"{path}: parquet file lacks column(s) {missing}")
    records = []
    for row in table.select(list(FIELDS)).to_pylist():
        rec = {**row, "meta": json.loads(row["meta"])}
        validate_record(rec)
        records.append(rec)
    return records
