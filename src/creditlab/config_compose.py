"""Hydra composition of ``configs/run.yaml``: a run's override list (:func:`run_args`) and a composer of one primary
config for many override lists, as ``hydra.compose`` would, but faster (:class:`CachedComposer`).

:data:`CONFIG_DIR` and :func:`run_args` live here, below every layer, so that whatever composes a run's config (the
plan, and the data preparation that composes each planned run's ``data``) builds the same override list without
importing the plan.

``hydra.compose`` splits a list of overrides into config-group choices (``model=qwen3-8b-base``: they shape the
defaults tree, i.e. which files are merged) and value overrides (``trainer.lr=1e-6``, ``+a.b=1``, ``~a.b``), merges
the defaults tree's files, then applies the value overrides to the merged config with
``ConfigLoaderImpl._apply_overrides_to_config``. Planning composes 70-110 runs whose group choices take a few dozen
distinct values, and each ``hydra.compose`` call re-reads and re-merges every file (0.1-0.2 s). `CachedComposer`
composes the merged config once per distinct list of group choices (with ``hydra.compose`` itself), and for each run
applies the value overrides to a copy with the same Hydra routine: the same config, the same errors (an unknown key,
a type mismatch, an unknown group option), ~15x cheaper per run. `tests/test_paper_scale.py` checks it equal to
``hydra.compose`` on the runs of every scale, and composes verl's own trainer config with it.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from omegaconf import DictConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
"""The repository's ``configs/`` (``run.yaml``, the config groups, ``papers/``, ``pipeline.yaml``)."""
ENV_CONFIG_PATH = "CREDITLAB_CONFIG_PATH"
"""Environment variable: more config directories (``os.pathsep``-separated), laid out as ``configs/`` (``method/``,
``papers/``, any config group), searched after it; jobs inherit it from the Snakemake that plans them."""


def extra_config_dirs(value: str | None = None) -> list[Path]:
    """The config directories of ``$CREDITLAB_CONFIG_PATH`` (or ``value``), absolute, in order. ValueError naming the
    entry for one that is no directory, or for a file in it that has the name of one of creditlab's own configs (a
    method or paper config would silently lose to creditlab's, or shadow it)."""
    import os

    raw = os.environ.get(ENV_CONFIG_PATH, "") if value is None else value
    dirs = [Path(d).expanduser().resolve() for d in raw.split(os.pathsep) if d.strip()]
    for d in dirs:
        if not d.is_dir():
            raise ValueError(f"${ENV_CONFIG_PATH}: {str(d)!r} is not a directory")
        for f in sorted(d.glob("*/*.yaml")):
            if (CONFIG_DIR / f.parent.name / f.name).exists():
                raise ValueError(
                    f"${ENV_CONFIG_PATH}: {f} has the name of creditlab's configs/{f.parent.name}/{f.name}; rename it"
                )
    return dirs


def search_path_overrides() -> list[str]:
    """The Hydra override that adds :func:`extra_config_dirs` to the config search path (none when there are none)."""
    dirs = extra_config_dirs()
    return [f"hydra.searchpath={hydra_value([f'file://{d}' for d in dirs])}"] if dirs else []


def run_args(
    scale: str, backbone: str, method: str, overrides: Iterable[str], seed: int, config_dir: Path = CONFIG_DIR
) -> list[str]:
    """The Hydra overrides of configs/run.yaml that make a run's config: scale, model, method, seed, its overrides,
    and at a scale whose config has a ``shrink`` list (smoke) that list last (after the papers' own settings)."""
    return [
        f"scale={scale}",
        f"model={backbone}",
        f"method={method}",
        f"seed={seed}",
        *overrides,
        *_shrink(scale, str(config_dir)),
    ]


@lru_cache(maxsize=None)
def _shrink(scale: str, config_dir: str) -> tuple[str, ...]:
    path = Path(config_dir) / "scale" / f"{scale}.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return tuple((data or {}).get("shrink") or ())


class CachedComposer:
    """Compose ``config_name`` of ``config_dir`` for many override lists (use as a context manager: it holds a Hydra
    context, as ``hydra.initialize_config_dir`` does). Composing ``run``, the directories of ``$CREDITLAB_CONFIG_PATH``
    are searched after ``config_dir`` (:func:`search_path_overrides`, read when the context is entered)."""

    def __init__(self, config_dir: str | Path, config_name: str) -> None:
        self.config_dir = str(Path(config_dir).resolve())
        self.config_name = config_name
        self._bases: dict[tuple[str, ...], DictConfig] = {}
        self._searchpath: tuple[str, ...] = ()
        self._context = None
        self._repo = None

    def __enter__(self) -> "CachedComposer":
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        self._context = initialize_config_dir(config_dir=self.config_dir, version_base=None)
        self._context.__enter__()
        # the user's config directories extend creditlab's run tree only (not another tree, e.g. verl's own)
        self._searchpath = tuple(search_path_overrides()) if self.config_name == "run" else ()
        self._repo = GlobalHydra.instance().config_loader().repository
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._context is not None
        self._context.__exit__(exc_type, exc, tb)
        self._context = self._repo = None

    def split(self, overrides: Iterable[str]) -> tuple[list, list]:
        """(config-group overrides, value overrides), parsed, split as Hydra's defaults list does it (a group override
        names an existing config group and has a non-dict value)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if self._repo is None:
            raise RuntimeError("CachedComposer is used outside its `with` block")
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
        groups, values = [], []
        for o in parsed:
            is_group = self._repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict)
            (groups if is_group else values).append(o)
        return groups, values

    def compose(self, overrides: Iterable[str]) -> DictConfig:
        """The composed config (struct mode, unresolved), equal to ``hydra.compose(config_name, overrides)``.

        Raises what ``hydra.compose`` raises (``hydra.errors.HydraException``,
        ``omegaconf.errors.OmegaConfBaseException``).
        """
        from hydra import compose as hydra_compose
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        groups, values = self.split(overrides)
        key = tuple(o.input_line for o in groups) + self._searchpath
        if key not in self._bases:
            self._bases[key] = hydra_compose(config_name=self.config_name, overrides=list(key))
        cfg = copy.deepcopy(self._bases[key])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)  # the step hydra.compose runs after merging
        return cfg


_PLAIN = re.compile(r"[A-Za-z0-9_./:@+\-]+")


def hydra_value(value: Any) -> str:
    """A Python value as a Hydra override value: null, bools, numbers (finite), strings (quoted where the grammar
    needs it), lists and mappings of those; ValueError otherwise. The verl launcher's overrides and the plan's
    method combinations are written with it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in ("null", "true", "false") and not _is_number(value):
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{hydra_value(str(k))}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"no Hydra override form for {type(value).__name__} {value!r}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
