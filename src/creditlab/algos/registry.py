"""Name -> function registries for the methods.

Configs pick methods by name (``advantage: grpo``, ``loss: dapo``, ``credit: [dlogp]``); both engines
look the function up here, so a method is written once. Unknown names fail with the valid choices.
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
    _load_builtin()
    table = _REGISTRIES.get(kind, {})
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; valid choices: {sorted(table)}")
    return table[name]


def names(kind: str) -> list[str]:
    """Sorted names registered under ``kind``."""
    _load_builtin()
    return sorted(_REGISTRIES.get(kind, {}))


def _load_builtin() -> None:
    # Importing the method modules registers them. Layers above algos/ (rewards/) register their own
    # kinds when imported; algos/ never imports upward.
    from creditlab.algos import advantages, batching, losses  # noqa: F401
    from creditlab.algos import credit  # noqa: F401
