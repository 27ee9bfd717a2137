"""Build a paper table from evaluation outputs: a long CSV and a readable Markdown page.

Evaluation results live at `{evals_dir}/{backbone}/{run}/s{seed}/metrics.json` (backbone = our
model config name at the scale, run = run name or "base"). Each cell is recomputed from the
per-question data, never from summary numbers or averaged CIs:

- per question: greedy -> greedy[q]; avg@k -> c[q] / n; pass@j -> unbiased pass@j from (n, c[q], j);
- several seeds: average each question's value over seeds (the questions are the same), then a
  percentile bootstrap over questions (2000 resamples, fixed seed);
- several suites (a `benchmarks` column or an `average_of` column): the mean of the suite means
  (plain or weighted by question count), with the CI from resampling questions within each
  suite independently.

Values are fractions in the files and percentages in the tables, as in the papers.

A `step_time` column is a training cost, read from `{runs_dir}/{backbone}/{run}/s{seed}/metrics.jsonl`
(`t_step` of every step, seconds): the mean over the steps of all seeds pooled, with a percentile
bootstrap over steps; with `relative_to: <run>` the cell is the % difference (or, with `relative: ratio`,
the ratio) vs that run on the same backbone (CI from the ratio of independent bootstrap means). A
base-model row has no training: empty.

A `steps_to` column (Paper E's compute to reach a threshold) reads the same files' `reward_mean`: per seed,
the RL steps run until the EMA of the reward curve (tables.figures.ema) first reaches the column's
`threshold` (1 + the 0-based step where it does); a seed that never reaches it is censored, counted at
its N steps trained and flagged (`censored` column, `>` in the Markdown). The cell is the mean over seeds
with a percentile bootstrap over seeds (none with one seed); `relative_to` compares the means as for
step_time (`relative: ratio` -> `0.91x`).

A benchmark without a stand-in at the table's scale (mapped to null) is left out: a column on it
alone is omitted, a column over several benchmarks averages the mapped ones, and the Markdown says so.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from creditlab import paths
from creditlab.eval.metrics import bootstrap_average, bootstrap_ci, pass_at_k_per_question
from creditlab.papers.spec import (BASE_RUN, COMPARISON_METRICS, TRAINING_METRICS, Column, PaperSpec, Row, TableSpec,
                                   resolve_metric)
from creditlab.tables.figures import curve, ema, read_jsonl

N_BOOT = 2000
ALPHA = 0.05
BOOT_SEED = 0

LONG_COLUMNS = (
    "row", "paper_backbone", "backbone", "run", "column", "suites", "metric", "unit",
    "ours_mean", "ours_lo", "ours_hi", "n_questions", "n_steps", "seeds", "paper", "scale",
    "left_out", "detail", "censored", "ref_censored", "mlflow_run_ids", "run_keys", "commits", "configs",
    "sources", "verdict", "p_value", "p_adj",
)
"""Columns of the long table frame (one line per row x shown column), in CSV order.

unit: "%" (accuracy), "s" (step_time), "steps" (steps_to), "% vs <run>" / "x vs <run>" (a training column
with relative_to <run>, relative percent / ratio); n_questions / n_steps: what the CI resamples (steps_to:
n_steps = the steps read, all seeds; its CI resamples the seeds, listed in `seeds`); left_out: the
column's paper benchmarks without a stand-in at this scale (";"-joined); detail: for relative cells both
means, for steps_to the value of every seed (`>N` = never reached in its N steps); censored: how many of
the row's seeds never reached a steps_to threshold (counted at N: the mean is then a lower bound);
ref_censored: the same for the relative_to run's seeds (0 for every other cell); sources: the files read;
verdict / p_value / p_adj: a versus cell's claim ("beats <ref>", "worse than <ref>", "noise", "reference"), its
two-sided p and its Holm-adjusted p over the table's versus cells (ours_mean: the difference in percentage points,
ours_lo / ours_hi: its 95% paired-bootstrap interval; unit "pp vs <run>")."""

SEP = ";"  # joins several values (one per seed or suite) in one CSV field


def metrics_path(evals_dir: Path, backbone: str, run: str, seed: int, decode: str | None = None) -> Path:
    """Where the evaluation of `run` on `backbone` with `seed` (and a test-time `decode`) writes metrics.json."""
    pattern = paths.EVAL_METRICS if decode is None else paths.DECODE_EVAL_METRICS
    return paths.fmt(pattern.replace("{results}/{scale}/evals", str(evals_dir)), backbone=backbone, run=run,
                     seed=seed, decode=decode)


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
    return paths.fmt(paths.RUN_METRICS.replace("{results}/{scale}/runs", str(runs_dir)), backbone=backbone,
                     run=run, seed=seed)


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
    return {"provenance": {"mlflow_run_id": prov.get("mlflow_run_id"), "run_key": prov.get("run_key"),
                           "commit": prov.get("commit"), "config": str(config) if config.is_file() else None},
            "_path": str(path)}


def load_step_times(runs_dir: Path, backbone: str, run: str, seeds: Sequence[int], key: str = "t_step"
                    ) -> StepTimes:
    """Pool the `key` values (default `t_step`) of `seeds`; provenance from each run dir's DONE (MLflow run id, run
    key, commit) and config.yaml, and the metrics.jsonl paths as sources."""
    values, provs = [], []
    for seed in seeds:
        path = run_metrics_path(Path(runs_dir), backbone, run, seed)
        values.append(read_step_times(path, key))
        provs.append(_run_provenance(path))
    return StepTimes(np.concatenate(values), _provenance(provs))


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


def steps_to_threshold(steps: Sequence[int], values: Sequence[float], threshold: float,
                       smoothing: float) -> tuple[int, bool, int]:
    """(steps, censored, trained): the RL steps run until the EMA of `values` (figures.ema, `smoothing`)
    first reaches `threshold` (1 + the 0-based step where it does), or the steps trained N = 1 + the
    last step, censored, if it never does."""
    trained = int(max(steps)) + 1
    for step, value in zip(steps, ema(list(values), smoothing)):
        if value >= threshold:
            return int(step) + 1, False, trained
    return trained, True, trained


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

    @property
    def mean(self) -> float:
        return float(self.values.mean())

    @property
    def n_censored(self) -> int:
        return int(self.censored.sum())

    def text(self) -> str:
        """The mean with its unit, `>` when a seed is censored (the mean is then a lower bound)."""
        return f"{'>' if self.n_censored else ''}{_fmt_num(self.mean)} steps"

    def per_seed(self) -> str:
        """Every seed's value: `s0: 12, s1: >20` (`>N`: never reached in its N steps)."""
        return ", ".join(f"s{seed}: {'>' if c else ''}{int(v)}"
                         for seed, v, c in zip(self.seeds, self.values, self.censored))


