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
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from creditlab import paths
from creditlab.eval.metrics import bootstrap_average, bootstrap_ci, pass_at_k_per_question
from creditlab.tables.spec import PaperSpec, Row, TableSpec, resolve_metric

N_BOOT = 2000
ALPHA = 0.05
BOOT_SEED = 0

LONG_COLUMNS = (
    "row", "paper_backbone", "backbone", "run", "column", "suites", "metric",
    "ours_mean", "ours_lo", "ours_hi", "n_questions", "seeds", "paper", "scale",
    "mlflow_run_ids", "run_keys", "commits", "configs",
)
"""Columns of the long table frame (one line per row x column), in CSV order."""

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
            "commits": joined("commit"), "configs": joined("config")}


def _unique(items: Sequence[str]) -> list[str]:
    """`items` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))


def _row_lines(paper: PaperSpec, table: TableSpec, row: Row, scale: str, seeds: list[int],
               results: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The long-frame lines of one table row, one per column."""
    backbone = paper.backbone_for(row.backbone, scale)
    lines = []
    for column in table.columns:
        leaves = table.leaves(column)
        suites = [paper.suite_for(bench, scale) for bench, _ in leaves]
        metrics = [resolve_metric(metric, k) for _, metric in leaves]
        if row.decode is None and "replacement_rate" in metrics:  # plain decoding replaces nothing: n/a
            per_suite, (mean, lo, hi) = [], (float("nan"),) * 3
        else:
            per_suite = [seed_averaged(results, s, m) for s, m in zip(suites, metrics)]
            mean, lo, hi = _cell_stats(per_suite, column.weighting)
        n_questions = {s: len(v) for s, v in zip(suites, per_suite)}
        lines.append({
            "row": row.label, "paper_backbone": row.backbone, "backbone": backbone,
            "run": row.run, "column": column.name, "suites": _SEP.join(_unique(suites)),
            "metric": _SEP.join(_unique(metrics)), "ours_mean": mean, "ours_lo": lo, "ours_hi": hi,
            "n_questions": sum(n_questions.values()), "seeds": _SEP.join(map(str, seeds)),
            "paper": row.paper.get(column.name, float("nan")), "scale": scale,
            **_provenance(results),
        })
    return lines


def build_table(paper: PaperSpec, table: str, scale: str, seeds: list[int], evals_dir: Path,
                k: int) -> pd.DataFrame:
    """Compute every cell of `paper`'s `table` at `scale` from the evaluations of `seeds`.

    `k` is the evaluation's k at that scale (it resolves the symbolic "avg@k" / "pass@k").
    Returns the long frame with LONG_COLUMNS, rows and columns in the spec's order.
    """
    if not seeds:
        raise ValueError("build_table needs at least one seed")
    spec = paper.table(table)
    cache: dict[tuple[str, str, int, str | None], dict[str, Any]] = {}
    lines: list[dict[str, Any]] = []
    for row in spec.rows:
        backbone = paper.backbone_for(row.backbone, scale)
        results = []
        for seed in seeds:
            key = (backbone, row.run, seed, row.decode)
            if key not in cache:
                cache[key] = load_eval(Path(evals_dir), backbone, row.run, seed, row.decode)
            results.append(cache[key])
        lines.extend(_row_lines(paper, spec, row, scale, list(seeds), results, k))
    return pd.DataFrame(lines, columns=list(LONG_COLUMNS))


# ----------------------------------------------------------------------------------------------
# writing


def _fmt(value: float) -> str:
    """A percentage with two decimals, or an em dash when missing."""
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "—" if missing else f"{value:.2f}"


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
    sub = df[df["column"] == column_name]
    metric = _single(sub, "metric") if len(sub) else "?"
    suites = ", ".join(f"`{paper.suite_for(b, scale)}`" for b, _ in spec.leaves(column))
    if column.average_of is not None:
        how = f"{column.weighting} mean of the suite means of {', '.join(column.average_of)}"
        return f"- **{column.name}**: {how} ({metric} on {suites})"
    if column.benchmarks:
        return f"- **{column.name}**: {metric}, {column.weighting} mean over {suites}"
    return f"- **{column.name}**: {metric} on {suites} (paper: {column.benchmark})"


