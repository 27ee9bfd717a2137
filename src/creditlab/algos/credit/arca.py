"""ARCA paper (Paper D, "Adapter-Residual Credit Assignment When Token Signals Degenerate", 2026).

Token credit redistribution of a trajectory-level advantage [paper, eqs. 6-8]:

    g_w = A sum_t w_t grad log pi_theta(y_t | y_<t, x),   w_t = (a_t + eps) / sum_k (a_k + eps),

with a detached, non-negative salience a_t per token, normalised within each trajectory (sum_t w_t = 1).
Five saliences [paper, eqs. 9-15]: uniform (a = const), surprisal (-log pi_theta(y_t)), entropy
reduction (max(0, H_t - H_{t+1}), 0 for the last token), policy divergence
(|log pi_theta(y_t) - log pi_ref(y_t)|, ref = adapter disabled) and ARCA (||h_t^adapted - h_t^base||_2
on the last hidden layer, base = the same forward with the adapter disabled).

Scale [ours]. The trainer multiplies the per-token advantage by the returned weight and then
aggregates the loss (``algos.losses.aggregate``; DAPO's token-mean by default). Every function takes
``scale``:

- ``"mean1"`` (default): W_t = T w_t, with T the row's number of valid tokens, so sum_t W_t = T and
  mean_t W_t = 1. Uniform salience gives W = 1 on every valid token, i.e. exactly the engine's plain
  loss, and the other saliences redistribute the same total within each trajectory. With
  ``agg: seq-mean-token-mean`` the loss is mean_i sum_t A_i w_{i,t} l_{i,t}: the paper's objective
  (eq. 6, uniform = sequence-mean aggregation) exactly. With token-mean each trajectory's total
  credit is proportional to its length, as in the engine's plain loss.
- ``"sum1"``: W_t = w_t literally (sum_t W_t = 1); the paper's objective exactly with
  ``agg: seq-mean-token-sum``; with a token-mean loss it shrinks the update by ~1/T.

Inputs [ours]: pi_theta(y_t) is the rollout batch's old policy (``CreditInputs.old_logp``, and
``entropy`` from the same old-log-prob forward), which equals the current policy for the first
mini-batch; the paper computes the weights once per minibatch from the current policy. pi_ref /
h^base come from the reference pass (adapter disabled): ``ref_logp`` / ``base_hidden``.

eps: the paper only says "a small eps > 0"; the default 1e-6 is ours. The floor is part of the
estimator: scores far below eps give uniform weights (e.g. ARCA at LoRA init, where B = 0 makes the
residual exactly 0).

Diagnostics [paper, sec. 4.5]: weight Gini, effective-token ratio EffN/T and, for ARCA, the mean and
max adapter-residual norm (:func:`weight_diagnostics`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditlab.algos.credit.base import run_in_memory
from creditlab.algos.registry import register

SCALES = ("mean1", "sum1")
EPS = 1e-6
"""Default normalisation floor eps [ours; the paper: "a small eps > 0"]."""


# ---------------------------------------------------------------------------------------------------
# normalisation and concentration measures


def _float(x: Tensor) -> Tensor:
    """x in at least float32 (hidden states / log-probs may come from a bf16 autocast forward)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def normalize_within_trajectory(scores: Tensor, mask: Tensor, eps: float) -> Tensor:
    """w_t = (a_t + eps) / sum_k (a_k + eps), the sum over the valid tokens of each row [paper, eq. 8].

    scores (a_t >= 0), mask: Tensor[B, T] -> Tensor[B, T] (float32 or wider); each row with a valid
    token sums to 1. Padding gets 0 whatever its score (NaN/inf included). A row whose denominator is 0
    (no valid token; or eps = 0 with all-zero scores) is all zeros, never NaN [ours].
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    s = _float(scores)
    valid = mask > 0
    num = torch.where(valid, s + eps, torch.zeros_like(s))
    den = num.sum(-1, keepdim=True)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def gini(w: Tensor, mask: Tensor) -> Tensor:
    """Gini coefficient of each row's valid weights: Tensor[B, T], mask Tensor[B, T] -> Tensor[B].

    Standard sorted form: with x_(1) <= ... <= x_(n) the n valid values of the row (x >= 0),
        G = sum_i (2 i - n - 1) x_(i) / (n sum_i x_i),
    equal to the mean-absolute-difference form sum_i sum_j |x_i - x_j| / (2 n^2 mean x). Uniform -> 0,
    one-hot -> 1 - 1/n. Scale invariant (the "sum1" and "mean1" weights give the same G). A row with no
    valid token or all-zero weights gives 0 [ours].
    """
    x = _float(w)
    valid = mask > 0
    n = valid.sum(-1)
    # padding sorts last (+inf); the first n sorted entries are the row's valid values in ascending order
    xs = torch.where(valid, x, torch.full_like(x, float("inf"))).sort(-1).values
    rank = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype).expand_as(x)
    in_row = rank <= n.unsqueeze(-1)
    xs = torch.where(in_row, xs, torch.zeros_like(xs))
    coef = torch.where(in_row, 2 * rank - n.unsqueeze(-1).to(x.dtype) - 1, torch.zeros_like(xs))
    num = (coef * xs).sum(-1)
    den = n.to(x.dtype) * xs.sum(-1)
    g = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))
    return g.clamp(min=0.0)  # in [0, 1) for non-negative values: a uniform row's rounding (-1e-9) reads 0


def effective_token_ratio(w: Tensor, mask: Tensor) -> Tensor:
    """EffN/T = 1 / (T sum_t p_t^2), p = w / sum_t w over the row's T valid tokens [paper, sec. 3.4].

    Equivalently (sum_t w_t)^2 / (T sum_t w_t^2), so it is scale invariant. Uniform -> 1, one-hot ->
    1/T. w, mask: Tensor[B, T] -> Tensor[B]; a row with no valid token or all-zero weights gives 0 [ours].
    """
    x = _float(w)
    valid = mask > 0
    x = torch.where(valid, x, torch.zeros_like(x))
    n = valid.sum(-1).to(x.dtype)
    num = x.sum(-1) ** 2
    den = n * (x * x).sum(-1)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def adapter_residual_norm(hidden: Tensor, base_hidden: Tensor) -> Tensor:
    """ARCA salience a_t = ||h_t^adapted - h_t^base||_2 [paper, eq. 15].

    hidden, base_hidden: Tensor[B, T, d] (last hidden layer, adapter enabled / disabled) -> Tensor[B, T]
    (float32 or wider, detached).
    """
    if hidden is None or base_hidden is None:
        raise ValueError(
            "ARCA needs both `hidden` (adapter enabled) and `base_hidden` (the same forward with "
            "the LoRA adapter disabled, i.e. the reference pass); the engine did not provide "
            f"{'hidden' if hidden is None else 'base_hidden'}"
        )
    if hidden.shape != base_hidden.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and base_hidden {tuple(base_hidden.shape)} differ in shape")
    return torch.linalg.vector_norm(_float(hidden.detach()) - _float(base_hidden.detach()), dim=-1)


def weight_diagnostics(w: Tensor, mask: Tensor, residual: Tensor | None = None) -> dict[str, float]:
    """Per-step credit diagnostics of the paper (sec. 4.5): weight Gini, EffN/T, ARCA residual mean/max.

    w, mask: Tensor[B, T] (any positive scale: both measures are scale invariant); residual: the raw
    ARCA saliences a_t (Tensor[B, T], :func:`adapter_residual_norm`) or None. Returns
    ``weight_gini`` and ``eff_token_ratio`` (means over the rows that have a valid token) and, with
    ``residual``, ``arca_residual_mean`` / ``arca_residual_max`` over all valid tokens of the batch.
    A batch with no valid token gives NaN [ours].
    """
    rows = (mask > 0).any(-1)
    nan = float("nan")
    out = {
        "weight_gini": gini(w, mask)[rows].mean().item() if rows.any() else nan,
        "eff_token_ratio": effective_token_ratio(w, mask)[rows].mean().item() if rows.any() else nan,
    }
    if residual is not None:
        vals = _float(residual)[mask > 0]
        out["arca_residual_mean"] = vals.mean().item() if vals.numel() else nan
        out["arca_residual_max"] = vals.max().item() if vals.numel() else nan
    return out


def _scaled(scores: Tensor, mask: Tensor, eps: float, scale: str) -> Tensor:
    """normalize_within_trajectory, then the ``scale`` convention (module docstring): Tensor[B, T]."""
    if scale not in SCALES:
        raise ValueError(f"unknown ARCA weight scale {scale!r}; valid choices: {list(SCALES)}")
    w = normalize_within_trajectory(scores, mask, eps)
    if scale == "mean1":
        w = w * (mask > 0).sum(-1, keepdim=True).to(w.dtype)
    return w


# ---------------------------------------------------------------------------------------------------
# the five weightings (kind "credit")


@register("credit", "arca_uniform")
@torch.no_grad()
def arca_uniform_weights(mask: Tensor, eps: float = EPS, scale: str = "mean1") -> Tensor:
    """Uniform baseline [paper, eq. 9]: a_t = const (1), w_t = 1/T.

    mask: Tensor[B, T] -> Tensor[B, T]; "mean1": 1 on valid tokens (the engine's plain loss), "sum1":
    1/T. eps is accepted for a uniform config surface; it has no effect here.
    """
    return _scaled(torch.ones_like(_float(mask)), mask, eps, scale)


@register("credit", "arca_surprisal")
@torch.no_grad()
def arca_surprisal_weights(old_logp: Tensor, mask: Tensor, eps: float = EPS, scale: str = "mean1") -> Tensor:
    """Surprisal [paper, eq. 10]: a_t = -log pi_theta(y_t | y_<t, x), then eq. 8.

    pi_theta = the old policy (``old_logp``) [ours, see module docstring]; a_t clamped at 0 against
    rounding (log-probs from a bf16 forward can read slightly above 0) [ours].
    old_logp, mask: Tensor[B, T] -> Tensor[B, T].
    """
    return _scaled((-_float(old_logp)).clamp(min=0.0), mask, eps, scale)


@register("credit", "arca_entropy_reduction")
@torch.no_grad()
def arca_entropy_reduction_weights(entropy: Tensor, mask: Tensor, eps: float = EPS, scale: str = "mean1") -> Tensor:
    """Entropy reduction [paper, eqs. 11-13]: a_t = max(0, H_t - H_{t+1}), a_T = 0, then eq. 8.

    H_t = entropy of the predictive distribution from which y_t was sampled (``entropy``, the old
    policy's [ours]). "Last token" [ours]: a valid token whose next position is padding (right-padded
    responses: the row's last valid token). entropy, mask: Tensor[B, T] -> Tensor[B, T].
    """
    h = _float(entropy)
    valid = mask > 0
    a = torch.zeros_like(h)
    has_next = valid[:, :-1] & valid[:, 1:]
    drop = (h[:, :-1] - h[:, 1:]).clamp(min=0.0)
    a[:, :-1] = torch.where(has_next, drop, torch.zeros_like(drop))
    return _scaled(a, mask, eps, scale)


@register("credit", "arca_divergence")
@torch.no_grad()
def arca_divergence_weights(
    old_logp: Tensor, ref_logp: Tensor, mask: Tensor, eps: float = EPS, scale: str = "mean1"
) -> Tensor:
    """Policy divergence [paper, eq. 14]: a_t = |log pi_theta(y_t) - log pi_ref(y_t)|, then eq. 8.

    pi_theta = the old policy (``old_logp``) [ours]; pi_ref = the same model with the LoRA adapter
    disabled (``ref_logp``) [paper]. old_logp, ref_logp, mask: Tensor[B, T] -> Tensor[B, T].
    """
    return _scaled((_float(old_logp) - _float(ref_logp)).abs(), mask, eps, scale)


class ArcaCredit:
    """The streamed form of :func:`arca_weights` (``arca_weights.stream``, ``algos.credit.base.credit_stream``): one
    pass; :meth:`update` reads a micro-batch's hidden, base_hidden Tensor[B_mb, T, d] and mask Tensor[B_mb, T] and
    returns its saliences a_t (eq. 15; 0 on padding), :meth:`finish` normalises the whole batch's Tensor[B, T] within
    each trajectory (eq. 8 and ``scale``). Only a_t (a scalar per token) outlives its micro-batch."""

    def __init__(self, eps: float = EPS, scale: str = "mean1"):
        if scale not in SCALES:
            raise ValueError(f"unknown ARCA weight scale {scale!r}; valid choices: {list(SCALES)}")
        self.eps, self.scale, self.done = eps, scale, False

    def update(self, hidden: Tensor, base_hidden: Tensor, mask: Tensor) -> Tensor:
        return adapter_residual_norm(hidden, base_hidden) * (mask > 0)

    def end_pass(self) -> None:
        self.done = True

    def finish(self, values: Tensor, mask: Tensor) -> Tensor:
        return _scaled(values, mask, self.eps, self.scale)


@register("credit", "arca")
@torch.no_grad()
def arca_weights(hidden: Tensor, base_hidden: Tensor, mask: Tensor, eps: float = EPS, scale: str = "mean1") -> Tensor:
    """ARCA [paper, eq. 15]: a_t = ||h_t^adapted - h_t^base||_2 on the last hidden layer, then eq. 8.

    h^adapted = ``hidden`` (the old-log-prob forward, adapter enabled); h^base = ``base_hidden`` (the
    same forward with the adapter disabled: the reference pass, no extra forward) [paper].
    hidden, base_hidden: Tensor[B, T, d]; mask: Tensor[B, T] -> Tensor[B, T]. Both are required:
    ``apply_credit`` (and a direct call with None) raises a ValueError naming the missing one.
    The whole batch as one micro-batch of :class:`ArcaCredit` (the verl workers stream it).
    """
    return run_in_memory(ArcaCredit(eps, scale), dict(hidden=hidden, base_hidden=base_hidden, mask=mask))


arca_weights.stream = ArcaCredit
