"""Table-layer features for Paper B (DelTA): benchmarks without a stand-in at a scale (null mapping),
the step_time training-cost column (and relative_to), the bars and token_credit figure kinds."""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from creditlab import cli, paths
from creditlab import plan as plan_mod
from creditlab.papers.load import parse_paper
from creditlab.tables.build import build_table, write_table
from creditlab.tables.figures import plot_bars, plot_token_credit
from creditlab.tables.frame import LONG_COLUMNS
from creditlab.tables.load import metrics_path, read_step_times, run_metrics_path
from creditlab.tables.render import table_markdown
from creditlab.tables.token_credit import (
    load_token_credit,
    overall_mean,
    rank_tokens,
    visible,
    write_token_credit,
)
from table_helpers import DELETE as _DELETE
from table_helpers import cell as _cell
from table_helpers import edit as _edit

K = 8  # = the tiny evaluation k (the CLI test resolves avg@k with it)
PAPER = {
    "paper": "tb",
    "title": "Paper B toy: DelTA-like (test fixture)",
    "backbones": {
        "Small-8B": {"tiny": "tiny-s", "paper": "small-8b"},
        "Large-14B": {"tiny": "tiny-m", "paper": "large-14b"},
    },
    "benchmarks": {
        "A": {"tiny": "sa", "paper": "bench-a"},
        "B": {"tiny": "sb", "paper": "bench-b"},
        "N": {"tiny": None, "paper": "bench-n"},
        "M": {"tiny": None, "paper": "bench-m"},
    },
    "runs": {"dapo": {"method": "dapo"}, "delta": {"method": "delta"}},
    "tables": {
        "main": {
            "caption": "Toy main table.",
            "columns": [
                {"name": "A", "benchmark": "A", "metric": "avg@k"},
                {"name": "N", "benchmark": "N", "metric": "avg@k"},
                {"name": "Avg", "average_of": ["A", "N"]},
                {"name": "All", "benchmarks": ["A", "B", "N", "M"], "metric": "avg@k", "weighting": "count"},
                {"name": "NM", "benchmarks": ["N", "M"], "metric": "avg@k"},
                {"name": "Step time (s)", "metric": "step_time"},
                {"name": "Overhead", "metric": "step_time", "relative_to": "dapo"},
            ],
            "rows": [
                {"label": "Base", "backbone": "Small-8B", "run": "base"},
                {
                    "label": "DAPO",
                    "backbone": "Small-8B",
                    "run": "dapo",
                    "paper": {"A": 30.0, "N": 20.0, "Avg": 25.0, "All": 22.0},
                },
                {"label": "DelTA", "backbone": "Small-8B", "run": "delta", "paper": {"Overhead": 10.2}},
            ],
        },
        "cost": {  # at tiny: only the step time is shown, no evaluation is read
            "columns": [
                {"name": "Code", "benchmark": "N", "metric": "avg@k"},
                {"name": "Step time (s)", "metric": "step_time"},
            ],
            "rows": [
                {"label": "Base", "backbone": "Large-14B", "run": "base"},
                {"label": "DAPO", "backbone": "Large-14B", "run": "dapo"},
                {"label": "DelTA", "backbone": "Large-14B", "run": "delta"},
            ],
        },
        "unmapped": {  # no column at tiny: not built there
            "columns": [{"name": "NM", "benchmarks": ["N", "M"], "metric": "avg@k"}],
            "rows": [{"label": "DelTA", "backbone": "Large-14B", "run": "delta"}],
        },
    },
    "figures": {
        "selection": {"kind": "bars", "table": "main", "y": "A", "caption": "Bars."},
        "overhead": {"kind": "bars", "table": "main", "y": "Overhead"},
        "n_bars": {"kind": "bars", "table": "main", "y": "N"},  # N has no tiny stand-in: not drawn there
        "clouds": {
            "kind": "token_credit",
            "backbone": "Small-8B",
            "run": "delta",
            "top": 3,
            "min_count": 5,
            "caption": "Token clouds.",
        },
    },
}

