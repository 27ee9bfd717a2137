"""Read a paper config (`configs/papers/<paper>.yaml`) into a PaperSpec: its structure checked by the JSON schema, its
cross-references here.

`workflow/schemas/paper.schema.yaml` states the structure: every section's keys, the required ones, the types, the
closed choices (decoding criteria, figure and claim kinds, ...) and the keys each column metric, figure kind and claim
kind takes. This module checks what a schema cannot: the references between sections (a row's run, backbone and
decoding; a column's benchmarks, average_of and of; a figure's table and columns; a claim's table, column and rows),
the per-scale maps (every backbone and benchmark on the same scales; seeds and overrides on those scales; a column's
per-scale metric on every one of them), metric names, finite numbers, an analysis' start, and duplicate names. Analysis
kinds and their params are checked against creditlab.analysis by creditlab.plan. Every error is a ValueError
``<file>: <key path>: <reason>[; choices: [...]]``, raised before any job starts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

import yaml

from creditlab.papers.spec import (
    ALL_RUNS,
    BASE_RUN,
    COMPARISON_METRICS,
    EVAL_METRICS,
    METRICS,
    STEPS_TO_SMOOTHING,
    TOKEN_CREDIT_MIN_COUNT,
    TOKEN_CREDIT_TOP,
    TRAINING_METRICS,
    AnalysisSpec,
    Claim,
    Column,
    DecodeSpec,
    FigureSpec,
    FrozenMap,
    PaperSpec,
    Row,
    RunSpec,
    TableSpec,
    is_metric,
)
from creditlab.scales import SCALES

PAPER_SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "paper.schema.yaml"
"""The structure of a paper config (JSON schema)."""

ANALYSIS_STARTS = ("base", "trained", "trained@<step>", "trained@<percent>%")
"""Where an analysis starts: the warmed-up base model, the final state (model + optimizer) of its run, or its state
after a given step (``trained@40``) or share of its steps (``trained@50%``; `creditlab.plan.resolve_start`)."""
_START_RE = re.compile(r"base|trained(@(\d+)(%?))?")


class Checker:
    """Builds error messages that name the file being validated: ``<file>: <where>: <problem>; choices: [...]``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, choices: Iterable[Any] | None = None) -> NoReturn:
        """Raise the ValueError for `problem` at key path `where`."""
        msg = f"{self.source}: {where}: {problem}"
        if choices is not None:
            msg += f"; choices: {list(choices)}"
        raise ValueError(msg)

    def choice(self, value: Any, where: str, choices: Iterable[Any]) -> Any:
        """Check that `value` is one of `choices`."""
        choices = list(choices)
        if value not in choices:
            self.fail(where, f"unknown value {value!r}", choices)
        return value


# ----------------------------------------------------------------------------------------------
# the structure: the JSON schema


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft202012Validator

    with open(PAPER_SCHEMA) as f:
        schema = yaml.safe_load(f)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


_LABELS = {"columns": "name", "rows": "label", "claims": "id"}
"""A list item's own name, shown after its index in a key path (``tables.main.columns[3] (Avg)``)."""

_EXPECTED = (
    "type",
    "minLength",
    "minItems",
    "maxItems",
    "minProperties",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
)
"""Validators whose failure reads "expected <x-expected>, got <value>"."""

_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "null": "null",
    "boolean": "a boolean",
}


def _where(data: Any, path: Iterable[Any]) -> str:
    """The key path of `path` in `data`: ``tables.main.columns[3] (Avg).metric``; a column, row or claim is followed by
    its own name."""
    out, node, parent = "", data, None
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part]
            name = node.get(_LABELS.get(parent, ""), None) if isinstance(node, Mapping) else None
            if isinstance(name, str) and name:
                out += f" ({name})"
        else:
            out += f".{part}" if out else str(part)
            node = node[part]
        parent = part
    return out


