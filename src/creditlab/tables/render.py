"""Show a built table: the cells as text and the annotated Markdown page (scale warning, mappings, how each column is
computed, the wide table of ours [CI] beside the paper's numbers, provenance).

Values are fractions in the evaluation files and percentages in the tables, as in the papers. A benchmark without a
stand-in at the table's scale is left out: a column on it alone is omitted, a column over several benchmarks averages
the mapped ones, and the page says so.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from creditlab.papers.spec import (
    BASE_RUN,
    COMPARISON_METRICS,
    TRAINING_METRICS,
    Column,
    PaperSpec,
    TableSpec,
)
from creditlab.tables.frame import SEP, missing, split, unique
from creditlab.tables.load import StepsTo
from creditlab.tables.stats import N_BOOT, VERSUS_TEST


def _fmt(value: float) -> str:
    """A number with two decimals, or an em dash when missing."""
    return "—" if missing(value) else f"{value:.2f}"


def _fmt_signed(value: float) -> str:
    """A signed percentage difference with two decimals ("+2.10%"), or an em dash when missing."""
    return "—" if missing(value) else f"{value:+.2f}%"


def _fmt_num(value: float) -> str:
    """A count: an integer as is ("12"), otherwise two decimals ("12.33"); an em dash when missing."""
    if missing(value):
        return "—"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _fmt_ratio(value: float) -> str:
    """A ratio with two decimals and an x ("0.91x"), or an em dash when missing."""
    return "—" if missing(value) else f"{value:.2f}x"


def _count(value: Any) -> int:
    """An integer field of a line (0 when missing: a CSV written before the field existed)."""
    return 0 if missing(value) else int(value)


def steps_to_text(value: StepsTo) -> str:
    """The mean steps to the threshold with its unit, `>` when a seed is censored (the mean is then a lower bound)."""
    return f"{'>' if value.n_censored else ''}{_fmt_num(value.mean)} steps"


def steps_to_per_seed(value: StepsTo) -> str:
    """Every seed's steps to the threshold: `s0: 12, s1: >20` (`>N`: never reached in its N steps)."""
    return ", ".join(
        f"s{seed}: {'>' if c else ''}{int(v)}" for seed, v, c in zip(value.seeds, value.values, value.censored)
    )


def _ours_cell(line: Any) -> str:
    """Our cell in the wide table: mean [lo, hi] in the line's unit; steps_to cells marked when censored."""
    unit, detail = str(line.unit), line.detail if isinstance(line.detail, str) else ""
    if line.metric in COMPARISON_METRICS:
        verdict = str(getattr(line, "verdict", "") or "")
        if verdict == "reference":
            return "reference"
        return (
            f"**{verdict}** ({_fmt_signed(line.ours_mean).removesuffix('%')} pp "
            f"[{_fmt_signed(line.ours_lo).removesuffix('%')}, {_fmt_signed(line.ours_hi).removesuffix('%')}], "
            f"p_adj = {_fmt_p(line.p_adj)})"
        )
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
        if not (steps_to and missing(line.ours_lo) and missing(line.ours_hi)):
            cell += f" [{ci_fmt(line.ours_lo)}, {ci_fmt(line.ours_hi)}]"
        if censored and ref_censored:
            cell += f" (censored: {censored}/{n_seeds} seeds, reference {ref_censored}/{n_seeds}: no bound)"
        elif censored or ref_censored:
            cell += f" (censored: {censored}/{n_seeds} seeds, reference {ref_censored}/{n_seeds})"
        return cell
    if steps_to:
        cell = f"{'>' if censored else ''}{_fmt_num(line.ours_mean)}"
        if censored < n_seeds and not (missing(line.ours_lo) and missing(line.ours_hi)):
            cell += f" [{_fmt(line.ours_lo)}, {_fmt(line.ours_hi)}]"
        if censored and n_seeds > 1:
            cell += f" ({censored}/{n_seeds} censored)"
        return cell
    f = _fmt_sig if line.metric == "train_mean" else _fmt
    return f"{f(line.ours_mean)} [{f(line.ours_lo)}, {f(line.ours_hi)}]"


def _fmt_p(value: float) -> str:
    """A p-value: three significant digits, or an em dash when missing."""
    return "—" if missing(value) else f"{value:.3g}"


def _fmt_sig(value: float) -> str:
    """Four significant digits (training metrics span many magnitudes: EffN/T 0.05, residual 3e-3)."""
    return "—" if missing(value) else f"{value:.4g}"


def _paper_cell(line: Any) -> str:
    unit = str(line.unit)
    if unit.startswith("x vs"):
        return _fmt_ratio(line.paper)
    return _fmt_signed(line.paper) if unit.startswith("% vs") else _fmt(line.paper)


