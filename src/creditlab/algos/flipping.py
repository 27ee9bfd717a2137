"""Token flipping of one update (Paper C, Algorithm 1): which tokens an update boosted, suppressed or left stable.

Δ_{i,t} = log π_after(o_{i,t} | ...) - log π_before(o_{i,t} | ...); boosted if Δ > eps, suppressed if Δ < -eps,
else stable [paper]. Pure tensor functions: the flipping analysis (``analysis.flipping``) and the verl trainer's
post-update pass (``engines.verl.ordering.flip_metrics``) both count with them.
"""

from __future__ import annotations

import torch
from torch import Tensor

CLASSES = ("boosted", "suppressed", "stable")


def classify_shift(delta: Tensor, eps: float) -> Tensor:
    """Tensor[B, T] of Δ log p -> Tensor[B, T] long: +1 boosted (Δ > eps), -1 suppressed (Δ < -eps), 0 stable."""
    return (delta > eps).long() - (delta < -eps).long()


def flip_fractions(
    delta: Tensor, mask: Tensor, adv: Tensor, eps: float, select: Tensor | None = None
) -> dict[str, dict[str, float]]:
    """Boosted / suppressed / stable fractions of the valid tokens of positive (A > 0) and negative (A < 0)
    rollouts, and of all rollouts.

    delta, mask: Tensor[B, T]; adv: Tensor[B]; select: optional Tensor[B, T] bool restricting the tokens.
    Returns {"positive"|"negative"|"all": {"boosted", "suppressed", "stable": percent, "n": tokens}}.
    """
    cls = classify_shift(delta, eps)
    valid = mask.bool() if select is None else mask.bool() & select
    rows = {"positive": adv > 0, "negative": adv < 0, "all": torch.ones_like(adv, dtype=torch.bool)}
    out: dict[str, dict[str, float]] = {}
    for name, r in rows.items():
        keep = valid & r[:, None]
        n = int(keep.sum())
        c = cls[keep]
        frac = (lambda v: 100.0 * float((c == v).sum()) / n) if n else (lambda v: float("nan"))
        out[name] = {"boosted": frac(1), "suppressed": frac(-1), "stable": frac(0), "n": n}
    return out
