"""The rankcredit credit weight, registered in creditlab's registry when creditlab imports this module (the
entry point ``creditlab.methods`` of this package's pyproject.toml)."""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.registry import register


@register("credit", "rankcredit")
@torch.no_grad()
def rankcredit_weights(old_logp: Tensor, mask: Tensor, group_ids: Tensor, beta: float = 0.5) -> Tensor:
    """Surprisal-rank credit: w_{i,t} = 1 + beta (r_{i,t} - 1/2) on valid tokens, 1 elsewhere, where

        r_{i,t} = (#{u in G : s_u < s_{i,t}} + (#{u in G : s_u = s_{i,t}} - 1) / 2) / (n_G - 1)

    is the mid-rank of the token's surprisal s_{i,t} = -old_logp_{i,t} among the n_G valid tokens of every rollout
    of its group G (the rollouts of one prompt), scaled to [0, 1] (r = 1/2 when n_G = 1): the group's most
    surprising token gets 1 + beta/2, its least surprising 1 - beta/2, and the weights average 1 over the group.

    old_logp: Tensor[B, T] rollout-time log-probs; mask: Tensor[B, T] 1 on valid response tokens;
    group_ids: Tensor[B] long; beta in [0, 2). Returns Tensor[B, T].
    """
    s = -old_logp
    valid = mask > 0
    w = torch.ones_like(s)
    for g in torch.unique(group_ids):
        sel = valid & (group_ids == g)[:, None]
        vals = s[sel]
        n = vals.numel()
        if n == 0:
            continue
        srt = torch.sort(vals).values
        less = torch.searchsorted(srt, vals, right=False)
        leq = torch.searchsorted(srt, vals, right=True)
        r = (less + leq - 1).to(s.dtype) / (2 * (n - 1)) if n > 1 else torch.full_like(vals, 0.5)
        w[sel] = 1 + beta * (r - 0.5)
    return w
