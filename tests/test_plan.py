"""Config validation happens before any job: unknown papers, methods and keys fail with the choices."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from creditlab.plan import CONFIG_DIR, PlanError, build_plan, compose, run_config

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PIPE = {"scale": "micro", "papers": ["dlogp"], "seeds": [0], "results": "results"}


def test_plan_dedupes_runs_and_resolves_configs():
    plan = build_plan(PIPE)
    assert sorted(plan.runs) == [
        "micro/micro-m/dapo-ds/s0",
        "micro/micro-m/dlogp-ds-a0.1/s0",
        "micro/micro-s/base/s0",
        "micro/micro-s/dapo-ds/s0",
        "micro/micro-s/dlogp-ds-a0.2/s0",
        "micro/micro-s/dominate-ds/s0",
        "micro/micro-s/ppl-ds/s0",
    ]
    run = plan.get("micro-s", "dapo-ds", 0)
    assert run.experiment == "dlogp" and run.tables == ["dlogp/main", "dlogp/extrapolation", "dlogp/replacement"]
    shared = plan.get("micro-s", "dlogp-ds-a0.2", 0)  # one run serves two tables: trained once
    assert shared.tables == ["dlogp/main", "dlogp/ablation"]
    assert run_config(shared)["method"]["credit"] == [{"name": "dlogp", "alpha": 0.2}]
    cfg = compose("micro", "micro-s", "dapo", run.overrides)
    assert cfg["trainer"]["dynamic_sampling"] is True  # the paper's override reached the trainer
    assert cfg["model"]["arch"]["hidden_size"] == 64 and cfg["trainer"]["steps"] == 4
    assert compose("tiny", "tiny-s")["trainer"]["dynamic_sampling"] is False


def test_seeds_multiply_runs():
    plan = build_plan(PIPE | {"seeds": [0, 1]}, validate=False)
    assert len(plan.runs) == 14 and len(plan.table_runs("dlogp", "main")) == 10


def test_unknown_paper_lists_choices():
    with pytest.raises(PlanError, match=r"unknown paper 'nope'.*valid choices: \[.*'dlogp'"):
        build_plan(PIPE | {"papers": ["nope"]})


def _configs_with(tmp_path: Path, edit) -> Path:
    cfg_dir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, cfg_dir)
    path = cfg_dir / "papers" / "dlogp.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))
    return cfg_dir


def test_unknown_method_fails_naming_choices(tmp_path):
    cfg_dir = _configs_with(tmp_path, lambda d: d["runs"]["dapo-ds"].update(method="dapoo"))
    with pytest.raises(PlanError, match=r"dapoo.*(dapo|Available options)"):
        build_plan(PIPE, cfg_dir)


def test_unknown_override_key_fails(tmp_path):
    cfg_dir = _configs_with(tmp_path, lambda d: d["runs"]["dapo-ds"].update(overrides=["trainer.dynamic_samplin=true"]))
    with pytest.raises(PlanError, match="dynamic_samplin"):
        build_plan(PIPE, cfg_dir)


def test_unknown_registered_name_fails(tmp_path):
    cfg_dir = _configs_with(tmp_path, lambda d: d["runs"]["dapo-ds"].update(overrides=["method.advantage=gpro"]))
    with pytest.raises(PlanError, match=r"unknown advantage 'gpro'; valid choices: \['dr_grpo', 'grpo', 'rloo'\]"):
        build_plan(PIPE, cfg_dir)


@pytest.mark.parametrize(
    "override, needle", [("papers=[nope]", "nope"), ("scale=huge", "huge"), ("sedes=[0]", "sedes")]
)
def test_snakemake_rejects_bad_pipeline_config_before_any_job(override, needle, tmp_path):
    proc = subprocess.run(
        [
            SNAKEMAKE,
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "-n",
            "--config",
            override,
            f"results={tmp_path}/results",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert needle in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()  # nothing ran


NULL_PAPER = {  # a benchmark without a tiny stand-in (null), a step_time-only table at tiny, a token_credit figure
    "paper": "nulls",
    "backbones": {"Small": {"tiny": "tiny-s", "paper": "small"}, "Large": {"tiny": "tiny-m", "paper": "large"}},
    "benchmarks": {
        "A": {"tiny": "medium", "paper": "bench-a"},
        "B": {"tiny": "hard", "paper": "bench-b"},
        "N": {"tiny": None, "paper": "bench-n"},
    },
    "runs": {
        "dapo": {"method": "dapo"},
        "other": {"method": "dapo", "overrides": ["trainer.mini_batches=2"]},
        "lonely": {"method": "dapo", "overrides": ["trainer.mini_batches=4"]},
    },
    "tables": {
        "main": {
            "columns": [
                {"name": "A", "benchmark": "A", "metric": "avg@k"},
                {"name": "N", "benchmark": "N", "metric": "avg@k"},
                {"name": "Avg", "benchmarks": ["A", "B", "N"], "metric": "avg@k"},
            ],
            "rows": [
                {"label": "Base", "backbone": "Small", "run": "base"},
                {"label": "DAPO", "backbone": "Small", "run": "dapo"},
            ],
        },
        "cost": {
            "columns": [
                {"name": "Code", "benchmark": "N", "metric": "avg@k"},
                {"name": "Step time (s)", "metric": "step_time"},
            ],
            "rows": [{"label": "DAPO", "backbone": "Large", "run": "dapo"}],
        },
        "code": {
            "columns": [{"name": "Code", "benchmark": "N", "metric": "avg@k"}],
            "rows": [{"label": "Other", "backbone": "Large", "run": "other"}],
        },
    },
    "figures": {
        "clouds": {"kind": "token_credit", "backbone": "Large", "run": "lonely"},
        "code_bars": {"kind": "bars", "table": "code", "y": "Code"},
    },
}


def test_plan_skips_benchmarks_without_a_stand_in(tmp_path):
    cfg_dir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, cfg_dir)
    (cfg_dir / "papers" / "nulls.yaml").write_text(yaml.safe_dump(NULL_PAPER, sort_keys=False))
    plan = build_plan({"scale": "tiny", "papers": ["nulls"], "seeds": [0, 1], "results": "r"}, cfg_dir, validate=False)
    assert plan.tables == [("nulls", "main"), ("nulls", "cost")] and plan.skipped_tables == [("nulls", "code")]
    assert plan.table_suites("nulls", "main") == ["medium", "hard"]  # N has no tiny suite: never asked for
    assert len(plan.table_evals("nulls", "main")) == 4
    assert plan.table_evals("nulls", "cost") == [] and plan.table_suites("nulls", "cost") == []
    assert [r.key for r in plan.table_runs("nulls", "cost")] == ["tiny/tiny-m/dapo/s0", "tiny/tiny-m/dapo/s1"]
    assert "tiny/tiny-m/other/s0" not in plan.runs  # only the skipped table has it
    assert plan.figures == [("nulls", "clouds")]  # the code table's bars cannot be drawn at tiny
    lonely = plan.get("tiny-m", "lonely", 0)  # a figure's run is planned (first seed) even without a row
    assert lonely.tables == [] and lonely.papers == ["nulls"] and "tiny/tiny-m/lonely/s1" not in plan.runs
    at_paper = build_plan(
        {"scale": "paper", "papers": ["nulls"], "seeds": [0], "results": "r"}, cfg_dir, validate=False
    )
    assert at_paper.skipped_tables == [] and at_paper.table_suites("nulls", "main") == ["bench-a", "bench-n", "bench-b"]


OWN_SEEDS = {  # a paper with its own seeds at tiny and paper scale, sharing the run `dapo` (tiny-s) with NULL_PAPER
    "paper": "own",
    "backbones": {"Small": {"tiny": "tiny-s", "paper": "small"}},
    "benchmarks": {"A": {"tiny": "medium", "paper": "bench-a"}},
    "runs": {"dapo": {"method": "dapo"}, "solo": {"method": "dapo", "overrides": ["trainer.mini_batches=2"]}},
    "seeds": {"tiny": [2, 0, 1], "paper": [5]},
    "tables": {
        "t1": {
            "columns": [
                {"name": "A", "benchmark": "A", "metric": "avg@k"},
                {"name": "Steps", "metric": "steps_to", "threshold": 0.7},
            ],
            "rows": [
                {"label": "DAPO", "backbone": "Small", "run": "dapo"},
                {"label": "Solo", "backbone": "Small", "run": "solo"},
            ],
        }
    },
    "figures": {"clouds": {"kind": "token_credit", "backbone": "Small", "run": "solo"}},
}


def test_per_paper_seeds_reach_the_plan(tmp_path):
    cfg_dir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, cfg_dir)
    (cfg_dir / "papers" / "nulls.yaml").write_text(yaml.safe_dump(NULL_PAPER, sort_keys=False))
    (cfg_dir / "papers" / "own.yaml").write_text(yaml.safe_dump(OWN_SEEDS, sort_keys=False))
    pipe = {"scale": "tiny", "papers": ["nulls", "own"], "seeds": [0], "results": "r"}
    plan = build_plan(pipe, cfg_dir, validate=False)
    assert plan.seeds == [0] and plan.paper_seeds("nulls") == [0] and plan.paper_seeds("own") == [2, 0, 1]
    assert [(r.key, d) for r, d in plan.table_evals("own", "t1")] == [
        (f"tiny/tiny-s/{run}/s{s}", None) for run in ("dapo", "solo") for s in (2, 0, 1)
    ]
    assert [r.seed for r in plan.table_runs("own", "t1")] == [2, 0, 1, 2, 0, 1]
    assert [r.key for r, _ in plan.table_evals("nulls", "main")] == [  # the pipeline's seeds
        "tiny/tiny-s/base/s0",
        "tiny/tiny-s/dapo/s0",
    ]
    # a run key of both papers is planned for the union of their seeds, tagged with the papers that use each
    assert plan.get("tiny-s", "dapo", 0).papers == ["nulls", "own"]
    assert plan.get("tiny-s", "dapo", 2).papers == ["own"] and plan.get("tiny-s", "dapo", 2).tables == ["own/t1"]
    assert "tiny/tiny-s/base/s2" not in plan.runs  # nulls' base row: the pipeline's seed only
    assert plan.get("tiny-s", "solo", 2).tables == ["own/t1"]  # the token_credit figure's run: first seed 2
    with pytest.raises(PlanError, match=r"unknown paper 'nope'; planned papers: \['nulls', 'own'\]"):
        plan.paper_seeds("nope")
    more = build_plan(pipe | {"seeds": [0, 7]}, cfg_dir, validate=False)  # the pipeline's seeds: not own's
    assert more.paper_seeds("own") == [2, 0, 1] and more.paper_seeds("nulls") == [0, 7]
    assert "tiny/tiny-s/solo/s7" not in more.runs and "tiny/tiny-s/dapo/s7" in more.runs
    at_paper = build_plan(pipe | {"scale": "paper"}, cfg_dir, validate=False)
    assert at_paper.paper_seeds("own") == [5] and sorted(r.seed for r in at_paper.table_runs("own", "t1")) == [5, 5]
    # a job of one run (CLI --seed) plans that seed for every paper, listed in a paper's seeds or not
    one = build_plan(pipe | {"seeds": [9], "ignore_paper_seeds": True}, cfg_dir, validate=False)
    assert one.get("tiny-s", "solo", 9).papers == ["own"] and one.paper_seeds("own") == [9]


def test_papers_all_keeps_the_pipeline_order_first(tmp_path):
    """Jobs plan with `--papers all`; a run shared by papers is tracked under the first paper's experiment,
    so the pipeline config's order comes first and a new paper config never moves an existing run."""
    import argparse

    import yaml

    from creditlab.cli import _pipeline
    from creditlab.plan import CONFIG_DIR, all_papers, build_plan

    cfg = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text())
    cfg["papers"] = ["delta", "dlogp"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    a = argparse.Namespace(pipeline_config=str(path), scale="micro", seeds=None, seed=0, papers="all")
    papers = _pipeline(a)["papers"]
    assert papers[:2] == ["delta", "dlogp"] and sorted(papers) == sorted(all_papers())
    plan = build_plan(_pipeline(a), validate=False)
    dapo = next(r for r in plan.runs.values() if r.run == "dapo" and r.backbone == "micro-s")
    assert dapo.experiment == "delta" and dapo.papers[0] == "delta"  # not cancellation, which also uses it


def test_one_run_job_plans_its_seed_with_seeds_given_too():
    """`creditlab --seeds 10,11 train --run grpo --seed 10`: the one-run job plans seed 10 although Paper E has its
    own seeds at tiny scale (0, 1), which would otherwise win (seen: 'run tiny/tiny-s/grpo/s10 is not in the plan')."""
    from creditlab.cli import _plan, build_parser

    base = ["--scale", "tiny", "--papers", "all", "--seeds", "10,11"]
    a = build_parser().parse_args([*base, "train", "--backbone", "tiny-s", "--run", "grpo", "--seed", "10"])
    assert _plan(a).get("tiny-s", "grpo", 10).seed == 10
    a = build_parser().parse_args([*base, "warmup", "--backbone", "tiny-s"])  # its default seed 0, not in --seeds
    assert _plan(a).seeds == [0]


def test_tables_choose_what_is_built_and_keep_every_run_planned():
    """The pipeline's `tables`: only those tables are built by default and read by their paper's ledger, the figures
    drawn from other tables are dropped, every run stays planned (any table can still be a target), and the claims of
    a table left out are reported as not built, never tested. A name that is no table fails with the choices."""
    from creditlab.tables.ledger import NOT_TESTABLE, evaluate_claim

    whole = build_plan(PIPE, validate=False)
    plan = build_plan(PIPE | {"tables": ["dlogp/ablation"]}, validate=False)
    assert plan.tables == [("dlogp", "ablation")] and len(whole.tables) > 1
    assert sorted(plan.runs) == sorted(whole.runs) and plan.buildable_tables == whole.tables
    assert all(
        whole.papers["dlogp"].figures[f].table != "ablation"
        for f in whole.papers["dlogp"].figures_at("micro")
        if f not in plan.papers["dlogp"].figures_at("micro")
    )
    spec = plan.papers["dlogp"]
    claim = next(c for c in spec.claims if c.table != "ablation")
    result = evaluate_claim(spec, claim, "micro", [0], Path("/nonexistent"), 4, Path("/nonexistent"))
    assert result.verdict == NOT_TESTABLE and "not built" in result.note
    with pytest.raises(PlanError, match="no table of the chosen papers.*dlogp/main"):
        build_plan(PIPE | {"tables": ["dlogp/nope"]}, validate=False)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("trainer.group_size=0", r"trainer\.group_size: 0 is less than the minimum of 2"),
        ("trainer.lr=-1e-5", r"trainer\.lr: -1e-05 is less than or equal to the minimum of 0"),
        ("eval.top_p=1.5", r"eval\.top_p: 1\.5 is greater than the maximum of 1"),
        ("trainer.lr_schedule=linear", r"trainer\.lr_schedule: 'linear' is not one of"),
        ("eval.ks=[1,64]", r"eval\.ks=\[1, 64\]: pass@j needs j <= eval\.k"),
    ],
)
def test_out_of_range_values_are_refused_at_plan_time_naming_the_key(tmp_path, override, needle):
    """What a job would refuse at its first step (or silently misuse) is refused when the plan is built
       (`snakemake -n`),
    with the run and the key: the ranges of workflow/schemas/run.schema.yaml."""
    cfg_dir = _configs_with(tmp_path, lambda d: d["runs"]["dapo-ds"].update(overrides=[override]))
    with pytest.raises(PlanError, match=r"micro/micro-\w/dapo-ds/s0: " + needle):
        build_plan(PIPE, cfg_dir)


