"""The pre-registered verdict machinery (creditlab.analysis.mechanisms): Welch and one-sample tests against scipy's
formulas read directly, Holm's step-down, the verdict rule and the power beside it."""

import math

import numpy as np
import pytest

from creditlab.analysis import mechanisms as mech
from creditlab.analysis.noise import power_two_sample


def test_welch_and_one_sample_match_their_formulas():
    a, b = [1.0, 2.0, 4.0, 3.5], [0.5, 0.7, 1.1]
    diff, se, t, p = mech.welch(a, b)
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
    assert diff == pytest.approx(np.mean(a) - np.mean(b)) and se == pytest.approx(math.sqrt(va + vb))
    assert t == pytest.approx(diff / se)
    m, se1, t1, p1 = mech.one_sample([0.1, 0.3, 0.2])
    assert m == pytest.approx(0.2) and t1 == pytest.approx(0.2 / (0.1 / math.sqrt(3)))
    assert 0 < p < 1 and 0 < p1 < 1


def test_holm_is_step_down_and_monotone():
    assert mech.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert mech.holm([0.5]) == [0.5]


def test_verdicts_holds_contradicted_null_with_power():
    rng = np.random.default_rng(0)
    scores = {
        "a": {s: {"m": 1.0 + 0.01 * rng.normal(), "c": 0.5 + 0.01 * rng.normal()} for s in range(6)},
        "b": {s: {"m": x} for s, x in enumerate([0.0, 0.01, -0.01, 0.004, -0.004, 0.002])},  # c permuted: no effect
        "c": {s: {"m": x} for s, x in enumerate([0.004, -0.01, 0.0, 0.01, -0.004, 0.002])},
    }
    protocol = (
        mech.MechanismTest("T1", "p", "a beats b", "m", "a", "b"),
        mech.MechanismTest("T2", "p", "b beats a", "m", "b", "a"),
        mech.MechanismTest("T3", "p", "b beats c", "m", "b", "c"),
        mech.MechanismTest("T4", "p", "c of a above 0", "c", "a", None),
    )
    rows = {r["id"]: r for r in mech.decide(scores, {"m": 0.01, "c": 0.01}, protocol=protocol)}
    assert rows["T1"]["verdict"] == "holds" and rows["T2"]["verdict"] == "contradicted"
    assert rows["T3"]["verdict"] == "null" and rows["T4"]["verdict"] == "holds"
    assert rows["T1"]["sesoi"] == pytest.approx(0.02)
    assert rows["T1"]["power_at_sesoi"] == pytest.approx(power_two_sample(0.02, 0.01, 6))
    assert rows["T1"]["power_at_sesoi_holm"] == pytest.approx(power_two_sample(0.02, 0.01, 6, alpha=0.05 / 4))
    assert all(r["p_holm"] >= r["p"] for r in rows.values())
    assert "| T1 |" in mech.markdown(list(rows.values()))


def test_each_protocol_reads_only_planned_runs():
    """Every run a protocol reads is a run of the tiny plan of its papers (the CLI trains them by these names); v2
    keeps v1's tests unchanged (a protocol is never edited after its verdicts) and adds RB's."""
    from creditlab.plan import build_plan

    plan = build_plan({"scale": "tiny", "papers": ["cancellation", "delta", "dfpo"], "seeds": [0]}, validate=False)
    planned = {r.run for r in plan.runs.values() if r.backbone == "tiny-s"}
    for name, protocol in mech.PROTOCOLS.items():
        assert set(mech.protocol_runs(protocol)) <= planned, name
    assert {t.id for t in mech.PROTOCOLS["v1"] if t.family} == {"M1", "M2", "M3", "M4"}
    assert set(mech.PROTOCOLS["v1"]) < set(mech.PROTOCOLS["v2"])
    assert {t.id for t in mech.PROTOCOLS["v2"] if t.family} == {"M1", "M2", "M3", "M4", "M5"}
    assert mech.protocol_runs(mech.PROTOCOLS["v2"]) == ["delta", "dapo", "qb", "dfpo", "grpo", "rb"]


