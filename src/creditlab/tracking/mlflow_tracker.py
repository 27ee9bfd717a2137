"""MLflow tracking with deterministic run identity and an honest offline fallback.

- One experiment per paper, one MLflow run per training run, identified by the tag `run_key`
  (`{scale}/{backbone}/{run}/s{seed}`): a killed and restarted job resumes the same MLflow run,
  and the evaluation step logs into the run it evaluates (`Tracker.attach`).
- Store: env `MLFLOW_TRACKING_URI` if set, else a SQLite file `results/mlflow.db`, artifacts
  under `results/mlartifacts/<experiment>`. `init_store` creates the store and the experiments
  once, before any job (two jobs creating a fresh SQLite store at once crash MLflow).
- Nested runs per table: every table has a parent run in its paper's experiment (run key
  `{scale}/table/{paper}/{table}`, name `table {paper}/{table}`, see `ParentRun`). A run that trains or
  evaluates a table's row is created as its child (tag `mlflow.parentRunId`), so the experiment page
  shows a table's rows folded under it; a run shared by several tables is the child of its first
  table in its own experiment, and every table's parent carries a link to the compare view of
  exactly its rows (`publish_table`), wherever they live. Runs are found or created by a race-safe
  protocol (`_unique_run`, a file lock on a local store): concurrent jobs creating the same parent end with one.
- Experiments are tagged `mlflow.experimentKind = custom_model_development` so that MLflow 3's UI
  opens them on the training-runs view rather than the GenAI traces overview.
- Tracking must never stop training: an http(s) server is probed first (3 s) and our MLflow
  calls run without retries and with a short timeout; the first failing MLflow call (refused,
  timeout, database error, ...) warns once with the URI and the reason and switches the tracker
  offline. From then on every call is appended as one JSON line
  `{"event", "run_key", "payload", "time"}` to `local_dir/mlflow_offline.jsonl`: nothing is lost.
  Errors in the caller's own arguments (a non-numeric metric, a missing artifact file) are
  raised, not swallowed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from creditlab.tracking.provenance import git_commit

if TYPE_CHECKING:  # mlflow is imported lazily: it costs ~1.5 s and most callers do not need it
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
OFFLINE_FILE = "mlflow_offline.jsonl"
PROBE_TIMEOUT_S = 3.0
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
STANDARD_TAGS = ("run_key", "paper", "table", "method", "backbone", "seed", "scale", "git_commit", "slurm_job_id")
END_STATUSES = ("FINISHED", "FAILED", "KILLED", "SCHEDULED")  # SCHEDULED: paused for its next SLURM allocation

# MLflow's limits (mlflow.utils.validation), restated to keep the import lazy
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000

PARENT_TAG = "mlflow.parentRunId"
NOTE_TAG = "mlflow.note.content"  # the run's description (Markdown) in the UI
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
MAX_KEYED_RUNS = 50  # runs fetched per run key when resolving duplicates

_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")

_UNREACHABLE: dict[str, str] = {}
"""Tracking servers whose probe failed in this process -> reason (not probed again)."""


# ----------------------------------------------------------------------------------------------
# store location and reachability


def tracking_uri(results_dir: str | Path) -> str:
    """The tracking URI: env MLFLOW_TRACKING_URI if set, else SQLite at results_dir/mlflow.db."""
    env = os.environ.get(ENV_TRACKING_URI, "").strip()
    if env:
        return env
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def _is_remote(uri: str) -> bool:
    """True for a tracking server (http, https, databricks), False for a local store."""
    return uri.startswith(("http://", "https://", "databricks"))


def artifact_location(results_dir: str | Path, experiment: str, uri: str) -> str | None:
    """results_dir/mlartifacts/<experiment> for a local store; None (server's choice) otherwise."""
    if _is_remote(uri):
        return None
    return (Path(results_dir).resolve() / "mlartifacts" / experiment).as_uri()


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Return why an http(s) tracking server cannot be reached, or None if it answers.

    Any HTTP answer (even an error status) counts as reachable: later failures of real calls
    are handled by the tracker. Local stores are not probed.
    """
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, socket.timeout) as err:
        reason = getattr(err, "reason", err)
        return f"{type(err).__name__}: {reason}"


def _prepare(uri: str) -> str | None:
    """Get ready to call MLflow at `uri`: bound its http retries/timeout, probe it once.

    Returns the reason it is unreachable (cached for the process), or None.
    """
    if uri in _UNREACHABLE:
        return _UNREACHABLE[uri]
    if uri.startswith(("http://", "https://")):
        for key, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        reason = probe(uri)
        if reason is not None:
            _UNREACHABLE[uri] = reason
        return reason
    if uri.startswith("sqlite:///"):
        try:
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return f"{type(err).__name__}: {err}"
    return None


def _warn_unreachable(uri: str, reason: str, what: str) -> None:
    """The single warning (warnings + logging) that tracking at `uri` failed and why."""
    message = f"MLflow tracking at {uri} failed ({reason}); {what}"
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    log.warning(message)


def _client(uri: str) -> MlflowClient:
    """An MlflowClient for `uri` (imports mlflow on first use)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


# ----------------------------------------------------------------------------------------------
# experiments and runs


def _ensure_experiment(client: MlflowClient, name: str, location: str | None) -> str:
    """The id of experiment `name`, created (or restored if deleted) when needed, with EXPERIMENT_TAGS."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
        except MlflowException:  # created concurrently by another process
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    for key, value in EXPERIMENT_TAGS.items():  # experiments made before the tag existed
        if exp.tags.get(key) != value:
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def _check_run_key(run_key: str) -> None:
    """A run key goes into an MLflow filter string: it must be non-empty and quote-free."""
    if not run_key or "'" in run_key or '"' in run_key:
        raise ValueError(f"invalid run_key {run_key!r}: must be non-empty, without quotes")


def _keyed_runs(client: MlflowClient, experiment_id: str, run_key: str) -> list[Run]:
    """The active runs of the experiment tagged run_key == `run_key`, earliest first (ties: run id)."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.run_key = '{run_key}'", max_results=MAX_KEYED_RUNS)
    return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))


