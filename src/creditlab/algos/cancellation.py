"""Token gradient cancellation within a group (Paper E, DFPO): group transforms and the residual diagnostic.

Reading [ours; the paper has no public code, SPEC.md "Paper E"]. For a policy loss L, write the
gradient coefficient of each generated token ``g_{i,t} = dL / d logp_{i,t}``. A direction shared
by the rollouts of one group (a *shared token*: the same token id in several rollouts of the group, at
any position; ``shared_tokens``, the one definition GRPO-fix and the diagnostic use) receives
``sum_i sum_{t: o_{i,t} = v} g_{i,t}``. For a critic-free PG loss ``g_{i,t} = -A_i w_i``, where
``w_i`` is the rollout's effective multiplicative weight (aggregation normaliser x importance ratio x
clip indicator), so a token that every rollout of the group emits once gets ``-sum_i A_i w_i``. Group
advantages sum to 0 (GRPO, Dr. GRPO, RLOO), hence the contributions cancel when ``w`` is constant
within the group; GSPO's sequence ratio, per-rollout 1/L_i normalisers and PPO's sign-dependent
(min-)clipping make ``w`` vary inside the group and leave a residual.

This module holds the tensor pieces shared by the Paper E losses (``algos/losses.py``: ``gspo``,
``grpo_fix``, ``dfpo``) and the diagnostic:

- ``group_index``: dense group index of each rollout;
- ``shared_tokens``: which tokens are shared within a group (the definition of a shared token);
- ``within_group_transform``: DFPO's stop-gradient transforms of per-rollout weights (min-replace,
  advantage-orthogonal projection);
- ``group_coefficients``: ``sum_{i in g} A_i w_i`` per group;
- ``loss_token_coefficients``: ``g_{i,t}`` of any registered loss by autograd;
- ``cancellation_residual``: the per-(group, token id) residual of those coefficients.

Everything is vectorised with ``index_add_`` / ``scatter_reduce_`` over dense group (and token) keys;
nothing loops over rollouts. Nothing here imports ``losses`` (``losses`` imports this module).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

TRANSFORMS = ("min_replace", "project", "none")


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group index of every rollout: (inv: Tensor[B] long in [0, n_groups), n_groups)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


class SharedTokens(NamedTuple):
    """``shared_tokens``' answer: K (group, token id) pairs, in sorted (group, token id) order."""

    key: Tensor  # Tensor[B, T] long: the pair of each valid token (index into the K pairs), -1 on invalid tokens
    shared: Tensor  # Tensor[B, T] bool: valid tokens whose pair is shared
    key_group: Tensor  # Tensor[K] long: dense group index of each pair (``group_index``: groups sorted by id)
    key_rollouts: Tensor  # Tensor[K] long: distinct rollouts of the group in which the pair occurs
    key_shared: Tensor  # Tensor[K] bool: key_rollouts >= min_rollouts
    n_groups: int


@torch.no_grad()
def shared_tokens(responses: Tensor, mask: Tensor, group_ids: Tensor, min_rollouts: int = 2) -> SharedTokens:
    """Which generated tokens are shared within their group: Paper E's shared token, defined once [ours].

    A valid token (i, t) (mask > 0) with id v = responses[i, t] is *shared* when v occurs at a valid position
    in at least ``min_rollouts`` (2) distinct rollouts of i's group (rollouts of the batch with the same
    group id), at any position. Neither the position nor the prefix matters: the paper's cancellation acts
    "in the shared token space" on "high-frequency tokens" (its abstract), i.e. on the direction of token
    id v, whose logit-gradient is the same wherever v is emitted, and whose coefficients sum over every
    occurrence of v in the group (the unit of ``cancellation_residual``, what GRPO-fix's symmetric clip mask
    is taken over). Occurrences of v within one rollout share its advantage: v in one rollout only is not
    shared. responses: Tensor[B, T] token ids; mask: Tensor[B, T]; group_ids: Tensor[B]. Returns
    ``SharedTokens`` (shapes there; K = distinct (group, token id) pairs among the valid tokens).
    """
    valid = mask > 0
    dev = responses.device
    inv, n_groups = group_index(group_ids.to(dev))
    B, T = valid.shape
    rows = torch.arange(B, device=dev)[:, None].expand(B, T)[valid]
    grp = inv[:, None].expand(B, T)[valid]
    tok = responses.long()[valid]
    if tok.numel():
        _, k = torch.unique(torch.stack([grp, tok]), dim=1, return_inverse=True)
    else:
        k = tok.new_zeros(0)
    n_keys = int(k.max()) + 1 if k.numel() else 0
    key_group = torch.zeros(n_keys, dtype=torch.long, device=dev).scatter_(0, k, grp)
    pairs = torch.unique(torch.stack([k, rows]), dim=1)  # distinct (pair, rollout)
    key_rollouts = torch.zeros(n_keys, dtype=torch.long, device=dev).index_add_(
        0, pairs[0], torch.ones(pairs.shape[1], dtype=torch.long, device=dev)
    )
    key_shared = key_rollouts >= min_rollouts
    key = torch.full((B, T), -1, dtype=torch.long, device=dev)
    key[valid] = k
    shared = torch.zeros(B, T, dtype=torch.bool, device=dev)
    shared[valid] = key_shared[k]
    return SharedTokens(key, shared, key_group, key_rollouts, key_shared, n_groups)


