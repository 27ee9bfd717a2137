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
        w, fkl = fipo_weights(
            logp,
            old_logp,
            adv,
            mask,
            dual_clip_c=dual_clip_c,
            decay_halflife=decay_halflife,
            w_min=w_min,
            w_max=w_max,
            safety_thresh=safety_thresh,
            neg_w_range=neg_w_range,
        )
        ratio = (logp - old_logp).clamp(-20.0, 20.0).float().exp()
        neg_high = (adv < 0) & (ratio > safety_thresh)
        at_dual = (adv < 0) & (ratio > dual_clip_c) & valid
        if max_dual_clip_tokens is None:
            drop = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
        else:
            drop = at_dual.sum(-1) > max_dual_clip_tokens
        keep_mask = mask * (~drop).to(mask.dtype)[:, None]
    loss, stats = dapo_loss(
        logp,
        old_logp,
        adv * w,
        keep_mask,
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip_c=dual_clip_c,
        agg=agg,
        denom=denom,
    )
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


# ------------------------------------------------------------------------------------------------
# Paper E (DFPO, "token gradient cancellation"): GSPO, GRPO-fix and DFPO. Only the paper's abstract
# is public; every choice marked [ours] below is a reading, kept configurable (SPEC.md "Paper E").
# The shared group pieces and the cancellation diagnostic live in algos/cancellation.py.
# GRPO itself needs no code: configs/method/grpo.yaml is ``dapo_loss`` with eps 0.2 / 0.2, no dual
# clip and seq-mean-token-mean.

from creditlab.algos.cancellation import (  # noqa: E402
    TRANSFORMS,
    group_coefficients,
    shared_tokens,
    within_group_transform,
)

DFPO_WEIGHTS = ("seq_ratio", "token_mean")


def aggregation_row_weights(mask: Tensor, agg: str = "token-mean", denom: float | None = None) -> Tensor:
    """Per-rollout normaliser n_i of ``aggregate``: d aggregate(l, mask, agg, denom) / d l_{i,t} = n_i m_{i,t}.

    Read from ``aggregate`` itself by autograd (so it cannot drift from it): token-mean 1/sum m (or
    1/denom), seq-mean-token-mean 1/(B L_i), seq-mean-token-sum 1/B; 0 for a row with no valid token.
    mask: Tensor[B, T] -> Tensor[B] (dtype: mask's, at least float32).
    """
    dt = torch.promote_types(mask.dtype, torch.float32)
    m = mask.detach().to(dt)
    with torch.enable_grad():
        x = torch.zeros(m.shape, dtype=dt, device=m.device, requires_grad=True)
        (d,) = torch.autograd.grad(aggregate(x, m, agg, denom), x)
    tot = m.sum(-1)
    return torch.where(tot > 0, d.sum(-1) / torch.where(tot > 0, tot, torch.ones_like(tot)), torch.zeros_like(tot))


def gspo_seq_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log s_i = mean_{t valid} clamp(logp - old_logp, -20, 20): GSPO's length-normalised sequence log-ratio.

    s_i = exp(log s_i) is the geometric mean of the token ratios. Tensor[B, T] each -> Tensor[B]
    (0 for a row with no valid token); differentiable if ``logp`` is.
    """
    m = mask.to(torch.promote_types(logp.dtype, mask.dtype))
    lr = (logp - old_logp).clamp(-20.0, 20.0)
    return (lr * m).sum(-1) / m.sum(-1).clamp(min=1)


@register("policy_loss", "gspo")
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_log_ratio: float = 10.0,
    agg: str = "seq-mean-token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (Group Sequence Policy Optimization, arXiv:2507.18071), token-level form ("GSPO-token").

    log s_i   = mean_{t valid} log r_{i,t}             (s_i: geometric mean of the token ratios)
    s_{i,t}   = sg[s_i] * exp(logp_{i,t} - sg[logp_{i,t}])   value s_i, d s_{i,t} / d logp_{i,t} = s_i
                (log s_{i,t} clamped at ``max_log_ratio`` = 10 as verl's ``loss_mode=gspo``)
    l_{i,t}   = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t})
    aggregated with ``agg`` (GSPO: seq-mean-token-mean), clip 3e-4 / 4e-4, no dual clip, no KL.
    Implemented as ``dapo_loss`` on the log-ratio log s_{i,t} (old log-prob 0, dual clip off), so the
    per-token gradient is -A_{i,t} s_i 1[s_i inside the trust region on A's side] n_i (n_i: the
    aggregation normaliser, 1/(B L_i)): one weight per rollout, but not constant within a group.
    Shapes: Tensor[B, T] each -> scalar loss; stats: clipfrac (token-weighted fraction of clipped
    sequences), seq_clipfrac (fraction of non-empty rollouts clipped), seq_ratio_mean, and the
    token-level approx_kl / ratio_mean (as the other losses).
    """
    seq_lr = gspo_seq_log_ratio(logp.detach(), old_logp, mask)
    log_s_tok = (seq_lr[:, None] + logp - logp.detach()).clamp(max=max_log_ratio)
    loss, stats = dapo_loss(
        log_s_tok,
        torch.zeros_like(log_s_tok),
        adv,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip_c=None,
        agg=agg,
        denom=denom,
    )
    with torch.no_grad():
        m = mask.to(logp.dtype)
        log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
        nonempty = m.sum(-1) > 0
        s = seq_lr.clamp(max=max_log_ratio).exp()
        a = (adv * m).sum(-1) / m.sum(-1).clamp(min=1)
        seq_clip = ((a > 0) & (s > 1 + eps_high)) | ((a < 0) & (s < 1 - eps_low))
        n = nonempty.sum().clamp(min=1)
        stats |= {
            "seq_clipfrac": ((seq_clip & nonempty).sum() / n).item(),
            "seq_ratio_mean": ((s * nonempty).sum() / n).item(),
            "approx_kl": _masked_mean(0.5 * log_ratio.square(), m).item(),
            "ratio_mean": _masked_mean(log_ratio.exp(), m).item(),
        }
    return loss, stats


