"""DAPO's generation-batch cap (trainer.max_gen_batches -> algorithm.filter_groups.max_num_gen_batches) on verl 0.9.1's
V1 sync trainer, against verl's real replay buffer and a real TransferQueue (Ray local mode, one storage unit).

verl's own ``ReplayBuffer`` ignores the cap (it keeps refilling while groups tie); the plug-in's
``samplers.CappedDapoSampler`` runs the same ``ReplayBuffer.sample`` loop under a per-step budget of
``max_num_gen_batches x train_batch_size`` prompts and raises, as verl's DAPO recipe does, when the budget is spent
with too few groups whose rewards differ. The plug-in selects it for every dynamic-sampling run, through verl's own
``PPOTrainer._build_replay_buffer``.
"""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest
import torch
import yaml
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from conftest import clear_partition
from creditlab.engines.verl import plugin, samplers
from creditlab.plan import compose as compose_run

GROUP = 4
TIED, MIXED = [1, 1, 1, 1], [1, 0, 0, 1]
_UIDS = itertools.count(1)


@pytest.fixture
def tq(transfer_queue):
    clear_partition(transfer_queue)
    yield transfer_queue
    clear_partition(transfer_queue)


def _register(tq, step, status):
    """A prompt key as verl's trainer registers it (``_submit_batch_to_rollout``) and its agent loop updates it."""
    uid = uuid.UUID(int=next(_UIDS) * 0x9E3779B97F4A7C15 % (1 << 128)).hex
    tq.kv_batch_put(
        keys=[uid], partition_id="train", tags=[{"is_prompt": True, "status": status, "global_steps": step}]
    )
    return uid