def _find_run(client: MlflowClient, experiment_id: str, run_key: str) -> Run | None:
    """The earliest active run of the experiment tagged run_key == `run_key`, or None."""
    runs = _keyed_runs(client, experiment_id, run_key)
    return runs[0] if runs else None


@contextmanager
def _creation_lock(uri: str) -> Iterator[None]:
    """Serialise find-or-create of runs between the processes of one machine on a local store (an exclusive
    ``flock`` on ``<store>.create.lock``); a no-op for a tracking server (whose jobs find every parent run that
    `init_store` created before them). Without it, find-create-look-again is not enough: a racer that looked
    before another's run was committed keeps its own, while the other, whose client-side start time is earlier,
    keeps its own too (seen in CI: two parent runs of one table, rows split between them)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    path = Path(uri.removeprefix("sqlite:///")).with_suffix(".create.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _unique_run(
    client: MlflowClient, experiment_id: str, run_key: str, create: Callable[[], Run], uri: str
) -> tuple[Run, bool]:
    """The run of `run_key`, created with `create()` if there is none: (run, created by this call).

    On a local store, find-or-create holds the store's creation lock (`_creation_lock`), so exactly one
    process creates. Against a server, after creating, look again: if an earlier run of the key exists
    (another job created one at the same time), delete ours and use that one (best effort: `init_store`
    creates every parent before any job starts, so jobs only find them).
    """
    with _creation_lock(uri):
        run = _find_run(client, experiment_id, run_key)
        if run is not None:
            return run, False
        mine = create()
        first = _find_run(client, experiment_id, run_key)
    if first is not None and first.info.run_id != mine.info.run_id:
        client.delete_run(mine.info.run_id)
        return first, False
    return mine, True


@dataclass(frozen=True)
class ParentRun:
    """The parent run that groups a table's rows in its paper's experiment (see the module doc)."""

    key: str
    name: str
    tags: Mapping[str, str]

    @classmethod
    def of_table(cls, scale: str, paper: str, table: str) -> ParentRun:
        """The parent run of `paper`'s table `table` at `scale`."""
        return cls(
            key=f"{scale}/table/{paper}/{table}",
            name=f"table {paper}/{table}",
            tags={"kind": "table", "paper": paper, "table": f"{paper}/{table}", "scale": scale},
        )


