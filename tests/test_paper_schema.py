"""The paper-config schema (workflow/schemas/paper.schema.yaml): every paper config satisfies it, its closed choices
agree with the code, and its errors name the file, the key path and the reason as the hand checks do."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from creditlab.papers import spec as S
from creditlab.papers.load import PAPER_SCHEMA, _validator, check_structure, load_paper, parse_paper

PAPERS = sorted((Path(__file__).resolve().parents[1] / "configs" / "papers").glob("*.yaml"))
SCHEMA = yaml.safe_load(PAPER_SCHEMA.read_text())

TOY = {
    "paper": "p",
    "backbones": {"B": {"tiny": "tiny-s"}},
    "benchmarks": {"X": {"tiny": "easy"}},
    "runs": {"r": {"method": "dapo"}},
    "tables": {
        "t": {
            "columns": [{"name": "Acc", "benchmark": "X", "metric": "greedy"}],
            "rows": [{"label": "R", "backbone": "B", "run": "r"}],
        }
    },
}


@pytest.mark.parametrize("path", PAPERS, ids=lambda p: p.stem)
def test_every_paper_config_satisfies_the_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert not list(_validator().iter_errors(data))
    assert load_paper(path).paper == path.stem


def test_the_schemas_choices_are_the_codes() -> None:
    from creditlab.decoding.criteria import CRITERIA

    defs = SCHEMA["$defs"]
    assert set(defs["decode"]["properties"]["criterion"]["enum"]) <= {c.name for c in CRITERIA}
    branches = defs["column"]["allOf"]
    assert [b["if"]["properties"]["metric"]["const"] for b in branches[:-1]] == [
        "step_time",
        "train_mean",
        "steps_to",
        "versus",
    ]
    assert set(S.TRAINING_METRICS + S.COMPARISON_METRICS) == {"step_time", "train_mean", "steps_to", "versus"}
    accuracy = branches[-1]["if"]["anyOf"][1]["properties"]["metric"]["anyOf"]  # the evaluation metrics
    assert accuracy[1]["enum"] == list(S.EVAL_METRICS) and accuracy[2]["pattern"] == f"^{S._FIXED_K.pattern}$"
    kinds = defs["figure"]["properties"]["kind"]["enum"]
    assert [b["if"]["properties"]["kind"]["const"] for b in defs["figure"]["allOf"]] == [
        "replacement_curves",
        "scatter",
        "bars",
        "token_histograms",
        "token_credit",
    ]
    assert set(kinds) == {"replacement_curves", "scatter", "bars", "token_histograms", "token_credit"}
    figure = defs["figure"]["properties"]
    assert (figure["top"]["default"], figure["min_count"]["default"]) == (S.TOKEN_CREDIT_TOP, S.TOKEN_CREDIT_MIN_COUNT)
    claims = defs["claim"]
    assert [b["if"]["properties"]["kind"]["const"] for b in claims["allOf"]] == claims["properties"]["kind"]["enum"]


def _error(data: dict) -> str:
    with pytest.raises(ValueError) as err:
        parse_paper(data, "p.yaml")
    return str(err.value)


def _with(path: list, value) -> dict:
    data = copy.deepcopy(TOY)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


COL = ["tables", "t", "columns", 0]


@pytest.mark.parametrize(
    "data, message",
    [
        (None, "p.yaml: : expected a mapping, got None"),
        (
            {k: v for k, v in TOY.items() if k != "runs"},
            "p.yaml: top level: missing required key 'runs'; choices: ['paper'",
        ),
        (_with(["title_"], "T"), "p.yaml: title_: unknown key 'title_'; choices: ['paper', 'title'"),
        (_with(["backbones", "B", "tiny"], ""), "p.yaml: backbones.B.tiny: expected a non-empty string, got ''"),
        (
            _with(["runs", "r", "overrides"], ["novalue"]),
            "p.yaml: runs.r.overrides[0]: expected a key=value string, got 'novalue'",
        ),
        (
            _with([*COL, "weighting"], "heavy"),
            "p.yaml: tables.t.columns[0] (Acc).weighting: unknown value 'heavy'; choices: ['plain', 'count']",
        ),
        (_with([*COL, "key"], "k"), "p.yaml: tables.t.columns[0] (Acc).key: key applies to a train_mean column only"),
        (
            _with(COL, {"name": "T", "metric": "step_time", "weighting": "plain"}),
            "p.yaml: tables.t.columns[0] (T).weighting: a step_time column averages no suites; choices: ['name', "
            "'metric', 'relative_to', 'relative']",
        ),
        (
            _with(COL, {"name": "T", "metric": "step_time", "key": "k"}),
            "p.yaml: tables.t.columns[0] (T).key: a step_time column takes no key 'key'; choices: ['name', 'metric', "
            "'relative_to', 'relative']",
        ),
        (
            _with(COL, {"name": "T", "metric": "steps_to"}),
            "p.yaml: tables.t.columns[0] (T): a steps_to column needs a threshold",
        ),
        (
            _with(COL, {"name": "T", "metric": "step_time", "relative": "ratio"}),
            "p.yaml: tables.t.columns[0] (T).relative: relative (percent | ratio) needs relative_to: <run>",
        ),
        (
            _with(COL, {"name": "A", "benchmark": "X", "benchmarks": ["X"], "metric": "greedy"}),
            "exactly one of benchmark / benchmarks / average_of (only a step_time/steps_to/train_mean column has "
            "none), got "
            "['benchmark', 'benchmarks']; choices: ['benchmark', 'benchmarks', 'average_of']",
        ),
        (_with(["seeds"], {"tiny": [1, 1]}), "p.yaml: seeds.tiny: duplicate seed(s) [1] in [1, 1]"),
        (
            _with(["figures"], {"f": {"kind": "bars", "table": "t", "x": "Acc"}}),
            "p.yaml: figures.f.x: a bars figure takes no key 'x'; choices: ['kind', 'caption', 'table', 'y']",
        ),
        (
            _with(COL, {"name": "A", "benchmark": "X", "metric": "avg@kk", "threshold": 1}),
            "p.yaml: tables.t.columns[0] (A).metric: unknown metric 'avg@kk'",
        ),  # an unknown metric first: no branch
        (
            _with(
                ["claims"], [{"id": "c", "text": "t", "table": "t", "column": "Acc", "kind": "order", "rows": ["R"]}]
            ),
            "p.yaml: claims[0] (c).rows: expected a list of at least 2 row labels, got ['R']",
        ),
    ],
)
def test_schema_errors_name_the_file_the_key_and_the_reason(data, message) -> None:
    assert message in _error(data)


def test_what_the_schema_cannot_say_is_checked_in_python() -> None:
    assert "tables.t.rows[0] (R).run: unknown value 'nope'; choices: ['base', 'r']" in _error(
        _with(["tables", "t", "rows", 0, "run"], "nope")
    )
    assert "p.yaml: runs.base: 'base' is reserved" in _error(_with(["runs", "base"], {"method": "dapo"}))
    assert "tables.t.columns[0] (Acc).metric: unknown metric 'avg@32'" in _error(_with([*COL, "metric"], "avg@32"))
    assert "tables.t.rows[0] (R).paper.Acc: expected a number or null, got inf" in _error(
        _with(["tables", "t", "rows", 0, "paper"], {"Acc": float("inf")})
    )
    assert "seeds.paper: unknown value 'paper'; choices: ['tiny']" in _error(_with(["seeds"], {"paper": [0]}))
    assert "figures.f.y: unknown value None; choices: ['Acc']" in _error(
        _with(["figures"], {"f": {"kind": "bars", "table": "t"}})
    )
    check_structure(copy.deepcopy(TOY), "p.yaml")  # the toy itself is fine
