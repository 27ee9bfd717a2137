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


def _start(
    results: Path, tmp_path: Path, run_key: str, params: dict | None = None, experiment: str = "paper-a"
) -> Tracker:
    tags = {"paper": experiment, "table": "main", "method": "dapo", "backbone": "tiny-s", "seed": 0, "scale": "tiny"}
    return Tracker.start(
        results,
        experiment,
        run_key,
        run_key.replace("/", "-"),
        tags,
        params or {"trainer": {"lr": 1e-6, "steps": 10}},
        tmp_path / "local",
    )


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


def test_start_resume_same_run_and_data_lands(
    results: Path, tmp_path: Path, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    long_value = "x" * (MAX_PARAM_VAL_LENGTH + 50)
    first = _start(
        results,
        tmp_path,
        "tiny/tiny-s/dapo/s0",
        {"trainer": {"lr": 1e-6, "steps": 10}, "data": {"suites": ["a", "b"]}, "note": long_value},
    )
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


def test_resume_with_changed_params_keeps_first_and_warns(results: Path, tmp_path: Path, client) -> None:
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

    base = Tracker.attach(results, "paper-b", "tiny/tiny-s/base/s0", tmp_path / "eval", tags={"method": "base"})
    base.end()
    created = client.get_run(base.run_id)
    assert created.data.tags["run_key"] == "tiny/tiny-s/base/s0"
    assert created.data.tags["method"] == "base" and created.info.status == "FINISHED"


@pytest.mark.timeout(120)  # a hang on the unreachable server fails here (no wall-clock assertion)
def test_unreachable_server_falls_back_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    with pytest.warns(RuntimeWarning, match=re.escape(uri)) as record:
        tracker = Tracker.start(
            tmp_path,
            "paper-a",
            "tiny/tiny-s/off/s0",
            "off",
            {"method": "dapo"},
            {"trainer": {"lr": 1e-6}},
            tmp_path / "run",
        )
        tracker.log_metrics({"reward_mean": 0.5}, step=3)
        tracker.log_metrics({"reward_mean": 0.6}, step=4)
        tracker.set_tags({"note": "x"})
        tracker.end("FINISHED")
    assert len(record) == 1  # warned once
    assert tracker.offline and tracker.run_id is None
    lines = [json.loads(x) for x in (tmp_path / "run" / OFFLINE_FILE).read_text().splitlines()]
    assert [x["event"] for x in lines] == ["offline", "start", "log_metrics", "log_metrics", "set_tags", "end"]
    assert all(x["run_key"] == "tiny/tiny-s/off/s0" and x["time"] > 0 for x in lines)
    assert lines[0]["payload"]["uri"] == uri
    assert lines[1]["payload"]["params"] == {"trainer.lr": "1e-06"}
    assert [x["payload"] for x in lines[2:4]] == [
        {"metrics": {"reward_mean": 0.5}, "step": 3},
        {"metrics": {"reward_mean": 0.6}, "step": 4},
    ]
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
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

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


# ----------------------------------------------------------------------------------------------
# experiments open on training runs; tables are parent runs with their rows nested under them


def test_experiments_are_tagged_for_training_runs(results: Path, client) -> None:
    client.set_experiment_tag(client.get_experiment_by_name("paper-b").experiment_id, "mlflow.experimentKind", "")
    init_store(results, EXPERIMENTS)  # an experiment made before the tag existed gets it
    for name in EXPERIMENTS:
        assert client.get_experiment_by_name(name).tags["mlflow.experimentKind"] == "custom_model_development"


def _start_child(results: str, local: str, run_key: str, experiment: str = "paper-a") -> str:
    """Start (in a fresh process) a run nested under table paper-a/main's parent; return the parent id."""
    from creditlab.tracking.mlflow_tracker import PARENT_TAG, ParentRun

    with Tracker.start(
        Path(results),
        experiment,
        run_key,
        run_key,
        {"seed": 0},
        {"lr": 1.0},
        Path(local),
        parent=ParentRun.of_table("tiny", "paper-a", "main"),
    ) as tracker:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracker.uri).get_run(tracker.run_id).data.tags[PARENT_TAG]


