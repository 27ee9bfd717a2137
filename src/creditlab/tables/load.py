"""Read the results a table is built from: evaluations (metrics.json) and training metrics (metrics.jsonl), with
their provenance.

Evaluation results live at `{evals_dir}/{backbone}/{run}/s{seed}/metrics.json` (backbone = our model config name at
the scale, run = run name or "base"; a test-time decoding's under the run's `decode/<name>`), each suite with its
per-question data: greedy -> greedy[q]; avg@k -> c[q] / n; pass@j -> unbiased pass@j from (n, c[q], j);
replacement_rate -> resampled[q] / tokens[q]. Training metrics live at
`{runs_dir}/{backbone}/{run}/s{seed}/metrics.jsonl`, one record per RL step (a step logged twice keeps its last record;
a line cut by a killed job is skipped with a warning); provenance from the run directory's DONE and config.yaml.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from creditlab import paths
from creditlab.stats import pass_at_k_per_question
from creditlab.tables.frame import SEP
from creditlab.tables.stats import ema, steps_to_threshold

log = logging.getLogger(__name__)


def metrics_path(evals_dir: Path, backbone: str, run: str, seed: int, decode: str | None = None) -> Path:
    """Where the evaluation of `run` on `backbone` with `seed` (and a test-time `decode`) writes metrics.json."""
    pattern = paths.EVAL_METRICS if decode is None else paths.DECODE_EVAL_METRICS
    return paths.fmt(
        pattern.replace("{results}/{scale}/evals", str(evals_dir)), backbone=backbone, run=run, seed=seed, decode=decode
    )


def load_eval(evals_dir: Path, backbone: str, run: str, seed: int, decode: str | None = None) -> dict[str, Any]:
    """Read one metrics.json; FileNotFoundError naming the run and the path when it is missing."""
    path = metrics_path(evals_dir, backbone, run, seed, decode)
    if not path.is_file():
        raise FileNotFoundError(
            f"no evaluation for run {run!r}{f' decoded with {decode!r}' if decode else ''} on backbone "
            f"{backbone!r} seed {seed}: {path} is missing"
        )
    with path.open() as fh:
        data = json.load(fh)
    data["_path"] = str(path)
    return data


def run_metrics_path(runs_dir: Path, backbone: str, run: str, seed: int) -> Path:
    """Where the training of `run` on `backbone` with `seed` writes metrics.jsonl (paths.RUN_METRICS)."""
    return paths.fmt(
        paths.RUN_METRICS.replace("{results}/{scale}/runs", str(runs_dir)), backbone=backbone, run=run, seed=seed
    )


def _warn(message: str) -> None:
    """Warn through both `warnings` (visible in tests) and logging (visible in job logs)."""
    warnings.warn(message, stacklevel=3)
    log.warning(message)


def read_jsonl(path: Path) -> list[dict]:
    """Read a metrics.jsonl; a non-JSON line (cut by a killed job) is skipped with a warning."""
    records = []
    with Path(path).open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                _warn(f"{path}:{lineno}: not valid JSON, line skipped")
    return records


def curve(records: Sequence[Mapping], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` by step; a step logged twice (resumed run) keeps its last value."""
    by_step: dict[int, float] = {}
    for rec in records:
        value = rec.get(key)
        if "step" in rec and isinstance(value, (int, float)) and math.isfinite(value):
            by_step[int(rec["step"])] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def read_step_times(path: Path, key: str = "t_step") -> np.ndarray:
    """The `key` values (default `t_step`, seconds) of every step of a training metrics.jsonl, in step order
    (steps without a finite value skipped).

    A step logged twice (resumed run) keeps its last record; a line cut by a killed job is skipped
    with a warning. FileNotFoundError / ValueError naming the path when there is nothing to read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training metrics: {path} is missing")
    by_step: dict[int, float] = {}
    with path.open() as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{lineno}: not valid JSON, line skipped", stacklevel=2)
                continue
            value = rec.get(key)
            if "step" in rec and isinstance(value, (int, float)) and math.isfinite(value):
                by_step[int(rec["step"])] = float(value)
    if not by_step:
        what = " (the RL step wall time)" if key == "t_step" else ""
        raise ValueError(f"{path}: no step with a finite {key!r}{what}")
    return np.array([by_step[s] for s in sorted(by_step)], dtype=float)


@dataclass(frozen=True)
class StepTimes:
    """The step wall times of one run on one backbone, all seeds pooled, with their provenance."""

    values: np.ndarray
    provenance: dict[str, str]

    @property
    def mean(self) -> float:
        return float(self.values.mean())


def _run_provenance(path: Path) -> dict[str, Any]:
    """Provenance of a run's metrics.jsonl from its run dir: DONE (MLflow run id, run key, commit) and
    config.yaml; the file itself as source."""
    done, config = path.parent / "DONE", path.parent / "config.yaml"
    prov: dict[str, Any] = {}
    if done.is_file():
        try:
            prov = json.loads(done.read_text())
        except json.JSONDecodeError:
            warnings.warn(f"{done}: not valid JSON; training-metrics provenance left empty", stacklevel=3)
    return {
        "provenance": {
            "mlflow_run_id": prov.get("mlflow_run_id"),
            "run_key": prov.get("run_key"),
            "commit": prov.get("commit"),
            "config": str(config) if config.is_file() else None,
        },
        "_path": str(path),
    }


def load_step_times(runs_dir: Path, backbone: str, run: str, seeds: Sequence[int], key: str = "t_step") -> StepTimes:
    """Pool the `key` values (default `t_step`) of `seeds`; provenance from each run dir's DONE (MLflow run id, run
    key, commit) and config.yaml, and the metrics.jsonl paths as sources."""
    values, provs = [], []
    for seed in seeds:
        path = run_metrics_path(Path(runs_dir), backbone, run, seed)
        values.append(read_step_times(path, key))
        provs.append(_run_provenance(path))
    return StepTimes(np.concatenate(values), provenance(provs))


def read_reward_curve(path: Path, key: str = "reward_mean") -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `key` in a training metrics.jsonl, by step (a step logged twice keeps its last
    record; a cut line is skipped with a warning). FileNotFoundError / ValueError naming the path when
    there is nothing to read."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training metrics: {path} is missing")
    steps, values = curve(read_jsonl(path), key)
    if not steps:
        raise ValueError(f"{path}: no step with a finite {key!r} (the training reward)")
    return np.asarray(steps, dtype=int), np.asarray(values, dtype=float)


@dataclass(frozen=True)
class StepsTo:
    """Steps to reach a training-reward threshold of one run on one backbone, one value per seed."""

    seeds: tuple[int, ...]
    values: np.ndarray
    """Per seed: the steps run until the reward EMA reached the threshold, or N if it never did."""
    censored: np.ndarray
    """Per seed: True when the threshold was never reached (the value is then N, a lower bound)."""
    trained: np.ndarray
    """Per seed: N, the steps trained (1 + the last step logged)."""
    provenance: dict[str, str]
    threshold: float = float("nan")
    """The reward level the seeds had to reach."""

    @property
    def mean(self) -> float:
        return float(self.values.mean())

    @property
    def n_censored(self) -> int:
        return int(self.censored.sum())


def load_steps_to(
    runs_dir: Path, backbone: str, run: str, seeds: Sequence[int], threshold: float, smoothing: float
) -> StepsTo:
    """Per seed, the steps until the EMA of the run's `reward_mean` reaches `threshold` (steps_to_threshold);
    provenance as load_step_times."""
    values, censored, trained, provs = [], [], [], []
    for seed in seeds:
        path = run_metrics_path(Path(runs_dir), backbone, run, seed)
        steps, rewards = read_reward_curve(path)
        value, cens, n = steps_to_threshold(steps, rewards, threshold, smoothing)
        values.append(value)
        censored.append(cens)
        trained.append(n)
        provs.append(_run_provenance(path))
    return StepsTo(
        tuple(int(s) for s in seeds),
        np.asarray(values, dtype=float),
        np.asarray(censored, dtype=bool),
        np.asarray(trained, dtype=int),
        provenance(provs),
        float(threshold),
    )


def final_reward_ema(runs_dir: Path, backbone: str, run: str, seeds: Sequence[int], smoothing: float) -> float:
    """Mean over `seeds` of the last value of the EMA (`smoothing`, debiased: stats.ema) of the run's training
    `reward_mean`: the level a steps_to column with `threshold_of` scales."""
    curves = [read_reward_curve(run_metrics_path(Path(runs_dir), backbone, run, s))[1] for s in seeds]
    finals = [ema(list(rewards), smoothing)[-1] for rewards in curves]
    return float(np.mean(finals))


def question_values(suite: dict[str, Any], metric: str) -> np.ndarray:
    """Per-question values of a concrete metric ("greedy", "avg@8", "pass@1", ...) for one suite."""
    pq = suite["per_question"]
    if metric == "greedy":
        return np.asarray(pq["greedy"], dtype=float)
    if metric == "replacement_rate":  # test-time decoding: resampled / generated tokens of each question
        if "resampled" not in pq:
            raise ValueError("replacement_rate needs a test-time decoding evaluation (row with `decode`)")
        return np.asarray(pq["resampled"], dtype=float) / np.maximum(np.asarray(pq["tokens"], dtype=float), 1)
    kind, _, j_text = metric.partition("@")
    j, n = int(j_text), int(pq["n"])
    correct = np.asarray(pq["c"], dtype=int)
    if j > n:
        raise ValueError(f"{metric} needs at least {j} samples per question, the evaluation has n={n}")
    if kind == "avg":
        return correct / n
    if kind == "pass":
        return pass_at_k_per_question(n, correct, j)
    raise ValueError(f"unknown metric {metric!r}")


def _suite(result: dict[str, Any], suite: str) -> dict[str, Any]:
    """The `suite` block of a metrics.json, or a ValueError naming the suites it has."""
    suites = result.get("suites", {})
    if suite not in suites:
        raise ValueError(f"{result['_path']}: no suite {suite!r}; choices: {sorted(suites)}")
    return suites[suite]


def _check_summary(suite: dict[str, Any], metric: str, values: np.ndarray, path: str) -> None:
    """Warn when the recomputed mean disagrees with the summary metric the evaluation wrote."""
    summary = suite.get("metrics", {}).get(metric)
    if summary is None or "mean" not in summary:
        return
    if not math.isclose(float(values.mean()), float(summary["mean"]), abs_tol=1e-6):
        warnings.warn(
            f"{path}: {metric} recomputed from per-question data is {values.mean():.6f}, "
            f"the file's summary says {summary['mean']:.6f}; the table uses the recomputed value",
            stacklevel=3,
        )


def seed_averaged(results: Sequence[dict[str, Any]], suite: str, metric: str) -> np.ndarray:
    """Per-question values of `metric` on `suite`, averaged over the seeds' results."""
    return seed_matrix(results, suite, metric).mean(axis=1)


