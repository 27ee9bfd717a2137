"""DelTA (Paper B): token-gradient discriminator reweighting of the advantage.

Per rollout batch, without gradient, over the N valid response tokens (SPEC "Paper B", read from the
authors' code, RUCBM/DelTA):

1. proxy v_n = (1 - p_n) h_n: the gradient of log p(y_n) w.r.t. the LM-head row of the sampled token;
2. centroids mu+ = sum_{A>0} A v / sum A,  mu- = sum_{A<0} |A| v / sum |A|;
3. margins, own side s and other side s': m_n = ||v_n - mu_s'||^2 - ||v_n - mu_s||^2;
   gamma_s = sqrt(max(population variance of m over side s, 1e-8)) (the official floor is on the variance,
   so gamma >= 1e-4: RUCBM/DelTA verl-DelTA/verl/workers/actor/dp_actor.py, compute_log_prob_h, eps = 1e-8 and
   gamma_pos = gamma_time * sqrt(clamp(E[m^2] - E[m]^2, min=eps)), gamma_time = 1);
4. refinement, K steps: alpha = sigmoid(m / gamma); mu_s <- sum_s alpha |A| v / sum_s alpha |A|;
   gamma_s <- population std of those same margins (computed before the centroid update), then the
   margins are recomputed under the new centroids (K = 1: the final gamma is the initial one);
5. alpha* = sigmoid(m* / gamma);  lambda = lam_min + (lam_max - lam_min) alpha*;  A = 0 tokens: lam_min;
6. self-normalise: lambda <- lambda N / sum lambda (mean 1).  The loss uses A lambda.

No N x N tensor exists: ||v - mu||^2 = ||v||^2 - 2 v.mu + ||mu||^2, evaluated in row chunks, so the
memory is O(N d) (the proxies themselves) plus O(chunk d). Every batch statistic is a sum passed
through ``all_reduce`` (identity here): the identity gives the official per-rank statistics (the authors'
compute_log_prob_h has no all-reduce: centroids, gamma and the lambda normaliser are those of one data-parallel
rank's rollouts; the verl plug-in's default, ``verl.credit_dp_stats: rank``), a sum all-reduce over the
data-parallel ranks the global-batch ones (``global``: an ablation row, configs/papers/delta.yaml).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from creditlab.algos.registry import register

COEF_VARIANTS = ("full", "within_side", "fixed_gamma", "hard", "no_norm", "no_range", "no_refine", "random")
"""Rows of the diagnostics table computed by :func:`delta_coefficients` (SPEC Paper B, Table 4):
full (DelTA) | within_side (score by the own centroid only) | fixed_gamma (w/o adaptive gamma: gamma = 1) |
hard (w/o h(alpha): alpha = 1[m > 0]) | no_norm (w/o lambda-norm) | no_range (w/o range map: lambda =
alpha*, then normalised) | no_refine (K = 0) | random (lambda ~ U[lam_min, lam_max], then normalised)."""

VARIANTS = COEF_VARIANTS + ("topk_proxy",)
"""All diagnostics rows; ``topk_proxy`` is ``full`` on the top-K hidden-gradient proxy (:func:`topk_hidden_proxy`)."""

VAR_MIN = 1e-8
"""Floor on the margins' variance before the square root: gamma_s = sqrt(max(var_s, VAR_MIN)) >= 1e-4 [code:
RUCBM/DelTA dp_actor.py compute_log_prob_h, ``torch.sqrt(torch.clamp(m_sumsq / m_count - m_mean ** 2, min=eps))``
with ``eps = 1e-8``]. (A floor of 1e-8 on gamma itself let a side of near-identical margins reach m / gamma ~ 1e4:
a hard 0/1 alpha where the official one is a soft sigmoid.)"""
Reduce = Callable[[Tensor], Tensor]


def _identity(x: Tensor) -> Tensor:
    return x


def _sq_dists(v: Tensor, mus: Tensor, chunk: int) -> Tensor:
    """||v_n - mu_c||^2 for every row n and centroid c: Tensor[N, d] x Tensor[C, d] -> Tensor[N, C] (float32).

    Expanded as ||v||^2 - 2 v.mu + ||mu||^2 over row chunks: no [N, C, d] or [N, N] intermediate.
    """
    out = torch.empty(v.shape[0], mus.shape[0], dtype=torch.float32, device=v.device)
    mus = mus.float()
    mu_sq = mus.square().sum(-1)
    for s in range(0, v.shape[0], chunk):
        vc = v[s : s + chunk].float()
        out[s : s + chunk] = vc.square().sum(-1, keepdim=True) - 2.0 * vc @ mus.T + mu_sq
    return out.clamp_(min=0.0)


def _weighted_sums(v: Tensor, w: Tensor, side: Tensor, chunk: int) -> Tensor:
    """sum_n w_n v_n over each side: Tensor[N, d], Tensor[N], side Tensor[N] long in {0, 1} -> Tensor[2, d]."""
    out = torch.zeros(2, v.shape[1], dtype=torch.float32, device=v.device)
    for s in range(0, v.shape[0], chunk):
        out.index_add_(0, side[s : s + chunk], w[s : s + chunk, None] * v[s : s + chunk].float())
    return out


def _side_sums(x: Tensor, side: Tensor) -> Tensor:
    """sum of x over each side: Tensor[N], Tensor[N] long -> Tensor[2]."""
    return torch.zeros(2, dtype=torch.float32, device=x.device).index_add_(0, side, x.float())


def delta_coefficients(
    v: Tensor,
    adv: Tensor,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_steps: int = 1,
    variant: str = "full",
    *,
    generator: torch.Generator | None = None,
    all_reduce: Reduce | None = None,
    chunk_size: int = 8192,
) -> Tensor:
    """DelTA's per-token coefficients lambda (mean 1 unless ``variant="no_norm"``).

    v:   Tensor[N, d]  token-gradient proxies of the N valid tokens (e.g. (1 - p) h)
    adv: Tensor[N]     the sequence advantage of each token's rollout
    returns Tensor[N] float32, detached.

    Sides: positive (A > 0) and negative (A < 0) tokens; A = 0 tokens sit on neither side and get
    ``lam_min`` (they add nothing to the loss but count in its normaliser). [ours] When one side is
    empty the two-centroid margin is undefined: the other side's tokens get alpha* = 0.5 (the middle of
    the range) — except ``within_side``, which needs only the own centroid. A side whose refinement
    weights sum to 0 (possible with ``hard``) keeps its previous centroid.
    ``generator`` seeds ``random``; ``all_reduce`` sums statistics across data-parallel ranks.
    """
    if variant not in COEF_VARIANTS:
        raise ValueError(f"unknown DelTA variant {variant!r}; valid choices: {list(COEF_VARIANTS)}")
    if v.ndim != 2 or adv.shape != v.shape[:1]:
        raise ValueError(f"expected v Tensor[N, d] and adv Tensor[N]; got {tuple(v.shape)} and {tuple(adv.shape)}")
    reduce = all_reduce or _identity
    adv = adv.float()
    pos, neg = adv > 0, adv < 0
    active = pos | neg
    lam = torch.full_like(adv, lam_min)
    if variant == "random":
        u = torch.rand(adv.shape, generator=generator, dtype=torch.float32, device="cpu").to(adv.device)
        lam = torch.where(active, lam_min + (lam_max - lam_min) * u, lam)
        return _normalise(lam, reduce)

    side = neg.long()  # 0 = positive side, 1 = negative side (meaningful on active tokens only)
    absA = torch.where(active, adv.abs(), torch.zeros_like(adv))
    counts = reduce(_side_sums(active.float(), side))  # [2]: tokens on each side
    two_sided = bool((counts > 0).all())
    K = 0 if variant == "no_refine" else int(refine_steps)

    def centroids(weight: Tensor, previous: Tensor | None) -> Tensor:
        num = reduce(_weighted_sums(v, weight, side, chunk_size))
        den = reduce(_side_sums(weight, side))
        mu = num / den.clamp(min=1e-30)[:, None]
        if previous is not None:  # a side with no weight keeps its centroid
            mu = torch.where((den > 0)[:, None], mu, previous)
        return mu

    def margins(mu: Tensor) -> Tensor:
        d = _sq_dists(v, mu, chunk_size)  # [N, 2]
        own = d.gather(1, side[:, None]).squeeze(1)
        if variant == "within_side":  # closeness to the own centroid relative to the side's mean distance
            mean_own = reduce(_side_sums(torch.where(active, own, 0.0), side)) / counts.clamp(min=1)
            return mean_own[side] - own
        return d.gather(1, (1 - side)[:, None]).squeeze(1) - own

    def spread(m: Tensor) -> Tensor:
        """Population std of m over each side, sqrt(max(var, VAR_MIN)): Tensor[2] (1 for fixed_gamma)."""
        if variant == "fixed_gamma":
            return torch.ones(2, device=m.device)
        mm = torch.where(active, m, 0.0)
        n = counts.clamp(min=1)
        mean = reduce(_side_sums(mm, side)) / n
        var = reduce(_side_sums(torch.where(active, (m - mean[side]).square(), 0.0), side)) / n
        return var.clamp(min=VAR_MIN).sqrt()  # the official floor: on the variance [code]

    def h(m: Tensor, gamma: Tensor) -> Tensor:
        x = m / gamma[side]
        return (x > 0).float() if variant == "hard" else torch.sigmoid(x)

    if two_sided or variant == "within_side":
        mu = centroids(absA, None)
        m = margins(mu)
        gamma = spread(m)
        for _ in range(K):
            alpha = h(m, gamma)
            mu = centroids(alpha * absA, mu)
            gamma = spread(m)  # the margins under the centroids before this update
            m = margins(mu)
        alpha_star = h(m, gamma)
    else:
        alpha_star = torch.full_like(adv, 0.5)

    if variant == "no_range":
        lam = torch.where(active, alpha_star, torch.zeros_like(adv))
    else:
        lam = torch.where(active, lam_min + (lam_max - lam_min) * alpha_star, lam)
    return lam if variant == "no_norm" else _normalise(lam, reduce)


def _normalise(lam: Tensor, reduce: Reduce) -> Tensor:
    """lambda N / sum lambda, with N and the sum all-reduced: Tensor[N] -> Tensor[N] (mean 1)."""
    stats = reduce(torch.stack([lam.sum(), torch.tensor(float(lam.numel()), device=lam.device)]))
    return lam * (stats[1] / stats[0].clamp(min=1e-12))


def lm_head_row_proxy(old_logp: Tensor, hidden: Tensor) -> Tensor:
    """v = (1 - p) h = d log p(y) / d W_y (the LM-head row of the sampled token y).

    old_logp: Tensor[N], hidden: Tensor[N, d] -> Tensor[N, d] (float32).
    """
    return (1.0 - old_logp.float().exp())[:, None] * hidden.float()


def topk_hidden_proxy(
    token_ids: Tensor, topk_logp: Tensor, topk_ids: Tensor, lm_head: Tensor, chunk_elems: int = 1 << 24
) -> Tensor:
    """Top-K hidden-gradient proxy [ours]: v = W_y - sum_{j in topK} p_j W_j.

    The gradient of log p(y) w.r.t. the LM-head input h is W^T (e_y - p); this keeps the sampled row
    and the K most probable rows (the rest of the vocabulary carries little mass).
    token_ids: Tensor[N]; topk_logp, topk_ids: Tensor[N, K]; lm_head: Tensor[V, d] -> Tensor[N, d].
    Rows are processed in chunks so that the gathered [chunk, K, d] block stays under ``chunk_elems``.
    """
    W = lm_head.float()
    N, K = topk_ids.shape
    out = torch.empty(N, W.shape[1], dtype=torch.float32, device=W.device)
    step = max(1, chunk_elems // max(1, K * W.shape[1]))
    for s in range(0, N, step):
        p = topk_logp[s : s + step].float().exp()  # [c, K]
        out[s : s + step] = W[token_ids[s : s + step]] - torch.einsum("ck,ckd->cd", p, W[topk_ids[s : s + step]])
    return out


@register("credit", "delta")
@torch.no_grad()
def delta_weights(
    responses: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    hidden: Tensor,
    topk_logp: Tensor | None = None,
    topk_ids: Tensor | None = None,
    lm_head: Tensor | None = None,
    rng: torch.Generator | None = None,
    *,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_steps: int = 1,
    variant: str = "full",
    topk: int | None = None,
    all_reduce: Reduce | None = None,
) -> Tensor:
    """DelTA credit: lambda_{i,t} from :func:`delta_coefficients` on the valid tokens, 0 on padding.

    responses, mask, old_logp: Tensor[B, T]; advantages: Tensor[B]; hidden: Tensor[B, T, d] (the LM-head
    inputs of the old-log-prob forward: no extra forward pass). ``variant="topk_proxy"`` builds v from
    the top-``topk`` distribution (topk_logp/topk_ids Tensor[B, T, K], lm_head Tensor[V, d]; an engine
    returns K = min(topk, V) columns when a credit config sets ``topk``) instead of (1 - p) h.
    ``all_reduce`` (a sum over data-parallel ranks, passed by a multi-rank engine: the verl workers) makes
    every statistic global-batch; None = this batch alone (one rank, or the official per-rank statistics).
    Returns Tensor[B, T].
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown DelTA variant {variant!r}; valid choices: {list(VARIANTS)}")
    valid = mask.bool()
    if variant == "topk_proxy":
        if not topk or topk_logp is None or topk_ids is None or lm_head is None:
            raise ValueError(
                "DelTA variant 'topk_proxy' needs `topk` set and topk_logp, topk_ids, lm_head from the engine"
            )
        v = topk_hidden_proxy(responses[valid], topk_logp[valid][:, :topk], topk_ids[valid][:, :topk], lm_head)
        variant = "full"
    else:
        v = lm_head_row_proxy(old_logp[valid], hidden[valid])
    adv_tok = advantages.float()[:, None].expand_as(mask)[valid]
    lam = delta_coefficients(v, adv_tok, lam_min, lam_max, refine_steps, variant, generator=rng, all_reduce=all_reduce)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    out[valid] = lam
    return out