def test_a_paired_test_is_scipys_paired_t_over_shared_seeds_with_power_at_correlation_zero():
    """Paired (protocol v3): the t test of per-seed differences over the seeds both arms ran (scipy's ttest_rel read
    directly), its power the one-sample test's at sd sqrt(2) x the seed sd; a shared seed effect that Welch cannot
    see past is found, and v3 pairs every two-arm test of v2 and nothing else."""
    from scipy import stats

    from creditlab.analysis.noise import power_one_sample

    seed_effect = [0.0, 0.3, -0.2, 0.5, -0.4, 0.1]  # shared by both arms of a seed
    a = {s: {"m": 1.0 + e + 0.01 * ((-1) ** s)} for s, e in enumerate(seed_effect)}
    b = {s: {"m": 0.95 + e} for s, e in enumerate(seed_effect)} | {9: {"m": 5.0}}  # seed 9: b only, left out
    pair = mech.MechanismTest("P", "p", "a beats b", "m", "a", "b", paired=True)
    unpaired = mech.MechanismTest("W", "p", "a beats b", "m", "a", "b")
    rows = {r["id"]: r for r in mech.decide({"a": a, "b": b}, {"m": 0.3}, protocol=(pair, unpaired))}
    ref = stats.ttest_rel([a[s]["m"] for s in range(6)], [b[s]["m"] for s in range(6)])
    assert rows["P"]["t"] == pytest.approx(ref.statistic) and rows["P"]["p"] == pytest.approx(ref.pvalue)
    assert rows["P"]["effect"] == pytest.approx(0.05) and rows["P"]["n"] == 6 and rows["P"]["test"] == "paired t"
    assert rows["P"]["pair_corr"] > 0.99
    assert rows["P"]["verdict"] == "holds" and rows["W"]["verdict"] == "null"
    assert rows["P"]["power_at_sesoi"] == pytest.approx(power_one_sample(0.6, 0.3 * math.sqrt(2), 6))
    assert "paired t (r 1.00)" in mech.markdown(list(rows.values()))
    del a[5]["m"]  # a seed without the metric leaves the pairs, as Welch's branch leaves it out
    short = mech.decide({"a": a, "b": b}, {"m": 0.3}, protocol=(pair,))[0]
    assert short["n"] == 5 and short["p"] == pytest.approx(
        stats.ttest_rel([a[s]["m"] for s in range(5)], [b[s]["m"] for s in range(5)]).pvalue
    )
    v2, v3 = mech.PROTOCOLS["v2"], mech.PROTOCOLS["v3"]
    assert [t.id for t in v3] == [t.id for t in v2]
    assert all(t3.paired == (t2.ref is not None) and t3.metric == t2.metric for t2, t3 in zip(v2, v3))


def test_the_verdict_figure_has_a_panel_per_test_with_each_seeds_pair(tmp_path):
    """plot: one titled panel per test (verdict and p in the title), one line per seed pair in a two-arm panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = {
        "a": {s: {"m": 1.0 + s + 0.03 * (s % 2), "c": 0.1 * s} for s in range(4)},
        "b": {s: {"m": 0.5 + s} for s in range(3)},
    }
    protocol = (
        mech.MechanismTest("T1", "p", "a beats b", "m", "a", "b", paired=True),
        mech.MechanismTest("T2", "p", "c of a above 0", "c", "a", None),
    )
    rows = mech.decide(scores, {"m": 0.1, "c": 0.1}, protocol=protocol)
    png = tmp_path / "v.png"
    seen = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, path, **kw):
        seen["titles"] = [ax.get_title() for ax in fig.axes if ax.get_title()]
        seen["pairs"] = len(fig.axes[0].lines)
        return real_savefig(fig, path, **kw)

    plt.Figure.savefig = spy
    try:
        mech.plot(scores, rows, png, protocol=protocol)
    finally:
        plt.Figure.savefig = real_savefig
    assert png.stat().st_size > 1000
    assert seen["titles"] == [
        f"T1: holds (p {rows[0]['p_holm']:.2g})",
        f"T2: {rows[1]['verdict']} (p {rows[1]['p_holm']:.2g})",
    ]
    assert seen["pairs"] == 3 + 1  # three shared seeds, and the SESOI bar


def test_protocol_v4_adds_rbs_compute_control_and_reads_generation_rounds(tmp_path):
    """v4 keeps v3's tests and adds S5 (RB vs the baseline with dynamic sampling, paired, outside the Holm family);
    a run's generation rounds per update are RB's rb_rounds where it logged them, else dynamic sampling's batches."""
    import json

    v3, v4 = mech.PROTOCOLS["v3"], mech.PROTOCOLS["v4"]
    assert v4[: len(v3)] == v3
    (s5,) = [t for t in v4 if t.id == "S5"]
    assert (s5.arm, s5.ref, s5.paired, s5.family, s5.metric) == ("rb", "dapo-ds4", True, False, "avg_sampled")
    rb, ds = tmp_path / "rb.jsonl", tmp_path / "ds.jsonl"
    rb.write_text(
        "".join(json.dumps({"step": i, "rb_rounds": r, "n_gen_batches": 1.0}) + "\n" for i, r in enumerate([1, 2, 4]))
    )
    ds.write_text("".join(json.dumps({"step": i, "n_gen_batches": r}) + "\n" for i, r in enumerate([2, 3])))
    assert mech.gen_rounds(rb) == pytest.approx(7 / 3) and mech.gen_rounds(ds) == pytest.approx(2.5)
    assert mech.gen_rounds(tmp_path / "absent.jsonl") is None
    table = mech.rounds_markdown({"rb": {0: {"train/gen_rounds": 2.0}, 1: {"train/gen_rounds": 3.0}}, "x": {0: {}}})
    assert "| rb | 2.50 | 2.00 - 3.00 |" in table and "| x |" not in table