def _need_responses(name: str, responses: Tensor | None, logp: Tensor) -> Tensor:
    if responses is None:
        raise ValueError(
            f"policy loss {name!r} needs responses (Tensor[B, T], the token ids of the mini-batch's "
            "rollouts: its shared tokens are token ids); the engines pass them to losses whose "
            "signature names `responses`"
        )
    if responses.shape != logp.shape:
        raise ValueError(f"responses has shape {tuple(responses.shape)}, expected {tuple(logp.shape)}")
    return responses.to(logp.device)


def _need_group_ids(name: str, group_ids: Tensor | None, logp: Tensor) -> Tensor:
    if group_ids is None:
        raise ValueError(
            f"policy loss {name!r} needs group_ids (Tensor[B], the prompt group of each rollout of the "
            "mini-batch); the engine passes them to losses whose signature names `group_ids`"
        )
    if group_ids.shape != logp.shape[:1]:
        raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, expected ({logp.shape[0]},)")
    return group_ids.to(logp.device)


@torch.no_grad()
def grpo_pruned(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> Tensor:
    """Tokens whose gradient ``dapo_loss`` zeroes by clipping (Tensor[B, T] bool, valid tokens only).

    With r = exp(clamp(logp - old_logp, -20, 20)): the min-clip prunes A > 0 where r > 1 + eps_high
    and A < 0 where r < 1 - eps_low (the side depends on the sign of A: the asymmetry Paper E
    names); the dual clip (if c is set) prunes A < 0 where the loss is capped at -c A.
    """
    ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    pruned = l2 > l1
    if dual_clip_c is not None:
        pruned = pruned | ((adv < 0) & (torch.maximum(l1, l2) > -adv * dual_clip_c))
    return pruned & (mask > 0)


@register("policy_loss", "grpo_fix")
def grpo_fix_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    responses: Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
    agg: str = "seq-mean-token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO-fix (Paper E): GRPO whose clip mask is applied symmetrically to each shared token of a group [ours].

    GRPO (``dapo_loss`` with eps 0.2 / 0.2, no dual clip, seq-mean-token-mean) zeroes the gradient of
    token (i, t) when its ratio leaves the trust region on the side that matters for the sign of
    A_{i,t} (``grpo_pruned``: p_{i,t}). A token id that rollouts of one group share (the same token, in
    positive and negative rollouts) is then pruned in the positive rollouts and trained in the negative
    ones or vice versa, and its gradient no longer cancels. GRPO-fix [ours] makes the clip mask
    symmetric over every shared token (``cancellation.shared_tokens``: the (group g, token id v) pairs
    with v in >= 2 rollouts of g, any position; the one definition the cancellation diagnostic uses):
        P_{g,v} = OR_{j in g, t valid in j, o_{j,t} = v} p_{j,t}      (v pruned somewhere in the group)
        P_{i,t} = P_{g(i), o_{i,t}}  if (g(i), o_{i,t}) is shared,  else p_{i,t}
    and token (i, t) is trained iff not P_{i,t}: a shared token id is trained at all its occurrences in
    the group or at none, so its net coefficient is GRPO's unclipped one or 0 (never one sign's share of
    it); a token id in one rollout only keeps GRPO's own clip. A token with P = 1 keeps its loss value
    and its place in the normaliser (its logp is detached, as a clipped token's gradient is 0 in GRPO);
    every other token is GRPO's unclipped term (P contains p, so its own min-clip is inactive). Hence with
    ratio 1 on the trained tokens, equal lengths (or token-mean) and the same multiset of tokens in every
    rollout of a group, the group gradient of every token id cancels exactly. The dual clip, if set, prunes
    too. Only rollouts present in the mini-batch vote (``group_ids`` of the mini-batch); keep groups whole
    (``trainer.batching=sequential``, mini-batch size a multiple of G) for the group reading.
    Shapes: Tensor[B, T] each, group_ids Tensor[B] and responses Tensor[B, T] (token ids) required -> scalar
    loss; stats: ``dapo_loss``'s (clipfrac is GRPO's own) plus grpo_fix_pruned_frac (valid tokens with
    P = 1) and grpo_fix_shared_frac (valid tokens that are shared).
    """
    group_ids = _need_group_ids("grpo_fix", group_ids, logp)
    responses = _need_responses("grpo_fix", responses, logp)
    with torch.no_grad():
        pruned = grpo_pruned(logp, old_logp, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)
        st = shared_tokens(responses, mask, group_ids)
        valid = mask > 0
        key_pruned = (
            torch.zeros(st.key_group.numel(), dtype=torch.long, device=logp.device).index_add_(
                0, st.key[valid], pruned[valid].long()
            )
            > 0
        )
        common = pruned | (st.shared & key_pruned[st.key.clamp(min=0)])
    logp_fix = torch.where(common, logp.detach(), logp)
    loss, stats = dapo_loss(
        logp_fix, old_logp, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c, agg=agg, denom=denom
    )
    with torch.no_grad():
        stats["grpo_fix_pruned_frac"] = _masked_mean(common.float(), mask.float()).item()
        stats["grpo_fix_shared_frac"] = _masked_mean(st.shared.float(), mask.float()).item()
    return loss, stats


@torch.no_grad()
def dfpo_weights(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    weight: str = "seq_ratio",
    transform: str = "project",
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_log_ratio: float = 10.0,
    norm_in_weight: bool = True,
    agg: str = "seq-mean-token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DFPO's per-rollout gradient coefficient c_i (no gradient); the equations are in ``dfpo_loss``.

    Tensor[B, T] each, group_ids Tensor[B] -> (c: Tensor[B], parts: dict of Tensor[B]: adv (A_i),
    rho, w (before the transform), w_t (after), clipped (rollout clipped / token clip fraction), active).
    """
    if weight not in DFPO_WEIGHTS:
        raise ValueError(f"unknown DFPO weight {weight!r}; valid choices: {list(DFPO_WEIGHTS)}")
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown DFPO transform {transform!r}; valid choices: {list(TRANSFORMS)}")
    dt = torch.promote_types(torch.promote_types(logp.dtype, adv.dtype), torch.float32)
    m = mask.to(dt)
    L = m.sum(-1)
    active = L > 0
    a = (adv.to(dt) * m).sum(-1) / L.clamp(min=1)
    if weight == "seq_ratio":
        ls = gspo_seq_log_ratio(logp.to(dt), old_logp.to(dt), m)
        s = ls.clamp(max=max_log_ratio).exp()
        clipped = ((a > 0) & (s > 1 + eps_high)) | ((a < 0) & (s < 1 - eps_low)) | (ls > max_log_ratio)
        rho = torch.where(clipped, torch.zeros_like(s), s)
        clipped = clipped.to(dt)
    else:
        r = (logp.to(dt) - old_logp.to(dt)).clamp(-20.0, 20.0).exp()
        tok_clip = ((adv > 0) & (r > 1 + eps_high)) | ((adv < 0) & (r < 1 - eps_low))
        rho = (torch.where(tok_clip, torch.zeros_like(r), r) * m).sum(-1) / L.clamp(min=1)
        clipped = (tok_clip.to(dt) * m).sum(-1) / L.clamp(min=1)
    n = aggregation_row_weights(m, agg, denom).to(dt)
    gid = group_ids.to(logp.device)
    if norm_in_weight:
        w = n * rho
        w_t = within_group_transform(w, a, gid, transform, active)
        c = w_t
    else:
        w = rho
        w_t = within_group_transform(w, a, gid, transform, active)
        c = n * w_t
    c = torch.where(active, c, torch.zeros_like(c))
    return c, {"adv": a, "rho": rho, "w": w, "w_t": w_t, "clipped": clipped, "active": active}


