"""A verl LoRA run is evaluated with its trained adapter (issue 28, problems 4 and 5), checked on logits.

The run is built the way verl 0.9.1 builds it, on a CPU: the smoke qwen3 stand-in (:func:`write_standin`) wrapped in a
peft LoRA adapter with nonzero A and B, sharded with FSDP2 (one gloo rank, mesh dim ``fsdp``) and saved by verl's own
``FSDPCheckpointManager`` (shards, ``huggingface/``, ``lora_train_meta.json``), then merged by verl's model merger
with the launcher's command (:func:`launch.merge_command`). The merger writes the *base* weights (bf16) to final/ and
the adapter to final/lora_adapter/ (lora_alpha from lora_train_meta.json; 0 without it); before the fix the evaluator
looked for run_dir/adapter only and served final/, i.e. the base model.

The reference, "base + adapter": the base stand-in in float32 with the trained adapter as the merger stores it (bf16
values), peft's forward. The served model is what :func:`client.eval_engines` names (model dir + LoRA adapter),
loaded with transformers + peft in float32; its logits must equal the reference's and differ from the base's.
The last test runs an evaluation with ``.venv-vllm/bin/python`` as the *main* interpreter (the cluster environment's
situation: vLLM importable in the running environment, no separate vLLM environment): the worker is started with
``sys.executable`` and vLLM's teacher-forced log-probs of the served LoRA run equal the reference's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from creditlab.engines.verl import launch  # noqa: E402
from creditlab.engines.vllm import client  # noqa: E402

LORA = {"enable": True, "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
"""The run's trainer.lora (what verl_overrides passes to actor_rollout_ref.model.lora_rank / lora_alpha / ...)."""
TEXTS = ["What is 1+1?", "Compute 2+3.", "What is 7 times 6?", "Answer: \\boxed{42}"]
TOL = 1e-4
"""|logit or log p difference| allowed between two float32 computations of the same model."""
REPO = Path(__file__).resolve().parents[1]
ARTIFACT = REPO / "test-artifacts" / "lora_eval" / "diffs.json"
"""Measured differences (max |.| over positions and vocabulary), merged in by every test that measures some."""


def _record(**diffs: float) -> None:
    old = json.loads(ARTIFACT.read_text()) if ARTIFACT.is_file() else {}
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(old | diffs, indent=2) + "\n")


# ------------------------------------------------------------------------------------------ building the run
def _make_checkpoint(root: Path) -> None:
    """(subprocess: it initialises torch.distributed) stand-in base in root/base; the trained adapter (float32) in
    root/trained.pt; verl's FSDP checkpoint of the LoRA model in root/ckpt/global_step_2/actor."""
    import torch.distributed as dist
    from peft import get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from creditlab.models.standin import write_standin

    base = write_standin("qwen3", TEXTS, root / "base")
    dist.init_process_group("gloo", init_method=f"file://{root / 'pg'}", rank=0, world_size=1)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.config.name_or_path = str(base)  # as verl loads it: the checkpoint's huggingface/ gets generation_config
    model = get_peft_model(model, _lora_config())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    torch.save({n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}, root / "trained.pt")
    fully_shard(model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",)))
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    FSDPCheckpointManager(
        model=model,
        optimizer=optim,
        lr_scheduler=None,
        processing_class=AutoTokenizer.from_pretrained(base),
        checkpoint_config={"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model"]},
    ).save_checkpoint(str(root / "ckpt" / "global_step_2" / "actor"), global_step=2)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory) -> dict:
    """The base snapshot, verl's checkpoint and the merger's output (run/final), as the train job leaves them before
    ``finish_merged``; built once (tests copy ``run/`` before changing it)."""
    root = tmp_path_factory.mktemp("verl_lora")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    subprocess.run([sys.executable, __file__, str(root)], check=True, env=env, timeout=600)
    actor = root / "ckpt" / "global_step_2" / "actor"
    run_dir = root / "run"
    merge = launch.merge_command(root / "ckpt", 2, run_dir / "final")
    proc = subprocess.run(merge, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "base": root / "base", "actor": actor, "run": run_dir, "trained": root / "trained.pt"}


def _run_copy(verl_run: dict, tmp_path: Path, alpha: float | None = None) -> Path:
    """A fresh copy of the merged run dir; ``alpha``: the merger's adapter_config lora_alpha replaced (0: what the
    merger writes for a checkpoint without lora_train_meta.json, base_model_merger.py:345 and 367-372)."""
    run = tmp_path / "run"
    shutil.copytree(verl_run["run"], run)
    if alpha is not None:
        path = run / "final" / "lora_adapter" / "adapter_config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"lora_alpha": alpha}, indent=4))
    return run


