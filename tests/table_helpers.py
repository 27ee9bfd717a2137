"""Helpers shared by the table tests (tests/test_tables*.py)."""

from __future__ import annotations

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
