"""A cluster's tracking store: `python -m creditlab mlflow-server` serves a SQL backend to many concurrent writer
processes without losing a metric, and a SQLite store on a network filesystem is refused at paper scale
(creditlab.tracking.store_safety; the filesystem type read from a mount table)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from creditlab.jobs.tracking import mlflow_server_argv
from creditlab.tracking.store_safety import filesystem_type, store_refusal

WRITERS, STEPS = 6, 30

WRITER = """
import sys
from creditlab.tracking.mlflow_tracker import Tracker
i, results = int(sys.argv[1]), sys.argv[2]
with Tracker.start(results, "concurrency", f"paper/w/r{i}/s0", f"writer {i}", {}, {"i": i}, f"{results}/w{i}") as t:
    for step in range(STEPS):
        t.log_metrics({"m": float(step), "who": float(i)}, step)
    assert not t.offline, t.offline_reason
print("ok", t.run_id)
""".replace("STEPS", str(STEPS))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow-server exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("mlflow-server did not answer /health")


def test_concurrent_writers_lose_no_metric(tmp_path: Path):
    results, port = tmp_path / "results", _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "creditlab", "--results", str(results), "mlflow-server"]
        + ["--backend-store-uri", f"sqlite:///{tmp_path / 'server' / 'mlflow.db'}", "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its uvicorn workers in its own process group, ended below
    )
    try:
        _wait_up(url, server)
        client_env = env | {"MLFLOW_TRACKING_URI": url}
        subprocess.run(
            [sys.executable, "-c", f"from creditlab.tracking.mlflow_tracker import init_store; "
             f"init_store({str(results)!r}, ['concurrency'])"],
            env=client_env, check=True, timeout=120,
        )  # fmt: skip
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, str(i), str(results)],
                env=client_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(WRITERS)
        ]
        outs = [w.communicate(timeout=180) for w in writers]
        for w, (out, err) in zip(writers, outs):
            assert w.returncode == 0 and out.splitlines()[-1].startswith("ok "), err[-2000:]
            assert "offline" not in err, err[-2000:]  # nothing went to the offline fallback

        from mlflow.tracking import MlflowClient

        client = MlflowClient(url)
        exp = client.get_experiment_by_name("concurrency")
        runs = client.search_runs([exp.experiment_id], max_results=100)
        assert len(runs) == WRITERS
        for run in runs:
            i = int(run.data.params["i"])
            m = client.get_metric_history(run.info.run_id, "m")
            who = client.get_metric_history(run.info.run_id, "who")
            assert sorted((x.step, x.value) for x in m) == [(s, float(s)) for s in range(STEPS)]
            assert len(who) == STEPS and {x.value for x in who} == {float(i)}
        assert not list(results.rglob("mlflow_offline.jsonl"))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=20)


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
server:/export/home /home nfs4 rw,relatime,vers=4.2 0 0
lustre@o2ib:/scratch /scratch lustre rw,flock 0 0
/dev/nvme0n1 /scratch/local\\040disk xfs rw 0 0
"""


def test_filesystem_type_from_the_mount_table(tmp_path: Path):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert filesystem_type("/home/u/creditlab/results", mounts) == "nfs4"
    assert filesystem_type("/scratch/u/results/mlflow.db", mounts) == "lustre"
    assert filesystem_type("/scratch/local disk/results", mounts) == "xfs"  # the longest mount point wins
    assert filesystem_type("/opt/x", mounts) == "ext4"
    assert filesystem_type(tmp_path) != ""  # this machine's own table


@pytest.mark.parametrize(
    ("uri", "scale", "accept", "refused"),
    [
        ("sqlite:////home/u/results/mlflow.db", "paper", False, "nfs4"),
        ("sqlite:////scratch/u/results/mlflow.db", "paper", False, "lustre"),
        ("sqlite:////home/u/results/mlflow.db", "paper", True, None),  # accepted explicitly
        ("sqlite:////home/u/results/mlflow.db", "tiny", False, None),  # one machine
        ("sqlite:////opt/results/mlflow.db", "paper", False, None),  # a local disk
        ("http://mlflow.example:5000", "paper", False, None),
        ("postgresql://u@db/mlflow", "paper", False, None),
    ],
)
def test_sqlite_on_a_network_filesystem_refused_at_paper_scale(tmp_path, uri, scale, accept, refused):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    why = store_refusal(uri, scale, accept, mounts)
    if refused is None:
        assert why is None
    else:
        assert why and f"on a {refused} filesystem" in why and "mlflow-server" in why
        assert "accept_sqlite_on_network_fs=true" in why


def test_server_command_has_a_sql_backend_and_shared_artifacts(tmp_path: Path):
    argv = mlflow_server_argv(tmp_path / "results", None, None, "0.0.0.0", 5000, 4)
    assert argv[argv.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path / 'results/mlflow-server/mlflow.db'}"
    assert argv[argv.index("--artifacts-destination") + 1] == str(tmp_path / "results/mlartifacts")
    assert "--serve-artifacts" in argv and socket.gethostname() in argv[argv.index("--allowed-hosts") + 1]