# ------------------------------------------------------------------------------------------ the models compared
def _prompts(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [list(tok(t)["input_ids"]) for t in TEXTS]


def _logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([p])).logits[0].float() for p in prompts]


def _load(model_dir: Path, adapter: Path | str | None = None):
    """A saved model (+ a peft adapter directory) in float32, as a loader of the served run would build it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model if adapter is None else PeftModel.from_pretrained(model, str(adapter)).eval()


def _lora_config():
    """verl's own LoraConfig of the run (workers/engine/fsdp/transformer_impl.py _build_lora_module)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=LORA["rank"],
        lora_alpha=LORA["alpha"],
        target_modules=LORA["target_modules"],
        bias="none",
    )


def _reference(verl_run: dict):
    """Base + adapter: the float32 base with the trained adapter's values as verl's merger stores them (bf16)."""
    from peft import get_peft_model

    model = get_peft_model(_load(verl_run["base"]), _lora_config())
    trained = torch.load(verl_run["trained"])
    state = {n: t.to(torch.bfloat16).float() for n, t in trained.items()}
    missing = set(state) - set(dict(model.named_parameters()))
    assert not missing, sorted(missing)[:3]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in state:
                p.copy_(state[name])
    return model.eval()


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


# ------------------------------------------------------------------------------------------ the tests
def test_verl_writes_lora_meta_and_the_merger_puts_the_adapter_in_final(verl_run) -> None:
    """What verl 0.9.1 leaves: FSDPCheckpointManager writes lora_train_meta.json beside the shards (its real r and
    alpha; fsdp_checkpoint_manager.py:122-129, 417), the merger writes final/ = the base weights in bf16 and
    final/lora_adapter with that alpha; nothing at run_dir/adapter."""
    from safetensors.torch import load_file

    meta = json.loads((verl_run["actor"] / "lora_train_meta.json").read_text())
    assert meta == {"r": LORA["rank"], "lora_alpha": LORA["alpha"], "task_type": "CAUSAL_LM"}
    final = verl_run["run"] / "final"
    conf = json.loads((final / "lora_adapter" / "adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"], sorted(conf["target_modules"])) == (4, 8, sorted(LORA["target_modules"]))
    merged, base = load_file(final / "model.safetensors"), load_file(verl_run["base"] / "model.safetensors")
    assert set(merged) == set(base)
    assert all(torch.equal(merged[k], base[k].to(torch.bfloat16)) for k in base)  # the base model, cast to bf16
    assert not (verl_run["run"] / "adapter").exists()


@pytest.mark.parametrize("merger_alpha", [None, 0], ids=["with_lora_meta", "without_lora_meta"])
def test_lora_run_is_served_with_its_adapter(verl_run, tmp_path, merger_alpha) -> None:
    """After finish_merged (what train_verl runs after the merger), the evaluator's engines serve base + the run's
    adapter with the run's alpha: float32 logits equal base + adapter (peft) and differ from the base's by what the
    adapter adds; final/ itself now holds the merged weights (bf16). Before the fix the evaluator served final/ with no
    adapter, the base model (and an alpha-0 adapter would be a no-op)."""
    run = _run_copy(verl_run, tmp_path, merger_alpha)
    launch.finish_merged(run / "final", {"trainer": {"lora": LORA}})
    engines, decoder = client.eval_engines(
        {"backend": "vllm", "vllm": {"dtype": "float32"}}, base_dir=verl_run["base"], run_dir=run, lora=LORA
    )
    served = _load(Path(engines["model"]["model"]), decoder["lora"])
    assert json.loads((Path(decoder["lora"]) / "adapter_config.json").read_text())["lora_alpha"] == LORA["alpha"]
    assert engines["model"]["enable_lora"] and engines["model"]["max_lora_rank"] >= LORA["rank"]
    prompts = _prompts(verl_run["base"])
    ref, base = _logits(_reference(verl_run), prompts), _logits(_load(verl_run["base"]), prompts)
    got = _logits(served, prompts)
    adapter_effect = _max_diff(ref, base)
    assert adapter_effect > 0.5  # the adapter changes the model
    assert _max_diff(got, ref) < TOL  # served - base == (base + adapter) - base
    final = _logits(_load(run / "final"), prompts)  # final/: base + adapter merged, stored in bf16
    tag = "with_lora_meta" if merger_alpha is None else "without_lora_meta"
    _record(
        **{
            f"{tag}/logits_served_vs_base_plus_adapter": _max_diff(got, ref),
            f"{tag}/logits_base_plus_adapter_vs_base": adapter_effect,
            f"{tag}/logits_merged_final_bf16_vs_base_plus_adapter": _max_diff(final, ref),
        }
    )
    assert _max_diff(final, ref) < 0.05 * adapter_effect


