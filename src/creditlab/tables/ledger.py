"""The reproduction ledger of a paper: every table cell at a scale with its provenance, and the paper's
claims (configs/papers/<paper>.yaml `claims`) tested by a stated statistical test, never by eye.

Tests (one-sided, alpha = 0.05, B = 2000 bootstrap resamples, fixed seed):

- an accuracy column (read from evaluations): a **paired bootstrap over questions**. Each row's per-question
  values are averaged over seeds (as the tables do); the question indices are resampled jointly for both
  rows (the same questions), the statistic is mean(A) - mean(B). A column over several suites (an average)
  takes the plain or question-count-weighted mean of the suite means, each suite's questions resampled
  independently (as the table's CI).
- a training column (step_time, train_mean: one value per RL step): an **unpaired bootstrap over steps**
  (steps of all seeds pooled; the two runs' steps resampled independently: steps are not paired).
  A `relative_to` column compares the raw per-step values (the same reference divides both rows).

One comparison "A > B" holds when the one-sided 95% lower bound of A - B (its 5% bootstrap quantile) is
above 0, is contradicted when the one-sided 95% upper bound (95% quantile) is below 0, and is otherwise not
resolved (noise). Its one-sided p-value is (1 + #{diff* <= 0}) / (1 + B) (the reverse, for contradiction,
(1 + #{diff* >= 0}) / (1 + B)). A claim of several comparisons (best_of, order, between) holds only if all
of its comparisons hold after a Holm correction of their p-values (family-wise alpha 0.05), and is
contradicted if any comparison is significantly reversed after Holm on the reverse p-values.

A `matched_order` claim (series[0] > series[1] > ... on `column` at matched values of `x`: the replacement study's
"Δlog p > KL > entropy at matched replacement rates") compares curves, not rows. Each series is a set of rows (one
per threshold) with a measured x (the `x` column's cell: replacement rate, %) and y (`column`'s cell). The **matched
rates** are G = 11 evenly spaced x values over the common range [max of the series' smallest measured x, min of their
largest] (the point estimates): inside every series' measured range, never extrapolated. Each series' y at a matched
x is the linear interpolation of its (x, y) points sorted by x (equal x averaged). A link "A > B" has the statistic
mean over the matched rates of y_A(x) - y_B(x) (the area between the curves over the common range, per unit of x),
tested by the paired bootstrap above: a draw resamples the seeds and, per suite, the questions jointly for every row
of every series, recomputes every row's x and y (so the uncertainty of the measured rates is in the test) and
re-interpolates at the same matched rates (a resampled curve that no longer spans one is held at its end value).
Verdicts as for `order` (one link: its bounds; several: Holm over the links). When the series' measured ranges do not
overlap there is no matched rate: the claim is `not decidable` (NOT_DECIDABLE), reported with each series' range.
With `toward` a row (the RL model whose accuracy replacement is to recover), a link's statistic is instead the mean
over the matched rates of |y_B(x) - y_T| - |y_A(x) - y_T|, y_T that row's cell resampled with the same draws: A
reaches the target with fewer replacements, whether the target lies above the base model's accuracy or below it.
"""

from __future__ import annotations

import json
import math
import platform
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from creditlab.papers.spec import BASE_RUN, Claim, PaperSpec, TableSpec, resolve_metric
from creditlab.tables.frame import SEP, row_run_ids, split_field
from creditlab.tables.load import load_eval, load_step_times, seed_matrix
from creditlab.tables.stats import (
    BOOT_SEED,
    CONTRADICTED,
    HOLDS,
    MATCHED_POINTS,
    MATCHED_TEST,
    MATCHED_TOWARD,
    N_BOOT,
    NOISE,
    PAIRED_TEST,
    UNPAIRED_TEST,
    combined_verdict,
    holm,
    matched_gap_bootstrap,
    matched_grid,
    matched_range,
    paired_bootstrap_diff_suites,
    point_mean,
    single_verdict,
    suite_means,
    unpaired_bootstrap_diff,
)

NOT_TESTABLE = "not testable at this scale"
NOT_DECIDABLE = "not decidable (no matched x: the series' measured ranges do not overlap)"
VERDICTS = (HOLDS, CONTRADICTED, NOISE, NOT_TESTABLE, NOT_DECIDABLE)


