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

No N x N tensor exists: ||v - mu||^2 = ||v||^2 - 2 v.mu + ||mu||^2, evaluated in row chunks. Every statistic is a
sum, so :class:`DeltaStream` reads the tokens one micro-batch at a time, one pass per statistic as the official
code does (sums, spread, K refinements, final: K + 3 passes, :func:`delta_passes`), holding O(d) statistics plus one
micro-batch's proxies (:func:`delta_pass_peak_bytes`): the verl workers re-run the old-log-prob forward for each pass
(:class:`DeltaCredit`, ``delta_weights.stream``) instead of holding every rollout's hidden states; the local engine
and :func:`delta_weights` feed the whole batch as one micro-batch. Every batch statistic is passed
through ``all_reduce`` (identity here): the identity gives the official per-rank statistics (the authors'
compute_log_prob_h has no all-reduce: centroids, gamma and the lambda normaliser are those of one data-parallel
rank's rollouts; the verl plug-in's default, ``verl.credit_dp_stats: rank``), a sum all-reduce over the
data-parallel ranks the global-batch ones (``global``: an ablation row, configs/papers/delta.yaml).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from creditlab.algos.credit.base import run_in_memory
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


class DeltaStream:
    """DelTA's coefficients over a batch read in micro-batches, one statistics pass at a time, as the official
    ``compute_log_prob_h`` computes them (per-micro-batch sums; never every token's proxy at once).

    Passes, each reading every valid token once (the verl workers re-run the forward for each, :func:`delta_passes`):
      ``sums``      side counts n_s, sum_s |A|, sum_s |A| v  (within_side: also sum_s v, sum_s ||v||^2)  -> mu_0
      ``spread``    sum_s m, sum_s m^2 under mu_0 -> gamma_0 (population std, variance floored at VAR_MIN)
      ``refine`` k  alpha = h(m_k / gamma_k); sum_s alpha |A| v, sum_s alpha |A| -> mu_{k+1} (a side with no
                    weight keeps mu_k); sum_s m_k, sum_s m_k^2 -> gamma_{k+1}   (k = 0 .. K-1)
      ``final``     lambda of every token (returned by :meth:`update`); sum lambda and N -> :attr:`scale`
    ``fixed_gamma`` skips ``spread``; a batch with an empty side skips to ``final`` (alpha* = 0.5; not within_side);
    ``random`` has ``final`` only. within_side's mean own distance under any mu is closed-form from the ``sums``
    pass: mean_s ||v - mu||^2 = (sum_s ||v||^2 - 2 mu . sum_s v) / n_s + ||mu||^2.
    Memory: O(d) statistics plus O(chunk d) temporaries (:func:`delta_pass_peak_bytes`). Scalar sums are float64;
    every statistic goes through ``all_reduce`` at the end of its pass.

    Driver (``v`` Tensor[n, d] and ``adv`` Tensor[n] of each micro-batch's valid tokens)::

        while not s.done:
            outs = [s.update(v, adv) for v, adv in micro_batches]   # Tensor[n] on the final pass, else None
            s.end_pass()
        lam = torch.cat(outs) * s.scale
    """

    def __init__(
        self,
        lam_min: float = 0.8,
        lam_max: float = 1.2,
        refine_steps: int = 1,
        variant: str = "full",
        *,
        generator: torch.Generator | None = None,
        all_reduce: Reduce | None = None,
        chunk_size: int = 8192,
    ):
        if variant not in COEF_VARIANTS:
            raise ValueError(f"unknown DelTA variant {variant!r}; valid choices: {list(COEF_VARIANTS)}")
        self.lam_min, self.lam_max, self.variant = float(lam_min), float(lam_max), variant
        self.K = 0 if variant == "no_refine" else int(refine_steps)
        self.generator, self.reduce, self.chunk = generator, all_reduce or _identity, int(chunk_size)
        self.stage = "final" if variant == "random" else "sums"
        self.step = 0  # refinement steps done
        self.mu: Tensor | None = None  # [2, d]
        self.gamma: Tensor | None = None  # [2]
        self.mean_own: Tensor | None = None  # [2] (within_side)
        self.scale = 1.0
        self._acc: dict[str, Tensor] = {}

    @property
    def done(self) -> bool:
        return self.stage == "done"

    def _add(self, name: str, x: Tensor) -> None:
        self._acc[name] = self._acc[name] + x if name in self._acc else x

    def _margins(self, vc: Tensor, side: Tensor, active: Tensor) -> Tensor:
        """m of each row under the current centroids: Tensor[c] float32."""
        d = _sq_dists(vc, self.mu, vc.shape[0] or 1)
        own = d.gather(1, side[:, None]).squeeze(1)
        if self.variant == "within_side":
            return (self.mean_own.float()[side] - own).where(active, 0.0)
        return d.gather(1, (1 - side)[:, None]).squeeze(1) - own

    def _alpha(self, m: Tensor, side: Tensor) -> Tensor:
        x = m / self.gamma.float()[side]
        return (x > 0).float() if self.variant == "hard" else torch.sigmoid(x)

    def update(self, v: Tensor, adv: Tensor) -> Tensor | None:
        """Read one micro-batch's valid tokens: v Tensor[n, d] (proxies), adv Tensor[n] (their rollouts' A).
        Returns lambda Tensor[n] float32 (before :attr:`scale`) on the final pass, else None."""
        if self.done:
            raise RuntimeError("DelTA stream: every pass is done")
        if v.ndim != 2 or adv.shape != v.shape[:1]:
            raise ValueError(f"expected v Tensor[N, d] and adv Tensor[N]; got {tuple(v.shape)} and {tuple(adv.shape)}")
        outs = []
        step = max(v.shape[0], 1) if self.variant == "random" else self.chunk  # random: one draw per micro-batch
        for s in range(0, max(v.shape[0], 1), step):  # an empty micro-batch still adds (zero) statistics
            out = self._update_chunk(v[s : s + step], adv[s : s + step].float())
            if out is not None:
                outs.append(out)
        if self.stage != "final":
            return None
        return torch.cat(outs) if outs else torch.zeros(0, dtype=torch.float32, device=v.device)

    def _update_chunk(self, vc: Tensor, adv: Tensor) -> Tensor | None:
        pos, neg = adv > 0, adv < 0
        active = pos | neg
        side = neg.long()  # 0 = positive side, 1 = negative side (meaningful on active tokens only)
        absA = torch.where(active, adv.abs(), torch.zeros_like(adv))
        f64 = torch.float64
        if self.stage == "sums":
            self._add("n", _side_sums(active.float(), side).to(f64))
            self._add("w", _side_sums(absA, side).to(f64))
            self._add("num", _weighted_sums(vc, absA, side, self.chunk))
            if self.variant == "within_side":
                self._add("s1", _weighted_sums(vc, active.float(), side, self.chunk).to(f64))
                self._add("s2", _side_sums(torch.where(active, vc.float().square().sum(-1), 0.0), side).to(f64))
            return None
        if self.stage in ("spread", "refine"):
            m = self._margins(vc, side, active)
            if self.variant != "fixed_gamma":
                mm = torch.where(active, m, 0.0).to(f64)
                self._add("m1", torch.zeros(2, dtype=f64, device=vc.device).index_add_(0, side, mm))
                self._add("m2", torch.zeros(2, dtype=f64, device=vc.device).index_add_(0, side, mm.square()))
            if self.stage == "refine":
                wa = self._alpha(m, side) * absA
                self._add("num", _weighted_sums(vc, wa, side, self.chunk))
                self._add("w", _side_sums(wa, side).to(f64))
            return None
        # final
        if self.variant == "random":
            u = torch.rand(adv.shape, generator=self.generator, dtype=torch.float32, device="cpu").to(adv.device)
            lam = torch.where(active, self.lam_min + (self.lam_max - self.lam_min) * u, self.lam_min)
        else:
            alpha = torch.full_like(adv, 0.5) if self.mu is None else self._alpha(self._margins(vc, side, active), side)
            if self.variant == "no_range":
                lam = torch.where(active, alpha, 0.0)
            else:
                lam = torch.where(active, self.lam_min + (self.lam_max - self.lam_min) * alpha, self.lam_min)
        n = torch.tensor(float(lam.numel()), dtype=f64, device=lam.device)
        self._add("lam", torch.stack([lam.to(f64).sum(), n]))
        return lam.float()

    def _spread(self, acc: dict[str, Tensor]) -> Tensor:
        """gamma_s = sqrt(max(E_s[m^2] - E_s[m]^2, VAR_MIN)) from the pass's sums: Tensor[2] float64."""
        if self.variant == "fixed_gamma":
            return torch.ones(2, dtype=torch.float64, device=self.mu.device)
        n = self.n.clamp(min=1)
        m1, m2 = self.reduce(acc["m1"]), self.reduce(acc["m2"])
        return (m2 / n - (m1 / n).square()).clamp(min=VAR_MIN).sqrt()

    def _set_mean_own(self) -> None:
        """within_side: mean_s ||v - mu_s||^2 under the current centroids (closed form, float64)."""
        if self.variant == "within_side":
            mu = self.mu.double()
            n = self.n.clamp(min=1)
            self.mean_own = (self.s2 - 2.0 * (mu * self.s1).sum(-1)) / n + mu.square().sum(-1)

    def end_pass(self) -> None:
        """Close the current pass: all-reduce its statistics, derive the centroids / gamma / scale, move on."""
        acc, self._acc = self._acc, {}
        if not acc:  # every rank must reduce the same statistics in the same order
            raise RuntimeError("DelTA stream: end_pass() before any update() of the pass")
        if self.stage == "sums":
            self.n = self.reduce(acc["n"])
            if not (bool((self.n > 0).all()) or self.variant == "within_side"):
                self.stage = "final"  # one side empty: the two-centroid margin is undefined, alpha* = 0.5
                return
            num, den = self.reduce(acc["num"]), self.reduce(acc["w"])
            self.mu = num / den.clamp(min=1e-30).to(num.dtype)[:, None]
            if self.variant == "within_side":
                self.s1, self.s2 = self.reduce(acc["s1"]), self.reduce(acc["s2"])
            self._set_mean_own()
            if self.variant == "fixed_gamma":
                self.gamma = self._spread(acc)
                self.stage = "refine" if self.K else "final"
            else:
                self.stage = "spread"
        elif self.stage == "spread":
            self.gamma = self._spread(acc)
            self.stage = "refine" if self.K else "final"
        elif self.stage == "refine":
            num, den = self.reduce(acc["num"]), self.reduce(acc["w"])
            mu = num / den.clamp(min=1e-30).to(num.dtype)[:, None]
            self.mu = torch.where((den > 0)[:, None], mu, self.mu)  # a side with no weight keeps its centroid
            self.gamma = self._spread(acc)  # the margins under the centroids before this update
            self._set_mean_own()
            self.step += 1
            if self.step >= self.K:
                self.stage = "final"
        else:  # final
            if self.variant != "no_norm":
                stats = self.reduce(acc["lam"])
                self.scale = float(stats[1] / stats[0].clamp(min=1e-12))
            self.stage = "done"


