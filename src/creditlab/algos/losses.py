"""Policy-gradient losses on per-token tensors, registered by name (kind ``"policy_loss"``).

Shapes: ``logp``, ``old_logp``, ``adv``, ``mask`` are Tensor[B, T] over response positions
(``adv`` is the per-token advantage: the sequence advantage A_i times any credit weights);
``mask`` is 1.0 on tokens that enter the loss. Each loss returns ``(loss: Tensor[], stats: dict)``.
"""

from __future__ import annotations

import math

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


@register("policy_loss", "sapo")
def sapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: str = "seq-mean-token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347): a soft gate instead of clipping.

    r = exp(clamp(logp - old_logp, -20, 20));  tau = tau_pos if A > 0 else tau_neg  (per token)
    f(r) = sigmoid(tau (r - 1)) * 4 / tau;      l = -f(r) A      (no clipping, no dual clip, no KL)
    then aggregated with ``agg`` (SAPO / verl ``loss_mode=sapo``: seq-mean-token-mean; ``denom``
    only affects token-mean, as in ``dapo_loss``).
    At r = 1 the gradient is the plain policy gradient: d l / d logp = -A * 4/tau * tau * sigmoid'(0) = -A.
    Shapes: Tensor[B, T] each -> scalar loss; stats are python floats (mean gate, ratio, approx KL).
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss_mat = -gate * adv
    loss = aggregate(loss_mat, mask, agg, denom)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        stats = {
            "sapo_gate_mean": _masked_mean(gate, m).item(),
            "approx_kl": _masked_mean(0.5 * log_ratio.square(), m).item(),
            "ratio_mean": _masked_mean(ratio, m).item(),
        }
    return loss, stats


def discounted_future_sum(x: Tensor, gamma: float, chunk: int = 256) -> Tensor:
    """Reverse discounted cumulative sum along the last dim: y_t = sum_{k >= t} gamma^{k-t} x_k.

    x: Tensor[B, T] -> Tensor[B, T]. Blocks of ``chunk`` positions are done with one C x C decay
    matrix (C = min(chunk, T)), blocks are chained right to left through the carry y_{end} (one
    loop step per block, none over B): O(B T C) work, O(C^2 + B T) memory.
    """
    B, T = x.shape
    if T == 0:
        return x.clone()
    C = min(chunk, T)
    idx = torch.arange(C, device=x.device)
    dist = (idx[None, :] - idx[:, None]).to(x.dtype)  # [j, k] = k - j
    g = torch.as_tensor(gamma, dtype=x.dtype, device=x.device)
    decay = torch.where(dist >= 0, g.pow(dist.clamp(min=0)), torch.zeros_like(dist))
    out = torch.empty_like(x)
    carry = torch.zeros(B, dtype=x.dtype, device=x.device)
    for start in reversed(range(0, T, C)):
        end = min(start + C, T)
        n = end - start
        y = x[:, start:end] @ decay[:n, :n].T + carry[:, None] * g.pow((n - idx[:n]).to(x.dtype))
        out[:, start:end] = y
        carry = y[:, 0]
    return out


@torch.no_grad()
def fipo_weights(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    dual_clip_c: float = 10.0,
    decay_halflife: float = 32.0,
    w_min: float = 1.0,
    w_max: float = 1.2,
    safety_thresh: float = 10.0,
    neg_w_range: tuple[float, float] | list[float] = (0.8, 1.0),
) -> tuple[Tensor, Tensor]:
    """FIPO influence weights (no gradient); the equations are in ``fipo_loss``'s docstring.

    logp, old_logp, adv, mask: Tensor[B, T] -> (w: Tensor[B, T] in adv's dtype, FutureKL: Tensor[B, T] (>= fp32)).
    """
    lo_neg, hi_neg = neg_w_range
    delta = (logp - old_logp).clamp(-20.0, 20.0)
    delta = delta.to(torch.promote_types(delta.dtype, torch.float32))  # bf16 -> fp32, fp64 stays
    part = ((mask > 0) & (delta <= math.log(dual_clip_c))).float()
    fkl = discounted_future_sum(part * delta, 2.0 ** (-1.0 / decay_halflife))
    w = fkl.exp().clamp(w_min, w_max)
    w = torch.where((adv < 0) & (delta.exp() > safety_thresh), w.clamp(lo_neg, hi_neg), w)
    return w.to(adv.dtype), fkl


