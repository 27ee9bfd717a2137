"""Paper table specifications: load and validate `configs/papers/<paper>.yaml`.

A paper config is data, not code: it maps the paper's backbones and benchmarks to our model
configs and evaluation suites at each scale (a benchmark may map to null: no stand-in there), names
the training runs (with, per scale, the paper's own settings: `scale_overrides`), and declares each
table (columns = benchmark x metric or a training cost, rows = runs, plus the numbers the paper
reports), figures and, optionally, its own seeds per scale. See
`configs/papers/dlogp.yaml` for the format. Every validation error is a ValueError naming the file,
the offending key and the valid choices, raised before any job starts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from creditlab.scales import spec_scale

BASE_RUN = "base"
"""Reserved run name: the untrained base model (tiny: warmed up; paper: from the hub)."""

EVAL_METRICS = ("greedy", "avg@k", "pass@k", "pass@1", "replacement_rate")
"""Column metrics read from evaluations. `avg@k` / `pass@k` are symbolic: k is the evaluation's k at
the table's scale. avg@k estimates the same per-sample accuracy whatever k is (only its noise depends on k); pass@k
does not (pass@8 and pass@32 are different quantities), so no paper config uses the symbolic pass@k: a pass@ column
names its k (`pass@16`), per scale where the scales' evaluations draw different k (a column's `metric` may be a
mapping scale -> metric: see `Column.metric_at`)."""

TRAINING_METRICS = ("step_time", "steps_to", "train_mean")
"""Column metrics read from a run's training metrics.jsonl: `step_time` = mean wall time per RL step
(seconds); `train_mean` = the mean over RL steps of the logged metric `key` (e.g. `weight_gini`,
`reward_mean`); `steps_to` = RL steps until the EMA of the training `reward_mean` first reaches the column's
`threshold`. Such a column names no benchmark."""

RELATIVE_MODES = ("percent", "ratio")
"""How a `relative_to` cell compares a row with the reference run: `percent` = 100 (x / x_ref - 1)
(`+2.10%`), `ratio` = x / x_ref (`0.91x`)."""

STEPS_TO_SMOOTHING = 0.6
"""Default EMA factor of a steps_to column (the training-curve figures' smoothing)."""

COMPARISON_METRICS = ("versus",)
"""Column metrics that compare each row with a reference row: `versus` = the paired test of the row's `of` column
against the reference run's (`relative_to`, or the row's own `baseline`), Holm-corrected over every `versus` cell of
the table, shown as "beats <ref>" / "worse than <ref>" / "noise" with the adjusted p (creditlab.tables.build)."""

METRICS = EVAL_METRICS + TRAINING_METRICS + COMPARISON_METRICS

WEIGHTINGS = ("plain", "count")
"""How a column over several suites averages them: plain mean, or weighted by question count."""

_TOP_KEYS = ("paper", "title", "experiment", "backbones", "benchmarks", "runs", "decodes", "tables", "figures",
             "seeds", "analyses", "claims", "scale_overrides")
_ANALYSIS_KEYS = ("kind", "caption", "backbone", "run", "start", "params")
ANALYSIS_STARTS = ("base", "trained")
"""Where an analysis starts: the warmed-up base model, or the final state (model + optimizer) of its run."""
FIGURE_KINDS = ("replacement_curves", "token_histograms", "bars", "token_credit", "scatter")
_FIGURE_KEYS = ("kind", "caption", "table", "x", "y", "backbone", "run", "top", "min_count")
_FIGURE_KIND_KEYS = {
    "replacement_curves": ("kind", "caption", "table", "x", "y"),
    "token_histograms": ("kind", "caption", "backbone", "run"),
    "bars": ("kind", "caption", "table", "y"),
    "scatter": ("kind", "caption", "table", "x", "y"),
    "token_credit": ("kind", "caption", "backbone", "run", "top", "min_count"),
}
"""The keys each figure kind takes (all of them but `caption` required, except token_credit's `top`
(default 15) and `min_count` (default 20))."""
TOKEN_CREDIT_TOP = 15
TOKEN_CREDIT_MIN_COUNT = 20
_REQUIRED_TOP_KEYS = ("paper", "backbones", "benchmarks", "runs", "tables")
_RUN_KEYS = ("method", "overrides", "scale_overrides", "combine")
ALL_RUNS = "*"
"""Key of a paper's `scale_overrides.<scale>` entry that applies to every run of the paper (and to the evaluation of
the base model); the other keys are paper backbones."""
_TABLE_KEYS = ("caption", "columns", "rows", "curves")
_COLUMN_KEYS = ("name", "benchmark", "benchmarks", "metric", "average_of", "weighting", "relative_to", "relative",
                "threshold", "smoothing", "key", "of")
_VERSUS_KEYS = ("name", "metric", "of", "relative_to")
_TRAINING_COLUMN_KEYS = {
    "step_time": ("name", "metric", "relative_to", "relative"),
    "train_mean": ("name", "metric", "key", "relative_to", "relative"),
    "steps_to": ("name", "metric", "threshold", "smoothing", "relative_to", "relative"),
}
"""The keys each training-cost column takes (steps_to: `threshold` required)."""
CLAIM_KINDS = ("better", "best_of", "order", "between", "matched_order")
"""Claim kinds (creditlab.tables.ledger tests them): `better` row > one `over` row; `best_of` row > every `over`
row (Holm); `order` rows[0] > rows[1] > ... (Holm over the links); `between` every `over` row < row < every
`under` row (Holm); `matched_order` series[0] > series[1] > ... (Holm over the links), each series a curve of rows
(one per threshold, say) compared on `column` at matched values of the column `x` (the replacement rate): each
series' `column` interpolated linearly in its measured `x` at common x values inside every series' measured range."""
CLAIM_DIRECTIONS = ("higher", "lower")
_CLAIM_KEYS = ("id", "text", "table", "column", "kind", "backbone", "row", "over", "under", "rows", "direction",
               "series", "x")
_CLAIM_KIND_KEYS = {
    "better": ("row", "over"),
    "best_of": ("row", "over"),
    "order": ("rows",),
    "between": ("row", "over", "under"),
    "matched_order": ("series", "x"),
}
"""The row keys each claim kind requires (the others are refused)."""
_ROW_KEYS = ("label", "backbone", "run", "decode", "paper", "baseline")
_DECODE_KEYS = ("criterion", "threshold", "gamma", "decode_with", "top_k_support")
DECODE_CRITERIA = ("dlogp", "kl", "reverse_kl", "js", "entropy", "random")
DECODE_WITH = ("base", "rl")


@dataclass(frozen=True)
class RunSpec:
    """A training run: a method config plus Hydra overrides (every scale), plus this run's own overrides at some
    scales (`scale_overrides: {paper: [...]}`, applied last: see `PaperSpec.run_overrides`)."""

    name: str
    method: str
    overrides: tuple[str, ...] = ()
    scale_overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()
    combine: tuple[str, ...] = ()
    """Method configs whose credit functions and token filters are added to `method`'s (``combine: [dlogp]``): the
    plan appends them to the run's lists (`creditlab.plan.combination_overrides`); their weights multiply."""

    def overrides_at(self, scale: str) -> tuple[str, ...]:
        """This run's own overrides at `scale` (empty where it has none)."""
        return dict(self.scale_overrides).get(spec_scale(scale), ())


@dataclass(frozen=True)
class Column:
    """A table column: one metric on one or several benchmarks, the average of earlier columns, or a
    training cost.

    Exactly one of `benchmark`, `benchmarks`, `average_of` is set, except for a training-cost column
    (metric in TRAINING_METRICS: step_time, steps_to), which has none. `metric` is one of METRICS for
    benchmark and training columns and None for `average_of` columns (each averaged column keeps its
    own). `weighting` applies when several suites are averaged. `relative_to` (training columns only)
    names a run: the cell then compares the row's value with that run's on the same backbone, as a %
    difference or a ratio (`relative`). `threshold` / `smoothing` (steps_to only): the training-reward
    level to reach and the EMA factor applied to the reward curve first.
    """

    name: str
    benchmark: str | None = None
    benchmarks: tuple[str, ...] | None = None
    metric: str | None = None
    average_of: tuple[str, ...] | None = None
    weighting: str = "plain"
    relative_to: str | None = None
    relative: str = "percent"
    threshold: float | None = None
    smoothing: float | None = None
    key: str | None = None
    """train_mean only: the training metric (a key of the runs' metrics.jsonl) averaged over steps."""
    of: str | None = None
    """versus only: the earlier accuracy column whose per-question values the paired test compares."""
    metric_at: tuple[tuple[str, str], ...] = ()
    """A per-scale binding of an evaluation metric (config ``metric: {paper: pass@16, tiny: pass@8, micro: pass@4,
    smoke: pass@4}``), sorted (scale, metric) pairs; empty = `metric` at every scale. `metric` is then the paper-scale
    one, the metric the column's name and the paper's numbers stand for; `metric_for` / `label_at` give the metric read
    and the name shown at a scale."""

    def metric_for(self, scale: str | None) -> str | None:
        """The metric this column reads at `scale`: its per-scale binding there (the scale itself, else the scale whose
        entries it reads: smoke -> paper), else `metric` (also for scale None)."""
        table = dict(self.metric_at)
        if scale is None or not table:
            return self.metric
        return table.get(scale, table.get(spec_scale(scale), self.metric))

    def label_at(self, scale: str | None) -> str:
        """The column's name as shown at `scale`: `name` where the column reads `metric` there; where a per-scale
        binding reads another k, the name with the paper's k replaced by this scale's (``Pass@16`` -> ``Pass@8``), or,
        when the name does not show the paper's k, the name followed by the metric read (``Best (pass@8)``)."""
        metric = self.metric_for(scale)
        if metric is None or self.metric is None or metric == self.metric:
            return self.name
        (kind, _, n), (kind_here, _, n_here) = self.metric.partition("@"), metric.partition("@")
        shown = re.compile(rf"(?<=@){re.escape(n)}(?![0-9])")
        if n and n_here and kind == kind_here and shown.search(self.name):
            return shown.sub(n_here, self.name)
        return f"{self.name} ({metric})"

    @property
    def is_comparison(self) -> bool:
        """A `versus` column: a claim per row (row vs the reference run on the `of` column)."""
        return self.metric in COMPARISON_METRICS

    @property
    def series_key(self) -> str:
        """The metrics.jsonl key a step_time / train_mean column averages over steps."""
        return "t_step" if self.metric == "step_time" else str(self.key)

    @property
    def is_training(self) -> bool:
        """A column read from the runs' training metrics (no benchmark): step_time, steps_to."""
        return self.metric in TRAINING_METRICS

    @property
    def paper_benchmarks(self) -> tuple[str, ...]:
        """The paper benchmarks of a benchmark column (empty for an `average_of` column)."""
        if self.benchmark is not None:
            return (self.benchmark,)
        return self.benchmarks or ()


@dataclass(frozen=True)
class Row:
    """A table row: a run on a backbone, with the paper's reported numbers by column name."""

    label: str
    backbone: str
    run: str
    paper: dict[str, float] = field(default_factory=dict)
    decode: str | None = None
    """A test-time decoding (paper config ``decodes``) evaluated with the backbone's base model and
    this row's RL run, instead of plain sampling from the run's model."""
    baseline: str | None = None
    """The run this row is compared with in `versus` columns, instead of the column's `relative_to` (e.g. a LoRA
    row against the LoRA baseline); a row of that run must exist on the same backbone."""


@dataclass(frozen=True)
class Claim:
    """A paper's claim about one column of one of its tables, tested by creditlab.tables.ledger.

    Rows are (label, backbone) pairs of the table. `better`: row > over[0]; `best_of`: row > each of over;
    `order`: rows[0] > rows[1] > ...; `between`: each of over < row < each of under. `direction: lower` flips
    every comparison (lower is better, e.g. a step time)."""

    id: str
    text: str
    table: str
    column: str
    kind: str
    row: tuple[str, str] | None = None
    over: tuple[tuple[str, str], ...] = ()
    under: tuple[tuple[str, str], ...] = ()
    rows: tuple[tuple[str, str], ...] = ()
    direction: str = "higher"
    series: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    """matched_order only: (name, rows) per series, in the claimed order (best first)."""
    x: str | None = None
    """matched_order only: the column the series are matched on (the replacement rate)."""

    def series_links(self) -> list[tuple[str, str]]:
        """matched_order: the (better, worse) pairs of series names the claim needs, consecutive in its order."""
        names = [name for name, _ in self.series]
        return list(zip(names[:-1], names[1:]))

    def refs(self) -> list[tuple[str, str]]:
        """Every row the claim reads, in order, without repeats."""
        rows = [r for pair in self.comparisons() for r in pair] + [r for _, rs in self.series for r in rs]
        return list(dict.fromkeys(rows))

    def comparisons(self) -> list[tuple[tuple[str, str], tuple[str, str]]]:
        """The (winner, loser) pairs of rows the claim needs, each `winner > loser` (in `direction`); none for
        matched_order, which compares series of rows (`series_links`)."""
        if self.kind == "matched_order":
            return []
        if self.kind == "order":
            return list(zip(self.rows[:-1], self.rows[1:]))
        assert self.row is not None
        pairs = [(self.row, o) for o in self.over]
        return pairs + [(u, self.row) for u in self.under]


@dataclass(frozen=True)
class DecodeSpec:
    """A test-time decoding of Paper A: selective extrapolation / replacement between base and RL.

    criterion fires on the token proposed by the decoding model (dlogp: Δlog p <= threshold when
    decoding with the base model, >= when decoding with the RL model; others: score >= threshold);
    a fired position is resampled from log-softmax((1 + gamma) log pi_RL - gamma log pi_base).
    ``thresholds`` holds one value per scale (tiny models are far more confident than 7B-32B ones,
    so the paper's tau would almost never fire at tiny scale).
    """

    name: str
    thresholds: tuple[tuple[str, float], ...]
    criterion: str = "dlogp"
    gamma: float = 0.0
    decode_with: str = "base"
    top_k_support: int | None = None

    def threshold(self, scale: str) -> float:
        table = dict(self.thresholds)
        if "*" in table:  # one threshold for every scale
            return table["*"]
        scale = spec_scale(scale)
        if scale not in table:
            raise ValueError(f"decoding {self.name!r} has no threshold for scale {scale!r}; has {sorted(table)}")
        return table[scale]

    def settings(self, scale: str) -> dict[str, Any]:
        """Keyword arguments of creditlab.decoding.extrapolation.make_selective_generate_fn."""
        return {"criterion": self.criterion, "threshold": self.threshold(scale), "gamma": self.gamma,
                "decode_with": self.decode_with, "top_k_support": self.top_k_support}


@dataclass(frozen=True)
class FigureSpec:
    """A paper figure: ``replacement_curves`` plots column ``y`` against column ``x`` of ``table``, one
    line per decoding criterion (rows without a decoding as reference lines); ``token_histograms``
    plots Δlog p / entropy / KL histograms of ``run``'s outputs vs its base model's on ``backbone``;
    ``bars`` plots column ``y`` of ``table``, one bar per row with its 95% CI; ``token_credit`` plots
    the ``top`` tokens with the highest and lowest mean credit weight (among tokens generated at least
    ``min_count`` times) of ``run`` on ``backbone``, from the run's token_credit.json."""

    name: str
    kind: str
    caption: str = ""
    table: str | None = None
    x: str | None = None
    y: str | None = None
    backbone: str | None = None
    run: str | None = None
    top: int = TOKEN_CREDIT_TOP
    min_count: int = TOKEN_CREDIT_MIN_COUNT


@dataclass(frozen=True)
class AnalysisSpec:
    """A post-hoc analysis of RL updates (creditlab.analysis: flipping, coupling, value, ...): it builds
    the local trainer of ``run`` on ``backbone`` (the run's config), starting from the base model or the
    run's trained state, and calls the kind's ``analyze(ctx, **params)``; it writes a JSON, a Markdown
    table and a PNG figure. ``params`` are checked against the kind's signature before any job starts."""

    name: str
    kind: str
    backbone: str
    run: str
    start: str = "base"
    caption: str = ""
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return {k: _thaw(v) for k, v in self.params}


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Mapping):
        return tuple((str(k), _freeze(x)) for k, x in v.items())
    return v