def compare_url(run_ids: Sequence[str], experiment_ids: Sequence[str], base: str = "") -> str:
    """The MLflow UI's compare view of `run_ids` (from `experiment_ids`), relative to the UI's `base` URL."""
    compact = {"separators": (",", ":")}
    query = urllib.parse.urlencode(
        {
            "runs": json.dumps(list(run_ids), **compact),
            "experiments": json.dumps(list(dict.fromkeys(experiment_ids)), **compact),
        },
        quote_via=urllib.parse.quote,
    )
    return f"{base.rstrip('/')}/#/compare-runs?{query}" if base else f"#/compare-runs?{query}"


def _parent_run_id(client: MlflowClient, exp_id: str, parent: ParentRun, uri: str) -> str:
    """The run id of `parent` in experiment `exp_id`, created (status RUNNING) if needed (race-safe)."""

    def create() -> Run:
        return client.create_run(exp_id, tags=standard_tags(parent.key, parent.tags), run_name=parent.name)

    return _unique_run(client, exp_id, parent.key, create, uri)[0].info.run_id


def init_store(
    results_dir: str | Path,
    experiments: Sequence[str],
    parents: Sequence[tuple[str, ParentRun]] = (),
    children: Sequence[tuple[str, str, str]] = (),
) -> None:
    """Create the tracking store, the experiments and the tables' parent runs (experiment, parent) once,
    before any job (idempotent), and nest existing runs (experiment, run key, parent key) that have no
    parent yet (runs tracked before tables had parent runs). Jobs would create a missing parent too
    (race-safe), but doing it here also shows every planned table in the UI before its first row starts.

    An unreachable store is reported with a warning, not raised: jobs then track offline.
    """
    uri = tracking_uri(results_dir)
    reason = _prepare(uri)
    if reason is None:
        try:
            client = _client(uri)
            ids = {
                name: _ensure_experiment(client, name, artifact_location(results_dir, name, uri))
                for name in dict.fromkeys([*experiments, *(e for e, _ in parents)])
            }
            parent_ids: dict[tuple[str, str], str] = {}
            for name, parent in parents:
                parent_ids[name, parent.key] = _parent_run_id(client, ids[name], parent, uri)
            for name, run_key, parent_key in children:
                run = _find_run(client, ids[name], run_key) if name in ids else None
                pid = parent_ids.get((name, parent_key))
                if run is not None and pid is not None and PARENT_TAG not in run.data.tags:
                    client.set_tag(run.info.run_id, PARENT_TAG, pid)
            return
        except Exception as err:  # noqa: BLE001 - any store failure must not stop the pipeline
            reason = f"{type(err).__name__}: {err}"
    _warn_unreachable(uri, reason, "experiments not created; jobs will track offline")


def find_run_id(results_dir: str | Path, experiment: str, run_key: str) -> str | None:
    """The MLflow run id of `run_key` in `experiment`, or None (no such run / store unreachable)."""
    _check_run_key(run_key)
    uri = tracking_uri(results_dir)
    reason = _prepare(uri)
    if reason is None:
        try:
            client = _client(uri)
            exp = client.get_experiment_by_name(experiment)
            run = _find_run(client, exp.experiment_id, run_key) if exp else None
            return run.info.run_id if run else None
        except Exception as err:  # noqa: BLE001
            reason = f"{type(err).__name__}: {err}"
    _warn_unreachable(uri, reason, f"cannot look up run {run_key!r}")
    return None