# ----------------------------------------------------------------------------------------------
# reading the data of a claim


@dataclass(frozen=True)
class Comparison:
    """One comparison `winner > loser` of a claim with its bootstrap numbers (in the column's unit)."""

    winner: tuple[str, str]
    loser: tuple[str, str]
    diff: float
    lo: float
    hi: float
    p: float
    p_reverse: float
    p_holm: float = float("nan")

    def text(self) -> str:
        return (
            f"{self.winner[0]} vs {self.loser[0]}: advantage {self.diff:+.4g}, one-sided 95% bounds "
            f"[{self.lo:+.4g}, {self.hi:+.4g}], "
            f"p = {self.p:.4f}" + ("" if math.isnan(self.p_holm) else f" (Holm {self.p_holm:.4f})")
        )


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    test: str
    verdict: str
    comparisons: tuple[Comparison, ...] = ()
    note: str = ""


def _row_of(table: TableSpec, ref: tuple[str, str]):
    return next(r for r in table.rows if (r.label, r.backbone) == ref)


def _series_values(
    paper: PaperSpec,
    table: TableSpec,
    claim: Claim,
    scale: str,
    seeds: Sequence[int],
    evals_dir: Path,
    k: int,
    sign: float,
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray | None]:
    """Per series of a matched_order claim: (x, y) of its rows, each [1 + n_boot, T]: the point estimate (row 0), then
    the bootstrap draws, every row of every series resampled with the same seeds and, per suite, the same questions.
    x and y are the cells of the claim's `x` and `column` in percent (y times `sign`). Second: the `toward` row's y
    [1 + n_boot] with the same draws (None without `toward`)."""
    y_col, x_col = table.column(claim.column), table.column(str(claim.x))
    leaves = {name: paper.leaves_at(table.name, col, scale)[0] for name, col in (("y", y_col), ("x", x_col))}
    suites = {name: [paper.suite_for(b, scale) for b, _ in pairs] for name, pairs in leaves.items()}
    metrics = {name: [resolve_metric(m, k) for _, m in pairs] for name, pairs in leaves.items()}
    weighting = {"y": y_col.weighting, "x": x_col.weighting}
    arrays: dict[tuple[str, str], dict[str, list[np.ndarray]]] = {}
    for ref in claim.refs():
        row = _row_of(table, ref)
        results = [
            load_eval(Path(evals_dir), paper.backbone_for(row.backbone, scale), row.run, s, row.decode) for s in seeds
        ]
        arrays[ref] = {  # the `toward` row is read for y only (an RL run's own evaluation has no replacement rate)
            name: [100.0 * seed_matrix(results, s, m) for s, m in zip(suites[name], metrics[name])]
            for name in (("y",) if ref == claim.toward else ("y", "x"))
        }
    sizes = {}
    for per in arrays.values():
        for name in per:
            for s, v in zip(suites[name], per[name]):
                if sizes.setdefault(s, v.shape) != v.shape:
                    raise ValueError(
                        f"claim {claim.id!r}: suite {s!r} has different questions or seeds across its "
                        f"rows ({sizes[s]} vs {v.shape}): the series cannot be paired"
                    )
    rng = np.random.default_rng(seed)
    idx = {s: rng.integers(0, shape[0], size=(n_boot, shape[0])) for s, shape in sizes.items()}
    n_seeds = len(seeds)
    seed_idx = rng.integers(0, n_seeds, size=(n_boot, n_seeds))

    def cell(per: dict[str, list[np.ndarray]], name: str) -> np.ndarray:
        point = point_mean(per[name], weighting[name])
        boots = suite_means(per[name], [idx[s] for s in suites[name]], weighting[name], seed_idx)
        return np.concatenate([[point], boots])

    out = {}
    for series, rows in claim.series:
        x = np.stack([cell(arrays[r], "x") for r in rows], axis=1)
        y = sign * np.stack([cell(arrays[r], "y") for r in rows], axis=1)
        out[series] = (x, y)
    # `toward`: the target row's y [1 + n_boot], resampled with the same draws
    target = None if claim.toward is None else sign * cell(arrays[claim.toward], "y")
    return out, target


