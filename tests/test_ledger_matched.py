"""Claims at matched replacement rates (issue 20, item 6): the `matched_order` claim kind of the ledger. Each series
(a criterion's rows, one per threshold) is interpolated linearly in its measured replacement rate at common rates
inside every series' measured range; the links are decided by the paired bootstrap over seeds and questions (Holm
over the links); no overlap -> not decidable. The Δlog p paper's replacement-ranking claim is such a claim."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest

from creditlab.papers.load import load_paper, parse_paper
from creditlab.tables import ledger as L
from creditlab.tables import stats as S
from creditlab.tables.build import build_table
from creditlab.tables.load import metrics_path

ROOT = Path(__file__).resolve().parents[1]
K = 10  # samples per question
N_Q = 60


def _decode(criterion: str, threshold: float) -> dict:
    return {"criterion": criterion, "threshold": threshold, "gamma": 0.0}


# two criteria, three thresholds each, with (replacement rate %, accuracy %) per threshold chosen so that the first
# thresholds favour KL (D1 30% at 2% replaced < K1 40% at 8%) while at matched rates (the common range 8-10%) Δlog p
# is far ahead: D(8) = 55, D(10) = 60 vs K(8) = 40, K(10) = 43.3
CURVES = {
    "d1": (2.0, 30.0),
    "d2": (6.0, 50.0),
    "d3": (10.0, 60.0),
    "k1": (8.0, 40.0),
    "k2": (14.0, 50.0),
    "k3": (20.0, 58.0),
    "e1": (2.0, 30.0),
    "e2": (6.0, 50.0),
    "e3": (10.0, 60.0),  # Δlog p's curve (other questions' draws): a null
    "f1": (20.0, 70.0),
    "f2": (30.0, 75.0),
    "f3": (40.0, 80.0),  # far right: no overlap with Δlog p
}
PAPER = {
    "paper": "tm",
    "title": "Matched-rate toy (test fixture)",
    "backbones": {"Big": {"tiny": "tiny-s", "paper": "big"}},
    "benchmarks": {"A": {"tiny": "sa", "paper": "a"}},
    "runs": {"rl": {"method": "dapo"}},
    "decodes": {name: _decode("dlogp" if name[0] in "de" else "kl", i / 10) for i, name in enumerate(CURVES)},
    "tables": {
        "replacement": {
            "columns": [
                {"name": "Acc", "benchmark": "A", "metric": "avg@k"},
                {"name": "Replaced", "benchmark": "A", "metric": "replacement_rate"},
            ],
            "rows": [{"label": "RL", "backbone": "Big", "run": "rl"}]
            + [{"label": name.upper(), "backbone": "Big", "run": "rl", "decode": name} for name in CURVES],
        },
    },
    "claims": [
        {
            "id": "matched",
            "text": "D > K at matched rates",
            "table": "replacement",
            "column": "Acc",
            "kind": "matched_order",
            "x": "Replaced",
            "series": {"D": ["D1", "D2", "D3"], "K": ["K1", "K2", "K3"]},
        },
        {
            "id": "first",
            "text": "D > K at the first thresholds",
            "table": "replacement",
            "column": "Acc",
            "kind": "order",
            "rows": ["D1", "K1"],
        },
        {
            "id": "reversed",
            "text": "K > D",
            "table": "replacement",
            "column": "Acc",
            "kind": "matched_order",
            "x": "Replaced",
            "series": {"K": ["K1", "K2", "K3"], "D": ["D1", "D2", "D3"]},
        },
        {
            "id": "null",
            "text": "D > its copy",
            "table": "replacement",
            "column": "Acc",
            "kind": "matched_order",
            "x": "Replaced",
            "series": {"D": ["D1", "D2", "D3"], "E": ["E1", "E2", "E3"]},
        },
        {
            "id": "apart",
            "text": "D > F",
            "table": "replacement",
            "column": "Acc",
            "kind": "matched_order",
            "x": "Replaced",
            "series": {"D": ["D1", "D2", "D3"], "F": ["F1", "F2", "F3"]},
        },
        {
            "id": "three",
            "text": "D > K > F",
            "table": "replacement",
            "column": "Acc",
            "kind": "matched_order",
            "x": "Replaced",
            "series": {"D": ["D1", "D2", "D3"], "K": ["K1", "K2", "K3"], "F": ["F1", "F2", "F3"]},
        },
    ],
}


def _counts(acc: float, rng: np.random.Generator) -> list[int]:
    """Correct-sample counts (of K) per question whose mean is exactly acc % (questions vary around it)."""
    total = round(acc / 100 * K * N_Q)
    c = np.full(N_Q, total // N_Q)
    c[: total % N_Q] += 1
    for _ in range(N_Q):  # move samples between questions: the mean stays, the questions differ
        i, j = rng.integers(0, N_Q, 2)
        if c[i] < K and c[j] > 0:
            c[i] += 1
            c[j] -= 1
    return [int(x) for x in c]


def _write(root: Path, seeds=(0, 1)) -> Path:
    evals = root / "tiny" / "evals"
    rng = np.random.default_rng(0)
    for seed in seeds:
        for decode, (rate, acc) in [(None, (0.0, 65.0)), *CURVES.items()]:
            c = _counts(acc, rng)
            tokens = [1000] * N_Q
            wobble = rng.integers(-3, 4, N_Q)  # per-question rates around the series' rate (mean kept)
            resampled = [int(round(rate * 10)) + int(w - wobble.mean().round()) if decode else 0 for w in wobble]
            pq = {
                "ids": [f"a-{i}" for i in range(N_Q)],
                "greedy": [x > K // 2 for x in c],
                "n": K,
                "c": c,
                "tokens": tokens,
                "resampled": resampled,
            }
            data = {
                "suites": {"sa": {"n_questions": N_Q, "k": K, "metrics": {}, "per_question": pq}},
                "k": K,
                "provenance": {
                    "run_key": f"tiny/tiny-s/rl/s{seed}",
                    "mlflow_run_id": "",
                    "commit": "abc",
                    "config": "cfg.yaml",
                },
            }
            path = metrics_path(evals, "tiny-s", "rl", seed, decode)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data))
    return evals


def _results(tmp_path: Path) -> dict[str, L.ClaimResult]:
    evals = _write(tmp_path)
    paper = parse_paper(copy.deepcopy(PAPER), "tm.yaml")
    return {c.id: L.evaluate_claim(paper, c, "tiny", [0, 1], evals, K, tmp_path / "runs") for c in paper.claims}


# ---------------------------------------------------------------------------------------- the pieces


def test_interpolation_range_and_grid_by_hand():
    x, y = np.array([10.0, 2.0, 6.0, 6.0]), np.array([60.0, 30.0, 48.0, 52.0])  # unsorted, a repeated x averaged
    assert S.interpolate_curve(x, y, np.array([2.0, 4.0, 6.0, 8.0, 10.0])) == pytest.approx([30, 40, 50, 55, 60])
    assert S.interpolate_curve(x, y, np.array([0.0, 12.0])) == pytest.approx([30, 60])  # held at the ends
    assert S.matched_range([np.array([2.0, 6, 10]), np.array([8.0, 14, 20])]) == (8.0, 10.0)
    assert S.matched_range([np.array([2.0, 6, 10]), np.array([20.0, 30])]) is None
    assert S.matched_range([np.array([2.0, 10]), np.array([10.0, 30])]) == (10.0, 10.0)  # touching: one rate
    assert list(S.matched_grid(8.0, 10.0)) == pytest.approx([8 + 0.2 * i for i in range(11)])
    assert list(S.matched_grid(10.0, 10.0)) == [10.0]


def test_matched_gap_without_noise_is_the_mean_vertical_gap():
    grid = S.matched_grid(8.0, 10.0)
    d = (np.tile([2.0, 6.0, 10.0], (5, 1)), np.tile([30.0, 50.0, 60.0], (5, 1)))
    k = (np.tile([8.0, 14.0, 20.0], (5, 1)), np.tile([40.0, 50.0, 58.0], (5, 1)))
    gap = np.mean([(55 + 2.5 * (g - 8)) - (40 + 10 / 6 * (g - 8)) for g in grid])
    diff, lo, hi, p, p_rev = S.matched_gap_bootstrap(d, k, grid)
    assert diff == pytest.approx(gap) and lo == pytest.approx(gap) and hi == pytest.approx(gap)
    assert p == pytest.approx(1 / 5) and p_rev == pytest.approx(1.0)  # (1 + 0) / (1 + 4) draws


# ---------------------------------------------------------------------------------------- claims from evaluations


def test_matched_rates_decide_where_the_first_thresholds_mislead(tmp_path: Path):
    """At the first thresholds K looks better (the old test: contradicted); at matched rates D is ahead (holds), by
    the mean gap over the common range 8-10% that a hand interpolation of the cells gives; reversed: contradicted;
    a copy: noise; no overlap: not decidable, with the ranges in the note."""
    res = _results(tmp_path)
    assert res["first"].verdict == S.CONTRADICTED
    matched = res["matched"]
    assert matched.verdict == S.HOLDS and "matched Replaced" in matched.test and "interpolated linearly" in matched.test
    (comp,) = matched.comparisons
    assert (comp.winner[0], comp.loser[0]) == ("D", "K") and comp.lo > 0
    # by hand from the table's own cells (seed-averaged question means)
    paper = parse_paper(copy.deepcopy(PAPER), "tm.yaml")
    df = build_table(paper, "replacement", "tiny", [0, 1], tmp_path / "tiny" / "evals", K)
    cell = {(r["row"], r["column"]): r["ours_mean"] for r in df.to_dict("records")}
    xd, yd = [cell[(f"D{i}", "Replaced")] for i in (1, 2, 3)], [cell[(f"D{i}", "Acc")] for i in (1, 2, 3)]
    xk, yk = [cell[(f"K{i}", "Replaced")] for i in (1, 2, 3)], [cell[(f"K{i}", "Acc")] for i in (1, 2, 3)]
    lo, hi = max(min(xd), min(xk)), min(max(xd), max(xk))
    grid = np.linspace(lo, hi, 11)
    assert comp.diff == pytest.approx(float(np.mean(np.interp(grid, xd, yd) - np.interp(grid, xk, yk))))
    assert 14 < comp.diff < 18  # the curves of CURVES: about 15.8 points
    assert f"{lo:.4g}–{hi:.4g}" in matched.note
    assert res["reversed"].verdict == S.CONTRADICTED
    assert res["null"].verdict == S.NOISE and abs(res["null"].comparisons[0].diff) < 1  # same curve, other draws
    assert res["apart"].verdict == L.NOT_DECIDABLE and not res["apart"].comparisons
    assert "do not overlap" in res["apart"].note
    assert re.search(r"\(D 2(\.\d+)?–(9\.9\d*|10); F 20(\.\d+)?–40(\.\d+)?\)", res["apart"].note)  # each range
    assert res["three"].verdict == L.NOT_DECIDABLE  # the common range is over every series


def test_toward_compares_closeness_to_a_target_row(tmp_path: Path):
    """`toward`: the series are scored by how close their interpolated accuracy comes to the target row's, whichever
    side of it they lie on. Toward RL (65%, above both curves at the matched 8-10%) D (55-60) is closer than K
    (40-43): holds; toward E1 (30%, below both) K is closer: D > K is contradicted. The advantage equals a hand
    computation from the table's cells."""
    data = copy.deepcopy(PAPER)
    base = {"table": "replacement", "column": "Acc", "kind": "matched_order", "x": "Replaced"}
    series = {"D": ["D1", "D2", "D3"], "K": ["K1", "K2", "K3"]}
    data["claims"] = [
        dict(base, id="up", text="D reaches RL first", series=series, toward="RL"),
        dict(base, id="down", text="D reaches E1 first", series=series, toward="E1"),
    ]
    evals = _write(tmp_path)
    paper = parse_paper(data, "tm.yaml")
    res = {c.id: L.evaluate_claim(paper, c, "tiny", [0, 1], evals, K, tmp_path / "runs") for c in paper.claims}
    assert res["up"].verdict == S.HOLDS and res["down"].verdict == S.CONTRADICTED
    assert "closeness to RL" in res["up"].test and "closer to RL's Acc" in res["up"].note
    df = build_table(paper, "replacement", "tiny", [0, 1], evals, K)
    cell = {(r["row"], r["column"]): r["ours_mean"] for r in df.to_dict("records")}
    xd, yd = [cell[(f"D{i}", "Replaced")] for i in (1, 2, 3)], [cell[(f"D{i}", "Acc")] for i in (1, 2, 3)]
    xk, yk = [cell[(f"K{i}", "Replaced")] for i in (1, 2, 3)], [cell[(f"K{i}", "Acc")] for i in (1, 2, 3)]
    grid = np.linspace(max(min(xd), min(xk)), min(max(xd), max(xk)), 11)
    for cid, t in (("up", cell[("RL", "Acc")]), ("down", cell[("E1", "Acc")])):
        hand = np.mean(np.abs(np.interp(grid, xk, yk) - t) - np.abs(np.interp(grid, xd, yd) - t))
        assert res[cid].comparisons[0].diff == pytest.approx(float(hand))
    md = L.ledger_markdown(
        paper,
        "tiny",
        *L.build_ledger(paper, "tiny", [0, 1], {"replacement": df}, evals, K, tmp_path / "r", "file:///n"),
    )
    assert "at matched Replaced, in closeness to RL on Acc" in md


