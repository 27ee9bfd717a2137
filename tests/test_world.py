"""The pipeline's `world` (tiny / micro scale): every run composes the chosen tiny-world data config, the plan refuses
an unknown one or one at paper scale, and a job refuses data prepared for another world."""

import json

import pytest

from creditlab.models.sources import check_prepared_world
from creditlab.plan import PlanError, build_plan, run_config


def _pipeline(**kw):
    return {"scale": "micro", "papers": ["cancellation"], "seeds": [0], "tables": ["cancellation/broken"]} | kw


def test_every_run_composes_the_world():
    plan = build_plan(_pipeline(world="tiny_rule"), validate=False)
    assert plan.world == "tiny_rule" and plan.runs
    for run in plan.runs.values():
        assert run.overrides[0] == "data=tiny_rule"
    cfg = run_config(next(iter(plan.runs.values())))
    assert cfg["data"]["name"] == "tiny_rule_arith" and cfg["data"]["train"]["format"] == "rule"
    from creditlab.rewards.routing import data_source_kind

    assert data_source_kind(cfg["data"]["name"]) == "math"  # its records are scored by the math reward
    default = build_plan(_pipeline(), validate=False)  # the default world adds nothing to any run
    assert default.world == "tiny_arith" and not any("data=" in o for r in default.runs.values() for o in r.overrides)


def test_the_plan_refuses_an_unknown_world_and_a_tiny_world_at_paper_scale():
    with pytest.raises(PlanError, match=r"world: 'dapo_math_17k' is no tiny-world data config.*tiny_rule"):
        build_plan(_pipeline(world="dapo_math_17k"), validate=False)
    with pytest.raises(PlanError, match=r"at scale 'paper' the runs read the papers' datasets"):
        build_plan(_pipeline(world="tiny_rule", scale="paper", tables=None), validate=False)


def test_a_job_refuses_data_of_another_world(tmp_path):
    (tmp_path / "prep_report.json").write_text(json.dumps({"name": "tiny_arith"}))
    check_prepared_world(tmp_path, {"data": {"name": "tiny_arith"}})
    with pytest.raises(ValueError, match=r"holds the tiny world 'tiny_arith'.*'tiny_rule'.*one world per results root"):
        check_prepared_world(tmp_path, {"data": {"name": "tiny_rule"}})
    check_prepared_world(tmp_path / "none", {"data": {"name": "tiny_rule"}})  # not prepared yet: the read will say