def load_steps_to(runs_dir: Path, backbone: str, run: str, seeds: Sequence[int], threshold: float,
                  smoothing: float) -> StepsTo:
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
    return StepsTo(tuple(int(s) for s in seeds), np.asarray(values, dtype=float), np.asarray(censored, dtype=bool),
                   np.asarray(trained, dtype=int), _provenance(provs))


def _boot_means(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """N_BOOT means of resamples (with replacement) of x."""
    return x[rng.integers(0, len(x), size=(N_BOOT, len(x)))].mean(axis=1)


def _as_relative(ratio: float | np.ndarray, relative: str) -> float | np.ndarray:
    """A ratio x / x_ref as the cell shows it: itself (`ratio`) or 100 (ratio - 1) (`percent`)."""
    if relative not in ("percent", "ratio"):
        raise ValueError(f"unknown relative mode {relative!r}; choices: ['percent', 'ratio']")
    return ratio if relative == "ratio" else 100.0 * (ratio - 1.0)


def _ratio_stats(row: np.ndarray, ref: np.ndarray, relative: str) -> tuple[float, float, float]:
    """(value, lo, hi) of mean(row) / mean(ref) as `relative`; CI: percentiles of the ratio of independent
    bootstrap means of both (NaN when either has a single value: nothing to resample)."""
    value = float(_as_relative(row.mean() / ref.mean(), relative))
    if len(row) < 2 or len(ref) < 2:
        return value, float("nan"), float("nan")
    rng = np.random.default_rng(BOOT_SEED)
    ratio = _boot_means(row, rng) / _boot_means(ref, rng)
    lo, hi = np.quantile(_as_relative(ratio, relative), [ALPHA / 2, 1 - ALPHA / 2])
    return value, float(lo), float(hi)


def step_time_stats(row: StepTimes, ref: StepTimes | None = None, relative: str = "percent"
                    ) -> tuple[float, float, float]:
    """(mean, lo, hi): seconds per step with a bootstrap CI over steps; with `ref`, the % difference
    100 (mean / mean_ref - 1) (`relative="ratio"`: mean / mean_ref) with the CI of that ratio over
    independent bootstraps of both runs."""
    if ref is None:
        return bootstrap_ci(row.values, n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)
    return _ratio_stats(row.values, ref.values, relative)


def steps_to_stats(row: StepsTo, ref: StepsTo | None = None, relative: str = "percent"
                   ) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean over seeds of the steps to the threshold (censored seeds counted at N) with
    a percentile bootstrap CI over seeds (NaN with one seed); with `ref`, the ratio of the means as
    `relative` (percent / ratio), CI from independent bootstraps over both runs' seeds."""
    if ref is not None:
        return _ratio_stats(row.values, ref.values, relative)
    if len(row.values) < 2:
        return row.mean, float("nan"), float("nan")
    return bootstrap_ci(row.values, n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)


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
        raise ValueError(f"{metric} needs at least {j} samples per question, "
                         f"the evaluation has n={n}")
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
            raise ValueError(f"{result['_path']}: questions of suite {suite!r} differ from the "
                             f"other seeds' ({results[0]['_path']})")
        values = question_values(block, metric)
        if len(values) != len(these):
            raise ValueError(f"{result['_path']}: suite {suite!r} has {len(these)} ids but "
                             f"{len(values)} {metric} values")
        _check_summary(block, metric, values, result["_path"])
        per_seed.append(values)
    return np.stack(per_seed, axis=1)


def _cell_stats(per_suite: list[np.ndarray], weighting: str) -> tuple[float, float, float]:
    """(mean, lo, hi) in percent: bootstrap over questions, suites resampled independently."""
    if len(per_suite) == 1:
        mean, lo, hi = bootstrap_ci(per_suite[0], n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)
    else:
        mean, lo, hi = bootstrap_average(per_suite, weighting=weighting, n_boot=N_BOOT,
                                         alpha=ALPHA, seed=BOOT_SEED)
    return 100.0 * mean, 100.0 * lo, 100.0 * hi


def _provenance(results: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Join the provenance fields of the seeds' results, one value per seed."""
    provs = [r.get("provenance") or {} for r in results]

    def joined(key: str) -> str:
        return SEP.join("" if p.get(key) is None else str(p[key]) for p in provs)

    return {"mlflow_run_ids": joined("mlflow_run_id"), "run_keys": joined("run_key"),
            "commits": joined("commit"), "configs": joined("config"),
            "sources": SEP.join(str(r.get("_path", "")) for r in results)}


def _unique(items: Sequence[str]) -> list[str]:
    """`items` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))


def _line(row: Row, backbone: str, column: Column, scale: str, seeds: Sequence[int], **cells: Any
          ) -> dict[str, Any]:
    """One long-frame line; `cells` fill the computed fields (the others are empty)."""
    blank = {"suites": "", "metric": column.metric or "", "unit": "%", "ours_mean": float("nan"),
             "ours_lo": float("nan"), "ours_hi": float("nan"), "n_questions": 0, "n_steps": 0,
             "left_out": "", "detail": "", "censored": 0, "ref_censored": 0, "mlflow_run_ids": "",
             "run_keys": "", "commits": "", "configs": "", "sources": "", "verdict": "", "p_value": float("nan"),
             "p_adj": float("nan")}
    return {"row": row.label, "paper_backbone": row.backbone, "backbone": backbone, "run": row.run,
            "column": column.name, "seeds": SEP.join(map(str, seeds)),
            "paper": row.paper.get(column.name, float("nan")), "scale": scale, **blank, **cells}


def _eval_line(paper: PaperSpec, table: TableSpec, row: Row, column: Column, scale: str,
               seeds: Sequence[int], results: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """The line of an accuracy cell: the column's mapped (suite, metric) pairs from the evaluations."""
    leaves, left_out = paper.leaves_at(table.name, column, scale)
    suites = [paper.suite_for(bench, scale) for bench, _ in leaves]
    metrics = [resolve_metric(metric, k) for _, metric in leaves]
    if row.decode is None and "replacement_rate" in metrics:  # plain decoding replaces nothing: n/a
        per_suite, (mean, lo, hi) = [], (float("nan"),) * 3
    else:
        per_suite = [seed_averaged(results, s, m) for s, m in zip(suites, metrics)]
        mean, lo, hi = _cell_stats(per_suite, column.weighting)
    return _line(row, paper.backbone_for(row.backbone, scale), column, scale, seeds,
                 suites=SEP.join(_unique(suites)), metric=SEP.join(_unique(metrics)), ours_mean=mean,
                 ours_lo=lo, ours_hi=hi, n_questions=sum(len(v) for v in per_suite),
                 left_out=SEP.join(left_out), **_provenance(results))


def _per_suite(paper: PaperSpec, table: TableSpec, column: Column, scale: str, results: list[dict[str, Any]],
               k: int, per_seed: bool = False) -> tuple[list[str], list[str], list[np.ndarray]]:
    """(suites, concrete metrics, per-question values of each suite averaged over the seeds' results, or with
    `per_seed` one column per seed: seed_matrix) of a column."""
    leaves, _ = paper.leaves_at(table.name, column, scale)
    suites = [paper.suite_for(bench, scale) for bench, _ in leaves]
    metrics = [resolve_metric(metric, k) for _, metric in leaves]
    values = seed_matrix if per_seed else seed_averaged
    return suites, metrics, [values(results, s, m) for s, m in zip(suites, metrics)]


def _versus_lines(paper: PaperSpec, table: TableSpec, scale: str, seeds: Sequence[int], k: int,
                  cells: list[tuple[Row, Column]], results_of) -> list[dict[str, Any]]:
    """The lines of a table's versus cells, as one family: per cell the paired bootstrap of the row's `of` column
    against the reference run's on the same backbone (creditlab.tables.ledger's test, values in percentage points),
    its two-sided p, Holm over every non-reference cell, the verdict. `results_of(backbone, run)`: the run's
    evaluations of `seeds` (plain decoding)."""
    from creditlab.tables.ledger import VERSUS_TEST, paired_bootstrap_diff_suites, versus_verdicts

    out: list[dict[str, Any]] = []
    family: list[tuple[int, str, bool]] = []
    stats: list[tuple[float, float, float, float, float]] = []
    for row, column in cells:
        backbone = paper.backbone_for(row.backbone, scale)
        ref = row.baseline or column.relative_to
        assert ref is not None
        ref_label = next(r.label for r in table.rows if r.run == ref and r.backbone == row.backbone)
        mine = results_of(backbone, row.run, row.decode)
        theirs = results_of(backbone, ref, None)
        of = table.column(str(column.of))
        suites, _, a = _per_suite(paper, table, of, scale, mine, k, per_seed=True)
        common = {"unit": f"pp vs {ref}", "suites": SEP.join(_unique(suites)), "metric": column.metric or "",
                  "n_questions": sum(len(v) for v in a)}
        if row.run == ref and row.decode is None:
            out.append(_line(row, backbone, column, scale, seeds, verdict="reference", detail=f"reference: {ref_label}",
                             **common, **_provenance(mine)))
            continue
        _, _, b = _per_suite(paper, table, of, scale, theirs, k, per_seed=True)
        st = paired_bootstrap_diff_suites([100.0 * x for x in a], [100.0 * x for x in b], of.weighting,
                                          alpha=ALPHA / 2)
        family.append((len(out), ref_label, ref != column.relative_to))
        stats.append(st)
        out.append(_line(row, backbone, column, scale, seeds, ours_mean=st[0], ours_lo=st[1], ours_hi=st[2],
                         detail=f"{row.label} vs {ref_label} on {column.of}: {VERSUS_TEST}", **common,
                         **_provenance(mine + theirs)))
    verdicts = versus_verdicts([st[0] for st in stats], [st[3] for st in stats], [st[4] for st in stats])
    for (i, label, own), (p2, adj, verdict) in zip(family, verdicts):
        # "noise" alone against the column's reference; a row with its own baseline says which
        text = f"{verdict} vs {label}" if verdict == "noise" and own else (
            verdict if verdict == "noise" else f"{verdict} {label}")
        out[i].update(p_value=p2, p_adj=adj, verdict=text)
    return out


def _unit(column: Column) -> str:
    """The long-frame unit of a training column: s / steps, or `% vs <run>` / `x vs <run>` when relative."""
    if column.relative_to is None:
        return {"step_time": "s", "steps_to": "steps"}.get(str(column.metric), column.series_key)
    return f"{'x' if column.relative == 'ratio' else '%'} vs {column.relative_to}"


def _reference_value(column: Column) -> float:
    """The cell of the relative_to run's own rows: ratio 1, difference 0 %."""
    return 1.0 if column.relative == "ratio" else 0.0


def _suffix(column: Column) -> str:
    return " s" if column.metric == "step_time" else f" {column.series_key}"


def _step_time_line(row: Row, backbone: str, column: Column, scale: str, seeds: Sequence[int],
                    times: StepTimes | None, ref: StepTimes | None) -> dict[str, Any]:
    """The line of a step_time cell (empty for the base model, which is not trained)."""
    unit = _unit(column)
    if times is None:
        return _line(row, backbone, column, scale, seeds, unit=unit)
    if column.relative_to is None:
        mean, lo, hi = step_time_stats(times)
        detail = ""
    elif row.run == column.relative_to:
        mean = lo = hi = _reference_value(column)
        detail = f"reference: {times.mean:.3f}{_suffix(column)}"
    else:
        assert ref is not None
        mean, lo, hi = step_time_stats(times, ref, column.relative)
        detail = f"{times.mean:.3f}{_suffix(column)} vs {ref.mean:.3f}{_suffix(column)} ({column.relative_to})"
    return _line(row, backbone, column, scale, seeds, unit=unit, ours_mean=mean, ours_lo=lo, ours_hi=hi,
                 n_steps=len(times.values), detail=detail, **times.provenance)


def _steps_to_line(row: Row, backbone: str, column: Column, scale: str, seeds: Sequence[int],
                   value: StepsTo | None, ref: StepsTo | None) -> dict[str, Any]:
    """The line of a steps_to cell (empty for the base model, which is not trained); censored seeds are
    counted in `censored` (and the reference run's in `ref_censored`)."""
    unit = _unit(column)
    if value is None:
        return _line(row, backbone, column, scale, seeds, unit=unit)
    ref_censored = 0
    if column.relative_to is None:
        mean, lo, hi = steps_to_stats(value)
        detail = value.per_seed()
    elif row.run == column.relative_to:
        mean = lo = hi = _reference_value(column)
        detail = f"reference: {value.text()}; {value.per_seed()}"
        ref_censored = value.n_censored
    else:
        assert ref is not None
        mean, lo, hi = steps_to_stats(value, ref, column.relative)
        detail = (f"{value.text()} vs {ref.text()} ({column.relative_to}); {value.per_seed()}; "
                  f"{column.relative_to}: {ref.per_seed()}")
        ref_censored = ref.n_censored
    return _line(row, backbone, column, scale, seeds, unit=unit, ours_mean=mean, ours_lo=lo, ours_hi=hi,
                 n_steps=int(value.trained.sum()), detail=detail, censored=value.n_censored,
                 ref_censored=ref_censored, **value.provenance)


def build_table(paper: PaperSpec, table: str, scale: str, seeds: list[int], evals_dir: Path,
                k: int, runs_dir: Path | None = None) -> pd.DataFrame:
    """Compute every cell of `paper`'s `table` at `scale` from the evaluations of `seeds`.

    `k` is the evaluation's k at that scale (it resolves the symbolic "avg@k" / "pass@k").
    `seeds` are the paper's (Plan.paper_seeds: its own `seeds` at the scale, else the pipeline's).
    `runs_dir` holds the training runs (step_time / steps_to columns; default: `evals_dir`'s sibling `runs`).
    Returns the long frame with LONG_COLUMNS, rows and the columns shown at `scale` in the spec's
    order (a column none of whose benchmarks has a stand-in at `scale` is omitted).
    """
    if not seeds:
        raise ValueError("build_table needs at least one seed")
    spec = paper.table(table)
    columns = paper.columns_at(table, scale)
    if not columns:
        raise ValueError(
            f"{paper.source}: table {table!r} has no column at scale {scale!r}: none of its benchmarks "
            f"has a stand-in there; tables buildable at {scale!r}: {paper.tables_at(scale)}")
    runs_dir = Path(evals_dir).parent / "runs" if runs_dir is None else Path(runs_dir)
    cache: dict[tuple[str, str, int, str | None], dict[str, Any]] = {}
    times: dict[tuple[str, str, str], StepTimes] = {}
    reached: dict[tuple[str, str, float, float], StepsTo] = {}

    def step_times(backbone: str, run: str, key: str) -> StepTimes:
        if (backbone, run, key) not in times:
            times[(backbone, run, key)] = load_step_times(runs_dir, backbone, run, seeds, key)
        return times[(backbone, run, key)]

    def steps_to(backbone: str, run: str, column: Column) -> StepsTo:
        assert column.threshold is not None and column.smoothing is not None
        key = (backbone, run, column.threshold, column.smoothing)
        if key not in reached:
            reached[key] = load_steps_to(runs_dir, backbone, run, seeds, column.threshold, column.smoothing)
        return reached[key]

    def results_of(backbone: str, run: str, decode: str | None) -> list[dict[str, Any]]:
        for seed in seeds:
            if (backbone, run, seed, decode) not in cache:
                cache[(backbone, run, seed, decode)] = load_eval(Path(evals_dir), backbone, run, seed, decode)
        return [cache[(backbone, run, seed, decode)] for seed in seeds]

    lines: list[dict[str, Any] | None] = []
    versus: list[tuple[Row, Column]] = []
    for row in spec.rows:
        backbone = paper.backbone_for(row.backbone, scale)
        results = results_of(backbone, row.run, row.decode) if paper.needs_evals(table, scale) else []
        for column in columns:
            if column.is_comparison:  # a family over the whole table: filled in below
                versus.append((row, column))
                lines.append(None)
                continue
            if not column.is_training:
                lines.append(_eval_line(paper, spec, row, column, scale, seeds, results, k))
                continue
            trained = row.run != BASE_RUN
            if column.metric == "steps_to":
                ref_st = steps_to(backbone, column.relative_to, column) if trained and column.relative_to else None
                lines.append(_steps_to_line(row, backbone, column, scale, seeds,
                                            steps_to(backbone, row.run, column) if trained else None, ref_st))
                continue
            k_ = column.series_key
            ref = step_times(backbone, column.relative_to, k_) if trained and column.relative_to else None
            lines.append(_step_time_line(row, backbone, column, scale, seeds,
                                         step_times(backbone, row.run, k_) if trained else None, ref))
    filled = iter(_versus_lines(paper, spec, scale, seeds, k, versus, results_of) if versus else [])
    return pd.DataFrame([line if line is not None else next(filled) for line in lines], columns=list(LONG_COLUMNS))


# ----------------------------------------------------------------------------------------------
# writing


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: float) -> str:
    """A number with two decimals, or an em dash when missing."""
    return "—" if _missing(value) else f"{value:.2f}"


def _fmt_signed(value: float) -> str:
    """A signed percentage difference with two decimals ("+2.10%"), or an em dash when missing."""
    return "—" if _missing(value) else f"{value:+.2f}%"


def _fmt_num(value: float) -> str:
    """A count: an integer as is ("12"), otherwise two decimals ("12.33"); an em dash when missing."""
    if _missing(value):
        return "—"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _fmt_ratio(value: float) -> str:
    """A ratio with two decimals and an x ("0.91x"), or an em dash when missing."""
    return "—" if _missing(value) else f"{value:.2f}x"


def _count(value: Any) -> int:
    """An integer field of a line (0 when missing: a CSV written before the field existed)."""
    return 0 if _missing(value) else int(value)


def _ours_cell(line: Any) -> str:
    """Our cell in the wide table: mean [lo, hi] in the line's unit; steps_to cells marked when censored."""
    unit, detail = str(line.unit), line.detail if isinstance(line.detail, str) else ""
    if line.metric in COMPARISON_METRICS:
        verdict = str(getattr(line, "verdict", "") or "")
        if verdict == "reference":
            return "reference"
        return (f"**{verdict}** ({_fmt_signed(line.ours_mean).removesuffix('%')} pp "
                f"[{_fmt_signed(line.ours_lo).removesuffix('%')}, {_fmt_signed(line.ours_hi).removesuffix('%')}], "
                f"p_adj = {_fmt_p(line.p_adj)})")
    if line.metric in TRAINING_METRICS and line.run == BASE_RUN:
        return ""  # the base model is not trained: no step time, no training reward
    steps_to = line.metric == "steps_to"
    censored, ref_censored = _count(getattr(line, "censored", 0)), _count(getattr(line, "ref_censored", 0))
    n_seeds = len(str(line.seeds).split(SEP))
    if " vs " in unit:
        if detail.startswith("reference"):
            return f"reference ({detail.split('; ')[0].removeprefix('reference: ')})"
        fmt, ci_fmt = (_fmt_ratio, _fmt) if unit.startswith("x vs") else (_fmt_signed, _fmt_signed)
        bound = ""
        if censored and not ref_censored:
            bound = ">"  # the row's mean is a lower bound: so is the ratio
        elif ref_censored and not censored:
            bound = "<"  # the reference's mean is a lower bound: the ratio is an upper bound
        cell = f"{bound}{fmt(line.ours_mean)}"
        if not (steps_to and _missing(line.ours_lo) and _missing(line.ours_hi)):
            cell += f" [{ci_fmt(line.ours_lo)}, {ci_fmt(line.ours_hi)}]"
        if censored and ref_censored:
            cell += f" (censored: {censored}/{n_seeds} seeds, reference {ref_censored}/{n_seeds}: no bound)"
        elif censored or ref_censored:
            cell += f" (censored: {censored}/{n_seeds} seeds, reference {ref_censored}/{n_seeds})"
        return cell
    if steps_to:
        cell = f"{'>' if censored else ''}{_fmt_num(line.ours_mean)}"
        if censored < n_seeds and not (_missing(line.ours_lo) and _missing(line.ours_hi)):
            cell += f" [{_fmt(line.ours_lo)}, {_fmt(line.ours_hi)}]"
        if censored and n_seeds > 1:
            cell += f" ({censored}/{n_seeds} censored)"
        return cell
    f = _fmt_sig if line.metric == "train_mean" else _fmt
    return f"{f(line.ours_mean)} [{f(line.ours_lo)}, {f(line.ours_hi)}]"


def _fmt_p(value: float) -> str:
    """A p-value: three significant digits, or an em dash when missing."""
    return "—" if _missing(value) else f"{value:.3g}"


def _fmt_sig(value: float) -> str:
    """Four significant digits (training metrics span many magnitudes: EffN/T 0.05, residual 3e-3)."""
    return "—" if _missing(value) else f"{value:.4g}"


def _paper_cell(line: Any) -> str:
    unit = str(line.unit)
    if unit.startswith("x vs"):
        return _fmt_ratio(line.paper)
    return _fmt_signed(line.paper) if unit.startswith("% vs") else _fmt(line.paper)


def _md_table(header: list[str], lines: list[list[str]]) -> list[str]:
    """A GitHub Markdown table."""
    def fmt(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    return [fmt(header), fmt(["---"] * len(header)), *(fmt(line) for line in lines)]


def _single(df: pd.DataFrame, column: str) -> str:
    """The one value of `column` in `df` (ValueError if the frame mixes several)."""
    values = _unique([str(v) for v in df[column]])
    if len(values) != 1:
        raise ValueError(f"the table frame mixes several values of {column!r}: {values}")
    return values[0]


def _comparability_note(scale: str) -> str:
    """Whether our numbers can be compared with the paper's at this scale."""
    if scale == "paper":
        return ("**Scale `paper`.** Our numbers and the *paper* columns use the paper's benchmarks "
                "and backbones: they are comparable, up to sampling noise and the evaluation "
                "settings (k, sampling, max tokens) stated below.")
    if scale == "smoke":
        return ("**Scale `smoke`: these numbers mean nothing.** The paper's pipeline ran end to end on a CPU (verl, "
                "vLLM, the hub loaders) with random-init stand-ins of the backbones, a handful of fixture questions "
                "and 2 RL steps per run: the table proves the path executes, not any result.")
    return (f"**Scale `{scale}`: these are NOT the paper's results.** Our numbers come from tiny "
            f"models on synthetic suites that stand in for the paper's benchmarks. The *paper* "
            f"columns are the numbers the paper reports at paper scale on its own benchmarks and "
            f"backbones; they are **not comparable in absolute value** with ours. Compare the "
            f"ordering of methods and the direction of effects only.")


def _column_note(paper: PaperSpec, spec: TableSpec, column_name: str, scale: str,
                 df: pd.DataFrame) -> str:
    """One line describing how a column is computed at this scale."""
    column = spec.column(column_name)
    if column.is_comparison:
        from creditlab.tables.ledger import VERSUS_TEST

        n = int((df[df["column"] == column_name]["verdict"].astype(str) != "reference").sum()) if len(df) else 0
        family = int(sum((df[df["column"] == c.name]["verdict"].astype(str) != "reference").sum()
                         for c in spec.columns if c.is_comparison and c.name in set(df["column"])))
        return (f"- **{column.name}**: the claim \"row beats its reference\" on **{column.of}** (reference: run "
                f"`{column.relative_to}` on the same backbone, or the row's own `baseline`), decided by a "
                f"{VERSUS_TEST}; {n} claims in this column, **{family} in the Holm family** (every versus cell of "
                f"the table). `beats X` / `worse than X` = Holm-adjusted p < 0.05 with that sign; `noise` = not "
                f"resolved at this number of questions and seeds. Shown: the difference in percentage points "
                f"[95% paired-bootstrap interval], p_adj. The training seeds are resampled with the questions, so "
                f"seed-to-seed variance of RL is in p; with few seeds the seed resampling is coarse (3 seeds: 10 "
                f"distinct seed multisets)")
    if column.metric == "steps_to":
        return _steps_to_note(column, scale, df)
    if column.metric == "train_mean":
        what = (f"mean over RL steps of `{column.key}` (the run's training metrics.jsonl; steps where it is not "
                f"logged or not finite are skipped), steps of all seeds pooled, 95% bootstrap CI over steps; "
                f"base-model rows: empty (not trained)")
        if column.relative_to is not None:
            what += (f"; as {'a ratio to' if column.relative == 'ratio' else 'a % difference vs'} run "
                     f"`{column.relative_to}` on the same backbone (CI from the ratio of bootstrap means)")
        return f"- **{column.name}**: {what}"
    if column.is_training:
        what = ("mean wall time per RL step (`t_step` of the run's training metrics.jsonl) in seconds, "
                "steps of all seeds pooled, 95% bootstrap CI over steps; base-model rows: empty (not trained)")
        ref = column.relative_to
        if ref is not None and column.relative == "ratio":
            what = (f"ratio of the {what.split(' in seconds')[0]} to run `{ref}`'s on the same backbone, "
                    f"t / t_ref (`0.91x` = 9% less time per step); CI: percentiles of the ratio of bootstrap "
                    f"means (steps of both runs resampled independently); the `{ref}` rows are the reference; "
                    f"base-model rows: empty")
        elif ref is not None:
            what = (f"% difference of the {what.split(' in seconds')[0]} vs run `{ref}` on "
                    f"the same backbone, 100 (t / t_ref - 1); CI: percentiles of the ratio of bootstrap means "
                    f"(steps of both runs resampled independently); the `{ref}` rows are the "
                    f"reference; base-model rows: empty")
        if scale != "paper":
            what += f"; {scale}-scale CPU/GPU time of tiny models, not the paper's cluster cost"
        return f"- **{column.name}**: {what}"
    sub = df[df["column"] == column_name]
    metric = _single(sub, "metric") if len(sub) else "?"
    leaves, left_out = paper.leaves_at(spec.name, column, scale)
    suites = ", ".join(f"`{paper.suite_for(b, scale)}`" for b, _ in leaves)
    missing = ""
    if left_out:
        n_all = len(_unique([b for b, _ in spec.leaves(column)]))
        missing = (f"; **averages {n_all - len(left_out)} of the paper's {n_all} benchmarks**: left out "
                   f"(no {scale} stand-in): {', '.join(left_out)}")
    if column.metric_for(scale) != column.metric:
        missing += (f"; **{column.metric_for(scale)} at this scale, the paper's {column.metric}** (the column's "
                    f"per-scale metric: this scale's evaluation draws fewer samples per question), shown as "
                    f"{column.label_at(scale)}")
    if column.average_of is not None:
        how = f"{column.weighting} mean of the suite means of {', '.join(column.average_of)}"
        return f"- **{column.name}**: {how} ({metric} on {suites}){missing}"
    if column.benchmarks:
        return f"- **{column.name}**: {metric}, {column.weighting} mean over {suites}{missing}"
    return f"- **{column.name}**: {metric} on {suites} (paper: {column.benchmark}){missing}"


def _steps_to_note(column: Column, scale: str, df: pd.DataFrame) -> str:
    """How a steps_to column is computed (threshold, smoothing, seeds, censoring, relative mode)."""
    sub = df[df["column"] == column.name]
    seeds = _single(sub, "seeds").replace(SEP, ", ") if len(sub) else "?"
    n_seeds = len(seeds.split(", "))
    ci = ("95% percentile bootstrap CI over seeds" if n_seeds > 1
          else "no CI: one seed (a CI needs several seeds: paper config `seeds`)")
    smoothed = (f"the EMA (smoothing {column.smoothing:g}, debiased as in the training-curve figures) of"
                if column.smoothing else "(no smoothing)")
    what = (f"RL steps until {smoothed} the run's training `reward_mean` (mean verifier score of every rollout "
            f"generated in a step, "
            f"before any dynamic-sampling filter) first reaches **{column.threshold:g}**: 1 + the 0-based `step` "
            f"of metrics.jsonl where it does (the steps run, that one included)")
    censor = ("a seed that never reaches it is censored: counted at its N steps trained (the mean is then a "
              "lower bound)")
    ref = column.relative_to
    if ref is None:
        what += (f"; mean over seeds {seeds}, {ci}; {censor}, marked `>` (with `k/n censored` when several "
                 f"seeds; CSV `censored` = how many)")
    else:
        how = ("ratio of the means s / s_ref (`0.91x` = 9% fewer steps)" if column.relative == "ratio"
               else "% difference of the means, 100 (s / s_ref - 1)")
        ci_rel = ("CI: percentiles of the ratio of independent bootstrap means over both runs' seeds"
                  if n_seeds > 1 else "no CI: one seed")
        what += (f", mean over seeds {seeds}, vs run `{ref}` on the same backbone: {how}; {ci_rel}; {censor}; "
                 f"`>` = a lower bound (some of the row's seeds censored, CSV `censored`), `<` = an upper bound "
                 f"(some of the reference's, CSV `ref_censored`), both: no bound; the `{ref}` rows are the reference")
    what += ("; base-model rows: empty (not trained). It counts RL steps, not FLOPs or wall time: a costlier step "
             "(see a step_time column) or a run with a larger batch per step spends more per step")
    if scale != "paper":
        what += (f"; {scale}-scale: tiny models on the synthetic task, with a threshold set for them, not the "
                 f"paper's")
    return f"- **{column.name}**: {what}"


def _omitted_lines(paper: PaperSpec, spec: TableSpec, scale: str) -> list[str]:
    """The columns left out at this scale and the columns averaged over fewer benchmarks."""
    omitted = paper.omitted_columns(spec.name, scale)
    partial = [(c, paper.leaves_at(spec.name, c, scale)[1]) for c in paper.columns_at(spec.name, scale)]
    partial = [(c, out) for c, out in partial if out]
    if not omitted and not partial:
        return []
    lines = ["## Benchmarks without a stand-in at this scale", ""]
    if omitted:
        lines.append(f"Columns **omitted** (none of their benchmarks has a {scale} stand-in): " + ", ".join(
            f"{c.name} ({', '.join(_unique([b for b, _ in spec.leaves(c)]))})" for c in omitted) + ".")
    for col, out in partial:
        n_all = len(_unique([b for b, _ in spec.leaves(col)]))
        lines.append(f"- **{col.name}** averages only {n_all - len(out)} of its {n_all} benchmarks here "
                     f"(left out: {', '.join(out)}); its *paper* number is the paper's {n_all}-benchmark "
                     f"value: do not compare the two.")
    return lines + [""]


def _mapping_lines(paper: PaperSpec, spec: TableSpec, scale: str) -> list[str]:
    """The backbone and benchmark mappings the table uses at this scale."""
    backbones = _unique([row.backbone for row in spec.rows])
    benches = _unique([b for col in spec.columns for b, _ in spec.leaves(col)])
    lines = ["## Mappings at this scale", ""]
    lines += [f"- {b} -> {scale} backbone `{paper.backbone_for(b, scale)}`" for b in backbones]
    lines += [f"- {b} -> {scale} suite `{paper.suite_for(b, scale)}`" if paper.has_suite(b, scale)
              else f"- {b} -> no {scale} stand-in (left out)" for b in benches]
    return lines


def _wide_lines(df: pd.DataFrame, spec: TableSpec, scale: str, columns: list[Column]) -> list[str]:
    """The wide Markdown table: one line per row, ours [CI] and the paper's number per column."""
    ours = "ours" if scale == "paper" else f"ours ({scale})"
    header = ["Backbone (paper)", "Row"]
    for col in columns:  # our cells under the k they read at this scale (Pass@8 at tiny), the paper's under its own
        header += [f"{col.label_at(scale)} {ours}", f"{col.name} paper"]
    lines = []
    for row in spec.rows:
        sub = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone)]
        cells = [row.backbone, row.label]
        for col in columns:
            line = sub[sub["column"] == col.name].iloc[0]
            cells += [_ours_cell(line), _paper_cell(line)]
        lines.append(cells)
    return _md_table(header, lines)