@pytest.mark.parametrize(
    "change, message",
    [
        ({"toward": "D1"}, r"toward: row 'D1' is in series 'D'"),
        ({"toward": "nope"}, r"toward: unknown row 'nope'"),
        ({"toward": "RL", "direction": "lower"}, r"closer is better"),
    ],
)
def test_toward_validation(change, message):
    data = copy.deepcopy(PAPER)
    data["claims"] = [dict(data["claims"][0], **change)]
    with pytest.raises(ValueError, match=message):
        parse_paper(data, "tm.yaml")
    data["claims"] = [dict(data["claims"][0], kind="order", rows=["D1", "K1"], toward="RL")]
    for key in ("series", "x"):
        data["claims"][0].pop(key)
    with pytest.raises(ValueError, match="a order claim takes no 'toward'"):
        parse_paper(data, "tm.yaml")


def test_two_links_are_holm_corrected(tmp_path: Path):
    data = copy.deepcopy(PAPER)
    data["claims"] = [
        {
            "id": "chain",
            "text": "D > E-shifted > K",
            "table": "replacement",
            "column": "Acc",
            "kind": "matched_order",
            "x": "Replaced",
            "series": {"D": ["D1", "D2", "D3"], "K": ["K1", "K2", "K3"], "E": ["E1", "E2", "E3"]},
        }
    ]
    evals = _write(tmp_path)
    paper = parse_paper(data, "tm.yaml")
    (claim,) = paper.claims
    res = L.evaluate_claim(paper, claim, "tiny", [0, 1], evals, K, tmp_path / "runs")
    assert "Holm correction over the 2 links" in res.test and len(res.comparisons) == 2
    assert all(not np.isnan(c.p_holm) for c in res.comparisons)
    assert res.verdict == S.CONTRADICTED  # K < E (E is D's copy) at matched rates: the second link is reversed


