"""Methods defined outside creditlab: the modules of other installed packages that register advantages, policy
losses, credit weights, token filters or batchings, found and imported wherever creditlab's own methods are.

A package declares its method modules as entry points of the group :data:`ENTRY_POINT_GROUP` (``creditlab.methods``)
in its ``pyproject.toml``::

    [project.entry-points."creditlab.methods"]
    mymethod = "mypkg.methods"

and each module registers its functions with :func:`creditlab.algos.registry.register` when imported, as creditlab's
own do. A module may also be named without a package entry point: in a run's method config (``modules: [pkg.mod]``,
imported by the plan before any job starts, and exported by the verl launcher) or in ``$CREDITLAB_METHOD_MODULES``
(comma-separated). :mod:`creditlab.algos` calls :func:`load_plugins` after importing its own modules, so every
process that looks a method up (the plan, the local engine, verl's driver and Ray workers through the verl plug-in,
the analyses) has them. A module or entry point that cannot be imported raises :class:`MethodPluginError` naming it,
where it was declared and why; a name registered twice (two packages, or a package and creditlab) raises the
registry's ValueError.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "creditlab.methods"
ENV_MODULES = "CREDITLAB_METHOD_MODULES"
"""Environment variable: comma-separated modules to import as method plug-ins (the verl launcher sets it from the
run's ``method.modules``; verl's entry point forwards it to every Ray process)."""

_LOADED: dict[str, str] = {}
"""Module name -> where it was declared, for every plug-in module imported by this process."""


class MethodPluginError(ImportError):
    """A declared method module (entry point, ``method.modules``, ``$CREDITLAB_METHOD_MODULES``) cannot be imported."""


def env_modules(value: str | None = None) -> list[str]:
    """The modules named in ``$CREDITLAB_METHOD_MODULES`` (or ``value``), in order, blanks dropped."""
    raw = os.environ.get(ENV_MODULES, "") if value is None else value
    return [m.strip() for m in raw.split(",") if m.strip()]


def load_modules(modules: Iterable[str], where: str) -> list[str]:
    """Import ``modules`` (dotted names) so that they register their methods; ``where`` says who named them (in the
    error). Already imported ones are skipped. Returns the names imported by this call."""
    done = []
    for name in modules:
        if name in _LOADED:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # ModuleNotFoundError, or the module's own error while registering
            raise MethodPluginError(
                f"method module {name!r} ({where}) cannot be imported: {type(e).__name__}: {e}; is its package "
                f"installed in this environment ({_python()})?"
            ) from e
        _LOADED[name] = where
        done.append(name)
    return done


def load_plugins() -> list[str]:
    """Import every entry point of :data:`ENTRY_POINT_GROUP` and every module of ``$CREDITLAB_METHOD_MODULES``.
    Returns the module names imported by this call (none the second time)."""
    done = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep.dist, "name", None) or "?"
        where = f"entry point {ep.name!r} = {ep.value!r} of package {dist!r}, group {ENTRY_POINT_GROUP!r}"
        if ep.value in _LOADED:
            continue
        if ep.attr:  # "pkg.mod:obj": the object must exist too
            try:
                ep.load()
            except Exception as e:
                raise MethodPluginError(f"{where} cannot be loaded: {type(e).__name__}: {e}") from e
            _LOADED[ep.value] = where
            done.append(ep.value)
        else:
            done += load_modules([ep.value], where)
    done += load_modules(env_modules(), f"${ENV_MODULES}")
    return done


def loaded() -> dict[str, str]:
    """Module name -> where it was declared, for every plug-in module this process imported."""
    return dict(_LOADED)


def _python() -> str:
    import sys

    return sys.executable