def _finish(tq, uid, rewards, step):
    """The agent loop's output for prompt ``uid``: trajectories ``{uid}_{session}_0`` (rm_scores with the reward on
    the last token), then the prompt key tagged finished."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys = [f"{uid}_{s}_0" for s in range(len(rewards))]
    fields = [
        {
            "rm_scores": torch.tensor([0.0, 0.0, float(r)]),
            "uid": uid,
            "responses": torch.arange(3) + s,
            "response_mask": torch.ones(3, dtype=torch.int64),
        }
        for s, r in enumerate(rewards)
    ]
    tags = [{"status": "success", "seq_len": 13, "global_steps": step} for _ in rewards]
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    tq.kv_batch_put(
        keys=[uid], partition_id="train", tags=[{"is_prompt": True, "status": "finished", "global_steps": step}]
    )


def _put(tq, rewards, step):
    uid = _register(tq, step, "finished")
    _finish(tq, uid, rewards, step)
    return uid


class _Rollout:
    """The trainer's ``_add_prompts_to_generate`` (the replay buffer's ``refill_fn``): each prompt's group appears in
    TransferQueue with the next rewards of ``script`` (TIED when it runs out), finished at once or, with ``delay``,
    registered as running and finished by a timer (verl's agent loop finishing while the sampler polls)."""

    def __init__(self, tq, script=(), step=1, delay=None, limit=None):
        self.tq, self.script, self.step, self.delay, self.limit = tq, list(script), step, delay, limit
        self.calls: list[int] = []
        self.timers: list[threading.Timer] = []

    def __call__(self, n: int) -> int:
        self.calls.append(n)
        if self.limit is not None and sum(self.calls) > self.limit:
            raise _Runaway(sum(self.calls))
        for _ in range(n):
            rewards = self.script.pop(0) if self.script else TIED
            if self.delay is None:
                _put(self.tq, rewards, self.step)
            else:
                uid = _register(self.tq, self.step, "running")
                timer = threading.Timer(self.delay, _finish, (self.tq, uid, rewards, self.step))
                self.timers.append(timer)
                timer.start()
        return n


class _Runaway(Exception):
    pass


def _capped(refill, cap, train_batch_size=2, inflight=1):
    kwargs = {
        "filter_metric": "reward",
        "train_batch_size": train_batch_size,
        "max_num_gen_batches": cap,
        "max_inflight_gen_batches": inflight,
    }
    return samplers.CappedDapoSampler("sync", {}, None, "drop", kwargs, refill_fn=refill, poll_interval=0.01)


def _uids(batch):
    return sorted({k.split("_")[0] for k in batch.keys})


# ------------------------------------------------------------------------------------------------------


def test_verls_own_replay_buffer_does_not_cap_generation(tq):
    """The premise: verl 0.9.1's sync ReplayBuffer with DAPO's filter keeps refilling while every group ties; nothing
    stops it at max_num_gen_batches (verl logs that it ignores the key). Stopped here by the test after 20 batches."""
    rollout = _Rollout(tq, step=1, limit=20 * 2)
    buffer = ReplayBuffer(
        "sync",
        {},
        None,
        "drop",
        {},
        poll_interval=0.01,
        refill_fn=rollout,
        filter_groups_metric="reward",
        train_batch_size=2,
        gen_batch_size=1,
        max_inflight_gen_batches=1,
    )
    _put(tq, TIED, 1), _put(tq, TIED, 1)  # the step's first generation batch (prepare_step)
    with pytest.raises(_Runaway):
        buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert sum(rollout.calls) > 20 * 2  # far beyond any cap: 20 batches of 2 prompts after the first


def test_cap_spent_raises_like_dapos_recipe(tq):
    """Every group ties: the step generates exactly max_num_gen_batches batches of train_batch_size prompts (the first
    from prepare_step, the rest as verl's refills) and raises the recipe's ValueError instead of generating on."""
    rollout = _Rollout(tq, step=1)
    sampler = _capped(rollout, cap=3)
    _put(tq, TIED, 1), _put(tq, TIED, 1)
    with pytest.raises(samplers.GenerationCapExceeded, match="max_num_gen_batches=3.*Generated too many"):
        sampler.sample(global_steps=1, partition_id="train", batch_size=2)
    assert sum(rollout.calls) == (3 - 1) * 2  # 2 more batches of 2 prompts, then nothing
    assert isinstance(samplers.GenerationCapExceeded("x"), ValueError)


def test_within_the_cap_verls_filter_fills_the_batch_and_the_count_is_logged(tq):
    """One group of the first batch ties: verl evicts it and refills; the batch holds only groups whose rewards differ,
    the step's generation count is logged (creditlab/n_gen_batches), and the next step has a fresh budget."""
    rollout = _Rollout(tq, script=[MIXED, MIXED], step=1)
    sampler = _capped(rollout, cap=2)
    _put(tq, MIXED, 1)
    tied = _put(tq, TIED, 1)
    batch, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=2)
    assert len(_uids(batch)) == 2 and tied not in _uids(batch) and len(batch.keys) == 2 * GROUP
    assert rollout.calls == [2]  # verl's refill credit: 2 prompts per evicted group
    assert metrics["creditlab/n_gen_batches"] == 2.0 and metrics["creditlab/gen_prompts"] == 4.0
    assert metrics["training/filter_groups/evicted_samples"] == 1  # verl's own metrics are kept
    tq.kv_clear(keys=batch.keys, partition_id="train")  # what PPOTrainer.fit does after the step
    clear_partition(tq)

    rollout.step = 2  # step 2: the budget starts again from the step's first batch
    rollout.script = [MIXED]
    _put(tq, TIED, 2), _put(tq, MIXED, 2)
    batch, metrics = sampler.sample(global_steps=2, partition_id="train", batch_size=2)
    assert len(_uids(batch)) == 2 and metrics["creditlab/n_gen_batches"] == 2.0


def test_refills_beyond_the_budget_are_withheld_and_inflight_groups_still_count(tq):
    """With two batches allowed in flight, verl asks for 4 prompts after two evictions; the cap lets 2 through. Those
    are still running when the budget is spent: the sampler waits for them (no error) and trains on them."""
    rollout = _Rollout(tq, script=[MIXED, MIXED], step=1, delay=0.3)
    sampler = _capped(rollout, cap=2, inflight=2)
    _put(tq, TIED, 1), _put(tq, TIED, 1)
    try:
        batch, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=2)
    finally:
        for timer in rollout.timers:
            timer.join()
    assert rollout.calls == [2]  # verl's dispatch of 4 clipped to the budget
    assert metrics["creditlab/gen_prompts_withheld"] == 2.0 and metrics["creditlab/n_gen_batches"] == 2.0
    assert len(_uids(batch)) == 2