SUITES = {"sa": ([8, 4, 0, 2], [1, 1, 0, 0]), "sb": ([0, 0, 8, 8, 4], [0, 0, 1, 1, 1])}
# t_step per step, per (run, seed): delta is slower than dapo
STEPS = {
    ("dapo", 0): [1.0, 1.2, 0.8, 1.0],
    ("dapo", 1): [1.1, 0.9],
    ("delta", 0): [1.3, 1.1, 1.2, 1.2],
    ("delta", 1): [1.0, 1.4],
}


def _paper(data: dict | None = None):
    return parse_paper(copy.deepcopy(data or PAPER), "tb.yaml")


def _write_eval(evals_dir: Path, backbone: str, run: str, seed: int) -> Path:
    blocks = {
        name: {
            "n_questions": len(c),
            "k": K,
            "metrics": {},
            "per_question": {"ids": [f"{name}-{i}" for i in range(len(c))], "greedy": g, "n": K, "c": c},
        }
        for name, (c, g) in SUITES.items()
    }  # no suite for N / M: the tiny world has none
    key = f"tiny/{backbone}/{run}/s{seed}"
    data = {
        "suites": blocks,
        "k": K,
        "provenance": {
            "run_key": key,
            "mlflow_run_id": f"ev-{run}-{seed}",
            "commit": "abc123",
            "config": f"cfg/{key}.yaml",
        },
    }
    path = metrics_path(evals_dir, backbone, run, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _write_run(runs_dir: Path, backbone: str, run: str, seed: int, times: list[float], done: bool = True) -> Path:
    path = run_metrics_path(runs_dir, backbone, run, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "step": i,
                    "reward_mean": 0.1 * i,
                    "response_len_mean": 9.0 + i,
                    "entropy_mean": 1.0 / (1 + i),
                    "t_step": t,
                }
            )
            + "\n"
            for i, t in enumerate(times)
        )
    )
    (path.parent / "config.yaml").write_text("x: 1\n")
    if done:
        key = f"tiny/{backbone}/{run}/s{seed}"
        (path.parent / "DONE").write_text(
            json.dumps({"run_key": key, "mlflow_run_id": f"tr-{run}-{seed}", "commit": "abc123"})
        )
    return path


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """results/tiny/{evals,runs} for the rows of the toy tables, seeds 0 and 1."""
    root = tmp_path / "results"
    for backbone in ("tiny-s", "tiny-m"):
        for seed in (0, 1):
            for run in ("base", "dapo", "delta"):
                if backbone == "tiny-s":  # the cost table (tiny-m) must not need evaluations
                    _write_eval(root / "tiny" / "evals", backbone, run, seed)
                if run != "base":
                    _write_run(root / "tiny" / "runs", backbone, run, seed, STEPS[(run, seed)])
    return root


# ----------------------------------------------------------------------------------------------
# spec: null mappings, step_time columns, figure kinds


