"""Paper table specifications: load and validate `configs/papers/<paper>.yaml`.

A paper config is data, not code: it maps the paper's backbones and benchmarks to our model
configs and evaluation suites at each scale, names the training runs, and declares each table
(columns = benchmark x metric, rows = runs, plus the numbers the paper reports). See
`configs/papers/dlogp.yaml` for the format. Every validation error is a ValueError naming the
file, the offending key and the valid choices, raised before any job starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

BASE_RUN = "base"
"""Reserved run name: the untrained base model (tiny: warmed up; paper: from the hub)."""

METRICS = ("greedy", "avg@k", "pass@k", "pass@1", "replacement_rate")
"""Column metrics. `avg@k` / `pass@k` are symbolic: k is the evaluation's k at the table's scale."""

WEIGHTINGS = ("plain", "count")
"""How a column over several suites averages them: plain mean, or weighted by question count."""

_TOP_KEYS = ("paper", "title", "experiment", "backbones", "benchmarks", "runs", "decodes", "tables", "figures")
FIGURE_KINDS = ("replacement_curves", "token_histograms")
_FIGURE_KEYS = ("kind", "caption", "table", "x", "y", "backbone", "run")
_REQUIRED_TOP_KEYS = ("paper", "backbones", "benchmarks", "runs", "tables")
_RUN_KEYS = ("method", "overrides")
_TABLE_KEYS = ("caption", "columns", "rows")
_COLUMN_KEYS = ("name", "benchmark", "benchmarks", "metric", "average_of", "weighting")
_ROW_KEYS = ("label", "backbone", "run", "decode", "paper")
_DECODE_KEYS = ("criterion", "threshold", "gamma", "decode_with", "top_k_support")
DECODE_CRITERIA = ("dlogp", "kl", "reverse_kl", "js", "entropy", "random")
DECODE_WITH = ("base", "rl")


@dataclass(frozen=True)
class RunSpec:
    """A training run: a method config plus Hydra overrides."""

    name: str
    method: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    """A table column: one metric on one or several benchmarks, or the average of earlier columns.

    Exactly one of `benchmark`, `benchmarks`, `average_of` is set. `metric` is one of METRICS for
    benchmark columns and None for `average_of` columns (each averaged column keeps its own).
    `weighting` applies when several suites are averaged.
    """

    name: str
    benchmark: str | None = None
    benchmarks: tuple[str, ...] | None = None
    metric: str | None = None
    average_of: tuple[str, ...] | None = None
    weighting: str = "plain"

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
    plots Δlog p / entropy / KL histograms of ``run``'s outputs vs its base model's on ``backbone``."""

    name: str
    kind: str
    caption: str = ""
    table: str | None = None
    x: str | None = None
    y: str | None = None
    backbone: str | None = None
    run: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """One table of a paper."""

    paper: str
    name: str
    caption: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]

    def column(self, name: str) -> Column:
        """The column called `name` (ValueError naming the choices otherwise)."""
        for col in self.columns:
            if col.name == name:
                return col
        raise ValueError(
            f"table {self.paper}/{self.name}: unknown column {name!r}; "
            f"choices: {[c.name for c in self.columns]}"
        )

    def leaves(self, column: Column) -> list[tuple[str, str]]:
        """The (paper benchmark, symbolic metric) pairs a column averages over, in order.

        An `average_of` column expands its referenced columns recursively; a pair appearing
        twice is counted once.
        """
        if column.average_of is None:
            assert column.metric is not None
            return [(bench, column.metric) for bench in column.paper_benchmarks]
        pairs: list[tuple[str, str]] = []
        for ref in column.average_of:
            for pair in self.leaves(self.column(ref)):
                if pair not in pairs:
                    pairs.append(pair)
        return pairs


@dataclass(frozen=True)
class PaperSpec:
    """A paper: its backbone and benchmark mappings per scale, its runs and its tables."""

    paper: str
    title: str
    experiment: str
    backbones: dict[str, dict[str, str]]
    benchmarks: dict[str, dict[str, str]]
    runs: dict[str, RunSpec]
    tables: dict[str, TableSpec]
    source: str = ""
    decodes: dict[str, DecodeSpec] = field(default_factory=dict)
    figures: dict[str, FigureSpec] = field(default_factory=dict)

    def backbone_for(self, paper_backbone: str, scale: str) -> str:
        """The model config name standing in for `paper_backbone` at `scale`."""
        return _lookup(self.backbones, "backbones", paper_backbone, scale, self.source)

    def suite_for(self, benchmark: str, scale: str) -> str:
        """The evaluation suite standing in for the paper's `benchmark` at `scale`."""
        return _lookup(self.benchmarks, "benchmarks", benchmark, scale, self.source)

    def table(self, name: str) -> TableSpec:
        """The table called `name` (ValueError naming the choices otherwise)."""
        if name not in self.tables:
            raise ValueError(
                f"{self.source}: paper {self.paper!r} has no table {name!r}; "
                f"choices: {sorted(self.tables)}"
            )
        return self.tables[name]


def _lookup(mapping: dict[str, dict[str, str]], what: str, key: str, scale: str,
            source: str) -> str:
    """mapping[key][scale] with a ValueError naming the valid choices on either miss."""
    if key not in mapping:
        raise ValueError(f"{source}: unknown {what} entry {key!r}; choices: {sorted(mapping)}")
    if scale not in mapping[key]:
        raise ValueError(
            f"{source}: {what}.{key} has no mapping for scale {scale!r}; "
            f"choices: {sorted(mapping[key])}"
        )
    return mapping[key][scale]


def resolve_metric(metric: str, k: int) -> str:
    """Concrete metric name for a symbolic one: resolve_metric("avg@k", 8) == "avg@8"."""
    if metric not in METRICS:
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