def split_field(field: Any) -> list[str]:
    """The non-empty items of one SEP-joined CSV field (None, NaN and "" count as empty)."""
    if _missing(field) or field == "":
        return []
    return [v for v in str(field).split(SEP) if v]


def _split(values: Any) -> list[str]:
    """The non-empty items of SEP-joined fields, in order."""
    return [v for field in values for v in split_field(field)]


def row_run_ids(df: pd.DataFrame) -> list[str]:
    """The MLflow run ids a built table's cells were read from, in row order, without repeats or blanks."""
    return _unique(_split(df["mlflow_run_ids"])) if "mlflow_run_ids" in df else []


def _provenance_lines(df: pd.DataFrame, spec: TableSpec) -> list[str]:
    """Commit summary and, per row, the MLflow run ids, run keys and config paths of its sources."""
    commits = _unique(_split(df["commits"]))
    lines = ["## Provenance", ""]
    if len(commits) == 1:
        lines.append(f"Commit: `{commits[0]}`")
    else:
        lines.append(f"Commits (the rows come from different code versions): "
                     f"{', '.join(f'`{c}`' for c in commits) or 'unknown'}")
    if any(c.endswith("-dirty") for c in commits):
        lines.append("(`-dirty`: the code had uncommitted changes.)")
    lines.append("")
    for row in spec.rows:
        sub = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone)]
        first = sub.iloc[0]
        read = sub[[not _missing(s) and bool(str(s)) for s in sub["sources"]]]
        if read.empty:
            lines.append(f"- {row.label} / {row.backbone} (`{first.backbone}`, run `{first.run}`): no source read")
            continue
        ids: list[str] = []
        for field in read["mlflow_run_ids"]:  # one id per seed, "" = offline
            ids += [""] if _missing(field) else str(field).split(SEP)
        ids = _unique([i or "none (offline)" for i in ids])
        steps = _unique([s for s in _split(read[read["metric"].isin(["step_time", "train_mean"])]["sources"])])
        rewards = _unique([s for s in _split(read[read["metric"] == "steps_to"]["sources"])])
        line = (f"- {row.label} / {row.backbone} (`{first.backbone}`, run `{first.run}`, seeds "
                f"{str(first.seeds).replace(SEP, ', ')}): MLflow run ids {', '.join(ids)}; run keys "
                f"{', '.join(f'`{r}`' for r in _unique(_split(read['run_keys'])))}; configs "
                f"{', '.join(f'`{c}`' for c in _unique(_split(read['configs'])))}")
        if steps:
            line += f"; step times from {', '.join(f'`{s}`' for s in steps)}"
        if rewards:
            line += f"; training rewards from {', '.join(f'`{s}`' for s in rewards)}"
        lines.append(line)
    return lines


