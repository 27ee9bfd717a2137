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


LINEAR_ATTENTION_FAMILIES = ("qwen3_next",)
"""Architecture families (``model.arch.family``, config.json model_type) with linear-attention (Gated DeltaNet)
layers that verl 0.9.1's FSDP engine does not handle: no packed-sequence boundaries, no Ulysses sequence parallelism
(Qwen3.5, model_type ``qwen3_5``, has both in verl 0.9.1: models/transformers/qwen3_5.py)."""


def linear_attention_refusal(run_cfg: Mapping[str, Any], *, remove_padding: bool, ulysses_sp: int) -> str | None:
    """Why verl 0.9.1 would train the run's backbone wrongly with these launcher settings
    (``actor_rollout_ref.model.use_remove_padding``, ``actor.ulysses_sequence_parallel_size``), or None.

    Qwen3-Next's Gated DeltaNet layers (3 of its 4 layers) under verl 0.9.1's FSDP engine (issue 28, item (a);
    tests/test_suspected_qwen3_next.py runs the first two points on a CPU):

    * remove-padding packs a micro-batch into one row (workers/engine/fsdp/transformer_impl.py:1188-1193) and passes
      ``cu_seqlens`` only to a forward that takes it (:594, :1261-1272); transformers' Qwen3NextForCausalLM does not,
      and its Gated DeltaNet reads boundaries only from a ``cu_seq_lens_q`` kwarg (transformers 5.10.4
      models/qwen3_next/modeling_qwen3_next.py:651, :701) that nobody passes: the recurrent state and the causal
      conv run from one rollout into the next, so training log-probs differ from the rollout's, silently;
    * Ulysses sp > 1: verl's monkey patch (models/transformers/monkey_patch.py:497-551) makes the softmax attention
      sequence-parallel for every model but patches a Gated DeltaNet only for Qwen3.5; Qwen3-Next's would each see
      only their rank's slice of the sequence;
    * without remove-padding verl requires sp 1 (workers/config/actor.py:330-341) and its padded rows are right
      (the causal layers never see the padding);
    * envs/cluster.txt installs neither flash-linear-attention nor causal-conv1d, so transformers runs the Gated
      DeltaNet's torch fallback (torch_chunk_gated_delta_rule, modeling_qwen3_next.py:374-384), which swallows a
      ``cu_seqlens`` in ``**kwargs``: a patch that only passes boundaries would need fla as well.
    """
    family = str(((run_cfg.get("model") or {}).get("arch") or {}).get("family", ""))
    if family not in LINEAR_ATTENTION_FAMILIES:
        return None
    why = []
    if remove_padding:
        why.append(
            "actor_rollout_ref.model.use_remove_padding=true packs each micro-batch into one row and verl passes no "
            "sequence boundaries (cu_seqlens) to Qwen3NextForCausalLM, so its Gated DeltaNet layers carry state from "
            "one rollout into the next (verl workers/engine/fsdp/transformer_impl.py:594,1188-1193,1261-1272; "
            "transformers models/qwen3_next/modeling_qwen3_next.py:701)"
        )
    if int(ulysses_sp) > 1:
        why.append(
            f"Ulysses sp={int(ulysses_sp)}: verl's monkey patch makes only the softmax attention sequence-parallel "
            "for this model type, so each rank's Gated DeltaNet layers see only its slice of the sequence (verl "
            "models/transformers/monkey_patch.py:497-551 patches Qwen3.5's GatedDeltaNet only)"
        )
    if not why:
        return None
    return (
        f"model.arch.family={family} (linear-attention layers) would train on wrong log-probs under verl 0.9.1: "
        + "; ".join(why)
        + ". verl computes it right only with use_remove_padding=false and ulysses_sp 1 (padded rows; for long "
        "responses and group-coupled losses that is a memory question), or with a Gated DeltaNet patch that "
        "takes cu_seqlens and Ulysses (as verl's qwen3_5 one does, on flash-linear-attention, which "
        "envs/cluster.txt lacks)"
    )
