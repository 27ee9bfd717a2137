"""The order in which a few local cores take the DAG's jobs: Snakemake priorities, longest work first.

On 2 cores the wall time of a build is its job-minutes / 2 plus the time one core idles at the end, waiting for the
other's last job. Snakemake's schedulers (ILP and greedy) pick among ready jobs by `priority` first and take ties
in no order that knows a job's length, so a 5-minute run on the larger tiny backbone could start last and end
alone. Longest-processing-time-first list scheduling bounds that tail by the shortest jobs instead: the rules read
these priorities (workflow/rules/common.smk).

- warm-ups first (each gates every run of its backbone), the largest network first: :data:`WARMUP_PRIORITY` plus
  its parameter count in millions;
- then training runs, by their compute: :func:`train_priority`, ``log2`` of parameters x rollout tokens x steps
  (an ordering, not a time: only the order of two runs matters);
- then everything else (evaluations, decodings, analyses, tables: priority 0, Snakemake's default), which fills the
  cores once no run is ready.

Only the order changes: a job's outputs do not depend on when it runs (runs are seeded: the Δlog p and DelTA tables
reproduced to the last printed digit in a whole-plan build whose job order differed, docs/papers/mechanisms.md 10.3).
At paper scale SLURM runs the jobs side by side and the order is the cluster's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from creditlab.resources.shapes import shape_of

WARMUP_PRIORITY = 1000.0
"""Above every training run's priority (:func:`train_priority` stays below ~100 for any run up to 10^30 FLOPs)."""


def train_compute(run_cfg: Mapping[str, Any]) -> float:
    """A run's compute in parameter-tokens: active parameters x (prompt + response budget) x rollouts per step x
    steps x (1 + PPO epochs) (the rollout, and each epoch's forward + backward over the same tokens).

    run_cfg: a resolved run config (``model``, ``trainer``). Proportional to FLOPs up to the attention terms and the
    share of the budget a response uses: enough to order two runs, not to time one."""
    t = run_cfg["trainer"]
    tokens = int(t.get("max_prompt_tokens") or 0) + int(t["max_new_tokens"])
    rollouts = int(t["prompts_per_step"]) * int(t["group_size"])
    passes = 1 + int(t.get("ppo_epochs", 1))
    return float(shape_of(run_cfg).active_params()) * tokens * rollouts * int(t["steps"]) * passes


def train_priority(run_cfg: Mapping[str, Any]) -> float:
    """Snakemake priority of a run's `train` job: ``log2`` of :func:`train_compute` (>= 1), so that of two ready runs
    the one with more compute starts first."""
    return max(1.0, math.log2(max(train_compute(run_cfg), 1.0)))


def warmup_priority(run_cfg: Mapping[str, Any] | None) -> float:
    """Snakemake priority of a backbone's `warmup` job: :data:`WARMUP_PRIORITY` plus the backbone's parameters in
    millions (the larger warm-up, the longer, first). run_cfg: any planned run on that backbone (its ``model``), or
    None where none is planned (the warm-up is then a target of its own: WARMUP_PRIORITY)."""
    if run_cfg is None:
        return WARMUP_PRIORITY
    return WARMUP_PRIORITY + shape_of(run_cfg).params() / 1e6