def test_null_mapping_and_scale_views():
    tb = _paper()
    assert tb.has_suite("A", "tiny") and not tb.has_suite("N", "tiny") and tb.has_suite("N", "paper")
    assert tb.suite_for("N", "paper") == "bench-n"
    with pytest.raises(ValueError, match=r"benchmarks\.N has no stand-in suite at scale 'tiny'.*\['paper'\]"):
        tb.suite_for("N", "tiny")
    with pytest.raises(ValueError, match=r"'micro'.*choices: \['paper', 'tiny'\]"):
        tb.has_suite("A", "micro")
    assert [c.name for c in tb.columns_at("main", "tiny")] == ["A", "Avg", "All", "Step time (s)", "Overhead"]
    assert [c.name for c in tb.omitted_columns("main", "tiny")] == ["N", "NM"]
    assert tb.leaves_at("main", "All", "tiny") == ([("A", "avg@k"), ("B", "avg@k")], ["N", "M"])
    assert len(tb.columns_at("main", "paper")) == 7 and not tb.omitted_columns("main", "paper")
    assert tb.tables_at("tiny") == ["main", "cost"] and tb.tables_at("paper") == ["main", "cost", "unmapped"]
    assert not tb.needs_evals("cost", "tiny") and tb.needs_evals("cost", "paper")
    assert tb.figures_at("tiny") == ["selection", "overhead", "clouds"] and "n_bars" in tb.figures_at("paper")
    step, over = tb.table("main").column("Step time (s)"), tb.table("main").column("Overhead")
    assert step.is_training and step.relative_to is None and over.relative_to == "dapo"
    assert tb.table("main").leaves(step) == []
    clouds = tb.figures["clouds"]
    assert (clouds.kind, clouds.backbone, clouds.run, clouds.top, clouds.min_count) == (
        "token_credit",
        "Small-8B",
        "delta",
        3,
        5,
    )
    data = copy.deepcopy(PAPER)
    del data["figures"]["clouds"]["top"], data["figures"]["clouds"]["min_count"]
    assert (_paper(data).figures["clouds"].top, _paper(data).figures["clouds"].min_count) == (15, 20)


COLS = ["tables", "main", "columns"]
B_ERRORS = {
    "step_time with a benchmark": (
        _edit([*COLS, 5, "benchmark"], "A"),
        "columns[5] (Step time (s)).benchmark",
        "takes no benchmark",
    ),
    "step_time with weighting": (_edit([*COLS, 5, "weighting"], "count"), "weighting", "averages no suites"),
    "accuracy without benchmark": (
        _edit([*COLS, 0], {"name": "A", "metric": "avg@k"}),
        "columns[0]",
        "exactly one of benchmark / benchmarks / average_of",
    ),
    "relative_to on accuracy": (_edit([*COLS, 0, "relative_to"], "dapo"), "relative_to", "training-cost column only"),
    "relative_to unknown run": (
        _edit([*COLS, 6, "relative_to"], "dapoo"),
        "relative_to",
        "unknown value 'dapoo'; choices: ['dapo', 'delta']",
    ),
    "relative_to without reference row": (
        _edit(["tables", "main", "rows", 1, "backbone"], "Large-14B"),
        "(Overhead).relative_to",
        "no row of run 'dapo' on backbone 'Small-8B'",
    ),
    "average of step time": (
        _edit([*COLS, 6], {"name": "X", "average_of": ["A", "Step time (s)"]}),
        "average_of",
        "training-cost column",
    ),
    "null backbone": (_edit(["backbones", "Small-8B", "tiny"], None), "backbones.Small-8B.tiny", "non-empty string"),
    "benchmark missing a scale": (
        _edit(["benchmarks", "N"], {"paper": "bench-n"}),
        "benchmarks.N",
        "no mapping for scale(s) ['tiny']",
    ),
    "bars with x": (_edit(["figures", "selection", "x"], "A"), "figures.selection.x", "takes no key 'x'"),
    "bars unknown y": (_edit(["figures", "selection", "y"], "Nope"), "figures.selection.y", "'Nope'"),
    "bars without table": (_edit(["figures", "selection", "table"], _DELETE), "figures.selection.table", "None"),
    "token_credit top 0": (_edit(["figures", "clouds", "top"], 0), "figures.clouds.top", "positive integer"),
    "token_credit base run": (_edit(["figures", "clouds", "run"], "base"), "figures.clouds.run", "'base'"),
    "unknown figure kind": (
        _edit(["figures", "clouds", "kind"], "clouds"),
        "kind",
        "['replacement_curves', 'token_histograms', 'bars', 'token_credit', 'scatter']",
    ),
}


@pytest.mark.parametrize("case", sorted(B_ERRORS))
def test_b_spec_errors_name_key_and_problem(case: str):
    mutate, key, problem = B_ERRORS[case]
    data = copy.deepcopy(PAPER)
    mutate(data)
    with pytest.raises(ValueError) as info:
        parse_paper(data, "tb.yaml")
    message = str(info.value)
    assert message.startswith("tb.yaml: ") and key in message and problem in message, message