def _group_sum(x: Tensor, inv: Tensor, n: int) -> Tensor:
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, inv, x)


def group_coefficients(adv: Tensor, w: Tensor, group_ids: Tensor) -> Tensor:
    """``c_g = sum_{i in g} A_i w_i`` for every group (sorted by group id). adv, w: Tensor[B] -> Tensor[n_groups]."""
    inv, n = group_index(group_ids)
    return _group_sum(adv * w, inv, n)


@torch.no_grad()
def within_group_transform(
    w: Tensor, adv: Tensor, group_ids: Tensor, transform: str = "project", active: Tensor | None = None
) -> Tensor:
    """DFPO's within-group transform of per-rollout weights (no gradient).

    w, adv: Tensor[B] (per-rollout weight and sequence advantage); group_ids: Tensor[B];
    active: Tensor[B] bool, rows that take part (default all; rows with no valid token should not:
    their weight is 0 and would win every min). Returns Tensor[B]:

      min_replace: w~_i = min_{j in g, j active} w_j        (constant within the group, so
                   sum_i A_i w~_i = w~_g sum_i A_i = 0 when the group's advantages sum to 0, i.e. the
                   whole group is in the mini-batch)
      project:     w~ = w - (A.w / ||A||^2) A  within each group (dot products over the group's active
                   rows): sum_{i in g} A_i w~_i = 0 for any advantages; a group with ||A|| = 0 is left
                   unchanged (its gradient is 0 anyway). w~ may be negative.
      none:        w~ = w  (ablation: the untransformed weights)
    Inactive rows keep their w.
    """
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown DFPO transform {transform!r}; valid choices: {list(TRANSFORMS)}")
    if transform == "none" or w.numel() == 0:
        return w.clone()
    active = torch.ones_like(w, dtype=torch.bool) if active is None else active.bool()
    inv, n = group_index(group_ids)
    if transform == "min_replace":
        big = torch.full_like(w, torch.inf)
        gmin = torch.full((n,), torch.inf, dtype=w.dtype, device=w.device)
        gmin = gmin.scatter_reduce(0, inv, torch.where(active, w, big), reduce="amin", include_self=True)
        return torch.where(active, gmin[inv], w)
    a = torch.where(active, adv.to(w.dtype), torch.zeros_like(w))
    dot = _group_sum(a * w, inv, n)
    nrm = _group_sum(a * a, inv, n)
    coef = torch.where(nrm > 0, dot / torch.where(nrm > 0, nrm, torch.ones_like(nrm)), torch.zeros_like(nrm))
    return w - coef[inv] * a


def loss_token_coefficients(
    loss_fn: Callable[..., Any], logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, **kw: Any
) -> Tensor:
    """``g_{i,t} = d loss / d logp_{i,t}`` of ``loss_fn(logp, old_logp, adv, mask, **kw)`` by autograd.

    ``logp`` is detached and made a leaf here (the caller's tensor is untouched); weights a loss
    computes under ``no_grad`` / ``detach`` (DFPO's w, GSPO's sg[s_i]) count as constants, exactly as
    in the optimizer's gradient. Returns Tensor[B, T] (0 where the loss does not depend on logp).
    """
    leaf = logp.detach().clone().requires_grad_(True)
    out = loss_fn(leaf, old_logp, adv, mask, **kw)
    loss = out[0] if isinstance(out, tuple) else out
    (g,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf) if g is None else g.detach()


