"""Tests of the tracking layer: MLflow runs in a SQLite store, resume, attach, offline fallback.

Creating a SQLite store runs MLflow's migrations (seconds), so one store is shared by the module
and each test uses its own run keys.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from creditlab.tracking.mlflow_tracker import (
    MAX_PARAM_VAL_LENGTH,
    OFFLINE_FILE,
    Tracker,
    find_run_id,
    flatten_params,
    init_store,
    mlflow_key,
    tracking_uri,
)
from creditlab.tracking.provenance import git_commit, host_info

EXPERIMENTS = ["paper-a", "paper-b"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results dir whose SQLite store and experiments were created by init_store."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        results_dir = tmp_path_factory.mktemp("results")
        init_store(results_dir, EXPERIMENTS)
        yield results_dir


@pytest.fixture
def client(results: Path, monkeypatch: pytest.MonkeyPatch):
    """An MlflowClient on the shared store (and no tracking URI from the environment)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return MlflowClient(tracking_uri(results))


def _start(results: Path, tmp_path: Path, run_key: str, params: dict | None = None,
           experiment: str = "paper-a") -> Tracker:
    tags = {"paper": experiment, "table": "main", "method": "dapo", "backbone": "tiny-s",
            "seed": 0, "scale": "tiny"}
    return Tracker.start(results, experiment, run_key, run_key.replace("/", "-"), tags,
                         params or {"trainer": {"lr": 1e-6, "steps": 10}}, tmp_path / "local")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tracking_uri_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert tracking_uri(tmp_path) == "http://tracking.example:5000"


def test_init_store_is_idempotent(results: Path, client) -> None:
    init_store(results, [*EXPERIMENTS, "paper-c"])
    init_store(results, [*EXPERIMENTS, "paper-c"])
    names = [e.name for e in client.search_experiments()]
    for name in [*EXPERIMENTS, "paper-c"]:
        assert names.count(name) == 1
    location = client.get_experiment_by_name("paper-b").artifact_location
    assert location == (results / "mlartifacts" / "paper-b").resolve().as_uri()