# ----------------------------------------------------------------------------------------------
# build: omitted / partially averaged columns, step time, relative_to


def test_unmapped_benchmarks_omitted_and_partially_averaged(results: Path):
    tb = _paper()
    df = build_table(tb, "main", "tiny", [0], results / "tiny" / "evals", k=K)
    assert list(df.columns) == list(LONG_COLUMNS)
    assert set(df["column"]) == {"A", "Avg", "All", "Step time (s)", "Overhead"}  # N, NM omitted
    a_mean = 100 * (1 + 0.5 + 0 + 0.25) / 4
    avg = _cell(df, "DAPO", "Avg")  # average_of [A, N] -> A only
    assert avg.ours_mean == pytest.approx(a_mean) and avg.suites == "sa" and avg.left_out == "N"
    assert avg.paper == 25.0  # the paper's 2-benchmark value, kept beside ours (the notes warn)
    every = _cell(df, "DAPO", "All")  # count-weighted over A and B only
    assert every.ours_mean == pytest.approx(100 * (1.75 + 2.5) / 9) and every.left_out == "N;M"
    assert every.n_questions == 9 and _cell(df, "DAPO", "A").left_out == ""
    md = table_markdown(df, tb.table("main"), tb)
    for text in (
        "Columns **omitted** (none of their benchmarks has a tiny stand-in): N (N), NM (N, M).",
        "**Avg** averages only 1 of its 2 benchmarks here (left out: N)",
        "**All** averages only 2 of its 4 benchmarks here (left out: N, M); its *paper* number is the "
        "paper's 4-benchmark value: do not compare the two.",
        "- N -> no tiny stand-in (left out)",
        "- A -> tiny suite `sa`",
        "**averages 2 of the paper's 4 benchmarks**: left out (no tiny stand-in): N, M",
    ):
        assert text in md, text
    assert "| N ours (tiny)" not in md and "NM ours" not in md
    at_paper = _paper()  # at paper scale nothing is left out (the suites are the paper's)
    assert not at_paper.omitted_columns("main", "paper")


def test_step_time_mean_ci_relative_and_base(results: Path):
    tb = _paper()
    df = build_table(tb, "main", "tiny", [0, 1], results / "tiny" / "evals", k=K)
    dapo_t = np.array(STEPS[("dapo", 0)] + STEPS[("dapo", 1)])
    delta_t = np.array(STEPS[("delta", 0)] + STEPS[("delta", 1)])
    step = _cell(df, "DAPO", "Step time (s)")
    assert step.ours_mean == pytest.approx(dapo_t.mean())  # all steps of both seeds pooled
    assert step.ours_lo < step.ours_mean < step.ours_hi
    assert (step.unit, step.metric, step.n_steps, step.n_questions, step.seeds) == ("s", "step_time", 6, 0, "0;1")
    assert step.mlflow_run_ids == "tr-dapo-0;tr-dapo-1" and step.commits == "abc123;abc123"
    assert step.sources.endswith("runs/tiny-s/dapo/s1/metrics.jsonl") and step.configs.endswith("s1/config.yaml")
    base = _cell(df, "Base", "Step time (s)")
    assert math.isnan(base.ours_mean) and base.sources == "" and base.n_steps == 0
    over = _cell(df, "DelTA", "Overhead")
    assert over.ours_mean == pytest.approx(100 * (delta_t.mean() / dapo_t.mean() - 1))
    assert over.ours_lo < over.ours_mean < over.ours_hi and over.unit == "% vs dapo" and over.paper == 10.2
    assert over.detail == f"{delta_t.mean():.3f} s vs {dapo_t.mean():.3f} s (dapo)"
    ref = _cell(df, "DAPO", "Overhead")
    assert (ref.ours_mean, ref.ours_lo, ref.ours_hi) == (0.0, 0.0, 0.0) and ref.detail.startswith("reference: ")
    again = build_table(tb, "main", "tiny", [0, 1], results / "tiny" / "evals", k=K)  # fixed bootstrap seed
    assert again["ours_lo"].equals(df["ours_lo"])
    md = table_markdown(df, tb.table("main"), tb)
    assert f"| {step.ours_mean:.2f} [{step.ours_lo:.2f}, {step.ours_hi:.2f}] |" in md
    assert f"+{over.ours_mean:.2f}% [{over.ours_lo:+.2f}%, {over.ours_hi:+.2f}%] | +10.20% |" in md
    assert f"reference ({dapo_t.mean():.3f} s)" in md
    base_line = next(line for line in md.splitlines() if line.startswith("| Small-8B | Base |"))
    assert base_line.endswith("|  | — |  | — |")  # base: empty step-time cells
    assert "mean wall time per RL step" in md and "vs run `dapo` on the same backbone" in md
    delta_line = next(line for line in md.splitlines() if line.startswith("- DelTA / Small-8B"))
    assert "MLflow run ids ev-delta-0, ev-delta-1, tr-delta-0, tr-delta-1;" in delta_line  # evals, then training
    assert "runs/tiny-s/delta/s1/metrics.jsonl`" in delta_line.split("step times from ")[1]
    assert "step times from" not in next(line for line in md.splitlines() if line.startswith("- Base / Small-8B"))


