"""Monte Carlo token advantages by coupled continuations: the truth credit fidelity and world structure are scored on.

The estimator of :mod:`creditlab.analysis.credit_fidelity` ("Truth"): the true advantage of response token t of
rollout i is A*_{i,t} = V(q, o_{i,<=t}) - V(q, o_{i,<t}); K continuations per prefix, coupled across the prefixes of a
rollout by common random numbers (one stream of uniforms per continuation, indexed by response position), so that a
token the policy was sure of costs nothing and reads exactly 0. :func:`coupled_outcomes` returns every prefix's
continuation rewards, :func:`token_truth` the advantages, their paired standard errors and the split halves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from creditlab.analysis.value import item_seed, sample_continuations
from creditlab.lm.batch import pack, response_logprobs
from creditlab.lm.sampler import (
    SamplingParams,
    choose_tokens,
    draw_uniforms,
    filter_logits,
    nucleus,
)

BRANCH = 2
"""``item_seed`` branch of the fidelity uniforms (value.py uses 0 and 1)."""


def sampling_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution the sampler draws from (temperature, top-k, top-p; ``choose_tokens``'s): [N, V] -> [N, V]."""
    logits = filter_logits(logits.float(), params)
    if params.top_p < 1.0:
        sorted_logits, order = nucleus(logits, params.top_p)
        return torch.zeros_like(logits).scatter(1, order, torch.softmax(sorted_logits, dim=-1))
    return torch.softmax(logits, dim=-1)


def forward_logprobs(model, prompts, responses, pad_id: int, rows: int = 64) -> list[Tensor]:
    """Per rollout, the policy's next-token log-probs at each response position: [L_i, V] float32 (CPU)."""
    out: list[Tensor] = []
    device = next(model.parameters()).device
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    for s in range(0, len(prompts), rows):
        p, r = prompts[s : s + rows], responses[s : s + rows]
        with torch.no_grad(), cast:
            lp = response_logprobs(model, pack(p, [x if x else [pad_id] for x in r], pad_id)).float().cpu()
        out += [lp[k, : len(x)] for k, x in enumerate(r)]
    return out


def coupled_outcomes(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    golds: Sequence[Any],
    reward_fn: Callable[[list[list[int]], list[Any]], list[float]],
    params: SamplingParams,
    *,
    K: int,
    pad_id: int,
    chunk: int = 512,
    progress: bool = False,
) -> dict[str, Any]:
    """Coupled Monte Carlo outcomes of every prefix of every rollout (module docstring, "Truth").

    prompts, responses, golds: R rollouts (token lists; ``golds[i]`` is passed to ``reward_fn`` with rollout i's
    responses). reward_fn(responses, golds) -> rewards: the reward of full responses (token lists, the prompt
    excluded). params: the sampling (token choice, stop tokens, the response budget ``max_new_tokens``, ``seed``);
    pad_id: the padding of the scoring forward. Continuation j of rollout i draws its tokens from the uniforms
    ``draw_uniforms(K, max_new_tokens, 1, item_seed(seed, i, 0, BRANCH))[j, :, 0]`` indexed by response position.
    Returns {"C": [Tensor[K, L_i + 1] float64] (C[j, t]: reward of continuation j from the prefix o_<t; column L_i
    the rollout's own reward), "pairs" (sum_i K L_i), "deviations" (pairs whose first token differs from the
    rollout's), "decoded_tokens" (tokens the sampler generated), "rewards" (each rollout's reward by reward_fn)}.
    """
    if K < 2:
        raise ValueError(f"K must be >= 2 (split halves, a paired standard error), got {K}")
    stops, max_new_tokens = set(params.stop_ids), params.length()
    R = len(responses)
    uni = [draw_uniforms(K, max_new_tokens, 1, item_seed(params.seed, i, 0, BRANCH))[..., 0] for i in range(R)]  # [K,M]
    logp = forward_logprobs(model, prompts, responses, pad_id)
    first: list[Tensor] = []
    for i, resp in enumerate(responses):
        L = len(resp)
        if L == 0:
            first.append(torch.zeros(K, 0, dtype=torch.long))
            continue
        lg = logp[i].repeat_interleave(K, dim=0)  # rows (t, j)
        u = uni[i][:, :L].T.reshape(-1)
        first.append(choose_tokens(lg, params, u).view(L, K).T)  # [K, L]
    dev_items: list[tuple[int, int, int]] = []
    heads: list[list[int]] = []
    prefixes, budgets, us, which = [], [], [], []
    for i, resp in enumerate(responses):
        y = torch.as_tensor(list(resp), dtype=torch.long)
        for j, t in (first[i] != y[None, :]).nonzero().tolist():
            tok = int(first[i][j, t])
            head = list(resp[:t]) + [tok]
            budget = 0 if tok in stops else max_new_tokens - t - 1
            dev_items.append((i, t, j))
            heads.append(head)
            if budget > 0:
                which.append(len(heads) - 1)
                prefixes.append(list(prompts[i]) + head)
                budgets.append(budget)
                us.append(uni[i][j, t + 1 : t + 1 + budget][None])
    conts = (
        sample_continuations(
            model, prefixes, budgets, [0] * len(prefixes), params, n=1, chunk=chunk, progress=progress, uniforms=us
        )
        if prefixes
        else []
    )
    full = [list(h) for h in heads]
    decoded = 0
    for k, c in zip(which, conts):
        full[k] += c[0]
        decoded += len(c[0])
    dev_golds = [golds[i] for i, _, _ in dev_items]
    rewards = reward_fn([list(r) for r in responses] + full, list(golds) + dev_golds)
    own, dev_r = rewards[:R], rewards[R:]
    C: list[Tensor] = []
    dev_of: dict[tuple[int, int, int], float] = {it: float(r) for it, r in zip(dev_items, dev_r)}
    for i, resp in enumerate(responses):
        L = len(resp)
        c = torch.empty(K, L + 1, dtype=torch.float64)
        c[:, L] = float(own[i])
        y = torch.as_tensor(list(resp), dtype=torch.long)
        same = first[i] == y[None, :] if L else torch.zeros(K, 0, dtype=torch.bool)
        for t in range(L - 1, -1, -1):
            for j in range(K):
                c[j, t] = c[j, t + 1] if same[j, t] else dev_of[(i, t, j)]
        C.append(c)
    return {
        "C": C,
        "pairs": int(sum(K * len(r) for r in responses)),
        "deviations": len(dev_items),
        "decoded_tokens": decoded,
        "rewards": [float(r) for r in own],
    }


def token_truth(C: Sequence[Tensor]) -> dict[str, list[Tensor]]:
    """Per rollout, from the coupled outcomes C [K, L + 1]: ``adv`` [L] = mean_j d_j, ``se`` [L] = std_j(d_j) /
    sqrt(K) (unbiased std), ``half1`` / ``half2`` [L] = mean of d_j over j < K // 2 / j >= K // 2, ``value`` [L + 1]
    = mean_j C[j, t]; d_j = C[j, t + 1] - C[j, t] (float64)."""
    out: dict[str, list[Tensor]] = {k: [] for k in ("adv", "se", "half1", "half2", "value")}
    for c in C:
        K = c.shape[0]
        d = c[:, 1:] - c[:, :-1]
        out["adv"].append(d.mean(0))
        out["se"].append(d.std(0, unbiased=True) / math.sqrt(K) if d.shape[1] else d.sum(0))
        out["half1"].append(d[: K // 2].mean(0))
        out["half2"].append(d[K // 2 :].mean(0))
        out["value"].append(c.mean(0))
    return out