def _mapping_lines(paper: PaperSpec, spec: TableSpec, scale: str) -> list[str]:
    """The backbone and benchmark mappings the table uses at this scale."""
    backbones = _unique([row.backbone for row in spec.rows])
    benches = _unique([b for col in spec.columns for b, _ in spec.leaves(col)])
    lines = ["## Mappings at this scale", ""]
    lines += [f"- {b} -> {scale} backbone `{paper.backbone_for(b, scale)}`" for b in backbones]
    lines += [f"- {b} -> {scale} suite `{paper.suite_for(b, scale)}`" for b in benches]
    return lines


def _wide_lines(df: pd.DataFrame, spec: TableSpec, scale: str) -> list[str]:
    """The wide Markdown table: one line per row, ours [CI] and the paper's number per column."""
    ours = "ours" if scale == "paper" else f"ours ({scale})"
    header = ["Backbone (paper)", "Row"]
    for col in spec.columns:
        header += [f"{col.name} {ours}", f"{col.name} paper"]
    lines = []
    for row in spec.rows:
        sub = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone)]
        cells = [row.backbone, row.label]
        for col in spec.columns:
            line = sub[sub["column"] == col.name].iloc[0]
            cells += [f"{_fmt(line.ours_mean)} [{_fmt(line.ours_lo)}, {_fmt(line.ours_hi)}]",
                      _fmt(line.paper)]
        lines.append(cells)
    return _md_table(header, lines)


def _provenance_lines(df: pd.DataFrame, spec: TableSpec) -> list[str]:
    """Commit summary and, per row, the MLflow run ids, run keys and config paths."""
    commits = _unique([c for field in df["commits"] for c in str(field).split(_SEP) if c])
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
        line = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone)].iloc[0]
        runs = [r or "none (offline)" for r in str(line.mlflow_run_ids).split(_SEP)]
        lines.append(
            f"- {row.label} / {row.backbone} (`{line.backbone}`, run `{line.run}`, seeds "
            f"{line.seeds.replace(_SEP, ', ')}): MLflow run ids {', '.join(runs)}; run keys "
            f"{', '.join(f'`{r}`' for r in str(line.run_keys).split(_SEP))}; configs "
            f"{', '.join(f'`{c}`' for c in str(line.configs).split(_SEP))}"
        )
    return lines


def table_markdown(df: pd.DataFrame, table: TableSpec, paper: PaperSpec) -> str:
    """The readable Markdown page of a built table (see write_table)."""
    scale = _single(df, "scale")
    seeds = _single(df, "seeds").replace(_SEP, ", ")
    lines = [f"# {paper.title}: table `{table.name}`", "", _comparability_note(scale), ""]
    if table.caption:
        lines += [f"Paper caption: {table.caption}", ""]
    lines += [f"Our cells: mean in percent [95% percentile bootstrap CI over questions, {N_BOOT} "
              f"resamples; suites resampled independently], seeds {seeds} averaged per question. "
              f"Paper cells: the paper's reported number at paper scale (— = not reported).", ""]
    lines += _mapping_lines(paper, table, scale) + ["", "## Columns", ""]
    lines += [_column_note(paper, table, c.name, scale, df) for c in table.columns]
    lines += ["", "## Table", ""] + _wide_lines(df, table, scale) + [""]
    lines += _provenance_lines(df, table)
    return "\n".join(lines) + "\n"


def write_table(df: pd.DataFrame, table: TableSpec, paper: PaperSpec, out_csv: Path,
                out_md: Path) -> None:
    """Write the long frame as CSV and a wide, annotated Markdown page.

    The Markdown states the scale, the backbone and benchmark mappings, how each column is
    computed, that the paper columns are the paper's numbers at paper scale (not comparable in
    absolute value at other scales), the commit(s) and, per row, the MLflow run ids, run keys
    and config paths.
    """
    out_csv, out_md = Path(out_csv), Path(out_md)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_csv, index=False)
    out_md.write_text(table_markdown(df, table, paper))