def test_step_time_only_table_reads_no_evaluation_and_roundtrips(results: Path, tmp_path: Path):
    tb = _paper()
    df = build_table(tb, "cost", "tiny", [0, 1], results / "tiny" / "evals", k=K)  # no tiny-m evals exist
    assert set(df["column"]) == {"Step time (s)"} and len(df) == 3
    out_csv, out_md = tmp_path / "t" / "cost.csv", tmp_path / "t" / "cost.md"
    write_table(df, tb.table("cost"), tb, out_csv, out_md)
    back = pd.read_csv(out_csv)
    assert list(back.columns) == list(LONG_COLUMNS)
    assert table_markdown(back, tb.table("cost"), tb) == out_md.read_text()  # the CSV carries everything
    md = out_md.read_text()
    assert "Code (N)" in md and "Our accuracy cells" not in md and "Our step-time cells" in md
    with pytest.raises(ValueError, match=r"table 'unmapped' has no column at scale 'tiny'.*\['main', 'cost'\]"):
        build_table(tb, "unmapped", "tiny", [0], results / "tiny" / "evals", k=K)
    with pytest.raises(FileNotFoundError, match=r"runs/tiny-m/dapo/s7/metrics\.jsonl is missing"):
        build_table(tb, "cost", "tiny", [7], results / "tiny" / "evals", k=K)


def test_read_step_times_resumed_cut_and_missing(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0, "t_step": 2.0}\n{"step": 1, "t_step": 3.0}\n{"step": 1, "t_step": 5.0}\n'
        '{"step": 2, "t_step": NaN}\n{"step": 3, "t_st'
    )
    with pytest.warns(UserWarning, match="not valid JSON"):
        assert read_step_times(path).tolist() == [2.0, 5.0]  # resumed step 1 keeps its last record
    path.write_text('{"step": 0, "reward_mean": 1.0}\n')
    with pytest.raises(ValueError, match="no step with a finite 't_step'"):
        read_step_times(path)


# ----------------------------------------------------------------------------------------------
# figures: bars, token_credit