def test_lora_run_without_a_usable_adapter_is_refused(verl_run, tmp_path) -> None:
    """A LoRA run is never evaluated as its base model: finish_merged raises when the merger wrote no adapter (and
    does not merge twice); the evaluator raises for a LoRA run without an adapter, for an adapter with lora_alpha 0
    (no-op), and for one whose r / alpha are not the run's; a run without LoRA is served from final/."""
    run = _run_copy(verl_run, tmp_path)
    shutil.rmtree(run / "final" / "lora_adapter")
    with pytest.raises(launch.LaunchError, match="wrote no adapter"):
        launch.finish_merged(run / "final", {"trainer": {"lora": LORA}})
    e = {"backend": "vllm", "vllm": {"dtype": "float32"}}
    with pytest.raises(FileNotFoundError, match="refusing to evaluate it as its base model"):
        client.eval_engines(e, base_dir=verl_run["base"], run_dir=run, lora=LORA)
    run0 = _run_copy(verl_run, tmp_path / "zero", alpha=0)
    with pytest.raises(ValueError, match="no-op"):
        client.eval_engines(e, base_dir=verl_run["base"], run_dir=run0, lora=LORA)
    run2 = _run_copy(verl_run, tmp_path / "two")
    launch.finish_merged(run2 / "final", {"trainer": {"lora": LORA}})
    with pytest.raises(launch.LaunchError, match="wrote no adapter"):  # a second call: nothing merged twice
        launch.finish_merged(run2 / "final", {"trainer": {"lora": LORA}})
    with pytest.raises(ValueError, match="rank / alpha"):
        client.eval_engines(e, base_dir=verl_run["base"], run_dir=run2, lora=LORA | {"alpha": 16})
    with pytest.raises(launch.LaunchError, match="lora_alpha=8 but"):
        launch.finish_merged(
            _run_copy(verl_run, tmp_path / "three") / "final", {"trainer": {"lora": LORA | {"alpha": 4}}}
        )
    engines, dec = client.eval_engines(e, base_dir=verl_run["base"], run_dir=run2, lora=LORA | {"enable": False})
    assert engines["model"]["model"] == str(run2 / "final") and dec["lora"] is None


