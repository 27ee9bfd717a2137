"""Check 1: every registered method and every method config's credit pass, bf16 on the device against CPU float64.

One random rollout batch is drawn once (CPU, float64, seeded): G rollouts per prompt, right-padded responses of
varied lengths sampled from a random LM head, their old log-probs, entropies, top-K log-probs, hidden states, a
LoRA-like base pass (``base_hidden``, ``ref_logp``), rewards with overlong shaping, GRPO advantages, and current
log-probs whose per-rollout drift from the old ones ranges from none (ratio exactly 1, the first mini-batch) to
0.3 (clips and dual clips active). Every floating tensor is rounded to bf16 first, so the device (bf16) and the
reference (the same values in float64 on the CPU) see identical inputs and only the arithmetic differs. The device
runs each case under two input profiles (:data:`PROFILES`): ``bf16``, every floating input in bf16, and ``engine``,
the dtypes the engines feed the methods (hidden states bf16, log-probs float32); tolerances in ``gpu_check.compare``.

What runs, from the registries (``creditlab.algos.registry``), so a newly registered method is checked without an
edit here (a method whose required arguments cannot be built fails with a message saying so):

* ``advantage``: ``fn(rewards, group_ids, **kwargs)``;
* ``policy_loss``: the loss and its gradient d loss / d logp over the valid tokens, called as the local trainer
  calls it (``group_ids`` / ``responses`` where the signature names them), for every aggregation mode and every
  ``loss_kwargs`` a method config gives it;
* ``credit`` and ``token_filter``: through ``credit.base.apply_credit`` (the engines' call), with every kwargs a
  method config gives it plus the variants in :data:`EXTRA_CASES`;
* ``batching``: ``call_batching`` with device tensors must give exactly the CPU partition;
* ``method_config``: each configs/method/*.yaml's whole credit pass as ``Trainer.learn`` runs it (credit functions
  composed, token filters on the loss mask, A_i times the weights, the configured loss and its gradient).
"""

from __future__ import annotations

import inspect
import json
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from creditlab.algos.losses import AGG_MODES
from gpu_check import configs
from gpu_check.compare import Tolerance, exact, scalar_errors, tensor_errors

KINDS = ("advantage", "policy_loss", "credit", "token_filter", "batching")
"""The registries checked (``creditlab.algos.registry``); tests/test_gpu_check.py checks that none is missing."""

EXTRA_CASES: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("credit", "delta"): [
        {"variant": v} for v in ("within_side", "fixed_gamma", "hard", "no_norm", "no_range", "no_refine", "random")
    ]
    + [{"variant": "topk_proxy", "topk": "K"}],
    ("credit", "ppl"): [{"variant": "ppl"}, {"variant": "ppl-norm"}],
    ("credit", "arca"): [{"scale": "sum1"}],
    ("credit", "arca_surprisal"): [{"scale": "sum1"}],
    ("token_filter", "delta_select"): [{"mode": "bottom"}, {"mode": "random"}],
    ("policy_loss", "dfpo"): [
        {"transform": "min_replace"},
        {"transform": "none"},
        {"weight": "token_mean", "eps_low": 0.2, "eps_high": 0.2},
        {"norm_in_weight": False},
    ],
    ("policy_loss", "fipo"): [{"max_dual_clip_tokens": None}],
}
"""Variants beyond each function's defaults and the method configs' settings (``"K"``: the batch's top-K width)."""


@dataclass(frozen=True)
class Sizes:
    groups: int
    group_size: int
    T: int
    d: int
    V: int
    K: int

    @property
    def B(self) -> int:
        return self.groups * self.group_size


SIZES = {
    "small": Sizes(groups=4, group_size=4, T=24, d=32, V=64, K=8),
    "full": Sizes(groups=16, group_size=8, T=256, d=256, V=1024, K=16),
}


def _bf16_values(x: Tensor) -> Tensor:
    """x rounded to bf16, kept in float64 (the common inputs of the device and the reference)."""
    return x.to(torch.bfloat16).to(torch.float64)


