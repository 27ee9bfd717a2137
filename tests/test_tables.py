"""Tests of the table layer: paper specs, cell computation, CSV/Markdown output, figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from creditlab.papers.load import load_paper, load_papers
from creditlab.papers.spec import resolve_metric
from creditlab.tables.build import build_table, write_table
from creditlab.tables.figures import plot_training_curves
from creditlab.tables.frame import LONG_COLUMNS
from creditlab.tables.load import metrics_path, question_values
from creditlab.tables.render import table_markdown
from table_helpers import cell as _cell

FIXTURES = Path(__file__).parent / "fixtures" / "papers"
REPO = Path(__file__).resolve().parents[1]
TOY = FIXTURES / "toy.yaml"


# ----------------------------------------------------------------------------------------------
# spec


@pytest.fixture
def toy_data() -> dict:
    """The parsed YAML of the toy paper, to mutate into invalid configs."""
    return yaml.safe_load(TOY.read_text())


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _columns(data: dict) -> list[dict]:
    return data["tables"]["main"]["columns"]


def _rows(data: dict) -> list[dict]:
    return data["tables"]["main"]["rows"]


def test_toy_and_shipped_configs_load() -> None:
    toy = load_paper(TOY)
    assert toy.backbone_for("Huge-14B", "tiny") == "tiny-m"
    assert toy.suite_for("C", "paper") == "bench-c"
    table = toy.tables["main"]
    assert [c.name for c in table.columns][:2] == ["A", "B"]
    assert table.rows[1].paper == {"A": 35.73}  # null = not reported
    assert table.leaves(table.column("Avg")) == [("A", "avg@k"), ("B", "avg@k")]
    papers = load_papers(REPO / "configs" / "papers", ["dlogp"])
    assert papers["dlogp"].runs["dapo-ds"].method == "dapo"


def test_lookup_errors_name_choices() -> None:
    toy = load_paper(TOY)
    with pytest.raises(ValueError, match=r"'micro'.*choices: \['paper', 'tiny'\]"):
        toy.backbone_for("Big-7B", "micro")
    with pytest.raises(ValueError, match=r"'Z'.*choices: \['A', 'B', 'C'\]"):
        toy.suite_for("Z", "tiny")
    with pytest.raises(ValueError, match="unknown paper 'nope'.*toy"):
        load_papers(FIXTURES, ["nope"])


def _set(path: list, value):
    """A mutation setting data[path...] = value."""

    def mutate(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _append_row(data: dict) -> None:
    _rows(data).append({"label": "Base", "backbone": "Big-7B", "run": "r1"})


MAIN = ["tables", "main"]
SPEC_ERRORS = {
    "unknown run": (_set([*MAIN, "rows", 1, "run"], "r2"), "run", "'r2'", "['base', 'r1']"),
    "unknown backbone": (
        _set([*MAIN, "rows", 0, "backbone"], "Tiny-1B"),
        "backbone",
        "'Tiny-1B'",
        "['Big-7B', 'Huge-14B']",
    ),
    "unknown benchmark": (_set([*MAIN, "columns", 0, "benchmark"], "D"), "benchmark", "'D'", "['A', 'B', 'C']"),
    "unknown benchmark in list": (
        _set([*MAIN, "columns", 4, "benchmarks"], ["A", "D"]),
        "benchmarks[1]",
        "'D'",
        "['A', 'B', 'C']",
    ),
    "average_of missing": (
        _set([*MAIN, "columns", 3, "average_of"], ["A", "Z"]),
        "average_of",
        "'Z'",
        "['A', 'B', 'A-greedy']",
    ),
    "average_of later": (
        _set([*MAIN, "columns", 3, "average_of"], ["A", "Pass@k"]),
        "average_of",
        "'Pass@k'",
        "['A', 'B', 'A-greedy']",
    ),
    "paper number of no column": (_set([*MAIN, "rows", 0, "paper", "Q"], 1.0), "paper.Q", "'Q'", "'AvgCount'"),
    "column without source": (
        _set([*MAIN, "columns", 1], {"name": "B", "metric": "avg@k"}),
        "columns[1]",
        "exactly one",
        "'average_of'",
    ),
    "bad metric": (
        _set([*MAIN, "columns", 0, "metric"], "avg@32"),
        "metric",
        "'avg@32'",
        "['greedy', 'avg@k', 'pass@k', 'pass@1', 'replacement_rate', 'step_time', 'steps_to', 'train_mean', 'versus']",
    ),
    "duplicate row": (_append_row, "rows[2]", "duplicate row", "Base/Big-7B"),
    "unknown top-level key": (_set(["tabels"], {}), "tabels", "unknown key", "'tables'"),
    "reserved run name": (_set(["runs", "base"], {"method": "dapo"}), "runs.base", "reserved", None),
    "missing scale": (_set(["benchmarks", "C"], {"tiny": "sc"}), "benchmarks.C", "'paper'", "['paper', 'tiny']"),
    "unknown column key": (_set([*MAIN, "columns", 0, "metrics"], "greedy"), "metrics", "unknown key", "'metric'"),
}


@pytest.mark.parametrize("case", sorted(SPEC_ERRORS))
def test_spec_errors_name_file_key_and_choices(case: str, toy_data: dict, tmp_path: Path) -> None:
    mutate, key, problem, choices = SPEC_ERRORS[case]
    mutate(toy_data)
    path = _write(tmp_path, toy_data)
    with pytest.raises(ValueError) as info:
        load_paper(path)
    message = str(info.value)
    assert str(path) in message
    assert key in message and problem in message
    if choices is not None:
        assert choices in message


def test_resolve_metric() -> None:
    assert resolve_metric("avg@k", 8) == "avg@8"
    assert resolve_metric("pass@k", 16) == "pass@16"
    assert resolve_metric("pass@1", 8) == "pass@1"
    assert resolve_metric("greedy", 8) == "greedy"
    assert resolve_metric("pass@4", 8) == "pass@4"  # a fixed N (ARCA's pass@4)
    with pytest.raises(ValueError, match="choices"):
        resolve_metric("avg@32", 8)
    with pytest.raises(ValueError, match="positive"):
        resolve_metric("avg@k", 0)


# ----------------------------------------------------------------------------------------------
# build_table on synthetic evaluations with known per-question data

K = 4
# suite -> per-question (correct counts out of K, greedy correctness), seed 0
SEED0 = {
    "sa": ([4, 2, 0, 1], [1, 1, 0, 0]),
    "sb": ([0, 0, 4, 4, 2], [0, 0, 1, 1, 1]),
    "sc": ([1, 3], [0, 1]),
}
# seed 1 differs on suite sa only
SEED1 = {**SEED0, "sa": ([4, 4, 0, 1], [1, 1, 1, 0])}


def write_eval(
    evals_dir: Path,
    backbone: str,
    run: str,
    seed: int,
    suites: dict[str, tuple[list[int], list[int]]],
    summary: dict | None = None,
) -> Path:
    """Write a metrics.json in the evaluation's format with the given per-question data."""
    blocks = {}
    for name, (counts, greedy) in suites.items():
        blocks[name] = {
            "n_questions": len(counts),
            "k": K,
            "metrics": (summary or {}).get(name, {}),
            "per_question": {"ids": [f"{name}-{i}" for i in range(len(counts))], "greedy": greedy, "n": K, "c": counts},
        }
    run_key = f"tiny/{backbone}/{run}/s{seed}"
    data = {
        "suites": blocks,
        "k": K,
        "ks": [1, K],
        "settings": {"temperature": 1.0},
        "provenance": {
            "run_key": run_key,
            "mlflow_run_id": f"id-{run}-{seed}",
            "commit": "abc123",
            "config": f"results/tiny/runs/{run_key}/config.yaml",
            "scale": "tiny",
        },
    }
    path = metrics_path(evals_dir, backbone, run, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def evals(tmp_path: Path) -> Path:
    """Evaluations of the toy table's rows (base and r1 on tiny-s), seeds 0 and 1."""
    evals_dir = tmp_path / "evals"
    for run in ("base", "r1"):
        write_eval(evals_dir, "tiny-s", run, 0, SEED0)
        write_eval(evals_dir, "tiny-s", run, 1, SEED1)
    return evals_dir


def _pass(n: int, c: int, k: int) -> float:
    """Unbiased pass@k by hand: 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_question_values_by_hand() -> None:
    block = {"per_question": {"ids": list("abcd"), "greedy": [1, 0, 1, 0], "n": 4, "c": [4, 2, 0, 1]}}
    assert question_values(block, "greedy").tolist() == [1, 0, 1, 0]
    assert question_values(block, "avg@4").tolist() == [1.0, 0.5, 0.0, 0.25]
    assert np.allclose(question_values(block, "pass@2"), [1.0, 1 - 1 / 6, 0.0, 0.5])
    assert question_values(block, "pass@4").tolist() == [1.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="n=4"):
        question_values(block, "pass@8")


def test_build_table_single_seed_cells(evals: Path) -> None:
    toy = load_paper(TOY)
    df = build_table(toy, "main", "tiny", [0], evals, k=K)
    assert list(df.columns) == list(LONG_COLUMNS)
    assert len(df) == 2 * 6
    a = _cell(df, "Base", "A")
    assert a.ours_mean == pytest.approx(100 * (1 + 0.5 + 0 + 0.25) / 4)
    assert a.ours_lo <= a.ours_mean <= a.ours_hi and a.ours_lo < a.ours_hi
    assert (a.suites, a.metric, a.n_questions, a.backbone) == ("sa", "avg@4", 4, "tiny-s")
    assert a.paper == 14.79 and a.paper_backbone == "Big-7B" and a.scale == "tiny"
    assert _cell(df, "Base", "A-greedy").ours_mean == pytest.approx(50.0)
    b_mean = 100 * (0 + 0 + 1 + 1 + 0.5) / 5
    assert _cell(df, "Base", "B").ours_mean == pytest.approx(b_mean)
    avg = _cell(df, "Base", "Avg")  # plain mean of the two suite means
    assert avg.ours_mean == pytest.approx((43.75 + b_mean) / 2)
    assert avg.n_questions == 9 and avg.suites == "sa;sb"
    assert avg.ours_lo <= avg.ours_mean <= avg.ours_hi
    pass_k = _cell(df, "Base", "Pass@k")  # pass@4: solved at least once
    suite_means = [3 / 4, 3 / 5, 2 / 2]
    assert pass_k.ours_mean == pytest.approx(100 * np.mean(suite_means))
    assert pass_k.metric == "pass@4" and pass_k.suites == "sa;sb;sc"
    count = _cell(df, "Base", "AvgCount")  # weighted by question count = pooled mean
    pooled = (1 + 0.5 + 0 + 0.25 + 0.25 + 0.75) / 6
    assert count.ours_mean == pytest.approx(100 * pooled)
    assert math.isnan(_cell(df, "R1", "B").paper)  # null in the config
    assert math.isnan(_cell(df, "R1", "Avg").paper)
    assert _cell(df, "R1", "A").mlflow_run_ids == "id-r1-0"


def test_build_table_averages_seeds_per_question(evals: Path) -> None:
    toy = load_paper(TOY)
    df = build_table(toy, "main", "tiny", [0, 1], evals, k=K)
    a = _cell(df, "R1", "A")
    # per question, seeds averaged: [1, (0.5+1)/2, 0, 0.25]
    assert a.ours_mean == pytest.approx(100 * (1 + 0.75 + 0 + 0.25) / 4)
    assert a.n_questions == 4 and a.seeds == "0;1"
    assert a.mlflow_run_ids == "id-r1-0;id-r1-1"
    assert a.run_keys == "tiny/tiny-s/r1/s0;tiny/tiny-s/r1/s1"
    assert _cell(df, "R1", "A-greedy").ours_mean == pytest.approx(100 * (1 + 1 + 0.5 + 0) / 4)
    # a suite identical across seeds keeps its single-seed value
    assert _cell(df, "R1", "B").ours_mean == pytest.approx(100 * 2.5 / 5)


def test_build_table_errors(evals: Path) -> None:
    toy = load_paper(TOY)
    with pytest.raises(FileNotFoundError, match=r"run 'base'.*seed 7.*base/s7/metrics\.json"):
        build_table(toy, "main", "tiny", [7], evals, k=K)
    with pytest.raises(ValueError, match="n=4"):
        build_table(toy, "main", "tiny", [0], evals, k=8)
    write_eval(evals, "tiny-s", "base", 2, {"sa": SEED0["sa"]})
    with pytest.raises(ValueError, match=r"no suite 'sb'; choices: \['sa'\]"):
        build_table(toy, "main", "tiny", [2], evals, k=K)
    shuffled = {**SEED0, "sa": (SEED0["sa"][0][::-1], SEED0["sa"][1][::-1])}
    path = write_eval(evals, "tiny-s", "base", 3, shuffled)
    data = json.loads(path.read_text())
    data["suites"]["sa"]["per_question"]["ids"].reverse()
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="questions of suite 'sa' differ"):
        build_table(toy, "main", "tiny", [0, 3], evals, k=K)


def test_build_table_warns_when_summary_disagrees(evals: Path) -> None:
    summary = {"sa": {"avg@4": {"mean": 0.9, "lo": 0.8, "hi": 1.0}, "greedy": {"mean": 0.5, "lo": 0.0, "hi": 1.0}}}
    write_eval(evals, "tiny-s", "base", 4, SEED0, summary=summary)
    write_eval(evals, "tiny-s", "r1", 4, SEED0)
    with pytest.warns(UserWarning, match=r"avg@4 recomputed .* 0\.437500.* 0\.900000"):
        build_table(load_paper(TOY), "main", "tiny", [4], evals, k=K)


def test_write_table_csv_and_markdown(evals: Path, tmp_path: Path) -> None:
    toy = load_paper(TOY)
    df = build_table(toy, "main", "tiny", [0, 1], evals, k=K)
    out_csv, out_md = tmp_path / "t" / "main.csv", tmp_path / "t" / "main.md"
    write_table(df, toy.tables["main"], toy, out_csv, out_md)
    back = pd.read_csv(out_csv)
    assert list(back.columns) == list(LONG_COLUMNS) and len(back) == len(df)
    assert back["ours_mean"].tolist() == pytest.approx(df["ours_mean"].tolist())
    md = out_md.read_text()
    for text in (
        "NOT the paper's results",
        "not comparable in absolute value",
        "A -> tiny suite `sa`",
        "Big-7B -> tiny backbone `tiny-s`",
        "| Big-7B | Base |",
        "14.79",
        "51.52",
        "35.73",
        "A ours (tiny)",
        "A paper",
        "Commit: `abc123`",
        "id-r1-0, id-r1-1",
        "`results/tiny/runs/tiny/tiny-s/r1/s1/config.yaml`",
        "plain mean of the suite means of A, B",
        "pass@4, plain mean over `sa`, `sb`, `sc`",
    ):
        assert text in md, text
    a = _cell(df, "Base", "A")
    assert f"{a.ours_mean:.2f} [{a.ours_lo:.2f}, {a.ours_hi:.2f}]" in md
    assert "Huge-14B" not in md  # only the mappings the table uses
    at_paper = table_markdown(df.assign(scale="paper"), toy.tables["main"], toy)
    assert "they are comparable" in at_paper and "NOT the paper's" not in at_paper
    assert "A -> paper suite `bench-a`" in at_paper


# ----------------------------------------------------------------------------------------------
# figures


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_plot_training_curves_writes_png(tmp_path: Path) -> None:
    full = [
        {"step": s, "reward_mean": s / 10, "response_len_mean": 50 + s, "entropy_mean": 1 / (1 + s)} for s in range(10)
    ]
    partial = [{"step": s, "reward_mean": s / 20, "response_len_mean": 40 + s} for s in range(10)]
    a = _jsonl(tmp_path / "a.jsonl", full)
    b = _jsonl(tmp_path / "b.jsonl", partial)
    with open(b, "a") as fh:
        fh.write('{"step": 10, "reward_me')  # cut by a killed job
    with pytest.warns(UserWarning) as record:
        out = plot_training_curves({"DAPO": a, "Δlog p": b}, tmp_path / "fig" / "curves.png", title="toy")
    messages = " ".join(str(w.message) for w in record)
    assert "'entropy_mean'" in messages and "not valid JSON" in messages
    assert out.stat().st_size > 1000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
