"""Value gap vs sampling budget (Paper C, "Larger sampling budget strengthens cancellation", Fig. 6): the
value probe of :mod:`creditlab.analysis.value` repeated from the same weights with the rollout batch's
prompts per step (batch size) and rollouts per prompt (rollout n) varied one at a time."""

from __future__ import annotations

from typing import Any

from creditlab.analysis.value import _fmt_gap, value_probe


def analyze(
    ctx,
    *,
    batch_sizes: list[int] = [8, 16, 32],
    rollout_n: list[int] = [4, 8, 16],
    eps: float = 1e-3,
    per_class: int = 24,
    max_p: float = 0.95,
    n: int = 8,
) -> dict[str, Any]:
    """For each prompts-per-step in ``batch_sizes`` (rollout n at the run's) and each rollout n (group size)
    in ``rollout_n`` (batch size at the run's): a fresh trainer from the same weights, one update, the
    value gap of the tokens it boosted vs suppressed."""
    if ctx.make_trainer is None:
        raise ValueError("value_budget needs a context that can build trainers with overrides")
    rows = []
    base = ctx.trainer.tcfg
    for axis, key, values in (("batch size", "prompts_per_step", batch_sizes), ("rollout n", "group_size", rollout_n)):
        for v in values:
            trainer = ctx.make_trainer([f"trainer.{key}={v}"])
            p = value_probe(trainer, 0, eps=eps, per_class=per_class, max_p=max_p, n=n, seed=ctx.seed)
            rows.append(
                {
                    "axis": axis,
                    "value": v,
                    "prompts_per_step": trainer.tcfg["prompts_per_step"],
                    "group_size": trainer.tcfg["group_size"],
                    **p,
                }
            )
    return {
        "kind": "value_budget",
        "eps": eps,
        "n": n,
        "per_class": per_class,
        "run_prompts_per_step": base["prompts_per_step"],
        "run_group_size": base["group_size"],
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "Value gap (boosted - suppressed, 95% bootstrap CI) after one update, by sampling budget.",
        "",
        "| axis | value | prompts x rollouts | tokens | gap (all) | gap (A>0) | gap (A<0) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['axis']} | {r['value']} | {r['prompts_per_step']} x {r['group_size']} | {r['n_items']} | "
            f"{_fmt_gap(r['gap_all'])} | {_fmt_gap(r['gap_positive'])} | {_fmt_gap(r['gap_negative'])} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, axis in zip(axes, ("batch size", "rollout n")):
        rows = [
            r
            for r in result["rows"]
            if r["axis"] == axis and r["gap_all"]["n_boosted"] and r["gap_all"]["n_suppressed"]
        ]
        if rows:
            x = [r["value"] for r in rows]
            g = [r["gap_all"] for r in rows]
            ax.errorbar(
                x,
                [v["gap"] for v in g],
                yerr=[[v["gap"] - v["ci_low"] for v in g], [v["ci_high"] - v["gap"] for v in g]],
                marker="o",
                capsize=4,
            )
            ax.set_xscale("log", base=2)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel(axis)
        ax.set_title(f"Value gap vs {axis}")
    axes[0].set_ylabel("value gap")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
