"""The paper configuration as data: the dataclasses a `configs/papers/<paper>.yaml` becomes, and their queries.

A paper config is data, not code: it maps the paper's backbones and benchmarks to our model
configs and evaluation suites at each scale (a benchmark may map to null: no stand-in there), names
the training runs (with, per scale, the paper's own settings: `scale_overrides`), and declares each
table (columns = benchmark x metric or a training cost, rows = runs, plus the numbers the paper
reports), figures, analyses, claims and, optionally, its own seeds per scale. See
`configs/papers/dlogp.yaml` for the format; `creditlab.papers.load` reads and validates a file
(`workflow/schemas/paper.schema.yaml` for its structure, the cross-references in Python).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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

STEPS_TO_SMOOTHING = 0.6
"""Default EMA factor of a steps_to column (the training-curve figures' smoothing)."""

COMPARISON_METRICS = ("versus",)
"""Column metrics that compare each row with a reference row: `versus` = the paired test of the row's `of` column
against the reference run's (`relative_to`, or the row's own `baseline`), Holm-corrected over every `versus` cell of
the table, shown as "beats <ref>" / "worse than <ref>" / "noise" with the adjusted p (creditlab.tables.build)."""

METRICS = EVAL_METRICS + TRAINING_METRICS + COMPARISON_METRICS

TOKEN_CREDIT_TOP = 15
TOKEN_CREDIT_MIN_COUNT = 20
"""A token_credit figure's defaults: the `top` tokens shown at each end, among those generated `min_count` times."""
ALL_RUNS = "*"
"""Key of a paper's `scale_overrides.<scale>` entry that applies to every run of the paper (and to the evaluation of
the base model); the other keys are paper backbones."""


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
    level to reach and the EMA factor applied to the reward curve first; with `threshold_of` (a run) the level
    is `threshold` x that run's final reward EMA on the row's backbone (mean over the seeds), a level every
    world reaches, where a fixed number belongs to one world's reward scale.
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
    threshold_of: str | None = None
    """steps_to only: the run whose final reward EMA `threshold` multiplies (None: `threshold` is the level)."""
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

    Rows are (label, backbone) pairs of the table. `better`: row > over[0]; `best_of`: row > each of over (Holm);
    `order`: rows[0] > rows[1] > ... (Holm over the links); `between`: each of over < row < each of under (Holm);
    `matched_order`: series[0] > series[1] > ... (Holm over the links), each series a curve of rows (one per
    threshold, say) compared on `column` at matched values of the column `x` (the replacement rate): each series'
    `column` interpolated linearly in its measured `x` at common x values inside every series' measured range; with
    `toward` a row, closeness to that row's value is compared instead of the value.
    `direction: lower` flips every comparison (lower is better, e.g. a step time)."""

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
    toward: tuple[str, str] | None = None
    """matched_order only: a row whose `column` the series are to reach (Δlog p's "recovers pi_RL's accuracy"): each
    series is scored by -|value - the row's value|, so closer is better whichever side of it the series lie on."""

    def series_links(self) -> list[tuple[str, str]]:
        """matched_order: the (better, worse) pairs of series names the claim needs, consecutive in its order."""
        names = [name for name, _ in self.series]
        return list(zip(names[:-1], names[1:]))

    def refs(self) -> list[tuple[str, str]]:
        """Every row the claim reads, in order, without repeats."""
        rows = [r for pair in self.comparisons() for r in pair] + [r for _, rs in self.series for r in rs]
        return list(dict.fromkeys(rows + ([self.toward] if self.toward else [])))

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


OFFICIAL_TOP_K = 50
"""The official script's view of the two models in Paper A's decodings (``logprobs=50``; Hesse73/RLVR-Directions):
each model's top 50 log-probs per token. The default ``top_k_support`` where a scale reads paper entries."""


@dataclass(frozen=True)
class DecodeSpec:
    """A test-time decoding of Paper A: selective extrapolation / replacement between base and RL.

    criterion fires on the token proposed by the decoding model (dlogp: Δlog p <= threshold when
    decoding with the base model, >= when decoding with the RL model; others: score >= threshold);
    a fired position is resampled from log-softmax((1 + gamma) log pi_RL - gamma log pi_base).
    ``thresholds`` holds one value per scale (tiny models are far more confident than 7B-32B ones,
    so the paper's tau would almost never fire at tiny scale). ``top_k_supports``: the view of the two models
    (``decoding.extrapolation``), K or None (full vocabulary) per scale ("*": every scale); a scale not listed gets
    the official script's top-50 view where it reads paper entries (paper, smoke: both vLLM engines asked for 50
    log-probs per token instead of a 152k-entry row) and the full view elsewhere (tiny, micro).
    """

    name: str
    thresholds: tuple[tuple[str, float], ...]
    criterion: str = "dlogp"
    gamma: float = 0.0
    decode_with: str = "base"
    top_k_supports: tuple[tuple[str, int | None], ...] = ()

    def top_k_support(self, scale: str) -> int | None:
        """The decoding's view at ``scale``: K (top-K log-probs of each model) or None (full vocabulary)."""
        table = dict(self.top_k_supports)
        if "*" in table:
            return table["*"]
        scale = spec_scale(scale)
        if scale in table:
            return table[scale]
        return OFFICIAL_TOP_K if scale == "paper" else None

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
        return {
            "criterion": self.criterion,
            "threshold": self.threshold(scale),
            "gamma": self.gamma,
            "decode_with": self.decode_with,
            "top_k_support": self.top_k_support(scale),
        }


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
    table and a PNG figure. ``kind`` and ``params`` are checked against creditlab.analysis (the kind's ``analyze``
    signature) by creditlab.plan, before any job starts."""

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


class FrozenMap(tuple):
    """A mapping frozen into the (key, value) pairs of a hashable AnalysisSpec param, told apart from a frozen list
    so that it thaws back into a dict (a list of mappings, e.g. credit_fidelity's ``methods``)."""


def _thaw(v: Any) -> Any:
    if isinstance(v, FrozenMap):
        return {k: _thaw(x) for k, x in v}
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
            f"table {self.paper}/{self.name}: unknown column {name!r}; choices: {[c.name for c in self.columns]}"
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

    def run_overrides(
        self, run: str, paper_backbone: str, scale: str, combination: tuple[str, ...] = ()
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

    def leaves_at(self, table: str, column: Column | str, scale: str) -> tuple[list[tuple[str, str]], list[str]]:
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
                f"{self.source}: paper {self.paper!r} has no table {name!r}; choices: {sorted(self.tables)}"
            )
        return self.tables[name]


def _lookup(mapping: dict[str, dict[str, Any]], what: str, key: str, scale: str, source: str) -> Any:
    """mapping[key][scale] (`scale` read as creditlab.scales.spec_scale says) with a ValueError naming the valid
    choices on either miss."""
    scale = spec_scale(scale)
    if key not in mapping:
        raise ValueError(f"{source}: unknown {what} entry {key!r}; choices: {sorted(mapping)}")
    if scale not in mapping[key]:
        raise ValueError(f"{source}: {what}.{key} has no mapping for scale {scale!r}; choices: {sorted(mapping[key])}")
    return mapping[key][scale]


_FIXED_K = re.compile(r"pass@[1-9][0-9]*")
"""pass@N at a fixed N (`pass@4`: ARCA's table; the unbiased estimator from the evaluation's k >= N samples),
besides the symbolic metrics. avg@N is not one: avg@k is the mean over all k samples, whatever the scale."""


def is_metric(metric: Any) -> bool:
    return isinstance(metric, str) and (metric in METRICS or bool(_FIXED_K.fullmatch(metric)))


def resolve_metric(metric: str, k: int) -> str:
    """Concrete metric name for a symbolic one: resolve_metric("avg@k", 8) == "avg@8"
    (other metrics, step_time and fixed-k ones like pass@4 included, are returned unchanged)."""
    if not is_metric(metric):
        raise ValueError(f"unknown metric {metric!r}; choices: {list(METRICS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return metric.replace("@k", f"@{k}")