def delta_passes(variant: str = "full", refine_steps: int = 1) -> int:
    """Statistics passes of :class:`DelTA's stream <DeltaStream>` over the data, i.e. forwards of the policy per
    old-log-prob pass on the verl workers (the official code: K + 3, the first being verl's own old-log-prob
    forward): sums, spread (not fixed_gamma), K refinements, final; random: 1. A batch with an empty side stops
    after sums (2). topk_proxy counts as full."""
    if variant == "random":
        return 1
    K = 0 if variant == "no_refine" else int(refine_steps)
    return 2 + K + (0 if variant == "fixed_gamma" else 1)


def delta_pass_peak_bytes(
    micro_batch_tokens: int, hidden_size: int, passes: int = 1, dtype: torch.dtype = torch.bfloat16, topk: int = 0
) -> int:
    """Peak bytes the streamed DelTA credit adds to one micro-batch's forward on a worker's device, beyond the
    forward itself and the per-token scalars every old-log-prob pass returns.

    Per micro-batch of n = ``micro_batch_tokens`` tokens (packed, prompt + response: the captured LM-head input is
    full-sequence) and d = ``hidden_size``: the captured hidden states (n d, ``dtype``), their response part padded
    (n d, ``dtype``), the float32 proxy v and one float32 temporary of the distance / weighted-sum chunk
    (2 n d 4 bytes); the top-K proxy (``topk`` > 0) adds its [n, K] ids and log-probs and a [chunk, V]-free gather
    bounded by 2^24 float32 elements (64 MiB). Statistics: 4 d float32 + O(1). It does not grow with the rollouts
    per rank, nor with ``passes`` (each pass frees its micro-batch before the next); ``passes`` is accepted for the
    time model's sake and checked >= 1.
    """
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    n, d = int(micro_batch_tokens), int(hidden_size)
    size = torch.empty(0, dtype=dtype).element_size()
    out = 2 * n * d * size + 2 * n * d * 4 + 4 * d * 4 + 64
    if topk:
        out += n * int(topk) * 12 + (1 << 24) * 4
    return out


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
    """DelTA's per-token coefficients lambda (mean 1 unless ``variant="no_norm"``): :class:`DeltaStream` over one
    micro-batch holding every token.

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
    s = DeltaStream(
        lam_min, lam_max, refine_steps, variant, generator=generator, all_reduce=all_reduce, chunk_size=chunk_size
    )
    lam = None
    while not s.done:
        lam = s.update(v, adv)
        s.end_pass()
    return lam * s.scale


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


class DeltaCredit:
    """The streamed form of :func:`delta_weights` (its ``stream``): a :class:`DeltaStream` fed one micro-batch at a
    time (the verl workers: each pass re-runs the old-log-prob forward, :func:`delta_passes`).

    :meth:`update` takes one micro-batch's tensors, shapes as :func:`delta_weights` (B_mb rollouts), and returns on
    the final pass its lambda Tensor[B_mb, T] before the normaliser (0 on padding), else None; :meth:`finish` takes
    those of the whole batch (Tensor[B, T]) and returns the weights. Keyword arguments: :func:`delta_weights`'."""

    def __init__(
        self,
        *,
        lam_min: float = 0.8,
        lam_max: float = 1.2,
        refine_steps: int = 1,
        variant: str = "full",
        topk: int | None = None,
        all_reduce: Reduce | None = None,
    ):
        if variant not in VARIANTS:
            raise ValueError(f"unknown DelTA variant {variant!r}; valid choices: {list(VARIANTS)}")
        self.topk = int(topk or 0) if variant == "topk_proxy" else 0
        if variant == "topk_proxy" and not self.topk:
            raise ValueError("DelTA variant 'topk_proxy' needs `topk` set")
        self.stream = DeltaStream(
            lam_min, lam_max, refine_steps, "full" if variant == "topk_proxy" else variant, all_reduce=all_reduce
        )

    @property
    def done(self) -> bool:
        return self.stream.done

    def update(
        self,
        responses: Tensor,
        mask: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        hidden: Tensor,
        topk_logp: Tensor | None = None,
        topk_ids: Tensor | None = None,
        lm_head: Tensor | None = None,
        rng: torch.Generator | None = None,
    ) -> Tensor | None:
        valid = mask.bool()
        if self.topk:
            if topk_logp is None or topk_ids is None or lm_head is None:
                raise ValueError("DelTA variant 'topk_proxy' needs topk_logp, topk_ids, lm_head from the engine")
            k = self.topk
            v = topk_hidden_proxy(responses[valid], topk_logp[valid][:, :k], topk_ids[valid][:, :k], lm_head)
        else:
            v = lm_head_row_proxy(old_logp[valid], hidden[valid])
        self.stream.generator = rng
        lam = self.stream.update(v, advantages.float()[:, None].expand_as(mask)[valid])
        if lam is None:
            return None
        out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        out[valid] = lam
        return out

    def end_pass(self) -> None:
        self.stream.end_pass()

    def finish(self, values: Tensor) -> Tensor:
        return values * self.stream.scale


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
    """DelTA credit: lambda_{i,t} from :class:`DeltaStream` (:func:`delta_coefficients`) on the valid tokens, 0 on
    padding; the whole batch as one micro-batch (:class:`DeltaCredit` is the streamed form, ``delta_weights.stream``).

    responses, mask, old_logp: Tensor[B, T]; advantages: Tensor[B]; hidden: Tensor[B, T, d] (the LM-head
    inputs of the old-log-prob forward). ``variant="topk_proxy"`` builds v from
    the top-``topk`` distribution (topk_logp/topk_ids Tensor[B, T, K], lm_head Tensor[V, d]; an engine
    returns K = min(topk, V) columns when a credit config sets ``topk``) instead of (1 - p) h.
    ``all_reduce`` (a sum over data-parallel ranks, passed by a multi-rank engine: the verl workers) makes
    every statistic global-batch; None = this batch alone (one rank, or the official per-rank statistics).
    Returns Tensor[B, T].
    """
    s = DeltaCredit(
        lam_min=lam_min, lam_max=lam_max, refine_steps=refine_steps, variant=variant, topk=topk, all_reduce=all_reduce
    )
    inputs = dict(
        responses=responses,
        mask=mask,
        old_logp=old_logp,
        advantages=advantages,
        hidden=hidden,
        topk_logp=topk_logp,
        topk_ids=topk_ids,
        lm_head=lm_head,
        rng=rng,
    )
    return run_in_memory(s, inputs)


