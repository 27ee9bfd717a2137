"""Token filters (kind ``"token_filter"``): which tokens enter the policy-gradient loss.

A token filter has the same calling convention as a credit function (argument names that are
CreditInputs fields, plus its own kwargs; see ``base.apply_credit``) but returns a 0/1 float
Tensor[B, T]; the trainer multiplies the loss mask by it, so token-mean normalises by the number of
selected tokens. Several filters compose by multiplication.
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.registry import register


@register("token_filter", "forking")
@torch.no_grad()
def forking_tokens_mask(entropy: Tensor, mask: Tensor, top_frac: float = 0.2) -> Tensor:
    """DAPO w/ Forking Tokens (Wang et al. 2025, "80/20 rule"): keep only the high-entropy tokens.

    tau = the (1 - top_frac) quantile of {H_{i,t} : mask_{i,t} = 1} over the whole rollout batch,
    keep_{i,t} = 1[H_{i,t} >= tau] * mask_{i,t}.
    The quantile is torch.quantile's (linear interpolation), computed exactly with kthvalue
    (k = N - floor(top_frac (N - 1)) of the N valid entropies, which needs no 2^24-element limit):
    with distinct entropies exactly 1 + floor(top_frac (N - 1)) tokens are kept (~top_frac N); ties at
    the threshold are all kept (>=). No valid token -> all zeros.
    Entropy [ours]: H is the entropy of the rollout batch's old policy at each position (from the
    old-log-prob forward, ``CreditInputs.entropy``), so the selection is fixed for the step; it equals
    the current policy's entropy for the first mini-batch (the paper uses the current policy's).
    entropy, mask: Tensor[B, T] -> float Tensor[B, T] of 0/1 (dtype of entropy).
    """
    if not 0.0 < top_frac <= 1.0:
        raise ValueError(f"top_frac must be in (0, 1], got {top_frac}")
    valid = mask > 0
    vals = entropy[valid]
    n = vals.numel()
    if n == 0:
        return torch.zeros_like(entropy)
    k = n - int(top_frac * (n - 1))
    tau = vals.kthvalue(k).values
    return ((entropy >= tau) & valid).to(entropy.dtype)
