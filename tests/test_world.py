"""The pipeline's `world` (tiny / micro scale): every run composes the chosen tiny-world data config, the plan refuses
an unknown one or one at paper scale, and a job refuses data prepared for another world."""

import json

import pytest

from creditlab.models.sources import check_prepared_world
from creditlab.plan import PlanError, build_plan, run_config, world_run_overrides


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
    default = build_plan(_pipeline(), validate=False)  # world null: tiny_rule at tiny and micro scale
    assert default.world == "tiny_rule" and all(r.overrides[0] == "data=tiny_rule" for r in default.runs.values())
    arith = build_plan(_pipeline(world="tiny_arith"), validate=False)  # run.yaml's data default: nothing added
    assert arith.world == "tiny_arith" and not any("data=" in o for r in arith.runs.values() for o in r.overrides)


def test_a_null_world_is_the_papers_datasets_at_paper_and_smoke_scale():
    """The pipeline's default world (null) is tiny_rule only at tiny / micro scale: a smoke or paper build with the
    default pipeline config is not refused, and its runs get no tiny-world data override."""
    from creditlab.plan import DEFAULT_WORLD, TINY_WORLD, check_world

    assert check_world(None, "tiny") == check_world(None, "micro") == TINY_WORLD == "tiny_rule"
    assert check_world(None, "smoke") == check_world(None, "paper") == DEFAULT_WORLD
    assert check_world("tiny_arith", "paper") == DEFAULT_WORLD
    smoke = build_plan(_pipeline(scale="smoke", world=None, tables=None), validate=False)
    assert smoke.world == DEFAULT_WORLD and not any("data=tiny" in o for r in smoke.runs.values() for o in r.overrides)


def test_the_plan_refuses_an_unknown_world_and_a_tiny_world_at_paper_scale():
    with pytest.raises(PlanError, match=r"world: 'dapo_math_17k' is no tiny-world data config.*tiny_rule"):
        build_plan(_pipeline(world="dapo_math_17k"), validate=False)
    with pytest.raises(PlanError, match=r"at scale 'paper' the runs read the papers' datasets"):
        build_plan(_pipeline(world="tiny_rule", scale="paper", tables=None), validate=False)
    with pytest.raises(PlanError, match=r"leave world null"):
        build_plan(_pipeline(world="tiny_rule", scale="smoke", tables=None), validate=False)


def test_a_world_sets_its_rl_budget_and_a_run_still_overrides_it():
    """tiny_rule's `rl_overrides.tiny` reach every tiny run, before the run's own overrides (ARCA's LoRA lr wins);
    micro keeps the scale's budget; a malformed budget is refused with its key."""
    import yaml

    budget = yaml.safe_load(open("configs/data/tiny_rule.yaml"))["rl_overrides"]["tiny"]
    lr = float(next(x for x in budget if x.startswith("trainer.lr=")).split("=")[1])
    plan = build_plan(
        _pipeline(scale="tiny", papers=["cancellation", "arca"], tables=None, world="tiny_rule"), validate=False
    )
    dapo = next(r for r in plan.runs.values() if r.run == "dapo")
    assert dapo.overrides[: 1 + len(budget)] == ("data=tiny_rule", *budget)
    assert run_config(dapo)["trainer"]["lr"] == lr
    lora = next(r for r in plan.runs.values() if r.method.startswith("arca"))
    assert run_config(lora)["trainer"]["lr"] != lr  # the run's own trainer.lr comes later and wins
    assert world_run_overrides("tiny_rule", "micro") == ("data=tiny_rule",)
    assert world_run_overrides("tiny_arith", "tiny") == ()


@pytest.mark.parametrize(
    "budget, match",
    [
        ({"tiny": ["data.train.n=5"]}, r"rl_overrides.tiny: 'data.train.n=5' is no trainer.<key>=<value> override"),
        ({"paper": ["trainer.lr=1"]}, r"rl_overrides: 'paper' is no tiny-world scale"),
        ({"tiny": "trainer.lr=1"}, r"rl_overrides: must map a scale to a list"),
    ],
)
def test_a_malformed_world_budget_is_refused_with_its_key(tmp_path, budget, match):
    import yaml

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "w.yaml").write_text(yaml.safe_dump({"rl_overrides": budget}))
    with pytest.raises(PlanError, match=match):
        world_run_overrides("w", "tiny", tmp_path)


