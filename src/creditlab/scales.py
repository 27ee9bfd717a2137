"""What each scale is: which run the papers' hub models and data, and which read the paper configs as `paper`.

* ``tiny`` (default) and ``micro``: the embedded world (tiny models warmed up by SFT, synthetic suites, the local
  engine); each has its own columns in a paper config's ``backbones`` / ``benchmarks`` maps.
* ``paper``: the papers' backbones (hub checkpoints), hub datasets, verl on GPU clusters, vLLM evaluation.
* ``smoke``: the ``paper`` pipeline itself on a CPU (random-init stand-ins of the paper backbones written as hub
  snapshots, the hub fixtures as data, verl's own loop on a CPU, a few steps): it reads every paper config exactly as
  ``paper`` does (backbones, benchmarks, the papers' hyperparameters, seeds), then shrinks the sizes
  (``configs/scale/smoke.yaml`` ``shrink``). It proves the cluster's code paths execute; its numbers mean nothing.
"""

from __future__ import annotations

SCALES = ("tiny", "micro", "paper", "smoke")
HUB_SCALES = ("paper", "smoke")
"""Scales whose models are the papers' backbones (hub checkpoints or their stand-ins) and whose data is hub data."""
READS_AS = {"smoke": "paper"}
"""A scale that reads the paper configs' per-scale entries (backbones, benchmarks, scale_overrides, seeds, ...) as
another scale does."""


def spec_scale(scale: str) -> str:
    """The scale whose entries of a paper config ``scale`` uses (``smoke`` -> ``paper``; others: themselves)."""
    return READS_AS.get(scale, scale)


def is_hub(scale: str) -> bool:
    """Whether ``scale`` trains the papers' backbones (verl, hub-format data): ``paper`` and ``smoke``."""
    return scale in HUB_SCALES


SMOKE_MAX_SP = 2
"""Ulysses sequence-parallel size a smoke run keeps at most (a 2-core machine runs 2 ranks)."""


def smoke_job(verl_job: dict) -> dict:
    """A backbone's verl job (``model.verl``) sized for a CPU: one node, as many ranks as its Ulysses sp capped at
    :data:`SMOKE_MAX_SP` (so sp > 1 backbones still run Ulysses over 2 ranks), one rollout replica over all of them
    (``rollout_tp`` = ranks: the CPU rollout serves a replica from one process, and its sampling seeds count the
    requests per prompt, which two replicas would each count from 0), no offload."""
    sp = min(int(verl_job["ulysses_sp"]), SMOKE_MAX_SP)
    return {
        **verl_job,
        "nnodes": 1,
        "n_gpus_per_node": sp,
        "ulysses_sp": sp,
        "rollout_tp": sp,
        "param_offload": False,
        "optimizer_offload": False,
    }
