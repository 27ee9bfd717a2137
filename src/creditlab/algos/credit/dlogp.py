"""Δlog p paper ("Beyond Magnitude", ICLR 2026): probability-based advantage reweighting.

All weights are computed without gradient from the rollout-time old log-probs, once per batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.registry import register

PPL_VARIANTS = ("ppl", "ppl-norm", "ppl-norm-clamp")


@register("credit", "dlogp")
@torch.no_grad()
def dlogp_weights(old_logp: Tensor, alpha: float) -> Tensor:
    """Δlog p reweighting: w_{i,t} = 1 + alpha (1 - p_{i,t}),  p = exp(old_logp).

    Up-weights low-probability tokens (whose log-prob moves most under RLVR).
    old_logp: Tensor[B, T] -> Tensor[B, T]. alpha = 0.2 (Qwen2.5-Math-7B), 0.1 (Qwen3-8B-Base).
    """
    return 1.0 + alpha * (1.0 - old_logp.exp())


@register("credit", "dominate")
@torch.no_grad()
def dominate_weights(old_logp: Tensor, c: float = 0.2) -> Tensor:
    """ "Dominate" baseline (Yang et al.): w_{i,t} = c p_{i,t} + (1 - c). Tensor[B, T] -> Tensor[B, T]."""
    return c * old_logp.exp() + (1.0 - c)


@register("credit", "ppl")
@torch.no_grad()
def ppl_weights(
    old_logp: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    c: float = 0.1,
    variant: str = "ppl-norm-clamp",
    clamp: tuple[float, float] = (0.8, 1.2),
) -> Tensor:
    """Perplexity baseline: one weight per response, broadcast over its tokens.

    L_i = -(sum_t m_{i,t} log p_{i,t}) / sum_t m_{i,t}   (log perplexity of response i)
    ppl:            w_i = 1 - c L_i
    ppl-norm:       w_i = 1 - c z_i,  z_i = (L_i - mean_g L) / (std_g L + 1e-6), population std in group g
    ppl-norm-clamp: ppl-norm clamped to [0.8, 1.2]
    old_logp, mask: Tensor[B, T]; group_ids: Tensor[B] -> Tensor[B, 1].
    """
    if variant not in PPL_VARIANTS:
        raise ValueError(f"unknown ppl variant {variant!r}; valid choices: {list(PPL_VARIANTS)}")
    log_ppl = -(old_logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    if variant == "ppl":
        return (1.0 - c * log_ppl).unsqueeze(-1)
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = torch.zeros(int(inv.max()) + 1, dtype=log_ppl.dtype, device=log_ppl.device).index_add_(
        0, inv, torch.ones_like(log_ppl)
    )
    mean = torch.zeros_like(n).index_add_(0, inv, log_ppl) / n
    var = torch.zeros_like(n).index_add_(0, inv, (log_ppl - mean[inv]) ** 2) / n
    z = (log_ppl - mean[inv]) / (var[inv].sqrt() + 1e-6)
    w = 1.0 - c * z
    if variant == "ppl-norm-clamp":
        w = w.clamp(*clamp)
    return w.unsqueeze(-1)
