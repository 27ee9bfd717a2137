"""Token flipping and polarity probes (Paper C, Algorithm 1 and Appendix E.1; SPEC.md "Paper C" 3 and 5).

On one fixed rollout batch, from one saved state, one GRPO update is made with the sequence
advantages A_i rewritten by a *mode*, and every token's log-probability is measured before and
after by dedicated forwards of the training model (not the sampler's log-probs):

    Δ_{i,t} = log π_after(o_{i,t} | q, o_{i,<t}) - log π_before(o_{i,t} | q, o_{i,<t})
    boosted if Δ > eps, suppressed if Δ < -eps, else stable                          [paper]

Modes (all from the same snapshot, Δ always measured on the FULL batch) [paper / ours]:
    joint          A_i unchanged (the GRPO update)
    positive_only  A_i * 1[A_i > 0]        (the paper's positive-only control)
    negative_only  A_i * 1[A_i < 0]
    shuffled       A_i permuted over the batch (seeded) [ours]: the same advantage values on the wrong
                   rollouts. Flipping that survives this control is mechanical (shared directions
                   move whatever the signs), not credit assignment: read the joint fractions against it.

The fractions of boosted / suppressed / stable tokens are reported for positive-advantage and
negative-advantage rollouts (signs of the ORIGINAL advantages), over all valid tokens and over
uncertain ones (p_before < ``uncertain_p``: a prototype saw flipping only there). The phenomenon:
under ``joint`` positive and negative rollouts have similar profiles; under ``positive_only`` it
largely disappears. Token classes (polarity probes): which token types each mode boosts.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from creditlab.algos.flipping import CLASSES, classify_shift, flip_fractions
from creditlab.lm.batch import pack, response_forward

MODES = ("joint", "positive_only", "negative_only", "shuffled")
_SHORT = {"positive_only": "pos-only", "negative_only": "neg-only"}


def mode_transform(mode: str, generator: torch.Generator) -> Callable[[Tensor], Tensor] | None:
    """The advantage rewrite of a mode (None for joint)."""
    if mode == "joint":
        return None
    if mode == "positive_only":
        return lambda a: a * (a > 0)
    if mode == "negative_only":
        return lambda a: a * (a < 0)
    if mode == "shuffled":
        return lambda a: a[torch.randperm(a.numel(), generator=generator)]
    raise ValueError(f"unknown flipping mode {mode!r}; valid choices: {list(MODES)}")


def token_class_of(token: str) -> str:
    """Tiny-world token types for the polarity probes [ours]: reasoning = digits and arithmetic operators;
    format = everything else (the template, ``\\boxed{}``, newlines, EOS)."""
    return "reasoning" if token and (token.isdigit() or token in "+-*/=()") else "format"


def update_shifts(trainer, ro, modes: tuple[str, ...] | list[str], step: int, seed: int) -> dict[str, Any]:
    """One update per mode from the trainer's current state on rollout batch ``ro``; the trainer is
    restored to that state afterwards. Returns the before log-probs and entropy, the original
    advantages, the mask and Δ per mode (Tensor[B, T] each, on CPU)."""
    batch = pack(ro.prompts, ro.responses, trainer.tok.pad_token_id)
    model = trainer.model
    snap = trainer.snapshot()
    with torch.no_grad():
        before = response_forward(model, batch, with_entropy=True)
    rewards = torch.tensor(ro.rewards, dtype=torch.float32)
    gids = torch.tensor(ro.group_ids, dtype=torch.long)
    adv = trainer.advantage_fn(rewards, gids, **(trainer.mcfg.get("advantage_kwargs") or {}))
    deltas: dict[str, Tensor] = {}
    for k, mode in enumerate(modes):
        gen = torch.Generator().manual_seed(seed * 1000 + k)
        trainer.learn(step, ro, adv_transform=mode_transform(mode, gen))
        with torch.no_grad():
            after = response_forward(model, batch)
        deltas[mode] = (after.logp - before.logp).float().cpu()
        trainer.restore(snap)
    return {
        "before_logp": before.logp.float().cpu(),
        "entropy": before.entropy.float().cpu(),
        "mask": batch.response_mask.cpu(),
        "adv": adv.cpu(),
        "responses": batch.responses.cpu(),
        "delta": deltas,
    }


def class_shares(
    delta: Tensor, mask: Tensor, responses: Tensor, eps: float, decode: Callable[[int], str]
) -> dict[str, dict[str, float]]:
    """Polarity probes: the share (percent) of boosted and of suppressed tokens that are reasoning vs format tokens."""
    cls = classify_shift(delta, eps)
    valid = mask.bool()
    kinds = {}
    out: dict[str, dict[str, float]] = {}
    for name, v in (("boosted", 1), ("suppressed", -1)):
        ids = responses[valid & (cls == v)].tolist()
        counts = {"reasoning": 0, "format": 0}
        for i in ids:
            if i not in kinds:
                kinds[i] = token_class_of(decode(i))
            counts[kinds[i]] += 1
        n = len(ids)
        out[name] = {k: (100.0 * c / n if n else float("nan")) for k, c in counts.items()} | {"n": n}
    return out


def analyze(
    ctx, *, modes: list[str] = list(MODES), eps: float = 1e-3, uncertain_p: float = 0.9, batches: int = 1
) -> dict[str, Any]:
    """Token flipping (Algorithm 1) and polarity probes on ``batches`` rollout batches of the context's
    trainer (rollout steps 0.. of the run's prompt order); fractions pooled over the batches."""
    for m in modes:
        mode_transform(m, torch.Generator())  # validates the names before any work
    pooled: dict[str, list] = {m: [] for m in modes}
    keep: list[dict[str, Any]] = []
    for b in range(batches):
        ro, _ = ctx.trainer.collect(b)
        res = update_shifts(ctx.trainer, ro, modes, step=b, seed=ctx.seed + b)
        keep.append(res)
        for m in modes:
            pooled[m].append(res["delta"][m])
    rows = []
    for m in modes:
        for subset in ("all", "uncertain"):
            parts = []
            for res, d in zip(keep, pooled[m]):
                sel = res["before_logp"].exp() < uncertain_p if subset == "uncertain" else None
                parts.append((d, res["mask"], res["adv"], sel))
            fr = _pool_fractions(parts, eps)
            for side in ("positive", "negative", "all"):
                rows.append({"mode": m, "tokens": subset, "rollouts": side, **fr[side]})
    probes = {}
    for m in modes:
        shares = [class_shares(d, res["mask"], res["responses"], eps, ctx.decode) for res, d in zip(keep, pooled[m])]
        probes[m] = _pool_shares(shares)
    return {
        "kind": "flipping",
        "eps": eps,
        "uncertain_p": uncertain_p,
        "batches": batches,
        "n_rollouts": sum(int(r["adv"].numel()) for r in keep),
        "rows": rows,
        "token_classes": probes,
    }


def _pool_fractions(parts, eps):
    """flip_fractions over several batches: token-weighted pooling."""
    acc: dict[str, dict[str, float]] = {}
    for d, mask, adv, sel in parts:
        fr = flip_fractions(d, mask, adv, eps, sel)
        for side, v in fr.items():
            a = acc.setdefault(side, {"boosted": 0.0, "suppressed": 0.0, "stable": 0.0, "n": 0})
            for k in CLASSES:
                if v["n"]:
                    a[k] += v[k] * v["n"]
            a["n"] += v["n"]
    return {
        side: {k: (a[k] / a["n"] if a["n"] else float("nan")) for k in CLASSES} | {"n": a["n"]}
        for side, a in acc.items()
    }


def _pool_shares(shares):
    out = {}
    for name in ("boosted", "suppressed"):
        n = sum(s[name]["n"] for s in shares)
        out[name] = {
            k: (sum(s[name][k] * s[name]["n"] for s in shares if s[name]["n"]) / n if n else float("nan"))
            for k in ("reasoning", "format")
        } | {"n": n}
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Token flipping: one update per mode from one state; Δ log p classified with eps = {result['eps']}; "
        f"{result['n_rollouts']} rollouts over {result['batches']} batch(es). Percent of tokens.",
        "",
        "| mode | tokens | rollouts | boosted | suppressed | stable | n tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['mode']} | {r['tokens']} | {r['rollouts']} | {r['boosted']:.1f} | {r['suppressed']:.1f} | "
            f"{r['stable']:.1f} | {r['n']} |"
        )
    lines += [
        "",
        "Polarity probes: share of boosted / suppressed tokens that are reasoning (digits, operators) vs "
        "format tokens.",
        "",
        "| mode | boosted: reasoning | boosted: format | suppressed: reasoning | suppressed: format |",
        "|---|---|---|---|---|",
    ]
    for m, p in result["token_classes"].items():
        lines.append(
            f"| {m} | {p['boosted']['reasoning']:.1f} | {p['boosted']['format']:.1f} | "
            f"{p['suppressed']['reasoning']:.1f} | {p['suppressed']['format']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], png) -> None:
    """Stacked bars: boosted / suppressed / stable for positive and negative rollouts, per mode, all tokens
    and uncertain tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colors = {"boosted": "#2a9d8f", "suppressed": "#e76f51", "stable": "#cccccc"}
    for ax, subset in zip(axes, ("all", "uncertain")):
        labels, bottoms = [], None
        data = {c: [] for c in CLASSES}
        for m in modes:
            for side in ("positive", "negative"):
                r = next(
                    x for x in result["rows"] if x["mode"] == m and x["tokens"] == subset and x["rollouts"] == side
                )
                labels.append(f"{_SHORT.get(m, m)}\n{'A>0' if side == 'positive' else 'A<0'}")
                for c in CLASSES:
                    data[c].append(r[c])
        x = range(len(labels))
        bottoms = [0.0] * len(labels)
        for c in CLASSES:
            ax.bar(x, data[c], bottom=bottoms, color=colors[c], label=c)
            bottoms = [b + v for b, v in zip(bottoms, data[c])]
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_title(f"{subset} tokens" + (f" (p < {result['uncertain_p']})" if subset == "uncertain" else ""))
        ax.set_ylabel("% of tokens")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", fontsize=8, ncol=3)
    fig.suptitle(f"Token flipping after one update (eps = {result['eps']})", x=0.3)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(png, dpi=120)
    plt.close(fig)