def test_validation_is_verls_own_sampling(tq):
    """Validation ("val") groups are never filtered or capped."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    sampler = _capped(_Rollout(tq), cap=1)
    uid = uuid.UUID(int=next(_UIDS)).hex
    tq.kv_batch_put(
        keys=[f"{uid}_0_0"],
        partition_id="val",
        tags=[{"status": "success", "seq_len": 13}],
        fields=list_of_dict_to_tensordict([{"rm_scores": torch.tensor([1.0])}]),
    )
    tq.kv_batch_put(keys=[uid], partition_id="val", tags=[{"is_prompt": True, "status": "finished", "global_steps": 1}])
    batch, metrics = sampler.sample(global_steps=1, partition_id="val", batch_size=1)
    assert batch.keys == [f"{uid}_0_0"] and "creditlab/n_gen_batches" not in metrics
    tq.kv_clear(keys=batch.keys, partition_id="val")


def test_sampler_refuses_what_it_cannot_cap():
    kwargs = {"filter_metric": "reward", "train_batch_size": 2, "max_num_gen_batches": 0}
    with pytest.raises(ValueError, match=">= 1"):
        samplers.CappedDapoSampler("sync", {}, None, "drop", kwargs, refill_fn=lambda n: n)
    with pytest.raises(ValueError, match="sync"):
        samplers.CappedDapoSampler(
            "async", {}, None, "drop", {**kwargs, "max_num_gen_batches": 2}, refill_fn=lambda n: n
        )
    with pytest.raises(ValueError, match="max_num_gen_batches"):
        samplers.CappedDapoSampler("sync", {}, None, "drop", {"filter_metric": "acc"}, refill_fn=lambda n: n)


def test_dynamic_sampling_runs_get_the_capped_sampler_through_verls_trainer(tmp_path, monkeypatch):
    """plugin_overrides of a dynamic-sampling run compose with verl's Hydra config, and verl's own
    PPOTrainer._build_replay_buffer (the real method, on a trainer object without Ray) builds the capped sampler with
    the run's cap, batch size and filter metric; a run without dynamic sampling keeps verl's replay buffer."""
    from hydra import compose, initialize_config_module
    from omegaconf import open_dict

    from creditlab.engines.verl import trainer as vtrainer

    for var in ("VERL_USE_EXTERNAL_MODULES", plugin.ENV_RUN_CONFIG):
        monkeypatch.setenv(var, "")
    cfg = compose_run("micro", "micro-s", "dapo", ["trainer.dynamic_sampling=true", "trainer.max_gen_batches=3"])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, str(path))
    t = cfg["trainer"]

    def ds(run_cfg):
        return "true" if run_cfg["trainer"]["dynamic_sampling"] else "false"

    def build(run_cfg):
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            verl_cfg = compose(
                "ppo_trainer",
                overrides=[
                    *plugin.plugin_overrides(run_cfg),
                    f"data.train_batch_size={t['prompts_per_step']}",
                    f"algorithm.filter_groups.enable={ds(run_cfg)}",
                    f"+creditlab.config_path={path}",
                ],
            )
        with open_dict(verl_cfg):
            verl_cfg.trainer.v1.trainer_mode = "sync"  # as CreditlabTrainer.__init__ does
        trainer = object.__new__(vtrainer.CreditlabTrainer)
        trainer.config, trainer.trainer_mode = verl_cfg, "sync"
        trainer._add_prompts_to_generate = lambda n: n
        return trainer._build_replay_buffer()

    sampler = build(cfg)
    assert type(sampler) is samplers.CappedDapoSampler
    assert sampler.max_num_gen_batches == 3 and sampler.train_batch_size == t["prompts_per_step"]
    assert sampler.filter_groups_metric == plugin.verl_options(cfg)["filter_metric"] and sampler.gen_batch_size == 1
    off = compose_run("micro", "micro-s", "dapo", ["trainer.dynamic_sampling=false"])
    assert type(build(off)) is ReplayBuffer
