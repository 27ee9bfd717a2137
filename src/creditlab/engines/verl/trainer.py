"""creditlab's verl V1 trainer: verl's sync trainer with creditlab's batch orders, credit folding and token flipping.

verl 0.9.1's V1 sync trainer (``verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync``) runs one step as
  sample (ReplayBuffer over TransferQueue) -> ``_balance_batch`` -> ``_compute_old_log_prob`` ->
  ``_compute_ref_log_prob`` -> ``_compute_advantage`` -> ``_update_actor``
on a ``KVBatchMeta`` (keys ``{uid}_{session}_{index}`` of the rollouts in TransferQueue, with tags such as
``seq_len``). :class:`CreditlabTrainer` (registered as ``trainer.v1.trainer_mode=creditlab_sync``) overrides:

* ``_balance_batch``: with ``trainer.batching=query_preserved`` (QB, Paper C) the batch is ordered so that
  verl's own dispatch (contiguous equal chunks per data-parallel rank) and mini-batching (contiguous slices
  of ``ppo_mini_batch_size * n / dp`` rows per rank, ``actor.shuffle=false``) put every group whole into one
  optimizer step and onto one rank (:func:`qb_order`, built on creditlab's ``partition_bins``); with
  ``trainer.batching=sequential`` (Paper E) so that the same dispatch and mini-batching realise creditlab's
  sequential mini-batches (groups contiguous, in order, no balancing: :func:`sequential_order`); with
  ``trainer.batching=verl_ray`` verl's legacy ``RayPPOTrainer._balance_batch`` order, the papers' (V1's partition,
  each rank's rows by workload and interleaved: ``algos.batching.verl_ray_partition_order``); otherwise V1's
  token balancing (V1 calls ``_balance_batch`` whatever ``trainer.balance_batch`` says). All log
  ``creditlab/groups_split_frac`` of the mini-batches verl will cut. For a group-coupled loss (grpo_fix, dfpo)
  the order is checked to hold every group as G consecutive rows of one rank (:func:`groups_aligned`).
* ``_compute_old_log_prob``: when a credit function needs worker inputs (hidden states) or LoRA's reference
  pass, first writes the sequence advantages A_i to TransferQueue and the credit spec into the batch's
  ``extra_info``, so that the workers (``workers.CreditlabActorRolloutRefWorker``) compute them in the same
  forward; ``_compute_ref_log_prob`` then reuses the fused reference pass.
* ``_compute_advantage``: after verl's (our registered ``creditlab_<advantage>`` estimator: A_i on every
  token), folds the credit weights into the per-token advantages and computes the token-filter loss mask
  (``plugin.fold_credit``); logs Paper D's weight Gini / EffN/T and the adapter residual.
* ``_update_actor``: token filters restrict verl's loss mask (``response_mask`` / ``loss_mask``, the
  token-mean normaliser) for the update only; a group-coupled loss gets verl's ``force_group_size = G`` in the
  batch's ``extra_info`` (carried to every rank's mini-batches as non-tensor data and read by
  ``verl.workers.engine.utils.prepare_micro_batches``: consecutive G rows stay in one micro-batch, with dynamic
  batch sizes or fixed micro-batches of ``ppo_micro_batch_size_per_gpu`` groups); optionally a post-update
  log-prob pass measures token flipping
  (Paper C, Algorithm 1: Δ log p of every token after the step's update, ``creditlab/flip/...``).
* ``_init_resource_pool_mgr``: our worker class in place of verl's ``ActorRolloutRefWorker``.

The orders and checks themselves are pure and verl-free (``engines/verl/ordering.py``); reward-balanced batching
(RB, Paper C) is a verl custom replay buffer, ``samplers.RewardBalancedSampler``, whose waiting groups the trainer's
checkpoints save and restore.

Everything that needs verl's Ray worker group and GPUs is written against verl's classes but exercised on CPU
only piecewise (tests/test_verl_plugin.py): the balancing with verl's real code, the sampler against a real
TransferQueue, and the pure functions.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from tensordict import TensorDict
from torch import Tensor
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance
from verl.workers.utils.padding import response_from_nested, response_to_nested

from creditlab.algos.batching import groups_split_frac, verl_ray_partition_order
from creditlab.algos.credit.arca import weight_diagnostics
from creditlab.algos.credit.base import REF_INPUTS, CreditInputs, TokenCredit, credit_inputs_of, method_entries
from creditlab.allocation import AllocationClock, write_pause
from creditlab.engines.verl.ordering import (
    content_order,
    flip_metrics,
    groups_aligned,
    padded,
    qb_order,
    sequential_order,
    sign_order,
    uid_of,
    verl_minibatches,
    zero_signal_frac,
)
from creditlab.engines.verl.plugin import (
    ENV_RUN_CONFIG,
    GROUP_BATCHINGS,
    ORDERED_BATCHINGS,
    TRAINER_MODE,
    fold_credit,
    group_index,
    needs_group_ids,
    run_config,
    runs_on_worker,
    sequence_advantages,
    verl_options,
)
from creditlab.engines.verl.samplers import RewardBalancedSampler
from creditlab.engines.verl.workers import (
    CREDIT_KEY,
    OUT_FILTER,
    OUT_REF,
    OUT_RESIDUAL,
    OUT_SP_CHECK,
    OUT_WEIGHTS,
    SEQ_ADV,
    CreditlabActorRolloutRefWorker,
)
from creditlab.seeds import step_seed

PLUGIN_PREFIX = "creditlab/"
"""Prefix of the metrics the plug-in logs into verl's (MLflow) metrics."""
METRIC_NAMES = {
    "reward_mean": "critic/rewards/mean",
    "score_mean": "critic/score/mean",
    "response_len_mean": "response_length/mean",
    "entropy_mean": "actor/entropy",
    "clipfrac": "actor/pg_clipfrac",
    "t_step": "timing_s/step",
}
"""creditlab's metric names (those of the local engine's metrics.jsonl, read by tables and figures) -> verl's."""


