"""Build a paper table: every cell of a table at a scale, one line per row x column (the long frame), from the
loaded results and their statistics; write it as a CSV and the Markdown page.

Each cell is recomputed from the per-question data, never from summary numbers or averaged CIs (creditlab.tables.load
reads them, creditlab.tables.stats computes; 95% CIs, 2000 resamples, fixed seed):

- an accuracy cell: per question its value (greedy, avg@k, pass@j, replacement rate), averaged over seeds (the
  questions are the same), then a percentile bootstrap over questions; several suites (a `benchmarks` or an
  `average_of` column): the mean of the suite means (plain or weighted by question count), each suite's questions
  resampled independently. Values are fractions in the files and percentages in the tables, as in the papers.
- a `step_time` / `train_mean` cell: the mean over the steps of all seeds pooled of `t_step` / the column's `key`,
  with a percentile bootstrap over steps; with `relative_to: <run>` the % difference (or, with `relative: ratio`, the
  ratio) vs that run on the same backbone (CI from the ratio of independent bootstrap means). A base-model row has no
  training: empty.
- a `steps_to` cell (Paper E's compute to reach a threshold): per seed, the RL steps run until the EMA of the training
  `reward_mean` first reaches the column's `threshold` (1 + the 0-based step where it does); a seed that never reaches
  it is censored, counted at its N steps trained and flagged (`censored`, `>` in the Markdown). The cell is the mean
  over seeds with a percentile bootstrap over seeds (none with one seed); `relative_to` as for step_time.
- a `versus` cell: the paired test of the row's `of` column against the reference run's, Holm over the table's
  versus cells (creditlab.tables.stats.VERSUS_TEST).

A benchmark without a stand-in at the table's scale (mapped to null) is left out: a column on it alone is omitted, a
column over several benchmarks averages the mapped ones (creditlab.tables.render says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from creditlab.papers.spec import (
    BASE_RUN,
    Column,
    PaperSpec,
    Row,
    TableSpec,
    resolve_metric,
)
from creditlab.tables.frame import LONG_COLUMNS, SEP, unique
from creditlab.tables.load import (
    StepsTo,
    StepTimes,
    final_reward_ema,
    load_eval,
    load_step_times,
    load_steps_to,
    provenance,
    sandbox_tiers,
    seed_averaged,
    seed_matrix,
)
from creditlab.tables.render import steps_to_per_seed, steps_to_text, table_markdown
from creditlab.tables.stats import (
    ALPHA,
    VERSUS_TEST,
    cell_stats,
    paired_bootstrap_diff_suites,
    step_time_stats,
    steps_to_stats,
    versus_verdicts,
)


def _line(row: Row, backbone: str, column: Column, scale: str, seeds: Sequence[int], **cells: Any) -> dict[str, Any]:
    """One long-frame line; `cells` fill the computed fields (the others are empty)."""
    blank = {
        "suites": "",
        "metric": column.metric or "",
        "unit": "%",
        "ours_mean": float("nan"),
        "ours_lo": float("nan"),
        "ours_hi": float("nan"),
        "n_questions": 0,
        "n_steps": 0,
        "left_out": "",
        "detail": "",
        "censored": 0,
        "ref_censored": 0,
        "mlflow_run_ids": "",
        "run_keys": "",
        "commits": "",
        "configs": "",
        "sources": "",
        "sandbox": "",
        "verdict": "",
        "p_value": float("nan"),
        "p_adj": float("nan"),
    }
    return {
        "row": row.label,
        "paper_backbone": row.backbone,
        "backbone": backbone,
        "run": row.run,
        "column": column.name,
        "seeds": SEP.join(map(str, seeds)),
        "paper": row.paper.get(column.name, float("nan")),
        "scale": scale,
        **blank,
        **cells,
    }


def _eval_line(
    paper: PaperSpec,
    table: TableSpec,
    row: Row,
    column: Column,
    scale: str,
    seeds: Sequence[int],
    results: list[dict[str, Any]],
    k: int,
) -> dict[str, Any]:
    """The line of an accuracy cell: the column's mapped (suite, metric) pairs from the evaluations."""
    leaves, left_out = paper.leaves_at(table.name, column, scale)
    suites = [paper.suite_for(bench, scale) for bench, _ in leaves]
    metrics = [resolve_metric(metric, k) for _, metric in leaves]
    if row.decode is None and "replacement_rate" in metrics:  # plain decoding replaces nothing: n/a
        per_suite, (mean, lo, hi) = [], (float("nan"),) * 3
    else:
        per_suite = [seed_averaged(results, s, m) for s, m in zip(suites, metrics)]
        mean, lo, hi = cell_stats(per_suite, column.weighting)
    return _line(
        row,
        paper.backbone_for(row.backbone, scale),
        column,
        scale,
        seeds,
        suites=SEP.join(unique(suites)),
        metric=SEP.join(unique(metrics)),
        ours_mean=mean,
        ours_lo=lo,
        ours_hi=hi,
        n_questions=sum(len(v) for v in per_suite),
        left_out=SEP.join(left_out),
        sandbox=sandbox_tiers(results, suites),
        **provenance(results),
    )


