"""Post-hoc analyses of RL updates (Paper C): token flipping and polarity probes, coupling masking,
Monte Carlo token values; credit fidelity (issue 23: every method's token credit against Monte Carlo token
advantages) and whether it predicts training gains. Each kind is a module with ``analyze(ctx, **params) -> dict``
(JSON-able),
``markdown(result) -> str`` and ``plot(result, png)``; paper configs declare analyses by kind
(``analyses:`` in configs/papers/*.yaml) and ``python -m creditlab analyze`` runs one."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable

KINDS = ("flipping", "coupling", "value", "value_budget", "credit_fidelity", "fidelity_gains")
_MODULES = {
    "flipping": "flipping",
    "coupling": "coupling",
    "value": "value",
    "value_budget": "value_budget",
    "credit_fidelity": "credit_fidelity",
    "fidelity_gains": "fidelity_gains",
}
_PLAN_CHECKS = {"credit_fidelity": "credit_fidelity", "fidelity_gains": "fidelity_gains"}
"""Kinds with a plan-time check: a function of ``creditlab.analysis.plan_checks`` named after the kind."""


def plan_refusal(
    kind: str, params: dict[str, Any], cfg: dict[str, Any], plan: Any, paper: str, name: str
) -> str | None:
    """Why analysis ``name`` (kind ``kind``, ``params``) of ``paper`` cannot run at the plan's scale on its run's
    resolved config ``cfg`` (None: it can), from its kind's torch-free check in ``creditlab.analysis.plan_checks``;
    ValueError for a config error (a methods entry naming no run of the paper, ...)."""
    if kind not in _PLAN_CHECKS:
        return None
    from creditlab.analysis import plan_checks

    return getattr(plan_checks, _PLAN_CHECKS[kind])(params, cfg, plan, paper, name)


def analyze_params(kind: str) -> list[str]:
    """The keyword parameters of a kind's ``analyze(ctx, ...)``, read from its module's source without importing it
    (the modules import torch and transformers: planning the DAG checks paper configs' ``params`` against these names
    and should not pay for those imports). Equal to ``inspect.signature(kind_module(kind).analyze)`` minus ``ctx``
    (tested)."""
    if kind not in _MODULES:
        raise ValueError(f"unknown analysis kind {kind!r}; valid choices: {list(KINDS)}")
    a = analyze_node(_MODULES[kind]).args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n != "ctx"]


@functools.cache
def analyze_node(module: str):
    """The ``ast.FunctionDef`` of ``analyze`` in ``creditlab.analysis.<module>``, parsed from its source without
    importing it (ValueError when it defines none)."""
    import ast
    from importlib.util import find_spec

    spec = find_spec(f"creditlab.analysis.{module}")
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=spec.origin)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "analyze":
            return node
    raise ValueError(f"creditlab.analysis.{module} defines no analyze()")


def kind_module(kind: str):
    """The module implementing an analysis kind (ValueError naming the choices otherwise)."""
    if kind not in _MODULES:
        raise ValueError(f"unknown analysis kind {kind!r}; valid choices: {list(KINDS)}")
    return importlib.import_module(f"creditlab.analysis.{_MODULES[kind]}")


@dataclass
class AnalysisContext:
    """What an analysis works with: the run's local trainer (model in its start state, the run's config,
    its real reward scorer), a token decoder, the seed, and a factory for a trainer with config
    overrides (sweeps over batch size / rollout n start from the same weights). A kind whose module sets
    ``NEEDS_MODEL = False`` (it reads built results) gets no trainer: ``results``, ``scale`` and ``paper`` only."""

    trainer: Any
    decode: Callable[[int], str] | None
    seed: int
    make_trainer: Callable[[list[str]], Any] | None = None
    method_config: Callable[[str, str, list[str]], dict[str, Any]] | None = None
    """(kind, name, overrides) -> the ``method`` block of a method config (kind "method") or of a run of the paper
    (kind "run") at the run's scale, composed and checked (credit_fidelity scores methods by their own configs)."""
    reference: Callable[[], Any] | None = None
    """The reference model of a trained start (the warmed-up base model); None at ``start: base``."""
    results: Any = None
    scale: str | None = None
    paper: str | None = None