def md_table(header: list[str], lines: list[list[str]]) -> list[str]:
    """A GitHub Markdown table."""

    def fmt(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [fmt(header), fmt(["---"] * len(header)), *(fmt(line) for line in lines)]


def _single(df: pd.DataFrame, column: str) -> str:
    """The one value of `column` in `df` (ValueError if the frame mixes several)."""
    values = unique([str(v) for v in df[column]])
    if len(values) != 1:
        raise ValueError(f"the table frame mixes several values of {column!r}: {values}")
    return values[0]


def _comparability_note(scale: str) -> str:
    """Whether our numbers can be compared with the paper's at this scale."""
    if scale == "paper":
        return (
            "**Scale `paper`.** Our numbers and the *paper* columns use the paper's benchmarks "
            "and backbones: they are comparable, up to sampling noise and the evaluation "
            "settings (k, sampling, max tokens) stated below."
        )
    if scale == "smoke":
        return (
            "**Scale `smoke`: these numbers mean nothing.** The paper's pipeline ran end to end on a CPU (verl, "
            "vLLM, the hub loaders) with random-init stand-ins of the backbones, a handful of fixture questions "
            "and 2 RL steps per run: the table proves the path executes, not any result."
        )
    return (
        f"**Scale `{scale}`: these are NOT the paper's results.** Our numbers come from tiny "
        f"models on synthetic suites that stand in for the paper's benchmarks. The *paper* "
        f"columns are the numbers the paper reports at paper scale on its own benchmarks and "
        f"backbones; they are **not comparable in absolute value** with ours. Compare the "
        f"ordering of methods and the direction of effects only."
    )


def _column_note(paper: PaperSpec, spec: TableSpec, column_name: str, scale: str, df: pd.DataFrame) -> str:
    """One line describing how a column is computed at this scale."""
    column = spec.column(column_name)
    if column.is_comparison:
        n = int((df[df["column"] == column_name]["verdict"].astype(str) != "reference").sum()) if len(df) else 0
        family = int(
            sum(
                (df[df["column"] == c.name]["verdict"].astype(str) != "reference").sum()
                for c in spec.columns
                if c.is_comparison and c.name in set(df["column"])
            )
        )
        return (
            f'- **{column.name}**: the claim "row beats its reference" on **{column.of}** (reference: run '
            f"`{column.relative_to}` on the same backbone, or the row's own `baseline`), decided by a "
            f"{VERSUS_TEST}; {n} claims in this column, **{family} in the Holm family** (every versus cell of "
            f"the table). `beats X` / `worse than X` = Holm-adjusted p < 0.05 with that sign; `noise` = not "
            f"resolved at this number of questions and seeds. Shown: the difference in percentage points "
            f"[95% paired-bootstrap interval], p_adj. The training seeds are resampled with the questions, so "
            f"seed-to-seed variance of RL is in p; with few seeds the seed resampling is coarse (3 seeds: 10 "
            f"distinct seed multisets)"
        )
    if column.metric == "steps_to":
        return _steps_to_note(column, scale, df)
    if column.metric == "train_mean":
        what = (
            f"mean over RL steps of `{column.key}` (the run's training metrics.jsonl; steps where it is not "
            f"logged or not finite are skipped), steps of all seeds pooled, 95% bootstrap CI over steps; "
            f"base-model rows: empty (not trained)"
        )
        if column.relative_to is not None:
            what += (
                f"; as {'a ratio to' if column.relative == 'ratio' else 'a % difference vs'} run "
                f"`{column.relative_to}` on the same backbone (CI from the ratio of bootstrap means)"
            )
        return f"- **{column.name}**: {what}"
    if column.is_training:
        what = (
            "mean wall time per RL step (`t_step` of the run's training metrics.jsonl) in seconds, "
            "steps of all seeds pooled, 95% bootstrap CI over steps; base-model rows: empty (not trained)"
        )
        ref = column.relative_to
        if ref is not None and column.relative == "ratio":
            what = (
                f"ratio of the {what.split(' in seconds')[0]} to run `{ref}`'s on the same backbone, "
                f"t / t_ref (`0.91x` = 9% less time per step); CI: percentiles of the ratio of bootstrap "
                f"means (steps of both runs resampled independently); the `{ref}` rows are the reference; "
                f"base-model rows: empty"
            )
        elif ref is not None:
            what = (
                f"% difference of the {what.split(' in seconds')[0]} vs run `{ref}` on "
                f"the same backbone, 100 (t / t_ref - 1); CI: percentiles of the ratio of bootstrap means "
                f"(steps of both runs resampled independently); the `{ref}` rows are the "
                f"reference; base-model rows: empty"
            )
        if scale != "paper":
            what += f"; {scale}-scale CPU/GPU time of tiny models, not the paper's cluster cost"
        return f"- **{column.name}**: {what}"
    sub = df[df["column"] == column_name]
    metric = _single(sub, "metric") if len(sub) else "?"
    leaves, left_out = paper.leaves_at(spec.name, column, scale)
    suites = ", ".join(f"`{paper.suite_for(b, scale)}`" for b, _ in leaves)
    missing = ""
    if left_out:
        n_all = len(unique([b for b, _ in spec.leaves(column)]))
        missing = (
            f"; **averages {n_all - len(left_out)} of the paper's {n_all} benchmarks**: left out "
            f"(no {scale} stand-in): {', '.join(left_out)}"
        )
    if column.metric_for(scale) != column.metric:
        missing += (
            f"; **{column.metric_for(scale)} at this scale, the paper's {column.metric}** (the column's "
            f"per-scale metric: this scale's evaluation draws fewer samples per question), shown as "
            f"{column.label_at(scale)}"
        )
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
    ci = (
        "95% percentile bootstrap CI over seeds"
        if n_seeds > 1
        else "no CI: one seed (a CI needs several seeds: paper config `seeds`)"
    )
    level = (
        f"{column.threshold:g} x the last value of the same EMA of `{column.threshold_of}`'s reward on the row's "
        f"backbone (mean over its seeds; the level is in each cell's detail)"
        if column.threshold_of is not None
        else f"{column.threshold:g}"
    )
    smoothed = (
        f"the EMA (smoothing {column.smoothing:g}, debiased as in the training-curve figures) of"
        if column.smoothing
        else "(no smoothing)"
    )
    what = (
        f"RL steps until {smoothed} the run's training `reward_mean` (mean verifier score of every rollout "
        f"generated in a step, "
        f"before any dynamic-sampling filter) first reaches **{level}**: 1 + the 0-based `step` "
        f"of metrics.jsonl where it does (the steps run, that one included)"
    )
    censor = "a seed that never reaches it is censored: counted at its N steps trained (the mean is then a lower bound)"
    ref = column.relative_to
    if ref is None:
        what += (
            f"; mean over seeds {seeds}, {ci}; {censor}, marked `>` (with `k/n censored` when several "
            f"seeds; CSV `censored` = how many)"
        )
    else:
        how = (
            "ratio of the means s / s_ref (`0.91x` = 9% fewer steps)"
            if column.relative == "ratio"
            else "% difference of the means, 100 (s / s_ref - 1)"
        )
        ci_rel = (
            "CI: percentiles of the ratio of independent bootstrap means over both runs' seeds"
            if n_seeds > 1
            else "no CI: one seed"
        )
        what += (
            f", mean over seeds {seeds}, vs run `{ref}` on the same backbone: {how}; {ci_rel}; {censor}; "
            f"`>` = a lower bound (some of the row's seeds censored, CSV `censored`), `<` = an upper bound "
            f"(some of the reference's, CSV `ref_censored`), both: no bound; the `{ref}` rows are the reference"
        )
    what += (
        "; base-model rows: empty (not trained). It counts RL steps, not FLOPs or wall time: a costlier step "
        "(see a step_time column) or a run with a larger batch per step spends more per step"
    )
    if scale != "paper":
        what += f"; {scale}-scale: tiny models on the synthetic task, with a threshold set for them, not the paper's"
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
        lines.append(
            f"Columns **omitted** (none of their benchmarks has a {scale} stand-in): "
            + ", ".join(f"{c.name} ({', '.join(unique([b for b, _ in spec.leaves(c)]))})" for c in omitted)
            + "."
        )
    for col, out in partial:
        n_all = len(unique([b for b, _ in spec.leaves(col)]))
        lines.append(
            f"- **{col.name}** averages only {n_all - len(out)} of its {n_all} benchmarks here "
            f"(left out: {', '.join(out)}); its *paper* number is the paper's {n_all}-benchmark "
            f"value: do not compare the two."
        )
    return lines + [""]


def _mapping_lines(paper: PaperSpec, spec: TableSpec, scale: str) -> list[str]:
    """The backbone and benchmark mappings the table uses at this scale."""
    backbones = unique([row.backbone for row in spec.rows])
    benches = unique([b for col in spec.columns for b, _ in spec.leaves(col)])
    lines = ["## Mappings at this scale", ""]
    lines += [f"- {b} -> {scale} backbone `{paper.backbone_for(b, scale)}`" for b in backbones]
    lines += [
        f"- {b} -> {scale} suite `{paper.suite_for(b, scale)}`"
        if paper.has_suite(b, scale)
        else f"- {b} -> no {scale} stand-in (left out)"
        for b in benches
    ]
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
    return md_table(header, lines)


def _provenance_lines(df: pd.DataFrame, spec: TableSpec) -> list[str]:
    """Commit summary and, per row, the MLflow run ids, run keys and config paths of its sources."""
    commits = unique(split(df["commits"]))
    lines = ["## Provenance", ""]
    if len(commits) == 1:
        lines.append(f"Commit: `{commits[0]}`")
    else:
        lines.append(
            f"Commits (the rows come from different code versions): {', '.join(f'`{c}`' for c in commits) or 'unknown'}"
        )
    if any(c.endswith("-dirty") for c in commits):
        lines.append("(`-dirty`: the code had uncommitted changes.)")
    lines.append("")
    for row in spec.rows:
        sub = df[(df["row"] == row.label) & (df["paper_backbone"] == row.backbone)]
        first = sub.iloc[0]
        read = sub[[not missing(s) and bool(str(s)) for s in sub["sources"]]]
        if read.empty:
            lines.append(f"- {row.label} / {row.backbone} (`{first.backbone}`, run `{first.run}`): no source read")
            continue
        ids: list[str] = []
        for field in read["mlflow_run_ids"]:  # one id per seed, "" = offline
            ids += [""] if missing(field) else str(field).split(SEP)
        ids = unique([i or "none (offline)" for i in ids])
        steps = unique([s for s in split(read[read["metric"].isin(["step_time", "train_mean"])]["sources"])])
        rewards = unique([s for s in split(read[read["metric"] == "steps_to"]["sources"])])
        line = (
            f"- {row.label} / {row.backbone} (`{first.backbone}`, run `{first.run}`, seeds "
            f"{str(first.seeds).replace(SEP, ', ')}): MLflow run ids {', '.join(ids)}; run keys "
            f"{', '.join(f'`{r}`' for r in unique(split(read['run_keys'])))}; configs "
            f"{', '.join(f'`{c}`' for c in unique(split(read['configs'])))}"
        )
        if steps:
            line += f"; step times from {', '.join(f'`{s}`' for s in steps)}"
        if rewards:
            line += f"; training rewards from {', '.join(f'`{s}`' for s in rewards)}"
        tiers = unique(split(read["sandbox"])) if "sandbox" in read else []
        if tiers:  # the code sandbox tier the row's code suites were scored under
            line += f"; code scored under sandbox tier {', '.join(tiers)}"
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
        lines += [f"Seeds {seeds}: this paper's own `seeds` at scale `{scale}` (its config), not the pipeline's.", ""]
    if any(not c.is_training for c in columns):
        lines += [
            f"Our accuracy cells: mean in percent [95% percentile bootstrap CI over questions, {N_BOOT} "
            f"resamples; suites resampled independently], seeds {seeds} averaged per question."
        ]
    if any(c.metric == "step_time" for c in columns):
        lines += [
            f"Our step-time cells: seconds per RL step [95% percentile bootstrap CI over steps, "
            f"{N_BOOT} resamples], steps of seeds {seeds} pooled; relative cells in % or x (see Columns)."
        ]
    if any(c.metric == "train_mean" for c in columns):
        keys = ", ".join(unique([f"`{c.key}`" for c in columns if c.metric == "train_mean"]))
        lines += [
            f"Our training-metric cells ({keys}): mean over RL steps of the run's logged metric [95% "
            f"percentile bootstrap CI over steps, {N_BOOT} resamples], steps of seeds {seeds} pooled."
        ]
    if any(c.metric == "steps_to" for c in columns):
        n_seeds = len(seeds.split(", "))
        ci = (
            f"95% percentile bootstrap CI over seeds, {N_BOOT} resamples" if n_seeds > 1 else "no CI with a single seed"
        )
        lines += [
            f"Our steps-to-threshold cells: RL steps until the smoothed training reward first reaches the "
            f"column's threshold, mean over seeds {seeds} [{ci}]; `>` = a lower bound (a seed never "
            f"reached it: counted at its steps trained); relative cells in % or x (see Columns)."
        ]
    lines += ["Paper cells: the paper's reported number at paper scale (— = not reported).", ""]
    lines += _omitted_lines(paper, table, scale)
    lines += _mapping_lines(paper, table, scale) + ["", "## Columns", ""]
    lines += [_column_note(paper, table, c.name, scale, df) for c in columns]
    lines += ["", "## Table", ""] + _wide_lines(df, table, scale, columns) + [""]
    lines += _provenance_lines(df, table)
    return "\n".join(lines) + "\n"