def _thaw(v: Any) -> Any:
    return list(_thaw(x) for x in v) if isinstance(v, tuple) else v


@dataclass(frozen=True)
class TableSpec:
    """One table of a paper."""

    paper: str
    name: str
    caption: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    curves: tuple[str, ...] = ("reward_mean", "response_len_mean", "entropy_mean")
    """Training metrics (keys of the runs' metrics.jsonl) plotted in the table's training-curves figure."""

    def column(self, name: str) -> Column:
        """The column called `name` (ValueError naming the choices otherwise)."""
        for col in self.columns:
            if col.name == name:
                return col
        raise ValueError(
            f"table {self.paper}/{self.name}: unknown column {name!r}; "
            f"choices: {[c.name for c in self.columns]}"
        )

    def leaves(self, column: Column, scale: str | None = None) -> list[tuple[str, str]]:
        """The (paper benchmark, symbolic metric) pairs a column averages over, in order: each column's metric at
        `scale` (its per-scale binding, `Column.metric_for`), or its paper-scale `metric` when `scale` is None.

        An `average_of` column expands its referenced columns recursively; a pair appearing
        twice is counted once. A training column (step_time) has none.
        """
        if column.is_comparison:
            assert column.of is not None
            return self.leaves(self.column(column.of), scale)
        if column.average_of is None:
            metric = column.metric_for(scale)
            assert metric is not None
            return [(bench, metric) for bench in column.paper_benchmarks]
        pairs: list[tuple[str, str]] = []
        for ref in column.average_of:
            for pair in self.leaves(self.column(ref), scale):
                if pair not in pairs:
                    pairs.append(pair)
        return pairs


