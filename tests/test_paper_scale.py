"""Paper scale: every table of the five papers plans with the papers' models, data and hyperparameters, and every
paper-scale run's verl command composes and validates against verl 0.9.1's own Hydra config, on CPU.

What runs here (CPU, no network, no GPU): the plan at scale `paper`, the run configs, the verl launcher's commands,
verl's Hydra composition of `ppo_trainer` with them and the checks verl's `main_ppo` and trainer run at start-up
before any GPU work (validate_config, the config dataclasses, the reward manager, the custom reward function), the
hand-off from `python -m creditlab train` to verl (with a fake verl), the hub-model fetch (with a fake download).
What does not: verl training itself (GPUs), vLLM, hub downloads.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from creditlab import allocation, paths
from creditlab.config_compose import CachedComposer
from creditlab.engines.verl import launch
from creditlab.plan import BASE_RUN, CONFIG_DIR, PlanError, build_plan, check_registered, run_args, run_config

verl = pytest.importorskip("verl")
VERL_CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"
PAPERS = ["dlogp", "delta", "dfpo", "cancellation", "arca"]
PIPE = {"scale": "paper", "papers": PAPERS, "seeds": [0], "results": "results"}
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}


@pytest.fixture(scope="module")
def paper_plan():
    return build_plan(PIPE, validate=False)


def _run_cfg(composer, run):
    """A run's resolved config as `run_config` makes it, composed with the planner's CachedComposer (equal: tested)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(
        composer.compose(run_args(run.scale, run.backbone, run.method, run.overrides, run.seed)), resolve=True
    )
    check_registered(cfg, run.key)
    cfg["run"] = {
        "name": run.run,
        "key": run.key,
        "experiment": run.experiment,
        "papers": list(run.papers),
        "tables": list(run.tables),
    }
    return cfg


# ------------------------------------------------------------------------------------------------ the plan


def test_paper_scale_plans_every_table_of_the_five_papers(paper_plan):
    from creditlab.papers.load import load_paper

    every = [(p, t) for p in PAPERS for t in load_paper(CONFIG_DIR / "papers" / f"{p}.yaml").tables]
    assert sorted(paper_plan.tables) == sorted(every) and paper_plan.skipped_tables == []
    assert len(every) == 16
    trained = [r for r in paper_plan.runs.values() if r.trains]
    # 7 Paper A + 24 Paper B + 16 x 5 seeds Paper E (Table 1 and the G sweep run both DFPO transforms) + 14 Paper C
    # (13 + our RB compute control, dynamic sampling capped at 2, 3 and 4 rounds) + 7 Paper D
    assert len(trained) == 137 and len(paper_plan.runs) == 139
    assert paper_plan.paper_seeds("dfpo") == [0, 1, 2, 3, 4] and paper_plan.paper_seeds("arca") == [1337]
    suites = yaml.safe_load((CONFIG_DIR / "suites" / "paper.yaml").read_text())
    for p in PAPERS:  # every table's benchmark has a suite of the paper-scale catalog, every backbone a hub model
        spec = paper_plan.papers[p]
        for t in spec.tables:
            assert set(paper_plan.table_suites(p, t)) <= set(suites), (p, t)
        for name, per_scale in spec.backbones.items():
            model = yaml.safe_load((CONFIG_DIR / "model" / f"{per_scale['paper']}.yaml").read_text())
            assert model["kind"] == "hub" and "/" in model["hf_id"] and model["arch"]["family"] in ARCHITECTURES


