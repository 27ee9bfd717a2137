"""Name -> function registries of the methods, one table per kind (advantage, policy_loss, credit, token_filter,
batching).

Configs pick methods by name (``advantage: grpo``, ``loss: dapo``, ``credit: [dlogp]``); both engines
look the function up here, so a method is written once. Unknown names fail with the valid choices. The method
modules register themselves with :func:`register` when imported, and :mod:`creditlab.algos` imports all of them
(its ``__init__`` runs before this module), then the method modules of other packages (:mod:`creditlab.algos.plugins`),
so the tables are complete whenever this module is importable.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

_REGISTRIES: dict[str, dict[str, Callable]] = {}


def register(kind: str, name: str) -> Callable[[F], F]:
    """Decorator: register ``fn`` under ``kind``/``name`` (e.g. ``register("advantage", "grpo")``)."""

    def deco(fn: F) -> F:
        table = _REGISTRIES.setdefault(kind, {})
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} registered twice ({table[name].__module__} and {fn.__module__})")
        table[name] = fn
        return fn

    return deco


def get(kind: str, name: str) -> Callable:
    """Return the function registered as ``kind``/``name``; KeyError lists the valid names."""
    table = _REGISTRIES.get(kind, {})
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; valid choices: {sorted(table)}")
    return table[name]


def names(kind: str) -> list[str]:
    """Sorted names registered under ``kind``."""
    return sorted(_REGISTRIES.get(kind, {}))
