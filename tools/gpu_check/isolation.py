"""Make installed packages absent for this process, so the check runs here as in the device image that lacks them.

:func:`hide` replaces ``importlib.machinery.PathFinder`` in ``sys.meta_path`` by a finder that answers "not found"
for the hidden top-level names (an ``import`` raises ModuleNotFoundError, ``importlib.util.find_spec`` returns None,
and ``importlib.metadata`` lists no such distribution, which is how ``transformers`` and ``accelerate`` probe for
optional packages) and defers to PathFinder for everything else. Call it before anything imports them.
"""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder

DEVICE_ABSENT = (
    "ray",
    "verl",
    "vllm",
    "hydra",
    "omegaconf",
    "mlflow",
    "snakemake",
    "math_verify",
    "latex2sympy2_extended",
    "transfer_queue",
    "tensordict",
    "datasets",
    "pydantic",
    "wandb",
    "codetiming",
    "torchdata",
    "dill",
)
"""Import names of packages creditlab's environment has and the device machine's image does not (its package
list): the stacks of the verl engine, the pipeline and tracking, and dill (torch's data pipes take it when present)."""

_DIST_NAMES = {"hydra": "hydra-core", "transfer_queue": "transferqueue", "mlflow": "mlflow-skinny"}


def _norm(name: str) -> str:
    return name.lower().replace("-", "_")


class _HidingFinder:
    """PathFinder, blind to ``hidden`` top-level modules and distributions."""

    hidden: frozenset[str] = frozenset()

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in cls.hidden:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        names = {_norm(n) for n in cls.hidden} | {_norm(_DIST_NAMES[n]) for n in cls.hidden if n in _DIST_NAMES}
        names |= {n + "_skinny" for n in names}
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if _norm(dist.metadata["Name"] or "") not in names:
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


def hide(names: tuple[str, ...] | list[str] = DEVICE_ABSENT) -> list[str]:
    """Hide ``names`` (top-level import names) from this process; returns those already imported (too late)."""
    _HidingFinder.hidden = frozenset(names)
    sys.meta_path[:] = [_HidingFinder if f is PathFinder else f for f in sys.meta_path]
    return imported(names)


def imported(names: tuple[str, ...] | list[str] = DEVICE_ABSENT) -> list[str]:
    """Which of ``names`` are imported in this process (the proof that a run did without them; a ``None`` entry in
    ``sys.modules``, another way to block an import, is no import)."""
    return sorted({m.partition(".")[0] for m, mod in list(sys.modules.items()) if mod is not None} & set(names))
