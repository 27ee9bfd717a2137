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
bootstrap over steps; with `relative_to: <run>` the cell is the % difference vs that run on the same
backbone (CI from the ratio of independent bootstrap means). A base-model row has no training: empty.

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
from creditlab.tables.spec import BASE_RUN, Column, PaperSpec, Row, TableSpec, resolve_metric

N_BOOT = 2000
ALPHA = 0.05
BOOT_SEED = 0

LONG_COLUMNS = (
    "row", "paper_backbone", "backbone", "run", "column", "suites", "metric", "unit",
    "ours_mean", "ours_lo", "ours_hi", "n_questions", "n_steps", "seeds", "paper", "scale",
    "left_out", "detail", "mlflow_run_ids", "run_keys", "commits", "configs", "sources",
)
"""Columns of the long table frame (one line per row x shown column), in CSV order.

unit: "%" (accuracy), "s" (step_time) or "% vs <run>" (step_time relative_to <run>); n_questions /
n_steps: what the CI resamples; left_out: the column's paper benchmarks without a stand-in at this
scale (";"-joined); detail: for relative cells both mean step times; sources: the files read."""

_SEP = ";"  # joins several values (one per seed or suite) in one CSV field


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


def read_step_times(path: Path) -> np.ndarray:
    """The `t_step` (seconds) of every step of a training metrics.jsonl, in step order.

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
            value = rec.get("t_step")
            if "step" in rec and isinstance(value, (int, float)) and math.isfinite(value):
                by_step[int(rec["step"])] = float(value)
    if not by_step:
        raise ValueError(f"{path}: no step with a finite 't_step' (the RL step wall time)")
    return np.array([by_step[s] for s in sorted(by_step)], dtype=float)


@dataclass(frozen=True)
class StepTimes:
    """The step wall times of one run on one backbone, all seeds pooled, with their provenance."""

    values: np.ndarray
    provenance: dict[str, str]

    @property
    def mean(self) -> float:
        return float(self.values.mean())


def load_step_times(runs_dir: Path, backbone: str, run: str, seeds: Sequence[int]) -> StepTimes:
    """Pool the `t_step` values of `seeds`; provenance from each run dir's DONE (MLflow run id, run
    key, commit) and config.yaml, and the metrics.jsonl paths as sources."""
    values, provs = [], []
    for seed in seeds:
        path = run_metrics_path(Path(runs_dir), backbone, run, seed)
        values.append(read_step_times(path))
        done, config = path.parent / "DONE", path.parent / "config.yaml"
        prov: dict[str, Any] = {}
        if done.is_file():
            try:
                prov = json.loads(done.read_text())
            except json.JSONDecodeError:
                warnings.warn(f"{done}: not valid JSON; step-time provenance left empty", stacklevel=2)
        provs.append({"provenance": {"mlflow_run_id": prov.get("mlflow_run_id"), "run_key": prov.get("run_key"),
                                     "commit": prov.get("commit"),
                                     "config": str(config) if config.is_file() else None},
                      "_path": str(path)})
    return StepTimes(np.concatenate(values), _provenance(provs))


def _boot_means(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """N_BOOT means of resamples (with replacement) of x."""
    return x[rng.integers(0, len(x), size=(N_BOOT, len(x)))].mean(axis=1)


def step_time_stats(row: StepTimes, ref: StepTimes | None = None) -> tuple[float, float, float]:
    """(mean, lo, hi): seconds per step with a bootstrap CI over steps; with `ref`, the % difference
    100 (mean / mean_ref - 1) with the CI of that ratio over independent bootstraps of both runs."""
    if ref is None:
        return bootstrap_ci(row.values, n_boot=N_BOOT, alpha=ALPHA, seed=BOOT_SEED)
    rng = np.random.default_rng(BOOT_SEED)
    ratio = _boot_means(row.values, rng) / _boot_means(ref.values, rng)
    lo, hi = np.quantile(100.0 * (ratio - 1.0), [ALPHA / 2, 1 - ALPHA / 2])
    return 100.0 * (row.mean / ref.mean - 1.0), float(lo), float(hi)


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
    return np.mean(per_seed, axis=0)


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
        return _SEP.join("" if p.get(key) is None else str(p[key]) for p in provs)

    return {"mlflow_run_ids": joined("mlflow_run_id"), "run_keys": joined("run_key"),
            "commits": joined("commit"), "configs": joined("config"),
            "sources": _SEP.join(str(r.get("_path", "")) for r in results)}


def _unique(items: Sequence[str]) -> list[str]:
    """`items` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))