def _position(data: Any, path: Iterable[Any]) -> tuple[int, ...]:
    """Where `path` lies in the document, for ordering errors as the file reads."""
    pos, node = [], data
    for part in path:
        pos.append(part if isinstance(part, int) else list(node).index(part))
        node = node[part]
    return tuple(pos)


_RANK = {"type": 0, "not": 1, "additionalProperties": 2, "propertyNames": 2, "required": 3}
"""Which of several errors at one key path is reported: a wrong type, a key a column of its kind does not take, an
unknown key, a missing one, then the others."""


def _message(err: Any, data: Any, source: str) -> str:
    """The ValueError message of one schema error: file, key path, reason and, where there are some, the choices."""
    schema, instance, where = err.schema, err.instance, _where(data, err.absolute_path)
    text = schema.get("x-message") if isinstance(schema, Mapping) else None
    choices: list[Any] | None = None
    key: Any = None
    if "propertyNames" in err.relative_schema_path:  # an unknown key of a kind (schema: the propertyNames one)
        key, choices = instance, list(schema.get("enum", []))
        where = f"{where}.{key}" if where else str(key)
        problem = (text or "unknown key {key}").replace("{key}", repr(key))
    elif err.validator == "additionalProperties":
        allowed = list(schema.get("properties", {}))
        key = next(k for k in instance if k not in allowed)
        where, problem, choices = (f"{where}.{key}" if where else str(key)), f"unknown key {key!r}", allowed
    elif err.validator == "required":
        key = next(k for k in err.validator_value if k not in instance)
        problem = (text or "missing required key {key}").replace("{key}", repr(key))
        where = where or "top level"
        choices = list(err.validator_value) if text else list(schema.get("properties", {}))
    elif err.validator == "enum":
        problem, choices = f"unknown value {instance!r}", list(err.validator_value)
    elif err.validator in _EXPECTED:
        expected = schema.get("x-expected")
        if expected is None:
            types = schema.get("type", [])
            expected = " or ".join(_TYPE_WORDS.get(t, t) for t in ([types] if isinstance(types, str) else types))
        got = repr(instance)
        problem = f"expected {expected}, got {got if len(got) <= 80 else type(instance).__name__}"
    else:  # not, oneOf, uniqueItems, ...: the condition's own reason
        branches = (
            [err.validator_value, *err.validator_value.get("anyOf", [])]
            if err.validator == "not"
            else err.validator_value
            if err.validator in ("oneOf", "anyOf")
            else []
        )
        named = [k for branch in branches for k in branch.get("required", [])]
        if err.validator == "not":  # a key that must not be there: the path names it
            key = next(k for k in named if k in instance)
            where = f"{where}.{key}"
        elif named:
            choices = named
        repeated = sorted({repr(v) for v in instance if instance.count(v) > 1}) if isinstance(instance, list) else []
        problem = (
            (text or err.message)
            .replace("{key}", repr(key))
            .replace("{got}", repr(instance))
            .replace("{present}", repr([k for k in named if isinstance(instance, Mapping) and k in instance]))
            .replace("{duplicates}", f"[{', '.join(repeated)}]")
        )
    if isinstance(schema, Mapping):
        where = f"{where}.{schema['x-at']}" if "x-at" in schema else where
        choices = list(schema["x-choices"]) if "x-choices" in schema else choices
    msg = f"{source}: {where}: {problem}"
    return msg + (f"; choices: {choices}" if choices is not None else "")


def check_structure(data: Any, source: str) -> None:
    """Check `data` against workflow/schemas/paper.schema.yaml: ValueError naming `source`, the key path and the
    reason of the first error in the file's order."""
    errors = list(_validator().iter_errors(data))
    if errors:
        first = min(errors, key=lambda e: (_position(data, e.absolute_path), _RANK.get(e.validator, 3)))
        raise ValueError(_message(first, data, source))


# ----------------------------------------------------------------------------------------------
# what a schema cannot check: cross-references, per-scale maps, metric names, finite numbers, duplicates


