"""Check 2: the local engine in bf16 on the device: a warmed-up stand-in, its sampler against float32, RL steps.

The stand-in is the micro scale's base model (configs/model/micro-s.yaml, Qwen3; micro-olmo.yaml, OLMo), built
from its config as the pipeline builds it, on the tiny world's character tokenizer, and warmed up by the engine's
own SFT (``engines/local/sft.warmup``) in bf16 so that its greedy decodes are answers rather than noise. Then:

* ``sft/<backbone>``: the warm-up's losses are finite and fall;
* ``sampler/<backbone>``: ``lm.sampler.generate`` greedy in float32 against ``transformers``' own ``generate``
  (token agreement; the sampler's KV cache, mask and attention on this ``transformers``), and under bf16 autocast
  (the engine's rollouts) against float32: free-running token agreement (at least :data:`MIN_FREE_AGREEMENT`), and
  teacher-forced on the float32 decodes, the bf16 logits' error (at most :data:`LOGIT_RTOL` of the largest logit)
  and the share of positions whose bf16 argmax is the float32 one (at least :data:`MIN_TF_AGREEMENT`; a flip needs a
  float32 top-2 margin under twice the logit error, reported); sampling twice with one seed gives the same tokens;
  the greedy answers' accuracy is reported;
* ``rl_steps/<backbone>/<method>``: ``engines/local/trainer.Trainer`` (as tests/conftest.py ``make_trainer``
  builds it) runs a few RL steps of each configs/method/*.yaml (micro-olmo: dapo) from the warmed-up model: every
  loss, gradient norm and parameter stays finite. Scores alternate 0/1 within each group (tests/conftest.py's
  scorer), so every group is informative and every update path runs whatever the stand-in answers.

On CUDA the trainer and the SFT autocast their forwards to bf16 themselves (``engines/local/trainer._autocast``); on
the CPU (the dry run) :func:`bf16_context` makes that same function autocast to bf16 on the CPU.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from gpu_check import configs

LOGIT_RTOL = 0.1
"""Largest teacher-forced bf16 logit error, as a fraction of the largest float32 logit. bf16 autocast was seen at
1-3% here (bf16 hidden states through two layers); a broken bf16 path (mask, cache, rotary) is off by O(1). An
argmax can only flip where the float32 top-2 margin is under twice the logit error (the margins are reported)."""
MIN_TF_AGREEMENT = 0.95
"""Teacher-forced: the share of response positions whose bf16 argmax is the float32 one."""
MIN_FREE_AGREEMENT = 0.75
"""Free-running: the share of token positions where the bf16 greedy decode equals the float32 one ("most tokens";
after a near tie breaks the other way a response goes its own way, so this is looser than teacher-forced)."""
MIN_HF_AGREEMENT = 0.99
"""Float32 greedy tokens of the sampler against ``transformers.generate`` (the same arithmetic up to the
attention kernel's summation order)."""

SIZES = {
    "small": {"n_prompts": 16, "sft_steps": 40, "rl_steps": 2, "overrides": {}},
    "full": {
        "n_prompts": 64,
        "sft_steps": 200,
        "rl_steps": 3,
        "overrides": {"trainer.prompts_per_step": 16, "trainer.group_size": 8, "trainer.mini_batches": 4},
    },
}
BACKBONES = ("micro-s", "micro-olmo")
OLMO_METHODS = ("dapo",)


class AlternatingScorer:
    """Scores half of the rollouts right, deterministically, so every group is informative (tests/conftest.py)."""

    def score(self, texts, golds):
        return [float(i % 2) for i in range(len(texts))]


@contextmanager
def bf16_context(device: torch.device):
    """The engine's own bf16 regions on this device. On CUDA the engine autocasts its forwards itself
    (``engines.local.trainer._autocast``, also imported by the SFT); on the CPU, where that is a no-op, the same
    function is made to return CPU autocast for the block, so that exactly the same regions run in bf16 (the
    forwards; loss, backward and optimizer step stay float32 as on CUDA: an AdamW step inside CPU autocast was seen
    to stall the SFT warm-up, loss 3.0 after 200 steps against 0.08 with only the forwards in bf16)."""
    if device.type != "cpu":
        yield
        return
    from creditlab.engines.local import sft, trainer

    saved = trainer._autocast, sft._autocast

    def cpu_autocast(dev: torch.device):
        return torch.autocast("cpu", dtype=torch.bfloat16) if dev.type == "cpu" else saved[0](dev)

    trainer._autocast = sft._autocast = cpu_autocast
    try:
        yield
    finally:
        trainer._autocast, sft._autocast = saved


def _finite(xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def build_standin(backbone: str, device: torch.device, n_records: int = 160):
    """(config, tokenizer, records, randomly initialised model) of a micro backbone, as tests/conftest.py builds
    them."""
    from creditlab.data.synthetic import generate_split
    from creditlab.data.tokenizer import build_tokenizer
    from creditlab.models.tiny import build_model

    cfg = configs.compose("micro", backbone, "dapo", {"device": device.type})
    records = generate_split(0, n_records, [1, 1], [1, 1])
    tok = build_tokenizer([r["question"] + r["solution"] for r in records] + ["Q: A:\n \\boxed{}0123456789+-*"])
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    return cfg, tok, records, model


def check_sft(backbone: str, cfg, tok, records, model, device: torch.device, steps: int) -> dict[str, Any]:
    from creditlab.engines.local.sft import warmup

    t0 = time.perf_counter()
    cfg = configs.merge(cfg, {"warmup": {"steps": steps, "lr_warmup_steps": min(5, steps)}})
    with bf16_context(device):
        hist = warmup(model, tok, records, cfg, seed=0, progress=False)
    losses = [h["sft_loss"] for h in hist]
    k = max(1, len(losses) // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    ok = _finite(losses + [h["grad_norm"] for h in hist]) and last < first
    return {
        "check": "engine",
        "name": f"sft/{backbone}",
        "ok": ok,
        "metrics": {"steps": len(hist), "loss_first": first, "loss_last": last, "finite": _finite(losses)},
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of a response (the tiny world's answer format), or None."""
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Token agreement of two decodes of the same prompts: positions equal / positions (the longer response of
    each pair), whole responses equal, and the mean share of each response before the first difference."""
    same = total = exact = 0
    prefix = 0.0
    for x, y in zip(a, b):
        n = max(len(x), len(y), 1)
        total += n
        same += sum(1 for i in range(min(len(x), len(y))) if x[i] == y[i])
        exact += x == y
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        prefix += k / n
    return {"token_agreement": same / total, "exact_frac": exact / len(a), "prefix_frac": prefix / len(a)}


@torch.no_grad()
def _teacher_forced(model, prompts, responses, pad_id: int, device: torch.device) -> dict[str, Any]:
    """The float32 decodes fed back: argmax of the float32 and the bf16 forward at every response position."""
    from creditlab.lm.batch import pack

    batch = pack(prompts, [r[:-1] if len(r) > 1 else r for r in responses], pad_id)
    ids, att = batch.input_ids.to(device), batch.attention_mask.to(device)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    T = batch.response_len
    valid = batch.response_mask.to(device) > 0

    def logits() -> torch.Tensor:
        out = model(input_ids=ids, attention_mask=att, position_ids=pos).logits
        return out[:, -T - 1 : -1].float()

    l32 = logits()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    with autocast:
        l16 = logits()
    top2 = l32.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1])[valid]
    a32, a16 = l32.argmax(-1)[valid], l16.argmax(-1)[valid]
    differ = a32 != a16
    err = (l16 - l32).abs().amax(-1)[valid]
    return {
        "positions": int(valid.sum()),
        "argmax_agreement": float((~differ).float().mean()) if valid.any() else 1.0,
        "disagreements": int(differ.sum()),
        "max_margin_at_disagreement": float(margin[differ].max()) if differ.any() else 0.0,
        "median_margin": float(margin.median()) if valid.any() else 0.0,
        "logit_err_max": float(err.max()) if valid.any() else 0.0,
        "logit_err_mean": float(err.mean()) if valid.any() else 0.0,
        "logit_max": float(l32.abs().amax(-1)[valid].max()) if valid.any() else 0.0,
    }


@torch.no_grad()
def _hf_greedy(model, prompts, max_new: int, eos: int, pad: int, device: torch.device) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = model.generate(
            torch.tensor([p], device=device),
            attention_mask=torch.ones(1, len(p), dtype=torch.long, device=device),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )[0, len(p) :].tolist()
        if eos in ids:
            ids = ids[: ids.index(eos) + 1]
        out.append(ids)
    return out


def check_sampler(backbone: str, tok, records, model, device: torch.device, n_prompts: int) -> dict[str, Any]:
    from creditlab.data.schema import render_record_prompt
    from creditlab.lm.sampler import SamplingParams, generate

    t0 = time.perf_counter()
    model.eval()
    prompts = [tok(render_record_prompt(r, "tiny"))["input_ids"] for r in records[:n_prompts]]
    max_new = 32
    greedy = SamplingParams(greedy=True, max_new_tokens=max_new, eos_id=tok.eos_token_id)
    with torch.no_grad():
        g32 = generate(model, prompts, greedy).response_ids
        hf = _hf_greedy(model, prompts, max_new, tok.eos_token_id, tok.pad_token_id, device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            g16 = generate(model, prompts, greedy).response_ids
            sample = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=max_new, eos_id=tok.eos_token_id, seed=7)
            s1 = generate(model, prompts, sample).response_ids
            s2 = generate(model, prompts, sample).response_ids
            s3 = generate(model, prompts, sample, batch_size=max(1, n_prompts // 3)).response_ids
    tf = _teacher_forced(model, prompts, g32, tok.pad_token_id, device)
    vs_hf = _agreement(g32, hf)
    vs_32 = _agreement(g16, g32)
    golds = [r["answer"] for r in records[:n_prompts]]
    metrics = {
        "prompts": len(prompts),
        "fp32_vs_transformers": vs_hf,
        "bf16_vs_fp32_free_running": vs_32,
        "bf16_vs_fp32_teacher_forced": tf,
        "sampling_same_seed_equal": s1 == s2,
        "sampling_batch_size_agreement": _agreement(s3, s1)["token_agreement"],
        "fp32_response_len_mean": sum(map(len, g32)) / len(g32),
        "fp32_boxed_frac": sum(_boxed(tok.decode(r)) is not None for r in g32) / len(g32),
        "fp32_correct_frac": sum(_boxed(tok.decode(r)) == g for r, g in zip(g32, golds)) / len(g32),
        "bf16_correct_frac": sum(_boxed(tok.decode(r)) == g for r, g in zip(g16, golds)) / len(g16),
        "vocab_ok": all(0 <= t < len(tok) for r in g16 + s1 for t in r),
    }
    ok = (
        vs_hf["token_agreement"] >= MIN_HF_AGREEMENT
        and tf["argmax_agreement"] >= MIN_TF_AGREEMENT
        and vs_32["token_agreement"] >= MIN_FREE_AGREEMENT
        and tf["logit_err_max"] <= LOGIT_RTOL * tf["logit_max"]
        and metrics["sampling_same_seed_equal"]
        and metrics["vocab_ok"]
        and all(len(r) <= max_new for r in g16 + s1)
    )
    model.train()
    return {
        "check": "engine",
        "name": f"sampler/{backbone}",
        "ok": ok,
        "metrics": metrics,
        "tolerance": {
            "min_fp32_vs_transformers": MIN_HF_AGREEMENT,
            "min_teacher_forced_agreement": MIN_TF_AGREEMENT,
            "min_free_running_agreement": MIN_FREE_AGREEMENT,
            "max_logit_err_of_max_logit": LOGIT_RTOL,
        },
        "seconds": round(time.perf_counter() - t0, 3),
    }


def method_overrides(method: str) -> dict[str, Any]:
    """A group-coupled loss (its signature takes ``group_ids``) needs whole groups: ``trainer.batching=sequential``,
    as configs/papers/dfpo.yaml runs it."""
    from creditlab.algos import registry

    loss = configs.compose("micro", "micro-s", method)["method"]["policy_loss"]
    takes_groups = "group_ids" in inspect.signature(registry.get("policy_loss", loss)).parameters
    return {"trainer.batching": "sequential"} if takes_groups else {}


def check_rl_steps(
    backbone: str, method: str, tok, records, base_state: dict, device: torch.device, size: dict[str, Any]
) -> dict[str, Any]:
    from creditlab.engines.local.trainer import Trainer
    from creditlab.models.tiny import build_model

    t0 = time.perf_counter()
    name = f"rl_steps/{backbone}/{method}"
    try:
        over = {
            "trainer.steps": size["rl_steps"],
            "trainer.overlong.enable": False,
            "device": device.type,
            **size["overrides"],
            **method_overrides(method),
        }
        cfg = configs.compose("micro", backbone, method, over)
        model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        model.load_state_dict(base_state)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(cfg, model, tok, records, AlternatingScorer(), Path(tmp), progress=False)
            steps = []
            with bf16_context(device):
                for step in range(size["rl_steps"]):
                    steps.append(trainer.train_step(step))
        params_finite = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
        keys = ("loss", "grad_norm", "entropy_mean", "credit_weight_mean", "loss_token_frac")
        finite = _finite([s[k] for s in steps for k in keys if k in s])
        metrics = {
            "steps": len(steps),
            "loss": [s.get("loss") for s in steps],
            "grad_norm": [s.get("grad_norm") for s in steps],
            "entropy_mean": [s.get("entropy_mean") for s in steps],
            "response_len_mean": [s.get("response_len_mean") for s in steps],
            "t_step": [round(s.get("t_step", 0.0), 3) for s in steps],
            "lora": bool(cfg["trainer"]["lora"]["enable"]),
            "batching": cfg["trainer"]["batching"],
            "rollouts_per_step": cfg["trainer"]["prompts_per_step"] * cfg["trainer"]["group_size"],
            "params_finite": params_finite,
            "metrics_finite": finite,
        }
        ok = params_finite and finite and len(steps) == size["rl_steps"]
        return {"check": "engine", "name": name, "ok": ok, "metrics": metrics, "seconds": _since(t0)}
    except Exception as e:  # noqa: BLE001 - every failure is a finding
        return _failed(name, e, t0)


def _failed(name: str, e: Exception, t0: float) -> dict[str, Any]:
    err, tb = f"{type(e).__name__}: {e}", traceback.format_exc()
    return {"check": "engine", "name": name, "ok": False, "error": err, "tb": tb, "seconds": _since(t0)}


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 3)


def run(device: str, size: str = "full", methods: list[str] | None = None) -> dict[str, Any]:
    """Check 2 on ``device``: the records (sft, sampler, rl_steps per backbone)."""
    dev = torch.device(device)
    sz = SIZES[size]
    methods = methods or configs.method_names()
    records: list[dict[str, Any]] = []
    for backbone in BACKBONES:
        t0 = time.perf_counter()
        try:
            cfg, tok, data, model = build_standin(backbone, dev)
            model.to(dev)
            records.append(check_sft(backbone, cfg, tok, data, model, dev, sz["sft_steps"]))
            base_state = copy.deepcopy(model.state_dict())
        except Exception as e:  # noqa: BLE001
            records.append(_failed(f"standin/{backbone}", e, t0))
            continue
        t0 = time.perf_counter()
        try:
            records.append(check_sampler(backbone, tok, data, model, dev, sz["n_prompts"]))
        except Exception as e:  # noqa: BLE001 - the RL steps still run (and say whether they need what failed)
            records.append(_failed(f"sampler/{backbone}", e, t0))
        for method in methods if backbone == "micro-s" else [m for m in OLMO_METHODS if m in methods]:
            records.append(check_rl_steps(backbone, method, tok, data, base_state, dev, sz))
    return {"records": records, "backbones": list(BACKBONES), "methods": methods, "size": sz}
