"""The long table frame: one line per table row x shown column, its columns, and how one field holds several values.

`creditlab.tables.build` fills it, `creditlab.tables.render` shows it, `creditlab.tables.ledger` reads it back (from
the table CSV); `row_run_ids` are the MLflow runs a built table was read from (its MLflow table run links them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

LONG_COLUMNS = (
    "row",
    "paper_backbone",
    "backbone",
    "run",
    "column",
    "suites",
    "metric",
    "unit",
    "ours_mean",
    "ours_lo",
    "ours_hi",
    "n_questions",
    "n_steps",
    "seeds",
    "paper",
    "scale",
    "left_out",
    "detail",
    "censored",
    "ref_censored",
    "mlflow_run_ids",
    "run_keys",
    "commits",
    "configs",
    "sources",
    "sandbox",
    "verdict",
    "p_value",
    "p_adj",
)
"""Columns of the long table frame (one line per row x shown column), in CSV order.

unit: "%" (accuracy), "s" (step_time), "steps" (steps_to), "% vs <run>" / "x vs <run>" (a training column
with relative_to <run>, relative percent / ratio); n_questions / n_steps: what the CI resamples (steps_to:
n_steps = the steps read, all seeds; its CI resamples the seeds, listed in `seeds`); left_out: the
column's paper benchmarks without a stand-in at this scale (";"-joined); detail: for relative cells both
means, for steps_to the value of every seed (`>N` = never reached in its N steps); censored: how many of
the row's seeds never reached a steps_to threshold (counted at N: the mean is then a lower bound);
ref_censored: the same for the relative_to run's seeds (0 for every other cell); sources: the files read;
sandbox: the code sandbox tier(s) the cell's code suites were scored under (one per seed, from the evaluations'
metrics.json; empty for a cell without code);
verdict / p_value / p_adj: a versus cell's claim ("beats <ref>", "worse than <ref>", "noise", "reference"), its
two-sided p and its Holm-adjusted p over the table's versus cells (ours_mean: the difference in percentage points,
ours_lo / ours_hi: its 95% paired-bootstrap interval; unit "pp vs <run>")."""

SEP = ";"  # joins several values (one per seed or suite) in one CSV field


def missing(value: Any) -> bool:
    """None or NaN: an empty field."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def unique(items: Sequence[str]) -> list[str]:
    """`items` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))


def split_field(field: Any) -> list[str]:
    """The non-empty items of one SEP-joined CSV field (None, NaN and "" count as empty)."""
    if missing(field) or field == "":
        return []
    return [v for v in str(field).split(SEP) if v]


def split(values: Any) -> list[str]:
    """The non-empty items of SEP-joined fields, in order."""
    return [v for field in values for v in split_field(field)]


def row_run_ids(df: pd.DataFrame) -> list[str]:
    """The MLflow run ids a built table's cells were read from, in row order, without repeats or blanks."""
    return unique(split(df["mlflow_run_ids"])) if "mlflow_run_ids" in df else []
