"""How a rollout batch is split into PPO mini-batches (kind ``"batching"``).

A batching function takes ``group_ids: Tensor[B]`` (prompt of each rollout), the number of
mini-batches and a ``torch.Generator`` and returns a list of index tensors that partition
``range(B)``. Every rollout is used exactly once per epoch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.registry import register


@register("batching", "random")
def random_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """Shuffle rollouts, then cut into ``n_minibatches`` near-equal chunks.

    This is the usual engine behaviour (verl shuffles / load-balances rollouts across mini-batches),
    so the rollouts of one prompt generally land in different optimizer steps.
    """
    perm = torch.randperm(group_ids.numel(), generator=generator)
    return [chunk for chunk in torch.tensor_split(perm, n_minibatches) if chunk.numel()]


@register("batching", "sequential")
def sequential_minibatches(group_ids: Tensor, n_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """Rollouts in batch order (groups contiguous), cut into ``n_minibatches`` near-equal chunks."""
    idx = torch.arange(group_ids.numel())
    return [chunk for chunk in torch.tensor_split(idx, n_minibatches) if chunk.numel()]
