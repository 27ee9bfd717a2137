"""The reward registry: reward name -> its score function and its extract/judge split (:class:`RewardSpec`).

Configs pick a reward by name (``trainer.reward: math_verify``); the trainers call its score function
(:func:`get`), the batch scorer runs its :class:`RewardSpec` (:func:`get_reward_spec`). Each reward module
registers both when imported (:func:`register` on the score function, :func:`add_spec` for the split), and
:mod:`creditlab.rewards` imports every reward module on purpose: importing anything under ``creditlab.rewards``
(this module included) runs that package ``__init__`` first, so the registry is always complete, also in the
scorer's worker processes. The methods' kinds (advantage, loss, credit, ...) have their own registry,
:mod:`creditlab.algos.registry`; the decoding criteria theirs, :mod:`creditlab.decoding.criteria`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class RewardSpec:
    """How the scorer runs a registered reward: extract in the caller, judge in a worker.

    ``failure`` is the score of a response with no answer, a judge error, a timeout or a crash.
    ``cache_tag`` versions persisted cache entries (it changes with the judge's implementation).
    """

    name: str
    extract: Callable[[str], str | None]
    judge: Callable[[str, str], float]
    failure: float
    cache_tag: str


_SCORES: dict[str, Callable[..., float]] = {}
REWARD_SPECS: dict[str, RewardSpec] = {}
"""Reward name -> its extract/judge split (what the scorer's worker processes run)."""


def register(name: str) -> Callable[[F], F]:
    """Decorator: register ``fn(response, gold) -> float`` as reward ``name``."""

    def deco(fn: F) -> F:
        if name in _SCORES and _SCORES[name] is not fn:
            raise ValueError(f"reward {name!r} registered twice ({_SCORES[name].__module__} and {fn.__module__})")
        _SCORES[name] = fn
        return fn

    return deco


def add_spec(spec: RewardSpec) -> RewardSpec:
    """Register the extract/judge split of reward ``spec.name`` (the first registration of a name stays)."""
    return REWARD_SPECS.setdefault(spec.name, spec)


def get(name: str) -> Callable[..., float]:
    """The score function of reward ``name``; KeyError lists the valid names."""
    if name not in _SCORES:
        raise KeyError(f"unknown reward {name!r}; valid choices: {sorted(_SCORES)}")
    return _SCORES[name]


def names() -> list[str]:
    """Sorted names of the registered rewards."""
    return sorted(_SCORES)


def get_reward_spec(name: str) -> RewardSpec:
    """The :class:`RewardSpec` of reward ``name``; KeyError lists the valid names."""
    if name not in REWARD_SPECS:
        raise KeyError(f"unknown reward {name!r}; valid choices: {sorted(REWARD_SPECS)}")
    return REWARD_SPECS[name]
