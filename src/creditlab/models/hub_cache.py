"""Where the hub's model snapshots and datasets are cached (one setting, ``hub_cache``) and how much room they take.

The pipeline config's ``hub_cache`` (default ``$SCRATCH/creditlab/hub``: the shared scratch) is the root of both
caches of the paper scale: model snapshots under ``<hub_cache>/huggingface`` (``HF_HOME``: ``warmup`` fetches
each backbone there with ``huggingface_hub.snapshot_download``) and the raw datasets under ``<hub_cache>/datasets``
(``CREDITLAB_HUB_RAW``: ``prepare_data`` downloads there). A variable already set in the environment wins, so a site
that keeps its own ``HF_HOME`` keeps it. Unset (and no ``HF_HOME``), huggingface_hub caches under ``~/.cache``:
often a small home quota, while the nine paper backbones' snapshots take ~0.4 TB (:func:`snapshot_bytes`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ENV_HF_HOME = "HF_HOME"
ENV_HUB_RAW = "CREDITLAB_HUB_RAW"
_VAR = re.compile(r"\$(?:(\w+)|\{(\w+)\})")  # $NAME or ${NAME}

BYTES_PER_PARAM = 2
"""The paper backbones' hub checkpoints are stored in bfloat16: 2 bytes per parameter."""
SNAPSHOT_MARGIN = 1.02
"""Tokenizer, configs and safetensors headers on top of the weights: a 2% margin (an estimate, not measured)."""


def hub_cache_env(hub_cache: str | None, environ: Mapping[str, str] = os.environ) -> tuple[dict[str, str], str]:
    """(the variables a job needs so that snapshots and datasets land under ``hub_cache``, a line saying where they
    go). Environment variables in ``hub_cache`` are expanded (``$SCRATCH/creditlab/hub``); a variable ``environ``
    already sets is left out (it wins). ``hub_cache`` unset, or naming an unset variable: nothing exported, and the
    line says so (huggingface_hub's default is ``~/.cache``). ValueError for a relative path."""
    default = environ.get(ENV_HF_HOME) or "~/.cache/huggingface (huggingface_hub's default: often a small home quota)"
    if not hub_cache:
        return {}, f"hub_cache unset: hub snapshots go to {default}"
    root = os.path.expanduser(_VAR.sub(lambda m: environ.get(m[1] or m[2], m[0]), hub_cache))
    if "$" in root:
        return {}, f"hub_cache {hub_cache!r} names an unset variable: hub snapshots go to {default}; set hub_cache"
    if not os.path.isabs(root):
        raise ValueError(
            f"hub_cache {hub_cache!r} is not an absolute path; set it to a directory on the shared scratch the compute "
            f"nodes see (configs/pipeline.yaml or --config hub_cache=...)"
        )
    want = {ENV_HF_HOME: str(Path(root) / "huggingface"), ENV_HUB_RAW: str(Path(root) / "datasets")}
    env = {k: v for k, v in want.items() if not environ.get(k)}
    where = ", ".join(
        f"{k}={environ.get(k) or v}" + ("" if k in env else " (from the environment)") for k, v in want.items()
    )
    return env, f"hub snapshots and datasets: {where}"


def snapshot_bytes(model: Mapping[str, Any]) -> int:
    """Bytes of one hub backbone's snapshot, estimated: ``arch.params_b`` x :data:`BYTES_PER_PARAM` x
    :data:`SNAPSHOT_MARGIN`; 0 for a model that is not a hub model."""
    if model.get("kind") != "hub":
        return 0
    arch = model.get("arch") or {}
    if "params_b" not in arch:
        raise ValueError(f"model {model.get('name')!r}: arch.params_b is needed to size its hub snapshot")
    return int(float(arch["params_b"]) * 1e9 * BYTES_PER_PARAM * SNAPSHOT_MARGIN)


def hub_cache_bytes(run_configs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The hub snapshots the planned runs read (resolved run configs): hf_id -> bytes, each snapshot once (runs
    sharing a backbone share its snapshot). Their sum is the hub cache's size in the plan's resource table."""
    out: dict[str, int] = {}
    for cfg in run_configs:
        model = cfg["model"]
        if model.get("kind") == "hub":
            out.setdefault(str(model["hf_id"]), snapshot_bytes(model))
    return out
