"""Helpers shared by the table tests (tests/test_tables*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

DELETE = object()
"""`edit(path, DELETE)` removes the key instead of setting it."""


def cell(df: pd.DataFrame, row: str, column: str) -> pd.Series:
    """The one line of a long table frame for (row label, column name)."""
    sub = df[(df["row"] == row) & (df["column"] == column)]
    assert len(sub) == 1, (row, column)
    return sub.iloc[0]


def edit(path: list, value):
    """A function that sets (or, with DELETE, removes) the key at `path` of a nested config dict."""

    def mutate(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return mutate


def write_eval(
    path: Path, suites: dict[str, list[int]], k: int, run_key: str, run_id: str, config: str, greedy_above: int
) -> None:
    """A minimal evaluation metrics.json at `path`: per suite the per-question correct-sample counts `c` (of k),
    greedy correct where c > `greedy_above`, question ids `<suite>-<i>`, and the provenance a table cell reads."""
    blocks = {
        s: {
            "n_questions": len(c),
            "k": k,
            "metrics": {},
            "per_question": {
                "ids": [f"{s}-{i}" for i in range(len(c))],
                "greedy": [x > greedy_above for x in c],
                "n": k,
                "c": list(c),
            },
        }
        for s, c in suites.items()
    }
    data = {
        "suites": blocks,
        "k": k,
        "provenance": {"run_key": run_key, "mlflow_run_id": run_id, "commit": "abc", "config": config},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