def _evaluate_matched(
    paper: PaperSpec, claim: Claim, scale: str, seeds: Sequence[int], evals_dir: Path, k: int
) -> ClaimResult:
    """A matched_order claim (see the module doc): the series compared at matched x, Holm over the links."""
    table = paper.table(claim.table)
    test = MATCHED_TEST.format(x=claim.x, y=claim.column, g=MATCHED_POINTS)
    if claim.x not in [c.name for c in paper.columns_at(claim.table, scale)]:
        return ClaimResult(claim, "—", NOT_TESTABLE, note=f"column {claim.x!r} has no stand-in at scale {scale!r}")
    sign = 1.0 if claim.direction == "higher" else -1.0
    values, target = _series_values(paper, table, claim, scale, seeds, evals_dir, k, sign)
    if claim.toward is not None:
        test += MATCHED_TOWARD.format(x=claim.x, y=claim.column, t=claim.toward[0])
    ranges = "; ".join(f"{name} {x[0].min():.4g}–{x[0].max():.4g}" for name, (x, _) in values.items())
    common = matched_range([x[0] for x, _ in values.values()])
    if common is None:
        return ClaimResult(
            claim,
            test,
            NOT_DECIDABLE,
            note=f"the series' measured {claim.x} ranges do not overlap ({ranges}): no matched "
            f"{claim.x} to compare them at; thresholds giving overlapping rates would decide it",
        )
    grid = matched_grid(*common)
    comps = [
        Comparison((a, ""), (b, ""), *matched_gap_bootstrap(values[a], values[b], grid, target=target))
        for a, b in claim.series_links()
    ]
    note = (
        f"matched {claim.x}: {len(grid)} values over {common[0]:.4g}–{common[1]:.4g} (the common range of the "
        f"measured {claim.x}: {ranges}); advantage = "
        + (
            "mean accuracy difference over them, in points"
            if target is None
            else f"how much closer to {claim.toward[0]}'s {claim.column} ({target[0]:.4g}) on average over them, "
            "in points"
        )
    )
    if claim.direction == "lower":
        test += "; lower is better: the difference is the winner's advantage, loser − winner"
    if len(comps) == 1:
        return ClaimResult(claim, test, single_verdict(comps[0].lo, comps[0].hi), tuple(comps), note)
    adj = holm([c.p for c in comps])
    comps = [Comparison(c.winner, c.loser, c.diff, c.lo, c.hi, c.p, c.p_reverse, a) for c, a in zip(comps, adj)]
    verdict = combined_verdict([c.p for c in comps], [c.p_reverse for c in comps])
    return ClaimResult(claim, test + f"; Holm correction over the {len(comps)} links", verdict, tuple(comps), note)


def evaluate_claim(
    paper: PaperSpec, claim: Claim, scale: str, seeds: Sequence[int], evals_dir: Path, k: int, runs_dir: Path
) -> ClaimResult:
    """Test one claim at `scale` over `seeds` (see the module doc for the tests and verdicts)."""
    table = paper.table(claim.table)
    column = table.column(claim.column)
    if paper.built is not None and claim.table not in paper.built:
        return ClaimResult(
            claim,
            "—",
            NOT_TESTABLE,
            note=f"table {claim.table!r} is not built by this pipeline (config `tables`, or its runs refused at plan "
            "time: `snakemake -n` says which)",
        )
    shown = [c.name for c in paper.columns_at(claim.table, scale)] if claim.table in paper.tables_at(scale) else []
    sign = 1.0 if claim.direction == "higher" else -1.0
    if claim.column not in shown:
        return ClaimResult(claim, "—", NOT_TESTABLE, note=f"column {claim.column!r} has no stand-in at scale {scale!r}")
    if claim.kind == "matched_order":
        return _evaluate_matched(paper, claim, scale, seeds, evals_dir, k)
    pairs = claim.comparisons()
    if column.is_training:
        test = UNPAIRED_TEST
        refs = {r for pair in pairs for r in pair}
        if any(_row_of(table, r).run == BASE_RUN for r in refs):
            return ClaimResult(claim, test, NOT_TESTABLE, note="a base-model row has no training metrics")
        values = {
            r: load_step_times(
                runs_dir, paper.backbone_for(r[1], scale), _row_of(table, r).run, seeds, column.series_key
            ).values
            for r in refs
        }
        stats = [unpaired_bootstrap_diff(sign * values[w], sign * values[l]) for w, l in pairs]
    else:
        test = PAIRED_TEST
        leaves, _ = paper.leaves_at(table.name, column, scale)
        suites = [paper.suite_for(bench, scale) for bench, _ in leaves]
        metrics = [resolve_metric(m, k) for _, m in leaves]
        per_row: dict[tuple[str, str], list[np.ndarray]] = {}
        for ref in {r for pair in pairs for r in pair}:
            row = _row_of(table, ref)
            backbone = paper.backbone_for(row.backbone, scale)
            results = [load_eval(Path(evals_dir), backbone, row.run, s, row.decode) for s in seeds]
            per_row[ref] = [100.0 * sign * seed_matrix(results, s, m) for s, m in zip(suites, metrics)]
        stats = [paired_bootstrap_diff_suites(per_row[w], per_row[l], column.weighting) for w, l in pairs]
    comps = [Comparison(w, l, *st) for (w, l), st in zip(pairs, stats)]
    if claim.direction == "lower":
        test += "; lower is better: the difference is the winner's advantage, loser − winner"
    if len(comps) == 1:
        return ClaimResult(claim, test, single_verdict(comps[0].lo, comps[0].hi), tuple(comps))
    adj = holm([c.p for c in comps])
    comps = [Comparison(c.winner, c.loser, c.diff, c.lo, c.hi, c.p, c.p_reverse, a) for c, a in zip(comps, adj)]
    verdict = combined_verdict([c.p for c in comps], [c.p_reverse for c in comps])
    return ClaimResult(claim, test + f"; Holm correction over the {len(comps)} comparisons", verdict, tuple(comps))


