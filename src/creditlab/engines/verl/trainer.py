"""creditlab's verl V1 trainer: query-preserved batching, credit folding, the RB sampler, token flipping.

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
  sequential mini-batches (groups contiguous, in order, no balancing: :func:`sequential_order`); otherwise
  verl's token balancing (V1 calls ``_balance_batch`` whatever ``trainer.balance_batch`` says). All log
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

:class:`RewardBalancedSampler` is reward-balanced batching (RB, Paper C) as a verl custom replay buffer
(``trainer.v1.sampler.custom_sampler``) on the real TransferQueue.

Everything that needs verl's Ray worker group and GPUs is written against verl's classes but exercised on CPU
only piecewise (tests/test_verl_plugin.py): the balancing with verl's real code, the sampler against a real
TransferQueue, and the pure functions.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from tensordict import TensorDict
from torch import Tensor
from transfer_queue import KVBatchMeta

from creditlab.algos.batching import (
    RB_SIGNS,
    RewardBalancedBuffer,
    groups_split_frac,
    rb_draw,
    partition_bins,
    rb_sign_values,
    sequential_minibatches,
    sign_counts,
)
from creditlab.algos.credit.arca import weight_diagnostics
from creditlab.algos.credit.base import REF_INPUTS, CreditInputs, TokenCredit, credit_inputs_of, method_entries
from creditlab.analysis.flipping import flip_fractions
from creditlab.seeds import step_seed
from creditlab.engines.verl.plugin import (
    ENV_RUN_CONFIG,
    GROUP_BATCHINGS,
    TRAINER_MODE,
    fold_credit,
    group_index,
    needs_group_ids,
    run_config,
    runs_on_worker,
    sequence_advantages,
    verl_options,
)
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
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.seqlen_balancing import calculate_workload, log_seqlen_unbalance
from verl.workers.utils.padding import response_from_nested, response_to_nested

PLUGIN_PREFIX = "creditlab/"
"""Prefix of the metrics the plug-in logs into verl's (MLflow) metrics."""
METRIC_NAMES = {"reward_mean": "critic/rewards/mean", "score_mean": "critic/score/mean",
                "response_len_mean": "response_length/mean", "entropy_mean": "actor/entropy",
                "clipfrac": "actor/pg_clipfrac", "t_step": "timing_s/step"}
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
    out |= {k[len(PLUGIN_PREFIX):]: v for k, v in list(out.items())
            if k.startswith(PLUGIN_PREFIX) and k[len(PLUGIN_PREFIX):] not in out}
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
# pure pieces


def uid_of(key: str) -> str:
    """The prompt uid of a verl rollout key ``{uid}_{session_id}_{index}`` (uids are uuid4 strings)."""
    return key.split("_", 1)[0]


def _padded(nt: Tensor, value: float = 0.0) -> Tensor:
    return torch.nested.to_padded_tensor(nt, value) if nt.is_nested else nt


