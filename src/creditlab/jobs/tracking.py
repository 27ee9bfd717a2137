"""The tracking jobs: create the MLflow store before parallel jobs use it, serve its UI, and serve a cluster's store."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from creditlab import paths
from creditlab.tracking.mlflow_tracker import ParentRun, init_store, tracking_uri
from creditlab.tracking.store_safety import sqlite_path, store_refusal


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


def server_allowed_hosts() -> str:
    """Host headers the tracking server answers: this host by name (short and fully qualified, any port), localhost
    and private IPs (MLflow's own default, which alone refuses compute nodes that name the server's host)."""
    names = dict.fromkeys([socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"])
    return ",".join([h for n in names for h in (n, f"{n}:*")] + ["10.*", "192.168.*", "172.*"])


def mlflow_server_argv(
    results: str | Path,
    backend_store_uri: str | None,
    artifacts_destination: str | None,
    host: str,
    port: int,
    workers: int,
    allowed_hosts: str | None = None,
    accept_sqlite_on_network_fs: bool = False,
) -> list[str]:
    """The `mlflow server` command of a cluster's tracking server: runs and metrics in ``backend_store_uri`` (a SQL
    database: postgresql://... for a cluster; default a SQLite file ``<results>/mlflow-server/mlflow.db``, which only
    this server writes), artifacts uploaded through the server into ``artifacts_destination`` (default
    ``<results>/mlartifacts``: on the shared storage), ``workers`` processes listening on ``host:port``. A SQLite
    backend on a network filesystem is refused (SystemExit, :mod:`creditlab.tracking.store_safety`) unless
    accepted."""
    results = Path(results).resolve()
    uri = backend_store_uri or f"sqlite:///{results / 'mlflow-server' / 'mlflow.db'}"
    why = store_refusal(uri, "paper", accept_sqlite_on_network_fs)
    if why:
        raise SystemExit(f"mlflow-server: {why}")
    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    dest = artifacts_destination or str(results / "mlartifacts")
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--serve-artifacts",
        "--artifacts-destination",
        dest,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--allowed-hosts",
        allowed_hosts or server_allowed_hosts(),
    ]


def mlflow_server(results: str | Path, **kw) -> None:
    """Replace this process by a tracking server for a cluster (:func:`mlflow_server_argv`); jobs then log to it
    with the pipeline config ``mlflow_uri=http://<this host>:<port>``."""
    argv = mlflow_server_argv(results, **kw)
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    host = socket.getfqdn() if kw["host"] in ("0.0.0.0", "::") else kw["host"]
    print(
        f"MLflow tracking server: http://{host}:{kw['port']}  (store: {argv[argv.index('--backend-store-uri') + 1]}, "
        f"artifacts: {argv[argv.index('--artifacts-destination') + 1]})\n"
        f"  run the pipeline with --config mlflow_uri=http://{host}:{kw['port']}",
        file=sys.stderr,
    )
    os.execv(sys.executable, argv)