# ----------------------------------------------------------------------------------------------
# parameters, tags, metrics as MLflow entities


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config to dotted keys with string values cut to MLflow's length limit.

    Lists and other non-mapping values are stored as JSON text.
    """
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{mlflow_key(key)}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{name}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        flat[name] = text[:MAX_PARAM_VAL_LENGTH]
    return flat


def mlflow_key(name: str) -> str:
    """An MLflow-safe metric/param/tag name: "@" -> "_at_" (avg@8 -> avg_at_8), and any other
    character MLflow rejects (outside letters, digits, _ - . space : /) -> "_"."""
    return _BAD_KEY_CHARS.sub("_", str(name).replace("@", "_at_"))


def _str_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tags with safe keys and string values cut to MLflow's length limit."""
    return {mlflow_key(k): ("" if v is None else str(v))[:MAX_TAG_VAL_LENGTH] for k, v in tags.items()}


def _float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Metrics with safe keys and float values (non-numbers raise: that is a caller bug)."""
    return {mlflow_key(k): float(v) for k, v in metrics.items()}


def _is_rejection(err: Exception) -> bool:
    """True when MLflow refused the call's arguments (as opposed to the store failing)."""
    return getattr(err, "error_code", None) == "INVALID_PARAMETER_VALUE"


def _chunks(items: list, size: int) -> Iterator[list]:
    """`items` in consecutive pieces of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def standard_tags(run_key: str, tags: Mapping[str, Any]) -> dict[str, str]:
    """The caller's tags plus the standard ones: run_key, git_commit, slurm_job_id, host.

    Standard tags the caller does not give are set to "" so that every run can be filtered on
    every standard tag; run_key always equals the run's key.
    """
    merged: dict[str, Any] = {name: "" for name in STANDARD_TAGS}
    merged.update(git_commit=git_commit(), slurm_job_id=os.environ.get("SLURM_JOB_ID", ""), host=socket.gethostname())
    merged.update({k: v for k, v in tags.items() if v is not None})
    merged["run_key"] = run_key
    return _str_tags(merged)


# ----------------------------------------------------------------------------------------------
# the tracker


class Tracker:
    """One MLflow run, or its offline log when tracking is unreachable.

    Create with `Tracker.start` (training: create or resume the run of a run key) or
    `Tracker.attach` (evaluation: reopen the run without touching its params). Usable as a
    context manager: leaving the block ends the run FINISHED, or FAILED on an exception.
    """

    def __init__(
        self, uri: str, experiment: str, run_key: str, local_dir: str | Path, owns_status: bool = True
    ) -> None:
        self.uri = uri
        self.experiment = experiment
        self.run_key = run_key
        self.local_dir = Path(local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self.offline_path = self.local_dir / OFFLINE_FILE
        self.owns_status = owns_status
        self.offline_reason: str | None = None
        self._run_id: str | None = None
        self._client: MlflowClient | None = None
        self._rejected: set[str] = set()

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        results_dir: str | Path,
        experiment: str,
        run_key: str,
        run_name: str,
        tags: Mapping[str, Any],
        params: Mapping[str, Any],
        local_dir: str | Path,
        parent: ParentRun | None = None,
    ) -> Tracker:
        """Create the MLflow run of `run_key`, or resume it if the experiment already has it.

        Sets the standard tags (see `standard_tags`) and logs `params` flattened to dotted keys.
        On resume, params already logged keep their value (MLflow params are immutable); a
        changed value is reported with a warning and listed in the tag `params_changed_on_resume`.
        With `parent`, the run is nested under that parent run (found or created in the same
        experiment).
        """
        _check_run_key(run_key)
        tracker = cls(tracking_uri(results_dir), experiment, run_key, local_dir)
        all_tags, flat = standard_tags(run_key, tags), flatten_params(params)
        payload = {
            "experiment": experiment,
            "run_name": run_name,
            "tags": all_tags,
            "params": flat,
            "parent": parent.key if parent else None,
        }
        tracker._open(
            "start", payload, lambda: tracker._create_or_resume(results_dir, run_name, all_tags, flat, parent)
        )
        return tracker

    @classmethod
    def attach(
        cls,
        results_dir: str | Path,
        experiment: str,
        run_key: str,
        local_dir: str | Path,
        tags: Mapping[str, Any] | None = None,
    ) -> Tracker:
        """Reopen the run of `run_key` to log into it (evaluation), without changing its params.

        The run's status is left as it is. If the run does not exist (e.g. the base model, or a
        training run that was tracked offline), it is created with the standard tags and `tags`,
        and this tracker then owns its status.
        """
        _check_run_key(run_key)
        tracker = cls(tracking_uri(results_dir), experiment, run_key, local_dir, owns_status=False)
        payload = {"experiment": experiment, "tags": dict(tags or {})}
        tracker._open("attach", payload, lambda: tracker._attach_or_create(results_dir, tags or {}))
        return tracker

    def _open(self, event: str, payload: dict[str, Any], action: Callable[[], None]) -> None:
        """Connect (probing a server first) and run `action`, or go offline and log `event`."""
        reason = _prepare(self.uri)
        if reason is not None:
            self._go_offline(reason)
            self._append(event, payload)
            return

        def connect_then_act() -> None:
            self._client = _client(self.uri)
            action()

        self._call(event, payload, connect_then_act)

    def _experiment_id(self, results_dir: str | Path) -> str:
        """The id of this tracker's experiment, created if needed."""
        assert self._client is not None
        location = artifact_location(results_dir, self.experiment, self.uri)
        return _ensure_experiment(self._client, self.experiment, location)

    def _create_or_resume(
        self,
        results_dir: str | Path,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, str],
        parent: ParentRun | None = None,
    ) -> None:
        """Online part of `start`."""
        assert self._client is not None
        client = self._client
        exp_id = self._experiment_id(results_dir)
        if parent is not None:
            tags = {**tags, PARENT_TAG: _parent_run_id(client, exp_id, parent, self.uri)}
        run, created = _unique_run(
            client, exp_id, self.run_key, lambda: client.create_run(exp_id, tags=tags, run_name=run_name), self.uri
        )
        self._run_id = run.info.run_id
        if created:
            self._log_batch(params=params)
            return
        log.info("resuming MLflow run %s of %s", self._run_id, self.run_key)
        self._client.update_run(self._run_id, status="RUNNING")
        changed = sorted(k for k, v in params.items() if run.data.params.get(k, v) != v)
        new = {k: v for k, v in params.items() if k not in run.data.params}
        if changed:
            warnings.warn(
                f"run {self.run_key}: params changed since the run was created, keeping the first values: {changed}",
                RuntimeWarning,
                stacklevel=4,
            )
            tags = {**tags, "params_changed_on_resume": ",".join(changed)[:MAX_TAG_VAL_LENGTH]}
        self._log_batch(params=new, tags=tags)

    def _attach_or_create(self, results_dir: str | Path, tags: Mapping[str, Any]) -> None:
        """Online part of `attach`."""
        assert self._client is not None
        client = self._client
        exp_id = self._experiment_id(results_dir)

        def create() -> Run:
            log.info("no MLflow run for %s yet: creating it", self.run_key)
            return client.create_run(exp_id, tags=standard_tags(self.run_key, tags), run_name=self.run_key)

        run, created = _unique_run(client, exp_id, self.run_key, create, self.uri)
        self.owns_status = created
        self._run_id = run.info.run_id

    # -- state ----------------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id; None when offline (the local jsonl is then the record)."""
        return None if self.offline else self._run_id

    @property
    def offline(self) -> bool:
        """True once tracking failed: every call then goes to local_dir/mlflow_offline.jsonl."""
        return self.offline_reason is not None

    def _go_offline(self, reason: str) -> None:
        """Go offline (once per tracker): warn with the URI and the reason, note it locally."""
        self.offline_reason = reason
        _warn_unreachable(self.uri, reason, f"logging run {self.run_key} offline to {self.offline_path}")
        self._append("offline", {"uri": self.uri, "reason": reason, "run_id": self._run_id})

    def _append(self, event: str, payload: Mapping[str, Any]) -> None:
        """Append one event to the offline jsonl (opened per call: a killed job loses nothing)."""
        record = {"event": event, "run_key": self.run_key, "payload": payload, "time": time.time()}
        with self.offline_path.open("a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def _call(self, event: str, payload: Mapping[str, Any], action: Callable[[], None]) -> None:
        """Run an MLflow `action`; on its first failure go offline. Offline, log `event` locally.

        A call MLflow rejects as invalid (e.g. changing a logged param) does not switch the
        tracker offline: it is warned about (once per event type) and recorded in the jsonl.
        """
        if not self.offline:
            try:
                action()
                return
            except Exception as err:  # noqa: BLE001 - a tracking failure must not stop training
                reason = f"{type(err).__name__}: {err}"
                if not _is_rejection(err) or self._run_id is None:
                    self._go_offline(reason)
                else:
                    self._reject(event, reason)
                    payload = {**payload, "rejected": reason}
        self._append(event, payload)

    def _reject(self, event: str, reason: str) -> None:
        """Warn (once per event type) that MLflow rejected a call's arguments."""
        if event in self._rejected:
            return
        self._rejected.add(event)
        message = f"MLflow rejected {event} for run {self.run_key} ({reason}); recorded in {self.offline_path} instead"
        warnings.warn(message, RuntimeWarning, stacklevel=4)
        log.warning(message)

    def _log_batch(
        self,
        metrics: Sequence[Any] = (),
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """log_batch in pieces within MLflow's per-request limits."""
        from mlflow.entities import Param, RunTag

        assert self._client is not None and self._run_id is not None
        entities = [Param(k, v) for k, v in (params or {}).items()]
        for piece in _chunks(entities, MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(self._run_id, params=piece)
        entities = [RunTag(k, v) for k, v in (tags or {}).items()]
        for piece in _chunks(entities, MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(self._run_id, tags=piece)
        for piece in _chunks(list(metrics), MAX_METRICS_PER_BATCH):
            self._client.log_batch(self._run_id, metrics=piece)

    # -- logging --------------------------------------------------------------------------------

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log scalar metrics at a step (values must be numbers)."""
        values = _float_metrics(metrics)
        stamp = int(time.time() * 1000)

        def action() -> None:
            from mlflow.entities import Metric

            self._log_batch(metrics=[Metric(k, v, stamp, int(step)) for k, v in values.items()])

        self._call("log_metrics", {"metrics": values, "step": int(step)}, action)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params (a nested mapping is flattened to dotted keys)."""
        flat = flatten_params(params)
        self._call("log_params", {"params": flat}, lambda: self._log_batch(params=flat))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set (or overwrite) tags."""
        text = _str_tags(tags)
        self._call("set_tags", {"tags": text}, lambda: self._log_batch(tags=text))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Log a file or a directory as an artifact; offline, its local path is recorded."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"artifact {path} does not exist")

        def action() -> None:
            assert self._client is not None
            if path.is_dir():
                self._client.log_artifacts(self._run_id, str(path), artifact_path)
            else:
                self._client.log_artifact(self._run_id, str(path), artifact_path)

        payload = {"path": str(path.resolve()), "artifact_path": artifact_path}
        self._call("log_artifact", payload, action)

    def compare_link(self, run_ids: Sequence[str]) -> str | None:
        """The UI-relative compare view of `run_ids` (runs of any experiment); None offline or on failure."""
        if self.offline or self._client is None or not run_ids:
            return None
        try:
            exps = [self._client.get_run(rid).info.experiment_id for rid in run_ids]
        except Exception as err:  # noqa: BLE001 - a missing run must not stop the table
            log.warning("no compare link for %s: %s", self.run_key, err)
            return None
        return compare_url(run_ids, exps)

    def end(self, status: str = "FINISHED") -> None:
        """End the run with `status`. An attached run's status is left unchanged."""
        if status not in END_STATUSES:
            raise ValueError(f"unknown run status {status!r}; choices: {list(END_STATUSES)}")
        if not self.owns_status:
            if self.offline:
                self._append("end", {"status": status, "owns_status": False})
            return

        def action() -> None:
            assert self._client is not None
            self._client.set_terminated(self._run_id, status=status)

        self._call("end", {"status": status}, action)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is KeyboardInterrupt:
            self.end("KILLED")
        elif getattr(exc, "mlflow_status", None):  # e.g. a run paused for its next SLURM allocation: SCHEDULED
            self.end(exc.mlflow_status)
        else:
            self.end("FAILED" if exc_type is not None else "FINISHED")
