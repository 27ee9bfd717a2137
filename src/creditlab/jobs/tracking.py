"""The tracking jobs: create the MLflow store before parallel jobs use it, and serve its UI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from creditlab import paths
from creditlab.tracking.mlflow_tracker import ParentRun, init_store, tracking_uri


def init_tracking(results: str | Path, plan) -> None:
    """Create the MLflow store, every experiment and every table's parent run once; nest runs tracked before their
    table had a parent run (idempotent: safe to run again). Writes the tracking-ready marker."""
    parents = [(plan.papers[p].experiment, ParentRun.of_table(plan.scale, p, t)) for p, t in plan.tables]
    children = [
        (r.experiment, r.key, ParentRun.of_table(r.scale, *r.parent_table).key)
        for r in plan.runs.values()
        if r.parent_table
    ]  # nests runs tracked before parents existed
    init_store(Path(results), plan.experiments + ["base-models"], parents, children)
    marker = paths.fmt(paths.TRACKING_READY, results=results)
    text = tracking_uri(Path(results)) + "\n"
    if not marker.is_file() or marker.read_text() != text:  # unchanged: keep its mtime (jobs depend on it)
        marker.write_text(text)


def mlflow_ui(results: str | Path, port: int, workers: int) -> None:
    """Replace this process by the MLflow UI on 127.0.0.1:``port`` against the project's store."""
    uri = tracking_uri(Path(results))
    argv = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    # the server's background job runner (GenAI judges, ~9 huey processes) is not used by this project
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    base = f"http://127.0.0.1:{port}"
    print(
        f"MLflow UI: {base}  (store: {uri})\n"
        f"  experiments = papers; each table is a parent run `table <paper>/<table>` with its rows nested under it,\n"
        f"  and its tag `compare_url` opens the compare view of exactly its rows: {base}/<compare_url>\n"
        f"  training runs view: {base}/#/experiments/<id>/runs?workflowType=machine_learning",
        file=sys.stderr,
    )
    os.execv(sys.executable, argv)