delta_weights.stream = DeltaCredit

SELECT_MODES = ("top", "bottom", "random")


def select_by(lam: Tensor, mask: Tensor, advantages: Tensor, mode: str, frac: float, rng: torch.Generator | None):
    """The ``frac`` share of the A != 0 valid tokens with the highest (top) / lowest (bottom) lambda, or a random
    share: lam, mask Tensor[B, T], advantages Tensor[B] -> 0/1 float Tensor[B, T]."""
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


class DeltaSelect(DeltaCredit):
    """The streamed form of :func:`delta_select_mask`: DelTA's lambda streamed (:class:`DeltaCredit`), the selection
    made by :meth:`finish` on the whole batch's lambda (Tensor[B, T] scalars)."""

    def __init__(
        self,
        *,
        mode: str = "top",
        frac: float = 0.5,
        lam_min: float = 0.8,
        lam_max: float = 1.2,
        refine_steps: int = 1,
        all_reduce: Reduce | None = None,
    ):
        if mode not in SELECT_MODES:
            raise ValueError(f"unknown selection mode {mode!r}; valid choices: {list(SELECT_MODES)}")
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"frac must be in (0, 1], got {frac}")
        super().__init__(lam_min=lam_min, lam_max=lam_max, refine_steps=refine_steps, all_reduce=all_reduce)
        self.mode, self.frac = mode, float(frac)

    def update(self, responses, mask, old_logp, advantages, hidden) -> Tensor | None:  # no rng: lambda is not random
        return super().update(responses, mask, old_logp, advantages, hidden)

    def finish(self, values: Tensor, mask: Tensor, advantages: Tensor, rng: torch.Generator | None = None) -> Tensor:
        return select_by(super().finish(values), mask, advantages, self.mode, self.frac, rng)


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
    taken within this batch, i.e. per data-parallel rank [ours]). Streamed form: :class:`DeltaSelect`.
    Shapes as :func:`delta_weights`; returns a 0/1 float Tensor[B, T].
    """
    s = DeltaSelect(
        mode=mode, frac=frac, lam_min=lam_min, lam_max=lam_max, refine_steps=refine_steps, all_reduce=all_reduce
    )
    inputs = dict(responses=responses, mask=mask, old_logp=old_logp, advantages=advantages, hidden=hidden, rng=rng)
    return run_in_memory(s, inputs)


delta_select_mask.stream = DeltaSelect
