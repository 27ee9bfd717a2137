"""Shared input type of credit functions and the identity credit ``none``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from creditlab.algos.registry import register


@dataclass
class CreditInputs:
    """Plain tensors describing one rollout batch (B rollouts, T response positions).

    responses: Tensor[B, T] long   sampled token ids (right padded)
    mask:      Tensor[B, T] float  1 on valid response tokens
    old_logp:  Tensor[B, T]        log pi_old(o_t | q, o_<t) from the old-log-prob forward
    advantages: Tensor[B]          sequence advantages A_i
    group_ids: Tensor[B] long      prompt group of each rollout
    hidden:    Tensor[B, T, d]     final hidden states h_t (LM-head input) from the same forward, or None
    entropy:   Tensor[B, T]        entropy of pi_old at each position, or None
    ref_logp:  Tensor[B, T]        reference-model log-probs, or None
    """

    responses: Tensor
    mask: Tensor
    old_logp: Tensor
    advantages: Tensor
    group_ids: Tensor
    hidden: Tensor | None = None
    entropy: Tensor | None = None
    ref_logp: Tensor | None = None


@register("credit", "none")
def no_credit(batch: CreditInputs) -> Tensor:
    """w_{i,t} = 1 for every token: plain GRPO/DAPO. Returns Tensor[B, T]."""
    return torch.ones_like(batch.old_logp)