def verl_minibatches(n_rollouts: int, dp_size: int, mini_batch_size: int) -> list[list[int]]:
    """Rows (positions in the balanced batch) of each optimizer step, as verl 0.9.1 cuts them.

    Dispatch splits the batch into ``dp_size`` contiguous equal chunks (``BatchMeta.chunk``); each rank's
    ``TrainingWorker.train_mini_batch`` cuts its chunk into contiguous mini-batches of
    ``mini_batch_size / dp_size`` rows (``tu.make_iterator`` with ``shuffle=False``). Global mini-batch m =
    the m-th slice of every rank. Returns M lists of row positions.
    """
    per_rank, per_mb = n_rollouts // dp_size, mini_batch_size // dp_size
    return [[r * per_rank + m * per_mb + j for r in range(dp_size) for j in range(per_mb)]
            for m in range(per_rank // per_mb)]


def qb_order(group_ids: Tensor, workloads: Tensor, n_minibatches: int, dp_size: int,
             generator: torch.Generator) -> tuple[list[int], list[list[int]]]:
    """Query-preserved order of a rollout batch for verl (Paper C's QB).

    creditlab's ``partition_bins(..., whole_groups=True)`` (the QB of ``algos/batching.py``) assigns whole
    groups to M x R bins of equal size with balanced ``workloads`` (verl's ``calculate_workload`` of the
    sequence lengths). The order is rank-major: rank r's contiguous chunk holds its shards of mini-batch
    0, 1, ..., M-1, so verl's chunking and mini-batching (:func:`verl_minibatches`) realise bin (m, r) as
    rank r's part of optimizer step m.
    group_ids, workloads: Tensor[B]. Returns (order: permutation of range(B), per-rank index lists).
    Raises ValueError when whole groups cannot fill the bins exactly (group size must divide B / (M R)).
    """
    B = group_ids.numel()
    bins = partition_bins(group_ids, workloads, n_minibatches, dp_size, generator, whole_groups=True)
    size = B // (n_minibatches * dp_size)
    sizes = sorted({int(b.numel()) for row in bins for b in row})
    if B % (n_minibatches * dp_size) or sizes != [size]:
        raise ValueError(f"query-preserved batching cannot cut {B} rollouts into {n_minibatches} mini-batches x "
                         f"{dp_size} ranks of whole groups (bin sizes {sizes}, needed {size}): the prompts per "
                         "mini-batch (actor.ppo_mini_batch_size) must be a multiple of the data-parallel size")
    per_rank = [[int(i) for m in range(n_minibatches) for i in bins[m][r]] for r in range(dp_size)]
    return [i for part in per_rank for i in part], per_rank


def sequential_order(group_ids: Tensor, n_minibatches: int, dp_size: int) -> tuple[list[int], list[list[int]]]:
    """Sequential mini-batching (creditlab's ``sequential_minibatches``, Paper E) laid out for verl.

    The batch is first made group-contiguous: groups in order of first appearance, each group's rollouts in
    their order (verl's sampled batch lists rollouts as TransferQueue received them, so groups may interleave).
    creditlab's ``sequential_minibatches`` then cuts that order into M contiguous mini-batches; rank r's
    contiguous chunk holds the r-th of R equal contiguous shards of mini-batch 0, 1, ..., M-1, so verl's
    dispatch and mini-batch iterator (:func:`verl_minibatches`) realise mini-batch m as optimizer step m, its
    rows in order (rank 0's shard, then rank 1's, ...). No balancing: the token load per rank is what it is.
    group_ids: Tensor[B]. Returns (order: permutation of range(B), per-rank index lists).
    Raises ValueError when the batch does not cut into M equal mini-batches of R equal shards.
    """
    B = group_ids.numel()
    if n_minibatches < 1 or B % (n_minibatches * dp_size):
        raise ValueError(f"sequential batching cannot cut {B} rollouts into {n_minibatches} equal mini-batches x "
                         f"{dp_size} ranks (verl would pad the batch with synthetic rollouts)")
    first: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        first.setdefault(g, []).append(i)
    seq = torch.tensor([i for rows in first.values() for i in rows], dtype=torch.long)
    mbs = sequential_minibatches(group_ids[seq], n_minibatches, torch.Generator())
    if sorted({int(mb.numel()) for mb in mbs}) != [B // n_minibatches]:
        raise ValueError(f"sequential batching: unequal mini-batches {[int(mb.numel()) for mb in mbs]}")
    per_rank = [[int(seq[i]) for mb in mbs for i in mb.chunk(dp_size)[r]] for r in range(dp_size)]
    return [i for part in per_rank for i in part], per_rank


def content_order(prompts: list[Tensor], responses: list[Tensor]) -> list[int]:
    """The rollouts of a batch in an order fixed by what they are, not by when they arrived: groups by a hash of their
    prompt's token ids, a group's rollouts by a hash of their response's (rollouts of a group are exchangeable).
    verl lists a sampled batch in the order TransferQueue received the rollouts, which the timing of the rollout
    server decides; every order built on it (sequential, QB, sign, verl's balancing, which breaks ties by position)
    then differs between an uninterrupted and a resumed run of the same seed. prompts, responses: B token-id tensors.
    Returns a permutation of range(B)."""
    def digest(t: Tensor) -> bytes:
        return hashlib.sha256(t.detach().to("cpu", torch.int64).numpy().tobytes()).digest()

    keys = [(digest(p), digest(r)) for p, r in zip(prompts, responses)]
    return sorted(range(len(keys)), key=keys.__getitem__)


def sign_order(advantages: Tensor, n_minibatches: int, dp_size: int,
               generator: torch.Generator) -> tuple[list[int], list[list[int]], int]:
    """Paper C's sign-partitioned control ("broken cancellation") laid out for verl's equal mini-batches.

    The local engine (``algos.batching.sign_partitioned_minibatches``) gives each sign side its own mini-batches,
    of unequal sizes. verl cuts every rank's chunk into equal contiguous mini-batches, so here [ours] the rollouts are
    ordered side by side (A > 0 vs A <= 0, each side shuffled, which side comes first drawn per step) and cut into M
    equal contiguous mini-batches, each split into R equal contiguous rank shards laid out rank-major as
    :func:`sequential_order` does: every optimizer step holds a single sign except at most one, the step where the
    two sides meet (counted, and logged by the trainer as ``creditlab/sign_mixed_minibatches``).
    advantages: Tensor[B] sequence advantages. Returns (order, per-rank index lists, mixed mini-batches).
    Raises ValueError when the batch does not cut into M equal mini-batches of R equal shards.
    """
    B = advantages.numel()
    if n_minibatches < 1 or B % (n_minibatches * dp_size):
        raise ValueError(f"sign-partitioned batching cannot cut {B} rollouts into {n_minibatches} equal mini-batches "
                         f"x {dp_size} ranks (verl would pad the batch with synthetic rollouts)")
    pos = torch.nonzero(advantages > 0).flatten()
    rest = torch.nonzero(advantages <= 0).flatten()
    sides = [s[torch.randperm(s.numel(), generator=generator)] for s in (pos, rest)]
    if torch.rand((), generator=generator).item() < 0.5:
        sides.reverse()
    seq = torch.cat(sides)
    positive = advantages[seq] > 0
    mbs = list(seq.chunk(n_minibatches))
    mixed = sum(int(positive[m * len(mb):(m + 1) * len(mb)].unique().numel() > 1) for m, mb in enumerate(mbs))
    per_rank = [[int(i) for mb in mbs for i in mb.chunk(dp_size)[r]] for r in range(dp_size)]
    return [i for part in per_rank for i in part], per_rank, mixed


def zero_signal_frac(advantages: Tensor, group_ids: Tensor) -> float:
    """Share of the batch's groups whose rollouts all have A_i = 0 (their rewards tie: no learning signal; DAPO's
    dynamic sampling drops such groups by its filter metric). advantages, group_ids: Tensor[B]."""
    groups = group_ids.unique()
    silent = [bool((advantages[group_ids == g] == 0).all()) for g in groups.tolist()]
    return sum(silent) / max(1, len(silent))


def groups_aligned(group_ids: Tensor, dp_size: int, group_size: int) -> bool:
    """Whether every group is G = ``group_size`` consecutive rows of one rank's contiguous chunk (what verl's
    ``force_group_size = G`` micro-batching needs to keep each group in one micro-batch): each aligned block of
    G rows of each rank holds a single group, and no group appears in two blocks. group_ids: Tensor[B]."""
    B = group_ids.numel()
    if B % dp_size or (B // dp_size) % group_size:
        return False
    blocks = group_ids.reshape(-1, group_size)
    return bool((blocks == blocks[:, :1]).all()) and blocks[:, 0].unique().numel() == blocks.shape[0]


def flip_metrics(delta: Tensor, mask: Tensor, adv: Tensor, eps: float) -> dict[str, float]:
    """Token flipping of one update as metrics ``creditlab/flip/{positive,negative,all}/{boosted,...}``:
    creditlab's ``flip_fractions`` (percent of the valid tokens with Δ log p > eps, < -eps, else).
    delta, mask: Tensor[B, T]; adv: Tensor[B] (its sign splits the rollouts)."""
    out = {}
    for side, fr in flip_fractions(delta, mask, adv, eps).items():
        out.update({f"creditlab/flip/{side}/{k}": float(v) for k, v in fr.items() if k != "n"})
    return out


# ------------------------------------------------------------------------------------------------------
# reward-balanced batching (RB) as a verl replay buffer


class RewardBalancedSampler(ReplayBuffer):
    """RB [paper C] over TransferQueue: whole prompt groups wait until ``n`` groups with >= rho positive and
    >= rho negative rollouts can be selected (creditlab's ``RewardBalancedBuffer`` decides; this class only
    moves groups between it and TransferQueue).

    Selected by ``trainer.v1.sampler.custom_sampler.{path=pkg://creditlab.engines.verl.trainer,
    name=RewardBalancedSampler}``; ``trainer.v1.sampler.sampler_kwargs``: rho, max_age, sign
    (advantage | reward), reward_threshold, and optionally max_rounds, on_exhausted, advantage.

    ``sample(global_steps, "train", n)`` is creditlab's ``rb_draw`` (the local engine runs the same loop):
      1. admit: wait until no prompt of the partition is pending/running (sync: the round's generation is done),
         then buffer every finished group not yet buffered: its rewards (``rm_scores`` summed per rollout) give
         its positive / negative counts (``sign_counts`` of the registered advantage, or of the reward
         against ``reward_threshold``), born at the current generation round;
      2. select: groups older than ``max_age`` rounds are dropped (and cleared from TransferQueue); a balanced
         batch is returned and its prompt keys cleared (verl's ``_materialize_batch``); the others stay in
         TransferQueue for later steps;
      3. no balanced batch: one more generation round of n prompts (``refill_fn``, the trainer's
         ``_add_prompts_to_generate``, same policy) and back to 1; after ``max_rounds`` rounds, ``on_exhausted``
         (``trainer.reward_balance``): ``train_unbalanced`` takes the oldest n groups (rho = 0;
         ``training/rb/forced`` = 1) or ``raise``.
    Every step updates, after possibly several rounds (``training/rb/rounds``).
    Validation (partition "val") is verl's own sync sampling.
    """

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: Any, refill_fn=None, poll_interval: float = 2.0,
                 **kwargs: Any):
        super().__init__(trainer_mode=trainer_mode, trainer_config=trainer_config,
                         max_off_policy_threshold=max_off_policy_threshold,
                         max_off_policy_strategy=max_off_policy_strategy, sampler_kwargs=sampler_kwargs,
                         poll_interval=poll_interval, refill_fn=refill_fn)
        kw = (OmegaConf.to_container(sampler_kwargs) if isinstance(sampler_kwargs, DictConfig)
              else dict(sampler_kwargs or {}))
        run_cfg = run_config()
        rb = ((run_cfg or {}).get("trainer") or {}).get("reward_balance") or {}
        self.rho = float(kw.get("rho", 0.25))
        self.max_age = int(kw.get("max_age", 2))
        self.sign = str(kw.get("sign", "advantage"))
        if self.sign not in RB_SIGNS:
            raise ValueError(f"RB sign must be one of {list(RB_SIGNS)}, got {self.sign!r}")
        self.reward_threshold = float(kw.get("reward_threshold", 0.5))
        self.max_rounds = int(kw.get("max_rounds", rb.get("max_rounds", 4)))
        self.on_exhausted = str(kw.get("on_exhausted", rb.get("on_exhausted", "train_unbalanced")))
        self.advantage = kw.get("advantage") or ((run_cfg or {}).get("method") or {}).get("advantage", "grpo")
        self.buffer: RewardBalancedBuffer | None = None
        self.round = 0
        self._born: dict[str, int] = {}  # restored births (checkpoint) of groups re-admitted from TransferQueue

    # -- state (the buffered groups themselves live in TransferQueue)
    def state_dict(self) -> dict[str, Any]:
        entries_ = self.buffer.entries if self.buffer else []
        return {"round": self.round, "dropped_total": self.buffer.dropped_total if self.buffer else 0,
                "born": {e.payload: e.born for e in entries_}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round, self._born = int(state["round"]), dict(state.get("born") or {})
        self._dropped_restored = int(state.get("dropped_total", 0))

    # -- sampling
    def _wait_until_generated(self, partition_id: str) -> None:
        last = 0.0
        while True:
            self._sync_metadata_from_transfer_queue()
            if not (self.pending_keys[partition_id] or self.running_keys[partition_id]):
                return
            last = self._wait_for_next_poll(partition_id, last)

    def _admit(self, partition_id: str, rnd: int) -> None:
        """Buffer the finished groups of TransferQueue not yet buffered (born at round ``rnd`` unless a checkpoint
        restored their birth); forget those no longer there."""
        terminal = self.finished_keys[partition_id] | self.failure_keys[partition_id]
        self.buffer.entries = [e for e in self.buffer.entries if e.payload in terminal]
        known = {e.payload for e in self.buffer.entries}
        # in submission order (TransferQueue lists prompt keys as registered): the buffer breaks age ties by
        # insertion order, as the local engine's batch order
        trajs: dict[str, list[str]] = {u: [] for u in self.prompt_global_steps[partition_id]
                                       if u in terminal and u not in known}
        for key in self.partitions[partition_id]:
            if uid_of(key) in trajs:
                trajs[uid_of(key)].append(key)
        empty = {u for u, ks in trajs.items() if not ks}  # failed groups without a trajectory
        self._clear_groups(partition_id, empty)
        uids = [u for u in trajs if u not in empty]
        if not uids:
            return
        keys = [k for u in uids for k in trajs[u]]
        rm = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["rm_scores"])["rm_scores"]
        rewards = _padded(rm).sum(-1)  # shaped (DAPO reward manager: score + overlong penalty), as the loss sees
        gids = torch.tensor([i for i, u in enumerate(uids) for _ in trajs[u]], dtype=torch.long)
        scores = self._raw_scores(keys, partition_id) if self.sign == "reward" else rewards
        values, thr = rb_sign_values(self.sign, rewards, scores, gids,
                                     lambda r, g: sequence_advantages(self.advantage, r, g), self.reward_threshold)
        for g, (n_pos, n_neg, size) in sign_counts(values, gids, thr).items():
            uid = uids[g]
            self.buffer.add(uid, n_pos, n_neg, size, self._born.pop(uid, rnd))

    @staticmethod
    def _raw_scores(keys: list[str], partition_id: str) -> torch.Tensor:
        """The unshaped correctness of each trajectory: the reward manager's ``acc``, read from
        ``extra_fields.reward_extra_info`` as verl's own replay buffer reads its DAPO filter metric."""
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])["extra_fields"]
        out = []
        for key, value in zip(keys, data):
            fields = getattr(value, "data", value)
            info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
            if "acc" not in info:
                raise RuntimeError(f"RB sign 'reward' needs the reward manager's 'acc' for {key}; none in its "
                                   "reward_extra_info (use sign 'advantage' or a reward manager that reports acc)")
            out.append(float(info["acc"]))
        return torch.tensor(out, dtype=torch.float32)

    def _select(self, partition_id: str, rnd: int) -> tuple[list[str] | None, dict[str, float]]:
        """One ``buffer.select`` at round ``rnd``; clears the groups it drops from TransferQueue."""
        live = {e.payload for e in self.buffer.entries}
        chosen, stats = self.buffer.select(rnd)
        gone = live - {e.payload for e in self.buffer.entries} - set(chosen or [])
        self._clear_groups(partition_id, gone)
        return chosen, stats

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """A batch of ``batch_size`` whole groups (see the class docstring) and ``training/rb/*`` metrics."""
        if partition_id != "train":
            return super().sample(global_steps, partition_id, batch_size)
        if self.buffer is None:
            self.buffer = RewardBalancedBuffer(batch_size, self.rho, self.max_age)
            self.buffer.dropped_total = getattr(self, "_dropped_restored", 0)
        if self.buffer.n_groups != batch_size:
            raise ValueError(f"RB sampler built for {self.buffer.n_groups} groups per update, asked for {batch_size}")

        def admit(rnd: int) -> None:
            self._wait_until_generated(partition_id)
            self._admit(partition_id, rnd)

        chosen, stats, self.round = rb_draw(self.buffer, self.round, admit=admit,
                                            refill=lambda: self.refill_fn(batch_size),
                                            select=lambda rnd: self._select(partition_id, rnd),
                                            max_rounds=self.max_rounds, on_exhausted=self.on_exhausted)
        batch = self._materialize_batch(partition_id, chosen, dict(self.partitions[partition_id]))
        return batch, {f"training/rb/{k[3:]}": v for k, v in stats.items()}


# ------------------------------------------------------------------------------------------------------
# the trainer


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
        if getattr(self, "_save_due", False):  # the step's checkpoint, after its line (see _save_checkpoint)
            self._save_due = False
            self._save_checkpoint_now()
        return out

    def _setup_creditlab(self) -> None:
        """Read the run config: which credit runs where, QB, LoRA's fused reference pass, options."""
        m, t = self.run_cfg["method"], self.run_cfg["trainer"]
        self.seed = int(self.run_cfg.get("seed", 0))
        self.advantage_name = m["advantage"]
        self.options = verl_options(self.run_cfg)
        credit, filters = m.get("credit") or [], m.get("token_filter") or []
        on_worker = {c["name"]: runs_on_worker(fn) for kind, items in (("credit", credit), ("token_filter", filters))
                     for c, (fn, _) in zip(items, method_entries(kind, items))}
        self.worker_credit = [c for c in credit if on_worker[c["name"]]]
        self.worker_filters = [c for c in filters if on_worker[c["name"]]]
        self.driver_credit = method_entries("credit", [c for c in credit if not on_worker[c["name"]]])
        self.driver_filters = method_entries("token_filter", [c for c in filters if not on_worker[c["name"]]])
        fns = method_entries("credit", credit) + method_entries("token_filter", filters)
        needs_ref = any(set(credit_inputs_of(fn)) & REF_INPUTS for fn, _ in fns)
        lcfg = t.get("lora") or {}
        self.fused_ref = bool(lcfg.get("enable")) and (needs_ref or lcfg.get("reference_pass") == "always")
        if needs_ref and not lcfg.get("enable"):
            raise ValueError(f"method {m.get('name')!r} needs the reference pass (adapter disabled): "
                             "set trainer.lora.enable=true")
        self.worker_pass = bool(self.worker_credit or self.worker_filters or self.fused_ref)
        self.has_credit = bool(credit or filters or self.fused_ref)
        self.has_filters = bool(filters)
        self.token_credit = TokenCredit()
        self.batching = t.get("batching", "verl_default")
        self.qb, self.sequential = self.batching == "query_preserved", self.batching == "sequential"
        self.sign_partitioned = self.batching == "sign_partitioned"
        actor = self.config.actor_rollout_ref.actor
        if (self.qb or self.sequential or self.sign_partitioned) and actor.shuffle:
            raise ValueError(f"trainer.batching={self.batching} needs actor_rollout_ref.actor.shuffle=false "
                             "(plugin_overrides)")
        self.group_size = int(self.config.actor_rollout_ref.rollout.n)
        self.group_coupled = needs_group_ids(m["policy_loss"])
        if self.group_coupled:
            if self.batching not in GROUP_BATCHINGS:
                raise ValueError(f"policy loss {m['policy_loss']!r} couples the rollouts of a group: "
                                 f"trainer.batching must be one of {list(GROUP_BATCHINGS)}, got {self.batching!r}")
            if actor.use_dynamic_bsz:  # verl: max_token_len = per-GPU budget x sp, and a forced group is atomic
                sp = int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
                data = self.config.data
                need = self.group_size * (int(data.max_prompt_length) + int(data.max_response_length))
                if int(actor.ppo_max_token_len_per_gpu) * sp < need:
                    raise ValueError(f"policy loss {m['policy_loss']!r} needs whole groups in a micro-batch: "
                                     f"{self.group_size} sequences of up to {need // self.group_size} tokens exceed "
                                     f"actor.ppo_max_token_len_per_gpu={actor.ppo_max_token_len_per_gpu} x sp {sp} "
                                     "(plugin_overrides raises it)")

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

    def _balance_batch(self, batch: KVBatchMeta, metrics: dict, logging_prefix: str = "global_seqlen",
                       keep_minibatch: bool = False) -> KVBatchMeta:
        """QB order (:func:`qb_order`), sequential order (:func:`sequential_order`), sign-partitioned order
        (:func:`sign_order`) or verl's token balancing; logs ``creditlab/groups_split_frac``; a group-coupled loss's
        order must pass :func:`groups_aligned`."""
        dp = self._actor_dp_size()
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "rm_scores", "prompts", "responses"])
        order = content_order(list(data["prompts"].unbind()), list(data["responses"].unbind()))
        adv = self._sequence_advantages(batch, data)[torch.tensor(order, dtype=torch.long)]
        batch.reorder(order)  # every order below starts from the batch's content, not from its arrival
        metrics["creditlab/zero_adv_groups_frac"] = zero_signal_frac(adv, group_index([uid_of(k) for k in batch.keys]))
        if self.sign_partitioned:
            n, mini = len(batch), self._mini_batch_rollouts()
            if n % mini:
                raise ValueError(f"trainer.batching=sign_partitioned needs the rollout batch ({n}) to be a multiple "
                                 f"of the mini-batch ({mini} rollouts)")
            gen = torch.Generator().manual_seed(step_seed(self.seed, self.global_steps, 10_000))
            order, _, mixed = sign_order(adv, n // mini, dp, gen)
            batch.reorder(order)
            metrics["creditlab/sign_mixed_minibatches"] = float(mixed)
        elif self.qb or self.sequential:
            n, mini = len(batch), self._mini_batch_rollouts()
            required = self._get_required_batch_multiple(dp)
            if n % required or n % mini:
                raise ValueError(f"trainer.batching={self.batching} needs the rollout batch ({n}) to be a multiple of "
                                 f"{required} (verl would pad it with synthetic rollouts, which are no group)")
            gids = group_index([uid_of(k) for k in batch.keys])
            seqlen = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
            if self.qb:
                gen = torch.Generator().manual_seed(step_seed(self.seed, self.global_steps, 10_000))
                order, partitions = qb_order(gids, calculate_workload(seqlen), n // mini, dp, gen)
            else:
                order, partitions = sequential_order(gids, n // mini, dp)
            batch.reorder(order)
            metrics.update(log_seqlen_unbalance(seqlen_list=seqlen.tolist(), partitions=partitions,
                                                prefix=logging_prefix))
        else:
            batch = super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        gids = group_index([uid_of(k) for k in batch.keys])
        if self.group_coupled and not groups_aligned(gids, dp, self.group_size):
            raise ValueError(f"the policy loss couples the rollouts of a group, but the batch's {len(batch)} rollouts "
                             f"are not whole groups of {self.group_size} consecutive rows per rank (a group has "
                             "fewer rollouts, or the order splits one): verl's micro-batching would split it")
        mbs = [torch.tensor(rows) for rows in verl_minibatches(len(batch), dp, self._mini_batch_rollouts())]
        metrics["creditlab/groups_split_frac"] = groups_split_frac(mbs, gids)
        return batch

    # -- old-log-prob pass (with worker-side credit) and the fused reference pass
    def _sequence_advantages(self, batch: KVBatchMeta, data: TensorDict | None = None) -> Tensor:
        """A_i of every rollout from TransferQueue (``rm_scores`` summed, prompt uids; or from ``data`` holding those
        fields in batch order): the same registered advantage as our verl estimator ``creditlab_<advantage>``.
        Tensor[B] float32."""
        if data is None:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "rm_scores"])
        scores = _padded(data["rm_scores"]).sum(-1).float()
        return sequence_advantages(self.advantage_name, scores, group_index(list(data["uid"]))).float()

    def _credit_spec(self) -> dict[str, Any]:
        return {"credit": self.worker_credit, "token_filter": self.worker_filters, "seed": self.seed,
                "step": int(self.global_steps), "dp_stats": self.options["credit_dp_stats"],
                "fused_ref": self.fused_ref, "sp_check": bool(self.options["sp_check"])}

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if not self.worker_pass:
            return super()._compute_old_log_prob(batch, metrics)
        adv = self._sequence_advantages(batch)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({SEQ_ADV: adv}, batch_size=len(batch)))
        batch.extra_info[CREDIT_KEY] = self._credit_spec()
        try:
            batch = super()._compute_old_log_prob(batch, metrics)
        finally:
            batch.extra_info.pop(CREDIT_KEY, None)
        if self.fused_ref:  # the adapter-disabled pass ran in the same worker call: store it as verl's ref
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=[OUT_REF, "response_mask"])
            ref = response_from_nested(data[OUT_REF], data["response_mask"])
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                            fields=TensorDict({"ref_log_prob": ref}, batch_size=len(batch)))
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
        sp_check = self.worker_credit and self.options["sp_check"] and \
            int(self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1) > 1
        if sp_check:
            fields.append(OUT_SP_CHECK)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        mask_nt = data["response_mask"]
        mask = _padded(mask_nt).float()
        adv_tok = _padded(data["advantages"]).float()
        first = mask.argmax(-1)  # A_i sits on every valid token; rows without one read 0
        seq_adv = torch.where(mask.any(-1), adv_tok[torch.arange(len(first)), first],
                              torch.zeros_like(first, dtype=adv_tok.dtype))
        get = (lambda k: _padded(data[k]).float() if k in data.keys() else None)
        inputs = CreditInputs(responses=_padded(data["responses"]), mask=mask, old_logp=get("old_log_probs"),
                              advantages=seq_adv, group_ids=group_index(list(data["uid"])), entropy=get("entropy"),
                              ref_logp=get("ref_log_prob"),
                              rng=torch.Generator().manual_seed(step_seed(self.seed, self.global_steps, 20_000)))
        adv_new, loss_mask, w = fold_credit(inputs, self.driver_credit, self.driver_filters,
                                            get(OUT_WEIGHTS), get(OUT_FILTER))
        self.token_credit.add(inputs.responses, mask, w)  # token_credit.json (DelTA's token clouds)
        out = {"advantages": response_to_nested(adv_new, mask_nt), SEQ_ADV: seq_adv}
        if self.has_filters:
            out[LOSS_MASK] = response_to_nested(loss_mask, mask_nt)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(out, batch_size=len(batch)))
        residual = get(OUT_RESIDUAL)
        diag = weight_diagnostics(w, mask, residual)
        valid = mask.bool()
        diag |= {"credit_weight_mean": w[valid].mean().item(),
                 "loss_token_frac": (loss_mask.sum() / mask.sum().clamp(min=1)).item()}
        if inputs.ref_logp is not None:
            diag["ref_kl"] = ((inputs.old_logp - inputs.ref_logp) * mask).sum().item() / max(1.0, mask.sum().item())
        if sp_check:  # the Ulysses credit against the sp=1 forward of the same batch (verl.sp_check)
            diffs = _padded(data[OUT_SP_CHECK]).float().reshape(-1, 3).amax(0)
            diag |= {"sp_check/credit_max_abs_diff": diffs[0].item(), "sp_check/hidden_max_abs_diff": diffs[1].item(),
                     "sp_check/hidden_max_abs": diffs[2].item()}
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
        meta = KVBatchMeta(keys=list(batch.keys), tags=list(batch.tags), partition_id=batch.partition_id,
                           extra_info={"calculate_entropy": False, "compute_loss": False,
                                       "temperature": self.config.actor_rollout_ref.rollout.temperature})
        self.actor_rollout_wg.compute_log_prob(meta)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "old_log_probs", "response_mask", "advantages"])
        mask = _padded(data["response_mask"]).float()
        after = _padded(response_from_nested(data["log_probs"], data["response_mask"])).float()
        delta = after - _padded(data["old_log_probs"]).float()
        adv = (_padded(data["advantages"]).float() * mask).sum(-1)  # the sign of A_i (credit weights are > 0)
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