def test_the_ledger_reports_matched_claims(tmp_path: Path):
    evals = _write(tmp_path)
    paper = parse_paper(copy.deepcopy(PAPER), "tm.yaml")
    tables = {"replacement": build_table(paper, "replacement", "tiny", [0, 1], evals, K)}
    df, results = L.build_ledger(paper, "tiny", [0, 1], tables, evals, K, tmp_path / "runs", "file:///none")
    md = L.ledger_markdown(paper, "tiny", df, results)
    assert "### `matched`: **holds**" in md and f"### `apart`: **{L.NOT_DECIDABLE}**" in md
    assert "D (D1, D2, D3) > K (K1, K2, K3) at matched Replaced on Acc" in md
    assert "common range of the measured Replaced" in md


# ---------------------------------------------------------------------------------------- validation, the paper


@pytest.mark.parametrize(
    "change, message",
    [
        ({"series": {"D": ["D1", "D2"]}}, r"series: expected a mapping of at least 2 series"),
        ({"series": {"D": ["D1"], "K": ["D1"]}}, r"series\.K\[0\]: row 'D1' is already in series 'D'"),
        ({"series": {"D": ["D1"], "K": []}}, r"series\.K: expected a non-empty list"),
        ({"series": {"D": ["D1"], "K": ["RL"]}}, r"row 'RL' has no test-time decoding"),
        ({"x": "Acc"}, r"x: unknown value 'Acc'; choices: \['Replaced'\]"),
        ({"rows": ["D1", "K1"]}, r"a matched_order claim takes no 'rows'"),
    ],
)
def test_matched_claim_validation(change, message):
    data = copy.deepcopy(PAPER)
    data["claims"] = [dict(data["claims"][0], **change)]
    with pytest.raises(ValueError, match=message):
        parse_paper(data, "tm.yaml")
    missing = copy.deepcopy(PAPER)
    del missing["claims"][0]["x"]
    with pytest.raises(ValueError, match="a matched_order claim needs 'x'"):
        parse_paper(missing, "tm.yaml")


def test_the_dlogp_replacement_ranking_is_tested_at_matched_rates():
    """The paper compares the criteria at matched replacement rates: the claim matches on the table's Replaced
    column, each criterion a series of its three thresholds, in the paper's order Δlog p > KL > entropy."""
    paper = load_paper(ROOT / "configs" / "papers" / "dlogp.yaml")
    claim = next(c for c in paper.claims if c.id == "replacement-ranking")
    assert claim.kind == "matched_order" and claim.table == "replacement" and claim.x == "Replaced"
    assert paper.table("replacement").column("Replaced").metric == "replacement_rate"
    assert [name for name, _ in claim.series] == ["Δlog p", "KL", "entropy"]
    for name, rows in claim.series:
        assert [r[0] for r in rows] == [f"{name} ({i})" for i in (1, 2, 3)]
        decodes = [next(r for r in paper.table("replacement").rows if r.label == label).decode for label, _ in rows]
        crit = {"Δlog p": "dlogp", "KL": "kl", "entropy": "entropy"}[name]
        assert {paper.decodes[d].criterion for d in decodes} == {crit}