def make_batch(s: Sizes, seed: int = 0) -> dict[str, Tensor]:
    """One random rollout batch (module docstring): CPU tensors, floats in float64 holding bf16 values."""
    from creditlab.algos.advantages import grpo_advantages

    g = torch.Generator().manual_seed(seed)
    B, T = s.B, s.T
    lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
    lengths[:: max(1, B // 4)] = T  # some rollouts hit the budget
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    group_ids = (torch.randperm(10 * s.groups, generator=g)[: s.groups] * 7 + 3).repeat_interleave(s.group_size)
    hidden = _bf16_values(torch.randn(B, T, s.d, generator=g, dtype=torch.float64))
    lm_head = _bf16_values(3.0 * torch.randn(s.V, s.d, generator=g, dtype=torch.float64) / math.sqrt(s.d))
    logprobs = torch.log_softmax(hidden @ lm_head.T, -1)  # [B, T, V]
    responses = torch.multinomial(logprobs.exp().view(-1, s.V), 1, generator=g).view(B, T)
    old_logp = logprobs.gather(-1, responses[..., None]).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    top = logprobs.topk(s.K, dim=-1)
    drift = torch.tensor([0.0, 1e-3, 0.05, 0.3], dtype=torch.float64)[torch.arange(B) % 4]
    logp = old_logp + drift[:, None] * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref_logp = old_logp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    base_hidden = hidden + 0.05 * torch.randn(B, T, s.d, generator=g, dtype=torch.float64)
    scores = (torch.rand(B, generator=g) < 0.5).to(torch.float64)
    buffer = max(1, T // 8)
    rewards = scores - ((lengths - (T - buffer)).clamp(min=0) / buffer).to(torch.float64)
    rewards = _bf16_values(rewards)
    adv = _bf16_values(grpo_advantages(rewards, group_ids))
    weights = 1.0 + 0.2 * (1.0 - old_logp.exp())  # a credit-like per-token weight
    batch = {
        "responses": responses,
        "mask": mask,
        "old_logp": old_logp,
        "logp": logp,
        "ref_logp": ref_logp,
        "entropy": entropy,
        "hidden": hidden,
        "base_hidden": base_hidden,
        "topk_logp": top.values,
        "topk_ids": top.indices,
        "lm_head": lm_head,
        "rewards": rewards,
        "advantages": adv,
        "adv_tok": adv[:, None] * weights * mask,
        "group_ids": group_ids,
        "lengths": lengths,
        "seq_lengths": lengths + torch.randint(4, 32, (B,), generator=g),
    }
    return {k: _bf16_values(v) if v.is_floating_point() else v for k, v in batch.items()}


PROFILES = {
    "bf16": "every floating input in bf16 (the stress test)",
    "engine": "the dtypes the local engine feeds the methods under bf16 autocast: hidden states and LM head in bf16, "
    "log-probs, entropies, advantages and masks in float32 (response_forward casts the logits to float32)",
}
"""Input dtype profiles on the device; the reference is float64 on the CPU for both."""
BF16_KEYS = frozenset({"hidden", "base_hidden", "lm_head"})
"""The inputs the ``engine`` profile keeps in bf16."""

_GSPO_BF16 = (
    "gspo_loss forms its sequence ratio s_i = exp(mean_t log r) in the dtype of logp; next to 1 bf16 values are "
    "2^-8 = 3.9e-3 apart (2^-7 above 1), coarser than GSPO's trust region 1 - 3e-4 .. 1 + 4e-4, so with bf16 "
    "log-probs rollouts whose |log s_i| is under ~2e-3 are never clipped (dfpo promotes to float32 and passes). The "
    "local engine gives the loss float32 log-probs (the `engine` profile, which must pass); verl 0.9.1 does when "
    "flash-attn is installed (its Triton cross-entropy returns float32), but without it logprobs_from_logits_v2 "
    "returns bf16 log-probs for bf16 logits"
)
KNOWN_LIMITS: dict[tuple[str, str, str], str] = {
    ("bf16", "policy_loss", "gspo"): _GSPO_BF16,
    ("bf16", "method_config", "gspo"): _GSPO_BF16,
}
"""(profile, kind, method) -> why a bf16 mismatch there is the format's resolution, not a bug. Such a case is
reported (numbers, reason) but does not fail the check; every other case does."""


class Place:
    """Where and in which float dtypes a computation runs: the device under a profile, or the reference (CPU,
    float64)."""

    def __init__(self, device: str | torch.device, profile: str | None):
        self.device, self.profile = torch.device(device), profile

    def dtype(self, key: str) -> torch.dtype:
        if self.profile is None:
            return torch.float64
        if self.profile == "bf16" or key in BF16_KEYS:
            return torch.bfloat16
        return torch.float32

    def __call__(self, batch: dict[str, Tensor], key: str) -> Tensor:
        x = batch[key]
        return x.to(self.device, self.dtype(key) if x.is_floating_point() else x.dtype)

    def put(self, x: Tensor, key: str) -> Tensor:
        """A derived tensor (not in the batch) placed as the input ``key`` would be."""
        return self({key: x}, key)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


REFERENCE = Place("cpu", None)


def credit_inputs(batch: dict[str, Tensor], at: Place, rng_seed: int = 1234):
    """``CreditInputs`` of the batch placed at ``at`` (a fresh seeded CPU generator, as the engines pass)."""
    from creditlab.algos.credit.base import INPUT_FIELDS, CreditInputs

    fields = {k: at(batch, k) for k in INPUT_FIELDS if k in batch}
    return CreditInputs(**fields, rng=torch.Generator().manual_seed(rng_seed))


def _key(kw: dict[str, Any]) -> str:
    return json.dumps(kw, sort_keys=True, default=str)


def config_cases() -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every (kind, name) -> kwargs a method config (configs/method/*.yaml) gives it."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for m in configs.method_names():
        meth = configs.compose("micro", "micro-s", m)["method"]
        out.setdefault(("advantage", meth["advantage"]), []).append(dict(meth.get("advantage_kwargs") or {}))
        out.setdefault(("policy_loss", meth["policy_loss"]), []).append(dict(meth.get("loss_kwargs") or {}))
        for kind in ("credit", "token_filter"):
            for entry in meth.get(kind) or []:
                out.setdefault((kind, entry["name"]), []).append({k: v for k, v in entry.items() if k != "name"})
    return out


def cases_of(kind: str, name: str, from_configs: dict, K: int) -> list[dict[str, Any]]:
    """Deduplicated kwargs to run ``kind``/``name`` with: its defaults, the configs', the extras."""
    raw: list[dict[str, Any]] = [{}]
    if kind == "policy_loss":
        raw += [{"agg": a} for a in AGG_MODES]
    raw += from_configs.get((kind, name), []) + EXTRA_CASES.get((kind, name), [])
    out, seen = [], set()
    for kw in raw:
        kw = {k: (K if v == "K" else v) for k, v in kw.items()}
        if _key(kw) not in seen:
            seen.add(_key(kw))
            out.append(kw)
    return out


def _case_name(kind: str, name: str, kw: dict[str, Any]) -> str:
    args = ",".join(f"{k}={v}" for k, v in sorted(kw.items()))
    return f"{kind}/{name}" + (f"[{args}]" if args else "")


def _missing_required(fn: Callable, provided: set[str]) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p.name not in provided
    ]


# ------------------------------------------------------------------------------------------------- the runners


def run_advantage(fn: Callable, kw: dict, batch: dict[str, Tensor], at: Place) -> dict[str, Tensor]:
    return {"advantages": fn(at(batch, "rewards"), at(batch, "group_ids"), **kw)}


def run_policy_loss(
    fn: Callable, kw: dict, batch: dict[str, Tensor], at: Place, adv: Tensor | None = None, mask: Tensor | None = None
) -> dict[str, Any]:
    """Loss, d loss / d logp and stats, called as ``Trainer.learn`` calls a loss."""
    params = inspect.signature(fn).parameters
    extra = {}
    if "group_ids" in params:
        extra["group_ids"] = at(batch, "group_ids")
    if "responses" in params:
        extra["responses"] = at(batch, "responses")
    logp = at(batch, "logp").clone().requires_grad_(True)
    a = at(batch, "adv_tok") if adv is None else adv
    m = at(batch, "mask") if mask is None else mask
    loss, stats = fn(logp, at(batch, "old_logp"), a, m, **kw, **extra)
    grad = torch.autograd.grad(loss, logp)[0] if loss.requires_grad else torch.zeros_like(logp)
    return {"loss": loss.detach(), "grad": grad, "stats": stats}


def run_credit(fn: Callable, kw: dict, batch: dict[str, Tensor], at: Place) -> dict[str, Tensor]:
    from creditlab.algos.credit.base import apply_credit

    return {"weights": apply_credit(fn, credit_inputs(batch, at), kw)}


def run_batching(fn: Callable, kw: dict, batch: dict[str, Tensor], at: Place) -> dict[str, Any]:
    from creditlab.algos.batching import call_batching

    gen = torch.Generator().manual_seed(4321)
    parts = call_batching(
        fn,
        at(batch, "group_ids"),
        kw["mini_batches"],
        gen,
        lengths=at(batch, "lengths"),
        seq_lengths=at(batch, "seq_lengths"),
        advantages=at(batch, "advantages"),
        n_ranks=kw["n_ranks"],
    )
    return {"partition": [p.tolist() for p in parts]}


# ------------------------------------------------------------------------------------------------- comparisons


def _valid(x: Tensor, mask: Tensor) -> Tensor:
    return x.detach().to("cpu")[mask.to("cpu") > 0]


def loss_scale(ref: dict[str, Any], ref_abs: dict[str, Any]) -> float:
    """The magnitude of a loss's terms: max of |loss|, |loss with |A||, and ||d loss / d logp||_1 (a loss that is
    0 by construction, as DFPO's projected weights make it, still has terms of the gradient's size)."""
    return max(abs(float(ref["loss"])), abs(float(ref_abs["loss"])), float(ref["grad"].abs().sum()))


def compare_loss(dev: dict, ref: dict, scale: float, mask: Tensor, tol: Tolerance) -> dict[str, Any]:
    loss = scalar_errors(dev["loss"], ref["loss"], scale)
    grad = tensor_errors(_valid(dev["grad"], mask), _valid(ref["grad"], mask), tol)
    bad_stats = sorted(
        k for k, v in ref["stats"].items() if math.isfinite(v) and not math.isfinite(dev["stats"].get(k, math.nan))
    )
    return {
        "ok": loss["ok"] and grad["ok"],
        "loss": loss,
        "grad": grad,
        "stats_nonfinite": bad_stats,  # reported, not gated: logged metrics only
    }


def _record(profile: str, kind: str, name: str, kw: dict, started: float, ok: bool, **fields) -> dict[str, Any]:
    limit = KNOWN_LIMITS.get((profile, kind, name))
    out = {
        "check": "methods",
        "profile": profile,
        "kind": kind,
        "method": name,
        "name": f"{profile}:{_case_name(kind, name, kw)}",
        "kwargs": json.loads(_key(kw)),
        "seconds": round(time.perf_counter() - started, 4),
        "ok": ok,
        **fields,
    }
    if limit and not ok and "error" not in fields:  # a number off by the format's resolution: reported, not failed
        out |= {"ok": True, "limited": limit}
    elif limit:
        out["limit_not_hit"] = limit
    return out


PROVIDED = {
    "advantage": {"rewards", "group_ids"},
    "policy_loss": {"logp", "old_logp", "adv", "mask", "group_ids", "responses"},
    "batching": {"group_ids", "n_minibatches", "generator", "lengths", "seq_lengths", "advantages", "n_ranks"},
}
"""What the engines pass each kind besides its kwargs (credit functions and token filters: CreditInputs fields)."""


def provided_args(kind: str) -> set[str]:
    from creditlab.algos.credit.base import INPUT_FIELDS

    return set(INPUT_FIELDS) if kind in ("credit", "token_filter") else PROVIDED[kind]


def callable_cases(kind: str, name: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cases that give every required argument (a function without defaults for its hyperparameters, such as
    dlogp's alpha, runs with the configs' values only); all of them when none does, so the error is reported."""
    from creditlab.algos import registry

    fn = registry.get(kind, name)
    ok = [kw for kw in cases if not _missing_required(fn, provided_args(kind) | set(kw))]
    return ok or cases


def check_one(kind: str, name: str, kw: dict, batch: dict[str, Tensor], dev: Place, tol: Tolerance) -> dict:
    """Run ``kind``/``name`` with ``kw`` on the device and the reference; the comparison record."""
    from creditlab.algos import registry

    fn = registry.get(kind, name)
    t0 = time.perf_counter()
    try:
        missing = _missing_required(fn, provided_args(kind) | set(kw))
        if missing:
            raise TypeError(
                f"{kind} {name!r} needs {missing}, which no method config or EXTRA_CASES entry of "
                "tools/gpu_check/methods.py gives it: add a case there"
            )
        mask = batch["mask"]
        if kind == "advantage":
            d, r = run_advantage(fn, kw, batch, dev), run_advantage(fn, kw, batch, REFERENCE)
            dev.sync()
            res = tensor_errors(d["advantages"], r["advantages"], tol)
        elif kind == "policy_loss":
            d, r = run_policy_loss(fn, kw, batch, dev), run_policy_loss(fn, kw, batch, REFERENCE)
            dev.sync()
            r_abs = run_policy_loss(fn, kw, batch, REFERENCE, adv=batch["adv_tok"].abs())
            res = compare_loss(d, r, loss_scale(r, r_abs), mask, tol)
        elif kind in ("credit", "token_filter"):
            d, r = run_credit(fn, kw, batch, dev), run_credit(fn, kw, batch, REFERENCE)
            dev.sync()
            res = tensor_errors(_valid(d["weights"], mask), _valid(r["weights"], mask), tol)
        else:
            d, r = run_batching(fn, kw, batch, dev), run_batching(fn, kw, batch, REFERENCE)
            flat = sorted(i for p in r["partition"] for i in p)
            res = exact(d["partition"], r["partition"]) | {
                "is_partition": flat == list(range(batch["group_ids"].numel())),
                "n_minibatches": len(r["partition"]),
            }
            res["ok"] = res["ok"] and res["is_partition"]
        return _record(dev.profile, kind, name, kw, t0, res["ok"], metrics=res)
    except Exception as e:  # noqa: BLE001 - every failure is a finding, reported with its traceback
        tb = traceback.format_exc()
        return _record(dev.profile, kind, name, kw, t0, False, error=f"{type(e).__name__}: {e}", tb=tb)


def check_method_config(method: str, batch: dict[str, Tensor], dev: Place, tol: Tolerance) -> dict[str, Any]:
    """configs/method/<method>.yaml's credit pass and loss as ``Trainer.learn`` runs them, device vs reference:
    credit weights composed, token filters on the loss mask, A_i times the weights, the loss and its gradient."""
    from creditlab.algos import registry
    from creditlab.algos.credit.base import compose_credit, method_entries

    t0 = time.perf_counter()
    try:
        m = configs.compose("micro", "micro-s", method)["method"]
        credit = method_entries("credit", m.get("credit"))
        filters = method_entries("token_filter", m.get("token_filter"))
        loss_fn = registry.get("policy_loss", m["policy_loss"])
        kw = dict(m.get("loss_kwargs") or {})

        def chain(at: Place, abs_adv: bool = False) -> dict[str, Any]:
            inputs = credit_inputs(batch, at)
            weights = compose_credit(credit, inputs)  # float32 (float64 on the reference: it keeps old_logp's)
            adv = inputs.advantages.abs() if abs_adv else inputs.advantages
            adv_tok = at.put(adv.to(weights.dtype)[:, None] * weights, "adv_tok")
            loss_mask = at.put(inputs.mask * compose_credit(filters, inputs).to(inputs.mask.dtype), "mask")
            out = run_policy_loss(loss_fn, kw, batch, at, adv=adv_tok, mask=loss_mask)
            return out | {"weights": weights, "loss_mask": loss_mask}

        d, r = chain(dev), chain(REFERENCE)
        dev.sync()
        mask = batch["mask"]
        res = compare_loss(d, r, loss_scale(r, chain(REFERENCE, abs_adv=True)), mask, tol)
        res["weights"] = tensor_errors(_valid(d["weights"], mask), _valid(r["weights"], mask), tol)
        res["loss_mask"] = tensor_errors(_valid(d["loss_mask"], mask), _valid(r["loss_mask"], mask), tol)
        res["ok"] = res["ok"] and res["weights"]["ok"] and res["loss_mask"]["ok"]
        return _record(dev.profile, "method_config", method, {}, t0, res["ok"], metrics=res, uses=_uses(m))
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exc()
        return _record(dev.profile, "method_config", method, {}, t0, False, error=f"{type(e).__name__}: {e}", tb=tb)


def _uses(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "advantage": m["advantage"],
        "policy_loss": m["policy_loss"],
        "credit": [c["name"] for c in m.get("credit") or []],
        "token_filter": [f["name"] for f in m.get("token_filter") or []],
    }


BATCHING_CASES = [{"mini_batches": 2, "n_ranks": 1}, {"mini_batches": 4, "n_ranks": 2}]


def run(device: str, size: str = "full", seed: int = 0, tol: Tolerance | None = None) -> dict[str, Any]:
    """Check 1 on ``device`` under both profiles: the records of every case and the registered names they cover."""
    from creditlab.algos import registry

    tol = tol or Tolerance()
    s = SIZES[size]
    batch = make_batch(s, seed)
    from_configs = config_cases()
    records = []
    for profile in PROFILES:
        dev = Place(device, profile)
        for kind in KINDS:
            for name in registry.names(kind):
                kws = BATCHING_CASES if kind == "batching" else cases_of(kind, name, from_configs, s.K)
                records += [check_one(kind, name, kw, batch, dev, tol) for kw in callable_cases(kind, name, kws)]
        records += [check_method_config(m, batch, dev, tol) for m in configs.method_names()]
    registered = {kind: registry.names(kind) for kind in KINDS}
    covered = {kind: sorted({r["method"] for r in records if r["kind"] == kind and "error" not in r}) for kind in KINDS}
    return {
        "records": records,
        "registered": registered,
        "covered": covered,
        "method_configs": configs.method_names(),
        "profiles": PROFILES,
        "sizes": {**s.__dict__, "B": s.B},
        "tolerance": tol.as_dict(),
    }
