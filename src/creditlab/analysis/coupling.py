"""Token coupling (Paper C, "The Cancellation Hypothesis", Section 2 and Table 1; SPEC.md "Paper C" item 4).

One SGD step on a token-level policy loss moves every token's log-probability, not only through its
own advantage. To first order [paper Eq. 5], for flattened token indices i, j,

    Δ logp_i  ~=  lr * sum_j  w_j  K_ij,        K_ij = <grad_theta logp_i, grad_theta logp_j>,

with w_j the effective weight of token j (the advantage A_j times the aggregation normaliser, the
importance ratio and the clip indicator; at ratio 1 under DAPO's token-mean: w_j = A_j / N).
[ours: in general w_j = -dL/dlogp_j, read off the loss by autograd.]

Output-layer proxy [paper Eqs. 6-8]: with logits z = W h, d log softmax(z)_y / dW = (e_y - p) h^T,
so restricted to the LM head W the kernel factorises (Frobenius product of two rank-1 matrices):

    K_ij  ~=  (h_i . h_j) * S_ij,     S_ij = (e_{y_i} - p_i) . (e_{y_j} - p_j)
                                           = 1[y_i = y_j] - p_i[y_j] - p_j[y_i] + p_i . p_j.

Non-negligible S needs the same token id (1[y_i = y_j]) and low confidence (small p_i[y_i]), which
is the paper's sparse-coupling prediction [paper Eq. 10].

Masking experiment [paper Table 1]: compare the normal update with one where a token set is removed
from the loss; Masking Effect of candidate c

    M_c = Δlogp_c(normal) - Δlogp_c(masked)     [paper]
    M_c = sign(A_c) * (Δlogp_c(normal) - Δlogp_c(masked))   [ours: oriented by the candidate's own
          advantage sign; "boost" = the masked tokens pushed c the way its own advantage asks]

Boost Rate = share of candidates with M > 0 (percent); Mean Boost = mean M. Sets: random, same token
id, low confidence (p < low_conf_p), same AND low-confidence. Plain SGD, no momentum [paper: Adam's
first step is sign-like and would erase the per-token magnitudes]. See ``masking_experiment``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from creditlab.algos.cancellation import loss_token_coefficients
from creditlab.lm.batch import TokenBatch, response_forward

PARAMS = ("lm_head", "full")
"""What the SGD step of ``masking_experiment`` moves: the LM-head (unembedding) weight only, or every parameter."""
POOLS = ("same_sign", "all")
"""Where the masked tokens of ``masking_experiment`` are drawn from."""
SETS = ("random", "same", "lowconf", "same_lowconf")
"""The masked token sets of Table 1: random; same token id; low confidence; same AND low confidence."""


def output_similarity(probs: Tensor, tokens: Tensor) -> Tensor:
    """Output-distribution factor of the coupling kernel [paper Eq. 8].

    S_ij = (e_{y_i} - p_i) . (e_{y_j} - p_j) = 1[y_i = y_j] - p_i[y_j] - p_j[y_i] + p_i . p_j,
    computed in this expanded form (no [N, V] one-hot is built).

    probs: Tensor[N, V] next-token distributions p_i (rows sum to 1); tokens: Tensor[N] long, the
    emitted ids y_i. Returns Tensor[N, N] (symmetric; dtype: probs', at least float32).
    """
    if probs.dim() != 2 or tokens.shape != probs.shape[:1]:
        raise ValueError(
            f"output_similarity needs probs [N, V] and tokens [N], got {tuple(probs.shape)} and {tuple(tokens.shape)}"
        )
    p = probs.to(torch.promote_types(probs.dtype, torch.float32))
    y = tokens.to(p.device).long()
    same = (y[:, None] == y[None, :]).to(p.dtype)
    p_at = p[:, y]  # [i, j] = p_i[y_j]
    return same - p_at - p_at.T + p @ p.T


def coupling_kernel_proxy(hidden: Tensor, probs: Tensor, tokens: Tensor) -> Tensor:
    """Output-layer proxy of the token coupling kernel [paper Eq. 7].

    K_ij = (h_i . h_j) * ((e_{y_i} - p_i) . (e_{y_j} - p_j)) = <d logp_i / dW, d logp_j / dW>_F,
    because d log softmax(W h)_y / dW = (e_y - p) h^T (W: the LM head, V x d; a bias, if any, is not
    part of the proxy).

    hidden: Tensor[N, d] the LM-head inputs h_i; probs: Tensor[N, V] softmax(W h_i); tokens: Tensor[N]
    the emitted ids y_i. Returns Tensor[N, N] (dtype: the promoted one, at least float32).
    """
    if hidden.dim() != 2 or hidden.shape[0] != probs.shape[0]:
        raise ValueError(
            f"coupling_kernel_proxy needs hidden [N, d] and probs [N, V] with the same N, got "
            f"{tuple(hidden.shape)} and {tuple(probs.shape)}"
        )
    s = output_similarity(probs, tokens)
    h = hidden.to(device=s.device, dtype=torch.promote_types(hidden.dtype, s.dtype))
    return (h @ h.T) * s.to(h.dtype)


def _kernel_row(h_c: Tensor, p_c: Tensor, y_c: int, hidden: Tensor, probs: Tensor, tokens: Tensor) -> Tensor:
    """Row c of ``coupling_kernel_proxy`` against M tokens: Tensor[M] (hidden [M, d], probs [M, V], tokens [M])."""
    s = (tokens == y_c).to(probs.dtype) - probs[:, y_c] - p_c[tokens] + probs @ p_c
    return (hidden @ h_c) * s


class _Runner(torch.nn.Module):
    """``response_forward`` as a module, so ``torch.func.functional_call`` can run it with other parameters
    (the after-update forward of ``masking_experiment``: the caller's model is never written)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: TokenBatch):
        return response_forward(self.model, batch)


def _check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {list(valid)}")


def masking_experiment(
    model,
    batch: TokenBatch,
    adv_tok: Tensor,
    mask: Tensor,
    loss_fn: Callable[..., Any],
    *,
    lr: float,
    params: str = "lm_head",
    n_candidates: int = 64,
    low_conf_p: float = 0.5,
    candidate_max_p: float = 0.9,
    pool: str = "same_sign",
    generator: torch.Generator | None = None,
    loss_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Coupling masking (Paper C, Table 1): how a masked token set moves a candidate token's update.

    Inputs: ``model`` (a causal LM with ``.model`` and an LM head, as the local engine uses), ``batch``
    (TokenBatch, B rows, T response positions), ``adv_tok`` Tensor[B, T] per-token advantages (a
    Tensor[B] of sequence advantages is broadcast over T), ``mask`` Tensor[B, T] the loss mask,
    ``loss_fn`` a registered policy loss ``loss_fn(new_logp, old_logp, adv, mask, **loss_kwargs)``
    (the trainer's ``loss_fn`` and its ``loss_kwargs``). Old log-probs are the pre-update ones, so
    every ratio is 1 at theta0 (the first mini-batch step).

    Procedure:
      1. From theta0, one forward (kept, with its graph) gives logp0, p0 = exp(logp0), h and the
         next-token distributions. The normal update is one plain-SGD step theta1 = theta0 - lr g on
         the full loss [paper: SGD without momentum].
      2. Candidates [ours]: valid tokens with A != 0 and p0 < ``candidate_max_p`` (so that their update
         is measurable, not saturated), ``n_candidates`` of them drawn at random (``generator``).
      3. Pool [ours]: ``same_sign`` (default) = valid tokens whose advantage has the sign of A_c
         (per token; the rollout's sign for sequence advantages), the candidate's own position
         excluded; ``all`` = every other valid token. Sets within the pool:
         ``same`` (y = y_c), ``lowconf`` (p0 < ``low_conf_p``), ``same_lowconf`` (both), ``random``
         (uniform from the pool, as many as ``same_lowconf`` has, at least 1).
      4. For each candidate and non-empty set S: restore theta0, one SGD step on the masked loss, then
         Δ_masked = logp_c(after) - logp_c(before);
            M_c = sign(A_c) * (Δ_normal - Δ_masked)   [ours: oriented by A_c's sign; the paper's is unsigned]
         Boost Rate = 100 * share of candidates with M > 0; Mean Boost = mean M   [paper].
      Removing a token from the loss [ours]: its advantage is zeroed and the mask (so the token-mean
      normaliser N, and every other token's gradient weight) is unchanged; dropping it from the mask
      would rescale every other token's gradient by N / (N - |S|) and bias M.

    ``params`` [paper: both]: ``lm_head`` moves only the unembedding W. Hidden states do not depend
    on W through the LM head use, so the step and the after-"forward" are computed on the detached
    pre-update h, in float64 (B*T*V, cheap) so small-lr effects are not lost to float32 rounding
    [ours]. With tied embeddings [ours] the step is the gradient through the LM-head *use* only: the
    input embedding is not moved (as for the paper's unembedding matrix W_U). ``full`` moves every
    trainable parameter (a tied weight once, with the sum of both paths) with the gradient of the one
    retained pre-update graph (one backward per update, no re-forward), and the after-forward runs on
    the candidate's row only (rows are independent in a causal LM) with the updated parameters passed
    through ``torch.func.functional_call``, in the model's dtype, without autocast. Either way the
    caller's model is never written. Note [ours]: ``nn.Embedding(padding_idx)`` gives the pad row no
    input-path gradient; where the pad id is an attended input (a random-init model can sample it) the
    full step still moves that row through the tied LM-head path, as the trainer's optimizer would, and
    the measured Δ includes its input-path effect (a first-order prediction from autograd misses it).

    Per candidate the record also holds ``proxy_effect`` [ours, Fig. 3-style]: the first-order LM-head
    prediction sign(A_c) * lr * sum_j (g_masked - g_normal)_j K_cj with g = dL/dlogp and K the
    output-layer proxy; under DAPO token-mean at ratio 1 it is lr/N sign(A_c) sum_{s in S} A_s K_cs.

    Returns a plain dict:
      sets: {name: {boost_rate (percent), mean_boost, n (candidates measured), mean_set_size,
                    n_skipped (candidates whose set was empty), proxy_sign_agree (share with
                    sign(M) = sign(proxy_effect))}}   (nan where n = 0)
      candidates: [{row, pos, token, adv, p, delta_normal, sets: {name: {size, delta_masked, effect,
                    proxy_effect} | None}}]
      params, lr, pool, low_conf_p, candidate_max_p, n_eligible (tokens that could be candidates),
      n_tokens (valid tokens).
    The model's parameters and ``.grad`` are never written; it runs in eval mode (its training flag is
    restored at the end).
    """
    _check_choice("params", params, PARAMS)
    _check_choice("pool", pool, POOLS)
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    if n_candidates < 1:
        raise ValueError(f"n_candidates must be >= 1, got {n_candidates}")
    B, T = batch.response_mask.shape
    if mask.shape != (B, T):
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(B, T)}")
    if adv_tok.shape == (B,):
        adv_tok = adv_tok[:, None].expand(B, T)
    if adv_tok.shape != (B, T):
        raise ValueError(f"adv_tok has shape {tuple(adv_tok.shape)}, expected {(B, T)} (or ({B},))")
    kw = dict(loss_kwargs or {})
    gen = generator if generator is not None else torch.Generator().manual_seed(0)

    device = next(model.parameters()).device
    head = model.get_output_embeddings()
    tokens = batch.responses.to(device)
    mask = mask.to(device)
    adv_tok = adv_tok.to(device).detach()
    was_training = model.training
    model.eval()
    named = [(f"model.{n}", p) for n, p in model.named_parameters() if p.requires_grad]  # tied: listed once
    runner = _Runner(model)
    try:
        # ---------------------------------------------------------------- pre-update forward (kept)
        W0 = head.weight.detach().to(torch.float64)
        bias = None if getattr(head, "bias", None) is None else head.bias.detach().to(torch.float64)

        def head_logits(h: Tensor, W: Tensor) -> Tensor:
            z = h @ W.T
            return z if bias is None else z + bias

        if params == "lm_head":
            with torch.no_grad():
                hidden = response_forward(model, batch, with_hidden=True).hidden.detach().to(torch.float64)
            W_leaf = W0.clone().requires_grad_(True)
            logp_graph = torch.log_softmax(head_logits(hidden, W_leaf), -1).gather(-1, tokens[..., None])[..., 0]
            leaves = [W_leaf]
        else:
            out = response_forward(model, batch, with_hidden=True)
            logp_graph, leaves = out.logp, [p for _, p in named]
            hidden = out.hidden.detach().to(torch.float64)
        logp0 = logp_graph.detach()
        with torch.no_grad():
            probs = torch.softmax(head_logits(hidden, W0), -1)  # [B, T, V] float64 (for the proxy)
        p0 = logp0.exp()

        def token_coef(adv: Tensor) -> Tensor:
            return loss_token_coefficients(loss_fn, logp0, logp0, adv, mask, **kw)

        def step_grads(coef: Tensor) -> list[Tensor | None]:
            return list(
                torch.autograd.grad(
                    logp_graph, leaves, grad_outputs=coef.to(logp_graph.dtype), retain_graph=True, allow_unused=True
                )
            )

        row_cache: dict[int, TokenBatch] = {}

        def logp_after(coef: Tensor, b: int, t: int) -> float:
            """log p of token (b, t) after one SGD step from theta0 with token coefficients ``coef``."""
            grads = step_grads(coef)
            if params == "lm_head":
                W1 = W0 - lr * (grads[0] if grads[0] is not None else torch.zeros_like(W0))
                with torch.no_grad():
                    return torch.log_softmax(head_logits(hidden[b, t], W1), -1)[tokens[b, t]].item()
            theta1 = {n: (p.detach() if g is None else p.detach() - lr * g) for (n, p), g in zip(named, grads)}
            if b not in row_cache:
                row_cache[b] = batch.select(torch.tensor([b]))
            # select() trims only prompt-side padding and response columns after the row's last valid
            # token, so response position t keeps its index
            with torch.no_grad():
                return torch.func.functional_call(runner, theta1, (row_cache[b],)).logp[0, t].item()

        # ---------------------------------------------------------------- candidates and pools
        valid = mask > 0
        sign = torch.sign(adv_tok)
        eligible = valid & (adv_tok != 0) & (p0 < candidate_max_p)
        elig_idx = eligible.nonzero().cpu()
        order = torch.randperm(elig_idx.shape[0], generator=gen)[:n_candidates]
        cands = elig_idx[order].tolist()
        coef_normal = token_coef(adv_tok)
        normal_after: dict[tuple[int, int], float] = {}
        flat_h, flat_p, flat_y = hidden.reshape(B * T, -1), probs.reshape(B * T, -1), tokens.reshape(-1)

        records: list[dict[str, Any]] = []
        acc = {s: {"effects": [], "sizes": [], "agree": [], "skipped": 0} for s in SETS}
        for b, t in cands:
            s_c = float(sign[b, t])
            y_c = int(tokens[b, t])
            pool_m = valid.clone()
            if pool == "same_sign":
                pool_m &= sign == s_c
            pool_m[b, t] = False
            same_m = pool_m & (tokens == y_c)
            low_m = pool_m & (p0 < low_conf_p)
            sl_m = same_m & low_m
            pool_idx = pool_m.reshape(-1).nonzero()[:, 0].cpu()
            rand_m = torch.zeros(B * T, dtype=torch.bool)
            if pool_idx.numel():
                k = min(max(1, int(sl_m.sum())), pool_idx.numel())
                rand_m[pool_idx[torch.randperm(pool_idx.numel(), generator=gen)[:k]]] = True
            set_masks = {
                "random": rand_m.reshape(B, T).to(device),
                "same": same_m,
                "lowconf": low_m,
                "same_lowconf": sl_m,
            }
            if (b, t) not in normal_after:
                normal_after[(b, t)] = logp_after(coef_normal, b, t)
            before = float(logp0[b, t])
            d_normal = normal_after[(b, t)] - before
            k_row = _kernel_row(hidden[b, t], probs[b, t], y_c, flat_h, flat_p, flat_y)
            rec: dict[str, Any] = {
                "row": b,
                "pos": t,
                "token": y_c,
                "adv": float(adv_tok[b, t]),
                "p": float(p0[b, t]),
                "delta_normal": d_normal,
                "sets": {},
            }
            for name in SETS:
                m_set = set_masks[name]
                size = int(m_set.sum())
                if size == 0:
                    acc[name]["skipped"] += 1
                    rec["sets"][name] = None
                    continue
                adv_m = torch.where(m_set, torch.zeros_like(adv_tok), adv_tok)
                coef_m = token_coef(adv_m)
                after = logp_after(coef_m, b, t)
                effect = s_c * (normal_after[(b, t)] - after)
                proxy = s_c * lr * float(((coef_m - coef_normal).reshape(-1).to(k_row.dtype) * k_row).sum())
                rec["sets"][name] = {
                    "size": size,
                    "delta_masked": after - before,
                    "effect": effect,
                    "proxy_effect": proxy,
                }
                acc[name]["effects"].append(effect)
                acc[name]["sizes"].append(size)
                acc[name]["agree"].append(float((effect > 0) == (proxy > 0)))
            records.append(rec)
    finally:
        model.train(was_training)

    def _mean(xs: list[float]) -> float:
        return float(sum(xs) / len(xs)) if xs else float("nan")

    sets = {
        name: {
            "boost_rate": 100.0 * _mean([float(e > 0) for e in a["effects"]]) if a["effects"] else float("nan"),
            "mean_boost": _mean(a["effects"]),
            "n": len(a["effects"]),
            "mean_set_size": _mean(a["sizes"]),
            "n_skipped": a["skipped"],
            "proxy_sign_agree": _mean(a["agree"]),
        }
        for name, a in acc.items()
    }
    return {
        "sets": sets,
        "candidates": records,
        "params": params,
        "lr": lr,
        "pool": pool,
        "low_conf_p": low_conf_p,
        "candidate_max_p": candidate_max_p,
        "n_eligible": int(elig_idx.shape[0]),
        "n_tokens": int(valid.sum()),
    }


# ---------------------------------------------------------------------------------------------------
# the pipeline analysis (kind "coupling"): Table 1 on a rollout batch of the run's trainer


def analyze(
    ctx,
    *,
    lr: float = 1e-2,
    n_candidates: int = 64,
    low_conf_p: float = 0.5,
    candidate_max_p: float = 0.9,
    pool: str = "same_sign",
    params: list[str] = list(PARAMS),
) -> dict:
    """Coupling masking (Table 1) on rollout batch 0 of the context's trainer: Boost Rate and Mean Boost per
    masked set, for the LM-head-only and the full-parameter plain-SGD update."""
    from creditlab.lm.batch import pack

    for p in params:
        if p not in PARAMS:
            raise ValueError(f"unknown params {p!r}; valid choices: {list(PARAMS)}")
    tr = ctx.trainer
    ro, _ = tr.collect(0)
    batch = pack(ro.prompts, ro.responses, tr.tok.pad_token_id)
    adv = tr.advantage_fn(
        torch.tensor(ro.rewards, dtype=torch.float32),
        torch.tensor(ro.group_ids),
        **(tr.mcfg.get("advantage_kwargs") or {}),
    )
    out = {
        "kind": "coupling",
        "lr": lr,
        "pool": pool,
        "low_conf_p": low_conf_p,
        "candidate_max_p": candidate_max_p,
        "n_rollouts": len(ro.responses),
        "updates": {},
    }
    for p in params:
        res = masking_experiment(
            tr.model,
            batch,
            adv[:, None].expand_as(batch.response_mask).clone(),
            batch.response_mask,
            tr.loss_fn,
            lr=lr,
            params=p,
            n_candidates=n_candidates,
            low_conf_p=low_conf_p,
            candidate_max_p=candidate_max_p,
            pool=pool,
            generator=torch.Generator().manual_seed(ctx.seed),
            loss_kwargs=tr.mcfg.get("loss_kwargs"),
        )
        out["updates"][p] = {k: v for k, v in res.items() if k != "candidates"}
    return out


PAPER_TABLE1 = {
    "random": (50.60, 50.21),
    "same": (66.20, 66.41),
    "lowconf": (44.20, 43.04),
    "same_lowconf": (74.12, 75.00),
}
"""The paper's Boost Rates (LM-head, full) per masked set [paper Table 1]; Mean Boosts are lost in our copy."""


def markdown(result: dict) -> str:
    ps = list(result["updates"])
    head = " | ".join(f"{p}: Boost Rate | {p}: Mean Boost | {p}: set size" for p in ps)
    lines = [
        f"Coupling masking (Table 1): plain SGD, lr = {result['lr']}, masked tokens drawn from the "
        f"{result['pool']} pool; low confidence = p < {result['low_conf_p']}. Paper Boost Rate (LM-head / full) "
        "in the last column, for reference only (tiny model, synthetic data).",
        "",
        f"| masked set | {head} | paper |",
        "|---|" + "---|" * (3 * len(ps)) + "---|",
    ]
    for s in SETS:
        cells = " | ".join(_cells(result["updates"][p]["sets"][s]) for p in ps)
        lines.append(f"| {s} | {cells} | {PAPER_TABLE1[s][0]:.2f} / {PAPER_TABLE1[s][1]:.2f} |")
    return "\n".join(lines) + "\n"


def _cells(r: dict) -> str:
    if not r["n"]:
        return "n/a (no candidate had such tokens) | | "
    return f"{r['boost_rate']:.1f} | {r['mean_boost']:+.2e} | {r['mean_set_size']:.1f}"


def plot(result: dict, png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    ps = list(result["updates"])
    w = 0.8 / (len(ps) + 1)
    for k, p in enumerate(ps):
        ax.bar(
            [i + k * w for i in range(len(SETS))],
            [result["updates"][p]["sets"][s]["boost_rate"] for s in SETS],
            width=w,
            label=f"ours: {p}",
        )
    ax.bar(
        [i + len(ps) * w for i in range(len(SETS))],
        [PAPER_TABLE1[s][0] for s in SETS],
        width=w,
        color="#bbbbbb",
        label="paper (LM head)",
    )
    ax.axhline(50, color="k", lw=0.8, ls="--")
    ax.set_xticks([i + w * len(ps) / 2 for i in range(len(SETS))], list(SETS))
    ax.set_ylabel("Boost Rate (%)")
    ax.set_title("Coupling masking: share of candidates the masked tokens boost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