def seed_matrix(results: Sequence[dict[str, Any]], suite: str, metric: str) -> np.ndarray:
    """Per-question values of `metric` on `suite`, one column per seed's result: [n_questions, n_seeds]."""
    per_seed: list[np.ndarray] = []
    ids = None
    for result in results:
        block = _suite(result, suite)
        these = list(block["per_question"]["ids"])
        if ids is None:
            ids = these
        elif these != ids:
            raise ValueError(
                f"{result['_path']}: questions of suite {suite!r} differ from the other seeds' ({results[0]['_path']})"
            )
        values = question_values(block, metric)
        if len(values) != len(these):
            raise ValueError(
                f"{result['_path']}: suite {suite!r} has {len(these)} ids but {len(values)} {metric} values"
            )
        _check_summary(block, metric, values, result["_path"])
        per_seed.append(values)
    return np.stack(per_seed, axis=1)


def sandbox_tiers(results: Sequence[dict[str, Any]], suites: Sequence[str]) -> str:
    """The code sandbox tier(s) `suites` were scored under in the seeds' evaluations, one entry per seed (a tier
    with its acceptance, ``process (accepted)``, when a weaker tier was accepted in words); "" when none is code."""
    per_seed = []
    for r in results:
        recs = [(r.get("suites") or {}).get(s, {}).get("sandbox") for s in suites]
        tiers = [f"{x['tier']} (accepted)" if x.get("accepted") else str(x["tier"]) for x in recs if x]
        if tiers:
            per_seed.append("+".join(dict.fromkeys(tiers)))
    return SEP.join(per_seed)


def provenance(results: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Join the provenance fields of the seeds' results, one value per seed."""
    provs = [r.get("provenance") or {} for r in results]

    def joined(key: str) -> str:
        return SEP.join("" if p.get(key) is None else str(p[key]) for p in provs)

    return {
        "mlflow_run_ids": joined("mlflow_run_id"),
        "run_keys": joined("run_key"),
        "commits": joined("commit"),
        "configs": joined("config"),
        "sources": SEP.join(str(r.get("_path", "")) for r in results),
    }