def test_rows_nest_under_one_table_parent_even_when_jobs_race(
    results: Path, tmp_path: Path, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four processes start four rows of one table at the same time, with no parent run yet: one parent
    survives (the others' duplicates are deleted), every row is its child, and it carries the table's tags."""
    import multiprocessing as mp

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    keys = [f"tiny/tiny-s/race-{i}/s0" for i in range(4)]
    with mp.get_context("spawn").Pool(4) as pool:
        parents = pool.starmap(_start_child, [(str(results), str(tmp_path / k.replace("/", "_")), k) for k in keys])
    assert len(set(parents)) == 1
    exp = client.get_experiment_by_name("paper-a").experiment_id
    tables = client.search_runs([exp], "tags.run_key = 'tiny/table/paper-a/main'")
    assert [r.info.run_id for r in tables] == parents[:1]
    parent = tables[0]
    assert parent.info.run_name == "table paper-a/main"
    assert parent.data.tags["kind"] == "table" and parent.data.tags["table"] == "paper-a/main"
    children = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parents[0]}'")
    assert sorted(r.data.tags["run_key"] for r in children) == keys
    # a restarted job resumes its run and keeps its parent
    assert _start_child(str(results), str(tmp_path / "again"), keys[0]) == parents[0]


def test_publish_table_logs_cells_files_and_a_compare_link_across_experiments(
    results: Path, tmp_path: Path, client
) -> None:
    """The table's parent run gets the table as its description, every cell as a metric, the files as
    artifacts, the row runs' ids and a compare link that includes a row living in another experiment."""
    import urllib.parse

    import pandas as pd

    from creditlab.tables.frame import row_run_ids
    from creditlab.tracking.mlflow_tracker import NOTE_TAG, ParentRun
    from creditlab.tracking.table_runs import publish_table

    ids = []
    for key, experiment in (("tiny/tiny-s/pub-a/s0", "paper-a"), ("tiny/tiny-s/pub-b/s0", "paper-b")):
        with _start(results, tmp_path, key, experiment=experiment) as tracker:
            ids.append(tracker.run_id)
    df = pd.DataFrame(
        {
            "row": ["DAPO", "DAPO", "Ours"],
            "backbone": ["tiny-s"] * 3,
            "column": ["AIME24", "AMC", "AIME24"],
            "ours_mean": [40.0, float("nan"), 45.5],
            "mlflow_run_ids": [ids[0], ids[0], ids[1]],
        }
    )
    csv, md = tmp_path / "pub.csv", tmp_path / "pub.md"
    df.to_csv(csv, index=False)
    md.write_text("# Table pub\n\n| row | AIME24 |\n|---|---|\n| Ours | 45.5 |\n")
    link = publish_table(
        results,
        "paper-a",
        "tiny",
        "paper-a",
        "pub",
        df,
        md.read_text(),
        [csv, md],
        tmp_path / "local-pub",
        run_ids=row_run_ids(df),
    )
    exp_a = client.get_experiment_by_name("paper-a").experiment_id
    exp_b = client.get_experiment_by_name("paper-b").experiment_id
    query = urllib.parse.parse_qs(link.split("?", 1)[1])
    assert json.loads(query["runs"][0]) == ids and json.loads(query["experiments"][0]) == [exp_a, exp_b]
    run = client.get_run(find_run_id(results, "paper-a", ParentRun.of_table("tiny", "paper-a", "pub").key))
    assert run.info.status == "FINISHED" and run.info.run_name == "table paper-a/pub"
    assert run.data.tags[NOTE_TAG] == md.read_text() and run.data.tags["compare_url"] == link
    assert run.data.tags["row_run_ids"] == ",".join(ids) and run.data.tags["rows"] == "2"
    assert run.data.metrics == {"AIME24/DAPO/tiny-s": 40.0, "AIME24/Ours/tiny-s": 45.5}  # NaN cell: no metric
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["pub.csv", "pub.md"]


def test_unique_run_deletes_its_own_duplicate_when_another_job_got_there_first(results: Path, client) -> None:
    from creditlab.tracking.mlflow_tracker import _unique_run, tracking_uri

    exp = client.get_experiment_by_name("paper-a").experiment_id
    made = {}

    def create():  # another job creates the run between our look-up and our create
        made["other"] = client.create_run(exp, tags={"run_key": "tiny/dup"}, run_name="other")
        time.sleep(0.01)
        made["mine"] = client.create_run(exp, tags={"run_key": "tiny/dup"}, run_name="mine")
        return made["mine"]

    uri = tracking_uri(results)
    run, created = _unique_run(client, exp, "tiny/dup", create, uri)
    assert (run.info.run_id, created) == (made["other"].info.run_id, False)
    assert client.get_run(made["mine"].info.run_id).info.lifecycle_stage == "deleted"
    assert _unique_run(client, exp, "tiny/dup", create, uri)[0].info.run_id == made["other"].info.run_id


def test_init_store_nests_runs_tracked_before_their_table_had_a_parent(results: Path, tmp_path: Path, client) -> None:
    from creditlab.tracking.mlflow_tracker import PARENT_TAG, ParentRun

    with _start(results, tmp_path, "tiny/tiny-s/legacy/s0") as tracker:  # no parent: an older store
        rid = tracker.run_id
    parent = ParentRun.of_table("tiny", "paper-a", "legacy")
    children = [("paper-a", "tiny/tiny-s/legacy/s0", parent.key), ("paper-a", "tiny/tiny-s/absent/s0", parent.key)]
    init_store(results, EXPERIMENTS, [("paper-a", parent)], children)
    pid = find_run_id(results, "paper-a", parent.key)
    assert client.get_run(rid).data.tags[PARENT_TAG] == pid
    init_store(results, EXPERIMENTS, [("paper-a", parent)], children)  # idempotent
    assert find_run_id(results, "paper-a", parent.key) == pid and client.get_run(rid).data.tags[PARENT_TAG] == pid