@register("policy_loss", "dfpo")
def dfpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    weight: str = "seq_ratio",
    transform: str = "project",
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_log_ratio: float = 10.0,
    norm_in_weight: bool = True,
    agg: str = "seq-mean-token-mean",
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """DFPO (Paper E): a stop-gradient within-group transform of the rollout weights [ours throughout].

    Per rollout, without gradient (A_i = mean of adv over the rollout's valid tokens: the sequence
    advantage when no credit weights are used):
      rho_i  (``weight``)
        seq_ratio  (default): s_i 1[s_i inside the trust region on A_i's side], s_i = exp(mean_t log r_{i,t})
                   (GSPO's sequence ratio and clip, eps 3e-4 / 4e-4; also 0 where log s_i > max_log_ratio,
                   as GSPO's clamp), so with ``transform: none`` the gradient is exactly ``gspo_loss``'s;
        token_mean: mean_{t valid} r_{i,t} 1[token not min-clipped]  (GRPO's per-token weight averaged
                   over the rollout; use eps 0.2 / 0.2 with it).
      n_i    the normaliser ``aggregate`` applies to row i with ``agg`` (``aggregation_row_weights``;
             seq-mean-token-mean: 1/(B L_i)).
      w_i    = n_i rho_i     (``norm_in_weight: true``, default: the normaliser is part of the weight,
             because a per-rollout 1/L_i is itself a non-constant weight and the real gradient only
             cancels if it is transformed too; ``false`` transforms rho_i and multiplies by n_i after,
             which cancels only for equal n_i).
      w~     = within-group transform (``transform``; ``cancellation.within_group_transform``):
        project  (default): w~ = w - (A.w / ||A||^2) A per group (sum_i A_i w~_i = 0 for any A;
                 groups with ||A|| = 0 unchanged);
        min_replace: w~_i = min_{j in g} w_j (sum_i A_i w~_i = 0 when the group's A sum to 0: keep
                 groups whole in a mini-batch, ``trainer.batching=sequential``);
        none:    w~ = w (ablation).
    Loss (gradient through logp only):
        L = -sum_{i,t} m_{i,t} A_{i,t} w~_i exp(logp_{i,t} - sg[logp_{i,t}])
    i.e. d L / d logp_{i,t} = -A_{i,t} w~_i: constant along the rollout, so a token every rollout of
    the group emits equally often gets n_v (-sum_i A_i w~_i) = 0 with sequence advantages. The loss
    value is -sum_i A_i w~_i L_i (seq-mean-token-mean, no transform: -(1/B) sum_i A_i rho_i).
    Rows with no valid token get no weight and do not vote in a group's min.
    Shapes: Tensor[B, T] each, group_ids Tensor[B] (required) -> scalar loss; stats: dfpo_rho_mean,
    dfpo_clipfrac (rollouts clipped / token clip fraction), dfpo_cancel_rel_before / _after
    (sum_g |sum_i A_i w_i| / sum_g sum_i |A_i w_i|, before / after the transform, on the gradient's
    weights), dfpo_neg_weight_frac (rows with w~ < 0), dfpo_weight_ratio (sum w~ / sum w; 1 when sum w = 0), approx_kl,
    ratio_mean (token level).
    """
    group_ids = _need_group_ids("dfpo", group_ids, logp)
    c, parts = dfpo_weights(
        logp,
        old_logp,
        adv,
        mask,
        group_ids,
        weight=weight,
        transform=transform,
        eps_low=eps_low,
        eps_high=eps_high,
        max_log_ratio=max_log_ratio,
        norm_in_weight=norm_in_weight,
        agg=agg,
        denom=denom,
    )
    e = torch.exp(logp - logp.detach())
    loss = -(adv * c.to(adv.dtype)[:, None] * e * mask).sum()
    with torch.no_grad():
        m = mask.to(logp.dtype)
        act = parts["active"]
        k = act.sum().clamp(min=1)
        n = aggregation_row_weights(m, agg, denom).to(c.dtype)
        g_before = parts["w"] * (1 if norm_in_weight else n)
        a = parts["adv"]

        def _cancel_rel(wv: Tensor) -> float:
            den = (a * wv).abs().sum()
            return (group_coefficients(a, wv, group_ids).abs().sum() / den).item() if den > 0 else 0.0

        log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
        wsum = g_before[act].sum()
        stats = {
            "dfpo_rho_mean": (parts["rho"][act].sum() / k).item(),
            "dfpo_clipfrac": (parts["clipped"][act].sum() / k).item(),
            "dfpo_cancel_rel_before": _cancel_rel(g_before),
            "dfpo_cancel_rel_after": _cancel_rel(c),
            "dfpo_neg_weight_frac": ((c < 0) & act).sum().item() / max(int(act.sum()), 1),
            "dfpo_weight_ratio": (c[act].sum() / wsum).item() if wsum != 0 else 1.0,
            "approx_kl": _masked_mean(0.5 * log_ratio.square(), m).item(),
            "ratio_mean": _masked_mean(log_ratio.exp(), m).item(),
        }
    return loss, stats