@dataclass(frozen=True)
class PaperSpec:
    """A paper: its backbone and benchmark mappings per scale, its runs and its tables.

    A benchmark may have no stand-in at a scale (``benchmarks: {AIME26: {tiny: null, ...}}``): there,
    a column on it alone is omitted and a column over several benchmarks averages the mapped ones
    (see `leaves_at`, `columns_at`).
    """

    paper: str
    title: str
    experiment: str
    backbones: dict[str, dict[str, str]]
    benchmarks: dict[str, dict[str, str | None]]
    runs: dict[str, RunSpec]
    tables: dict[str, TableSpec]
    source: str = ""
    decodes: dict[str, DecodeSpec] = field(default_factory=dict)
    figures: dict[str, FigureSpec] = field(default_factory=dict)
    analyses: dict[str, AnalysisSpec] = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()
    """The paper's headline claims, tested in its reproduction ledger (creditlab.tables.ledger)."""
    seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The paper's own seeds per scale (``seeds: {tiny: [0, 1, 2]}``); a scale not listed uses the
    pipeline's (see `seeds_at`)."""
    scale_overrides: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    """Per scale, Hydra overrides of every run of the paper (key ``"*"``) and of the runs on one paper backbone
    (key = that backbone): the paper's own hyperparameters at that scale (``scale_overrides: {paper: {"*": [...]}}``),
    applied before each run's own overrides. See `run_overrides`."""
    built: frozenset[str] | None = None
    """The tables this pipeline builds (the pipeline config's ``tables``: ``[paper/table, ...]``); None = all of them.
    A table left out is no default target and not in the paper's ledger (`built_at`), nor are the figures drawn from it;
    its claims are reported as not built, never tested."""

    def run_overrides(self, run: str, paper_backbone: str, scale: str, combination: tuple[str, ...] = ()
                      ) -> tuple[str, ...]:
        """The Hydra overrides of `run` on `paper_backbone` at `scale`, in the order they apply (the last value of a
        key wins): the paper's `scale_overrides.<scale>` for every run (``*``), then for `paper_backbone` (the paper's
        settings at that scale), then `combination` (the overrides that add the run's `combine` methods' credit
        functions and filters: `creditlab.plan.combination_overrides`), then the run's `overrides` (every scale, so
        ``method.credit.1.alpha=...`` addresses the combined list), then the run's own
        `scale_overrides.<scale>`. The base model (`run` = ``base``) gets the paper's entries only (its evaluation
        settings). A scale without `scale_overrides` adds nothing: there, a run's overrides are its `overrides`.
        """
        per_scale = self.scale_overrides.get(spec_scale(scale), {})
        paper_level = per_scale.get(ALL_RUNS, ()) + per_scale.get(paper_backbone, ())
        if run == BASE_RUN:
            return paper_level
        spec = self.runs[run]
        return paper_level + tuple(combination) + spec.overrides + spec.overrides_at(scale)

    def seeds_at(self, scale: str, default: Iterable[int]) -> list[int]:
        """The seeds this paper's tables and figures use at `scale`: its own `seeds` there, else `default`
        (the pipeline's)."""
        return list(self.seeds[scale]) if scale in self.seeds else [int(s) for s in default]  # smoke: not paper's

    def backbone_for(self, paper_backbone: str, scale: str) -> str:
        """The model config name standing in for `paper_backbone` at `scale`."""
        return _lookup(self.backbones, "backbones", paper_backbone, scale, self.source)

    def suite_for(self, benchmark: str, scale: str) -> str:
        """The evaluation suite standing in for the paper's `benchmark` at `scale`.

        ValueError if the benchmark has no stand-in there (mapped to null); see `has_suite`.
        """
        suite = _lookup(self.benchmarks, "benchmarks", benchmark, scale, self.source)
        if suite is None:
            mapped = sorted(s for s, v in self.benchmarks[benchmark].items() if v is not None)
            raise ValueError(
                f"{self.source}: benchmarks.{benchmark} has no stand-in suite at scale {scale!r} (null); "
                f"scales where it has one: {mapped} (check PaperSpec.has_suite first)"
            )
        return suite

    def has_suite(self, benchmark: str, scale: str) -> bool:
        """Whether the paper's `benchmark` has a stand-in suite at `scale` (ValueError for an unknown
        benchmark or scale, as suite_for)."""
        return _lookup(self.benchmarks, "benchmarks", benchmark, scale, self.source) is not None

    def leaves_at(self, table: str, column: Column | str, scale: str
                  ) -> tuple[list[tuple[str, str]], list[str]]:
        """(mapped (benchmark, metric) pairs, benchmarks without a stand-in) of a column at `scale`; each metric is the
        one its column reads at `scale` (`Column.metric_for`: a per-scale binding such as ``pass@16`` at paper scale,
        ``pass@8`` at tiny)."""
        spec = self.table(table)
        col = spec.column(column) if isinstance(column, str) else column
        leaves = spec.leaves(col, scale)
        mapped = [(b, m) for b, m in leaves if self.has_suite(b, scale)]
        unmapped = list(dict.fromkeys(b for b, _ in leaves if not self.has_suite(b, scale)))
        return mapped, unmapped

    def columns_at(self, table: str, scale: str) -> list[Column]:
        """The columns of `table` shown at `scale`: training columns, and benchmark / average columns
        with at least one benchmark that has a stand-in there."""
        spec = self.table(table)
        return [c for c in spec.columns if c.is_training or self.leaves_at(table, c, scale)[0]]

    def omitted_columns(self, table: str, scale: str) -> list[Column]:
        """The columns of `table` left out at `scale` (none of their benchmarks has a stand-in)."""
        shown = {c.name for c in self.columns_at(table, scale)}
        return [c for c in self.table(table).columns if c.name not in shown]

    def needs_evals(self, table: str, scale: str) -> bool:
        """Whether `table` at `scale` reads any evaluation (a shown column with a mapped benchmark)."""
        return any(not c.is_training for c in self.columns_at(table, scale))

    def needs_training_metrics(self, table: str, scale: str) -> bool:
        """Whether `table` at `scale` reads the runs' training metrics (a step_time column)."""
        return any(c.is_training for c in self.columns_at(table, scale))

    def tables_at(self, scale: str) -> list[str]:
        """The tables with at least one column at `scale` (the others cannot be built there)."""
        return [t for t in self.tables if self.columns_at(t, scale)]

    def built_at(self, scale: str) -> list[str]:
        """The tables the pipeline builds at `scale`: those of `tables_at` it chose (`built`; all when None). The runs
        of every table stay planned, so a table left out can still be built as a target."""
        return [t for t in self.tables_at(scale) if self.built is None or t in self.built]

    def figures_at(self, scale: str) -> list[str]:
        """The figures that can be drawn at `scale`: table-based ones need their table and columns."""
        out = []
        for name, fig in self.figures.items():
            if fig.table is not None:
                if fig.table not in self.built_at(scale):
                    continue
                shown = {c.name for c in self.columns_at(fig.table, scale)}
                if not shown or any(c is not None and c not in shown for c in (fig.x, fig.y)):
                    continue
            out.append(name)
        return out

    def table(self, name: str) -> TableSpec:
        """The table called `name` (ValueError naming the choices otherwise)."""
        if name not in self.tables:
            raise ValueError(
                f"{self.source}: paper {self.paper!r} has no table {name!r}; "
                f"choices: {sorted(self.tables)}"
            )
        return self.tables[name]


