"""Plan-time checks of analysis kinds, torch-free (the DAG is planned without importing torch): one function per
kind named after it, ``(params, cfg, plan, paper, name) -> reason | None`` (`creditlab.analysis.plan_refusal`).
A returned reason means "cannot run at this scale" (the DAG leaves the analysis out and prints why); a ValueError
is a config error (the plan fails, naming it)."""

from __future__ import annotations

import ast
from functools import cache
from typing import Any


@cache
def analyze_defaults(kind_module: str) -> dict[str, Any]:
    """The literal keyword defaults of ``creditlab.analysis.<kind_module>.analyze``, read from its source (the
    module imports torch): one source of truth for the defaults the plan checks and the job uses."""
    from creditlab.analysis import analyze_node

    a = analyze_node(kind_module).args
    out = {}
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        if default is not None:
            try:
                out[arg.arg] = ast.literal_eval(default)
            except ValueError:
                pass
    return out


def credit_fidelity_cost(params: dict[str, Any], cfg: dict[str, Any]) -> dict[str, float]:
    """Worst-case size of a credit_fidelity job on a run config: truth rollouts, (token, continuation) pairs and
    decoded tokens if every resampled token differed from the rollout's and every continuation ran to the budget
    (the truth, plus the planted check's ``planted_length`` budget)."""
    p = analyze_defaults("credit_fidelity") | dict(params)
    t = cfg["trainer"]
    rollouts = int(p["groups"]) * min(int(p["per_group"]), int(t["group_size"]))
    L, K, Lp = int(t["max_new_tokens"]), int(p["K"]), int(p["planted_length"])
    return {
        "rollouts": rollouts,
        "pairs": rollouts * K * L,
        "worst_decoded_tokens": rollouts * K * (L * (L - 1) / 2 + Lp * (Lp - 1) / 2),
    }


def credit_fidelity(params: dict[str, Any], cfg: dict[str, Any], plan: Any, paper: str, name: str) -> str | None:
    """``methods`` entries naming runs must name runs of the paper (ValueError); refused where the worst-case
    Monte Carlo cost exceeds ``max_decode_tokens`` (paper scale: 20480-token responses)."""
    spec = plan.papers[paper]
    methods = params.get("methods")
    if methods is not None:
        if not isinstance(methods, list) or not methods:
            raise ValueError("params.methods: expected a non-empty list of {label, method | run | criterion, ...}")
        for k, e in enumerate(methods):
            if isinstance(e, dict) and e.get("run") is not None and e["run"] not in spec.runs:
                raise ValueError(
                    f"params.methods[{k}].run: {e['run']!r} is no run of paper {paper!r}; runs: {sorted(spec.runs)}"
                )
    cost = credit_fidelity_cost(params, cfg)
    budget = float((analyze_defaults("credit_fidelity") | dict(params))["max_decode_tokens"])
    if cost["worst_decoded_tokens"] > budget:
        return (
            f"credit_fidelity would decode up to {cost['worst_decoded_tokens']:.3g} tokens ({cost['rollouts']} "
            f"rollouts x K x trainer.max_new_tokens={cfg['trainer']['max_new_tokens']} prefixes, each continued "
            f"to the budget) > max_decode_tokens={budget:.3g}: size it down (fewer groups / K, a run with "
            f"shorter responses) or raise max_decode_tokens"
        )
    return None


def fidelity_gains(params: dict[str, Any], cfg: dict[str, Any], plan: Any, paper: str, name: str) -> str | None:
    """``fidelity`` must name credit_fidelity analyses of the paper and ``table`` one of its tables (ValueError);
    refused where the table is not built at this scale."""
    p = analyze_defaults("fidelity_gains") | dict(params)
    spec = plan.papers[paper]
    names = p["fidelity"]
    if not isinstance(names, list) or not names:
        raise ValueError("params.fidelity: expected a non-empty list of credit_fidelity analyses of the paper")
    for k, n in enumerate(names):
        if n not in spec.analyses or spec.analyses[n].kind != "credit_fidelity":
            raise ValueError(
                f"params.fidelity[{k}]: {n!r} is no credit_fidelity analysis of paper {paper!r}; those: "
                f"{sorted(a for a, x in spec.analyses.items() if x.kind == 'credit_fidelity')}"
            )
    if p["table"] not in spec.tables:
        raise ValueError(f"params.table: {p['table']!r} is no table of paper {paper!r}; tables: {sorted(spec.tables)}")
    if (paper, p["table"]) not in plan.buildable_tables:
        return f"table {paper}/{p['table']} is not built at scale {plan.scale!r}"
    if all((paper, n) in plan.skipped_analyses for n in names):
        return f"every analysis it reads ({', '.join(names)}) is refused at scale {plan.scale!r}"
    return None