def metrics_line(global_step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """One metrics.jsonl object of verl's step ``global_step`` (1-based): ``step`` 0-based as the local engine writes
    it (the tables count steps from it), creditlab's names (:data:`METRIC_NAMES`; the plug-in's own ``creditlab/<k>``
    metrics also as ``<k>``, the name the local engine logs and tables read, e.g. ``weight_gini``) and every numeric
    verl metric under its own name."""
    out: dict[str, Any] = {"step": int(global_step) - 1, "global_step": int(global_step)}
    for k, v in metrics.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    out |= {ours: out[theirs] for ours, theirs in METRIC_NAMES.items() if theirs in out}
    out |= {
        k[len(PLUGIN_PREFIX) :]: v
        for k, v in list(out.items())
        if k.startswith(PLUGIN_PREFIX) and k[len(PLUGIN_PREFIX) :] not in out
    }
    return out


def append_metrics(path: str, line: dict[str, Any]) -> None:
    """Add a step's line to metrics.jsonl, dropping lines of that step or later (a resumed run re-does them)."""
    kept = []
    if os.path.isfile(path):
        with open(path) as f:
            kept = [x for x in f if x.strip() and json.loads(x)["step"] < line["step"]]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept + [json.dumps(line) + "\n"])
    os.replace(tmp, path)


LOSS_MASK = "creditlab_loss_mask"
"""TransferQueue field: the loss mask after token filters (nested over response tokens)."""


# ------------------------------------------------------------------------------------------------------
# the trainer


class AllocationPaused(RuntimeError):
    """The run stopped after checkpointing a step because its SLURM allocation ends (creditlab.allocation)."""


