"""A built table in MLflow: its parent run holds the table, its cells and a link comparing its rows.

Every table has a parent run in its paper's experiment (`ParentRun.of_table`); the runs of its rows
are nested under it as they are created (see `creditlab.tracking.mlflow_tracker`). When the table is
built, `publish_table` resumes that parent run and

- sets its description (`mlflow.note.content`, Markdown shown on the run page) to the table;
- logs every cell's value as a metric `{column}/{row}/{backbone}` (step 0), so that tables can be
  charted and compared in the UI like runs;
- tags it `row_run_ids` (the MLflow runs the cells were read from, one per row, backbone and seed: the caller's
  `run_ids`, creditlab.tables.frame.row_run_ids of the table)
  and `compare_url`, the UI's compare view of exactly those runs: rows trained under another
  paper's table are in another experiment and not nested here, and the link includes them;
- logs the table's files (CSV, Markdown, figures) as artifacts and ends the run FINISHED.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from creditlab.tracking.mlflow_tracker import MAX_TAG_VAL_LENGTH, NOTE_TAG, ParentRun, Tracker, mlflow_key


def cell_metrics(df: pd.DataFrame) -> dict[str, float]:
    """`{column}/{row}/{backbone}` -> our value, for every cell that has one."""
    out: dict[str, float] = {}
    for line in df.itertuples(index=False):
        value = getattr(line, "ours_mean", float("nan"))
        if value is None or isinstance(value, str) or not math.isfinite(float(value)):
            continue
        out[mlflow_key(f"{line.column}/{line.row}/{line.backbone}")] = float(value)
    return out


def _note(markdown: str, files: Sequence[Path]) -> str:
    """The run description: the table's Markdown, cut to MLflow's tag limit with a pointer to the files."""
    tail = f"\n\n… cut here; the whole table is in the artifacts: {', '.join(p.name for p in files)}"
    if len(markdown) <= MAX_TAG_VAL_LENGTH:
        return markdown
    return markdown[: MAX_TAG_VAL_LENGTH - len(tail)] + tail


def publish_table(
    results_dir: str | Path,
    experiment: str,
    scale: str,
    paper: str,
    table: str,
    df: pd.DataFrame,
    markdown: str,
    files: Sequence[Path],
    local_dir: str | Path,
    *,
    run_ids: Sequence[str],
) -> str | None:
    """Log a built table into its parent run (see the module doc); `run_ids`: the MLflow runs its cells were read
    from. Returns the compare link, or None offline."""
    parent = ParentRun.of_table(scale, paper, table)
    ids = list(run_ids)
    tracker = Tracker.start(
        results_dir, experiment, parent.key, parent.name, tags=parent.tags, params={}, local_dir=local_dir
    )
    with tracker:
        link = tracker.compare_link(ids)
        tracker.set_tags(
            {
                NOTE_TAG: _note(markdown, files),
                "row_run_ids": ",".join(ids),
                "rows": str(len(df[["row", "backbone"]].drop_duplicates())),
                "compare_url": link or "",
            }
        )
        metrics = cell_metrics(df)
        if metrics:
            tracker.log_metrics(metrics, step=0)
        for path in files:
            tracker.log_artifact(path)
    return link