def test_protocol_v5_pairs_rb_with_dynamic_sampling_at_rbs_own_rounds():
    """S6's reference is, per seed, dynamic sampling's curve (accuracy against generation rounds over the
    baseline's 1 round and its caps 2, 3, 4) read by linear interpolation at RB's rounds: checked against the
    two-point formula by hand; a seed whose RB lies outside the curve, or whose curve misses a run, has no pair and is
    counted; the test is then scipy's paired t."""
    from scipy import stats

    v5 = mech.PROTOCOLS["v5"]
    assert mech.PROTOCOL == v5 and [t.id for t in v5] == ["S5", "S6"]
    s6 = v5[1]
    assert mech.protocol_runs(v5) == ["rb", "dapo-ds4", "dapo", "dapo-ds2", "dapo-ds3"]
    g, m = "train/gen_rounds", "avg_sampled"

    def pt(x, y):
        return {g: x, m: y}

    curve = {  # per seed (rounds, accuracy) at caps 1 (the baseline), 2, 3, 4, out of order: sorted by rounds
        "dapo": {s: pt(1.0, 6.0) for s in range(5)},
        "dapo-ds2": {0: pt(1.8, 10.0), 1: pt(1.9, 12.0), 2: pt(1.7, 9.0), 3: pt(2.0, 11.0), 4: pt(1.8, 10.0)},
        "dapo-ds3": {0: pt(2.6, 18.0), 1: pt(2.4, 16.0), 2: pt(2.5, 15.0), 3: pt(2.5, 17.0), 4: pt(2.6, 13.0)},
        "dapo-ds4": {0: pt(3.0, 20.0), 1: pt(3.2, 24.0), 2: pt(2.9, 21.0), 3: pt(3.1, 23.0)},  # seed 4: missing
    }
    rb = {0: pt(1.5, 20.0), 1: pt(2.4, 13.0), 2: pt(2.7, 22.0), 3: pt(3.3, 30.0), 4: pt(2.2, 11.0), 5: pt(2.3, 9.0)}
    scores = {"rb": rb, **curve}
    ref = mech.matched_reference(scores, s6)
    # by hand: seed 0 between the baseline's (1.0, 6) and (1.8, 10); seed 1 on the point (2.4, 16); seed 2 between
    # (2.5, 15) and (2.9, 21); seed 3 above its curve's 3.1 rounds; seed 4 misses dapo-ds4; seed 5 has no curve at all
    want = {0: 6.0 + (1.5 - 1.0) / (1.8 - 1.0) * 4.0, 1: 16.0, 2: 15.0 + (2.7 - 2.5) / (2.9 - 2.5) * 6.0}
    assert sorted(ref) == [0, 1, 2]
    for seed, y in want.items():
        assert ref[seed][m] == pytest.approx(y) and ref[seed][g] == rb[seed][g]
    (row,) = [r for r in mech.decide(scores, {m: 5.0}, protocol=(s6,))]
    diffs = [rb[s][m] - want[s] for s in (0, 1, 2)]
    res = stats.ttest_1samp(diffs, 0.0)
    assert row["n"] == 3 and row["unmatched"] == 3 and row["effect"] == pytest.approx(np.mean(diffs))
    assert row["p"] == pytest.approx(res.pvalue) and row["test"] == "paired t at matched train/gen_rounds"
    assert "3 seed(s) outside the curve" in mech.markdown([row])
