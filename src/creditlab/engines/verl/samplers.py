"""verl custom samplers (V1 replay buffers) of creditlab: DAPO's generation-batch cap and reward-balanced batching.

Both are selected through ``trainer.v1.sampler.custom_sampler.{path=pkg://creditlab.engines.verl.samplers, name=...}``
(``plugin.SAMPLER_PATH`` / ``plugin.DAPO_SAMPLER_PATH``) by ``plugin.plugin_overrides``.

DAPO's generation-batch cap on verl 0.9.1's V1 sync trainer: :class:`CappedDapoSampler`.

What verl does without it. The V1 trainer (``verl.trainer.ppo.v1``) implements DAPO's dynamic sampling in its
replay buffer, ``replay_buffer.ReplayBuffer.sample`` (sync mode): finished groups whose filter metric ties are
evicted from TransferQueue, each eviction adds 2 prompts of refill credit, and the credit is dispatched through
``refill_fn`` (the trainer's ``_add_prompts_to_generate``, one prompt per dataloader fetch) as long as fewer than
``max_inflight_gen_batches x train_batch_size`` prompts are pending or running; the loop ends only when
``batch_size`` groups are sampleable. Nothing counts the generation rounds: ``trainer_base.PPOTrainer.
_resolve_filter_groups_metric`` logs that ``algorithm.filter_groups.max_num_gen_batches`` "is ignored by the
built-in V1 ReplayBuffer", so a step whose groups keep tying generates forever.

What this sampler does [ours, the official recipe's behaviour]: the same ``ReplayBuffer.sample`` loop (verl's
eviction, refill credit, in-flight bound, draining and surplus discard are untouched), with every refill passing
through a budget. A generation batch is ``train_batch_size`` prompts (the unit of verl's recipe/dapo
``dapo_ray_trainer.py`` with ``gen_batch_size = train_batch_size``, and of the local engine's ``collect``); the
step's first batch is the one ``PPOTrainer.prepare_step`` submits, so a step may generate at most
``max_num_gen_batches x train_batch_size`` prompts. Refills beyond that are withheld (clipped to the budget); when
the budget is spent, nothing is in flight any more and fewer than ``batch_size`` groups are sampleable, the step
raises :class:`GenerationCapExceeded` (a ValueError), as ``dapo_ray_trainer.py`` does ("Generated too many") when
``num_gen_batches >= max_num_gen_batches``. It never trains on fewer groups: verl's mini-batches have fixed sizes
(``ppo_mini_batch_size x n`` rollouts; a short batch would be padded with synthetic rows, optimizer steps on
padding, and creditlab's QB / sequential orders refuse it). The local engine differs here (design note 40): its
``collect`` trains on the groups kept so far.

Logged per step (``sample``'s metrics, merged into verl's): ``creditlab/n_gen_batches`` = prompts generated this
step / train_batch_size (fractional: verl refills prompt by prompt; the local engine logs whole batches under the
same name), ``creditlab/gen_prompts``, ``creditlab/gen_prompts_withheld`` (refill credit the cap refused).

Selected by the plug-in for every run with ``trainer.dynamic_sampling`` (``plugin.plugin_overrides``):
``trainer.v1.sampler.custom_sampler.{path=pkg://creditlab.engines.verl.samplers, name=CappedDapoSampler}`` and
``trainer.v1.sampler.sampler_kwargs.{filter_metric, train_batch_size, max_num_gen_batches}`` (verl hands a custom
sampler neither its filter metric nor the batch sizes: ``PPOTrainer._build_replay_buffer``).

Reward-balanced batching (RB, Paper C) on the real TransferQueue: :class:`RewardBalancedSampler` (its docstring).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import transfer_queue as tq
import verl
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from creditlab.algos.batching import RB_SIGNS, RewardBalancedBuffer, rb_draw, rb_sign_values, sign_counts
from creditlab.engines.verl.ordering import padded, uid_of
from creditlab.engines.verl.plugin import run_config, sequence_advantages

VERL_VERSION = "0.9.1"
"""The verl whose ``ReplayBuffer.sample`` this sampler was written against (it hooks ``refill_fn`` and
``_wait_for_next_poll``, the loop's only two exits besides returning a batch)."""
TRAIN = "train"


class GenerationCapExceeded(ValueError):
    """A step spent its ``max_num_gen_batches`` generation batches without ``batch_size`` groups that pass DAPO's
    filter (the official recipe's ValueError)."""


def _kwargs(sampler_kwargs: Any) -> dict[str, Any]:
    if isinstance(sampler_kwargs, DictConfig):
        return dict(OmegaConf.to_container(sampler_kwargs, resolve=True))
    return dict(sampler_kwargs or {})


class CappedDapoSampler(ReplayBuffer):
    """verl's sync ``ReplayBuffer`` with DAPO group filtering and a per-step cap on generated prompts (module
    docstring). ``sampler_kwargs``: ``filter_metric`` (verl's ``algorithm.filter_groups.metric``: ``reward`` or a
    ``reward_extra_info`` field such as ``acc``), ``train_batch_size`` (prompts per step, verl's
    ``data.train_batch_size``), ``max_num_gen_batches`` (>= 1), optionally ``max_inflight_gen_batches`` (verl's,
    default 1)."""

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: Any,
        max_off_policy_threshold: int | None,
        max_off_policy_strategy: str,
        sampler_kwargs: Any,
        refill_fn: Callable[[int], Any] | None = None,
        poll_interval: float = 2.0,
        **_: Any,
    ):
        if verl.__version__ != VERL_VERSION:
            raise RuntimeError(
                f"CappedDapoSampler hooks verl {VERL_VERSION}'s ReplayBuffer.sample; verl is "
                f"{verl.__version__}: re-check the hooks (refill_fn, _wait_for_next_poll) first"
            )
        if trainer_mode != "sync":
            raise ValueError(f"CappedDapoSampler caps verl's sync DAPO sampling; trainer mode {trainer_mode!r}")
        kw = _kwargs(sampler_kwargs)
        missing = {"filter_metric", "train_batch_size", "max_num_gen_batches"} - kw.keys()
        if missing:
            raise ValueError(f"CappedDapoSampler needs sampler_kwargs {sorted(missing)}")
        self.max_num_gen_batches = int(kw["max_num_gen_batches"])
        if self.max_num_gen_batches < 1:
            raise ValueError(
                f"max_num_gen_batches={self.max_num_gen_batches}: the cap counts the step's first "
                "generation batch, so it must be >= 1"
            )
        self._refill_inner = refill_fn
        self._step: int | None = None
        self._gen_prompts = 0
        self._withheld = 0
        self._sampling = False
        super().__init__(
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            poll_interval=poll_interval,
            refill_fn=None if refill_fn is None else self._capped_refill,
            filter_groups_metric=str(kw["filter_metric"]),
            train_batch_size=int(kw["train_batch_size"]),
            gen_batch_size=1,
            max_inflight_gen_batches=int(kw.get("max_inflight_gen_batches", 1)),
        )

    # -- the budget of one global step
    @property
    def budget_prompts(self) -> int:
        """Prompts the current step may still submit for generation."""
        return self.max_num_gen_batches * self.train_batch_size - self._gen_prompts

    def _begin_step(self, global_steps: int) -> None:
        if global_steps != self._step:  # the step's first batch: PPOTrainer.prepare_step, train_batch_size prompts
            self._step, self._gen_prompts, self._withheld = global_steps, self.train_batch_size, 0

    def _capped_refill(self, num_prompts: int) -> int:
        if not self._sampling:  # outside a training sample (validation never refills): verl's own
            return self._refill_inner(num_prompts)
        allowed = max(0, min(int(num_prompts), self.budget_prompts))
        self._withheld += int(num_prompts) - allowed
        if allowed:
            self._refill_inner(allowed)
            self._gen_prompts += allowed
        return allowed

    def _wait_for_next_poll(self, partition_id: str, last_debug_time: float) -> float:
        # ReplayBuffer.sample waits here only when it can neither select nor dispatch; with the budget spent and
        # nothing in flight, nothing can change any more
        if (
            self._sampling
            and partition_id == TRAIN
            and self.budget_prompts <= 0
            and not (self.pending_keys[partition_id] or self.running_keys[partition_id])
        ):
            have = len(self.finished_keys[partition_id] | self.failure_keys[partition_id])
            n_batches = self._gen_prompts / self.train_batch_size
            raise GenerationCapExceeded(
                f"num_gen_batches={n_batches:g} >= max_num_gen_batches={self.max_num_gen_batches} at step "
                f"{self._step} ({self._gen_prompts} prompts generated, {self._withheld} more withheld) with only "
                f"{have} of the {self._batch_size} groups whose {self.filter_groups_metric!r} differs. Generated too "
                "many (DAPO's dynamic sampling): the data may be too difficult or too easy for the policy; raise "
                "trainer.max_gen_batches."
            )
        return super()._wait_for_next_poll(partition_id, last_debug_time)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's sync sample under the step's budget; adds ``creditlab/n_gen_batches`` (and the prompt counts)."""
        if partition_id != TRAIN:
            return super().sample(global_steps, partition_id, batch_size)
        self._begin_step(global_steps)
        self._sampling, self._batch_size = True, batch_size
        try:
            batch, metrics = super().sample(global_steps, partition_id, batch_size)
        finally:
            self._sampling = False
        metrics = {
            **metrics,
            "creditlab/n_gen_batches": self._gen_prompts / self.train_batch_size,
            "creditlab/gen_prompts": float(self._gen_prompts),
            "creditlab/gen_prompts_withheld": float(self._withheld),
        }
        return batch, metrics


# ------------------------------------------------------------------------------------------------------
# reward-balanced batching (RB) as a verl replay buffer


class RewardBalancedSampler(ReplayBuffer):
    """RB [paper C] over TransferQueue: whole prompt groups wait until ``n`` groups with >= rho positive and
    >= rho negative rollouts can be selected (creditlab's ``RewardBalancedBuffer`` decides; this class only
    moves groups between it and TransferQueue).

    Selected by ``trainer.v1.sampler.custom_sampler.{path=pkg://creditlab.engines.verl.samplers,
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

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: Any,
        max_off_policy_threshold: int | None,
        max_off_policy_strategy: str,
        sampler_kwargs: Any,
        refill_fn=None,
        poll_interval: float = 2.0,
        **kwargs: Any,
    ):
        super().__init__(
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            poll_interval=poll_interval,
            refill_fn=refill_fn,
        )
        kw = (
            OmegaConf.to_container(sampler_kwargs)
            if isinstance(sampler_kwargs, DictConfig)
            else dict(sampler_kwargs or {})
        )
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
        return {
            "round": self.round,
            "dropped_total": self.buffer.dropped_total if self.buffer else 0,
            "born": {e.payload: e.born for e in entries_},
        }

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
        trajs: dict[str, list[str]] = {
            u: [] for u in self.prompt_global_steps[partition_id] if u in terminal and u not in known
        }
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
        rewards = padded(rm).sum(-1)  # shaped (DAPO reward manager: score + overlong penalty), as the loss sees
        gids = torch.tensor([i for i, u in enumerate(uids) for _ in trajs[u]], dtype=torch.long)
        scores = self._raw_scores(keys, partition_id) if self.sign == "reward" else rewards
        values, thr = rb_sign_values(
            self.sign,
            rewards,
            scores,
            gids,
            lambda r, g: sequence_advantages(self.advantage, r, g),
            self.reward_threshold,
        )
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
                raise RuntimeError(
                    f"RB sign 'reward' needs the reward manager's 'acc' for {key}; none in its "
                    "reward_extra_info (use sign 'advantage' or a reward manager that reports acc)"
                )
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

        chosen, stats, self.round = rb_draw(
            self.buffer,
            self.round,
            admit=admit,
            refill=lambda: self.refill_fn(batch_size),
            select=lambda rnd: self._select(partition_id, rnd),
            max_rounds=self.max_rounds,
            on_exhausted=self.on_exhausted,
        )
        batch = self._materialize_batch(partition_id, chosen, dict(self.partitions[partition_id]))
        return batch, {f"training/rb/{k[3:]}": v for k, v in stats.items()}