def test_start_resume_same_run_and_data_lands(results: Path, tmp_path: Path, client,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    long_value = "x" * (MAX_PARAM_VAL_LENGTH + 50)
    first = _start(results, tmp_path, "tiny/tiny-s/dapo/s0",
                   {"trainer": {"lr": 1e-6, "steps": 10}, "data": {"suites": ["a", "b"]},
                    "note": long_value})
    first.log_metrics({"reward_mean": 0.25, "eval/hard/avg@8": 0.5}, step=1)
    artifact = tmp_path / "config.yaml"
    artifact.write_text("trainer: {lr: 1e-6}\n")
    first.log_artifact(artifact)
    first.end("KILLED")
    assert client.get_run(first.run_id).info.status == "KILLED"

    second = _start(results, tmp_path, "tiny/tiny-s/dapo/s0")  # the restarted job
    assert second.run_id == first.run_id
    assert client.get_run(second.run_id).info.status == "RUNNING"
    second.log_metrics({"reward_mean": 0.75}, step=2)
    second.end()

    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["run_key"] == "tiny/tiny-s/dapo/s0"
    assert run.data.tags["slurm_job_id"] == "4242"
    assert run.data.tags["method"] == "dapo" and run.data.tags["seed"] == "0"
    assert run.data.tags["git_commit"] == git_commit()
    assert run.data.params["trainer.lr"] == "1e-06"
    assert run.data.params["data.suites"] == '["a", "b"]'
    assert len(run.data.params["note"]) == MAX_PARAM_VAL_LENGTH
    history = client.get_metric_history(first.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    assert run.data.metrics["eval/hard/avg_at_8"] == 0.5
    assert [a.path for a in client.list_artifacts(first.run_id)] == ["config.yaml"]
    other = _start(results, tmp_path, "tiny/tiny-s/dapo/s1")
    assert other.run_id != first.run_id
    other.end()


def test_resume_with_changed_params_keeps_first_and_warns(results: Path, tmp_path: Path,
                                                          client) -> None:
    _start(results, tmp_path, "tiny/tiny-s/changed/s0", {"lr": 1e-6}).end()
    with pytest.warns(RuntimeWarning, match=r"params changed.*\['lr'\]"):
        again = _start(results, tmp_path, "tiny/tiny-s/changed/s0", {"lr": 2e-6, "new": 1})
    run = client.get_run(again.run_id)
    assert run.data.params == {"lr": "1e-06", "new": "1"}
    assert run.data.tags["params_changed_on_resume"] == "lr"
    assert not again.offline


def test_context_manager_marks_failed_run(results: Path, tmp_path: Path, client) -> None:
    with pytest.raises(RuntimeError, match="diverged"):
        with _start(results, tmp_path, "tiny/tiny-s/crash/s0") as tracker:
            raise RuntimeError("loss diverged")
    assert client.get_run(tracker.run_id).info.status == "FAILED"


def test_find_run_id_and_attach(results: Path, tmp_path: Path, client) -> None:
    trained = _start(results, tmp_path, "tiny/tiny-s/attach/s0", experiment="paper-b")
    trained.end()
    assert find_run_id(results, "paper-b", "tiny/tiny-s/attach/s0") == trained.run_id
    assert find_run_id(results, "paper-b", "tiny/tiny-s/never/s0") is None
    assert find_run_id(results, "no-such-experiment", "tiny/tiny-s/attach/s0") is None

    ev = Tracker.attach(results, "paper-b", "tiny/tiny-s/attach/s0", tmp_path / "eval")
    assert ev.run_id == trained.run_id
    ev.log_metrics({"eval/hard/avg@8": 0.4}, step=0)
    ev.end()
    run = client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"trainer.lr": "1e-06", "trainer.steps": "10"}
    assert run.data.metrics["eval/hard/avg_at_8"] == 0.4

    base = Tracker.attach(results, "paper-b", "tiny/tiny-s/base/s0", tmp_path / "eval",
                          tags={"method": "base"})
    base.end()
    created = client.get_run(base.run_id)
    assert created.data.tags["run_key"] == "tiny/tiny-s/base/s0"
    assert created.data.tags["method"] == "base" and created.info.status == "FINISHED"


def test_unreachable_server_falls_back_offline(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    began = time.monotonic()
    with pytest.warns(RuntimeWarning, match=re.escape(uri)) as record:
        tracker = Tracker.start(tmp_path, "paper-a", "tiny/tiny-s/off/s0", "off",
                                {"method": "dapo"}, {"trainer": {"lr": 1e-6}}, tmp_path / "run")
        tracker.log_metrics({"reward_mean": 0.5}, step=3)
        tracker.log_metrics({"reward_mean": 0.6}, step=4)
        tracker.set_tags({"note": "x"})
        tracker.end("FINISHED")
    assert time.monotonic() - began < 5.0
    assert len(record) == 1  # warned once
    assert tracker.offline and tracker.run_id is None
    lines = [json.loads(x) for x in (tmp_path / "run" / OFFLINE_FILE).read_text().splitlines()]
    assert [x["event"] for x in lines] == ["offline", "start", "log_metrics", "log_metrics",
                                           "set_tags", "end"]
    assert all(x["run_key"] == "tiny/tiny-s/off/s0" and x["time"] > 0 for x in lines)
    assert lines[0]["payload"]["uri"] == uri
    assert lines[1]["payload"]["params"] == {"trainer.lr": "1e-06"}
    assert [x["payload"] for x in lines[2:4]] == [{"metrics": {"reward_mean": 0.5}, "step": 3},
                                                  {"metrics": {"reward_mean": 0.6}, "step": 4}]
    with pytest.warns(RuntimeWarning, match=re.escape(uri)):
        assert find_run_id(tmp_path, "paper-a", "tiny/tiny-s/off/s0") is None


def test_store_failure_mid_run_goes_offline(results: Path, tmp_path: Path) -> None:
    from sqlalchemy.exc import OperationalError

    tracker = _start(results, tmp_path, "tiny/tiny-s/midrun/s0")
    assert tracker.run_id is not None

    def locked(*args, **kwargs):
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    tracker._client.log_batch = locked
    with pytest.warns(RuntimeWarning, match="database is locked") as record:
        tracker.log_metrics({"reward_mean": 1.0}, step=1)
        tracker.log_metrics({"reward_mean": 2.0}, step=2)
    assert len(record) == 1 and tracker.offline and tracker.run_id is None
    lines = (tmp_path / "local" / OFFLINE_FILE).read_text().splitlines()
    events = [json.loads(x) for x in lines]
    assert [e["event"] for e in events] == ["offline", "log_metrics", "log_metrics"]
    assert events[0]["payload"]["run_id"] is not None  # the partial MLflow run, for later merging
    with pytest.raises(ValueError):
        tracker.log_metrics({"reward_mean": "not a number"}, step=3)  # caller bugs still raise


def test_flatten_params_and_keys() -> None:
    flat = flatten_params({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": None, "f@k": "s", "g": {}})
    assert flat == {"a.b.c": "1", "a.d": "[1, 2]", "e": "null", "f_at_k": "s", "g": "{}"}
    assert mlflow_key("eval/hard/pass@8") == "eval/hard/pass_at_8"
    assert mlflow_key("x[0]=y") == "x_0__y"


def test_git_commit_and_host_info(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    assert git_commit(repo) == "unknown"  # no commit yet
    (repo / "f.txt").write_text("1\n")
    git("add", "f.txt")
    git("commit", "-q", "-m", "init")
    sha = git("rev-parse", "HEAD")
    (repo / "untracked.txt").write_text("scratch\n")
    assert git_commit(repo) == sha
    (repo / "f.txt").write_text("2\n")
    assert git_commit(repo) == f"{sha}-dirty"
    info = host_info()
    assert info["hostname"] and int(info["cpu_count"]) >= 1
    assert set(info) >= {"hostname", "cpu_count", "platform", "python", "slurm_job_id"}