def _check_metric(chk: Checker, metric: Any, where: str) -> str:
    if not is_metric(metric):
        chk.fail(where, f"unknown metric {metric!r} (or pass@N with a fixed N)", METRICS)
    return metric


def _finite(chk: Checker, value: float, where: str, what: str = "a finite number") -> float:
    """Check that a number is finite (the schema checked it is a number: NaN and infinity are numbers in YAML)."""
    if not math.isfinite(value):
        chk.fail(where, f"expected {what}, got {value!r}")
    return float(value)


def _unique_list(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _parse_scale_map(chk: Checker, data: Mapping, what: str) -> dict[str, dict[str, Any]]:
    """`backbones` / `benchmarks`: paper name -> {scale: our name}, the same scales for all."""
    parsed = {str(name): {str(s): v for s, v in per_scale.items()} for name, per_scale in data.items()}
    scales = {frozenset(m) for m in parsed.values()}
    if len(scales) > 1:
        union = sorted(set().union(*scales))
        for name, per_scale in parsed.items():
            missing = sorted(set(union) - set(per_scale))
            if missing:
                chk.fail(f"{what}.{name}", f"no mapping for scale(s) {missing}", union)
    return parsed


def _parse_decodes(data: Mapping | None) -> dict[str, DecodeSpec]:
    """`decodes`: name -> {criterion, threshold (number or scale -> number), gamma, decode_with, top_k_support (K, null
    or scale -> K | null; absent: the official top-50 view at paper scale, the full view at tiny)}."""
    decodes: dict[str, DecodeSpec] = {}
    for name, body in (data or {}).items():
        raw = body["threshold"]
        thresholds = {str(k): float(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {"*": float(raw)}
        top_k = body.get("top_k_support", {})  # absent: the per-scale default (DecodeSpec.top_k_support)
        top_ks = top_k if isinstance(top_k, Mapping) else {"*": top_k}
        decodes[str(name)] = DecodeSpec(
            str(name),
            tuple(sorted(thresholds.items())),
            body.get("criterion", "dlogp"),
            float(body.get("gamma", 0.0)),
            body.get("decode_with", "base"),
            tuple(sorted((str(k), None if v is None else int(v)) for k, v in top_ks.items())),
        )
    return decodes


def _parse_run_scale_overrides(
    chk: Checker, data: Mapping | None, where: str, scales: list[str]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A run's `scale_overrides`: scale (one of the paper's) -> list of key=value strings."""
    out = []
    for scale, overrides in (data or {}).items():
        chk.choice(scale, f"{where}.{scale}", scales)
        out.append((str(scale), tuple(overrides or ())))
    return tuple(out)


def _parse_scale_overrides(
    chk: Checker, data: Mapping | None, scales: list[str], backbones: Mapping[str, Any]
) -> dict[str, dict[str, tuple[str, ...]]]:
    """The paper's `scale_overrides`: scale -> {"*" | paper backbone -> list of key=value strings}."""
    targets = [ALL_RUNS, *backbones]
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for scale, per_target in (data or {}).items():
        where = f"scale_overrides.{scale}"
        chk.choice(scale, where, scales)
        out[str(scale)] = {}
        for target, overrides in per_target.items():
            chk.choice(target, f"{where}.{target}", targets)
            out[str(scale)][str(target)] = tuple(overrides or ())
    return out


def _parse_runs(chk: Checker, data: Mapping, scales: list[str]) -> dict[str, RunSpec]:
    """`runs`: run name -> {method, overrides, scale_overrides, combine}; `base` is reserved."""
    runs: dict[str, RunSpec] = {}
    for name, body in data.items():
        where = f"runs.{name}"
        if name == BASE_RUN:
            chk.fail(where, f"{BASE_RUN!r} is reserved for the untrained base model")
        method = body["method"]
        combine = tuple(body.get("combine") or ())
        if method in combine or len(set(combine)) != len(combine):
            chk.fail(f"{where}.combine", f"lists a method twice (the run's method is {method!r}): {list(combine)}")
        runs[str(name)] = RunSpec(
            str(name),
            method,
            tuple(body.get("overrides") or ()),
            _parse_run_scale_overrides(chk, body.get("scale_overrides"), f"{where}.scale_overrides", scales),
            combine,
        )
    return runs


def _parse_column(chk: Checker, body: Mapping, where: str, paper: Mapping[str, Any], earlier: list[Column]) -> Column:
    """One column (its keys checked by the schema for its metric); `earlier` are the columns before it."""
    names = [c.name for c in earlier]
    name = body["name"]
    where = f"{where} ({name})"
    if name in names:
        chk.fail(f"{where}.name", f"duplicate column name {name!r}", names)
    metric, metric_at = body.get("metric"), ()
    if isinstance(metric, Mapping):  # a per-scale binding: `metric` = its paper-scale value
        metric, metric_at = _parse_metric_at(chk, metric, f"{where}.metric", paper)
    elif metric is not None:
        _check_metric(chk, metric, f"{where}.metric")
    if metric in TRAINING_METRICS:
        return _parse_training_column(chk, body, where, name, paper)
    if metric in COMPARISON_METRICS:
        accuracy = [c.name for c in earlier if not (c.is_training or c.is_comparison)]
        return Column(
            name,
            metric=metric,
            relative_to=chk.choice(body["relative_to"], f"{where}.relative_to", paper["runs"]),
            of=chk.choice(body["of"], f"{where}.of", accuracy),
        )
    weighting = body.get("weighting", "plain")
    if "average_of" in body:
        refs = tuple(body["average_of"])
        for ref in refs:
            if ref not in names:
                chk.fail(f"{where}.average_of", f"{ref!r} is not a column defined before {name!r}", names)
            if earlier[names.index(ref)].is_training or earlier[names.index(ref)].is_comparison:
                chk.fail(
                    f"{where}.average_of",
                    f"{ref!r} is a training-cost column or a versus column, not an accuracy",
                    [c.name for c in earlier if not (c.is_training or c.is_comparison)],
                )
        return Column(name, average_of=refs, weighting=weighting)
    if "benchmark" in body:
        bench = chk.choice(body["benchmark"], f"{where}.benchmark", paper["benchmarks"])
        return Column(name, benchmark=bench, metric=metric, weighting=weighting, metric_at=metric_at)
    benches = tuple(body["benchmarks"])
    for i, bench in enumerate(benches):
        chk.choice(bench, f"{where}.benchmarks[{i}]", paper["benchmarks"])
    return Column(name, benchmarks=benches, metric=metric, weighting=weighting, metric_at=metric_at)


def _parse_metric_at(
    chk: Checker, data: Mapping, where: str, paper: Mapping[str, Any]
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A column's per-scale metric binding ``{paper: pass@16, tiny: pass@8, micro: pass@4, smoke: pass@4}``: one
    evaluation metric of one kind (pass@N at every scale, say) for every scale of the paper's backbones, `smoke`
    optional (it reads the paper-scale one otherwise). Returns (the paper-scale metric: the one the column's name and
    the paper's numbers stand for, the sorted (scale, metric) pairs)."""
    scales = sorted({s for per_scale in paper["backbones"].values() for s in per_scale})
    for scale in data:
        chk.choice(scale, f"{where}.{scale}", SCALES)
    missing = [s for s in scales if s not in data]
    if missing:
        chk.fail(where, f"a per-scale metric needs every scale of the paper's backbones; missing {missing}", scales)
    kinds = set()
    for scale, metric in data.items():
        _check_metric(chk, metric, f"{where}.{scale}")
        if metric in TRAINING_METRICS or metric in COMPARISON_METRICS:
            chk.fail(
                f"{where}.{scale}",
                f"a per-scale metric binds an evaluation metric, got {metric!r}",
                [*EVAL_METRICS, "pass@N"],
            )
        kinds.add(metric.partition("@")[0] if "@" in metric else metric)
    if len(kinds) != 1:
        chk.fail(
            where,
            f"a per-scale metric is one metric at each scale's k, got several kinds {sorted(kinds)}: {dict(data)}",
        )
    paper_metric = data.get("paper", data[scales[0]] if scales else next(iter(data.values())))
    return str(paper_metric), tuple(sorted((str(s), str(m)) for s, m in data.items()))


def _parse_training_column(chk: Checker, body: Mapping, where: str, name: str, paper: Mapping[str, Any]) -> Column:
    """A training-cost column (step_time, steps_to, train_mean): its reference run, a steps_to threshold and
    smoothing (finite), a train_mean key."""
    metric = body["metric"]
    relative_to = None
    if body.get("relative_to") is not None:
        relative_to = chk.choice(body["relative_to"], f"{where}.relative_to", paper["runs"])
    threshold = smoothing = threshold_of = None
    if metric == "steps_to":
        threshold = _finite(chk, body["threshold"], f"{where}.threshold")
        smoothing = _finite(chk, body.get("smoothing", STEPS_TO_SMOOTHING), f"{where}.smoothing")
        if body.get("threshold_of") is not None:
            threshold_of = chk.choice(body["threshold_of"], f"{where}.threshold_of", paper["runs"])
            if threshold is not None and not threshold > 0:
                chk.fail(f"{where}.threshold", f"a share of {threshold_of!r}'s final reward is > 0, got {threshold}")
    return Column(
        name,
        metric=metric,
        relative_to=relative_to,
        relative=body.get("relative", "percent"),
        threshold=threshold,
        smoothing=smoothing,
        threshold_of=threshold_of,
        key=body.get("key") if metric == "train_mean" else None,
    )


def _check_relative_to(chk: Checker, where: str, columns: list[Column], rows: list[Row]) -> None:
    """A relative_to (threshold_of) column needs, on the backbone of every trained row, a row of the reference run
    (of the run whose final reward sets the threshold)."""
    for i, col in enumerate(columns):
        for key, ref, what in (
            ("relative_to", col.relative_to, "to compare with"),
            ("threshold_of", col.threshold_of, "whose final reward sets the threshold"),
        ):
            if ref is None:
                continue
            for row in rows:
                if row.run == BASE_RUN or any(r.run == ref and r.backbone == row.backbone for r in rows):
                    continue
                runs = _unique_list(r.run for r in rows if r.backbone == row.backbone and r.run != BASE_RUN)
                chk.fail(
                    f"{where}.columns[{i}] ({col.name}).{key}",
                    f"no row of run {ref!r} on backbone {row.backbone!r} (row {row.label!r}) {what}",
                    runs,
                )


def _parse_paper_numbers(chk: Checker, data: Mapping | None, where: str, columns: list[str]) -> dict[str, float]:
    """A row's `paper` numbers: column name -> number (null = not reported, dropped)."""
    numbers: dict[str, float] = {}
    for col, value in (data or {}).items():
        chk.choice(col, f"{where}.{col}", columns)
        if value is not None:
            numbers[str(col)] = _finite(chk, value, f"{where}.{col}", "a number or null")
    return numbers


def _parse_row(chk: Checker, body: Mapping, where: str, paper: Mapping[str, Any], columns: list[str]) -> Row:
    """One row against the paper's backbones, runs, decodings and the table's columns."""
    label = body["label"]
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


def _parse_table(chk: Checker, paper_name: str, name: str, body: Mapping, paper: Mapping[str, Any]) -> TableSpec:
    """One table: caption, columns (in order), rows."""
    where = f"tables.{name}"
    columns: list[Column] = []
    for i, col in enumerate(body["columns"]):
        columns.append(_parse_column(chk, col, f"{where}.columns[{i}]", paper, columns))
    names = [c.name for c in columns]
    rows: list[Row] = []
    seen: set[tuple[str, str]] = set()
    for i, row_data in enumerate(body["rows"]):
        row = _parse_row(chk, row_data, f"{where}.rows[{i}]", paper, names)
        if (row.label, row.backbone) in seen:
            chk.fail(
                f"{where}.rows[{i}]",
                f"duplicate row (label={row.label!r}, backbone={row.backbone!r})",
                [f"{r.label}/{r.backbone}" for r in rows],
            )
        seen.add((row.label, row.backbone))
        rows.append(row)
    _check_relative_to(chk, where, columns, rows)
    for i, row in enumerate(rows):
        if row.baseline is not None and not any(r.run == row.baseline and r.backbone == row.backbone for r in rows):
            chk.fail(
                f"{where}.rows[{i}] ({row.label}).baseline",
                f"no row of run {row.baseline!r} on backbone {row.backbone!r} to compare with",
                _unique_list(r.run for r in rows if r.backbone == row.backbone),
            )
        if row.baseline is not None and not any(c.is_comparison for c in columns):
            chk.fail(
                f"{where}.rows[{i}] ({row.label}).baseline",
                "baseline applies to versus columns, and the table has none",
            )
    caption = " ".join(str(body.get("caption") or "").split())
    extra = {"curves": tuple(body["curves"])} if "curves" in body else {}
    return TableSpec(paper_name, str(name), caption, tuple(columns), tuple(rows), **extra)


def _parse_claims(chk: Checker, data: list | None, tables: Mapping[str, TableSpec]) -> tuple[Claim, ...]:
    """`claims`: every table, column, backbone and row a claim names checked (errors name the choices); the keys each
    kind takes are the schema's."""
    claims: list[Claim] = []
    for i, body in enumerate(data or ()):
        cid = body["id"]
        where = f"claims[{i}] ({cid})"
        if cid in [c.id for c in claims]:
            chk.fail(f"{where}.id", f"duplicate claim id {cid!r}", [c.id for c in claims])
        table = chk.choice(body["table"], f"{where}.table", tables)
        spec = tables[table]
        column = chk.choice(body["column"], f"{where}.column", [c.name for c in spec.columns])
        if spec.column(column).is_comparison:
            chk.fail(
                f"{where}.column",
                "a versus column is itself a set of tested claims; claim the column it tests",
                [c.name for c in spec.columns if not c.is_comparison],
            )
        if spec.column(column).metric == "steps_to":
            chk.fail(
                f"{where}.column",
                "a steps_to column cannot be tested (one value per seed)",
                [c.name for c in spec.columns if c.metric != "steps_to"],
            )
        kind = body["kind"]
        backbones = _unique_list(r.backbone for r in spec.rows)
        backbone = chk.choice(body["backbone"], f"{where}.backbone", backbones) if "backbone" in body else None

        def ref(label: Any, at: str) -> tuple[str, str]:
            matches = [r for r in spec.rows if r.label == label and backbone in (None, r.backbone)]
            if len(matches) == 1:
                return (matches[0].label, matches[0].backbone)
            choices = _unique_list(r.label for r in spec.rows if backbone in (None, r.backbone))
            if not matches:
                chk.fail(
                    at,
                    f"unknown row {label!r} in table {table!r}" + (f" on backbone {backbone!r}" if backbone else ""),
                    choices,
                )
            chk.fail(at, f"row {label!r} is on several backbones: set the claim's `backbone`", backbones)

        fields: dict[str, Any] = {}
        if "row" in body:
            fields["row"] = ref(body["row"], f"{where}.row")
        for key in ("over", "under", "rows"):
            if key in body:
                fields[key] = tuple(ref(v, f"{where}.{key}[{j}]") for j, v in enumerate(body[key]))
        if kind == "matched_order":
            fields.update(_parse_series(chk, body, where, spec, column, ref))
        claim = Claim(
            cid,
            " ".join(body["text"].split()),
            table,
            column,
            kind,
            direction=body.get("direction", "higher"),
            **fields,
        )
        if any(a == b for a, b in claim.comparisons()):
            chk.fail(where, "a claim compares a row with itself")
        claims.append(claim)
    return tuple(claims)


def _parse_series(chk: Checker, body: Mapping, where: str, spec: TableSpec, column: str, ref) -> dict[str, Any]:
    """A matched_order claim's `x` (an evaluation column of the table other than `column`), `series` (name ->
    row labels, in the claimed order, no row in two; where `x` is a replacement rate every row is a test-time
    decoding) and optional `toward` (a row outside the series whose value they are to reach)."""
    accuracy = [c.name for c in spec.columns if not (c.is_training or c.is_comparison) and c.name != column]
    x = chk.choice(body["x"], f"{where}.x", accuracy)
    series: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    seen: dict[tuple[str, str], str] = {}
    for name, labels in body["series"].items():
        at = f"{where}.series.{name}"
        rows = tuple(ref(label, f"{at}[{j}]") for j, label in enumerate(labels))
        for j, row in enumerate(rows):
            if row in seen:
                chk.fail(f"{at}[{j}]", f"row {row[0]!r} is already in series {seen[row]!r}")
            seen[row] = str(name)
            if (
                spec.column(x).metric_for(None) == "replacement_rate"
                and not next(r for r in spec.rows if (r.label, r.backbone) == row).decode
            ):
                chk.fail(
                    f"{at}[{j}]",
                    f"row {row[0]!r} has no test-time decoding: it has no {x!r} (replacement_rate) to match on",
                )
        series.append((str(name), rows))
    toward = ref(body["toward"], f"{where}.toward") if "toward" in body else None
    if toward is not None and toward in seen:
        chk.fail(f"{where}.toward", f"row {toward[0]!r} is in series {seen[toward]!r}: the target is not a series row")
    if toward is not None and body.get("direction", "higher") != "higher":
        chk.fail(f"{where}.direction", "a claim with `toward` compares closeness: closer is better (higher)")
    return {"series": tuple(series), "x": x, "toward": toward}


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Mapping):
        return FrozenMap((str(k), _freeze(x)) for k, x in v.items())
    return v


def _parse_analyses(chk: Checker, data: Mapping | None, paper: Mapping[str, Any]) -> dict[str, AnalysisSpec]:
    """`analyses`: name -> {kind, backbone, run, start, caption, params}; backbone, run and start checked here, the
    kind and its params by creditlab.plan (against creditlab.analysis)."""
    out: dict[str, AnalysisSpec] = {}
    for name, body in (data or {}).items():
        where = f"analyses.{name}"
        if body["run"] == BASE_RUN:
            chk.fail(
                f"{where}.run",
                "an analysis needs a run config (method, overrides): name one of the paper's "
                "runs and choose `start: base` to start from the base model",
                paper["runs"],
            )
        out[str(name)] = AnalysisSpec(
            str(name),
            body["kind"],
            backbone=chk.choice(body["backbone"], f"{where}.backbone", paper["backbones"]),
            run=chk.choice(body["run"], f"{where}.run", paper["runs"]),
            start=_parse_start(chk, body.get("start", "base"), f"{where}.start"),
            caption=" ".join(str(body.get("caption") or "").split()),
            params=tuple((str(k), _freeze(v)) for k, v in (body.get("params") or {}).items()),
        )
    return out


def _parse_start(chk: Checker, value: Any, where: str) -> str:
    """An analysis' `start` (ANALYSIS_STARTS): base | trained | trained@<step >= 1> | trained@<percent in (0, 100]>%."""
    m = _START_RE.fullmatch(str(value))
    if (
        not isinstance(value, str)
        or m is None
        or (m.group(2) is not None and not (0 < int(m.group(2)) <= (100 if m.group(3) else 10**9)))
    ):
        chk.fail(where, f"unknown value {value!r} (a step must be >= 1, a percent in (0, 100])", ANALYSIS_STARTS)
    return value


def _parse_seeds(chk: Checker, data: Mapping | None, scales: list[str]) -> dict[str, tuple[int, ...]]:
    """`seeds`: scale (one of `backbones`') -> the paper's own seeds at that scale."""
    seeds: dict[str, tuple[int, ...]] = {}
    for scale, values in (data or {}).items():
        chk.choice(scale, f"seeds.{scale}", scales)
        seeds[str(scale)] = tuple(values)
    return seeds


def _parse_figures(
    chk: Checker, data: Mapping | None, tables: Mapping[str, TableSpec], paper: Mapping[str, Any]
) -> dict[str, FigureSpec]:
    """`figures`: name -> {kind, caption, ...}; the table, columns, backbone and run each kind needs checked (a missing
    one is an unknown None, with the choices)."""
    figures: dict[str, FigureSpec] = {}
    for name, body in (data or {}).items():
        where = f"figures.{name}"
        kind = body["kind"]
        caption = " ".join(str(body.get("caption") or "").split())
        if kind in ("replacement_curves", "bars", "scatter"):
            table = chk.choice(body.get("table"), f"{where}.table", tables)
            cols = [c.name for c in tables[table].columns if not c.is_comparison]
            x = chk.choice(body.get("x"), f"{where}.x", cols) if kind in ("replacement_curves", "scatter") else None
            fig = FigureSpec(str(name), kind, caption, table, x, chk.choice(body.get("y"), f"{where}.y", cols))
        else:
            fig = FigureSpec(
                str(name),
                kind,
                caption,
                backbone=chk.choice(body.get("backbone"), f"{where}.backbone", paper["backbones"]),
                run=chk.choice(body.get("run"), f"{where}.run", paper["runs"]),
                top=body.get("top", TOKEN_CREDIT_TOP),
                min_count=body.get("min_count", TOKEN_CREDIT_MIN_COUNT),
            )
        figures[str(name)] = fig
    return figures


def parse_paper(data: Any, source: str) -> PaperSpec:
    """Validate the parsed YAML `data` of a paper config (the schema, then the cross-references); `source` names it
    in error messages."""
    check_structure(data, source)
    chk = Checker(source)
    paper = data["paper"]
    backbones = _parse_scale_map(chk, data["backbones"], "backbones")
    benchmarks = _parse_scale_map(chk, data["benchmarks"], "benchmarks")
    scales = sorted({s for per_scale in backbones.values() for s in per_scale})
    runs = _parse_runs(chk, data["runs"], scales)
    decodes = _parse_decodes(data.get("decodes"))
    context = {"backbones": backbones, "benchmarks": benchmarks, "runs": runs, "decodes": decodes}
    tables = {str(name): _parse_table(chk, paper, str(name), tbl, context) for name, tbl in data["tables"].items()}
    return PaperSpec(
        paper=paper,
        title=str(data.get("title") or paper),
        experiment=data.get("experiment", paper),
        backbones=backbones,
        benchmarks=benchmarks,
        runs=runs,
        tables=tables,
        source=source,
        decodes=decodes,
        figures=_parse_figures(chk, data.get("figures"), tables, context),
        analyses=_parse_analyses(chk, data.get("analyses"), context),
        seeds=_parse_seeds(chk, data.get("seeds"), scales),
        claims=_parse_claims(chk, data.get("claims"), tables),
        scale_overrides=_parse_scale_overrides(chk, data.get("scale_overrides"), scales, backbones),
    )


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
            raise ValueError(f"{path}: paper: {spec.paper!r} does not match the file name; choices: [{name!r}]")
        papers[name] = spec
    return papers