def test_bars_figure_from_the_table_csv(results: Path, tmp_path: Path):
    tb = _paper()
    df = build_table(tb, "main", "tiny", [0, 1], results / "tiny" / "evals", k=K)
    write_table(df, tb.table("main"), tb, tmp_path / "main.csv", tmp_path / "main.md")
    back = pd.read_csv(tmp_path / "main.csv")
    out = plot_bars(back, tb, tb.figures["selection"], tmp_path / "fig" / "bars.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000
    with pytest.warns(UserWarning, match="row 'Base'.*no 'Overhead' value"):
        out = plot_bars(back, tb, tb.figures["overhead"], tmp_path / "fig" / "overhead.png")
    assert out.stat().st_size > 5_000
    with pytest.raises(ValueError, match="column 'N' is not in the table frame"):
        plot_bars(back, tb, tb.figures["n_bars"], tmp_path / "fig" / "n.png")


TOKENS = [
    {"token": " ", "id": 3, "count": 50, "mean": 0.95},
    {"token": "=", "id": 4, "count": 40, "mean": 1.20},
    {"token": "7", "id": 5, "count": 30, "mean": 1.05},
    {"token": "\n", "id": 6, "count": 20, "mean": 0.82},
    {"token": "+", "id": 7, "count": 10, "mean": 1.10},
    {"token": "+", "id": 8, "count": 10, "mean": 0.90},  # same string as id 7: merged (count 20, mean 1.00)
    {"token": "x", "id": 9, "count": 4, "mean": 1.50},  # below min_count: not ranked
    {"token": "`|", "id": 10, "count": 6, "mean": 0.85},
]


def _token_credit(tmp_path: Path, tokens=TOKENS) -> Path:
    path = tmp_path / "token_credit.json"
    path.write_text(
        json.dumps({"tokens": tokens, "n_tokens": sum(t["count"] for t in tokens), "steps": 4, "weight": "credit"})
    )
    return path


def test_token_credit_ranking_plot_and_table(tmp_path: Path):
    data = load_token_credit(_token_credit(tmp_path))
    assert visible(" a\n\t") == "␣a↵⇥" and visible("") == "∅" and visible("\x00") == "\\x00"
    ranking = rank_tokens(data, top=3, min_count=5)
    top = ranking[ranking["side"] == "top"]
    bottom = ranking[ranking["side"] == "bottom"]
    assert top["token"].tolist() == ["=", "7", "+"] and top["rank"].tolist() == [1, 2, 3]
    assert bottom["token"].tolist() == ["\n", "`|", " "]
    plus = top[top["token"] == "+"].iloc[0]
    assert (plus["ids"], plus["count"], plus["mean"]) == ("7;8", 20, pytest.approx(1.0))
    assert overall_mean(data) == pytest.approx(sum(t["count"] * t["mean"] for t in TOKENS) / 170)
    png = plot_token_credit(ranking, tmp_path / "fig" / "clouds.png", "toy clouds", reference=overall_mean(data))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    meta = {
        "paper_title": "Toy",
        "figure": "clouds",
        "caption": "Token clouds.",
        "scale": "tiny",
        "paper_backbone": "Small-8B",
        "backbone": "tiny-s",
        "run": "delta",
        "seed": 0,
        "top": 3,
        "min_count": 5,
        "run_key": "tiny/tiny-s/delta/s0",
        "mlflow_run_id": "tr-delta-0",
        "commit": "abc123",
    }
    write_token_credit(ranking, data, meta, tmp_path / "fig" / "clouds.md", tmp_path / "fig" / "clouds.csv")
    csv = pd.read_csv(tmp_path / "fig" / "clouds.csv", keep_default_na=False)
    assert len(csv) == 6 and set(csv["side"]) == {"top", "bottom"} and (csv["run_key"] == "tiny/tiny-s/delta/s0").all()
    assert csv["shown"].tolist()[3] == "↵" and (csv["source"] == str(tmp_path / "token_credit.json")).all()
    md = (tmp_path / "fig" / "clouds.md").read_text()
    for text in (
        "NOT the paper's tokens",
        "the 6 of 7 strings generated at least 5 times",
        "| 1 | `=` | 4 | 40 | 1.200 |",
        "| 1 | `↵` | 6 | 20 | 0.820 |",
        "`` `\\| ``",
        "tr-delta-0",
    ):
        assert text in md, text
    assert "the two lists overlap" not in md
    write_token_credit(rank_tokens(data, 4, 5), data, meta | {"top": 4}, tmp_path / "o.md", tmp_path / "o.csv")
    assert "Only 6 strings qualify (< 2 x 4): the two lists overlap." in (tmp_path / "o.md").read_text()
    empty = rank_tokens(data, top=3, min_count=1000)
    assert empty.empty
    png = plot_token_credit(empty, tmp_path / "fig" / "empty.png", "nothing", reference=1.0)
    assert png.stat().st_size > 1_000


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d.pop("steps"), "steps: missing key"),
        (lambda d: d["tokens"][1].update(mean=float("nan")), "tokens[1].mean: invalid value nan"),
        (lambda d: d["tokens"][2].pop("count"), "tokens[2].count: missing key"),
        (lambda d: d.update(tokens={"a": 1}), "tokens: expected list"),
    ],
)
def test_token_credit_schema_errors(tmp_path: Path, edit, needle):
    data = {"tokens": copy.deepcopy(TOKENS), "n_tokens": 170, "steps": 4, "weight": "credit"}
    edit(data)
    path = tmp_path / "token_credit.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_token_credit(path)
    assert str(path) in str(info.value) and needle in str(info.value)
    with pytest.raises(FileNotFoundError, match="re-trained"):
        load_token_credit(tmp_path / "missing.json")


