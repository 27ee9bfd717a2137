"""Credit fidelity (issue 23): every method's token credit scored against Monte Carlo ground truth.

All five papers argue about which tokens deserve credit; at their scale nobody knows the true value of a token. At
tiny scale it can be measured. On one fixed rollout batch of a fixed policy pi (the warmed-up base model, or a
mid-training checkpoint: ``start: trained@<step>``):

**Truth.** The value of a state is the expected reward of the policy's continuations from it; the true advantage of
response token t of rollout i is [ours: the standard definition, SPEC "Paper C" 6 is its counterfactual variant]

    A*_{i,t} = V(q, o_{i,<=t}) - V(q, o_{i,<t}),       sum_t A*_{i,t} = R_i - V(q)        (telescoping)

Estimator (:func:`coupled_outcomes`) [ours]: K continuations per prefix, *coupled across the prefixes of a rollout*
by common random numbers. Continuation j of rollout i uses one stream of uniforms U_ij[pos] indexed by the absolute
response position, and the project's sampler turns a uniform into a token by inverting the CDF of the sampling
distribution (temperature, top-p: ``lm/sampler.py``). From prefix s_t the continuation's first token is
y'_{tj} = F^-1(U_ij[t] | s_t) (from the policy's logits at s_t, one forward over the rollout); if y'_{tj} = o_{i,t}
the continuation from s_t IS continuation j from s_{t+1} (same uniforms from there on), else it is decoded by the
sampler from s_t + y'_{tj} with U_ij[t+1:] (:func:`creditlab.analysis.value.sample_continuations`). With C_j(t) its
reward (C_j(L) = R_i, the rollout's own reward):

    A_hat_{i,t} = mean_j d_j,   d_j = C_j(t+1) - C_j(t),   se_{i,t} = std_j(d_j) / sqrt(K)     (paired)

Each C_j(t) is an exact draw of the policy's outcome from s_t (first token ~ pi(.|s_t), the rest ~ pi), so A_hat is
unbiased; the coupling makes d_j = 0 whenever the resampled token is the sampled one, so a token the policy was
sure of (p ~ 1) costs nothing and reads exactly 0, and only deviating draws are decoded. The reward is the one the
run trains on (the verifier's score plus DAPO's overlong shaping when enabled). The split-half control: the mean
of d_j over j < K/2 and over j >= K/2 are two independent estimates of the same tokens; their rank correlation r is
the estimate's reliability, its Spearman-Brown step-up 2r/(1+r) that of the full-K estimate, and sqrt(2r/(1+r)) the
highest correlation any credit can reach with the full-K estimate (the noise ceiling).

**Credit.** Every method is scored on the same rollouts by calling its own registered functions on the rollout
batch the run would train on (advantage, credit functions, token filters and policy loss of its method config,
``algos/``): its signed credit of token (i, t) is the per-token gradient coefficient

    c_{i,t} = - d L_m / d log pi(o_{i,t}),    evaluated at the rollout policy (ratio 1: the first mini-batch)

i.e. A_i w_{i,t} times the loss's normaliser and filter (DAPO token-mean: A_i w / N; GRPO / GSPO / ARCA:
A_i w / (B L_i); a token filter zeroes its unselected tokens; DFPO: A_i times its projected rollout weight). One
method = its config's functions, nothing re-implemented; the whole rollout batch goes through them (batch
statistics: DelTA's centroids, Forking's entropy quantile, PPL's group z-score), the truth is measured on a subset.
Losses whose weights need a moved policy (FIPO's future KL, GSPO's / DFPO's sequence ratio, clipping) are equal to
their ratio-1 forms at the rollout policy; an entry with ``policy: moved`` evaluates them after one update of the
run's own method on this batch (the policy its later mini-batches see; the trainer is restored afterwards). An
entry with ``criterion`` scores a registered selection criterion (Δlog p: log pi(y) - log pi_ref(y), the RL
direction) as a signed token score, not a weight of A_i. References (pi_ref, h^base; ARCA's divergence and
adapter residual, the Δlog p direction): the adapter-disabled pass for a LoRA run, else the warmed-up base model
(the full-parameter analogue of "the adapter disabled" [ours]); at ``start: base`` the policy is its own reference:
the residual and the divergence are exactly 0, so ARCA's weights are uniform by its own eps floor (eq. 8).

**Metrics** (:func:`fidelity_metrics`), on the valid tokens of the truth's rollouts, each with a percentile bootstrap
CI resampling prompt groups (rollouts of one prompt are not independent; [ours]): Spearman correlation of c with
A_hat; precision / recall of the top decile of |c| against the top decile of |A_hat| ("critical tokens"); the share
of |c| that lands on tokens whose A_hat is ~0 (|A_hat| < ``null_eps``). Differences to the ``baseline`` entry
(uniform credit) are paired (same resamples).

**Planted check** (:func:`planted_check`): a task variant whose critical token is known by construction. Each truth
rollout is cut at its highest-entropy position c (its prefix joins the prompt), the response is the next ``length``
tokens, and the reward is 1 iff the first response token is the policy's most likely token there: one marked choice
decides the reward, nothing after it can change it. Its exact advantage (1[y = mode] - p(mode) at the first token, 0
elsewhere: the oracle) is known from one forward. The same estimator and metrics then score the oracle (it should
reach the ceiling), the oracle shuffled over tokens (~0) and the exact sequence advantage spread over the response.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from creditlab.algos import registry
from creditlab.algos.credit.base import CreditInputs, compose_credit, method_entries
from creditlab.analysis.credit_fidelity_report import markdown, metrics, plot  # noqa: F401  (the outputs)
from creditlab.analysis.fidelity_metrics import (  # noqa: F401  (re-exported: the metrics of this analysis)
    METRICS,
    bootstrap_fidelity,
    fidelity_metrics,
    spearman,
    top_set,
)
from creditlab.analysis.mc_truth import (  # noqa: F401  (re-exported: the truth of this analysis)
    BRANCH,
    coupled_outcomes,
    forward_logprobs,
    sampling_probs,
    token_truth,
)
from creditlab.analysis.structure import advantage_structure, rollout_kinds
from creditlab.lm.batch import pack, response_forward
from creditlab.lm.sampler import (
    SamplingParams,
)

DEFAULT_METHODS: tuple[dict[str, Any], ...] = (
    {"label": "DAPO (uniform)", "method": "dapo"},
    {"label": "GRPO", "method": "grpo"},
    {"label": "Δlog p reweighting", "method": "dlogp"},
    {"label": "Dominate", "method": "dominate"},
    {"label": "PPL", "method": "ppl"},
    {"label": "DelTA", "method": "delta"},
    {"label": "Forking Tokens", "method": "forking"},
    {"label": "FIPO (after one update)", "method": "fipo", "policy": "moved"},
    {"label": "ARCA uniform", "method": "arca_uniform"},
    {"label": "ARCA surprisal", "method": "arca_surprisal"},
    {"label": "ARCA entropy reduction", "method": "arca_entropy"},
    {"label": "ARCA divergence", "method": "arca_divergence"},
    {"label": "ARCA", "method": "arca"},
    {"label": "GSPO", "method": "gspo"},
    {"label": "DFPO", "method": "dfpo"},
)
"""Used when an analysis declares no ``methods``: each entry {label, method | run | criterion, overrides, policy}."""

ENTRY_KEYS = ("label", "method", "run", "criterion", "overrides", "policy")
REALISED = "realised (own update)"
"""Label of the realised credit: Δ log pi(o_t) after one update of the run's own method on the batch."""
POLICIES = ("rollout", "moved")