def test_paper_hyperparameters_reach_the_run_configs(paper_plan):
    """SPEC's numbers per paper, as the jobs resolve them (run_config: the full Hydra composition)."""

    def cfg(backbone, run, seed=0):
        return run_config(paper_plan.get(backbone, run, seed))

    a7, a8 = cfg("qwen2.5-math-7b", "dlogp-ds-a0.2"), cfg("qwen3-8b-base", "dlogp-ds-a0.1")
    t = a7["trainer"]
    assert (t["prompts_per_step"], t["group_size"], t["prompts_per_step"] // t["mini_batches"]) == (512, 16, 32)
    assert (t["lr"], t["lr_warmup_steps"], t["weight_decay"], t["grad_clip"], t["dynamic_sampling"]) == (
        1e-6,
        10,
        0.1,
        1.0,
        True,
    )
    assert (t["max_new_tokens"], a8["trainer"]["max_new_tokens"], t["overlong"]["buffer"]) == (8192, 20480, 4096)
    assert a7["method"]["credit"][0]["alpha"] == 0.2 and a8["method"]["credit"][0]["alpha"] == 0.1
    assert (a7["eval"]["k"], a7["eval"]["max_new_tokens"], a7["eval"]["top_p"]) == (32, 20000, 0.7)
    assert a7["data"]["name"] == "dapo_math_17k" and a7["model"]["hf_id"] == "Qwen/Qwen2.5-Math-7B"

    b8, b14, bf = cfg("qwen3-8b-base", "delta"), cfg("qwen3-14b-base", "delta"), cfg("qwen3-8b-base", "fipo")
    t = b8["trainer"]
    assert b8["data"]["name"] == "deepmath_103k" and (t["prompts_per_step"], t["group_size"]) == (128, 16)
    assert (
        t["prompts_per_step"] // t["mini_batches"] == 32
        and bf["trainer"]["prompts_per_step"] // bf["trainer"]["mini_batches"] == 64
    )
    assert (t["max_prompt_tokens"], t["max_new_tokens"], t["dynamic_sampling"], t["epochs"]) == (2048, 20480, False, 2)
    assert (t["steps"], b14["trainer"]["steps"]) == (220, 300)
    assert (b8["eval"]["k"], b8["eval"]["max_new_tokens"]) == (16, 30000)

    c = cfg("qwen3-4b-base", "qb-rb")
    t = c["trainer"]
    assert (t["prompts_per_step"], t["group_size"], t["prompts_per_step"] // t["mini_batches"]) == (128, 8, 32)
    assert (t["max_prompt_tokens"], t["max_new_tokens"], t["overlong"]["enable"]) == (1024, 8192, False)
    assert (t["batching"], t["reward_balance"]["enable"]) == ("query_preserved", True)
    assert cfg("qwen3-4b-base", "dapo")["trainer"]["batching"] == "verl_ray"  # the papers' verl order: the baseline

    d = cfg("qwen3-1.7b-base", "arca-r16", 1337)
    t = d["trainer"]
    assert d["data"]["name"] == "math_lighteval" and (t["steps"], t["prompts_per_step"], t["group_size"]) == (100, 8, 4)
    assert (t["lr"], t["weight_decay"], t["lr_warmup_steps"], t["lr_schedule"], t["top_p"]) == (
        5e-6,
        0.0,
        10,
        "cosine",
        0.95,
    )
    assert (t["lora"]["enable"], t["lora"]["rank"], t["max_prompt_tokens"], t["max_new_tokens"]) == (True, 16, 512, 512)
    assert d["model"]["verl"]["n_gpus_per_node"] == 1 and d["eval"]["k"] == 4

    e2, e8 = cfg("qwen3-32b", "dfpo-g2", 3), cfg("qwen3-32b", "dfpo", 3)
    assert (e2["trainer"]["group_size"], e8["trainer"]["group_size"]) == (2, 8)  # the sweep's G wins over the paper's
    assert e8["trainer"]["batching"] == "sequential" and e8["eval"]["k"] == 32
    base = cfg("qwen2.5-math-7b", BASE_RUN)  # the base model's evaluation gets the paper's settings
    assert base["eval"]["k"] == 32 and base["method"] == {"name": BASE_RUN}


def test_tiny_and_micro_runs_are_unchanged_by_paper_settings():
    """scale_overrides only apply at their scale: at tiny, a run's overrides are its `overrides` as before (in the
    world that adds none, tiny_arith: a world's own prefix is tests/test_world.py's)."""
    plan = build_plan(
        {"scale": "tiny", "papers": PAPERS, "seeds": [0], "results": "r", "world": "tiny_arith"}, validate=False
    )
    spec = plan.papers["arca"]
    run = plan.get("tiny-s", "arca-r16", 0)
    assert run.overrides == spec.runs["arca-r16"].overrides and "trainer.lora.rank=2" in run.overrides
    assert plan.get("tiny-s", BASE_RUN, 0).overrides == ()
    assert plan.paper_seeds("arca") == [0] and plan.paper_seeds("dfpo") == [0]  # tiny: the pipeline's seeds


SO_PAPER = {
    "paper": "so",
    "backbones": {
        "Small": {"tiny": "tiny-s", "paper": "qwen3-1.7b-base"},
        "Big": {"tiny": "tiny-m", "paper": "qwen3-4b-base"},
    },
    "benchmarks": {"A": {"tiny": "medium", "paper": "aime24"}},
    "scale_overrides": {"paper": {"*": ["trainer.lr=2.0e-6", "trainer.group_size=8"], "Big": ["trainer.steps=7"]}},
    "runs": {
        "r": {
            "method": "dapo",
            "overrides": ["trainer.group_size=4"],
            "scale_overrides": {"paper": ["trainer.lr=3.0e-6"]},
        }
    },
    "tables": {
        "t": {
            "columns": [{"name": "A", "benchmark": "A", "metric": "avg@k"}],
            "rows": [
                {"label": "x", "backbone": "Small", "run": "r"},
                {"label": "x", "backbone": "Big", "run": "r"},
                {"label": "b", "backbone": "Big", "run": "base"},
            ],
        }
    },
}


def _with_paper(tmp_path, data):
    cfg_dir = tmp_path / "configs"
    import shutil

    shutil.copytree(CONFIG_DIR, cfg_dir)
    (cfg_dir / "papers" / f"{data['paper']}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg_dir


def test_scale_overrides_order_and_validation(tmp_path):
    """Paper-level settings first ("*", then the backbone's), then the run's overrides, then its own at the scale."""
    from creditlab.papers.load import parse_paper

    cfg_dir = _with_paper(tmp_path, SO_PAPER)
    plan = build_plan({"scale": "paper", "papers": ["so"], "seeds": [0], "results": "r"}, cfg_dir)
    big = plan.get("qwen3-4b-base", "r", 0)
    assert big.overrides == (
        "trainer.lr=2.0e-6",
        "trainer.group_size=8",
        "trainer.steps=7",
        "trainer.group_size=4",
        "trainer.lr=3.0e-6",
    )
    t = run_config(big, cfg_dir)["trainer"]
    assert (t["lr"], t["group_size"], t["steps"]) == (3e-6, 4, 7)
    assert plan.get("qwen3-4b-base", BASE_RUN, 0).overrides == (
        "trainer.lr=2.0e-6",
        "trainer.group_size=8",
        "trainer.steps=7",
    )
    tiny = {"scale": "tiny", "papers": ["so"], "seeds": [0], "results": "r", "world": "tiny_arith"}  # no world prefix
    assert build_plan(tiny, cfg_dir, validate=False).get("tiny-m", "r", 0).overrides == ("trainer.group_size=4",)
    for bad, needle in [
        ({"scale_overrides": {"huge": {"*": ["a=1"]}}}, r"scale_overrides\.huge.*choices: \['paper', 'tiny'\]"),
        ({"scale_overrides": {"paper": {"Nope": ["a=1"]}}}, r"scale_overrides\.paper\.Nope.*'\*', 'Small'"),
        ({"scale_overrides": {"paper": {"*": ["novalue"]}}}, r"scale_overrides\.paper\.\*\[0\].*key=value"),
    ]:
        with pytest.raises(ValueError, match=needle):
            parse_paper(SO_PAPER | bad, "so.yaml")
    with pytest.raises(ValueError, match=r"runs\.r\.scale_overrides\.huge"):
        parse_paper(SO_PAPER | {"runs": {"r": {"method": "dapo", "scale_overrides": {"huge": ["a=1"]}}}}, "so.yaml")
    bad_key = SO_PAPER | {"scale_overrides": {"paper": {"*": ["trainer.nope=1"]}}}
    with pytest.raises(PlanError, match=r"trainer\.nope"):
        build_plan(
            {"scale": "paper", "papers": ["so"], "seeds": [0], "results": "r"}, _with_paper(tmp_path / "b", bad_key)
        )


def test_cached_composer_equals_hydra_compose(paper_plan):
    """The planner's fast composition is Hydra's: equal configs for runs of every scale, the same errors."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    tiny = build_plan({"scale": "micro", "papers": PAPERS, "seeds": [0], "results": "r"}, validate=False)
    sample = [
        r
        for r in paper_plan.runs.values()
        if r.run in ("dlogp-ds-a0.1", "delta-topk", "arca-r4", "dfpo-g16") and r.seed in (0, 1337)
    ] + [r for r in tiny.runs.values() if r.run in ("delta-topk", "arca-r4", "qb-rb")]
    assert len(sample) == 9
    with CachedComposer(CONFIG_DIR, "run") as fast:
        got = [
            OmegaConf.to_container(fast.compose(run_args(r.scale, r.backbone, r.method, r.overrides, r.seed)))
            for r in sample
        ]
        with pytest.raises(HydraException, match="Could not override 'trainer.nope'"):
            fast.compose(["scale=paper", "model=qwen3-8b-base", "trainer.nope=1"])
        with pytest.raises(HydraException, match="nope"):
            fast.compose(["scale=paper", "method=nope"])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        want = [
            OmegaConf.to_container(compose("run", run_args(r.scale, r.backbone, r.method, r.overrides, r.seed)))
            for r in sample
        ]
    assert got == want


def test_analysis_params_are_read_without_importing_the_kinds():
    import inspect

    from creditlab.analysis import KINDS, analyze_params, kind_module

    for kind in KINDS:
        signature = inspect.signature(kind_module(kind).analyze).parameters
        assert analyze_params(kind) == [p for p in signature if p != "ctx"]


# ------------------------------------------------------------------------------------------------ the launcher


@pytest.fixture(scope="module")
def a_run_cfg(paper_plan):
    return run_config(paper_plan.get("qwen3-8b-base", "delta", 0))


def _kv(argv):
    return dict(o.split("=", 1) for o in argv[3:])


def test_verl_command_builds_the_launch(a_run_cfg, tmp_path):
    rp = launch.RunPaths.of(a_run_cfg, tmp_path / "results", model_path="/models/qwen3-8b-base")
    argv, env = launch.verl_command(
        a_run_cfg,
        rp,
        mlflow_run_id="r" * 32,
        tracking_uri="http://mlflow:5000",
        python="/env/bin/python",
        num_cpus=32,
        plugin_overrides=lambda cfg: ["actor_rollout_ref.actor.policy_loss.loss_mode=x", "trainer.save_freq=5"],
    )
    assert argv[:3] == ["/env/bin/python", "-m", "creditlab.engines.verl.main"]
    assert env == {
        "VERL_USE_EXTERNAL_MODULES": "creditlab.engines.verl.plugin",
        "MLFLOW_RUN_ID": "r" * 32,
        "MLFLOW_TRACKING_URI": "http://mlflow:5000",
    }
    kv = _kv(argv)
    root = (tmp_path / "results").resolve()
    assert kv["trainer.default_local_dir"] == str(root / "paper/checkpoints/qwen3-8b-base/delta/s0")
    assert kv["trainer.resume_mode"] == "auto" and kv["trainer.logger"] == "[console,mlflow]"
    assert kv["+creditlab.config_path"] == str(root / "paper/runs/qwen3-8b-base/delta/s0/config.yaml")
    assert kv["data.train_files"] == f"[{root}/paper/data/verl/deepmath_103k/train.parquet]"
    assert kv["data.val_files"] == f"[{root}/paper/data/verl/deepmath_103k/val.parquet]"
    assert kv["actor_rollout_ref.model.path"] == "/models/qwen3-8b-base"
    assert kv["reward.custom_reward_function.path"] == str(Path(launch.__file__).with_name("reward.py"))
    assert kv["reward.custom_reward_function.name"] == "compute_score"
    assert (
        kv["data.train_batch_size"],
        kv["actor_rollout_ref.rollout.n"],
        kv["actor_rollout_ref.actor.ppo_mini_batch_size"],
        kv["data.max_response_length"],
        kv["trainer.total_training_steps"],
    ) == ("128", "16", "32", "20480", "220")
    assert kv["trainer.experiment_name"] == "paper/qwen3-8b-base/delta/s0" and kv["trainer.project_name"] == "delta"
    assert kv["ray_kwargs.ray_init.num_cpus"] == "32"
    assert kv["+ray_kwargs.ray_init.address"] == "local"  # one node: a fresh Ray, never a stale or another job's one
    # the plug-in's key wins where both set one, and only its value is passed
    assert kv["trainer.save_freq"] == "5" and sum(o.startswith("trainer.save_freq=") for o in argv) == 1
    assert argv[-2:] == ["actor_rollout_ref.actor.policy_loss.loss_mode=x", "trainer.save_freq=5"]
    # tracking offline (no MLflow run id): console only, no MLflow variables
    argv, env = launch.verl_command(a_run_cfg, rp, plugin_overrides=lambda cfg: [])
    assert _kv(argv)["trainer.logger"] == "[console]" and set(env) == {"VERL_USE_EXTERNAL_MODULES"}


def test_verl_command_without_the_plugin_says_so(a_run_cfg, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "creditlab.engines.verl.plugin", None)  # import -> ImportError
    with pytest.raises(launch.PluginUnavailable, match=r"creditlab\.engines\.verl\.plugin\.plugin_overrides"):
        launch.verl_command(a_run_cfg, launch.RunPaths.of(a_run_cfg, tmp_path))


def test_preflight_rejects_what_the_gpus_would(a_run_cfg):
    import copy

    def bad(**changes):
        cfg = copy.deepcopy(a_run_cfg)
        for dotted, value in changes.items():
            node = cfg
            *parents, leaf = dotted.split("__")
            for p in parents:
                node = node[p]
            node[leaf] = value
        return cfg

    launch.preflight(a_run_cfg)
    for cfg, needle in [
        (bad(trainer__mini_batches=3), "not divisible by trainer.mini_batches=3"),
        (bad(trainer__max_new_tokens=40000), "context window 32768"),
        (bad(eval__max_new_tokens=31000), "eval.max_new_tokens"),
        (
            bad(trainer__prompts_per_step=4, trainer__mini_batches=4, trainer__group_size=2),
            "does not split over 4 data-parallel ranks",
        ),
        (bad(model__verl__rollout_tp=3), "rollout_tp=3"),
        (bad(trainer__lr_schedule="wsd"), "lr_schedule"),
    ]:
        with pytest.raises(launch.LaunchError, match=needle):
            launch.preflight(cfg)


def test_snakemake_plans_the_paper_scale_dag(paper_plan, tmp_path):
    """`snakemake -n --config scale=paper` lists every job of the five papers, and each GPU job asks for the GPUs
    its run's config sizes: training nodes x GPUs (model.verl), evaluation the vLLM tensor-parallel size.

    But the runs the plan refuses (creditlab.plan.RunRefused: DFPO's Qwen3-Next-80B-A3B rows, whose Gated DeltaNet
    layers verl 0.9.1 would train wrong, tests/test_suspected_qwen3_next.py): no job trains, evaluates or warms up that
    backbone, DFPO's Table 1 (which reads them) is not built, its other tables, figure and ledger are, and the DAG
    prints the refused runs' keys and the reason (tests/test_plan_refusals.py: the same at plan level). So are the
    evaluations longer than the site's job limit (creditlab.resources.eval_time, tests/test_eval_time.py: DelTA's Olmo 3
    transfer evaluations, Paper A's selective decodings with a window ten times one engine's KV cache) and the tables
    reading them. Each evaluation job's wall time is its estimate, printed in the `creditlab resources:` lines."""
    import re
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("snakemake")),
            "--snakefile",
            str(repo / "Snakefile"),
            "--directory",
            str(tmp_path),
            "-n",
            "--verbose",
            "--printshellcmds",
            "--config",
            "scale=paper",
            f"results={tmp_path / 'results'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out[out.rindex("Job stats:") :], re.M))
    assert {k: int(v) for k, v in counts.items()} == {
        "init_tracking": 1,
        "prepare_data": 1,
        "warmup": 8,  # the nine backbones but Qwen3-Next-80B-A3B
        "train": 127,  # 137 planned, less the 10 refused (Qwen3-Next: GSPO and DFPO x 5 seeds)
        "evaluate": 119,  # those 10, and the 10 Qwen3-32B GRPO / GRPO-fix evaluations only Table 1 read
        "evaluate_decode": 19,
        "table": 15,  # the 16 tables but DFPO's Table 1
        "ledger": 5,
        "figure": 5,
        "token_credit_figure": 1,
        "analysis": 5,
        "diagnose": 1,
        "all": 1,
        "total": 308,
    }, counts
    refused = [f"paper/qwen3-next-80b-a3b/{r}/s{s}" for r in ("gspo", "dfpo") for s in range(5)]
    notes = [line for line in out.splitlines() if line.startswith("creditlab: ")]
    (note,) = [line for line in notes if line.startswith("creditlab: table dfpo/main ")]
    # the only table left out: resources fit once the G = 16 rows run at Ulysses sp 16, Paper A's decodings at 48
    # sequences a step and Olmo 3's evaluations on 4 GPUs (configs/papers/*.yaml; refused before those overrides)
    assert [n.split(" reads ")[0] for n in notes if n.startswith("creditlab: table ")] == ["creditlab: table dfpo/main"]
    assert any(n.startswith("creditlab: hub_cache ") and "backbone snapshots" in n for n in notes)
    assert note.startswith(
        "creditlab: table dfpo/main reads runs refused at scale 'paper', not built: " + ", ".join(refused) + ": "
        "model.arch.family=qwen3_next (linear-attention layers) would train on wrong log-probs under verl 0.9.1: "
        "actor_rollout_ref.model.use_remove_padding=true"
    ), note[:1000]
    assert "Ulysses sp=8" in note
    assert "qwen3-next-80b-a3b" not in out.replace(note, "")  # no job of the backbone, no file of it read
    dfpo_tables = re.findall(r"^rule table:\n(?:    .*\n)*?    wildcards: paper=dfpo, table=(\w+)$", out, re.M)
    assert sorted(dfpo_tables) == ["compute", "group_size"]
    # the ledger tests the claims of the tables built (Table 1's: reported not built, tests/test_plan_refusals.py)
    assert re.search(r"^Shell command: .* --tables dfpo/group_size,dfpo/compute ledger --paper dfpo ", out, re.M)
    assert re.search(r"^    output: .*/paper/figures/dfpo/figure_group_size_bars\.png$", out, re.M)
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: (.*)\n(?:    .*\n)*?    resources: (.*)$", out, re.M)
    # the resource lines: every run's, then every evaluation job's hours and the wall time its rule asks for
    res_lines = [
        line.removeprefix("creditlab resources: ") for line in out.splitlines() if "creditlab resources: " in line
    ]
    assert any(line.startswith("totals (runs not refused): ") for line in res_lines)
    first = res_lines.index(next(line for line in res_lines if line.startswith("evaluation jobs ")))
    wall = {line.split()[0]: line.split() for line in res_lines[first + 2 :] if line.startswith("paper/")}
    assert wall["paper/qwen3-8b-base/delta/s0"][-1] == "yes" and wall["paper/olmo3-7b-base/delta/s0"][-1] == "yes"
    checked = 0
    for rule, wildcards, resources in jobs:
        if rule not in ("train", "evaluate", "evaluate_decode"):
            continue
        w = dict(kv.split("=", 1) for kv in wildcards.split(", "))
        res = dict(kv.split("=", 1) for kv in resources.split(", "))
        cfg = run_config(paper_plan.get(w["backbone"], w["run"], int(w["seed"])))
        v = cfg["model"]["verl"]
        want = (
            v["nnodes"] * v["n_gpus_per_node"]
            if rule == "train"
            else cfg["eval"]["vllm"]["extra"]["tensor_parallel_size"]
        )
        assert int(res["gpu"]) == want, (rule, w, res)
        if rule == "evaluate":  # its estimate's wall time (1.5 x hours + 20 min), within the site's 48 h
            key = paths.run_key("paper", w["backbone"], w["run"], int(w["seed"]))
            assert int(res["runtime"]) == int(wall[key][-2]) <= 48 * 60 and wall[key][-1] == "yes", (w, res)
        checked += 1
    assert checked == 127 + 119 + 19
    assert int(wall["paper/qwen3-8b-base/delta/s0"][-2]) > 240  # MMLU-Pro and LiveCodeBench: issue 30
    print(f"paper-scale dry run: {seconds:.1f} s")


def test_hydra_values():
    hv = launch.hydra_value
    assert [
        hv(None),
        hv(True),
        hv(3),
        hv(1e-6),
        hv("Qwen/Qwen3-8B"),
        hv("/a b/c"),
        hv("it's"),
        hv("1e-3"),
        hv("null"),
        hv([1, "x"]),
    ] == ["null", "true", "3", "1e-06", "Qwen/Qwen3-8B", "'/a b/c'", "'it\\'s'", "'1e-3'", "'null'", "[1,x]"]
    assert hv({"enable_thinking": False, "a b": [1]}) == "{enable_thinking:false,'a b':[1]}" and hv({}) == "{}"
    assert launch.override_key("++a.b=1") == "a.b" and launch.override_key("~a.b") == "a.b"


# ------------------------------------------------------------------------------------------------ verl's own config


def _stand_in_models(root: Path, families: dict[str, int]) -> dict[str, Path]:
    """A local HF model directory per backbone (config.json of the real architecture and context window, a small
    tokenizer with a chat template): what verl's HFModelConfig loads at start-up, instead of the hub checkpoint."""
    from transformers import AutoConfig

    from creditlab.data.tokenizer import build_tokenizer

    tok = build_tokenizer(["0123456789 abcdefghijklmnopqrstuvwxyz.,?{}\\+-*/=()"])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    out = {}
    for name, (family, window) in families.items():
        d = root / name
        tok.save_pretrained(d)
        c = AutoConfig.for_model(
            family,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=len(tok),
            max_position_embeddings=window,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        c.architectures = [ARCHITECTURES[family]]
        c.save_pretrained(d)
        out[name] = d
    return out


def _vllm_free_lora_check(monkeypatch):
    """verl's validate_config checks a LoRA rank with verl.workers.rollout.vllm_rollout.utils.get_vllm_max_lora_rank,
    whose module imports vLLM (absent on CPU). The function itself needs no vLLM (it falls back to vLLM's rank list):
    install verl's own function, compiled from verl's source, as that module."""
    src = Path(verl.__file__).parent / "workers" / "rollout" / "vllm_rollout" / "utils.py"
    fn = next(
        n
        for n in ast.parse(src.read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name == "get_vllm_max_lora_rank"
    )
    module = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    header = ast.parse("from typing import Literal, get_args").body
    exec(compile(ast.Module(body=[*header, fn], type_ignores=[]), str(src), "exec"), module.__dict__)
    package = types.ModuleType("verl.workers.rollout.vllm_rollout")
    package.__path__ = []
    package.utils = module
    monkeypatch.setitem(sys.modules, "verl.workers.rollout.vllm_rollout", package)
    monkeypatch.setitem(sys.modules, "verl.workers.rollout.vllm_rollout.utils", module)
    return module


@pytest.mark.parametrize(
    "papers,n_runs,several_nodes",
    [
        (PAPERS, 137, True),
        (["headtohead"], 57, False),  # issue 10's protocol at paper scale: 19 runs x 3 seeds, one 8B backbone
    ],
    ids=["five-papers", "headtohead"],
)
def test_every_paper_run_composes_and_validates_against_verl(
    paper_plan, tmp_path, monkeypatch, papers, n_runs, several_nodes
):
    """Each of the 137 paper-scale training runs of the five papers (and the 57 of the head-to-head table): its
    verl command's overrides, the verl plug-in's own included
    (creditlab.engines.verl.plugin.plugin_overrides), compose with verl 0.9.1's own `ppo_trainer` Hydra config and pass
    what verl checks at start-up on CPU: main_ppo's validate_config, the config dataclasses its trainer and workers
    build (actor, ref, rollout, model, algorithm, checkpoint engine, skip, distillation, critic when used), the
    dynamic-sampling metric, the custom reward function and the reward manager; and what creditlab's verl trainer
    checks at start-up (CreditlabTrainer._setup_creditlab: batching, whole groups for the group-coupled losses). Every
    run composes: Paper C's sign-partitioned control too (trainer.sign_order)."""
    from omegaconf import OmegaConf
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device
    from verl.utils.skip import SkipManagerConfig
    from verl.workers.config import ActorConfig, HFModelConfig, RolloutConfig
    from verl.workers.rollout.utils import get_max_position_embeddings

    from creditlab.engines.verl.plugin import plugin_overrides
    from creditlab.engines.verl.trainer import CreditlabTrainer

    t0 = time.perf_counter()
    lora_rank = _vllm_free_lora_check(monkeypatch)
    plan = paper_plan if papers == PAPERS else build_plan({**PIPE, "papers": papers}, validate=False)
    runs = [r for r in plan.runs.values() if r.trains]
    assert len(runs) == n_runs
    with CachedComposer(CONFIG_DIR, "run") as composer:
        run_cfgs = [_run_cfg(composer, r) for r in runs]
    models = {
        c["model"]["name"]: (c["model"]["arch"]["family"], c["model"]["arch"]["max_position_embeddings"])
        for c in run_cfgs
    }
    stand_ins = _stand_in_models(tmp_path / "models", models)
    checked_models, checked_rewards, seen, built, multi_node = {}, {}, set(), {}, 0

    def dataclass_of(node, dataclass_type=None):
        """verl's omega_conf_to_dataclass, once per distinct (resolved) config section: runs share most sections,
        and an identical section builds the identical dataclass (a third of this test's time otherwise)."""
        key = (json.dumps(OmegaConf.to_container(node), sort_keys=True, default=str), dataclass_type)
        if key not in built:
            built[key] = omega_conf_to_dataclass(node, dataclass_type=dataclass_type)
        return built[key]

    with CachedComposer(VERL_CONFIG_DIR, "ppo_trainer") as verl_composer:
        for cfg in run_cfgs:
            key, t, m = cfg["run"]["key"], cfg["trainer"], cfg["method"]
            rp = launch.RunPaths.of(cfg, tmp_path / "results", model_path=str(stand_ins[cfg["model"]["name"]]))
            argv, env = launch.verl_command(
                cfg, rp, mlflow_run_id="0" * 32, tracking_uri="http://mlflow.invalid", plugin_overrides=plugin_overrides
            )
            v = cfg["model"]["verl"]
            if v["nnodes"] > 1:  # multi-node: the driver runs under the Ray-on-SLURM bootstrap
                assert argv[1:6] == ["-m", launch.RAY_SLURM, "--gpus-per-node", str(v["n_gpus_per_node"]), "--"]
                argv = argv[6:]
                multi_node += 1
            assert argv[1:3] == ["-m", launch.VERL_MAIN] and env["MLFLOW_RUN_ID"] == "0" * 32
            conf = verl_composer.compose(argv[3:])  # verl's Hydra config + our overrides (+ the plug-in's)
            # verl's main_ppo, before Ray: device, validate_config
            auto_set_device(conf)
            validate_config(config=conf, use_reference_policy=need_reference_policy(conf), use_critic=need_critic(conf))
            OmegaConf.resolve(conf)  # the TaskRunner resolves the config before building the trainer
            # the dataclasses the trainer and its workers build from it
            arr = conf.actor_rollout_ref
            assert isinstance(dataclass_of(arr.actor), ActorConfig)
            rollout = dataclass_of(arr.rollout)
            assert isinstance(rollout, RolloutConfig) and rollout.n == t["group_size"] and rollout.name == "vllm"
            ref = OmegaConf.create(OmegaConf.to_container(arr.ref))  # as engine_workers.init_model reshapes the ref
            ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
            ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
            ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
            ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
            assert isinstance(dataclass_of(ref), ActorConfig)
            assert isinstance(dataclass_of(conf.algorithm), AlgoConfig)
            dataclass_of(arr.rollout.checkpoint_engine)
            dataclass_of(conf.skip, dataclass_type=SkipManagerConfig)
            dataclass_of(conf.distillation)
            if need_critic(conf):
                dataclass_of(conf.critic)
            metric = PPOTrainer._resolve_filter_groups_metric(SimpleNamespace(config=conf))
            assert metric == ("acc" if t["dynamic_sampling"] else None)
            if arr.model.get("lora_rank", 0) > 0:
                assert lora_rank.get_vllm_max_lora_rank(arr.model.lora_rank) >= arr.model.lora_rank
            model_key = json.dumps(OmegaConf.to_container(arr.model), sort_keys=True)
            if model_key not in checked_models:  # HFModelConfig loads the (stand-in) model's config and tokenizer
                checked_models[model_key] = omega_conf_to_dataclass(arr.model)
            mc = checked_models[model_key]
            assert isinstance(mc, HFModelConfig) and mc.architectures == [ARCHITECTURES[cfg["model"]["arch"]["family"]]]
            # verl's vLLM server refuses a max_model_len beyond the (overridden) HF config's window; vLLM gets the
            # same override (hf_overrides) as the trainer
            assert (
                get_max_position_embeddings(mc.hf_config)
                >= rollout.max_model_len
                == t["max_prompt_tokens"] + t["max_new_tokens"]
            )
            assert dict(rollout.engine_kwargs["vllm"].get("hf_overrides", {})) == cfg["model"]["override_config"]
            reward_key = json.dumps(OmegaConf.to_container(conf.reward), sort_keys=True)
            if reward_key not in checked_rewards:  # verl's reward function loader and the DAPO reward manager
                fn = get_custom_reward_fn(conf)
                assert fn(data_source=cfg["data"]["name"], solution_str="so \\boxed{4}", ground_truth="4") == 1.0
                checked_rewards[reward_key] = load_reward_manager(conf, mc.tokenizer)
            manager = checked_rewards[reward_key]
            assert type(manager).__name__ == "DAPORewardManager" and manager.max_resp_len == t["max_new_tokens"]
            assert bool(manager.overlong_buffer_cfg.enable) == t["overlong"]["enable"]
            # what the run must get, as verl sees it
            assert conf.trainer.default_local_dir == str(rp.ckpt_dir) and conf.trainer.resume_mode == "auto"
            assert list(conf.trainer.logger) == ["console", "mlflow"] and conf.trainer.experiment_name == key
            assert conf.creditlab.config_path == str(rp.config_path)
            assert conf.trainer.total_training_steps == t["steps"]
            assert conf.data.train_batch_size == t["prompts_per_step"]
            assert conf.data.max_response_length == t["max_new_tokens"] and arr.actor.optim.lr == t["lr"]
            assert (conf.trainer.nnodes, conf.trainer.n_gpus_per_node) == (v["nnodes"], v["n_gpus_per_node"])
            # the plug-in's registrations, selected as verl reads them
            assert conf.algorithm.adv_estimator == f"creditlab_{m['advantage']}"
            assert arr.actor.policy_loss.loss_mode == f"creditlab_{m['policy_loss']}"
            assert conf.trainer.v1.trainer_mode == "creditlab_sync" and conf.trainer.use_v1
            if t["batching"] in ("sequential", "query_preserved"):  # verl's iterator keeps each rank's order
                assert "actor_rollout_ref.actor.shuffle=false" in argv and arr.actor.shuffle is False
            assert conf.trainer.balance_batch is (t["batching"] != "sequential")
            trainer = object.__new__(CreditlabTrainer)  # creditlab's trainer start-up checks on this config
            trainer.config, trainer.run_cfg = conf, cfg
            trainer._setup_creditlab()
            assert trainer.group_coupled == (m["policy_loss"] in {"dfpo", "grpo_fix"})
            assert trainer.group_size == t["group_size"]
            if trainer.group_coupled:  # a micro-batch holds G whole sequences
                assert (
                    arr.actor.use_dynamic_bsz
                    and arr.actor.ppo_max_token_len_per_gpu * arr.actor.ulysses_sequence_parallel_size
                    >= t["group_size"] * rollout.max_model_len
                )
            seen.add(key)
    assert len(seen) == n_runs and (multi_node > 0) == several_nodes
    elapsed = time.perf_counter() - t0
    print(
        f"\n{len(seen)} paper-scale runs composed and validated against verl {verl.__version__} with the plug-in's "
        f"overrides in {elapsed:.1f} s"
    )


def test_verl_reads_the_prepared_parquet(tmp_path):
    """The verl parquet format of the `prepare` job (creditlab.data.verl_format) is what verl's RLHFDataset reads:
    the prompt chat list, data_source, reward_model.ground_truth; its reward function scores against it."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from creditlab.data.schema import make_record
    from creditlab.data.verl_format import write_verl_parquet
    from creditlab.engines.verl.reward import compute_score

    records = [
        make_record(
            f"dapo_math_17k/train/{i}", "dapo_math_17k", "train", f"What is {i} + {i}?", str(2 * i), meta={"n": i}
        )
        for i in range(5)
    ]
    path = paths.fmt(paths.VERL_TRAIN, results=tmp_path, scale="paper", dataset="dapo_math_17k")
    assert write_verl_parquet(records, path, template="boxed") == path
    tok_dir = _stand_in_models(tmp_path / "models", {"m": ("qwen3", 4096)})["m"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    with CachedComposer(VERL_CONFIG_DIR, "ppo_trainer") as vc:
        conf = vc.compose(
            [
                f"data.train_files=[{path}]",
                "data.max_prompt_length=512",
                "data.filter_overlong_prompts=true",
                f"+data.cache_dir={tmp_path / 'cache'}",
            ]
        )
    data_cfg = OmegaConf.create(OmegaConf.to_container(conf.data, resolve=True))
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tok, config=data_cfg)
    assert len(ds) == 5
    row = ds[3]
    assert row["data_source"] == "dapo_math_17k" and row["reward_model"]["ground_truth"] == "6"
    assert "What is 3 + 3?" in row["raw_prompt"][0]["content"] and "\\boxed{}" in row["raw_prompt"][0]["content"]
    assert json.loads(row["extra_info"]["meta"]) == {"n": 3}
    gold = row["reward_model"]["ground_truth"]
    assert compute_score(row["data_source"], "so \\boxed{6}", gold, row["extra_info"]) == 1.0


# ------------------------------------------------------------------------------------------------ the pipeline


class _FakeVerl:
    """Stands in for creditlab.engines.verl.launch's process runner: 'trains' by writing what verl and the plug-in
    write (the checkpoint record, metrics.jsonl), 'merges' by writing final/; the real command builders are used."""

    def __init__(self, steps_written=None, rc=0, lora_rank=64, pause=False, keep_steps=()):
        self.calls, self.steps_written, self.rc, self.lora_rank = [], steps_written, rc, lora_rank
        self.pause, self.keep_steps = pause, keep_steps  # pause: stop as the trainer does at an allocation's end
        names = (
            "RunPaths",
            "preflight",
            "steps_done",
            "merge_command",
            "merge_env",
            "finish_merged",
            "prune_checkpoints",
        )
        for name in names:
            setattr(self, name, getattr(launch, name))

    def verl_command(self, cfg, rp, **kw):
        return launch.verl_command(cfg, rp, plugin_overrides=lambda c: [], **kw)

    def run_streaming(self, argv, env, cwd=None):
        self.calls.append((argv, dict(env)))
        if argv[2] == launch.VERL_MAIN:
            kv = _kv(argv)
            ckpt = Path(kv["trainer.default_local_dir"])
            ckpt.mkdir(parents=True, exist_ok=True)
            last = self.steps_written or int(kv["trainer.total_training_steps"])
            (ckpt / launch.LATEST).write_text(str(last))
            for step in (*self.keep_steps, last):  # verl's global_step_N/ directories (keep_checkpoints of them)
                (ckpt / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
            if self.pause:  # what CreditlabTrainer._allocation_check writes before it stops (creditlab.allocation)
                clock = allocation.AllocationClock(time.time() + 600, 300)
                clock.observe(step_s=200, save_s=100)
                allocation.write_pause(ckpt, last, clock)
            run_dir = Path(kv["+creditlab.config_path"]).parent
            (run_dir / "metrics.jsonl").write_text('{"step": 0, "reward_mean": 0.5}\n')
        else:  # verl's merger on a LoRA checkpoint: the base weights in final/, the adapter in final/lora_adapter/
            _merged_lora(Path(argv[argv.index("--target_dir") + 1]), self.lora_rank)
        return self.rc


def _merged_lora(final: Path, rank: int) -> None:
    """What verl 0.9.1's merger writes for a LoRA run (model_merger/base_model_merger.py:311-408): final/ with the base
    weights, final/lora_adapter/ with the adapter, lora_alpha 0 as without lora_train_meta.json; one adapted layer."""
    import torch
    from safetensors.torch import save_file

    (final / "lora_adapter").mkdir(parents=True)
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8)}, str(final / "model.safetensors"))
    (final / "lora_adapter" / "adapter_config.json").write_text(
        json.dumps({"r": rank, "lora_alpha": 0, "target_modules": ["q_proj"]})
    )
    name = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {f"{name}.lora_A.weight": torch.ones(rank, 8), f"{name}.lora_B.weight": torch.ones(8, rank)},
        str(final / "lora_adapter" / "adapter_model.safetensors"),
    )


def test_train_at_paper_scale_hands_the_run_to_verl(tmp_path, monkeypatch, paper_plan):
    """`python -m creditlab train` at scale paper: config.yaml, the MLflow run (its id to verl), the verl command, the
    step check, the merge into final/, DONE; a short run is not marked DONE."""
    from creditlab.jobs.train import train_verl

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    run = paper_plan.get("qwen3-1.7b-base", "arca-r64", 1337)
    cfg = run_config(run)
    base = paths.fmt(paths.BASE_DONE, results=results, scale="paper", backbone=run.backbone)
    base.parent.mkdir(parents=True)
    base.write_text(json.dumps({"path": "/hf/snapshots/abc"}))
    fake = _FakeVerl()
    train_verl(str(results), run, cfg, launcher=fake)
    run_dir = paths.fmt(paths.RUN_DIR, results=results, scale="paper", backbone=run.backbone, run=run.run, seed=1337)
    done = json.loads((run_dir / "DONE").read_text())
    assert (done["steps_done"], done["steps_requested"], done["engine"]) == (100, 100, "verl") and done["mlflow_run_id"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["lora"]["rank"] == 64
    (argv, env), (merge, _) = fake.calls
    assert env["MLFLOW_RUN_ID"] == done["mlflow_run_id"] and env["MLFLOW_TRACKING_URI"].startswith("sqlite:///")
    kv = _kv(argv)
    assert kv["actor_rollout_ref.model.path"] == "/hf/snapshots/abc" and kv["actor_rollout_ref.model.lora_rank"] == "64"
    assert kv["trainer.n_gpus_per_node"] == "1" and kv["data.seed"] == "1337"
    assert merge[2:4] == ["verl.model_merger", "merge"] and merge[-1] == str(run_dir / "final")
    # finish_merged: the LoRA adapter placed where the evaluator serves it from, its alpha the run's, merged into final/
    assert json.loads((run_dir / "adapter" / "adapter_config.json").read_text())["lora_alpha"] == 128
    assert not (run_dir / "final" / "lora_adapter").exists()
    # a verl run that stopped short (or failed) is not DONE; its checkpoints stay for the resume
    short = paper_plan.get("qwen3-1.7b-base", "arca-r16", 1337)
    with pytest.raises(SystemExit, match="checkpointed step 40 of 100"):
        train_verl(str(results), short, run_config(short), launcher=_FakeVerl(steps_written=40))
    with pytest.raises(SystemExit, match="verl exited with status 3"):
        train_verl(str(results), short, run_config(short), launcher=_FakeVerl(rc=3))
    assert not paths.fmt(
        paths.RUN_DONE, results=results, scale="paper", backbone=short.backbone, run=short.run, seed=1337
    ).exists()


def test_a_run_longer_than_its_allocation_pauses_requeues_and_prunes(tmp_path, monkeypatch, paper_plan):
    """A verl run that stopped for its SLURM allocation's end (the trainer's pause record at the step it checkpointed)
    requeues its own job with scontrol, bounded by trainer.allocation.max_requeues, and leaves its MLflow run
    SCHEDULED; a crash requeues nothing; the next allocation finishes, and every checkpoint but the last is pruned."""
    from mlflow.tracking import MlflowClient

    from creditlab.jobs.train import AllocationEnded, train_verl
    from creditlab.tracking.mlflow_tracker import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results, calls = tmp_path / "results", tmp_path / "scontrol.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    end = 1_900_000_000  # an allocation end (2030): the fake verl pauses whatever it is
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(end))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    run = paper_plan.get("qwen3-1.7b-base", "arca-r64", 1337)
    cfg = run_config(run)
    assert (
        cfg["trainer"]["allocation"] == {"exit_grace_s": 900, "max_requeues": 20}
        and cfg["trainer"]["prune_checkpoints"]
    )
    base = paths.fmt(paths.BASE_DONE, results=results, scale="paper", backbone=run.backbone)
    base.parent.mkdir(parents=True)
    base.write_text(json.dumps({"path": "/hf/snapshots/abc"}))
    fill = dict(results=results, scale="paper", backbone=run.backbone, run=run.run, seed=1337)
    run_dir, ckpt = paths.fmt(paths.RUN_DIR, **fill), paths.fmt(paths.CKPT_DIR, **fill)

    paused = _FakeVerl(steps_written=40, rc=1, pause=True)
    with pytest.raises(AllocationEnded, match="paused at step 40 of 100"):
        train_verl(str(results), run, cfg, launcher=paused)
    assert calls.read_text().split() == ["requeue", "4242"] and not (run_dir / "DONE").exists()
    env = paused.calls[0][1]
    assert env[allocation.ENV_DEADLINE] == str(float(end)) and env[allocation.ENV_EXIT_GRACE] == "900"
    client = MlflowClient(tracking_uri(results))
    assert client.get_run(env["MLFLOW_RUN_ID"]).info.status == "SCHEDULED"
    # the bound: past max_requeues the job fails instead of requeueing again
    monkeypatch.setenv("SLURM_RESTART_COUNT", "20")
    with pytest.raises(allocation.RequeueRefused, match="requeued 20 times"):
        train_verl(str(results), run, cfg, launcher=_FakeVerl(steps_written=40, rc=1, pause=True))
    # a crash (no pause record of the last checkpoint) is not a pause: no requeue
    with pytest.raises(SystemExit, match="verl exited with status 3") as crash:
        train_verl(str(results), run, cfg, launcher=_FakeVerl(steps_written=40, rc=3))
    assert not isinstance(crash.value, AllocationEnded) and calls.read_text().split() == ["requeue", "4242"]
    # the next allocation finishes the run: DONE, the MLflow run resumed and FINISHED, checkpoints but the last pruned
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    done = _FakeVerl(keep_steps=(40, 80))
    train_verl(str(results), run, cfg, launcher=done)
    assert done.calls[0][1]["MLFLOW_RUN_ID"] == env["MLFLOW_RUN_ID"]
    assert client.get_run(env["MLFLOW_RUN_ID"]).info.status == "FINISHED"
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_100"]
    assert allocation.read_pause(ckpt) is None and (run_dir / "DONE").is_file()
    # trainer.prune_checkpoints: false keeps them
    keep = {**cfg, "trainer": {**cfg["trainer"], "prune_checkpoints": False}}
    (run_dir / "DONE").unlink()
    shutil.rmtree(run_dir / "final")
    shutil.rmtree(run_dir / "adapter")
    train_verl(str(results), run, keep, launcher=_FakeVerl(keep_steps=(40, 80)))
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_100", "global_step_40", "global_step_80"]


def test_warmup_at_paper_scale_fetches_and_checks_the_hub_model(tmp_path, monkeypatch):
    """`warmup` at paper scale: no SFT; the hub snapshot (here a fake download) is checked against the model config and
    recorded in DONE (the launcher's model path); a checkpoint that is not what the config says is refused."""
    import huggingface_hub

    from creditlab import cli
    from creditlab.jobs.warmup import warmup

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-4B-Base" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 32768}))
    asked = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, revision=None: asked.append((repo_id, revision)) or str(snapshot),
    )
    results = str(tmp_path / "results")
    warmup(results, "paper", "qwen3-4b-base", 0)
    done_path = paths.fmt(paths.BASE_DONE, results=results, scale="paper", backbone="qwen3-4b-base")
    done = json.loads(done_path.read_text())
    assert asked == [("Qwen/Qwen3-4B-Base", None)]
    assert (done["hf_id"], done["commit"], done["path"]) == ("Qwen/Qwen3-4B-Base", "0123abcd", str(snapshot))
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 4096}))
    with pytest.raises(SystemExit, match="config.json says .*4096.*configs/model/qwen3-4b-base.yaml says .*32768"):
        warmup(results, "paper", "qwen3-4b-base", 0)
    # `evaluate` at paper scale reads the suites of the run's tables only (Paper C's six), and says which are
    # missing before it starts anything (tests/test_paper_eval.py runs it for real)
    with pytest.raises(
        SystemExit, match=r"qb/s0: no suite file\(s\) .*aime24.parquet.*math500.parquet'\]: run the `prepare`"
    ):
        cli.main(["--results", results, "--scale", "paper", "evaluate", "--backbone", "qwen3-4b-base", "--run", "qb"])