# ----------------------------------------------------------------------------------------------
# the CLI verbs on a temporary config tree (table: step_time only; figure: bars and token_credit)


@pytest.fixture
def tb_configs(tmp_path: Path, monkeypatch) -> Path:
    """configs/ copy with papers/tb.yaml; cli.build_plan reads it."""
    cfg_dir = tmp_path / "configs"
    shutil.copytree(plan_mod.CONFIG_DIR, cfg_dir)
    (cfg_dir / "papers" / "tb.yaml").write_text(yaml.safe_dump(PAPER, sort_keys=False, allow_unicode=True))
    monkeypatch.setattr(cli, "build_plan", lambda pipe, validate=True: plan_mod.build_plan(pipe, cfg_dir, validate))
    pipe = tmp_path / "pipeline.yaml"
    pipe.write_text(yaml.safe_dump({"scale": "tiny", "papers": ["tb"], "seeds": [0, 1], "results": "results"}))
    return pipe


def test_cli_table_and_figures(results: Path, tb_configs: Path):
    common = ["--results", str(results), "--pipeline-config", str(tb_configs)]
    cli.main([*common, "table", "--paper", "tb", "--table", "cost"])
    fill = dict(results=results, scale="tiny", paper="tb")
    cost = pd.read_csv(paths.fmt(paths.TABLE_CSV, table="cost", **fill))
    assert set(cost["column"]) == {"Step time (s)"}
    assert paths.fmt(paths.CURVES_PNG, table="cost", **fill).stat().st_size > 5_000
    cli.main([*common, "table", "--paper", "tb", "--table", "main"])
    cli.main([*common, "figure", "--paper", "tb", "--name", "selection"])
    assert paths.fmt(paths.FIGURE_PNG, figure="selection", **fill).read_bytes()[:4] == b"\x89PNG"
    run_dir = paths.fmt(paths.RUN_DIR, results=results, scale="tiny", backbone="tiny-s", run="delta", seed=0)
    shutil.copy(
        _token_credit(run_dir.parent),
        paths.fmt(paths.RUN_TOKEN_CREDIT, results=results, scale="tiny", backbone="tiny-s", run="delta", seed=0),
    )
    cli.main([*common, "figure", "--paper", "tb", "--name", "clouds"])
    for pattern in (paths.FIGURE_PNG, paths.FIGURE_MD, paths.FIGURE_CSV):
        assert paths.fmt(pattern, figure="clouds", **fill).is_file()
    md = paths.fmt(paths.FIGURE_MD, figure="clouds", **fill).read_text()
    assert "Run `delta` on Small-8B (`tiny-s`), seed 0" in md and "tr-delta-0" in md
    with pytest.raises(SystemExit, match="cannot be drawn at scale 'tiny'"):
        cli.main([*common, "figure", "--paper", "tb", "--name", "n_bars"])
