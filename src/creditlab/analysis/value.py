"""Counterfactual token value by Monte Carlo rollouts (Paper C, SPEC "Paper C" item 6; paper Sec. 3.2
"Cancellation favors tokens with higher value", "The value gap peaks at intermediate entropy", App. E.2).

For a token y sampled at state s (prompt + response prefix) with policy probability p = pi(y | s), the
counterfactual token value is how much better taking y is than sampling an alternative y' != y:

    V(y) = Q(s, y) - E_{y' ~ pi(. | s), y' != y}[Q(s, y')]  =  (Q(s, y) - V(s)) / (1 - p)     [paper, E.2]

(because V(s) = p Q(s, y) + (1 - p) E_{y' != y}[Q(s, y')]). Monte Carlo estimator [paper, Eq. 20]:

    V_hat(y) = (mean_j R(s + y + c_j)  -  mean_j R(s + c'_j)) / (1 - p)

with n complete continuations c_j sampled from s + y and n continuations c'_j sampled from s, R the
binary (verifier) reward of the full response. Ours: 1 - p is clamped to >= eps (tokens with p near 1
make the estimator blow up), the response budget stays the rollout's ``max_new_tokens`` in total.

Pieces:
- :func:`token_values_mc`: V_hat for a list of (row, position) items, all continuations batched;
- :func:`value_gap`: mean value of boosted (delta > eps) minus suppressed (delta < -eps) tokens, with a
  bootstrap CI (paper Fig. 5a);
- :func:`gap_vs_entropy`: the gap on the top-x% highest-entropy tokens (paper Fig. 5b, peak ~ top-40%);
- :func:`sample_balanced_items`: equal numbers of boosted / suppressed tokens from positive / negative
  rollouts (paper Sec. 3.2).

Randomness: every (item, branch) has its own seed :func:`item_seed` (seed, row, position, branch), and
its n continuations are exactly those of ``generate([prefix] * n, params)`` with ``max_new_tokens=budget`` and
``seed=item_seed`` (same uniforms, see :mod:`creditlab.lm.sampler`), whatever the other items of the call are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from creditlab.lm.sampler import (
    DecodeState,
    SamplingParams,
    _decode_batch,
    decode_attention_enabled,
    draw_uniforms,
    sampling_chooser,
)
from creditlab.progress import progress as progress_bar

BRANCH_WITH = 0
"""Branch id of the continuations from s + y (see :func:`item_seed`)."""
BRANCH_STATE = 1
"""Branch id of the continuations from s."""

CLASSES = ("boosted_pos", "boosted_neg", "suppressed_pos", "suppressed_neg")
"""Labels of :func:`sample_balanced_items`: update direction x rollout advantage sign."""

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def item_seed(seed: int, row: int, pos: int, branch: int) -> int:
    """A 63-bit seed, a pure function of (seed, row, pos, branch) [ours]."""
    return int(np.random.SeedSequence([seed, row, pos, branch]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _single(logits: list[Tensor]) -> Tensor:
    return logits[0]


def sample_continuations(
    model: torch.nn.Module,
    prefixes: Sequence[Sequence[int]],
    budgets: Sequence[int],
    seeds: Sequence[int],
    params: SamplingParams,
    *,
    n: int,
    chunk: int = 512,
    progress: bool = False,
    uniforms: Sequence[Tensor] | None = None,
) -> list[list[list[int]]]:
    """n sampled continuations of each prefix, all prefixes decoded together (``progress``: a bar over them).

    prefixes: K token lists (prompt + response prefix); budgets: K max new tokens (<= 0: no
    continuation, n empty lists); seeds: K seeds; params: the token choice and stop tokens (each prefix's
    length and seed are its own: its ``max_new_tokens`` and ``seed`` are not read). Returns [K][n] token lists.
    Continuation j of prefix k is the j-th response of ``generate([prefixes[k]] * n,
    replace(params, max_new_tokens=budgets[k], seed=seeds[k]))`` (its uniforms are replayed row by row; up to the
    floating-point effect of a different batch shape). Rows are sorted by budget and decoded ``chunk``
    at a time, each chunk to its largest budget, every row then cut to its own budget.
    ``uniforms``: K pre-drawn Tensor[n, budgets[k]] of uniforms in [0, 1) (the sampler's inverse-CDF stream) used
    instead of those drawn from ``seeds`` (the seeds are then unused): common random numbers across prefixes
    (creditlab.analysis.credit_fidelity couples the continuations of consecutive prefixes this way).
    """
    chooser = sampling_chooser(_single, params)
    out: list[list[list[int]]] = [[[] for _ in range(n)] for _ in prefixes]
    rows = [(k, j) for k in range(len(prefixes)) if budgets[k] > 0 for j in range(n)]
    if not rows:
        return out
    if uniforms is not None:
        uni = {
            k: torch.as_tensor(uniforms[k], dtype=torch.float32).reshape(n, budgets[k], 1) for k in {k for k, _ in rows}
        }  # [n, b_k, 1]
    else:
        uni = {k: draw_uniforms(n, budgets[k], 1, seeds[k]) for k in {k for k, _ in rows}}  # [n, b_k, 1]
    rows.sort(key=lambda kj: -budgets[kj[0]])  # stable: chunks of similar budgets
    device = next(model.parameters()).device
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), cast, decode_attention_enabled(model):
            state = DecodeState(model)
            bar = progress_bar(len(rows), "mc continuations", enabled=progress)
            for start in range(0, len(rows), chunk):
                part = rows[start : start + chunk]
                width = budgets[part[0][0]]
                u = torch.zeros(len(part), width, 1)
                for r, (k, j) in enumerate(part):
                    u[r, : budgets[k]] = uni[k][j]
                resp, _, _ = _decode_batch(
                    [state], chooser, [list(prefixes[k]) for k, _ in part], u, width, params.stop_ids
                )
                for (k, j), toks in zip(part, resp):
                    out[k][j] = toks[: budgets[k]]
                bar.update(len(part))
            bar.close()
    finally:
        model.train(was_training)
    return out


def token_values_mc(
    model: torch.nn.Module,
    tok,
    scorer,
    prompts: list[list[int]],
    responses: list[list[int]],
    golds: list[str],
    items: list[tuple[int, int]],
    token_probs: Tensor,
    params: SamplingParams,
    *,
    n: int,
    eps: float = 0.05,
    chunk: int = 512,
    progress: bool = False,
) -> dict[str, Tensor]:
    """Monte Carlo counterfactual token value of M tokens [paper, App. E.2, Eq. 20].

    prompts, responses, golds: the rollout batch (B rows; token lists, gold answers). items: M pairs
    (i, t): token y = responses[i][t] at state s = prompts[i] + responses[i][:t]. token_probs:
    Tensor[M], p = pi(y | s) under the policy that samples the continuations.

    For each item, n continuations are sampled from s + y and n from s with ``model`` and ``params`` (temperature,
    top_p, stop tokens: ``eos_id`` None = the tokenizer's EOS), the response budget staying ``params.max_new_tokens``
    in total [ours]: the s + y branch gets
    max_new_tokens - t - 1 new tokens, the s branch max_new_tokens - t; a branch whose budget is <= 0, or
    whose prefix already ends with EOS, is not continued (the response is what it is). Each full
    response (response prefix + continuation) is decoded like the trainer does
    (``tok.batch_decode(..., skip_special_tokens=True)``) and scored by ``scorer.score(texts, golds)``
    (identical (text, gold) pairs scored once). All continuations of all items go through one batched
    decode (``chunk`` rows at a time); item k's branch b uses the seed ``item_seed(params.seed, i, t, b)``.

        r_with  = mean_j R(s + y + c_j)          [paper]
        r_state = mean_j R(s + c'_j)             [paper]
        value   = (r_with - r_state) / max(1 - p, eps)   [paper; the clamp is ours]

    Returns {"value", "r_with", "r_state"}: Tensor[M] float32 each (empty for M = 0).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    token_probs = torch.as_tensor(token_probs, dtype=torch.float32).flatten().cpu()
    if token_probs.numel() != len(items):
        raise ValueError(f"token_probs has {token_probs.numel()} entries for {len(items)} items")
    if params.eos_id is None:
        params = replace(params, eos_id=tok.eos_token_id)
    stops, max_new_tokens = set(params.stop_ids), params.length()
    prefixes, resp_prefixes, budgets, seeds, gold_of = [], [], [], [], []
    for i, t in items:
        resp = list(responses[i])
        if not 0 <= t < len(resp):
            raise IndexError(f"item ({i}, {t}): position outside a response of length {len(resp)}")
        for branch, cut in ((BRANCH_WITH, t + 1), (BRANCH_STATE, t)):
            head = resp[:cut]
            budget = 0 if head and head[-1] in stops else max_new_tokens - cut
            prefixes.append(list(prompts[i]) + head)
            resp_prefixes.append(head)
            budgets.append(budget)
            seeds.append(item_seed(params.seed, i, t, branch))
            gold_of.append(golds[i])
    conts = sample_continuations(model, prefixes, budgets, seeds, params, n=n, chunk=chunk, progress=progress)
    full = [head + c for head, cs in zip(resp_prefixes, conts) for c in cs]
    texts = tok.batch_decode(full, skip_special_tokens=True) if full else []
    gl = [g for g in gold_of for _ in range(n)]
    unique = list(dict.fromkeys(zip(texts, gl)))
    scored = dict(zip(unique, scorer.score([u[0] for u in unique], [u[1] for u in unique]))) if unique else {}
    rewards = torch.tensor([float(scored[k]) for k in zip(texts, gl)], dtype=torch.float64)
    means = rewards.view(len(items), 2, n).mean(-1) if items else torch.zeros(0, 2, dtype=torch.float64)
    r_with, r_state = means[:, BRANCH_WITH], means[:, BRANCH_STATE]
    value = (r_with - r_state) / (1.0 - token_probs.double()).clamp(min=eps)
    return {"value": value.float(), "r_with": r_with.float(), "r_state": r_state.float()}


def value_gap(values: Tensor, delta: Tensor, eps: float, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """Value gap between tokens boosted and suppressed by an update [paper Fig. 5a].

    values, delta: Tensor[M] (token value; Δ log p of the update). Boosted: delta > eps; suppressed:
    delta < -eps [paper]; tokens with a NaN value are left out [ours]. gap = mean value of the boosted
    minus mean value of the suppressed; 95% percentile bootstrap CI of the gap with ``n_boot``
    resamples drawn with replacement within each class (torch generator seeded with ``seed``) [ours].
    Returns floats: gap, ci_low, ci_high, mean_boosted, mean_suppressed and counts n_boosted,
    n_suppressed. An empty class gives its mean, the gap and the CI as NaN (count 0); n_boot = 0 gives
    a NaN CI.
    """
    v = torch.as_tensor(values).detach().flatten().double().cpu()
    d = torch.as_tensor(delta).detach().flatten().double().cpu()
    ok = ~torch.isnan(v)
    boosted, suppressed = v[(d > eps) & ok], v[(d < -eps) & ok]
    nan = float("nan")
    mb = float(boosted.mean()) if boosted.numel() else nan
    ms = float(suppressed.mean()) if suppressed.numel() else nan
    lo = hi = nan
    if boosted.numel() and suppressed.numel() and n_boot > 0:
        g = torch.Generator().manual_seed(seed)
        ib = torch.randint(boosted.numel(), (n_boot, boosted.numel()), generator=g)
        is_ = torch.randint(suppressed.numel(), (n_boot, suppressed.numel()), generator=g)
        boot = boosted[ib].mean(1) - suppressed[is_].mean(1)
        lo, hi = (float(x) for x in torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)))
    return {
        "gap": mb - ms,
        "ci_low": lo,
        "ci_high": hi,
        "mean_boosted": mb,
        "mean_suppressed": ms,
        "n_boosted": int(boosted.numel()),
        "n_suppressed": int(suppressed.numel()),
    }


def gap_vs_entropy(
    values: Tensor,
    delta: Tensor,
    entropy: Tensor,
    eps: float,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    n_boot: int = 1000,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Value gap on the top-x% highest-entropy tokens, for each x in ``fractions`` [paper Fig. 5b].

        values, delta, entropy: Tensor[M]. Tokens are sorted by entropy descending (stable: ties keep their
        order); the top-x subset is the first ceil(x * M) of them [ours], kept in input order (so the 100%
    row, bootstrap included, is exactly ``value_gap(values, delta, eps, n_boot, seed)``). Returns one dict per fraction:
        :func:`value_gap` of the subset plus fraction, n_tokens (subset size) and entropy_min (the lowest
        entropy in the subset, NaN when empty). The paper finds the gap peaks near the top 40%.
    """
    v = torch.as_tensor(values).detach().flatten().cpu()
    d = torch.as_tensor(delta).detach().flatten().cpu()
    h = torch.as_tensor(entropy).detach().flatten().double().cpu()
    if not v.numel() == d.numel() == h.numel():
        raise ValueError(f"values, delta, entropy sizes differ: {v.numel()}, {d.numel()}, {h.numel()}")
    order = torch.sort(h, descending=True, stable=True).indices
    m = h.numel()
    out = []
    for x in fractions:
        k = min(m, max(0, math.ceil(x * m - 1e-9)))
        idx = order[:k].sort().values  # original order: the top-100% row is value_gap of all tokens
        row = {"fraction": float(x), "n_tokens": k, "entropy_min": float(h[idx].min()) if k else float("nan")}
        out.append(row | value_gap(v[idx], d[idx], eps, n_boot=n_boot, seed=seed))
    return out


def sample_balanced_items(
    delta: Tensor,
    mask: Tensor,
    adv: Tensor,
    eps: float,
    per_class: int,
    max_p: float,
    probs: Tensor,
    generator: torch.Generator,
) -> tuple[list[tuple[int, int]], list[str]]:
    """Equal numbers of boosted and suppressed tokens from positive and negative rollouts [paper 3.2].

    delta: Tensor[B, T] Δ log p of the update; mask: Tensor[B, T] (nonzero = valid response token);
    adv: Tensor[B] rollout advantages (positive rollout: adv > 0, negative: adv < 0; adv = 0 rows are
    skipped); probs: Tensor[B, T] policy probability of each token; generator: torch CPU generator.
    Candidates are valid tokens with p <= max_p [ours: p near 1 makes (1 - p) blow the estimator up].
    From each of the four classes :data:`CLASSES` (boosted delta > eps / suppressed delta < -eps x
    positive / negative rollout) up to ``per_class`` tokens are drawn uniformly without replacement.
    Returns (items, labels): items (row, position) grouped by class in :data:`CLASSES` order, sorted
    within a class; labels[k] is the class of items[k].
    """
    d = torch.as_tensor(delta).detach().cpu()
    valid = (torch.as_tensor(mask).detach().cpu() != 0) & (torch.as_tensor(probs).detach().cpu() <= max_p)
    a = torch.as_tensor(adv).detach().flatten().cpu()[:, None].expand_as(d)
    sets = {
        "boosted_pos": (d > eps) & (a > 0),
        "boosted_neg": (d > eps) & (a < 0),
        "suppressed_pos": (d < -eps) & (a > 0),
        "suppressed_neg": (d < -eps) & (a < 0),
    }
    items: list[tuple[int, int]] = []
    labels: list[str] = []
    for name in CLASSES:
        cand = (sets[name] & valid).nonzero()  # [K, 2] (row, position), row-major order
        pick = torch.randperm(cand.shape[0], generator=generator)[:per_class]
        chosen = sorted((int(i), int(t)) for i, t in cand[pick].tolist())
        items += chosen
        labels += [name] * len(chosen)
    return items, labels


# ---------------------------------------------------------------------------------------------------
# the pipeline analysis (kind "value"): one update, then the values of the tokens it moved


def value_probe(
    trainer,
    step: int,
    *,
    eps: float,
    per_class: int,
    max_p: float,
    n: int,
    seed: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict:
    """One joint GRPO update on rollout batch ``step`` of the trainer (restored afterwards), Δ log p on the
    batch, ``per_class`` tokens of each class drawn, their MC values; the value gap boosted - suppressed
    over all sampled tokens, within positive and within negative rollouts, and by top-x% entropy."""
    from creditlab.analysis.flipping import update_shifts

    ro, _ = trainer.collect(step)
    res = update_shifts(trainer, ro, ["joint"], step=step, seed=seed)
    delta = res["delta"]["joint"]
    probs = res["before_logp"].exp()
    items, labels = sample_balanced_items(
        delta, res["mask"], res["adv"], eps, per_class, max_p, probs, torch.Generator().manual_seed(seed)
    )
    t = trainer.tcfg
    rows = torch.tensor([i for i, _ in items], dtype=torch.long)
    cols = torch.tensor([j for _, j in items], dtype=torch.long)
    trainer.model.eval()
    vals = token_values_mc(
        trainer.model,
        trainer.tok,
        trainer.scorer,
        ro.prompts,
        ro.responses,
        ro.golds,
        items,
        probs[rows, cols] if items else torch.zeros(0),
        SamplingParams(
            max_new_tokens=t["max_new_tokens"],
            temperature=t["temperature"],
            top_p=t["top_p"],
            eos_id=trainer.stop_ids,
            seed=seed,
        ),
        n=n,
        progress=trainer.progress,
    )
    trainer.model.train()
    v, d, ent = vals["value"], delta[rows, cols], res["entropy"][rows, cols]
    side = torch.tensor([lab.endswith("_pos") for lab in labels], dtype=torch.bool)
    out = {
        "n_items": len(items),
        "class_counts": {c: labels.count(c) for c in CLASSES},
        "gap_all": value_gap(v, d, eps, seed=seed),
        "gap_positive": value_gap(v[side], d[side], eps, seed=seed),
        "gap_negative": value_gap(v[~side], d[~side], eps, seed=seed),
        "by_entropy": gap_vs_entropy(v, d, ent, eps, fractions, seed=seed) if items else [],
        "reward_mean": float(np.mean(ro.scores)),
        "n_rollouts": len(ro.responses),
    }
    return out


def analyze(ctx, *, eps: float = 1e-3, per_class: int = 32, max_p: float = 0.95, n: int = 8, batches: int = 1) -> dict:
    """Value gap of boosted vs suppressed tokens after one update (paper Fig. 5a) and by entropy (Fig. 5b),
    on ``batches`` rollout batches (each its own probe; the first also gives the entropy curve)."""
    probes = [
        value_probe(ctx.trainer, b, eps=eps, per_class=per_class, max_p=max_p, n=n, seed=ctx.seed + b)
        for b in range(batches)
    ]
    return {"kind": "value", "eps": eps, "per_class": per_class, "max_p": max_p, "n": n, "probes": probes}


def _fmt_gap(g: dict) -> str:
    if g["n_boosted"] == 0 or g["n_suppressed"] == 0:
        return "n/a"
    return f"{g['gap']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]"


def markdown(result: dict) -> str:
    lines = [
        f"Counterfactual token value V(y) = (R(s+y) - R(s)) / (1 - p), {result['n']} continuations per branch; "
        "value gap = mean V of boosted minus suppressed tokens (95% bootstrap CI).",
        "",
        "| batch | tokens | gap (all) | gap (positive rollouts) | gap (negative rollouts) | batch reward |",
        "|---|---|---|---|---|---|",
    ]
    for b, p in enumerate(result["probes"]):
        lines.append(
            f"| {b} | {p['n_items']} | {_fmt_gap(p['gap_all'])} | {_fmt_gap(p['gap_positive'])} | "
            f"{_fmt_gap(p['gap_negative'])} | {p['reward_mean']:.3f} |"
        )
    if result["probes"] and result["probes"][0]["by_entropy"]:
        lines += [
            "",
            "Value gap on the top-x% highest-entropy sampled tokens (batch 0):",
            "",
            "| top-x% | tokens | gap |",
            "|---|---|---|",
        ]
        for r in result["probes"][0]["by_entropy"]:
            lines.append(f"| {100 * r['fraction']:.0f}% | {r['n_tokens']} | {_fmt_gap(r)} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    p0 = result["probes"][0]
    names = [("gap_all", "all"), ("gap_positive", "A>0"), ("gap_negative", "A<0")]
    for k, (key, label) in enumerate(names):
        g = p0[key]
        if g["n_boosted"] and g["n_suppressed"]:
            axes[0].bar(
                k, g["gap"], yerr=[[g["gap"] - g["ci_low"]], [g["ci_high"] - g["gap"]]], capsize=4, color="#2a9d8f"
            )
    axes[0].axhline(0, color="k", lw=0.8)
    axes[0].set_xticks(range(len(names)), [n for _, n in names])
    axes[0].set_ylabel("value gap (boosted - suppressed)")
    axes[0].set_title("Value gap by rollout sign")
    rows = [r for r in p0["by_entropy"] if r["n_boosted"] and r["n_suppressed"]]
    if rows:
        x = [100 * r["fraction"] for r in rows]
        axes[1].plot(x, [r["gap"] for r in rows], marker="o")
        axes[1].fill_between(x, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows], alpha=0.2)
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set_xlabel("top-x% highest-entropy tokens")
    axes[1].set_title("Value gap vs entropy")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