def _parse_scale_map(chk: _Checker, data: Any, what: str) -> dict[str, dict[str, str]]:
    """Parse `backbones` / `benchmarks`: paper name -> {scale: our name}, same scales for all."""
    if not isinstance(data, Mapping) or not data:
        chk.fail(what, "expected a non-empty mapping of paper name -> {scale: name}")
    parsed: dict[str, dict[str, str]] = {}
    for name, per_scale in data.items():
        where = f"{what}.{name}"
        if not isinstance(per_scale, Mapping) or not per_scale:
            chk.fail(where, f"expected a non-empty mapping scale -> name, got {per_scale!r}")
        parsed[str(name)] = {str(s): chk.string(v, f"{where}.{s}") for s, v in per_scale.items()}
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


def _parse_runs(chk: _Checker, data: Any) -> dict[str, RunSpec]:
    """Parse `runs`: run name -> {method, overrides}; `base` is reserved."""
    if not isinstance(data, Mapping):
        chk.fail("runs", "expected a mapping of run name -> {method, overrides}")
    runs: dict[str, RunSpec] = {}
    for name, body in data.items():
        where = f"runs.{name}"
        if name == BASE_RUN:
            chk.fail(where, f"{BASE_RUN!r} is reserved for the untrained base model")
        body = chk.keys(body, where, _RUN_KEYS, required=("method",))
        overrides = body.get("overrides") or []
        if not isinstance(overrides, list):
            chk.fail(f"{where}.overrides",
                     f"expected a list of key=value strings, got {overrides!r}")
        for i, item in enumerate(overrides):
            if not isinstance(item, str) or "=" not in item:
                chk.fail(f"{where}.overrides[{i}]", f"expected a key=value string, got {item!r}")
        runs[str(name)] = RunSpec(str(name), chk.string(body["method"], f"{where}.method"),
                                  tuple(overrides))
    return runs


def _parse_column(chk: _Checker, data: Any, where: str, benchmarks: Mapping[str, Any],
                  earlier: list[str]) -> Column:
    """Parse one column; `earlier` are the names of the columns before it."""
    body = chk.keys(data, where, _COLUMN_KEYS, required=("name",))
    name = chk.string(body["name"], f"{where}.name")
    where = f"{where} ({name})"
    if name in earlier:
        chk.fail(f"{where}.name", f"duplicate column name {name!r}", earlier)
    kinds = [k for k in ("benchmark", "benchmarks", "average_of") if k in body]
    if len(kinds) != 1:
        chk.fail(where, f"a column needs exactly one of benchmark / benchmarks / average_of, "
                 f"got {kinds}", ("benchmark", "benchmarks", "average_of"))
    weighting = chk.choice(body.get("weighting", "plain"), f"{where}.weighting", WEIGHTINGS)
    if "average_of" in body:
        if "metric" in body:
            chk.fail(f"{where}.metric", "an average_of column takes the metrics of its columns")
        refs = chk.strings(body["average_of"], f"{where}.average_of")
        for ref in refs:
            if ref not in earlier:
                chk.fail(f"{where}.average_of", f"{ref!r} is not a column defined before {name!r}",
                         earlier)
        return Column(name, average_of=refs, weighting=weighting)
    if "metric" not in body:
        chk.fail(where, "missing required key 'metric'", METRICS)
    metric = chk.choice(body["metric"], f"{where}.metric", METRICS)
    if "benchmark" in body:
        bench = chk.choice(body["benchmark"], f"{where}.benchmark", benchmarks)
        return Column(name, benchmark=bench, metric=metric, weighting=weighting)
    benches = chk.strings(body["benchmarks"], f"{where}.benchmarks")
    for i, bench in enumerate(benches):
        chk.choice(bench, f"{where}.benchmarks[{i}]", benchmarks)
    return Column(name, benchmarks=benches, metric=metric, weighting=weighting)


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
    decode = None
    if body.get("decode") is not None:
        decode = chk.choice(body["decode"], f"{where}.decode", paper["decodes"])
        if run == BASE_RUN:
            chk.fail(f"{where}.decode", "a decoding needs a trained RL run, not the base model", paper["runs"])
    return Row(label, backbone, run, numbers, decode)


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
        columns.append(_parse_column(chk, col, f"{where}.columns[{i}]", paper["benchmarks"],
                                     [c.name for c in columns]))
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
    caption = " ".join(str(body.get("caption") or "").split())
    return TableSpec(paper_name, str(name), caption, tuple(columns), tuple(rows))


def parse_paper(data: Any, source: str) -> PaperSpec:
    """Validate the parsed YAML `data` of a paper config; `source` names it in error messages."""
    chk = _Checker(source)
    body = chk.keys(data, "", _TOP_KEYS, required=_REQUIRED_TOP_KEYS)
    paper = chk.string(body["paper"], "paper")
    backbones = _parse_scale_map(chk, body["backbones"], "backbones")
    benchmarks = _parse_scale_map(chk, body["benchmarks"], "benchmarks")
    runs = _parse_runs(chk, body["runs"])
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
    )


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
        caption = " ".join(str(body.get("caption") or "").split())
        if kind == "replacement_curves":
            table = chk.choice(body.get("table"), f"{where}.table", tables)
            cols = [c.name for c in tables[table].columns]
            fig = FigureSpec(str(name), kind, caption, table, chk.choice(body.get("x"), f"{where}.x", cols),
                             chk.choice(body.get("y"), f"{where}.y", cols))
        else:
            fig = FigureSpec(str(name), kind, caption,
                             backbone=chk.choice(body.get("backbone"), f"{where}.backbone", paper["backbones"]),
                             run=chk.choice(body.get("run"), f"{where}.run", paper["runs"]))
        figures[str(name)] = fig
    return figures


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