@register("policy_loss", "fipo")
def fipo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float = 10.0,
    decay_halflife: float = 32.0,
    w_min: float = 1.0,
    w_max: float = 1.2,
    safety_thresh: float = 10.0,
    neg_w_range: tuple[float, float] | list[float] = (0.8, 1.0),
    max_dual_clip_tokens: int | None = 1,
    agg: str = "token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """FIPO (Future-KL Influenced Policy Optimization, arXiv:2603.19835): DAPO with future-KL weights.

    All weights are computed without gradient from the current/old log-ratio of the mini-batch:
      delta_t   = clamp(logp_t - old_logp_t, -20, 20),  r_t = exp(delta_t)
      m_t       = mask_t * 1[delta_t <= log c]          (c = dual_clip_c: high-ratio tokens excluded)
      FutureKL_t = sum_{k >= t} g^{k-t} m_k delta_k,     g = 2^(-1 / decay_halflife)
      w_t       = clip(exp(FutureKL_t), w_min, w_max)   (official default: high-only [1, 1.2])
      if A_t < 0 and r_t > safety_thresh:  w_t <- clamp(w_t, *neg_w_range)   ([0.8, 1.0]; threshold
                                            10 = c, as in the official 32B script)
      A~ = A w, then ``dapo_loss`` (clip-higher + dual clip c) on A~.
    Response drop: a response with more than ``max_dual_clip_tokens`` (1) valid tokens where the dual
    clip is active (A < 0 and r > c, for c > 1 + eps_high) is dropped: its mask row is zeroed before
    aggregation, so with token-mean it is excluded from the normaliser too (as the official code,
    which zeroes it in the aggregation mask) [ours: with ``denom`` given the trainer's normaliser is
    kept as passed; with seq-mean-* modes a dropped row contributes 0 and still counts in the mean
    over B]. ``max_dual_clip_tokens=None`` disables the drop.
    At r = 1 everywhere (first mini-batch) w = 1 (for w_min <= 1), nothing is dropped and the loss
    is exactly ``dapo_loss``. FutureKL is a chunked reverse discounted sum (``discounted_future_sum``).
    Shapes: Tensor[B, T] each -> scalar loss; stats: ``dapo_loss``'s (over the kept tokens) plus
    fipo_weight_mean, fipo_weight_at_max_frac, fipo_future_kl_mean, fipo_neg_capped_frac
    (token fractions over valid tokens) and fipo_dropped_frac (dropped / non-empty responses).
    """
    if dual_clip_c is None or dual_clip_c <= 1.0 + eps_high:
        raise ValueError(f"FIPO needs a dual-clip bound c > 1 + eps_high, got dual_clip_c={dual_clip_c}")
    with torch.no_grad():
        valid = mask > 0
        w, fkl = fipo_weights(logp, old_logp, adv, mask, dual_clip_c=dual_clip_c, decay_halflife=decay_halflife,
                              w_min=w_min, w_max=w_max, safety_thresh=safety_thresh, neg_w_range=neg_w_range)
        ratio = (logp - old_logp).clamp(-20.0, 20.0).float().exp()
        neg_high = (adv < 0) & (ratio > safety_thresh)
        at_dual = (adv < 0) & (ratio > dual_clip_c) & valid
        if max_dual_clip_tokens is None:
            drop = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
        else:
            drop = at_dual.sum(-1) > max_dual_clip_tokens
        keep_mask = mask * (~drop).to(mask.dtype)[:, None]
    loss, stats = dapo_loss(logp, old_logp, adv * w, keep_mask, eps_low=eps_low, eps_high=eps_high,
                            dual_clip_c=dual_clip_c, agg=agg, denom=denom)
    with torch.no_grad():
        m = valid.to(torch.float32)
        nonempty = valid.any(-1)
        stats |= {
            "fipo_weight_mean": _masked_mean(w.float(), m).item(),
            "fipo_weight_at_max_frac": _masked_mean((w >= w_max).float(), m).item(),
            "fipo_future_kl_mean": _masked_mean(fkl.float(), m).item(),
            "fipo_neg_capped_frac": _masked_mean(neg_high.float(), m).item(),
            "fipo_dropped_frac": ((drop & nonempty).sum() / nonempty.sum().clamp(min=1)).item(),
        }
    return loss, stats