def _line(row: Row, backbone: str, column: Column, scale: str, seeds: Sequence[int], **cells: Any
          ) -> dict[str, Any]:
    """One long-frame line; `cells` fill the computed fields (the others are empty)."""
    blank = {"suites": "", "metric": column.metric or "", "unit": "%", "ours_mean": float("nan"),
             "ours_lo": float("nan"), "ours_hi": float("nan"), "n_questions": 0, "n_steps": 0,
             "left_out": "", "detail": "", "mlflow_run_ids": "", "run_keys": "", "commits": "",
             "configs": "", "sources": ""}
    return {"row": row.label, "paper_backbone": row.backbone, "backbone": backbone, "run": row.run,
            "column": column.name, "seeds": _SEP.join(map(str, seeds)),
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
                 suites=_SEP.join(_unique(suites)), metric=_SEP.join(_unique(metrics)), ours_mean=mean,
                 ours_lo=lo, ours_hi=hi, n_questions=sum(len(v) for v in per_suite),
                 left_out=_SEP.join(left_out), **_provenance(results))


def _step_time_line(row: Row, backbone: str, column: Column, scale: str, seeds: Sequence[int],
                    times: StepTimes | None, ref: StepTimes | None) -> dict[str, Any]:
    """The line of a step_time cell (empty for the base model, which is not trained)."""
    unit = "s" if column.relative_to is None else f"% vs {column.relative_to}"
    if times is None:
        return _line(row, backbone, column, scale, seeds, unit=unit)
    if column.relative_to is None:
        mean, lo, hi = step_time_stats(times)
        detail = ""
    elif row.run == column.relative_to:
        mean, lo, hi = 0.0, 0.0, 0.0
        detail = f"reference: {times.mean:.3f} s"
    else:
        assert ref is not None
        mean, lo, hi = step_time_stats(times, ref)
        detail = f"{times.mean:.3f} s vs {ref.mean:.3f} s ({column.relative_to})"
    return _line(row, backbone, column, scale, seeds, unit=unit, ours_mean=mean, ours_lo=lo, ours_hi=hi,
                 n_steps=len(times.values), detail=detail, **times.provenance)


def build_table(paper: PaperSpec, table: str, scale: str, seeds: list[int], evals_dir: Path,
                k: int, runs_dir: Path | None = None) -> pd.DataFrame:
    """Compute every cell of `paper`'s `table` at `scale` from the evaluations of `seeds`.

    `k` is the evaluation's k at that scale (it resolves the symbolic "avg@k" / "pass@k").
    `runs_dir` holds the training runs (step_time columns; default: `evals_dir`'s sibling `runs`).
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
    times: dict[tuple[str, str], StepTimes] = {}

    def step_times(backbone: str, run: str) -> StepTimes:
        if (backbone, run) not in times:
            times[(backbone, run)] = load_step_times(runs_dir, backbone, run, seeds)
        return times[(backbone, run)]

    lines: list[dict[str, Any]] = []
    for row in spec.rows:
        backbone = paper.backbone_for(row.backbone, scale)
        results = []
        if paper.needs_evals(table, scale):
            for seed in seeds:
                key = (backbone, row.run, seed, row.decode)
                if key not in cache:
                    cache[key] = load_eval(Path(evals_dir), backbone, row.run, seed, row.decode)
                results.append(cache[key])
        for column in columns:
            if not column.is_training:
                lines.append(_eval_line(paper, spec, row, column, scale, seeds, results, k))
                continue
            trained = row.run != BASE_RUN
            ref = step_times(backbone, column.relative_to) if trained and column.relative_to else None
            lines.append(_step_time_line(row, backbone, column, scale, seeds,
                                         step_times(backbone, row.run) if trained else None, ref))
    return pd.DataFrame(lines, columns=list(LONG_COLUMNS))


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


def _ours_cell(line: Any) -> str:
    """Our cell in the wide table: mean [lo, hi] in the line's unit."""
    unit = str(line.unit)
    if line.metric == "step_time" and line.run == BASE_RUN:
        return ""  # the base model is not trained: no step time
    if unit.startswith("% vs"):
        if isinstance(line.detail, str) and line.detail.startswith("reference"):
            return f"{line.detail.replace('reference: ', 'reference (')})"
        return f"{_fmt_signed(line.ours_mean)} [{_fmt_signed(line.ours_lo)}, {_fmt_signed(line.ours_hi)}]"
    return f"{_fmt(line.ours_mean)} [{_fmt(line.ours_lo)}, {_fmt(line.ours_hi)}]"