def test_adapter_merge_into_a_sharded_checkpoint(verl_run, tmp_path) -> None:
    """final/ in several safetensors shards (what the merger writes for a large backbone, with an index): every
    adapted weight is merged, in whichever shard it is, exactly as into the one-file final/."""
    from safetensors.torch import load_file

    one, sharded = _run_copy(verl_run, tmp_path / "one"), _run_copy(verl_run, tmp_path / "sharded")
    model = _load(sharded / "final").to(torch.bfloat16)
    (sharded / "final" / "model.safetensors").unlink()
    model.save_pretrained(sharded / "final", max_shard_size="150KB")
    index = json.loads((sharded / "final" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 2
    for run in (one, sharded):
        launch.finish_merged(run / "final", {"trainer": {"lora": LORA}})
    want = load_file(one / "final" / "model.safetensors")
    got = {k: v for f in set(index.values()) for k, v in load_file(sharded / "final" / f).items()}
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    base = load_file(verl_run["base"] / "model.safetensors")
    changed = {k for k in want if not torch.equal(want[k], base[k].to(torch.bfloat16))}
    layers = json.loads((verl_run["base"] / "config.json").read_text())["num_hidden_layers"]
    adapted = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")  # LORA's target_modules
    assert changed == {f"model.layers.{i}.{m}.weight" for i in range(layers) for m in adapted}


# ------------------------------------------------------------------------------------------ inside the vLLM env
INSIDE = r"""
import json, os, sys
from pathlib import Path

from creditlab.engines.vllm import client

if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    client.REPO_ROOT = Path(args["hidden"])  # no .venv-vllm to find, as in the cluster environment
    assert client.PYTHON_ENV not in os.environ
    python = client.vllm_python()
    from transformers import AutoTokenizer

    from creditlab.eval.evaluate import evaluate_model
    from creditlab.lm.sampler import SamplingParams
    from creditlab.rewards import RewardScorer

    tok = AutoTokenizer.from_pretrained(args["base"])
    suites = {"s": [{"id": f"q{i}", "question": t, "answer": "2"} for i, t in enumerate(args["texts"])]}
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, eos_id=tok.eos_token_id, seed=0)
    e = {"backend": "vllm", "vllm": {"dtype": "float32"}}
    with open(args["log"], "w") as log, RewardScorer("dapo_answer", timeout_s=10.0) as scorer:
        with client.eval_generate_fn(e, base_dir=Path(args["base"]), run_dir=Path(args["run"]), lora=args["lora"],
                                     stderr=log) as fn:
            res = evaluate_model(None, tok, suites, params, k=2, ks=[1, 2], template="tiny", scorer=scorer,
                                 out_dir=Path(args["out"]), generate_fn=fn, progress=False, chat=True)
            lp = fn.worker.call("prompt_logprobs", engine=fn.engine, lora=fn.lora, prompt_ids=args["prompts"])
            plain = fn.worker.call("prompt_logprobs", engine=fn.engine, prompt_ids=args["prompts"])
            info = fn.worker.call("info")
    print(json.dumps({"python": str(python), "sys_executable": sys.executable, "worker_python": info["python"],
                      "versions": info["versions"], "decoder": res["settings"]["decoder"],
                      "lora": lp["logprobs"], "plain": plain["logprobs"]}))
"""


def _teacher_forced(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """log p(ids[t] | ids[:t]), t = 1 .. len-1, float32."""
    out = []
    for ids, logits in zip(prompts, _logits(model, prompts)):
        lp = logits.log_softmax(-1)
        out.append(lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1))
    return out


def test_evaluation_inside_the_vllm_environment_serves_the_lora_run(verl_run, tmp_path) -> None:
    """Run the evaluation with the vLLM environment's python as the main interpreter, CREDITLAB_VLLM_PYTHON unset and
    no .venv-vllm to find: vllm_python() is sys.executable, the worker runs on it, the evaluation of the LoRA run
    completes, and vLLM's teacher-forced log-probs of the served run equal base + adapter's (not the base's)."""
    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} does not exist: `make vllm-env` builds it (CI: `make install`)")
    run = _run_copy(verl_run, tmp_path)
    launch.finish_merged(run / "final", {"trainer": {"lora": LORA}})
    prompts = _prompts(verl_run["base"])
    args = {
        "hidden": str(tmp_path / "no-venv-vllm"),
        "base": str(verl_run["base"]),
        "run": str(run),
        "lora": LORA,
        "texts": TEXTS,
        "prompts": prompts,
        "out": str(tmp_path / "eval"),
        "log": str(tmp_path / "worker.log"),
    }
    env = {k: v for k, v in os.environ.items() if k != client.PYTHON_ENV}
    env["PYTHONPATH"] = str(client.SRC_DIR)  # the code under test
    proc = subprocess.run(
        [str(python), "-c", INSIDE, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    log = (tmp_path / "worker.log").read_text()[-3000:] if (tmp_path / "worker.log").exists() else ""
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\nworker log:\n{log}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["python"] == res["sys_executable"] == res["worker_python"] == str(python)
    assert res["decoder"]["name"] == "vllm" and res["decoder"]["lora"] == str(run / "adapter")
    ref, base = _teacher_forced(_reference(verl_run), prompts), _teacher_forced(_load(verl_run["base"]), prompts)
    got = [torch.tensor(x) for x in res["lora"]]
    plain = [torch.tensor(x) for x in res["plain"]]
    _record(
        vllm_lora_logprobs_vs_base_plus_adapter=_max_diff(got, ref),
        vllm_plain_logprobs_vs_base=_max_diff(plain, base),
        logprobs_base_plus_adapter_vs_base=_max_diff(ref, base),
    )
    assert _max_diff(got, ref) < TOL
    assert _max_diff(plain, base) < TOL
    assert _max_diff(ref, base) > 100 * TOL  # the adapter matters
    rows = [json.loads(x) for x in (tmp_path / "eval" / "s.jsonl").read_text().splitlines()]
    assert len(rows) == len(TEXTS) * 3


if __name__ == "__main__":  # the fixture's subprocess: verl's checkpoint of a LoRA model
    _make_checkpoint(Path(sys.argv[1]))