def _lookup(mapping: dict[str, dict[str, Any]], what: str, key: str, scale: str,
            source: str) -> Any:
    """mapping[key][scale] (`scale` read as creditlab.scales.spec_scale says) with a ValueError naming the valid
    choices on either miss."""
    scale = spec_scale(scale)
    if key not in mapping:
        raise ValueError(f"{source}: unknown {what} entry {key!r}; choices: {sorted(mapping)}")
    if scale not in mapping[key]:
        raise ValueError(
            f"{source}: {what}.{key} has no mapping for scale {scale!r}; "
            f"choices: {sorted(mapping[key])}"
        )
    return mapping[key][scale]


_FIXED_K = re.compile(r"pass@[1-9][0-9]*")
"""pass@N at a fixed N (`pass@4`: ARCA's table; the unbiased estimator from the evaluation's k >= N samples),
besides the symbolic metrics. avg@N is not one: avg@k is the mean over all k samples, whatever the scale."""


def is_metric(metric: Any) -> bool:
    return isinstance(metric, str) and (metric in METRICS or bool(_FIXED_K.fullmatch(metric)))


def _check_metric(chk: "_Checker", metric: Any, where: str) -> str:
    if not is_metric(metric):
        chk.fail(where, f"unknown metric {metric!r} (or pass@N with a fixed N)", METRICS)
    return metric