def _per_suite(
    paper: PaperSpec,
    table: TableSpec,
    column: Column,
    scale: str,
    results: list[dict[str, Any]],
    k: int,
    per_seed: bool = False,
) -> tuple[list[str], list[str], list[np.ndarray]]:
    """(suites, concrete metrics, per-question values of each suite averaged over the seeds' results, or with
    `per_seed` one column per seed: seed_matrix) of a column."""
    leaves, _ = paper.leaves_at(table.name, column, scale)
    suites = [paper.suite_for(bench, scale) for bench, _ in leaves]
    metrics = [resolve_metric(metric, k) for _, metric in leaves]
    values = seed_matrix if per_seed else seed_averaged
    return suites, metrics, [values(results, s, m) for s, m in zip(suites, metrics)]


def _versus_lines(
    paper: PaperSpec,
    table: TableSpec,
    scale: str,
    seeds: Sequence[int],
    k: int,
    cells: list[tuple[Row, Column]],
    results_of,
) -> list[dict[str, Any]]:
    """The lines of a table's versus cells, as one family: per cell the paired bootstrap of the row's `of` column
    against the reference run's on the same backbone (the ledger's paired test, values in percentage points),
    its two-sided p, Holm over every non-reference cell, the verdict. `results_of(backbone, run)`: the run's
    evaluations of `seeds` (plain decoding)."""
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
        common = {
            "unit": f"pp vs {ref}",
            "suites": SEP.join(unique(suites)),
            "metric": column.metric or "",
            "n_questions": sum(len(v) for v in a),
        }
        if row.run == ref and row.decode is None:
            out.append(
                _line(
                    row,
                    backbone,
                    column,
                    scale,
                    seeds,
                    verdict="reference",
                    detail=f"reference: {ref_label}",
                    sandbox=sandbox_tiers(mine, suites),
                    **common,
                    **provenance(mine),
                )
            )
            continue
        _, _, b = _per_suite(paper, table, of, scale, theirs, k, per_seed=True)
        st = paired_bootstrap_diff_suites([100.0 * x for x in a], [100.0 * x for x in b], of.weighting, alpha=ALPHA / 2)
        family.append((len(out), ref_label, ref != column.relative_to))
        stats.append(st)
        out.append(
            _line(
                row,
                backbone,
                column,
                scale,
                seeds,
                ours_mean=st[0],
                ours_lo=st[1],
                ours_hi=st[2],
                detail=f"{row.label} vs {ref_label} on {column.of}: {VERSUS_TEST}",
                sandbox=sandbox_tiers(mine + theirs, suites),
                **common,
                **provenance(mine + theirs),
            )
        )
    verdicts = versus_verdicts([st[0] for st in stats], [st[3] for st in stats], [st[4] for st in stats])
    for (i, label, own), (p2, adj, verdict) in zip(family, verdicts):
        # "noise" alone against the column's reference; a row with its own baseline says which
        text = (
            f"{verdict} vs {label}"
            if verdict == "noise" and own
            else (verdict if verdict == "noise" else f"{verdict} {label}")
        )
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