def claim_statement(claim: Claim) -> str:
    """The claim as comparisons of rows: `A > B`, `A > max(B, C)`, `A > B > C`, `L < A < H`."""
    op = ">" if claim.direction == "higher" else "<"
    name = lambda r: r[0]  # noqa: E731
    if claim.kind == "better":
        s = f"{name(claim.row)} {op} {name(claim.over[0])}"
    elif claim.kind == "best_of":
        s = f"{name(claim.row)} {op} each of {', '.join(map(name, claim.over))}"
    elif claim.kind == "order":
        s = f" {op} ".join(map(name, claim.rows))
    elif claim.kind == "matched_order":
        s = f" {op} ".join(f"{n} ({', '.join(map(name, rows))})" for n, rows in claim.series) + f" at matched {claim.x}"
        if claim.toward is not None:
            s += f", in closeness to {name(claim.toward)}"
    else:
        inv = "<" if op == ">" else ">"
        s = f"{', '.join(map(name, claim.over))} {inv} {name(claim.row)} {inv} {', '.join(map(name, claim.under))}"
    backbones = sorted({r[1] for r in claim.refs()})
    return f"{s} on {claim.column} ({claim.table}; {', '.join(backbones)})"


# ----------------------------------------------------------------------------------------------
# provenance: hardware, MLflow links


def hardware() -> str:
    """The platform of the machine building the ledger (the runs' DONE / metrics.json record no hostname)."""
    return f"{platform.platform()} {platform.machine()} (ledger-building machine; runs record none)"


def mlflow_links(run_ids: Sequence[str], uri: str) -> dict[str, str]:
    """run id -> `<uri>/#/experiments/<exp id>/runs/<run id>`; experiment ids read from a local SQLite
    store (read-only) when `uri` is one; a run id not found (or a remote store) maps to itself."""
    ids = [r for r in dict.fromkeys(run_ids) if r]
    found: dict[str, str] = {}
    if uri.startswith("sqlite:///") and ids:
        db = Path(uri.removeprefix("sqlite:///"))
        if db.is_file():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    marks = ",".join("?" * len(ids))
                    for rid, exp in con.execute(
                        f"SELECT run_uuid, experiment_id FROM runs WHERE run_uuid IN ({marks})", ids
                    ):
                        found[rid] = str(exp)
            except sqlite3.Error:
                pass
    return {r: (f"{uri}/#/experiments/{found[r]}/runs/{r}" if r in found else r) for r in ids}


# ----------------------------------------------------------------------------------------------
# the ledger