def _paper_cell(line: Any) -> str:
    return _fmt_signed(line.paper) if str(line.unit).startswith("% vs") else _fmt(line.paper)


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
    return (f"**Scale `{scale}`: these are NOT the paper's results.** Our numbers come from tiny "
            f"models on synthetic suites that stand in for the paper's benchmarks. The *paper* "
            f"columns are the numbers the paper reports at paper scale on its own benchmarks and "
            f"backbones; they are **not comparable in absolute value** with ours. Compare the "
            f"ordering of methods and the direction of effects only.")


def _column_note(paper: PaperSpec, spec: TableSpec, column_name: str, scale: str,
                 df: pd.DataFrame) -> str:
    """One line describing how a column is computed at this scale."""
    column = spec.column(column_name)
    if column.is_training:
        what = (f"mean wall time per RL step (`t_step` of the run's training metrics.jsonl) in seconds, "
                f"steps of all seeds pooled, 95% bootstrap CI over steps; base-model rows: empty (not trained)")
        if column.relative_to is not None:
            what = (f"% difference of the {what.split(' in seconds')[0]} vs run `{column.relative_to}` on "
                    f"the same backbone, 100 (t / t_ref - 1); CI: percentiles of the ratio of bootstrap means "
                    f"(steps of both runs resampled independently); the `{column.relative_to}` rows are the "
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
    if column.average_of is not None:
        how = f"{column.weighting} mean of the suite means of {', '.join(column.average_of)}"
        return f"- **{column.name}**: {how} ({metric} on {suites}){missing}"
    if column.benchmarks:
        return f"- **{column.name}**: {metric}, {column.weighting} mean over {suites}{missing}"
    return f"- **{column.name}**: {metric} on {suites} (paper: {column.benchmark})"


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
    for col in columns:
        header += [f"{col.name} {ours}", f"{col.name} paper"]
    lines = []
    for row in spec.rows:
        sub = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone)]
        cells = [row.backbone, row.label]
        for col in columns:
            line = sub[sub["column"] == col.name].iloc[0]
            cells += [_ours_cell(line), _paper_cell(line)]
        lines.append(cells)
    return _md_table(header, lines)


def _split(values: Any) -> list[str]:
    """The non-empty items of ";"-joined fields (NaN from a CSV counts as empty)."""
    return [v for field in values if not _missing(field) for v in str(field).split(_SEP) if v]


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
            ids += [""] if _missing(field) else str(field).split(_SEP)
        ids = _unique([i or "none (offline)" for i in ids])
        steps = _unique([s for s in _split(read[read["metric"] == "step_time"]["sources"])])
        line = (f"- {row.label} / {row.backbone} (`{first.backbone}`, run `{first.run}`, seeds "
                f"{str(first.seeds).replace(_SEP, ', ')}): MLflow run ids {', '.join(ids)}; run keys "
                f"{', '.join(f'`{r}`' for r in _unique(_split(read['run_keys'])))}; configs "
                f"{', '.join(f'`{c}`' for c in _unique(_split(read['configs'])))}")
        if steps:
            line += f"; step times from {', '.join(f'`{s}`' for s in steps)}"
        lines.append(line)
    return lines


def table_markdown(df: pd.DataFrame, table: TableSpec, paper: PaperSpec) -> str:
    """The readable Markdown page of a built table (see write_table)."""
    scale = _single(df, "scale")
    seeds = _single(df, "seeds").replace(_SEP, ", ")
    shown = set(df["column"])
    columns = [c for c in table.columns if c.name in shown]
    lines = [f"# {paper.title}: table `{table.name}`", "", _comparability_note(scale), ""]
    if table.caption:
        lines += [f"Paper caption: {table.caption}", ""]
    if any(not c.is_training for c in columns):
        lines += [f"Our accuracy cells: mean in percent [95% percentile bootstrap CI over questions, {N_BOOT} "
                  f"resamples; suites resampled independently], seeds {seeds} averaged per question."]
    if any(c.is_training for c in columns):
        lines += [f"Our step-time cells: seconds per RL step [95% percentile bootstrap CI over steps, "
                  f"{N_BOOT} resamples], steps of seeds {seeds} pooled; relative cells in % (see Columns)."]
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
