"""The size of a run's verl job read from its resolved config: data-parallel ranks, Ulysses sp, token budgets.

Shared by the launcher (``launch.py``: verl's micro-batch budgets) and the plug-in (``plugin.py``: the batching
overrides of group-coupled losses), so that neither imports the other for them; pure, no verl import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def token_len_per_gpu(run_cfg: Mapping[str, Any]) -> int:
    """verl's per-GPU token budget of a (dynamic-batch-size) micro-batch: ceil(model.verl.token_len_factor x
    (max_prompt_tokens + max_new_tokens)) -> actor.ppo_max_token_len_per_gpu and the log-prob passes' budgets
    (the plug-in raises the actor's for group-coupled losses, whose micro-batches hold whole groups)."""
    t = run_cfg["trainer"]
    factor = float(run_cfg["model"]["verl"]["token_len_factor"])
    return int(math.ceil(factor * (int(t["max_prompt_tokens"]) + int(t["max_new_tokens"]))))


def verl_sizes(run_cfg: Mapping[str, Any]) -> tuple[int, int] | None:
    """(data-parallel ranks, Ulysses sp) of the actor from the run config's ``model.verl`` (the launcher's job
    size), or None when the run config has none (tiny / micro backbones)."""
    v = (run_cfg.get("model") or {}).get("verl")
    if not v:
        return None
    sp = int(v["ulysses_sp"])
    return int(v["nnodes"]) * int(v["n_gpus_per_node"]) // sp, sp