SELECT_MODES = ("top", "bottom", "random")


@register("token_filter", "delta_select")
@torch.no_grad()
def delta_select_mask(
    responses: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    hidden: Tensor,
    rng: torch.Generator | None = None,
    *,
    mode: str = "top",
    frac: float = 0.5,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_steps: int = 1,
    all_reduce: Reduce | None = None,
) -> Tensor:
    """Token selection by DelTA's lambda (Paper B, Figure 3): the loss sees only the selected tokens.

    Among the valid tokens of rollouts with A != 0 (A = 0 tokens carry no gradient) keep the
    ``frac`` share with the highest (``top``) or lowest (``bottom``) lambda, or a uniformly random
    share (``random``); the advantage itself is not reweighted. [ours: the ranking excludes A = 0 tokens]
    ``all_reduce``: as :func:`delta_weights` (lambda from global statistics; the ``frac`` share is then
    taken within this batch, i.e. per data-parallel rank [ours]).
    Shapes as :func:`delta_weights`; returns a 0/1 float Tensor[B, T].
    """
    if mode not in SELECT_MODES:
        raise ValueError(f"unknown selection mode {mode!r}; valid choices: {list(SELECT_MODES)}")
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"frac must be in (0, 1], got {frac}")
    lam = delta_weights(
        responses,
        mask,
        old_logp,
        advantages,
        hidden,
        lam_min=lam_min,
        lam_max=lam_max,
        refine_steps=refine_steps,
        all_reduce=all_reduce,
    )
    cand = mask.bool() & (advantages != 0)[:, None]
    n_keep = int(round(frac * int(cand.sum())))
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if n_keep == 0:
        return out
    if mode == "random":
        score = torch.rand(int(cand.sum()), generator=rng).to(mask.device)
    else:
        score = lam[cand] if mode == "top" else -lam[cand]
    keep = torch.zeros_like(score, dtype=torch.bool)
    keep[torch.topk(score, n_keep).indices] = True
    out[cand] = keep.float()
    return out
