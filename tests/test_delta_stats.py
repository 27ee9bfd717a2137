"""DelTA's batch statistics under verl (issue 20, item 4): per data-parallel rank by default, as the official code
computes them (RUCBM/DelTA verl-DelTA/verl/workers/actor/dp_actor.py ``compute_log_prob_h``: no all-reduce), with the
global-batch statistics kept as the `delta-global-stats` ablation run of configs/papers/delta.yaml. The variance
floor of gamma is tested with the coefficients (tests/test_credit_delta.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from creditlab.algos.credit.delta import delta_weights  # noqa: E402
from creditlab.engines.verl import plugin  # noqa: E402
from creditlab.engines.verl import workers as vworkers  # noqa: E402
from creditlab.plan import build_plan, run_config  # noqa: E402

torch.set_num_threads(1)


def _shard(B=6, T=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None] < torch.randint(3, T + 1, (B,), generator=g)[:, None]).float()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 1.5])[:B]
    return dict(
        responses=torch.randint(0, 50, (B, T), generator=g),
        mask=mask,
        old_logp=-torch.rand(B, T, generator=g) * mask,
        advantages=adv,
        hidden=torch.randn(B, T, d, generator=g),
        uids=[f"s{seed}-{i // 2}" for i in range(B)],
    )


def _no_all_reduce(x):
    raise AssertionError("the statistics were all-reduced over the data-parallel ranks")


def test_worker_credit_defaults_to_per_rank_statistics():
    """Under the plug-in's default options (and with no dp_stats in the spec) a rank's DelTA coefficients are those of
    its own rollouts alone, computed without any all-reduce, as the official compute_log_prob_h; the pooled ones differ
    (summing the two shards' statistics is the `global` ablation, tested in test_verl_plugin)."""
    default = plugin.verl_options(None)["credit_dp_stats"]
    assert default == "rank" and plugin.VERL_DEFAULTS["credit_dp_stats"] == "rank"
    shards = [_shard(seed=s) for s in (0, 1)]
    for spec in (
        {"credit": [{"name": "delta"}], "seed": 0, "step": 1, "dp_stats": default},
        {"credit": [{"name": "delta"}], "seed": 0, "step": 1},
    ):
        for rank, b in enumerate(shards):
            out = vworkers.worker_credit(spec, **b, entropy=None, reduce=_no_all_reduce, rank=rank)
            alone = delta_weights(b["responses"], b["mask"], b["old_logp"], b["advantages"], b["hidden"])
            torch.testing.assert_close(out["weights"], alone)
            valid = b["mask"].bool()
            assert out["weights"][valid].mean().item() == pytest.approx(1.0, abs=1e-5)  # normalised per rank


def test_unknown_statistics_option_is_refused():
    with pytest.raises(ValueError, match=r"credit_dp_stats='ranks'.*\['rank', 'global'\]"):
        plugin.verl_options({"verl": {"credit_dp_stats": "ranks"}})
    with pytest.raises(ValueError, match=r"dp_stats='pooled'.*\['rank', 'global'\]"):
        vworkers.worker_credit(
            {"credit": [{"name": "delta"}], "dp_stats": "pooled"}, **_shard(), entropy=None, reduce=_no_all_reduce
        )


def test_paper_scale_delta_runs_use_per_rank_statistics_and_one_ablation_pools_them():
    """At paper (and smoke) scale every DelTA run resolves verl.credit_dp_stats to `rank`; the `statistics` table's
    `delta-global-stats` run to `global`. That table has no column at tiny / micro scale (one-process engines, where
    the two rows would be one run), so no duplicate of `delta` is trained there."""
    plan = build_plan({"scale": "paper", "papers": ["delta"], "seeds": [0], "results": "r"}, validate=False)
    assert ("delta", "statistics") in plan.tables
    assert plan.table_runs("delta", "statistics") == [
        plan.get("qwen3-8b-base", r, 0) for r in ("delta", "delta-global-stats")
    ]
    want = {"delta": "rank", "delta-topk": "rank", "select-top": "rank", "delta-global-stats": "global"}
    for run, stats in want.items():
        cfg = run_config(plan.get("qwen3-8b-base", run, 0))
        assert plugin.verl_options(cfg)["credit_dp_stats"] == stats, run
    assert plugin.verl_options(run_config(plan.get("qwen3-14b-base", "delta", 0)))["credit_dp_stats"] == "rank"
    smoke = build_plan({"scale": "smoke", "papers": ["delta"], "seeds": [0], "results": "r"}, validate=False)
    cfg = run_config(smoke.get("qwen3-8b-base", "delta-global-stats", 0))
    assert plugin.verl_options(cfg)["credit_dp_stats"] == "global" and cfg["verl"]["device"] == "cpu"
    for scale in ("tiny", "micro"):
        p = build_plan({"scale": scale, "papers": ["delta"], "seeds": [0], "results": "r"}, validate=False)
        assert ("delta", "statistics") in p.skipped_tables
        assert not [r for r in p.runs.values() if r.run == "delta-global-stats"]