def resolve_metric(metric: str, k: int) -> str:
    """Concrete metric name for a symbolic one: resolve_metric("avg@k", 8) == "avg@8"
    (other metrics, step_time and fixed-k ones like pass@4 included, are returned unchanged)."""
    if not is_metric(metric):
        raise ValueError(f"unknown metric {metric!r}; choices: {list(METRICS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return metric.replace("@k", f"@{k}")


# ----------------------------------------------------------------------------------------------
# validation helpers: each raises ValueError("<file>: <where>: <problem>; choices: [...]")


class _Checker:
    """Builds error messages that name the file being validated."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, choices: Iterable[str] | None = None) -> NoReturn:
        """Raise the ValueError for `problem` at key path `where`."""
        msg = f"{self.source}: {where}: {problem}"
        if choices is not None:
            msg += f"; choices: {list(choices)}"
        raise ValueError(msg)

    def keys(self, data: Any, where: str, allowed: tuple[str, ...],
             required: Iterable[str]) -> dict:
        """Check that `data` is a mapping with only `allowed` keys and all `required` ones."""
        if not isinstance(data, Mapping):
            self.fail(where, f"expected a mapping, got {type(data).__name__}")
        for key in data:
            if key not in allowed:
                self.fail(f"{where}.{key}" if where else str(key), f"unknown key {key!r}", allowed)
        for key in required:
            if key not in data:
                self.fail(where or "top level", f"missing required key {key!r}", allowed)
        return dict(data)

    def string(self, value: Any, where: str) -> str:
        """Check that `value` is a non-empty string."""
        if not isinstance(value, str) or not value:
            self.fail(where, f"expected a non-empty string, got {value!r}")
        return value

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        """Check that `value` is a non-empty list of non-empty strings."""
        if not isinstance(value, list) or not value:
            self.fail(where, f"expected a non-empty list of strings, got {value!r}")
        return tuple(self.string(v, f"{where}[{i}]") for i, v in enumerate(value))

    def choice(self, value: Any, where: str, choices: Iterable[str]) -> str:
        """Check that `value` is one of `choices`."""
        choices = list(choices)
        if value not in choices:
            self.fail(where, f"unknown value {value!r}", choices)
        return value


def _parse_scale_map(chk: _Checker, data: Any, what: str, allow_null: bool = False
                     ) -> dict[str, dict[str, Any]]:
    """Parse `backbones` / `benchmarks`: paper name -> {scale: our name}, same scales for all.

    With `allow_null` (benchmarks) a scale may map to null: no stand-in at that scale.
    """
    if not isinstance(data, Mapping) or not data:
        chk.fail(what, "expected a non-empty mapping of paper name -> {scale: name}")
    parsed: dict[str, dict[str, str]] = {}
    for name, per_scale in data.items():
        where = f"{what}.{name}"
        if not isinstance(per_scale, Mapping) or not per_scale:
            chk.fail(where, f"expected a non-empty mapping scale -> name, got {per_scale!r}")
        parsed[str(name)] = {str(s): None if (v is None and allow_null) else chk.string(v, f"{where}.{s}")
                             for s, v in per_scale.items()}
    scales = {frozenset(m) for m in parsed.values()}
    if len(scales) > 1:
        union = sorted(set().union(*scales))
        for name, per_scale in parsed.items():
            missing = sorted(set(union) - set(per_scale))
            if missing:
                chk.fail(f"{what}.{name}", f"no mapping for scale(s) {missing}", union)
    return parsed


def _parse_decodes(chk: _Checker, data: Any) -> dict[str, DecodeSpec]:
    """Parse `decodes`: name -> {criterion, threshold (number or scale -> number), gamma, decode_with,
    top_k_support}."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        chk.fail("decodes", "expected a mapping of decoding name -> settings")
    decodes: dict[str, DecodeSpec] = {}
    for name, body in data.items():
        where = f"decodes.{name}"
        body = chk.keys(body, where, _DECODE_KEYS, required=("threshold",))
        criterion = chk.choice(body.get("criterion", "dlogp"), f"{where}.criterion", DECODE_CRITERIA)
        decode_with = chk.choice(body.get("decode_with", "base"), f"{where}.decode_with", DECODE_WITH)
        raw = body["threshold"]
        try:
            thresholds = ({str(k): float(v) for k, v in raw.items()} if isinstance(raw, Mapping)
                          else {"*": float(raw)})
            gamma = float(body.get("gamma", 0.0))
            top_k = None if body.get("top_k_support") is None else int(body["top_k_support"])
        except (TypeError, ValueError):
            chk.fail(where, "threshold must be a number or a mapping scale -> number, gamma a number and "
                     f"top_k_support an integer; got {dict(body)}")
        decodes[str(name)] = DecodeSpec(str(name), tuple(sorted(thresholds.items())), criterion, gamma,
                                        decode_with, top_k)
    return decodes


def _parse_override_list(chk: _Checker, overrides: Any, where: str) -> tuple[str, ...]:
    """A list of Hydra `key=value` override strings (None = none)."""
    overrides = overrides or []
    if not isinstance(overrides, list):
        chk.fail(where, f"expected a list of key=value strings, got {overrides!r}")
    for i, item in enumerate(overrides):
        if not isinstance(item, str) or "=" not in item:
            chk.fail(f"{where}[{i}]", f"expected a key=value string, got {item!r}")
    return tuple(overrides)


def _parse_run_scale_overrides(chk: _Checker, data: Any, where: str, scales: list[str]
                               ) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A run's `scale_overrides`: scale -> list of key=value strings."""
    if data is None:
        return ()
    if not isinstance(data, Mapping) or not data:
        chk.fail(where, f"expected a mapping scale -> list of key=value strings, got {data!r}", scales)
    out = []
    for scale, overrides in data.items():
        chk.choice(scale, f"{where}.{scale}", scales)
        out.append((str(scale), _parse_override_list(chk, overrides, f"{where}.{scale}")))
    return tuple(out)


def _parse_scale_overrides(chk: _Checker, data: Any, scales: list[str], backbones: Mapping[str, Any]
                           ) -> dict[str, dict[str, tuple[str, ...]]]:
    """Parse the paper's `scale_overrides`: scale -> {"*" | paper backbone -> list of key=value strings}."""
    if data is None:
        return {}
    targets = [ALL_RUNS, *backbones]
    if not isinstance(data, Mapping) or not data:
        chk.fail("scale_overrides", f"expected a mapping scale -> {{'*' | paper backbone: [key=value, ...]}}, "
                 f"got {data!r}", scales)
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for scale, per_target in data.items():
        where = f"scale_overrides.{scale}"
        chk.choice(scale, where, scales)
        if not isinstance(per_target, Mapping) or not per_target:
            chk.fail(where, f"expected a mapping '*' | paper backbone -> list of key=value strings, got "
                     f"{per_target!r}", targets)
        out[str(scale)] = {}
        for target, overrides in per_target.items():
            chk.choice(target, f"{where}.{target}", targets)
            out[str(scale)][str(target)] = _parse_override_list(chk, overrides, f"{where}.{target}")
    return out


def _parse_runs(chk: _Checker, data: Any, scales: list[str]) -> dict[str, RunSpec]:
    """Parse `runs`: run name -> {method, overrides, scale_overrides}; `base` is reserved."""
    if not isinstance(data, Mapping):
        chk.fail("runs", "expected a mapping of run name -> {method, overrides}")
    runs: dict[str, RunSpec] = {}
    for name, body in data.items():
        where = f"runs.{name}"
        if name == BASE_RUN:
            chk.fail(where, f"{BASE_RUN!r} is reserved for the untrained base model")
        body = chk.keys(body, where, _RUN_KEYS, required=("method",))
        overrides = _parse_override_list(chk, body.get("overrides"), f"{where}.overrides")
        method = chk.string(body["method"], f"{where}.method")
        combine = chk.strings(body["combine"], f"{where}.combine") if body.get("combine") is not None else ()
        if method in combine or len(set(combine)) != len(combine):
            chk.fail(f"{where}.combine", f"lists a method twice (the run's method is {method!r}): {list(combine)}")
        runs[str(name)] = RunSpec(str(name), method, overrides,
                                  _parse_run_scale_overrides(chk, body.get("scale_overrides"),
                                                             f"{where}.scale_overrides", scales), combine)
    return runs


def _parse_column(chk: _Checker, data: Any, where: str, paper: Mapping[str, Any],
                  earlier: list[Column]) -> Column:
    """Parse one column; `earlier` are the columns before it."""
    benchmarks = paper["benchmarks"]
    names = [c.name for c in earlier]
    body = chk.keys(data, where, _COLUMN_KEYS, required=("name",))
    name = chk.string(body["name"], f"{where}.name")
    where = f"{where} ({name})"
    if name in names:
        chk.fail(f"{where}.name", f"duplicate column name {name!r}", names)
    metric_at: tuple[tuple[str, str], ...] = ()
    if isinstance(body.get("metric"), Mapping):  # a per-scale binding: parsed here, `metric` = its paper-scale value
        metric, metric_at = _parse_metric_at(chk, body["metric"], f"{where}.metric", paper)
        body = {**body, "metric": metric}
    kinds = [k for k in ("benchmark", "benchmarks", "average_of") if k in body]
    if "metric" in body:  # an unknown metric first: it decides which keys the column takes
        _check_metric(chk, body["metric"], f"{where}.metric")
    if body.get("metric") in TRAINING_METRICS:
        return _parse_training_column(chk, body, where, name, kinds, paper)
    if body.get("metric") in COMPARISON_METRICS:
        return _parse_versus_column(chk, body, where, name, paper, earlier)
    if "of" in body:
        chk.fail(f"{where}.of", "of applies to a versus column only", ["metric: versus"])
    for key in ("relative_to", "relative", "threshold", "smoothing", "key"):
        if key in body:
            owners = TRAINING_METRICS if key.startswith("relative") else (
                ("train_mean",) if key == "key" else ("steps_to",))
            kind = "training-cost" if key.startswith("relative") else ("train_mean" if key == "key" else "steps_to")
            chk.fail(f"{where}.{key}", f"{key} applies to a {kind} column only", [f"metric: {m}" for m in owners])
    if len(kinds) != 1:
        chk.fail(where, f"a column needs exactly one of benchmark / benchmarks / average_of "
                 f"(only a {'/'.join(TRAINING_METRICS)} column has none), got {kinds}",
                 ("benchmark", "benchmarks", "average_of"))
    weighting = chk.choice(body.get("weighting", "plain"), f"{where}.weighting", WEIGHTINGS)
    if "average_of" in body:
        if "metric" in body:
            chk.fail(f"{where}.metric", "an average_of column takes the metrics of its columns")
        refs = chk.strings(body["average_of"], f"{where}.average_of")
        for ref in refs:
            if ref not in names:
                chk.fail(f"{where}.average_of", f"{ref!r} is not a column defined before {name!r}",
                         names)
            if earlier[names.index(ref)].is_training or earlier[names.index(ref)].is_comparison:
                chk.fail(f"{where}.average_of", f"{ref!r} is a training-cost column or a versus column, not an accuracy",
                         [c.name for c in earlier if not (c.is_training or c.is_comparison)])
        return Column(name, average_of=refs, weighting=weighting)
    if "metric" not in body:
        chk.fail(where, "missing required key 'metric'", METRICS)
    metric = _check_metric(chk, body["metric"], f"{where}.metric")
    if "benchmark" in body:
        bench = chk.choice(body["benchmark"], f"{where}.benchmark", benchmarks)
        return Column(name, benchmark=bench, metric=metric, weighting=weighting, metric_at=metric_at)
    benches = chk.strings(body["benchmarks"], f"{where}.benchmarks")
    for i, bench in enumerate(benches):
        chk.choice(bench, f"{where}.benchmarks[{i}]", benchmarks)
    return Column(name, benchmarks=benches, metric=metric, weighting=weighting, metric_at=metric_at)


def _parse_metric_at(chk: _Checker, data: Mapping, where: str, paper: Mapping[str, Any]
                     ) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A column's per-scale metric binding ``{paper: pass@16, tiny: pass@8, micro: pass@4, smoke: pass@4}``: one
    evaluation metric of one kind (pass@N at every scale, say) for every scale of the paper's backbones, `smoke`
    optional (it reads the paper-scale one otherwise). Returns (the paper-scale metric: the one the column's name and
    the paper's numbers stand for, the sorted (scale, metric) pairs)."""
    from creditlab.scales import SCALES

    scales = sorted({s for per_scale in paper["backbones"].values() for s in per_scale})
    for scale in data:
        chk.choice(scale, f"{where}.{scale}", SCALES)
    missing = [s for s in scales if s not in data]
    if missing:
        chk.fail(where, f"a per-scale metric needs every scale of the paper's backbones; missing {missing}", scales)
    kinds = set()
    for scale, metric in data.items():
        _check_metric(chk, metric, f"{where}.{scale}")
        if metric not in EVAL_METRICS and not _FIXED_K.fullmatch(metric):
            chk.fail(f"{where}.{scale}", f"a per-scale metric binds an evaluation metric, got {metric!r}",
                     [*EVAL_METRICS, "pass@N"])
        kinds.add(metric.partition("@")[0] if "@" in metric else metric)
    if len(kinds) != 1:
        chk.fail(where, f"a per-scale metric is one metric at each scale's k, got several kinds {sorted(kinds)}: "
                 f"{dict(data)}")
    paper_metric = data.get("paper", data[scales[0]] if scales else next(iter(data.values())))
    return str(paper_metric), tuple(sorted((str(s), str(m)) for s, m in data.items()))


def _parse_versus_column(chk: _Checker, body: dict, where: str, name: str, paper: Mapping[str, Any],
                         earlier: list[Column]) -> Column:
    """A versus column: `of` (an earlier accuracy column) and `relative_to` (the reference run), nothing else."""
    for key in body:
        if key not in _VERSUS_KEYS:
            chk.fail(f"{where}.{key}", f"a versus column takes no key {key!r}", _VERSUS_KEYS)
    for key in ("of", "relative_to"):
        if key not in body:
            chk.fail(where, f"a versus column needs {key!r} (of: the accuracy column tested; relative_to: the "
                     f"reference run)", _VERSUS_KEYS)
    accuracy = [c.name for c in earlier if not (c.is_training or c.is_comparison)]
    of = chk.choice(body["of"], f"{where}.of", accuracy)
    relative_to = chk.choice(body["relative_to"], f"{where}.relative_to", paper["runs"])
    return Column(name, metric=body["metric"], relative_to=relative_to, of=of)


def _parse_training_column(chk: _Checker, body: dict, where: str, name: str, kinds: list[str],
                           paper: Mapping[str, Any]) -> Column:
    """A training-cost column (step_time, steps_to): no benchmark, no weighting, optional relative_to
    <run> and relative (percent | ratio); steps_to needs a threshold and takes a smoothing."""
    metric = body["metric"]
    allowed = _TRAINING_COLUMN_KEYS[metric]
    if kinds:
        chk.fail(f"{where}.{kinds[0]}", f"a {metric} column is a training cost of the row's run and "
                 f"takes no benchmark / benchmarks / average_of", allowed)
    if "weighting" in body:
        chk.fail(f"{where}.weighting", f"a {metric} column averages no suites", allowed)
    for key in body:
        if key not in allowed:
            chk.fail(f"{where}.{key}", f"a {metric} column takes no key {key!r}", allowed)
    relative_to = None
    if body.get("relative_to") is not None:
        relative_to = chk.choice(body["relative_to"], f"{where}.relative_to", paper["runs"])
    relative = "percent"
    if "relative" in body:
        relative = chk.choice(body["relative"], f"{where}.relative", RELATIVE_MODES)
        if relative_to is None:
            chk.fail(f"{where}.relative", "relative (percent | ratio) needs relative_to: <run>", paper["runs"])
    threshold = smoothing = None
    if metric == "steps_to":
        if "threshold" not in body:
            chk.fail(where, "a steps_to column needs a threshold (the training reward level to reach, "
                     "e.g. 0.7)", allowed)
        threshold = _finite_number(chk, body["threshold"], f"{where}.threshold")
        smoothing = _finite_number(chk, body.get("smoothing", STEPS_TO_SMOOTHING), f"{where}.smoothing")
        if not 0.0 <= smoothing < 1.0:
            chk.fail(f"{where}.smoothing", f"expected an EMA factor in [0, 1) (0 = no smoothing), got {smoothing!r}")
    key = None
    if metric == "train_mean":
        if "key" not in body:
            chk.fail(where, "a train_mean column needs a key (the training metric to average over steps, "
                     "e.g. weight_gini)", allowed)
        key = chk.string(body["key"], f"{where}.key")
    return Column(name, metric=metric, relative_to=relative_to, relative=relative, threshold=threshold,
                  smoothing=smoothing, key=key)


def _finite_number(chk: _Checker, value: Any, where: str) -> float:
    """Check that `value` is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        chk.fail(where, f"expected a finite number, got {value!r}")
    return float(value)


def _check_relative_to(chk: _Checker, where: str, columns: list[Column], rows: list[Row]) -> None:
    """A relative_to column needs, on the backbone of every trained row, a row of the reference run."""
    for i, col in enumerate(columns):
        if col.relative_to is None:
            continue
        for row in rows:
            if row.run == BASE_RUN:
                continue
            if not any(r.run == col.relative_to and r.backbone == row.backbone for r in rows):
                runs = _unique_list(r.run for r in rows if r.backbone == row.backbone and r.run != BASE_RUN)
                chk.fail(f"{where}.columns[{i}] ({col.name}).relative_to",
                         f"no row of run {col.relative_to!r} on backbone {row.backbone!r} (row "
                         f"{row.label!r}) to compare with", runs)


def _unique_list(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _parse_paper_numbers(chk: _Checker, data: Any, where: str,
                         columns: list[str]) -> dict[str, float]:
    """Parse a row's `paper` numbers: column name -> number (null = not reported, dropped)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        chk.fail(where, f"expected a mapping column -> number, got {data!r}")
    numbers: dict[str, float] = {}
    for col, value in data.items():
        chk.choice(col, f"{where}.{col}", columns)
        if value is None:
            continue
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value):
            chk.fail(f"{where}.{col}", f"expected a number or null, got {value!r}")
        numbers[str(col)] = float(value)
    return numbers


def _parse_row(chk: _Checker, data: Any, where: str, paper: Mapping[str, Any],
               columns: list[str]) -> Row:
    """Parse one row against the paper's backbones, runs and the table's columns."""
    body = chk.keys(data, where, _ROW_KEYS, required=("label", "backbone", "run"))
    label = chk.string(body["label"], f"{where}.label")
    where = f"{where} ({label})"
    backbone = chk.choice(body["backbone"], f"{where}.backbone", paper["backbones"])
    run = chk.choice(body["run"], f"{where}.run", [BASE_RUN, *paper["runs"]])
    numbers = _parse_paper_numbers(chk, body.get("paper"), f"{where}.paper", columns)
    baseline = None
    if body.get("baseline") is not None:
        baseline = chk.choice(body["baseline"], f"{where}.baseline", paper["runs"])
    decode = None
    if body.get("decode") is not None:
        decode = chk.choice(body["decode"], f"{where}.decode", paper["decodes"])
        if run == BASE_RUN:
            chk.fail(f"{where}.decode", "a decoding needs a trained RL run, not the base model", paper["runs"])
    return Row(label, backbone, run, numbers, decode, baseline)


def _parse_table(chk: _Checker, paper_name: str, name: str, data: Any,
                 paper: Mapping[str, Any]) -> TableSpec:
    """Parse one table: caption, columns (in order), rows."""
    where = f"tables.{name}"
    body = chk.keys(data, where, _TABLE_KEYS, required=("columns", "rows"))
    if not isinstance(body["columns"], list) or not body["columns"]:
        chk.fail(f"{where}.columns", "expected a non-empty list of columns")
    if not isinstance(body["rows"], list) or not body["rows"]:
        chk.fail(f"{where}.rows", "expected a non-empty list of rows")
    columns: list[Column] = []
    for i, col in enumerate(body["columns"]):
        columns.append(_parse_column(chk, col, f"{where}.columns[{i}]", paper, columns))
    names = [c.name for c in columns]
    rows: list[Row] = []
    seen: set[tuple[str, str]] = set()
    for i, row_data in enumerate(body["rows"]):
        row = _parse_row(chk, row_data, f"{where}.rows[{i}]", paper, names)
        if (row.label, row.backbone) in seen:
            chk.fail(f"{where}.rows[{i}]", f"duplicate row (label={row.label!r}, "
                     f"backbone={row.backbone!r})", [f"{r.label}/{r.backbone}" for r in rows])
        seen.add((row.label, row.backbone))
        rows.append(row)
    _check_relative_to(chk, where, columns, rows)
    for i, row in enumerate(rows):
        if row.baseline is not None and not any(r.run == row.baseline and r.backbone == row.backbone for r in rows):
            chk.fail(f"{where}.rows[{i}] ({row.label}).baseline", f"no row of run {row.baseline!r} on backbone "
                     f"{row.backbone!r} to compare with", _unique_list(r.run for r in rows if r.backbone == row.backbone))
        if row.baseline is not None and not any(c.is_comparison for c in columns):
            chk.fail(f"{where}.rows[{i}] ({row.label}).baseline", "baseline applies to versus columns, and the table "
                     "has none")
    caption = " ".join(str(body.get("caption") or "").split())
    extra = {"curves": chk.strings(body["curves"], f"{where}.curves")} if "curves" in body else {}
    return TableSpec(paper_name, str(name), caption, tuple(columns), tuple(rows), **extra)


def parse_paper(data: Any, source: str) -> PaperSpec:
    """Validate the parsed YAML `data` of a paper config; `source` names it in error messages."""
    chk = _Checker(source)
    body = chk.keys(data, "", _TOP_KEYS, required=_REQUIRED_TOP_KEYS)
    paper = chk.string(body["paper"], "paper")
    backbones = _parse_scale_map(chk, body["backbones"], "backbones")
    benchmarks = _parse_scale_map(chk, body["benchmarks"], "benchmarks", allow_null=True)
    scales = sorted({s for per_scale in backbones.values() for s in per_scale})
    runs = _parse_runs(chk, body["runs"], scales)
    decodes = _parse_decodes(chk, body.get("decodes"))
    context = {"backbones": backbones, "benchmarks": benchmarks, "runs": runs, "decodes": decodes}
    if not isinstance(body["tables"], Mapping) or not body["tables"]:
        chk.fail("tables", "expected a non-empty mapping of table name -> table")
    tables = {str(name): _parse_table(chk, paper, str(name), tbl, context)
              for name, tbl in body["tables"].items()}
    return PaperSpec(
        paper=paper,
        title=str(body.get("title") or paper),
        experiment=chk.string(body.get("experiment", paper), "experiment"),
        backbones=backbones,
        benchmarks=benchmarks,
        runs=runs,
        tables=tables,
        source=source,
        decodes=decodes,
        figures=_parse_figures(chk, body.get("figures"), tables, context),
        analyses=_parse_analyses(chk, body.get("analyses"), context),
        seeds=_parse_seeds(chk, body.get("seeds"), scales),
        claims=_parse_claims(chk, body.get("claims"), tables),
        scale_overrides=_parse_scale_overrides(chk, body.get("scale_overrides"), scales, backbones),
    )


def _parse_claims(chk: _Checker, data: Any, tables: Mapping[str, TableSpec]) -> tuple[Claim, ...]:
    """Parse `claims`: a list of {id, text, table, column, kind, [backbone], row / over / under / rows,
    [direction]}; every table, column, row and kind checked (errors name the choices)."""
    if data is None:
        return ()
    if not isinstance(data, list):
        chk.fail("claims", f"expected a list of claims, got {type(data).__name__}")
    claims: list[Claim] = []
    for i, item in enumerate(data):
        where = f"claims[{i}]"
        body = chk.keys(item, where, _CLAIM_KEYS, required=("id", "text", "table", "column", "kind"))
        cid = chk.string(body["id"], f"{where}.id")
        where = f"{where} ({cid})"
        if cid in [c.id for c in claims]:
            chk.fail(f"{where}.id", f"duplicate claim id {cid!r}", [c.id for c in claims])
        text = " ".join(chk.string(body["text"], f"{where}.text").split())
        table = chk.choice(body["table"], f"{where}.table", tables)
        spec = tables[table]
        column = chk.choice(body["column"], f"{where}.column", [c.name for c in spec.columns])
        if spec.column(column).is_comparison:
            chk.fail(f"{where}.column", "a versus column is itself a set of tested claims; claim the column it tests",
                     [c.name for c in spec.columns if not c.is_comparison])
        if spec.column(column).metric == "steps_to":
            chk.fail(f"{where}.column", "a steps_to column cannot be tested (one value per seed)",
                     [c.name for c in spec.columns if c.metric != "steps_to"])
        kind = chk.choice(body["kind"], f"{where}.kind", CLAIM_KINDS)
        needed = _CLAIM_KIND_KEYS[kind]
        for key in ("row", "over", "under", "rows", "series", "x"):
            if key in body and key not in needed:
                chk.fail(f"{where}.{key}", f"a {kind} claim takes no {key!r}", needed)
            if key in needed and key not in body:
                chk.fail(where, f"a {kind} claim needs {key!r}", needed)
        direction = chk.choice(body.get("direction", "higher"), f"{where}.direction", CLAIM_DIRECTIONS)
        backbones = _unique_list(r.backbone for r in spec.rows)
        backbone = chk.choice(body["backbone"], f"{where}.backbone", backbones) if "backbone" in body else None

        def ref(label: Any, at: str) -> tuple[str, str]:
            matches = [r for r in spec.rows if r.label == label and backbone in (None, r.backbone)]
            if len(matches) == 1:
                return (matches[0].label, matches[0].backbone)
            choices = _unique_list(r.label for r in spec.rows if backbone in (None, r.backbone))
            if not matches:
                chk.fail(at, f"unknown row {label!r} in table {table!r}"
                         + (f" on backbone {backbone!r}" if backbone else ""), choices)
            chk.fail(at, f"row {label!r} is on several backbones: set the claim's `backbone`", backbones)

        def refs(key: str, least: int, most: int | None = None) -> tuple[tuple[str, str], ...]:
            value = body[key]
            if not isinstance(value, list) or len(value) < least or (most is not None and len(value) > most):
                n = f"{least}" if most == least else f"at least {least}"
                chk.fail(f"{where}.{key}", f"expected a list of {n} row labels, got {value!r}")
            out = tuple(ref(v, f"{where}.{key}[{j}]") for j, v in enumerate(value))
            return out

        fields: dict[str, Any] = {}
        if "row" in needed:
            fields["row"] = ref(body["row"], f"{where}.row")
        if "over" in needed:
            fields["over"] = refs("over", 1, 1 if kind == "better" else None)
        if "under" in needed:
            fields["under"] = refs("under", 1)
        if "rows" in needed:
            fields["rows"] = refs("rows", 2)
        if kind == "matched_order":
            fields.update(_parse_series(chk, body, where, spec, column, ref))
        claim = Claim(cid, text, table, column, kind, direction=direction, **fields)
        if any(a == b for a, b in claim.comparisons()):
            chk.fail(where, "a claim compares a row with itself")
        claims.append(claim)
    return tuple(claims)


def _parse_series(chk: _Checker, body: Mapping, where: str, spec: TableSpec, column: str, ref) -> dict[str, Any]:
    """A matched_order claim's `x` (an evaluation column of the table other than `column`) and `series` (a mapping
    name -> non-empty list of row labels, at least two series, in the claimed order, no row in two; where `x` is a
    replacement rate every row is a test-time decoding)."""
    accuracy = [c.name for c in spec.columns if not (c.is_training or c.is_comparison) and c.name != column]
    x = chk.choice(body["x"], f"{where}.x", accuracy)
    data = body["series"]
    if not isinstance(data, Mapping) or len(data) < 2:
        chk.fail(f"{where}.series", f"expected a mapping of at least 2 series name -> [row labels] (in the claimed "
                 f"order), got {data!r}")
    series: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    seen: dict[tuple[str, str], str] = {}
    for name, labels in data.items():
        at = f"{where}.series.{name}"
        if not isinstance(labels, list) or not labels:
            chk.fail(at, f"expected a non-empty list of row labels, got {labels!r}")
        rows = tuple(ref(label, f"{at}[{j}]") for j, label in enumerate(labels))
        for j, row in enumerate(rows):
            if row in seen:
                chk.fail(f"{at}[{j}]", f"row {row[0]!r} is already in series {seen[row]!r}")
            seen[row] = str(name)
            if spec.column(x).metric_for(None) == "replacement_rate" and not next(
                    r for r in spec.rows if (r.label, r.backbone) == row).decode:
                chk.fail(f"{at}[{j}]", f"row {row[0]!r} has no test-time decoding: it has no {x!r} "
                         f"(replacement_rate) to match on")
        series.append((str(name), rows))
    return {"series": tuple(series), "x": x}


def _parse_analyses(chk: _Checker, data: Any, paper: Mapping[str, Any]) -> dict[str, AnalysisSpec]:
    """Parse `analyses`: name -> {kind, backbone, run, start, caption, params}, params checked against the
    kind's `analyze` signature (creditlab.analysis.KINDS)."""
    if data is None:
        return {}
    from creditlab.analysis import KINDS, analyze_params

    if not isinstance(data, Mapping):
        chk.fail("analyses", "expected a mapping of analysis name -> analysis")
    out: dict[str, AnalysisSpec] = {}
    for name, body in data.items():
        where = f"analyses.{name}"
        body = chk.keys(body, where, _ANALYSIS_KEYS, required=("kind", "backbone", "run"))
        kind = chk.choice(body["kind"], f"{where}.kind", KINDS)
        if body["run"] == BASE_RUN:
            chk.fail(f"{where}.run", "an analysis needs a run config (method, overrides): name one of the paper's "
                     "runs and choose `start: base` to start from the base model", paper["runs"])
        params = body.get("params") or {}
        if not isinstance(params, Mapping):
            chk.fail(f"{where}.params", f"expected a mapping of keyword -> value, got {params!r}")
        allowed = analyze_params(kind)  # the kind's analyze() signature, read without importing torch
        for key in params:
            chk.choice(key, f"{where}.params.{key}", allowed)
        out[str(name)] = AnalysisSpec(
            str(name), kind,
            backbone=chk.choice(body["backbone"], f"{where}.backbone", paper["backbones"]),
            run=chk.choice(body["run"], f"{where}.run", paper["runs"]),
            start=chk.choice(body.get("start", "base"), f"{where}.start", ANALYSIS_STARTS),
            caption=" ".join(str(body.get("caption") or "").split()),
            params=tuple((str(k), _freeze(v)) for k, v in params.items()))
    return out


def _parse_seeds(chk: _Checker, data: Any, scales: list[str]) -> dict[str, tuple[int, ...]]:
    """Parse `seeds`: scale -> non-empty list of distinct non-negative integers (the paper's own seeds at
    that scale; a scale not listed uses the pipeline's). The scales are those of `backbones`."""
    if data is None:
        return {}
    if not isinstance(data, Mapping) or not data:
        chk.fail("seeds", f"expected a mapping scale -> list of seeds (e.g. {{tiny: [0, 1, 2]}}), got {data!r}",
                 scales)
    seeds: dict[str, tuple[int, ...]] = {}
    for scale, values in data.items():
        where = f"seeds.{scale}"
        chk.choice(scale, where, scales)
        if not isinstance(values, list) or not values:
            chk.fail(where, f"expected a non-empty list of seeds (non-negative integers), got {values!r}")
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                chk.fail(f"{where}[{i}]", f"expected a non-negative integer seed, got {value!r}")
        if len(set(values)) != len(values):
            dupes = sorted({v for v in values if values.count(v) > 1})
            chk.fail(where, f"duplicate seed(s) {dupes} in {values}")
        seeds[str(scale)] = tuple(values)
    return seeds


def _parse_figures(chk: _Checker, data: Any, tables: Mapping[str, TableSpec], paper: Mapping[str, Any]
                   ) -> dict[str, FigureSpec]:
    """Parse `figures`: name -> {kind, caption, ...} checked against the tables, backbones and runs."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        chk.fail("figures", "expected a mapping of figure name -> figure")
    figures: dict[str, FigureSpec] = {}
    for name, body in data.items():
        where = f"figures.{name}"
        body = chk.keys(body, where, _FIGURE_KEYS, required=("kind",))
        kind = chk.choice(body["kind"], f"{where}.kind", FIGURE_KINDS)
        allowed = _FIGURE_KIND_KEYS[kind]
        for key in body:
            if key not in allowed:
                chk.fail(f"{where}.{key}", f"a {kind} figure takes no key {key!r}", allowed)
        caption = " ".join(str(body.get("caption") or "").split())
        if kind in ("replacement_curves", "bars", "scatter"):
            table = chk.choice(body.get("table"), f"{where}.table", tables)
            cols = [c.name for c in tables[table].columns if not c.is_comparison]
            x = chk.choice(body.get("x"), f"{where}.x", cols) if kind in ("replacement_curves", "scatter") else None
            fig = FigureSpec(str(name), kind, caption, table, x, chk.choice(body.get("y"), f"{where}.y", cols))
        else:
            fig = FigureSpec(str(name), kind, caption,
                             backbone=chk.choice(body.get("backbone"), f"{where}.backbone", paper["backbones"]),
                             run=chk.choice(body.get("run"), f"{where}.run", paper["runs"]),
                             top=_positive_int(chk, body.get("top", TOKEN_CREDIT_TOP), f"{where}.top"),
                             min_count=_positive_int(chk, body.get("min_count", TOKEN_CREDIT_MIN_COUNT),
                                                     f"{where}.min_count"))
        figures[str(name)] = fig
    return figures


def _positive_int(chk: _Checker, value: Any, where: str) -> int:
    """Check that `value` is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        chk.fail(where, f"expected a positive integer, got {value!r}")
    return value


def load_paper(path: str | Path) -> PaperSpec:
    """Load and validate one paper config file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    return parse_paper(data, str(path))


def load_papers(config_dir: str | Path, names: Iterable[str]) -> dict[str, PaperSpec]:
    """Load `config_dir/<name>.yaml` for each name; the file's `paper:` must equal its name."""
    config_dir = Path(config_dir)
    available = sorted(p.stem for p in config_dir.glob("*.yaml"))
    papers: dict[str, PaperSpec] = {}
    for name in names:
        path = config_dir / f"{name}.yaml"
        if not path.is_file():
            raise ValueError(f"{config_dir}: unknown paper {name!r}; choices: {available}")
        spec = load_paper(path)
        if spec.paper != name:
            raise ValueError(f"{path}: paper: {spec.paper!r} does not match the file name; "
                             f"choices: [{name!r}]")
        papers[name] = spec
    return papers