CELL_COLUMNS = (
    "section",
    "table",
    "row",
    "paper_backbone",
    "backbone",
    "run",
    "column",
    "unit",
    "paper",
    "ours_mean",
    "ours_lo",
    "ours_hi",
    "seeds",
    "scale",
    "hardware",
    "commits",
    "configs",
    "mlflow_links",
    "sandbox",
)
CLAIM_COLUMNS = ("claim_id", "claim_text", "claim", "test", "verdict", "comparisons", "note")
LEDGER_COLUMNS = CELL_COLUMNS + CLAIM_COLUMNS


def build_ledger(
    paper: PaperSpec,
    scale: str,
    seeds: Sequence[int],
    tables: dict[str, pd.DataFrame],
    evals_dir: Path,
    k: int,
    runs_dir: Path,
    tracking_uri: str,
) -> tuple[pd.DataFrame, list[ClaimResult]]:
    """The ledger frame (one `cell` line per table row x column, then one `claim` line per claim) and the
    claim results. `tables`: table name -> its built long frame (the table CSV)."""
    hw = hardware()
    lines: list[dict[str, Any]] = []
    all_ids = [i for df in tables.values() for i in row_run_ids(df)]
    links = mlflow_links(all_ids, tracking_uri)
    for name, df in tables.items():
        for rec in df.to_dict("records"):
            get = lambda key, default="": rec.get(key, default)  # noqa: E731 (older CSVs lack some fields)
            lines.append(
                {
                    "section": "cell",
                    "table": name,
                    "row": get("row"),
                    "paper_backbone": get("paper_backbone"),
                    "backbone": get("backbone"),
                    "run": get("run"),
                    "column": get("column"),
                    "unit": get("unit", "%") if split_field(get("unit", "%")) else "%",
                    "paper": get("paper", float("nan")),
                    "ours_mean": get("ours_mean", float("nan")),
                    "ours_lo": get("ours_lo", float("nan")),
                    "ours_hi": get("ours_hi", float("nan")),
                    "seeds": get("seeds"),
                    "scale": scale,
                    "hardware": hw,
                    "commits": SEP.join(dict.fromkeys(split_field(get("commits")))),
                    "configs": SEP.join(dict.fromkeys(split_field(get("configs")))),
                    "mlflow_links": SEP.join(
                        links.get(i, i) for i in dict.fromkeys(split_field(get("mlflow_run_ids")))
                    ),
                    "sandbox": SEP.join(dict.fromkeys(split_field(get("sandbox")))),
                }
            )
    results = [evaluate_claim(paper, c, scale, seeds, evals_dir, k, runs_dir) for c in paper.claims]
    for r in results:
        lines.append(
            {
                "section": "claim",
                "table": r.claim.table,
                "column": r.claim.column,
                "scale": scale,
                "seeds": SEP.join(map(str, seeds)),
                "hardware": hw,
                "claim_id": r.claim.id,
                "claim_text": r.claim.text,
                "claim": claim_statement(r.claim),
                "test": r.test,
                "verdict": r.verdict,
                "comparisons": "; ".join(c.text() for c in r.comparisons),
                "note": r.note,
            }
        )
    return pd.DataFrame(lines, columns=list(LEDGER_COLUMNS)), results


def _num(v: Any) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.4g}"