# ---------------------------------------------------------------------------------------------------------- credit
def signed_credit(mcfg: dict[str, Any], inputs: CreditInputs, rewards: Tensor, logp: Tensor) -> Tensor:
    """The per-token gradient coefficient c = -d L / d logp of method config ``mcfg`` (its registered advantage,
    credit functions, token filters and policy loss with its ``loss_kwargs``) on the batch ``inputs`` (its
    ``advantages`` are replaced by the method's own), at policy log-probs ``logp`` (Tensor[B, T]; ``inputs.old_logp``
    for ratio 1). rewards: Tensor[B]. Returns Tensor[B, T] float64, 0 on padding."""
    gids = inputs.group_ids
    adv = registry.get("advantage", mcfg["advantage"])(
        rewards.to(gids.device), gids, **(mcfg.get("advantage_kwargs") or {})
    ).float()
    batch = dataclasses.replace(inputs, advantages=adv)
    weights = compose_credit(method_entries("credit", mcfg.get("credit")), batch)
    batch = dataclasses.replace(batch, rng=_reseed(inputs.rng))
    keep = compose_credit(method_entries("token_filter", mcfg.get("token_filter")), batch)
    loss_fn = registry.get("policy_loss", mcfg["policy_loss"])
    kw = dict(mcfg.get("loss_kwargs") or {})
    params = inspect.signature(loss_fn).parameters
    if "group_ids" in params:
        kw["group_ids"] = gids
    if "responses" in params:
        kw["responses"] = inputs.responses
    mask = inputs.mask.float()
    lp = logp.detach().float().clone().requires_grad_(True)
    with torch.enable_grad():
        loss, _ = loss_fn(lp, inputs.old_logp.float(), (adv[:, None] * weights).detach(), mask * keep, **kw)
        (grad,) = torch.autograd.grad(loss, lp, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(lp)
    return (-grad * mask).double().detach()


def _reseed(rng: torch.Generator | None) -> torch.Generator | None:
    return None if rng is None else torch.Generator().manual_seed(rng.initial_seed())


def criterion_score(name: str, logp_policy: Tensor, logp_ref: Tensor, tokens: Tensor) -> Tensor:
    """A registered selection criterion (``decoding.criteria``, e.g. ``dlogp``: log pi(y) - log pi_ref(y)) of each
    sampled token: logp_policy, logp_ref [N, V] full log-probs, tokens [N] -> [N] float64."""
    from creditlab.decoding.criteria import get_criterion

    return get_criterion(name)(logp_policy, logp_ref, tokens, decoder="rl").double()


def check_entries(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``methods`` param's entries, checked: each a mapping with a ``label`` and exactly one of ``method``
    (a configs/method name), ``run`` (a run of the paper) or ``criterion`` (a registered selection criterion);
    ``overrides`` a list of Hydra overrides; ``policy`` rollout (default) | moved. ValueError naming the entry."""
    out, seen = [], set()
    for k, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"methods[{k}]: expected a mapping {{label, method | run | criterion, ...}}, got {e!r}")
        bad = sorted(set(e) - set(ENTRY_KEYS))
        if bad:
            raise ValueError(f"methods[{k}]: unknown key(s) {bad}; valid: {list(ENTRY_KEYS)}")
        what = [x for x in ("method", "run", "criterion") if e.get(x)]
        if len(what) != 1:
            raise ValueError(f"methods[{k}] ({e.get('label')!r}): name exactly one of method, run, criterion")
        label = str(e.get("label") or e[what[0]])
        if label in seen:
            raise ValueError(f"methods[{k}]: label {label!r} used twice")
        seen.add(label)
        policy = e.get("policy", "rollout")
        if policy not in POLICIES:
            raise ValueError(f"methods[{k}] ({label!r}): policy {policy!r}; valid: {list(POLICIES)}")
        if not isinstance(e.get("overrides", []), list):
            raise ValueError(f"methods[{k}] ({label!r}): overrides must be a list")
        out.append(
            {
                "label": label,
                "kind": what[0],
                "name": str(e[what[0]]),
                "overrides": [str(o) for o in e.get("overrides", [])],
                "policy": policy,
            }
        )
    return out


# ------------------------------------------------------------------------------------------------------- the batch
def _reward_fn(trainer) -> Callable[[list[list[int]], list[Any]], list[float]]:
    """The reward the run trains on, of full responses: the verifier's score of the decoded text (as the trainer
    decodes it), plus DAPO's overlong penalty when enabled (``algos.shaping.overlong_penalty``)."""
    from creditlab.algos.shaping import overlong_penalty

    t = trainer.tcfg
    ol = t["overlong"]

    def fn(token_lists: list[list[int]], golds: list[Any]) -> list[float]:
        texts = trainer.tok.batch_decode(token_lists, skip_special_tokens=True) if token_lists else []
        unique = list(dict.fromkeys(zip(texts, golds)))
        scored = (
            dict(zip(unique, trainer.scorer.score([u[0] for u in unique], [u[1] for u in unique]))) if unique else {}
        )
        out = [float(scored[k]) for k in zip(texts, golds)]
        if ol["enable"]:
            out = [
                r + overlong_penalty(len(ids), t["max_new_tokens"], ol["buffer"], ol["penalty"])
                for r, ids in zip(out, token_lists)
            ]
        return out

    return fn


def choose_subset(
    group_ids: Sequence[int], rewards: Sequence[float], groups: int, per_group: int, seed: int
) -> list[int]:
    """Rows of the truth: ``groups`` prompt groups drawn (seeded) among the informative ones (rewards not all
    equal: every method gives a group of equal rewards zero credit), ``per_group`` rollouts drawn in each (all when
    the group is smaller). Sorted row indices."""
    by: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        by.setdefault(int(g), []).append(i)
    informative = [g for g, rows in by.items() if len({round(float(rewards[i]), 9) for i in rows}) > 1]
    rng = np.random.default_rng([seed, 23])
    chosen = [informative[k] for k in sorted(rng.permutation(len(informative))[:groups])]
    rows: list[int] = []
    for g in chosen:
        members = by[g]
        pick = rng.permutation(len(members))[: min(per_group, len(members))]
        rows += [members[k] for k in sorted(pick)]
    return sorted(rows)


# ----------------------------------------------------------------------------------------------------- the analysis
def analyze(
    ctx,
    *,
    K: int = 16,
    groups: int = 16,
    per_group: int = 4,
    methods: list | None = None,
    baseline: str | None = None,
    top_frac: float = 0.1,
    null_eps: float = 0.05,
    n_boot: int = 1000,
    planted_length: int = 8,
    step: int | None = None,
    max_decode_tokens: float = 1.0e8,
) -> dict[str, Any]:
    """Credit fidelity of every entry of ``methods`` (default :data:`DEFAULT_METHODS`) on rollout batch ``step``
    (default: the trainer's step, i.e. the batch the run trains on next) of the context's policy; the truth on
    ``groups`` informative prompt groups x ``per_group`` rollouts with K coupled continuations per prefix; the
    planted check on the same rollouts. ``baseline``: the label the differences are taken against (default: the
    first entry, uniform credit). ``max_decode_tokens``: the job refuses to start when its worst-case Monte Carlo cost
    (`creditlab.analysis.plan_checks.credit_fidelity_cost`) exceeds it; the plan leaves it out there too."""
    from creditlab.analysis.plan_checks import credit_fidelity_cost

    cost = credit_fidelity_cost(
        dict(K=K, groups=groups, per_group=per_group, planted_length=planted_length), {"trainer": ctx.trainer.tcfg}
    )
    if cost["worst_decoded_tokens"] > max_decode_tokens:
        raise ValueError(
            f"credit_fidelity: worst case {cost['worst_decoded_tokens']:.3g} decoded tokens > "
            f"max_decode_tokens={max_decode_tokens:.3g}"
        )
    entries = check_entries(list(methods) if methods is not None else list(DEFAULT_METHODS))
    baseline = baseline or entries[0]["label"]
    if baseline not in {e["label"] for e in entries}:
        raise ValueError(f"baseline {baseline!r} is no entry label; labels: {[e['label'] for e in entries]}")
    tr = ctx.trainer
    t = tr.tcfg
    seed = ctx.seed
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    step = tr.step if step is None else int(step)
    ro, _ = tr.collect(step)
    timing["rollouts"] = time.perf_counter() - t0

    # ---- the batch tensors every method sees (the trainer's old-log-prob forward, and a reference pass)
    t1 = time.perf_counter()
    model = tr.model
    device = tr.device
    batch = pack(ro.prompts, ro.responses, tr.tok.pad_token_id)
    topk = max(
        [int(kw.get("topk") or 0) for e in entries if e["kind"] != "criterion" for kw in _credit_kwargs(ctx, e)] + [0]
    )
    was = model.training
    model.eval()
    with torch.no_grad():
        old = response_forward(model, batch, with_entropy=True, with_hidden=True, topk=topk)
    ref_logp, ref_hidden, reference = _reference_pass(ctx, batch, old)
    model.train(was)
    mask = batch.response_mask.to(device)
    rewards = torch.tensor(ro.rewards, dtype=torch.float32)
    gids = torch.tensor(ro.group_ids, dtype=torch.long, device=device)
    inputs = CreditInputs(
        responses=batch.responses.to(device),
        mask=mask,
        old_logp=old.logp,
        advantages=None,
        group_ids=gids,
        hidden=old.hidden,
        entropy=old.entropy,
        topk_logp=old.topk_logp,
        topk_ids=old.topk_ids,
        lm_head=model.get_output_embeddings().weight.detach(),
        rng=torch.Generator().manual_seed(seed * 1_000_003 + step),
        ref_logp=ref_logp,
        base_hidden=ref_hidden,
    )
    # one update of the run's own method on this batch (trainer restored after): the policy `moved` entries see, and
    # the realised credit (the change of every token's log-probability) [issue 29 item 5]
    from creditlab.analysis.flipping import update_shifts

    shifts = update_shifts(tr, ro, ["joint"], step=step, seed=seed)
    moved_logp = (shifts["before_logp"] + shifts["delta"]["joint"]).to(device)
    timing["forwards"] = time.perf_counter() - t1

    # ---- the truth's rows, and every method's credit
    rows = choose_subset(ro.group_ids, ro.rewards, groups, per_group, seed)
    if not rows:
        raise ValueError(
            f"rollout batch {step} has no informative group (every group's rewards tie): no method "
            f"gives any token credit there; mean reward {float(np.mean(ro.scores)):.3f}"
        )
    t2 = time.perf_counter()
    credit_rows: dict[str, Tensor] = {}
    for e in entries:
        if e["kind"] == "criterion":
            credit_rows[e["label"]] = _criterion_rows(ctx, e["name"], ro, rows, reference)
            continue
        mcfg = ctx.method_config(e["kind"], e["name"], e["overrides"])
        logp = old.logp if e["policy"] == "rollout" else moved_logp
        credit_rows[e["label"]] = signed_credit(mcfg, inputs, rewards, logp)[rows].cpu()
    timing["credit"] = time.perf_counter() - t2

    # ---- the truth
    t3 = time.perf_counter()
    reward_fn = _reward_fn(tr)
    P = [ro.prompts[i] for i in rows]
    Rsp = [ro.responses[i] for i in rows]
    G = [ro.golds[i] for i in rows]
    model.eval()
    params = SamplingParams(
        max_new_tokens=t["max_new_tokens"],
        temperature=t["temperature"],
        top_p=t["top_p"],
        eos_id=tr.stop_ids,
        seed=seed,
    )
    mc = coupled_outcomes(model, P, Rsp, G, reward_fn, params, K=K, pad_id=tr.tok.pad_token_id, progress=tr.progress)
    model.train(was)
    truth = token_truth(mc["C"])
    timing["truth"] = time.perf_counter() - t3

    # ---- metrics
    t4 = time.perf_counter()
    lens = [len(r) for r in Rsp]
    flat = lambda xs: np.concatenate([x.numpy() for x in xs]) if xs else np.zeros(0)
    a, se = flat(truth["adv"]), flat(truth["se"])
    h1, h2 = flat(truth["half1"]), flat(truth["half2"])
    clusters = np.concatenate([[int(ro.group_ids[i])] * n for i, n in zip(rows, lens)]).astype(np.int64)
    credits = {lab: np.concatenate([c[k, :n].numpy() for k, n in enumerate(lens)]) for lab, c in credit_rows.items()}
    realised = np.concatenate([shifts["delta"]["joint"][i, :n].numpy() for i, n in zip(rows, lens)])
    credits[REALISED] = realised
    uncertainty = 1.0 - np.exp(np.concatenate([old.logp[i, :n].float().cpu().numpy() for i, n in zip(rows, lens)]))
    fid = bootstrap_fidelity(
        credits,
        a,
        clusters,
        half1=h1,
        half2=h2,
        baseline=baseline,
        top_frac=top_frac,
        null_eps=null_eps,
        n_boot=n_boot,
        seed=seed,
        weights=uncertainty,
    )
    # where each credit map puts its mass, by token kind (a rule world: decisive letters vs ignorable separators)
    by_kind = None
    kinds = rollout_kinds(tr.tok, P, Rsp)
    if kinds is not None:
        by_kind = {"true advantage": advantage_structure(truth["adv"], kinds)} | {
            lab: advantage_structure(np.split(c, np.cumsum(lens)[:-1]), kinds) for lab, c in credits.items()
        }
    timing["metrics"] = time.perf_counter() - t4

    t5 = time.perf_counter()
    planted = planted_check(
        model,
        P,
        Rsp,
        dataclasses.replace(params, max_new_tokens=planted_length),
        K=K,
        pad_id=tr.tok.pad_token_id,
        top_frac=top_frac,
        null_eps=null_eps,
        n_boot=n_boot,
    )
    model.train(was)
    timing["planted"] = time.perf_counter() - t5
    timing["total"] = time.perf_counter() - t0

    own = np.array(mc["rewards"])
    sub_rewards = np.array([ro.rewards[i] for i in rows])
    for e in entries:
        fid["methods"][e["label"]] |= {
            "kind": e["kind"],
            "name": e["name"],
            "overrides": e["overrides"],
            "policy": e["policy"],
        }
    return {
        "kind": "credit_fidelity",
        "K": K,
        "step": step,
        "baseline": baseline,
        "top_frac": top_frac,
        "null_eps": null_eps,
        "n_boot": n_boot,
        "reference": reference,
        "batch": {
            "rollouts": len(ro.responses),
            "groups": len(set(ro.group_ids)),
            "informative_groups": _informative_groups(ro.group_ids, ro.rewards),
            "reward_mean": float(np.mean(ro.scores)),
        },
        "truth": {
            "rollouts": len(rows),
            "groups": fid["n_clusters"],
            "tokens": int(a.size),
            "pairs": mc["pairs"],
            "deviations": mc["deviations"],
            "decoded_tokens": mc["decoded_tokens"],
            "se_mean": float(se.mean()) if se.size else float("nan"),
            "se_median": float(np.median(se)) if se.size else float("nan"),
            "se_max": float(se.max()) if se.size else float("nan"),
            "se_mean_nonzero": float(se[a != 0].mean()) if (a != 0).any() else float("nan"),
            "zero_frac": float((a == 0).mean()) if a.size else float("nan"),
            "null_frac": float((np.abs(a) < null_eps).mean()) if a.size else float("nan"),
            "abs_adv_mean": float(np.abs(a).mean()) if a.size else float("nan"),
            "reward_check_max_abs": float(np.abs(own - sub_rewards).max()) if own.size else 0.0,
            "value_prompt_mean": float(np.mean([v[0].item() for v in truth["value"]])),
        },
        "ceiling": fid.get("ceiling"),
        "methods": [fid["methods"][e["label"]] | {"label": e["label"]} for e in entries],
        "realised": fid["methods"][REALISED] | {"label": REALISED, "method": tr.mcfg.get("name")},
        "uncertain": {
            "mean_1_minus_p": float(uncertainty.mean()) if uncertainty.size else float("nan"),
            "share_p_below_0.9": float((uncertainty > 0.1).mean()) if uncertainty.size else float("nan"),
        },
        "planted": planted,
        "by_kind": by_kind,
        "seconds": timing,
    }


def _informative_groups(group_ids: Sequence[int], rewards: Sequence[float]) -> int:
    by: dict[int, set[float]] = {}
    for g, r in zip(group_ids, rewards):
        by.setdefault(int(g), set()).add(round(float(r), 9))
    return sum(len(v) > 1 for v in by.values())


def _credit_kwargs(ctx, e: dict[str, Any]) -> list[dict[str, Any]]:
    mcfg = ctx.method_config(e["kind"], e["name"], e["overrides"])
    return [
        {k: v for k, v in c.items() if k != "name"}
        for c in (mcfg.get("credit") or []) + (mcfg.get("token_filter") or [])
    ]


def _reference_pass(ctx, batch, old) -> tuple[Tensor, Tensor, str]:
    """(ref_logp, base_hidden, what): the adapter-disabled pass for a LoRA trainer; else the reference model the
    context gives (the warmed-up base model of a trained start); else the policy itself (start: base)."""
    tr = ctx.trainer
    if getattr(tr, "peft", None) is not None:
        with torch.no_grad(), tr.peft.disable_adapter():
            ref = response_forward(tr.model, batch, with_hidden=True)
        return ref.logp, ref.hidden, "the policy with its LoRA adapter disabled"
    ref_model = ctx.reference() if getattr(ctx, "reference", None) is not None else None
    if ref_model is None:
        return (
            old.logp,
            old.hidden,
            (
                "the policy itself (start: base, no adapter): residual and divergence are 0, "
                "ARCA's weights uniform by its eps floor; the Δlog p direction is 0"
            ),
        )
    ref_model = ref_model.to(tr.device).eval()
    with torch.no_grad():
        ref = response_forward(ref_model, batch, with_hidden=True)
    return ref.logp, ref.hidden, "the warmed-up base model (the full-parameter analogue of the adapter disabled)"


def _criterion_rows(ctx, name: str, ro, rows: list[int], reference: str) -> Tensor:
    """A criterion's score of every token of the truth's rows (Tensor[R, T] float64, 0 on padding)."""
    tr = ctx.trainer
    P, Rsp = [ro.prompts[i] for i in rows], [ro.responses[i] for i in rows]
    pol = forward_logprobs(tr.model, P, Rsp, tr.tok.pad_token_id)
    ref_model = tr.model
    if getattr(tr, "peft", None) is None and getattr(ctx, "reference", None) is not None:
        ref_model = ctx.reference() or tr.model
    if getattr(tr, "peft", None) is not None:
        with tr.peft.disable_adapter():
            ref = forward_logprobs(tr.model, P, Rsp, tr.tok.pad_token_id)
    else:
        ref = forward_logprobs(ref_model.to(tr.device).eval(), P, Rsp, tr.tok.pad_token_id)
    T = max(len(r) for r in Rsp)
    out = torch.zeros(len(rows), T, dtype=torch.float64)
    for k, r in enumerate(Rsp):
        if r:
            out[k, : len(r)] = criterion_score(name, pol[k], ref[k], torch.as_tensor(r, dtype=torch.long))
    return out


# ------------------------------------------------------------------------------------------------------ planted check
def planted_check(
    model,
    prompts,
    responses,
    params: SamplingParams,
    *,
    K: int,
    pad_id: int,
    top_frac: float = 0.1,
    null_eps: float = 0.05,
    n_boot: int = 1000,
) -> dict[str, Any]:
    """The check that the metric can fail (module docstring, "Planted check"). prompts, responses: the rollouts;
    params: the sampling, its ``max_new_tokens`` the planted responses' length.

    Rollout i is cut at c_i = its highest-entropy position under the sampling distribution; planted prompt = prompt
    + response[:c_i], planted response = response[c_i : c_i + length], planted reward = 1 iff the first planted
    token is S_i = the most likely token at c_i (exact advantage 1[y = S_i] - p(S_i) at the first token, 0 after:
    the oracle). The coupled estimator (:func:`coupled_outcomes`, budget ``length``) measures the truth as for the
    real task; :func:`bootstrap_fidelity` scores the oracle, the oracle shuffled over all tokens and the exact
    sequence advantage spread over the planted response, clusters = rollouts. Returns their metrics, the ceiling,
    and the estimator's error on the oracle (``max_abs_after_first``: |A_hat| after the first token, exactly 0 by
    construction; ``first_token_z``: the mean error at the first token in units of its standard error)."""
    length, seed = params.length(), params.seed
    logp = forward_logprobs(model, prompts, responses, pad_id)
    P2, R2, S, pS = [], [], [], []
    for i, resp in enumerate(responses):
        if not resp:
            continue
        probs = sampling_probs(logp[i], params)  # [L, V]
        ent = -(probs * torch.log(probs.clamp(min=1e-30))).sum(-1)
        c = int(torch.argmax(ent))
        s = int(torch.argmax(probs[c]))
        P2.append(list(prompts[i]) + list(resp[:c]))
        R2.append(list(resp[c : c + length]))
        S.append(s)
        pS.append(float(probs[c, s]))

    def planted_reward(token_lists: list[list[int]], marks: list[int]) -> list[float]:
        return [float(bool(ids) and ids[0] == m) for ids, m in zip(token_lists, marks)]

    planted_params = dataclasses.replace(params, seed=params.seed + 7919)
    mc = coupled_outcomes(model, P2, R2, S, planted_reward, planted_params, K=K, pad_id=pad_id)
    truth = token_truth(mc["C"])
    lens = [len(r) for r in R2]
    a = np.concatenate([x.numpy() for x in truth["adv"]])
    se = np.concatenate([x.numpy() for x in truth["se"]])
    oracle = np.concatenate([[float(r[0] == s) - p] + [0.0] * (n - 1) for r, s, p, n in zip(R2, S, pS, lens)])
    spread = np.concatenate([[float(r[0] == s) - p] * n for r, s, p, n in zip(R2, S, pS, lens)])
    shuffled = oracle[np.random.default_rng([seed, 5]).permutation(oracle.size)]
    clusters = np.concatenate([[k] * n for k, n in enumerate(lens)])
    fid = bootstrap_fidelity(
        {"oracle": oracle, "shuffled oracle": shuffled, "sequence advantage spread": spread},
        a,
        clusters,
        half1=np.concatenate([x.numpy() for x in truth["half1"]]),
        half2=np.concatenate([x.numpy() for x in truth["half2"]]),
        baseline=None,
        top_frac=top_frac,
        null_eps=null_eps,
        n_boot=n_boot,
        seed=seed,
    )
    starts = np.cumsum([0] + lens[:-1])
    after = np.ones(a.size, dtype=bool)
    after[starts] = False
    err0 = a[starts] - oracle[starts]
    se0 = se[starts]
    return {
        "rollouts": len(R2),
        "tokens": int(a.size),
        "length": length,
        "p_mark_mean": float(np.mean(pS)),
        "methods": fid["methods"],
        "ceiling": fid.get("ceiling"),
        "max_abs_after_first": float(np.abs(a[after]).max()) if after.any() else 0.0,
        "first_token_error_mean": float(err0.mean()),
        "first_token_z": float(err0.mean() / (np.sqrt((se0**2).sum()) / len(se0))) if (se0 > 0).any() else float("nan"),
        "decoded_tokens": mc["decoded_tokens"],
    }