@torch.no_grad()
def cancellation_residual(
    grad_coef: Tensor,
    responses: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    adv: Tensor | None = None,
    min_rollouts: int = 2,
) -> dict[str, Any]:
    """How far the per-token gradient coefficients of shared tokens are from cancelling in each group.

    grad_coef: Tensor[B, T] ``g_{i,t} = dL/dlogp_{i,t}`` (e.g. ``loss_token_coefficients``);
    responses: Tensor[B, T] token ids; mask: Tensor[B, T] (> 0 on valid tokens); group_ids: Tensor[B];
    adv: optional Tensor[B] sequence advantages (only to report the per-rollout weights ``w``).

    Shared tokens [ours]: ``shared_tokens`` (a (group g, token id v) pair is shared when v occurs (valid) in
    at least ``min_rollouts`` (2) distinct rollouts of g, at any position). For each shared pair
        R_{g,v} = |sum_{i in g} sum_{t: o_{i,t} = v} g_{i,t}|,   S_{g,v} = sum_{i in g} sum_{t: o_{i,t} = v} |g_{i,t}|
    and per group  rel_g = sum_v R_{g,v} / sum_v S_{g,v}  in [0, 1]  (0: perfect cancellation; 1: all
    of the shared tokens' coefficients push the same way). Groups with sum_v S_{g,v} = 0 (no shared
    token, or no gradient on it) are left out of the means.

    Group coefficient [ours]: the per-rollout effective weight is the mean coefficient per valid token
    divided by -A_i, ``w_i = -mean_t g_{i,t} / A_i`` (for g_{i,t} = -A_i w_i this is w_i exactly), so
        c_g = sum_{i in g} A_i w_i = -sum_{i in g} mean_t g_{i,t}
    needs no division (A_i = 0 is fine); its scale-free form is
        c_rel_g = |c_g| / sum_{i in g} |mean_t g_{i,t}|.
    This is what a direction shared once by every rollout would receive when g is constant along each
    rollout, and 0 by construction for DFPO.

    Returns: rel_residual (mean_g rel_g, float), rel_residual_pooled (sum R / sum S over all groups),
    group_coef_rel (mean_g c_rel_g over groups with a non-zero denominator), shared_token_frac (valid
    tokens that belong to a shared pair), n_groups_scored (groups in rel_residual), and per-group tensors
    (groups sorted by id): groups, residual (sum_v R), total (sum_v S), rel (nan where total = 0),
    group_coef (c_g); plus w (Tensor[B], nan where A_i = 0) when ``adv`` is given.
    """
    g = grad_coef.detach().to(torch.float64)
    valid = mask > 0
    inv, n_groups = group_index(group_ids.to(g.device))
    st = shared_tokens(responses.to(g.device), mask, group_ids, min_rollouts)
    key, key_group, shared = st.key[valid], st.key_group, st.key_shared  # dense (group, token id) pairs
    n_keys = key_group.numel()
    coef = g[valid]

    key_sum = torch.zeros(n_keys, dtype=torch.float64, device=g.device).index_add_(0, key, coef)
    key_abs = torch.zeros(n_keys, dtype=torch.float64, device=g.device).index_add_(0, key, coef.abs())
    sh = shared.to(torch.float64)
    residual = _group_sum(key_sum.abs() * sh, key_group, n_groups)
    total = _group_sum(key_abs * sh, key_group, n_groups)
    scored = total > 0
    rel = torch.where(
        scored, residual / torch.where(scored, total, torch.ones_like(total)), torch.full_like(total, float("nan"))
    )

    lens = valid.sum(-1).clamp(min=1).to(torch.float64)
    mean_g = (g * valid).sum(-1) / lens  # mean coefficient per valid token of each rollout
    group_coef = -_group_sum(mean_g, inv, n_groups)
    coef_den = _group_sum(mean_g.abs(), inv, n_groups)
    coef_ok = coef_den > 0
    coef_rel = group_coef.abs()[coef_ok] / coef_den[coef_ok]

    out: dict[str, Any] = {
        "rel_residual": rel[scored].mean().item() if scored.any() else float("nan"),
        "rel_residual_pooled": (residual.sum() / total.sum()).item() if scored.any() else float("nan"),
        "group_coef_rel": coef_rel.mean().item() if coef_ok.any() else float("nan"),
        "shared_token_frac": (sh[key].mean().item() if key.numel() else float("nan")),
        "n_groups_scored": int(scored.sum()),
        "groups": torch.unique(group_ids),
        "residual": residual,
        "total": total,
        "rel": rel,
        "group_coef": group_coef,
    }
    if adv is not None:
        a = adv.to(torch.float64)
        out["w"] = torch.where(
            a != 0, -mean_g / torch.where(a != 0, a, torch.ones_like(a)), torch.full_like(a, float("nan"))
        )
    return out