def table_markdown(df: pd.DataFrame, table: TableSpec, paper: PaperSpec) -> str:
    """The readable Markdown page of a built table (see write_table)."""
    scale = _single(df, "scale")
    seeds = _single(df, "seeds").replace(SEP, ", ")
    shown = set(df["column"])
    columns = [c for c in table.columns if c.name in shown]
    lines = [f"# {paper.title}: table `{table.name}`", "", _comparability_note(scale), ""]
    if table.caption:
        lines += [f"Paper caption: {table.caption}", ""]
    if scale in paper.seeds:
        lines += [f"Seeds {seeds}: this paper's own `seeds` at scale `{scale}` (its config), not the "
                  f"pipeline's.", ""]
    if any(not c.is_training for c in columns):
        lines += [f"Our accuracy cells: mean in percent [95% percentile bootstrap CI over questions, {N_BOOT} "
                  f"resamples; suites resampled independently], seeds {seeds} averaged per question."]
    if any(c.metric == "step_time" for c in columns):
        lines += [f"Our step-time cells: seconds per RL step [95% percentile bootstrap CI over steps, "
                  f"{N_BOOT} resamples], steps of seeds {seeds} pooled; relative cells in % or x (see Columns)."]
    if any(c.metric == "train_mean" for c in columns):
        keys = ", ".join(_unique([f"`{c.key}`" for c in columns if c.metric == "train_mean"]))
        lines += [f"Our training-metric cells ({keys}): mean over RL steps of the run's logged metric [95% "
                  f"percentile bootstrap CI over steps, {N_BOOT} resamples], steps of seeds {seeds} pooled."]
    if any(c.metric == "steps_to" for c in columns):
        n_seeds = len(seeds.split(", "))
        ci = (f"95% percentile bootstrap CI over seeds, {N_BOOT} resamples" if n_seeds > 1
              else "no CI with a single seed")
        lines += [f"Our steps-to-threshold cells: RL steps until the smoothed training reward first reaches the "
                  f"column's threshold, mean over seeds {seeds} [{ci}]; `>` = a lower bound (a seed never "
                  f"reached it: counted at its steps trained); relative cells in % or x (see Columns)."]
    lines += ["Paper cells: the paper's reported number at paper scale (— = not reported).", ""]
    lines += _omitted_lines(paper, table, scale)
    lines += _mapping_lines(paper, table, scale) + ["", "## Columns", ""]
    lines += [_column_note(paper, table, c.name, scale, df) for c in columns]
    lines += ["", "## Table", ""] + _wide_lines(df, table, scale, columns) + [""]
    lines += _provenance_lines(df, table)
    return "\n".join(lines) + "\n"


def write_table(df: pd.DataFrame, table: TableSpec, paper: PaperSpec, out_csv: Path,
                out_md: Path) -> None:
    """Write the long frame as CSV and a wide, annotated Markdown page.

    The Markdown states the scale, the backbone and benchmark mappings (and the benchmarks without a
    stand-in: omitted columns, averages over fewer benchmarks), how each column is computed, that the
    paper columns are the paper's numbers at paper scale (not comparable in absolute value at other
    scales), the commit(s) and, per row, the MLflow run ids, run keys and config paths.
    """
    out_csv, out_md = Path(out_csv), Path(out_md)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_csv, index=False)
    out_md.write_text(table_markdown(df, table, paper))
