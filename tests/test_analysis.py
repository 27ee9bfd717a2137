"""Paper C analyses: token flipping against a direct reading, the probes restore the trainer, polarity
modes, and paper-config validation of `analyses:`."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import make_trainer
from creditlab.algos.flipping import classify_shift, flip_fractions
from creditlab.analysis.flipping import mode_transform, update_shifts


def test_flip_fractions_match_a_direct_reading():
    g = torch.Generator().manual_seed(0)
    delta = torch.randn(6, 9, generator=g) * 2e-3
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0, -1.0, -0.1])
    sel = torch.rand(6, 9, generator=g) > 0.5
    eps = 1e-3
    for select in (None, sel):
        got = flip_fractions(delta, mask, adv, eps, select)
        for side, want_row in (("positive", lambda a: a > 0), ("negative", lambda a: a < 0), ("all", lambda a: True)):
            counts = {"boosted": 0, "suppressed": 0, "stable": 0}
            n = 0
            for i in range(6):
                if not want_row(float(adv[i])):
                    continue
                for t in range(9):
                    if mask[i, t] == 0 or (select is not None and not select[i, t]):
                        continue
                    d = float(delta[i, t])
                    counts["boosted" if d > eps else "suppressed" if d < -eps else "stable"] += 1
                    n += 1
            assert got[side]["n"] == n
            for k, c in counts.items():
                assert got[side][k] == pytest.approx(100.0 * c / n)
    assert classify_shift(torch.tensor([2e-3, -2e-3, 5e-4]), 1e-3).tolist() == [1, -1, 0]


def test_modes_rewrite_advantages():
    a = torch.tensor([1.0, -2.0, 0.0, 3.0])
    g = torch.Generator().manual_seed(0)
    assert mode_transform("joint", g) is None
    assert mode_transform("positive_only", g)(a).tolist() == [1.0, 0.0, 0.0, 3.0]
    assert mode_transform("negative_only", g)(a).tolist() == [0.0, -2.0, 0.0, 0.0]
    assert sorted(mode_transform("shuffled", g)(a).tolist()) == sorted(a.tolist())
    with pytest.raises(ValueError, match="valid choices"):
        mode_transform("both", g)


def test_update_shifts_restore_the_trainer_and_the_modes_differ(tmp_path):
    t = make_trainer("dapo", tmp_path, ["trainer.mini_batches=1", "trainer.lr=1e-3"])
    ro, _ = t.collect(0)
    before = copy.deepcopy(t.model.state_dict())
    res = update_shifts(t, ro, ["joint", "positive_only", "negative_only", "shuffled"], step=0, seed=0)
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, before[k]), k  # every probe started from, and returned to, the same state
    assert not t.opt.state  # the fresh optimizer's state was restored too (no Adam moments left behind)
    d = res["delta"]
    valid = res["mask"].bool()
    assert all(d[m][valid].abs().max() > 0 for m in d)
    assert not torch.allclose(d["joint"], d["positive_only"])
    # one update per mode from the same state: the same call again gives the same shifts
    again = update_shifts(t, ro, ["joint"], step=0, seed=0)
    assert torch.allclose(again["delta"]["joint"], d["joint"], atol=1e-6)


def test_learn_adv_transform_zero_means_no_policy_gradient(tmp_path):
    t = make_trainer("dapo", tmp_path)
    ro, _ = t.collect(0)
    m = t.learn(0, ro, adv_transform=torch.zeros_like)
    assert m["grad_norm"] == 0.0


def _paper(extra):
    from creditlab.papers.load import parse_paper
    from creditlab.plan import check_analysis_kinds

    base = {
        "paper": "p",
        "backbones": {"B": {"tiny": "tiny-s"}},
        "benchmarks": {"X": {"tiny": "easy"}},
        "runs": {"dapo": {"method": "dapo"}},
        "tables": {
            "t": {
                "columns": [{"name": "X", "benchmark": "X", "metric": "greedy"}],
                "rows": [{"label": "r", "backbone": "B", "run": "dapo"}],
            }
        },
    }
    spec = parse_paper(base | {"analyses": extra}, "test.yaml")
    check_analysis_kinds(spec)  # kinds and params: creditlab.plan, against creditlab.analysis
    return spec


def test_analyses_are_validated_before_any_job():
    spec = _paper({"f": {"kind": "flipping", "backbone": "B", "run": "dapo", "params": {"eps": 0.01}}})
    assert spec.analyses["f"].kwargs == {"eps": 0.01} and spec.analyses["f"].start == "base"
    with pytest.raises(ValueError, match="kind.*valid choices|choices"):
        _paper({"f": {"kind": "nope", "backbone": "B", "run": "dapo"}})
    with pytest.raises(ValueError, match="params.epsilon"):
        _paper({"f": {"kind": "flipping", "backbone": "B", "run": "dapo", "params": {"epsilon": 0.01}}})
    with pytest.raises(ValueError, match="start"):
        _paper({"f": {"kind": "value", "backbone": "B", "run": "dapo", "start": "middle"}})
    with pytest.raises(ValueError, match="run"):
        _paper({"f": {"kind": "value", "backbone": "B", "run": "base"}})


def test_paper_c_config_plans_its_runs_and_analyses():
    from creditlab.plan import build_plan

    plan = build_plan({"scale": "tiny", "seeds": [0], "papers": ["cancellation"]})
    runs = {(r.backbone, r.run) for r in plan.runs.values()}
    for b in ("tiny-s", "tiny-m", "tiny-olmo"):
        assert {(b, r) for r in ("dapo", "qb", "rb", "qb-rb")} <= runs
    assert ("tiny-s", "sign-partitioned") in runs
    assert {a for _, a in plan.analyses} == {"flipping", "flipping_trained", "value", "value_budget", "coupling"}
    qb = next(r for r in plan.runs.values() if r.run == "qb-rb")
    from creditlab.plan import run_config

    cfg = run_config(qb)
    assert cfg["trainer"]["batching"] == "query_preserved" and cfg["trainer"]["reward_balance"]["enable"]
