"""The reproduction ledger (creditlab.tables.ledger): bootstrap and Holm against direct readings, claim
validation in the paper config, a ledger built from small synthetic evaluations, and the verdict strings."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from creditlab.papers.load import parse_paper
from creditlab.tables import ledger as L
from creditlab.tables import stats as S
from creditlab.tables.build import build_table
from creditlab.tables.load import metrics_path, run_metrics_path
from table_helpers import write_eval

K = 8
PAPER = {
    "paper": "tl",
    "title": "Ledger toy (test fixture)",
    "backbones": {"Small": {"tiny": "tiny-s", "paper": "small"}, "Large": {"tiny": "tiny-m", "paper": "large"}},
    "benchmarks": {
        "A": {"tiny": "sa", "paper": "a"},
        "B": {"tiny": "sb", "paper": "b"},
        "N": {"tiny": None, "paper": "n"},
    },
    "runs": {"dapo": {"method": "dapo"}, "delta": {"method": "delta"}, "same": {"method": "dapo"}},
    "tables": {
        "main": {
            "columns": [
                {"name": "A", "benchmark": "A", "metric": "avg@k"},
                {"name": "B", "benchmark": "B", "metric": "avg@k"},
                {"name": "N", "benchmark": "N", "metric": "avg@k"},
                {"name": "Avg", "average_of": ["A", "B"]},
                {"name": "Step time (s)", "metric": "step_time"},
            ],
            "rows": [
                {"label": "Base", "backbone": "Small", "run": "base"},
                {"label": "DAPO", "backbone": "Small", "run": "dapo", "paper": {"A": 30.0}},
                {"label": "Same", "backbone": "Small", "run": "same"},
                {"label": "DelTA", "backbone": "Small", "run": "delta", "paper": {"A": 35.0}},
                {"label": "DelTA", "backbone": "Large", "run": "delta"},
            ],
        },
    },
    "claims": [
        {
            "id": "delta-beats-dapo",
            "text": "DelTA > DAPO",
            "table": "main",
            "column": "Avg",
            "kind": "better",
            "backbone": "Small",
            "row": "DelTA",
            "over": ["DAPO"],
        },
        {
            "id": "dapo-beats-delta",
            "text": "reversed",
            "table": "main",
            "column": "A",
            "kind": "better",
            "backbone": "Small",
            "row": "DAPO",
            "over": ["DelTA"],
        },
        {
            "id": "same",
            "text": "a tie",
            "table": "main",
            "column": "A",
            "kind": "better",
            "backbone": "Small",
            "row": "Same",
            "over": ["DAPO"],
        },
        {
            "id": "best",
            "text": "DelTA best",
            "table": "main",
            "column": "Avg",
            "kind": "best_of",
            "backbone": "Small",
            "row": "DelTA",
            "over": ["DAPO", "Base"],
        },
        {
            "id": "order",
            "text": "DelTA > DAPO > Base",
            "table": "main",
            "column": "A",
            "kind": "order",
            "backbone": "Small",
            "rows": ["DelTA", "DAPO", "Base"],
        },
        {
            "id": "between",
            "text": "DAPO in the middle",
            "table": "main",
            "column": "A",
            "kind": "between",
            "backbone": "Small",
            "row": "DAPO",
            "over": ["Base"],
            "under": ["DelTA"],
        },
        {
            "id": "faster",
            "text": "DAPO steps are faster",
            "table": "main",
            "column": "Step time (s)",
            "kind": "better",
            "direction": "lower",
            "backbone": "Small",
            "row": "DAPO",
            "over": ["DelTA"],
        },
        {
            "id": "no-standin",
            "text": "on N",
            "table": "main",
            "column": "N",
            "kind": "better",
            "backbone": "Small",
            "row": "DelTA",
            "over": ["DAPO"],
        },
    ],
}

N_Q = 40
# correct counts out of K per question: base < dapo < delta on every question; `same` = dapo
_BASE = [i % 3 for i in range(N_Q)]
COUNTS = {
    "base": _BASE,
    "dapo": [c + 2 for c in _BASE],
    "same": [c + 2 for c in _BASE],
    "delta": [c + 4 for c in _BASE],
}
STEPS = {"dapo": [1.0, 1.1, 0.9, 1.0, 1.05, 0.95] * 3, "same": [1.0] * 6, "delta": [2.0, 2.1, 1.9, 2.0] * 3}


def _paper(data: dict | None = None):
    return parse_paper(copy.deepcopy(data or PAPER), "tl.yaml")


def _write(root: Path) -> None:
    for backbone in ("tiny-s", "tiny-m"):
        for run, c in COUNTS.items():
            write_eval(
                metrics_path(root / "tiny" / "evals", backbone, run, 0),
                {"sa": c, "sb": c},
                K,
                f"tiny/{backbone}/{run}/s0",
                f"id-{run}",
                f"cfg/{run}.yaml",
                greedy_above=3,
            )
            if run != "base":
                rpath = run_metrics_path(root / "tiny" / "runs", backbone, run, 0)
                rpath.parent.mkdir(parents=True, exist_ok=True)
                rpath.write_text("".join(json.dumps({"step": i, "t_step": t}) + "\n" for i, t in enumerate(STEPS[run])))


# ---------------------------------------------------------------------------------------- statistics


def test_identical_runs_give_zero_difference_and_a_ci_containing_zero():
    x = np.random.default_rng(1).random(50)
    diff, lo, hi = S.paired_bootstrap_diff(x, x.copy(), n_boot=500, seed=0)
    assert diff == 0.0 and lo == 0.0 and hi == 0.0  # paired: every resample's difference is exactly 0
    assert S.single_verdict(lo, hi) == S.NOISE


def test_better_on_every_question_holds_and_reversed_is_contradicted():
    b = np.random.default_rng(2).random(30)
    a = b + 0.1
    diff, lo, hi = S.paired_bootstrap_diff(a, b, n_boot=500)
    assert diff == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    assert S.single_verdict(lo, hi) == S.HOLDS
    _, lo, hi = S.paired_bootstrap_diff(b, a, n_boot=500)
    assert S.single_verdict(lo, hi) == S.CONTRADICTED


def test_paired_bootstrap_matches_a_direct_reading():
    """The bounds are the alpha / 1 - alpha quantiles of the mean differences of jointly resampled indices."""
    rng = np.random.default_rng(3)
    a, b = rng.random(20), rng.random(20)
    diff, lo, hi, p, p_rev = S.paired_bootstrap_diff_suites([a], [b], n_boot=300, seed=7)
    idx = np.random.default_rng(7).integers(0, 20, size=(300, 20))
    boots = a[idx].mean(axis=1) - b[idx].mean(axis=1)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert lo == pytest.approx(np.quantile(boots, 0.05)) and hi == pytest.approx(np.quantile(boots, 0.95))
    assert p == pytest.approx((1 + (boots <= 0).sum()) / 301)
    assert p_rev == pytest.approx((1 + (boots >= 0).sum()) / 301)


def test_seed_columns_are_resampled_with_the_questions():
    """[questions, seeds] arrays: each draw takes B questions and S seeds with replacement (seed s of both rows
    together, the same seeds in every suite): a direct reading with the same draws, one-seed columns equal the
    questions-only test, and a difference that flips sign between training seeds is noise although every
    seed-averaged question favours A."""
    rng = np.random.default_rng(4)
    a = [rng.random((12, 3)), rng.random((7, 3))]
    b = [rng.random((12, 3)), rng.random((7, 3))]
    diff, lo, hi, p, p_rev = S.paired_bootstrap_diff_suites(a, b, "count", n_boot=400, seed=9)
    draws = np.random.default_rng(9)
    idx = [draws.integers(0, 12, size=(400, 12)), draws.integers(0, 7, size=(400, 7))]
    seeds = draws.integers(0, 3, size=(400, 3))
    boots = []
    for r in range(400):
        total = 0.0
        for x, y, i in zip(a, b, idx):  # count weighting: question-count weighted mean over suites
            total += len(x) * (x[i[r]][:, seeds[r]].mean() - y[i[r]][:, seeds[r]].mean())
        boots.append(total / 19)
    boots = np.array(boots)
    assert diff == pytest.approx((a[0].sum() + a[1].sum() - b[0].sum() - b[1].sum()) / 57)
    assert lo == pytest.approx(np.quantile(boots, 0.05)) and hi == pytest.approx(np.quantile(boots, 0.95))
    assert p == pytest.approx((1 + (boots <= 0).sum()) / 401) and p_rev == pytest.approx((1 + (boots >= 0).sum()) / 401)
    one = [x[:, :1] for x in a], [y[:, :1] for y in b]
    assert S.paired_bootstrap_diff_suites(*one, n_boot=300, seed=2)[:3] == pytest.approx(
        S.paired_bootstrap_diff_suites([x[:, 0] for x in a], [y[:, 0] for y in b], n_boot=300, seed=2)[:3]
    )
    base = rng.random((200, 1)) * 0.01
    flips = base + np.array([[0.6, -0.5, 0.05]])  # seed 0: A far ahead, seed 1: far behind, seed 2: level
    per_seed = S.paired_bootstrap_diff_suites([flips], [np.repeat(base, 3, axis=1)], n_boot=2000, seed=0)
    averaged = S.paired_bootstrap_diff_suites([flips.mean(axis=1)], [base[:, 0]], n_boot=2000, seed=0)
    assert averaged[3] < 0.001 and S.single_verdict(*averaged[1:3]) == S.HOLDS  # questions alone: "holds"
    assert per_seed[3] > 0.05 and S.single_verdict(*per_seed[1:3]) == S.NOISE  # with the seeds: noise
    with pytest.raises(ValueError, match="same seeds"):
        S.paired_bootstrap_diff_suites([np.ones((3, 2))], [np.ones((3, 3))])


def test_several_suites_average_plain_or_weighted():
    a, b = [np.ones(2), np.zeros(6)], [np.zeros(2), np.zeros(6)]
    assert S.paired_bootstrap_diff_suites(a, b, "plain", n_boot=50)[0] == pytest.approx(0.5)
    assert S.paired_bootstrap_diff_suites(a, b, "count", n_boot=50)[0] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="same questions"):
        S.paired_bootstrap_diff_suites([np.ones(3)], [np.ones(4)])


def test_unpaired_bootstrap_over_steps():
    diff, lo, hi, p, _ = S.unpaired_bootstrap_diff(np.array([2.0, 2.1, 1.9]), np.array([1.0, 1.1, 0.9]), n_boot=300)
    assert diff == pytest.approx(1.0) and lo > 0.5 and p == pytest.approx(1 / 301)


def test_holm_against_a_hand_computation():
    # sorted 0.01, 0.02, 0.04 -> 3 * 0.01 = 0.03, 2 * 0.02 = 0.04, 1 * 0.04 = 0.04 (monotone)
    assert S.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    # step-down monotonicity: 0.03 * 2 = 0.06 < 3 * 0.025 = 0.075 -> lifted to 0.075
    assert S.holm([0.025, 0.03, 0.5]) == pytest.approx([0.075, 0.075, 0.5])
    assert S.holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # 2 * 0.6 capped at 1; 0.9 lifted to 1 (monotone)
    assert S.combined_verdict([0.01, 0.02], [0.99, 0.98]) == S.HOLDS
    assert S.combined_verdict([0.01, 0.04], [0.99, 0.97]) == S.HOLDS  # Holm: 0.02, 0.04 (both < 0.05)
    assert S.combined_verdict([0.03, 0.04], [0.97, 0.96]) == S.NOISE  # Holm: 0.06, 0.06
    assert S.combined_verdict([0.01, 0.9], [0.99, 0.01]) == S.CONTRADICTED


def test_verdict_strings():
    assert L.VERDICTS == (
        "holds",
        "contradicted",
        "not resolved (noise)",
        "not testable at this scale",
        "not decidable (no matched x: the series' measured ranges do not overlap)",
    )


# ---------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"kind": "greater"},
            r"kind: unknown value 'greater'; choices: \['better', 'best_of', 'order', 'between', "
            r"'matched_order'\]",
        ),
        ({"column": "Nope"}, r"column: unknown value 'Nope'; choices: \['A', 'B', 'N', 'Avg', 'Step time \(s\)'\]"),
        ({"table": "other"}, r"table: unknown value 'other'; choices: \['main'\]"),
        ({"row": "PPO"}, r"row: unknown row 'PPO' in table 'main' on backbone 'Small'; choices: \['Base', 'DAPO'"),
        ({"backbone": "Huge"}, r"backbone: unknown value 'Huge'; choices: \['Small', 'Large'\]"),
        ({"rows": ["DelTA", "DAPO"]}, r"a better claim takes no 'rows'"),
        ({"over": ["DAPO", "Base"]}, r"over: expected a list of 1 row labels"),
        ({"over": ["DelTA"]}, r"compares a row with itself"),
        ({"direction": "up"}, r"direction: unknown value 'up'; choices: \['higher', 'lower'\]"),
        ({"colour": 1}, r"unknown key 'colour'; choices: \['id', 'text'"),
    ],
)
def test_claim_validation_names_the_key_and_choices(change, message):
    data = copy.deepcopy(PAPER)
    data["claims"] = [dict(data["claims"][0], **change)]
    with pytest.raises(ValueError, match=message) as err:
        parse_paper(data, "tl.yaml")
    assert str(err.value).startswith("tl.yaml: claims[0]")


def test_a_label_on_several_backbones_needs_the_claims_backbone():
    data = copy.deepcopy(PAPER)
    claim = dict(data["claims"][0])
    del claim["backbone"]
    data["claims"] = [claim]
    with pytest.raises(ValueError, match="row 'DelTA' is on several backbones"):
        parse_paper(data, "tl.yaml")


def test_claims_in_the_paper_configs_are_valid():
    from creditlab.papers.load import load_paper

    root = Path(__file__).resolve().parents[1] / "configs" / "papers"
    for name in ("dlogp", "delta", "dfpo", "cancellation", "arca"):
        assert 2 <= len(load_paper(root / f"{name}.yaml").claims) <= 4


# ---------------------------------------------------------------------------------------- the ledger


def test_ledger_from_synthetic_evaluations(tmp_path: Path):
    root = tmp_path / "results"
    _write(root)
    paper = _paper()
    evals, runs = root / "tiny" / "evals", root / "tiny" / "runs"
    tables = {"main": build_table(paper, "main", "tiny", [0], evals, K, runs_dir=runs)}
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE runs (run_uuid TEXT, experiment_id INTEGER)")
        con.execute("INSERT INTO runs VALUES ('id-dapo', 3)")
    uri = f"sqlite:///{db}"
    df, results = L.build_ledger(paper, "tiny", [0], tables, evals, K, runs, uri)
    verdicts = {r.claim.id: r.verdict for r in results}
    assert verdicts == {
        "delta-beats-dapo": S.HOLDS,
        "dapo-beats-delta": S.CONTRADICTED,
        "same": S.NOISE,
        "best": S.HOLDS,
        "order": S.HOLDS,
        "between": S.HOLDS,
        "faster": S.HOLDS,
        "no-standin": L.NOT_TESTABLE,
    }
    by_id = {r.claim.id: r for r in results}
    assert by_id["delta-beats-dapo"].comparisons[0].diff == pytest.approx(100 * 2 / K)  # percentage points
    assert by_id["faster"].comparisons[0].diff == pytest.approx(1.0)  # lower is better: DelTA - DAPO seconds
    assert "unpaired bootstrap over RL steps" in by_id["faster"].test
    assert "Holm correction over the 2 comparisons" in by_id["order"].test
    cells = df[df["section"] == "cell"]
    assert len(cells) == len(tables["main"])
    dapo_a = cells[(cells["row"] == "DAPO") & (cells["column"] == "A")].iloc[0]
    assert dapo_a["paper"] == 30.0 and dapo_a["commits"] == "abc" and dapo_a["configs"] == "cfg/dapo.yaml"
    assert dapo_a["mlflow_links"] == f"{uri}/#/experiments/3/runs/id-dapo"
    delta_a = cells[(cells["row"] == "DelTA") & (cells["column"] == "A") & (cells["backbone"] == "tiny-s")].iloc[0]
    assert delta_a["mlflow_links"] == "id-delta"  # not in the store: the bare run id
    out_csv, out_md = tmp_path / "ledger" / "tl.csv", tmp_path / "ledger" / "tl.md"
    L.write_ledger(paper, "tiny", df, results, out_csv, out_md)
    md = out_md.read_text()
    assert "claims are tested on tiny models" in md and "NOT in the paper's setting" in md
    assert "### `delta-beats-dapo`: **holds**" in md and "### `no-standin`: **not testable at this scale**" in md
    assert "Hardware:" in md and "ledger-building machine" in md
    back = pd.read_csv(out_csv)
    assert list(back.columns) == list(L.LEDGER_COLUMNS)
    assert (back["section"] == "claim").sum() == len(PAPER["claims"])
