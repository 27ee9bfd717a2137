"""Outcome advantages for critic-free RL: one scalar per rollout, shared by its tokens.

All functions take ``rewards: Tensor[B]`` (one scalar reward per rollout) and ``group_ids: Tensor[B]``
(the prompt each rollout answers; rollouts of a prompt form a group) and return ``Tensor[B]``.
They run without gradient and make no assumption about the order of rollouts in the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.registry import register


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-rollout group sum, group count and group sum of squares (each Tensor[B], float64)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    r = rewards.to(torch.float64)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    s = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, inv, r)
    n = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, inv, torch.ones_like(r))
    s2 = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, inv, r * r)
    return s[inv], n[inv], s2[inv]


@register("advantage", "grpo")
@torch.no_grad()
def grpo_advantages(rewards: Tensor, group_ids: Tensor, std_normalize: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + eps), std unbiased (as verl's ``torch.std``).

    A group of one rollout has mean = its reward and std := 1 (verl's convention), so A = 0.
    rewards: Tensor[B]; group_ids: Tensor[B] -> Tensor[B] (dtype of rewards).
    """
    s, n, s2 = _group_stats(rewards, group_ids)
    mean = s / n
    adv = rewards.to(torch.float64) - mean
    if std_normalize:
        var = torch.where(n > 1, (s2 - n * mean * mean) / (n - 1).clamp(min=1), torch.ones_like(n))
        std = var.clamp(min=0).sqrt()
        adv = adv / (std + eps)
    return adv.to(rewards.dtype)


@register("advantage", "dr_grpo")
@torch.no_grad()
def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO: A_i = R_i - mean_g R (no std division). Tensor[B] -> Tensor[B]."""
    return grpo_advantages(rewards, group_ids, std_normalize=False)


@register("advantage", "rloo")
@torch.no_grad()
def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: A_i = R_i - mean_{j != i in g} R_j = n/(n-1) (R_i - mean_g R); 0 for a group of one."""
    s, n, _ = _group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    loo = torch.where(n > 1, (s - r) / (n - 1).clamp(min=1), r)
    return (r - loo).to(rewards.dtype)