def test_the_prepare_job_called_without_a_world_prepares_the_scales_default(tmp_path):
    """The job functions' own default is the pipeline's (None -> check_world), not a world named in Python."""
    from creditlab.data.io import read_records
    from creditlab.jobs.prepare import prepare_tiny

    prepare_tiny(tmp_path, "micro", "micro-s")
    assert {r["source"] for r in read_records(tmp_path / "micro" / "data" / "train.parquet")} == {"tiny_rule_arith"}


def test_a_job_refuses_data_of_another_world(tmp_path):
    (tmp_path / "prep_report.json").write_text(json.dumps({"name": "tiny_arith"}))
    check_prepared_world(tmp_path, {"data": {"name": "tiny_arith"}})
    with pytest.raises(ValueError, match=r"holds the tiny world 'tiny_arith'.*'tiny_rule'.*one world per results root"):
        check_prepared_world(tmp_path, {"data": {"name": "tiny_rule"}})
    check_prepared_world(tmp_path / "none", {"data": {"name": "tiny_rule"}})  # not prepared yet: the read will say


def test_a_micro_run_trains_on_the_rule_world_through_the_cli(tmp_path):
    """prepare, warm-up and a 4-step run at micro scale with --world tiny_rule: the prepared records carry rule letters
    and the warm-up text; the run's config is the rule world's; the same data refuse a job of tiny_arith."""
    import os
    import subprocess
    import sys

    from creditlab.data.io import read_records

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "creditlab", "--results", str(tmp_path), "--scale", "micro", "--quiet"]
    rule = [*cli, "--world", "tiny_rule", "--papers", "cancellation"]

    def run(args, ok=True):
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        assert (out.returncode == 0) == ok, out.stderr[-3000:]
        return out

    run([*rule, "prepare"])
    train = read_records(tmp_path / "micro" / "data" / "train.parquet")
    assert {r["source"] for r in train} == {"tiny_rule_arith"}
    assert any(r["meta"]["letters"] for r in train) and all("sft_solution" in r["meta"] for r in train)
    run([*rule, "warmup", "--backbone", "micro-s"])
    run([*rule, "train", "--backbone", "micro-s", "--run", "dapo", "--seed", "0"])
    run_dir = tmp_path / "micro" / "runs" / "micro-s" / "dapo" / "s0"
    assert json.loads((run_dir / "DONE").read_text())["steps_done"] == 4
    assert "name: tiny_rule_arith" in (run_dir / "config.yaml").read_text()
    refused = run(
        [*cli, "--world", "tiny_arith", "--papers", "cancellation", "train", "--backbone", "micro-s", "--run", "qb"],
        ok=False,
    )
    assert "holds the tiny world 'tiny_rule_arith'" in refused.stderr


def test_a_malformed_rl_prompt_mix_is_refused_by_the_plan_with_its_key(tmp_path):
    """`snakemake -n` refuses what prepare would refuse at its first step: the world's rl_prompts, key and reason."""
    import yaml

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "w.yaml").write_text(yaml.safe_dump({"rl_prompts": {"letters": [0, -1]}}))
    with pytest.raises(PlanError, match=r"w.yaml: data config rl_prompts.letters\[1\]: -1 is no share >= 0"):
        world_run_overrides("w", "tiny", tmp_path)


def test_the_run_trains_on_and_the_analyses_read_the_worlds_rl_prompts(tmp_path):
    """tiny_rule's resolved run config carries its rl_prompts; RunSources.load_records (the analyses' records) applies
    them to the prepared train split as the train job does."""
    from creditlab.data.io import write_records
    from creditlab.data.rule_arith import generate_rule_split
    from creditlab.models.sources import run_sources

    plan = build_plan(_pipeline(scale="tiny", papers=["cancellation"], tables=None, world="tiny_rule"), validate=False)
    run = next(r for r in plan.runs.values() if r.run == "rb")
    cfg = run_config(run)
    assert cfg["data"]["rl_prompts"] == {"letters": [0, 0.5, 0.5]}
    src = run_sources(run, cfg, tmp_path)
    recs = generate_rule_split(3, 400, [1, 3], [2, 2], 0.5, {"a": "+", "d": "-"}, (" ", ";"))
    write_records(recs, src.train_records)
    got = [r["meta"]["letters"] for r in src.load_records()]
    two = sum(r["meta"]["letters"] == 2 for r in recs)
    assert sorted(got) == [1] * two + [2] * two and two > 0