def _step_time_line(
    row: Row,
    backbone: str,
    column: Column,
    scale: str,
    seeds: Sequence[int],
    times: StepTimes | None,
    ref: StepTimes | None,
) -> dict[str, Any]:
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
    return _line(
        row,
        backbone,
        column,
        scale,
        seeds,
        unit=unit,
        ours_mean=mean,
        ours_lo=lo,
        ours_hi=hi,
        n_steps=len(times.values),
        detail=detail,
        **times.provenance,
    )


def _steps_to_line(
    row: Row,
    backbone: str,
    column: Column,
    scale: str,
    seeds: Sequence[int],
    value: StepsTo | None,
    ref: StepsTo | None,
) -> dict[str, Any]:
    """The line of a steps_to cell (empty for the base model, which is not trained); censored seeds are
    counted in `censored` (and the reference run's in `ref_censored`)."""
    unit = _unit(column)
    if value is None:
        return _line(row, backbone, column, scale, seeds, unit=unit)
    level = (
        f"threshold {value.threshold:.4g} ({column.threshold:g} x {column.threshold_of}'s final reward EMA); "
        if column.threshold_of is not None
        else ""
    )
    ref_censored = 0
    if column.relative_to is None:
        mean, lo, hi = steps_to_stats(value)
        detail = steps_to_per_seed(value)
    elif row.run == column.relative_to:
        mean = lo = hi = _reference_value(column)
        detail = f"reference: {steps_to_text(value)}; {steps_to_per_seed(value)}"
        ref_censored = value.n_censored
    else:
        assert ref is not None
        mean, lo, hi = steps_to_stats(value, ref, column.relative)
        detail = (
            f"{steps_to_text(value)} vs {steps_to_text(ref)} ({column.relative_to}); "
            f"{steps_to_per_seed(value)}; {column.relative_to}: {steps_to_per_seed(ref)}"
        )
        ref_censored = ref.n_censored
    return _line(
        row,
        backbone,
        column,
        scale,
        seeds,
        unit=unit,
        ours_mean=mean,
        ours_lo=lo,
        ours_hi=hi,
        n_steps=int(value.trained.sum()),
        detail=level + detail,
        censored=value.n_censored,
        ref_censored=ref_censored,
        **value.provenance,
    )


def build_table(
    paper: PaperSpec, table: str, scale: str, seeds: list[int], evals_dir: Path, k: int, runs_dir: Path | None = None
) -> pd.DataFrame:
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
            f"has a stand-in there; tables buildable at {scale!r}: {paper.tables_at(scale)}"
        )
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
        level = column.threshold
        if column.threshold_of is not None:  # a share of a run's final reward on this backbone
            level *= final_reward_ema(runs_dir, backbone, column.threshold_of, seeds, column.smoothing)
        key = (backbone, run, level, column.smoothing)
        if key not in reached:
            reached[key] = load_steps_to(runs_dir, backbone, run, seeds, level, column.smoothing)
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
                lines.append(
                    _steps_to_line(
                        row,
                        backbone,
                        column,
                        scale,
                        seeds,
                        steps_to(backbone, row.run, column) if trained else None,
                        ref_st,
                    )
                )
                continue
            k_ = column.series_key
            ref = step_times(backbone, column.relative_to, k_) if trained and column.relative_to else None
            lines.append(
                _step_time_line(
                    row, backbone, column, scale, seeds, step_times(backbone, row.run, k_) if trained else None, ref
                )
            )
    filled = iter(_versus_lines(paper, spec, scale, seeds, k, versus, results_of) if versus else [])
    return pd.DataFrame([line if line is not None else next(filled) for line in lines], columns=list(LONG_COLUMNS))


def write_table(df: pd.DataFrame, table: TableSpec, paper: PaperSpec, out_csv: Path, out_md: Path) -> None:
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
