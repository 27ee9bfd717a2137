"""Compose a run config from configs/ without Hydra: the subset of Hydra's defaults lists the micro runs use.

The device image has PyYAML but neither Hydra nor OmegaConf, so the GPU check reads ``configs/run.yaml`` and its
groups itself: a primary defaults list of ``group: name`` choices, group configs whose defaults name configs of
their own group (``- dapo``) or an absolute one with a package (``- /method/grpo@method``), ``_self_`` (implicitly
last where absent, as Hydra 1.1+), and the ``# @package _global_`` header. Dicts merge recursively, anything else
is replaced. Interpolations (``${...}``, paper scale only) are refused. tests/test_gpu_check.py checks the result
against ``creditlab.plan.compose`` for every method config at micro scale.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
_GLOBAL = re.compile(r"^#\s*@package\s+_global_\s*$", re.M)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: dicts recursively, other values replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _nest(package: str, data: dict[str, Any]) -> dict[str, Any]:
    for key in reversed([p for p in package.split(".") if p]):
        data = {key: data}
    return data


def _header(text: str) -> str:
    """The leading comment block of a config file (where Hydra reads ``@package``)."""
    lines = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def load_group(group: str, name: str, package: str | None = None, config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """configs/<group>/<name>.yaml with its defaults, as a root-level dict (its content under its package)."""
    text = (config_dir / group / f"{name}.yaml").read_text()
    if "${" in text:
        raise NotImplementedError(f"{group}/{name}.yaml uses interpolations, which this composer does not resolve")
    data = yaml.safe_load(text) or {}
    if package is None:
        package = "" if _GLOBAL.search(_header(text)) else group.replace("/", ".")
    defaults = data.pop("defaults", None) or []
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    out: dict[str, Any] = {}
    for entry in defaults:
        if entry == "_self_":
            out = merge(out, _nest(package, data))
            continue
        if not isinstance(entry, str):
            raise NotImplementedError(f"{group}/{name}.yaml: defaults entry {entry!r} is not supported here")
        ref, _, at = entry.partition("@")
        sub_group, sub_name = ref[1:].rpartition("/")[::2] if ref.startswith("/") else (group, ref)
        out = merge(out, load_group(sub_group, sub_name, at or None, config_dir))
    return out


def _dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        out = merge(out, _nest(key, value) if "." in key else {key: value})
    return out


def compose(
    scale: str,
    backbone: str,
    method: str,
    overrides: dict[str, Any] | None = None,
    seed: int = 0,
    config_dir: Path = CONFIG_DIR,
) -> dict[str, Any]:
    """The run config of (scale, backbone, method, seed) with ``overrides`` ({"trainer.steps": 2, ...}) applied
    last, as ``creditlab.plan.compose`` gives it for scales without interpolations (micro, tiny)."""
    root_text = (config_dir / "run.yaml").read_text()
    root = yaml.safe_load(root_text) or {}
    choices = {"scale": scale, "model": backbone, "method": method}
    out: dict[str, Any] = {}
    defaults = root.pop("defaults", None) or []
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    for entry in defaults:
        if entry == "_self_":
            out = merge(out, root)
            continue
        ((group, name),) = entry.items()
        out = merge(out, load_group(group, choices.get(group, name), None, config_dir))
    return merge(out, _dotted({"seed": seed, **(overrides or {})}))


def method_names(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The method configs (configs/method/*.yaml), sorted."""
    return sorted(p.stem for p in (config_dir / "method").glob("*.yaml"))