def test_a_fixed_k_metric_above_the_runs_eval_k_is_refused_at_plan_time(tmp_path):
    """A table column reading pass@N of runs whose evaluation draws fewer than N samples would fail in the table job
    (ValueError at build time): the plan refuses it before any job, naming the table, the metric and the run."""

    def edit(d):
        d["tables"]["main"]["columns"].append({"name": "P64", "benchmark": "AIME24", "metric": "pass@64"})

    cfg_dir = _configs_with(tmp_path, edit)
    with pytest.raises(PlanError, match=r"table 'main' reads pass@64 of run 'micro/.*eval\.k=\d+"):
        build_plan(PIPE, cfg_dir)


def test_seeds_given_on_snakemakes_command_line_are_accepted_as_numbers():
    """`snakemake --config seeds=[0,1,2]` (README) hands the Snakefile strings (Snakemake parses lists with YAML's
    BaseLoader): the schema takes the digits, the plan plans integer seeds; a negative or non-numeric seed is
    refused."""
    from snakemake.cli import parse_config
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = str(REPO / "workflow" / "schemas" / "pipeline.schema.yaml")
    base = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    cli = parse_config(["seeds=[0,1,2]", "scale=micro", "papers=[dlogp]"])
    assert cli["seeds"] == ["0", "1", "2"]  # what Snakemake really passes
    cfg = {**base, **cli}
    validate(cfg, schema)
    assert sorted({r.seed for r in build_plan(cfg).runs.values()}) == [0, 1, 2]
    for bad in ("seeds=[-1]", "seeds=[x]"):
        with pytest.raises(WorkflowError, match="seeds"):
            validate({**base, **parse_config([bad])}, schema)