def _md(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _column_shown(paper: PaperSpec, table: str, column: str, scale: str) -> str:
    """A cell's column as the ledger shows it: its name, or, where the column reads another k at this scale than the
    paper's (a per-scale metric), our k and the paper's (``Pass@8 (paper: Pass@16)``)."""
    try:
        label = paper.table(table).column(column).label_at(scale)
    except ValueError:
        return column
    return column if label == column else f"{label} (paper: {column})"


def ledger_markdown(paper: PaperSpec, scale: str, df: pd.DataFrame, results: list[ClaimResult]) -> str:
    """The readable ledger: scale warning, claims with their tests and verdicts, then every table cell."""
    cells = df[df["section"] == "cell"]
    hw = str(df["hardware"].iloc[0]) if len(df) else hardware()
    lines = [f"# Reproduction ledger: {paper.title}", ""]
    if scale != "paper":
        lines += [
            f"**Scale `{scale}`: the claims are tested on tiny models on synthetic stand-in suites, "
            f"NOT in the paper's setting (its models, benchmarks, budget).** A verdict here says whether "
            f"the paper's ordering shows up at this scale, not whether the paper is right.",
            "",
        ]
    lines += [
        f"Hardware: {hw}.",
        "",
        "MLflow: `<tracking uri>/#/experiments/<experiment id>/runs/<run id>` (a local SQLite store: "
        "open `python -m creditlab mlflow-ui` and append the `#/experiments/...` part to its address); "
        "a bare run id when the store does not know it.",
        "",
        "## Claims",
        "",
        f"Each claim is decided by a stated test, never by eye ({N_BOOT} bootstrap resamples, seed "
        f"{BOOT_SEED}): `holds` = the one-sided 95% lower bound of the difference (its 5% bootstrap "
        f"quantile) is above 0; `contradicted` = the one-sided 95% upper bound is below 0; otherwise "
        f"`not resolved (noise)`. Claims of several comparisons: every comparison's one-sided bootstrap "
        f"p-value (1 + #diff* <= 0) / (1 + B) Holm-corrected at family-wise alpha 0.05 (holds only if all "
        f"pass; contradicted if any is significantly reversed, Holm on the reverse p-values). `not "
        f"testable at this scale`: the column has no stand-in here. Claims at matched x (replacement rate): "
        f"each series interpolated linearly in its measured x at {MATCHED_POINTS} common x values inside every "
        f"series' measured range, the links tested on the mean accuracy difference there; `not decidable`: "
        f"the series' measured ranges do not overlap. Differences are in the column's "
        f"unit (accuracy: percentage points).",
        "",
    ]
    if not results:
        lines += ["No claims declared in the paper config.", ""]
    for r in results:
        lines += [
            f"### `{r.claim.id}`: **{r.verdict}**",
            "",
            f"- Paper's claim: {r.claim.text}",
            f"- Tested as: {claim_statement(r.claim)}",
            f"- Test: {r.test}",
        ]
        lines += [f"- {c.text()}" for c in r.comparisons]
        if r.note:
            lines.append(f"- Note: {r.note}")
        lines.append("")
    lines += [
        "## Table cells",
        "",
        "Ours: mean [95% CI] as in the table (see its page); paper: the paper's number at paper scale "
        "(— = not reported)" + (", not comparable in absolute value at this scale." if scale != "paper" else "."),
        "",
    ]
    header = [
        "Table",
        "Row",
        "Backbone (paper → ours)",
        "Run",
        "Column",
        "Paper",
        "Ours [CI]",
        "Seeds",
        "Commit",
        "Config",
        "MLflow",
    ]
    lines += [_md(header), _md(["---"] * len(header))]
    for c in cells.itertuples(index=False):
        ours = (
            ""
            if (isinstance(c.ours_mean, float) and math.isnan(c.ours_mean))
            else (f"{_num(c.ours_mean)} [{_num(c.ours_lo)}, {_num(c.ours_hi)}] {c.unit}")
        )
        lines.append(
            _md(
                [
                    c.table,
                    c.row,
                    f"{c.paper_backbone} → {c.backbone}",
                    c.run,
                    _column_shown(paper, c.table, c.column, scale),
                    _num(c.paper),
                    ours,
                    str(c.seeds).replace(SEP, ", "),
                    ", ".join(f"`{x[:12]}`" for x in split_field(c.commits)),
                    ", ".join(f"`{x}`" for x in split_field(c.configs)),
                    ", ".join(split_field(c.mlflow_links)),
                ]
            )
        )
    coded = [c for c in cells.itertuples(index=False) if split_field(getattr(c, "sandbox", ""))]
    if coded:  # code suites' results are only as safe and as right as the sandbox that ran them
        lines += ["", "Code cells, scored by executing the generated programs, and the sandbox tier that ran them:", ""]
        lines += [f"- {c.table} / {c.row} / {c.column}: {', '.join(split_field(c.sandbox))}" for c in coded]
    return "\n".join(lines) + "\n"


def write_ledger(
    paper: PaperSpec, scale: str, df: pd.DataFrame, results: list[ClaimResult], out_csv: Path, out_md: Path
) -> None:
    out_csv, out_md = Path(out_csv), Path(out_md)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_csv, index=False)
    out_md.write_text(ledger_markdown(paper, scale, df, results))


def verdict_summary(results: list[ClaimResult]) -> str:
    return json.dumps({r.claim.id: r.verdict for r in results}, ensure_ascii=False)
