"""`diagnose` and the Paper C analyses on hub-format models (scales paper and smoke): the per-scale resolver of a run's
files (creditlab.models.sources), prompts rendered as verl renders them, the checkpoint's stop tokens, and a
`start: trained` analysis taking verl's FSDP2 checkpoint (master weights + AdamW moments).

No verl run here: the checkpoint is written by two gloo ranks of torch's own FSDP2 (``fully_shard``) exactly as
verl 0.9.1's FSDPCheckpointManager saves it (per-rank ``model.state_dict()`` / ``optimizer.state_dict()`` of DTensor
shards, ``extra_state`` with the LR scheduler), with the full tensors beside it as the reference. The tests on that
smoke world are marked e2e; the resolver and sampler tests are not. The real verl runs of these jobs are built by
Snakemake at smoke scale: results/smoke/figures/diagnostics/qwen3-1.7b-base/dapo/s0_token_histograms.png and
results/smoke/analyses/cancellation/flipping_trained.json (one 1-rank verl run), .../flipping.json (none)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from creditlab import paths
from creditlab.plan import CONFIG_DIR, all_papers, build_plan, run_config

BACKBONE, RUN = "qwen3-1.7b-base", "dapo"  # Paper C's analyses run on the Qwen3-1.7B-Base stand-in's `dapo` run


def _plan(scale: str):
    cfg = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text()) | {"scale": scale, "papers": all_papers()}
    return build_plan(cfg, validate=False)


def _fill(results: Path, scale: str) -> dict:
    return dict(results=results, scale=scale, backbone=BACKBONE, run=RUN, seed=0)


# ------------------------------------------------------------------------------------------------ the resolver
def test_tiny_runs_resolve_to_the_local_engines_files(tmp_path):
    from creditlab.models.sources import run_sources

    plan = _plan("tiny")
    run = plan.get("tiny-s", RUN, 0)
    src = run_sources(run, run_config(run), tmp_path)
    fill = dict(results=tmp_path, scale="tiny", backbone="tiny-s", run=RUN, seed=0)
    data = paths.fmt(paths.DATA_DIR, **fill)
    assert not src.hub
    assert src.base == paths.fmt(paths.BASE_DIR, **fill)  # no DONE needed: the warmed-up model's own directory
    assert src.trained == paths.fmt(paths.RUN_DIR, **fill) / "final"
    assert src.tokenizer_path == data / "tokenizer"
    assert src.train_records == data / "train.parquet"
    assert src.suite("easy") == paths.fmt(paths.SUITE, suite="easy", **fill)
    assert src.weights("base") == src.base and src.weights("trained") == src.trained
    with pytest.raises(ValueError, match="unknown start"):
        src.weights("final")

    class Tok:
        eos_token_id = 7

    assert src.stop_ids(Tok()) == 7  # the tokenizer's EOS, as the local trainer always stopped


@pytest.mark.parametrize("scale", ["smoke", "paper"])
def test_hub_runs_resolve_to_the_snapshot_the_merged_model_and_the_prepared_set(tmp_path, scale):
    from creditlab.models.sources import run_sources

    plan = _plan(scale)
    run = plan.get(BACKBONE, RUN, 0)
    cfg = run_config(run)
    fill = _fill(tmp_path, scale)
    with pytest.raises(FileNotFoundError, match="the `warmup` job fetches Qwen/Qwen3-1.7B-Base first"):
        run_sources(run, cfg, tmp_path)
    snapshot = tmp_path / "hf_cache" / "snapshots" / "abc123"  # where `warmup` recorded the hub download / stand-in
    done = paths.fmt(paths.BASE_DONE, **fill)
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"hf_id": "Qwen/Qwen3-1.7B-Base", "path": str(snapshot)}))
    src = run_sources(run, cfg, tmp_path)
    assert src.hub and src.base == snapshot
    assert src.trained == paths.fmt(paths.RUN_DIR, **fill) / "final"  # verl's model merger writes it
    assert src.tokenizer_path == snapshot  # the model's own: there is no data/tokenizer at hub scales
    assert src.train_records == paths.fmt(paths.TRAIN_SET_DIR, dataset="dapo_math_17k", **fill) / "train.parquet"
    assert src.ckpt_dir == paths.fmt(paths.CKPT_DIR, **fill)
    assert src.template == "boxed"
    other = run_sources(run, cfg | {"model": {**cfg["model"], "tokenizer": "/elsewhere/tok"}}, tmp_path)
    assert other.tokenizer_path == Path("/elsewhere/tok")  # model.tokenizer wins, as in the evaluation
    run_dir = paths.fmt(paths.RUN_DIR, **fill)
    run_dir.mkdir(parents=True)
    (run_dir / "DONE").write_text(json.dumps({"steps_done": 500}))
    assert src.verl_checkpoint() == paths.fmt(paths.CKPT_DIR, **fill) / "global_step_500"


def test_the_sampler_stops_on_any_of_several_stop_tokens():
    from creditlab.lm.sampler import SamplingParams, generate
    from creditlab.models.tiny import build_model
    from creditlab.plan import compose

    model = build_model(compose("micro", "micro-s")["model"]["arch"], 12, 0, 1, 2, seed=0).eval()
    prompts = [[1, 5, 6], [1, 7], [1, 3, 4, 8]]
    free = generate(model, prompts, SamplingParams(max_new_tokens=12, eos_id=99, seed=3))  # 99: never sampled
    first = free.response_ids[0][2]
    stops = [first, 2]
    stopped = generate(model, prompts, SamplingParams(max_new_tokens=12, eos_id=stops, seed=3))
    for full, cut, done in zip(free.response_ids, stopped.response_ids, stopped.finished):
        k = next((i for i, t in enumerate(full) if t in stops), None)
        assert cut == (full if k is None else full[: k + 1]) and done == (k is not None)
    assert stopped.response_ids[0][-1] == first
    single = generate(model, prompts, SamplingParams(max_new_tokens=12, eos_id=2, seed=3))
    one_list = SamplingParams(max_new_tokens=12, eos_id=[2], seed=3)
    assert one_list.eos_id == (2,)  # a list of stop tokens is kept as a tuple
    assert single.response_ids == generate(model, prompts, one_list).response_ids


# ------------------------------------------------------------------------------------------------ a smoke world
SMOKE_WORLD = pytest.mark.e2e  # the world: prepare + warmup at smoke, two gloo ranks of FSDP2 (~20 s quiet, 75 busy)


@pytest.fixture(scope="module")
def smoke_world(tmp_path_factory):
    """results/smoke with the hub fixtures prepared, the Qwen3-1.7B-Base stand-in written by `warmup`, and the
    `dapo` run as a verl job leaves it: final/ (the merger's bf16 cast), DONE, and an FSDP2 checkpoint of 2 ranks at
    global_step_2 (plus the full tensors it holds, the reference)."""
    from creditlab import cli
    from creditlab.data import prepare_paper

    results = tmp_path_factory.mktemp("paper_analyses") / "results"
    prepare_paper.run(_plan("smoke"), results)
    cli.main(["--results", str(results), "--scale", "smoke", "warmup", "--backbone", BACKBONE])
    fill = _fill(results, "smoke")
    base = Path(json.loads(paths.fmt(paths.BASE_DONE, **fill).read_text())["path"])
    step_dir = paths.fmt(paths.CKPT_DIR, **fill) / "global_step_2"
    reference = results / "fsdp_reference.pt"
    _write_fsdp2_checkpoint(base, step_dir, reference)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = paths.fmt(paths.RUN_DIR, **fill)
    final = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16)  # stale weights, on purpose: the
    final.save_pretrained(run_dir / "final")  # trained start must take the checkpoint's fp32 masters over them
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(run_dir / "final")
    (run_dir / "DONE").write_text(
        json.dumps({"run_key": f"smoke/{BACKBONE}/{RUN}/s0", "engine": "verl", "steps_done": 2, "steps_requested": 2})
    )
    return {"results": results, "base": base, "step_dir": step_dir, "reference": torch.load(reference)}


WRITER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

base, actor, reference = sys.argv[1:4]
dist.init_process_group("gloo")
rank, ws = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
mesh = init_device_mesh("cpu", (ws,))
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1)  # verl: actor.parameters()
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
for step in range(2):  # two training steps of two optimizer steps each (mini-batches), as a smoke run makes
    for mb in range(2):
        loss = model(input_ids=ids[mb : mb + 1], labels=ids[mb : mb + 1]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    sched.step()
os.makedirs(actor, exist_ok=True)
torch.save(model.state_dict(), f"{actor}/model_world_size_{ws}_rank_{rank}.pt")
torch.save(opt.state_dict(), f"{actor}/optim_world_size_{ws}_rank_{rank}.pt")
torch.save({"lr_scheduler": sched.state_dict(), "rng": {}}, f"{actor}/extra_state_world_size_{ws}_rank_{rank}.pt")
full = {n: p.full_tensor() for n, p in model.named_parameters()}
moments = {n: {k: (v.full_tensor() if k != "step" else v) for k, v in opt.state[p].items()}
           for n, p in model.named_parameters()}
if rank == 0:
    json.dump({"FSDP_version": 2, "world_size": ws}, open(f"{actor}/fsdp_config.json", "w"))
    torch.save({"weights": full, "moments": moments}, reference)
dist.destroy_process_group()
"""


def _write_fsdp2_checkpoint(base: Path, step_dir: Path, reference: Path, ranks: int = 2) -> None:
    script = step_dir.parent / "write_fsdp2_checkpoint.py"
    step_dir.mkdir(parents=True)
    script.write_text(WRITER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(ranks),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(base), str(step_dir / "actor"), str(reference)],
            env=env | {"RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(ranks)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


@SMOKE_WORLD
def test_prompts_are_rendered_as_verls_rollout_renders_them(smoke_world):
    """The analyses' and diagnose's prompts are the token ids verl's rollout feeds the model for the same rows of the
    verl parquet file (its agent loop: verl.utils.tokenizer.chat_template.apply_chat_template with the generation
    prompt and data.apply_chat_template_kwargs = eval.chat_template_kwargs), and the rollouts stop on the checkpoint's
    stop tokens (EOS and <|im_end|>, what vLLM stopped verl's rollout on)."""
    from verl.utils.tokenizer.chat_template import apply_chat_template
    from verl.utils.tokenizer.tokenizer import normalize_token_ids

    from creditlab.data.verl_format import read_verl_parquet
    from creditlab.models.sources import run_sources

    results = smoke_world["results"]
    run = _plan("smoke").get(BACKBONE, RUN, 0)
    src = run_sources(run, run_config(run), results)
    tok = src.load_tokenizer()
    records = src.load_records()
    rows = {
        r["extra_info"]["id"]: r
        for r in read_verl_parquet(paths.fmt(paths.VERL_TRAIN, dataset="dapo_math_17k", **_fill(results, "smoke")))
    }
    assert records and {r["id"] for r in records} == set(rows)
    for rec, ids in zip(records, src.encode(tok, records)):
        verl_ids = normalize_token_ids(
            apply_chat_template(
                tok, rows[rec["id"]]["prompt"], tokenize=True, add_generation_prompt=True, **src.chat_kwargs
            )
        )
        assert ids == verl_ids
        assert tok.decode(ids).startswith("<|im_start|>user\n") and tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert src.stop_ids(tok) == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]


@SMOKE_WORLD
def test_verls_fsdp2_checkpoint_puts_the_local_trainer_in_the_runs_final_state(smoke_world):
    from creditlab.engines.local.trainer import Trainer
    from creditlab.models.sources import load_verl_train_state, run_sources

    run = _plan("smoke").get(BACKBONE, RUN, 0)
    cfg = run_config(run)
    src = run_sources(run, cfg, smoke_world["results"])
    tok = src.load_tokenizer()
    records = src.load_records()
    trainer = Trainer(
        cfg | {"device": "cpu"},
        src.load_model("trained", dtype=torch.float32),
        tok,
        records,
        None,
        smoke_world["results"] / "unused",
        progress=False,
        prompt_ids=src.encode(tok, records),
        stop_ids=src.stop_ids(tok),
    )
    info = load_verl_train_state(trainer, smoke_world["step_dir"])
    ref = smoke_world["reference"]
    named = dict(trainer.model.named_parameters())
    assert set(named) == set(ref["weights"])
    for name, p in named.items():
        assert torch.equal(p.detach(), ref["weights"][name]), name  # fp32 masters, not final/'s bf16
        state = trainer.opt.state[p]
        assert torch.equal(state["exp_avg"], ref["moments"][name]["exp_avg"]), name
        assert torch.equal(state["exp_avg_sq"], ref["moments"][name]["exp_avg_sq"]), name
        assert float(state["step"]) == 4.0  # 2 steps x 2 mini-batches
    assert info["source"] == "verl" and info["step"] == 2 and info["world_size"] == 2 and trainer.step == 2
    assert trainer.sched.last_epoch == 2 and trainer.opt.param_groups[0]["lr"] == pytest.approx(cfg["trainer"]["lr"])
    assert not (smoke_world["results"] / "unused").exists()


@SMOKE_WORLD
def test_a_verl_checkpoint_of_another_model_is_refused(smoke_world, tmp_path):
    from creditlab.engines.local.trainer import Trainer
    from creditlab.models.sources import load_verl_train_state, read_verl_checkpoint

    ckpt = read_verl_checkpoint(smoke_world["step_dir"])
    assert ckpt["world_size"] == 2 and ckpt["param_groups"][0]["lr"] == 1e-3
    run = _plan("smoke").get(BACKBONE, RUN, 0)
    cfg = run_config(run)
    from creditlab.models.sources import run_sources

    src = run_sources(run, cfg, smoke_world["results"])
    tok = src.load_tokenizer()
    model = src.load_model("base", dtype=torch.float32)
    model.model.layers = model.model.layers[:1]  # a model with fewer parameters than verl's actor
    trainer = Trainer(
        cfg | {"device": "cpu"},
        model,
        tok,
        [{"answer": "1"}],
        None,
        tmp_path,
        progress=False,
        prompt_ids=[[1, 2]],
        stop_ids=[2],
    )
    with pytest.raises(ValueError, match="not this model's full-parameter actor"):
        load_verl_train_state(trainer, smoke_world["step_dir"])
    with pytest.raises(FileNotFoundError, match="no FSDP shards"):
        load_verl_train_state(trainer, tmp_path / "global_step_9")
    partial = tmp_path / "global_step_2" / "actor"  # a rank's optimizer file lost (or save_contents without it)
    partial.mkdir(parents=True)
    for f in (smoke_world["step_dir"] / "actor").iterdir():
        if f.name != "optim_world_size_2_rank_1.pt":
            (partial / f.name).symlink_to(f)
    with pytest.raises(FileNotFoundError, match="missing .*optim_world_size_2_rank_1.pt"):
        load_verl_train_state(trainer, partial.parent)


@SMOKE_WORLD
def test_paper_c_analysis_from_verls_final_state_at_smoke_scale(smoke_world):
    """`analyze --name flipping_trained` at smoke: the Trainer built on the run's final/, put in verl's checkpoint
    state, the analysis run, its provenance and Markdown saying where the start state came from."""
    from creditlab.jobs.analyze import run_analysis

    results = smoke_world["results"]
    result = run_analysis(results, _plan("smoke"), "cancellation", "flipping_trained")
    prov = result["provenance"]
    fill = _fill(results, "smoke")
    assert prov["weights"] == str(paths.fmt(paths.RUN_DIR, **fill) / "final")
    assert prov["tokenizer"] == str(smoke_world["base"]) and prov["prompts"] == "chat template"
    assert prov["records"].endswith("data/train/dapo_math_17k/train.parquet")
    state = prov["start_state"]
    assert state["source"] == "verl" and state["step"] == 2 and state["checkpoint"] == str(smoke_world["step_dir"])
    assert "AdamW moments" in state["optimizer"] and "stand-in" in prov["note"]
    assert result["n_rollouts"] == 2 * 2 * 4  # batches x prompts_per_step x group_size at smoke
    out = dict(results=results, scale="smoke", paper="cancellation", analysis="flipping_trained")
    md = paths.fmt(paths.ANALYSIS_MD, **out).read_text()
    assert "Start state: the run's step 2 from verl's FSDP checkpoint" in md and "AdamW moments" in md
    assert json.loads(paths.fmt(paths.ANALYSIS_JSON, **out).read_text())["provenance"]["start"] == "trained"
    assert paths.fmt(paths.ANALYSIS_PNG, **out).is_file()


@SMOKE_WORLD
def test_diagnose_at_smoke_scale_reads_the_snapshot_and_the_merged_model(smoke_world):
    from creditlab import cli

    results = smoke_world["results"]
    cli.main(
        [
            "--results",
            str(results),
            "--scale",
            "smoke",
            "--papers",
            "all",
            "--quiet",
            "diagnose",
            "--backbone",
            BACKBONE,
            "--run",
            RUN,
            "--seed",
            "0",
        ]
    )
    png = paths.fmt(paths.DIAG_PNG, **_fill(results, "smoke"))
    out = json.loads(png.with_suffix(".json").read_text())
    assert png.is_file() and out["prompts"] == "chat template"
    assert out["suites"] == _plan("smoke").eval_suites(_plan("smoke").get(BACKBONE, RUN, 0))  # the run's evaluation's
    assert out["base"] == str(smoke_world["base"]) and out["rl"].endswith(f"runs/{BACKBONE}/{RUN}/s0/final")
    for source in ("base", "rl"):
        assert out["stats"][source]["dlogp"]["n"] > 0
    base_run = next(r for r in _plan("smoke").runs.values() if not r.trains)
    with pytest.raises(SystemExit, match="compares a trained run with its base model"):
        cli.main(
            [
                "--results",
                str(results),
                "--scale",
                "smoke",
                "--papers",
                "all",
                "diagnose",
                "--backbone",
                base_run.backbone,
                "--run",
                base_run.run,
                "--seed",
                "0",
            ]
        )