@register_trainer(TRAINER_MODE)
class CreditlabTrainer(PPOTrainerSync):
    """verl's V1 sync trainer with creditlab's batching, credit folding and diagnostics (module docstring).

    The run config comes from ``creditlab.config_path`` in verl's config (the launcher's
    ``+creditlab.config_path=<yaml>``). Behaves as verl's ``sync`` mode everywhere (``trainer_mode`` is
    reset to ``sync`` before verl's initialisation reads it).
    """

    def __init__(self, config: DictConfig):
        path = OmegaConf.select(config, "creditlab.config_path")
        if not path:
            raise ValueError("creditlab trainer: +creditlab.config_path=<resolved run config YAML> is required")
        os.environ[ENV_RUN_CONFIG] = os.path.abspath(path)
        self.run_cfg = run_config(os.path.abspath(path))
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"  # verl's sync semantics (replay buffer, refill, checkpoints)
        super().__init__(config)
        self._setup_creditlab()

    # -- metrics.jsonl beside the run config (what cmd_train, the tables and the figures read)
    def _compute_metrics(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict, global_steps: int, epoch: int):
        out = super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        if self.options.get("device") == "cpu":  # the CPU rollout's weight syncs so far (one per step expected)
            from creditlab.engines.verl.cpu import server_syncs

            syncs = server_syncs(0)
            metrics["creditlab/rollout_weight_syncs"] = len(syncs)
            metrics["creditlab/rollout_weights_checksum"] = syncs[-1]["checksum"] if syncs else 0.0
        run_dir = os.path.dirname(os.environ[ENV_RUN_CONFIG])
        append_metrics(os.path.join(run_dir, "metrics.jsonl"), metrics_line(global_steps, metrics))
        if self.has_credit:  # the mean credit weight per token so far, as the local engine writes it
            table = self.token_credit.table(lambda i: self.tokenizer.decode([i]), global_steps)
            tmp = os.path.join(run_dir, "token_credit.json.tmp")
            with open(tmp, "w") as f:
                json.dump(table, f)
            os.replace(tmp, os.path.join(run_dir, "token_credit.json"))
        saved = getattr(self, "_save_due", False)
        if saved:  # the step's checkpoint, after its line (see _save_checkpoint)
            self._save_due = False
            self._timed_save()
        self._allocation_check(global_steps, float(timing_raw.get("step", 0.0)), saved)
        return out

    def _timed_save(self) -> None:
        t0 = time.time()
        self._save_checkpoint_now()
        self.allocation.observe(save_s=time.time() - t0)

    def _allocation_check(self, global_steps: int, step_s: float, saved: bool) -> None:
        """After step `global_steps` (its metrics written, `saved` if it checkpointed): when the allocation ends before
        another step and save could (creditlab.allocation.AllocationClock), checkpoint this step if it did not, record
        the pause in the checkpoint dir and stop at the next step's start (:meth:`on_step_begin`)."""
        self.allocation.observe(step_s=step_s)
        if global_steps >= self.total_training_steps or not self.allocation.pause_due():
            return
        if not saved:
            self._timed_save()
        write_pause(self.config.trainer.default_local_dir, global_steps, self.allocation)
        self._pause_after = global_steps

    # -- allocations shorter than the run (creditlab.allocation): stop at the next step's start, after verl logged
    def on_step_begin(self):
        paused = getattr(self, "_pause_after", None)
        if paused is not None:
            raise AllocationPaused(
                f"step {paused} checkpointed; the allocation ends in {self.allocation.left_s():.0f} s, before another "
                f"step (longest {self.allocation.step_s:.0f} s) and save ({self.allocation.save_s:.0f} s) would: "
                f"stopping for the train job to requeue"
            )
        super().on_step_begin()

    def _setup_creditlab(self) -> None:
        """Read the run config: which credit runs where, QB, LoRA's fused reference pass, options."""
        m, t = self.run_cfg["method"], self.run_cfg["trainer"]
        self.seed = int(self.run_cfg.get("seed", 0))
        self.allocation = AllocationClock.from_env()  # the SLURM allocation's end, from the train job (or none)
        self.advantage_name = m["advantage"]
        self.options = verl_options(self.run_cfg)
        credit, filters = m.get("credit") or [], m.get("token_filter") or []
        on_worker = {
            c["name"]: runs_on_worker(fn)
            for kind, items in (("credit", credit), ("token_filter", filters))
            for c, (fn, _) in zip(items, method_entries(kind, items))
        }
        self.worker_credit = [c for c in credit if on_worker[c["name"]]]
        self.worker_filters = [c for c in filters if on_worker[c["name"]]]
        self.driver_credit = method_entries("credit", [c for c in credit if not on_worker[c["name"]]])
        self.driver_filters = method_entries("token_filter", [c for c in filters if not on_worker[c["name"]]])
        fns = method_entries("credit", credit) + method_entries("token_filter", filters)
        needs_ref = any(set(credit_inputs_of(fn)) & REF_INPUTS for fn, _ in fns)
        lcfg = t.get("lora") or {}
        self.fused_ref = bool(lcfg.get("enable")) and (needs_ref or lcfg.get("reference_pass") == "always")
        if needs_ref and not lcfg.get("enable"):
            raise ValueError(
                f"method {m.get('name')!r} needs the reference pass (adapter disabled): set trainer.lora.enable=true"
            )
        self.worker_pass = bool(self.worker_credit or self.worker_filters or self.fused_ref)
        self.has_credit = bool(credit or filters or self.fused_ref)
        self.has_filters = bool(filters)
        self.token_credit = TokenCredit()
        self.batching = t.get("batching", "verl_default")
        self.qb, self.sequential = self.batching == "query_preserved", self.batching == "sequential"
        self.sign_partitioned = self.batching == "sign_partitioned"
        actor = self.config.actor_rollout_ref.actor
        if self.batching in ORDERED_BATCHINGS and actor.shuffle:
            raise ValueError(
                f"trainer.batching={self.batching} needs actor_rollout_ref.actor.shuffle=false (plugin_overrides)"
            )
        self.group_size = int(self.config.actor_rollout_ref.rollout.n)
        self.group_coupled = needs_group_ids(m["policy_loss"])
        if self.group_coupled:
            if self.batching not in GROUP_BATCHINGS:
                raise ValueError(
                    f"policy loss {m['policy_loss']!r} couples the rollouts of a group: "
                    f"trainer.batching must be one of {list(GROUP_BATCHINGS)}, got {self.batching!r}"
                )
            if actor.use_dynamic_bsz:  # verl: max_token_len = per-GPU budget x sp, and a forced group is atomic
                sp = int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
                data = self.config.data
                need = self.group_size * (int(data.max_prompt_length) + int(data.max_response_length))
                if int(actor.ppo_max_token_len_per_gpu) * sp < need:
                    raise ValueError(
                        f"policy loss {m['policy_loss']!r} needs whole groups in a micro-batch: "
                        f"{self.group_size} sequences of up to {need // self.group_size} tokens exceed "
                        f"actor.ppo_max_token_len_per_gpu={actor.ppo_max_token_len_per_gpu} x sp {sp} "
                        "(plugin_overrides raises it)"
                    )

    # -- workers
    def _init_resource_pool_mgr(self):
        """verl's resource pools, with :class:`CreditlabActorRolloutRefWorker` as the actor/rollout/ref worker."""
        super()._init_resource_pool_mgr()
        for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor, Role.RefPolicy):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(CreditlabActorRolloutRefWorker)

    # -- batching
    def _actor_dp_size(self) -> int:
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1

    def _mini_batch_rollouts(self) -> int:
        return self.config.actor_rollout_ref.actor.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n

    def _balance_batch(
        self, batch: KVBatchMeta, metrics: dict, logging_prefix: str = "global_seqlen", keep_minibatch: bool = False
    ) -> KVBatchMeta:
        """QB order (:func:`qb_order`), sequential order (:func:`sequential_order`), sign-partitioned order
        (:func:`sign_order`) or verl's token balancing; logs ``creditlab/groups_split_frac``; a group-coupled loss's
        order must pass :func:`groups_aligned`."""
        dp = self._actor_dp_size()
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "rm_scores", "prompts", "responses"]
        )
        order = content_order(list(data["prompts"].unbind()), list(data["responses"].unbind()))
        adv = self._sequence_advantages(batch, data)[torch.tensor(order, dtype=torch.long)]
        batch.reorder(order)  # every order below starts from the batch's content, not from its arrival
        metrics["creditlab/zero_adv_groups_frac"] = zero_signal_frac(adv, group_index([uid_of(k) for k in batch.keys]))
        if self.sign_partitioned:
            n, mini = len(batch), self._mini_batch_rollouts()
            if n % mini:
                raise ValueError(
                    f"trainer.batching=sign_partitioned needs the rollout batch ({n}) to be a multiple "
                    f"of the mini-batch ({mini} rollouts)"
                )
            gen = torch.Generator().manual_seed(step_seed(self.seed, self.global_steps, 10_000))
            order, _, mixed = sign_order(adv, n // mini, dp, gen)
            batch.reorder(order)
            metrics["creditlab/sign_mixed_minibatches"] = float(mixed)
        elif self.qb or self.sequential:
            n, mini = len(batch), self._mini_batch_rollouts()
            required = self._get_required_batch_multiple(dp)
            if n % required or n % mini:
                raise ValueError(
                    f"trainer.batching={self.batching} needs the rollout batch ({n}) to be a multiple of "
                    f"{required} (verl would pad it with synthetic rollouts, which are no group)"
                )
            gids = group_index([uid_of(k) for k in batch.keys])
            seqlen = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
            if self.qb:
                gen = torch.Generator().manual_seed(step_seed(self.seed, self.global_steps, 10_000))
                order, partitions = qb_order(gids, calculate_workload(seqlen), n // mini, dp, gen)
            else:
                order, partitions = sequential_order(gids, n // mini, dp)
            batch.reorder(order)
            metrics.update(
                log_seqlen_unbalance(seqlen_list=seqlen.tolist(), partitions=partitions, prefix=logging_prefix)
            )
        elif self.batching == "verl_ray":
            batch = self._ray_trainer_order(batch, dp, metrics, logging_prefix)
        else:
            batch = super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        gids = group_index([uid_of(k) for k in batch.keys])
        if self.group_coupled and not groups_aligned(gids, dp, self.group_size):
            raise ValueError(
                f"the policy loss couples the rollouts of a group, but the batch's {len(batch)} rollouts "
                f"are not whole groups of {self.group_size} consecutive rows per rank (a group has "
                "fewer rollouts, or the order splits one): verl's micro-batching would split it"
            )
        mbs = [torch.tensor(rows) for rows in verl_minibatches(len(batch), dp, self._mini_batch_rollouts())]
        metrics["creditlab/groups_split_frac"] = groups_split_frac(mbs, gids)
        return batch

    def _ray_trainer_order(self, batch: KVBatchMeta, dp: int, metrics: dict, logging_prefix: str) -> KVBatchMeta:
        """V1's padding and partition (``trainer_base._balance_batch``), then each rank's rows in the legacy
        ``RayPPOTrainer._balance_batch`` order (by workload, interleaved; ``keep_minibatch`` and the prefix grouper
        are not modelled: both off by default)."""
        batch = upsample_batch_to_divisible_size(
            batch, self._get_required_batch_multiple(dp), self.tokenizer.eos_token_id
        )
        seqlen = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
        workload = calculate_workload(seqlen)
        parts = get_seqlen_balanced_partitions(workload, k_partitions=dp, equal_size=True)
        parts = [verl_ray_partition_order(p, workload.tolist()) for p in parts]
        batch.reorder([j for p in parts for j in p])
        metrics.update(log_seqlen_unbalance(seqlen_list=seqlen.tolist(), partitions=parts, prefix=logging_prefix))
        return batch

    # -- old-log-prob pass (with worker-side credit) and the fused reference pass
    def _sequence_advantages(self, batch: KVBatchMeta, data: TensorDict | None = None) -> Tensor:
        """A_i of every rollout from TransferQueue (``rm_scores`` summed, prompt uids; or from ``data`` holding those
        fields in batch order): the same registered advantage as our verl estimator ``creditlab_<advantage>``.
        Tensor[B] float32."""
        if data is None:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "rm_scores"])
        scores = padded(data["rm_scores"]).sum(-1).float()
        gids = group_index(list(data["uid"])).to(scores.device)
        return sequence_advantages(self.advantage_name, scores, gids).float()

    def _credit_spec(self) -> dict[str, Any]:
        return {
            "credit": self.worker_credit,
            "token_filter": self.worker_filters,
            "seed": self.seed,
            "step": int(self.global_steps),
            "dp_stats": self.options["credit_dp_stats"],
            "fused_ref": self.fused_ref,
            "sp_check": bool(self.options["sp_check"]),
        }

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if not self.worker_pass:
            return super()._compute_old_log_prob(batch, metrics)
        adv = self._sequence_advantages(batch)
        tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict({SEQ_ADV: adv}, batch_size=len(batch))
        )
        batch.extra_info[CREDIT_KEY] = self._credit_spec()
        try:
            batch = super()._compute_old_log_prob(batch, metrics)
        finally:
            batch.extra_info.pop(CREDIT_KEY, None)
        if self.fused_ref:  # the adapter-disabled pass ran in the same worker call: store it as verl's ref
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=[OUT_REF, "response_mask"]
            )
            ref = response_from_nested(data[OUT_REF], data["response_mask"])
            tq.kv_batch_put(
                keys=batch.keys,
                partition_id=batch.partition_id,
                fields=TensorDict({"ref_log_prob": ref}, batch_size=len(batch)),
            )
        return batch

    def _compute_ref_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        return batch if self.fused_ref else super()._compute_ref_log_prob(batch, metrics)

    # -- advantages with credit folded in
    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics)
        if not self.has_credit:
            return batch
        fields = ["uid", "responses", "response_mask", "old_log_probs", "entropy", "advantages"]
        if self.fused_ref or self.use_reference_policy:
            fields.append("ref_log_prob")
        if self.worker_credit:
            fields.append(OUT_WEIGHTS)
        if self.worker_filters:
            fields.append(OUT_FILTER)
        if self.fused_ref:
            fields.append(OUT_RESIDUAL)
        sp_check = (
            self.worker_credit
            and self.options["sp_check"]
            and int(self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1) > 1
        )
        if sp_check:
            fields.append(OUT_SP_CHECK)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        mask_nt = data["response_mask"]
        mask = padded(mask_nt).float()
        adv_tok = padded(data["advantages"]).float()
        first = mask.argmax(-1)  # A_i sits on every valid token; rows without one read 0
        seq_adv = torch.where(
            mask.any(-1), adv_tok[torch.arange(len(first)), first], torch.zeros_like(first, dtype=adv_tok.dtype)
        )
        get = lambda k: padded(data[k]).float() if k in data.keys() else None
        inputs = CreditInputs(
            responses=padded(data["responses"]),
            mask=mask,
            old_logp=get("old_log_probs"),
            advantages=seq_adv,
            group_ids=group_index(list(data["uid"])),
            entropy=get("entropy"),
            ref_logp=get("ref_log_prob"),
            rng=torch.Generator().manual_seed(step_seed(self.seed, self.global_steps, 20_000)),
        )
        adv_new, loss_mask, w = fold_credit(
            inputs, self.driver_credit, self.driver_filters, get(OUT_WEIGHTS), get(OUT_FILTER)
        )
        self.token_credit.add(inputs.responses, mask, w)  # token_credit.json (DelTA's token clouds)
        out = {"advantages": response_to_nested(adv_new, mask_nt), SEQ_ADV: seq_adv}
        if self.has_filters:
            out[LOSS_MASK] = response_to_nested(loss_mask, mask_nt)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(out, batch_size=len(batch)))
        residual = get(OUT_RESIDUAL)
        diag = weight_diagnostics(w, mask, residual)
        valid = mask.bool()
        diag |= {
            "credit_weight_mean": w[valid].mean().item(),
            "loss_token_frac": (loss_mask.sum() / mask.sum().clamp(min=1)).item(),
        }
        if inputs.ref_logp is not None:
            diag["ref_kl"] = ((inputs.old_logp - inputs.ref_logp) * mask).sum().item() / max(1.0, mask.sum().item())
        if sp_check:  # the Ulysses credit against the sp=1 forward of the same batch (verl.sp_check)
            diffs = padded(data[OUT_SP_CHECK]).float().reshape(-1, 3).amax(0)
            diag |= {
                "sp_check/credit_max_abs_diff": diffs[0].item(),
                "sp_check/hidden_max_abs_diff": diffs[1].item(),
                "sp_check/hidden_max_abs": diffs[2].item(),
            }
        metrics.update({f"creditlab/{k}": v for k, v in diag.items()})
        return batch

    # -- the update: token-filter loss mask, then the optional flipping pass
    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if not self.group_coupled:
            return self._update_actor_filtered(batch, metrics)
        batch.extra_info["force_group_size"] = self.group_size  # verl's: G consecutive rows per micro-batch
        try:
            return self._update_actor_filtered(batch, metrics)
        finally:
            batch.extra_info.pop("force_group_size", None)

    def _update_actor_filtered(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.has_filters:
            keys, pid = batch.keys, batch.partition_id
            orig = tq.kv_batch_get(keys=keys, partition_id=pid, select_fields=["response_mask", "loss_mask"])
            lm = tq.kv_batch_get(keys=keys, partition_id=pid, select_fields=[LOSS_MASK])[LOSS_MASK]
            swapped = {k: lm.to(orig[k].dtype) for k in ("response_mask", "loss_mask")}
            tq.kv_batch_put(keys=keys, partition_id=pid, fields=TensorDict(swapped, batch_size=len(batch)))
            try:
                batch = super()._update_actor(batch, metrics)
            finally:
                tq.kv_batch_put(keys=keys, partition_id=pid, fields=orig.select("response_mask", "loss_mask"))
        else:
            batch = super()._update_actor(batch, metrics)
        flip = self.options["flipping"]
        if flip["enable"] and self.global_steps % int(flip["every"]) == 0:
            metrics.update(self._flipping_pass(batch, float(flip["eps"])))
        return batch

    def _flipping_pass(self, batch: KVBatchMeta, eps: float) -> dict[str, float]:
        """Post-update log-prob pass (Paper C, Algorithm 1) [ours: after all of the step's mini-batches]:
        Δ = log p after the update - old_log_probs (the same training model before it), on every token."""
        meta = KVBatchMeta(
            keys=list(batch.keys),
            tags=list(batch.tags),
            partition_id=batch.partition_id,
            extra_info={
                "calculate_entropy": False,
                "compute_loss": False,
                "temperature": self.config.actor_rollout_ref.rollout.temperature,
            },
        )
        self.actor_rollout_wg.compute_log_prob(meta)
        data = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["log_probs", "old_log_probs", "response_mask", "advantages"],
        )
        mask = padded(data["response_mask"]).float()
        after = padded(response_from_nested(data["log_probs"], data["response_mask"])).float()
        delta = after - padded(data["old_log_probs"]).float()
        adv = (padded(data["advantages"]).float() * mask).sum(-1)  # the sign of A_i (credit weights are > 0)
        return flip_metrics(delta, mask, adv, eps)

    # -- checkpoints: verl saves TransferQueue only in async modes; RB's waiting groups live there
    def _step_folder(self) -> str:
        if self.config.trainer.resume_mode == "resume_path" and self.config.trainer.resume_from_path:
            return self.config.trainer.resume_from_path
        return os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")

    def _save_checkpoint(self):
        """Deferred to the end of the step's metrics (:meth:`_compute_metrics`): verl saves before it computes a
        step's metrics, so a job killed in between would resume past a step whose metrics.jsonl line was never
        written; saved after it, a resumed run redoes that step and rewrites its line."""
        self._save_due = True

    def _save_checkpoint_now(self):
        if isinstance(self.replay_buffer, RewardBalancedSampler):  # before verl marks the step as the latest
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            tq.save_checkpoint(os.path.join(folder, "transfer_queue"), metadata={"global_steps": self.global_steps})
            with open(os.path.join(folder, "creditlab_rb.json"), "w") as f:
                json.dump(self.replay_buffer.state_dict(), f)
        if self.has_credit:  # the token-credit sums so far (a resumed run's token_credit.json covers every step)
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            torch.save(self.token_credit.sums, os.path.join(folder, "creditlab_token_credit.pt"))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        sums = os.path.join(self._step_folder(), "creditlab_token_credit.pt")
        if self.global_steps > 0 and self.has_credit and os.path.exists(sums):
            self.token_credit.sums = torch.load(sums)
        if isinstance(self.replay_buffer, RewardBalancedSampler) and self.global_steps > 0:
            folder = self._step_folder()
            if os.path.exists(os.path.join(folder, "creditlab_rb.json")):
                tq.load_checkpoint(os.path.join(folder, "transfer_queue"))
                with open(os.path.join(folder, "creditlab_rb.json")) as f:
                    self.replay_buffer.load_state_dict(json.load(f))
