"""Policy-gradient losses on per-token tensors, registered by name (kind ``"policy_loss"``).

Shapes: ``logp``, ``old_logp``, ``adv``, ``mask`` are Tensor[B, T] over response positions
(``adv`` is the per-token advantage: the sequence advantage A_i times any credit weights);
``mask`` is 1.0 on tokens that enter the loss. Each loss returns ``(loss: Tensor[], stats: dict)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.registry import register

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean", denom: float | None = None) -> Tensor:
    """Reduce a per-token loss Tensor[B, T] to a scalar.

    token-mean:          sum_{i,t} m l / sum_{i,t} m   (DAPO; ``denom`` overrides the token count, for
                         micro-batches of a mini-batch normalised by the mini-batch's token count)
    seq-mean-token-mean: mean_i (sum_t m l / sum_t m)  (GRPO)
    seq-mean-token-sum:  mean_i sum_t m l              (Dr. GRPO style, no length normalisation)
    """
    if mode == "token-mean":
        n = mask.sum() if denom is None else torch.as_tensor(denom, dtype=loss_mat.dtype)
        return (loss_mat * mask).sum() / n.clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.mean()
    if mode == "seq-mean-token-sum":
        return (loss_mat * mask).sum(-1).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; valid choices: {list(AGG_MODES)}")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@register("policy_loss", "dapo")
def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float | None = 10.0,
    agg: str = "token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO/DAPO clipped surrogate with clip-higher and dual clip (no KL term).

    r = exp(logp - old_logp);  l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    dual clip (A < 0 only):     l = min(l, -c A)      i.e. the loss is bounded by c |A|
    then aggregated with ``agg`` (DAPO: token-mean over all valid tokens of the mini-batch).
    Shapes: Tensor[B, T] each -> scalar loss; stats are python floats (clip fractions, approx KL).
    """
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clipped = torch.maximum(l1, l2)
    loss_mat = clipped
    dual = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip_c is not None:
        l3 = -adv * dual_clip_c
        dual = (adv < 0) & (clipped > l3)
        loss_mat = torch.where(adv < 0, torch.minimum(clipped, l3), clipped)
    loss = aggregate(loss_mat, mask, agg, denom)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        stats = {
            "clipfrac": _masked_mean((l2 > l1).to(m.dtype), m).item(),
            "dual_clipfrac": _masked_mean(dual.to(m.dtype), m).item(),
            "approx_kl": _masked_mean(0.5 * log_ratio.square(), m).item(),
            "ratio_mean": _masked_mean(ratio, m).item(),
        }
    return loss, stats
