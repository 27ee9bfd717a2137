"""The verl plug-in (src/creditlab/engines/verl/) against verl 0.9.1's real code, on CPU.

What runs here for real: verl's policy-loss and advantage registries and its vanilla PPO loss and worker loss
(``ppo_loss``) with verl's ``FSDPActorConfig``; verl's Hydra config composed with ``plugin_overrides``; the
V1 trainer's ``_balance_batch`` (QB, sequential) / ``_compute_advantage`` / ``_update_actor`` and verl's dispatch
chunking, worker input (``_meta_to_realdata``), mini-batch iterator and micro-batching (``prepare_micro_batches``
with ``force_group_size``); the group-coupled losses (grpo_fix, dfpo) through ``ppo_loss`` with the micro-batch's
group ids; a real TransferQueue (Ray local mode, one storage unit) for the RB sampler and the batch orders; verl's
FSDP engine
``forward_step`` on a tiny Qwen3 for the hidden-state capture (the only CPU adaptation: verl's device lookup
returns "cpu"). What does not run here: verl's Ray worker group, FSDP, vLLM (GPU only).
"""

from __future__ import annotations

# verl 0.9.1 and TransferQueue 0.1.11 are in the dev install (make install): a missing one fails here, loudly
import importlib  # noqa: E402
import itertools
import threading
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

for _required in ("verl", "transfer_queue"):
    importlib.import_module(_required)

from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402

import verl_cpu  # noqa: E402
from conftest import clear_partition  # noqa: E402
from creditlab.algos import registry  # noqa: E402
from creditlab.algos.batching import RewardBalancedBuffer, sign_counts  # noqa: E402
from creditlab.algos.credit.arca import arca_weights  # noqa: E402
from creditlab.algos.credit.base import (  # noqa: E402
    CreditInputs,
    apply_credit,
    method_entries,
)
from creditlab.algos.credit.delta import delta_weights  # noqa: E402
from creditlab.algos.credit.dlogp import dlogp_weights  # noqa: E402
from creditlab.engines.verl import ordering, plugin, samplers  # noqa: E402
from creditlab.engines.verl import trainer as vtrainer  # noqa: E402
from creditlab.engines.verl import workers as vworkers  # noqa: E402
from creditlab.plan import compose as compose_run  # noqa: E402

GROUP = 4
RB_ON = "trainer.reward_balance.enable=true"


# ------------------------------------------------------------------------------------------------------
# helpers


def _run_cfg(method="dapo", overrides=()):
    return compose_run("micro", "micro-s", method, list(overrides))


def _write_cfg(tmp_path, cfg, name="run.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def _batch(B=8, T=7, d=16, seed=0):
    """A random rollout batch: right-padded mask, old/new log-probs spread beyond the clip range, GRPO
    advantages of groups of GROUP, hidden states."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lens[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 3
    new = old + torch.randn(B, T, generator=g) * 0.6
    new[:, 0] += 3.0  # ratios ~20 on the first token: the dual clip binds on negative-advantage rows
    rewards = torch.tensor([float(i % 3 == 0) for i in range(B)])
    gids = torch.arange(B) // GROUP
    adv = registry.get("advantage", "grpo")(rewards, gids)
    hidden = torch.randn(B, T, d, generator=g)
    return SimpleNamespace(
        mask=mask,
        old=old,
        new=new,
        adv=adv,
        gids=gids,
        hidden=hidden,
        responses=torch.randint(3, 50, (B, T), generator=g),
        lens=lens,
    )


def _actor_config(agg, dp=1, n_tokens=None, gbs=None, loss_mode="vanilla"):
    cfg = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=GROUP,
        ppo_micro_batch_size_per_gpu=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )
    cfg.global_batch_info.update(dp_size=dp, batch_num_tokens=n_tokens, global_batch_size=gbs, loss_scale_factor=None)
    return cfg


def _verl_cfg(overrides):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def _nt(xs):
    return torch.nested.as_nested_tensor(list(xs), layout=torch.jagged)


# ------------------------------------------------------------------------------------------------------
# registrations and losses


def test_every_creditlab_loss_and_advantage_is_in_verls_registries():
    for name in registry.names("policy_loss"):
        fn = core_algos.get_policy_loss_fn(f"creditlab_{name}")
        assert fn.__name__ == f"creditlab_{name}" and fn.__module__ == plugin.__name__
    for name in registry.names("advantage"):
        assert core_algos.get_adv_estimator_fn(f"creditlab_{name}").__name__ == f"creditlab_{name}"
    b = _batch()
    for name in ("dfpo", "grpo_fix"):  # group-coupled: outside the worker's with_group_ids they refuse, loudly
        assert plugin.needs_group_ids(name) and plugin.current_group_ids() is None
        with pytest.raises(ValueError, match="group ids of the micro-batch"):
            core_algos.get_policy_loss_fn(f"creditlab_{name}")(
                b.old, b.new, b.adv[:, None] * b.mask, b.mask.bool(), loss_agg_mode="seq-mean-token-mean"
            )
    assert not plugin.needs_group_ids("dapo") and not plugin.needs_group_ids("gspo")


@pytest.mark.parametrize(
    "agg,dp",
    [
        ("token-mean", 1),
        ("token-mean", 2),
        ("seq-mean-token-mean", 1),
        ("seq-mean-token-mean", 2),
        ("seq-mean-token-sum", 2),
    ],
)
def test_registered_dapo_equals_verl_vanilla_on_folded_advantages(tmp_path, monkeypatch, agg, dp):
    """creditlab_dapo (registered, kwargs from the run config) == verl's compute_policy_loss_vanilla, value and
    gradient, on advantages with DelTA x Δlog p weights folded in, per rank of a dp-rank mini-batch."""
    cfg = _run_cfg("dapo", [f"method.loss_kwargs.agg={agg}"])
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, cfg))
    b = _batch(B=8)
    inputs = CreditInputs(
        responses=b.responses, mask=b.mask, old_logp=b.old, advantages=b.adv, group_ids=b.gids, hidden=b.hidden
    )
    credit = method_entries("credit", [{"name": "dlogp", "alpha": 0.2}, {"name": "delta"}])
    adv_tok, loss_mask, w = plugin.fold_credit(inputs, credit, [])
    assert torch.equal(loss_mask, b.mask) and w[b.mask.bool()].std() > 0.01  # the weights are not trivial
    n_tokens, rows = int(b.mask.sum()), b.mask.shape[0]
    ours_fn = core_algos.get_policy_loss_fn("creditlab_dapo")
    diffs = []
    for shard in torch.arange(rows).chunk(dp):  # each rank's micro-batch, normalised by the global mini-batch
        args = [x[shard] for x in (b.old, b.new, adv_tok, b.mask.bool())]
        config = _actor_config(agg, dp, n_tokens if dp > 1 else None, rows if dp > 1 else None)
        out = {}
        for name, fn in (("ours", ours_fn), ("vanilla", core_algos.compute_policy_loss_vanilla)):
            logp = args[1].clone().requires_grad_(True)
            loss, metrics = fn(args[0], logp, args[2], args[3], loss_agg_mode=agg, config=config)
            (grad,) = torch.autograd.grad(loss, logp)
            out[name] = (loss.detach(), grad, metrics)
        diffs += [
            (out["ours"][0] - out["vanilla"][0]).abs().item(),
            (out["ours"][1] - out["vanilla"][1]).abs().max().item(),
        ]
        assert out["ours"][2]["actor/pg_clipfrac"] == pytest.approx(out["vanilla"][2]["actor/pg_clipfrac"])
        assert out["ours"][2]["actor/dual_clipfrac"] > 0 and out["ours"][2]["actor/clipfrac"] > 0  # all branches used
    assert max(diffs) < 1e-6, diffs
    # the folding matters: verl's loss on the unweighted advantages is a different loss
    plain = core_algos.compute_policy_loss_vanilla(
        b.old, b.new, b.adv[:, None] * b.mask, b.mask.bool(), loss_agg_mode=agg, config=_actor_config(agg)
    )[0]
    folded = core_algos.compute_policy_loss_vanilla(
        b.old, b.new, adv_tok, b.mask.bool(), loss_agg_mode=agg, config=_actor_config(agg)
    )[0]
    assert (plain - folded).abs() > 1e-4


@pytest.mark.parametrize("loss", ["sapo", "gspo"])
def test_registered_sapo_gspo_equal_verls_own(tmp_path, monkeypatch, loss):
    """creditlab's SAPO and GSPO, registered, equal verl's own loss_mode=sapo / gspo (their aggregation,
    seq-mean-token-mean, which verl's SAPO hard-codes) on folded advantages, on 2 data-parallel shards."""
    cfg = _run_cfg(loss)
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, cfg))
    kw, b = cfg["method"]["loss_kwargs"], _batch(B=8, seed=1)
    adv = b.adv[:, None] * torch.linspace(0.8, 1.2, b.mask.shape[1]) * b.mask
    diffs = []
    for shard in torch.arange(8).chunk(2):
        config = FSDPActorConfig(
            strategy="fsdp",
            rollout_n=GROUP,
            ppo_micro_batch_size_per_gpu=2,
            loss_agg_mode=kw["agg"],
            clip_ratio_low=kw.get("eps_low", 0.2),
            clip_ratio_high=kw.get("eps_high", 0.2),
            tau_pos=kw.get("tau_pos", 1.0),
            tau_neg=kw.get("tau_neg", 1.05),
        )
        config.global_batch_info.update(
            dp_size=2, batch_num_tokens=int(b.mask.sum()), global_batch_size=8, loss_scale_factor=None
        )
        out = []
        for name in (f"creditlab_{loss}", loss):
            logp = b.new[shard].clone().requires_grad_(True)
            value, _ = core_algos.get_policy_loss_fn(name)(
                b.old[shard], logp, adv[shard], b.mask[shard].bool(), loss_agg_mode=kw["agg"], config=config
            )
            out.append((value.detach(), torch.autograd.grad(value, logp)[0]))
        assert out[0][0] != 0
        diffs += [(out[0][0] - out[1][0]).abs().item(), (out[0][1] - out[1][1]).abs().max().item()]
    assert max(diffs) < 1e-6, diffs


def test_verl_worker_loss_path_with_our_loss_mode(tmp_path, monkeypatch):
    """verl's worker loss ``ppo_loss`` (nested TransferQueue-style fields, model output over full sequences)
    gives the same policy loss with loss_mode=creditlab_dapo as with vanilla."""
    from verl.workers.utils.losses import ppo_loss

    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, _run_cfg("dapo")))
    b = _batch(B=6)
    lens = b.lens.tolist()
    prompts = [torch.randint(3, 50, (3 + i % 2,)) for i in range(6)]
    full_logp = [
        torch.cat([torch.zeros(len(p) - 1), b.new[i, : lens[i]], torch.zeros(1)]) for i, p in enumerate(prompts)
    ]
    data = TensorDict(
        {
            "prompts": _nt(prompts),
            "responses": _nt(b.responses[i, :n] for i, n in enumerate(lens)),
            "response_mask": _nt(b.mask[i, :n] for i, n in enumerate(lens)),
            "old_log_probs": _nt(b.old[i, :n] for i, n in enumerate(lens)),
            "advantages": _nt((b.adv[i] * torch.linspace(0.8, 1.2, n)) for i, n in enumerate(lens)),
        },
        batch_size=[6],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(b.mask.sum()), global_batch_size=6)
    losses = {}
    for mode in ("vanilla", "creditlab_dapo"):
        cfg = _actor_config("token-mean", loss_mode=mode)
        loss, metrics = ppo_loss(cfg, {"log_probs": _nt(full_logp)}, data)
        losses[mode] = loss.item()
    assert losses["vanilla"] == pytest.approx(losses["creditlab_dapo"], abs=1e-6) and losses["vanilla"] != 0.0


def _rank_minibatch(loss, n_groups=4, seed=0, dtype=torch.float64):
    """A PPO mini-batch as verl's workers hold it (fields from TransferQueue, nested; the prompt ``uid`` of every
    rollout; whole groups of GROUP consecutive rows), and the current policy's response log-probs (a leaf,
    padded). DFPO's trust region (GSPO's 3e-4 / 4e-4) needs sequence ratios within ~1e-3 of 1; GRPO-fix's
    (0.2) needs token ratios spread beyond it."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * GROUP
    P = torch.randint(2, 6, (B,), generator=g).tolist()
    R = torch.randint(3, 10, (B,), generator=g).tolist()
    T = max(R)
    mask = (torch.arange(T)[None] < torch.tensor(R)[:, None]).to(dtype)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    if loss == "dfpo":
        new = (
            old
            + (torch.rand(B, 1, generator=g, dtype=dtype) - 0.5) * 1.6e-3
            + torch.randn(B, T, generator=g, dtype=dtype) * 2e-4
        )
    else:
        new = old + torch.randn(B, T, generator=g, dtype=dtype) * 0.3
    rewards = torch.randint(0, 2, (B,), generator=g).to(dtype)
    gids = torch.arange(B) // GROUP
    adv = registry.get("advantage", "grpo")(rewards, gids)[:, None] * mask
    uids = [uuid.UUID(int=int(torch.randint(0, 2**62, (1,), generator=g))).hex for _ in range(n_groups)]
    prompts = [torch.randint(3, 50, (p,), generator=g) for p in P]
    resps = [torch.randint(3, 50, (r,), generator=g) for r in R]
    td = TensorDict(
        {
            "input_ids": _nt(torch.cat([a, b]) for a, b in zip(prompts, resps)),
            "prompts": _nt(prompts),
            "responses": _nt(resps),
            "response_mask": _nt(mask[i, :n] for i, n in enumerate(R)),
            "old_log_probs": _nt(old[i, :n] for i, n in enumerate(R)),
            "advantages": _nt(adv[i, :n] for i, n in enumerate(R)),
            "row": torch.arange(B),
        },
        batch_size=[B],
    )
    td["uid"] = tu.get_tensordict({"uid": [uids[int(i)] for i in gids]})["uid"]
    tok = torch.stack([torch.nn.functional.pad(r, (0, T - len(r))) for r in resps])  # Tensor[B, T] token ids
    return SimpleNamespace(td=td, P=P, R=R, mask=mask, old=old, new=new, adv=adv, gids=gids, B=B, tok=tok)


def _verl_loss_path(mb, loss, agg, dp, force_group, budget):
    """The actor update's loss path of verl 0.9.1 on each rank's share of ``mb`` (rows split into ``dp`` contiguous
    rank chunks, as verl's dispatch): the non-tensor fields ``train_batch`` / ``forward_backward_batch`` set
    (dynamic batch sizes, the token budget, dp_size, the global token count, global_batch_size = the mini-batch's
    rollouts), verl's ``prepare_micro_batches`` (with the trainer's ``force_group_size``), and per micro-batch
    the worker's loss: ``plugin.with_group_ids(partial(ppo_loss, config))`` on the model output (full-sequence
    log-probs, as the engine's ``forward_step``). Returns [(rows, loss, d loss / d log-probs Tensor[B, T])] per
    micro-batch."""
    from functools import partial

    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss

    cfg = _actor_config(agg, loss_mode=f"creditlab_{loss}")
    fn = plugin.with_group_ids(partial(ppo_loss, config=cfg))
    out = []
    for rank_rows in torch.arange(mb.B).chunk(dp):
        data = tu.index_select_tensor_dict(mb.td, rank_rows)
        tu.assign_non_tensor(
            data,
            use_dynamic_bsz=True,
            max_token_len_per_gpu=budget,
            force_group_size=force_group,
            dp_size=dp,
            batch_num_tokens=int(mb.mask.sum()),
            global_batch_size=mb.B,
        )
        micro_batches, _ = prepare_micro_batches(data)
        for micro in micro_batches:
            rows = micro["row"].tolist()
            leaf = mb.new.clone().requires_grad_(True)
            full = [
                torch.cat(
                    [torch.zeros(mb.P[i] - 1, dtype=leaf.dtype), leaf[i, : mb.R[i]], torch.zeros(1, dtype=leaf.dtype)]
                )
                for i in rows
            ]
            value, _ = fn(model_output={"log_probs": _nt(full)}, data=micro, dp_group=None)
            out.append((rows, value.detach(), torch.autograd.grad(value, leaf)[0]))
    return out


@pytest.mark.parametrize(
    "loss,agg,dp",
    [
        ("dfpo", "seq-mean-token-mean", 1),
        ("dfpo", "seq-mean-token-mean", 2),
        ("dfpo", "token-mean", 2),
        ("grpo_fix", "seq-mean-token-mean", 1),
        ("grpo_fix", "seq-mean-token-mean", 2),
        ("grpo_fix", "token-mean", 2),
    ],
)
def test_group_coupled_losses_on_verls_loss_path(tmp_path, monkeypatch, capsys, loss, agg, dp):
    """creditlab_grpo_fix / creditlab_dfpo through verl's real actor loss path (prepare_micro_batches with dynamic
    batch sizes and the trainer's force_group_size = G, ppo_loss inside the worker's with_group_ids, dp ranks)
    equal creditlab's grpo_fix_loss / dfpo_loss called directly, loss and gradient: per micro-batch on its rows
    with its group ids (normalised as verl normalises a micro-batch: by the mini-batch: ``denom`` = tokens / dp
    for token-mean, x rows dp / rollouts for the seq-mean modes), and summed over micro-batches and averaged over
    ranks (FSDP), on the whole mini-batch with all its group ids (the local engine's loss). Without
    force_group_size verl's micro-batching splits groups and the loss is a different one."""
    cfg = _run_cfg(loss, [f"method.loss_kwargs.agg={agg}"])
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, cfg))
    kw = {k: v for k, v in cfg["method"]["loss_kwargs"].items() if k != "agg"}
    direct = registry.get("policy_loss", loss)

    def creditlab(rows, **extra):
        leaf = mb.new[rows].clone().requires_grad_(True)
        if loss == "grpo_fix":  # its shared tokens are token ids: the micro-batch's `responses` reach it
            extra["responses"] = mb.tok[rows]
        value, stats = direct(
            leaf, mb.old[rows], mb.adv[rows], mb.mask[rows], group_ids=mb.gids[rows], agg=agg, **extra, **kw
        )
        return value, torch.autograd.grad(value, leaf)[0], stats

    mb = _rank_minibatch(loss, n_groups=6)
    budget = 2 * GROUP * max(p + r for p, r in zip(mb.P, mb.R))  # two groups always fit; several micro-batches
    micro = _verl_loss_path(mb, loss, agg, dp, GROUP, budget)
    n_groups = [len({int(mb.gids[i]) for i in r}) for r, _, _ in micro]
    assert len(micro) > dp and max(n_groups) > 1  # several micro-batches per rank, some with several groups
    assert all(n * GROUP == len(r) for n, (r, _, _) in zip(n_groups, micro))  # only whole groups
    d_micro = []
    for rows, value, grad in micro:  # each micro-batch against the direct call on it
        idx = torch.tensor(rows)
        denom = float(mb.mask.sum()) / dp if agg == "token-mean" else None
        scale = 1.0 if agg == "token-mean" else len(rows) * dp / mb.B
        v, g, _ = creditlab(idx, denom=denom)
        d_micro += [(value - v * scale).abs().item(), (grad[idx] - g * scale).abs().max().item()]
        assert grad[[i for i in range(mb.B) if i not in rows]].abs().max() == 0
    total = sum(v for _, v, _ in micro) / dp  # what the optimizer step sees (FSDP averages over ranks)
    total_grad = sum(g for _, _, g in micro) / dp
    ref, ref_grad, stats = creditlab(torch.arange(mb.B))  # the local engine: the whole mini-batch at once
    d_loss, d_grad = (total - ref).abs().item(), (total_grad - ref_grad).abs().max().item()
    with capsys.disabled():
        print(
            f"\n{loss} {agg} dp={dp}, {len(micro)} micro-batches: max |diff| per micro-batch {max(d_micro):.1e}; "
            f"mini-batch loss {d_loss:.1e}, gradient {d_grad:.1e} (loss {ref.item():.3e}, "
            f"max |grad| {ref_grad.abs().max().item():.1e})"
        )
    assert ref.abs() > 1e-6 and ref_grad.abs().max() > 1e-6
    assert max(d_micro) < 1e-12 and d_loss < 1e-12 and d_grad < 1e-12
    if loss == "dfpo":
        assert stats["dfpo_cancel_rel_before"] > 1e-3 and stats["dfpo_cancel_rel_after"] < 1e-9  # the transform acts
    else:
        assert 0 < stats["grpo_fix_pruned_frac"] < 1 and 0 < stats["grpo_fix_shared_frac"] < 1
    # without force_group_size verl's token-balanced micro-batches split groups: a different loss
    split = _verl_loss_path(mb, loss, agg, dp, 1, budget)
    assert any(len({int(mb.gids[i]) for i in r}) * GROUP != len(r) for r, _, _ in split)
    assert (sum(g for _, _, g in split) / dp - ref_grad).abs().max() > 1e-6


def test_worker_installs_the_group_ids_wrapper_for_group_coupled_losses():
    """CreditlabActorRolloutRefWorker.init_model (after verl's) wraps the actor's ppo_loss with with_group_ids for
    a group-coupled loss_mode only, and hands it to the actor's TrainingWorker; idempotent."""
    from omegaconf import OmegaConf

    class _Actor:
        def set_loss_fn(self, fn):
            self.loss_fn = fn

    for mode, wrapped in (
        ("creditlab_dfpo", True),
        ("creditlab_grpo_fix", True),
        ("creditlab_dapo", False),
        ("vanilla", False),
    ):
        inner = lambda model_output, data, dp_group=None: (plugin.current_responses(4), plugin.current_group_ids())
        worker = SimpleNamespace(
            actor=_Actor(), loss_fn=inner, config=OmegaConf.create({"actor": {"policy_loss": {"loss_mode": mode}}})
        )
        assert vworkers.install_group_ids(worker) is wrapped
        assert (worker.loss_fn is inner) is not wrapped and getattr(worker.actor, "loss_fn", None) is (
            worker.loss_fn if wrapped else None
        )
        if wrapped:
            data = TensorDict({}, batch_size=[3])
            data["uid"] = tu.get_tensordict({"uid": ["b", "a", "b"]})["uid"]
            tok, seen = worker.loss_fn(model_output=1, data=data, dp_group=None)
            assert seen.tolist() == [1, 0, 1] and plugin.current_group_ids() is None and tok is None
            # the micro-batch's token ids (GRPO-fix's shared tokens), right-padded to the loss's width
            data["responses"] = _nt([torch.tensor([5, 6]), torch.tensor([7, 8, 9, 10, 11]), torch.tensor([5])])
            tok, _ = worker.loss_fn(model_output=1, data=data, dp_group=None)
            assert tok.tolist() == [[5, 6, 0, 0], [7, 8, 9, 10], [5, 0, 0, 0]] and plugin.current_responses(4) is None
            assert vworkers.install_group_ids(worker) is False  # already wrapped


def test_creditlab_grpo_estimator_equals_verls_grpo_through_compute_advantage(tmp_path, monkeypatch):
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, _run_cfg("dapo")))
    b = _batch(B=12)
    scores = torch.zeros_like(b.mask)
    scores[torch.arange(12), b.lens - 1] = torch.tensor([float(i % 3 == 0) + 0.1 * i for i in range(12)])
    uids = np.array([f"u{i // GROUP}" for i in range(12)], dtype=object)
    outs = {}
    for est in ("grpo", "creditlab_grpo", "creditlab_rloo"):
        data = DataProto.from_dict(
            tensors={"token_level_rewards": scores, "response_mask": b.mask}, non_tensors={"uid": uids}
        )
        algo = SimpleNamespace(get=lambda *a: None)
        outs[est] = compute_advantage(data, adv_estimator=est, config=algo).batch["advantages"]
    assert (outs["grpo"] - outs["creditlab_grpo"]).abs().max() < 1e-6
    assert (outs["grpo"] - outs["creditlab_rloo"]).abs().max() > 1e-2  # a different estimator really is different


def test_fold_credit_is_the_local_engine_composition():
    """adv_tok = A w (credit functions multiplied), loss mask = mask x token filters, as the local engine."""
    b = _batch(B=8)
    entropy = torch.rand(8, 7)
    inputs = CreditInputs(
        responses=b.responses,
        mask=b.mask,
        old_logp=b.old,
        advantages=b.adv,
        group_ids=b.gids,
        hidden=b.hidden,
        entropy=entropy,
    )
    credit = [{"name": "dlogp", "alpha": 0.1}, {"name": "ppl"}]
    filters = [{"name": "forking", "top_frac": 0.3}]
    adv_tok, loss_mask, w = plugin.fold_credit(
        inputs, method_entries("credit", credit), method_entries("token_filter", filters)
    )
    want_w = torch.ones_like(b.old)
    for fn, kw in method_entries("credit", credit):
        want_w = want_w * apply_credit(fn, inputs, kw)
    fn, kw = method_entries("token_filter", filters)[0]
    keep = apply_credit(fn, inputs, kw)
    assert torch.allclose(w, want_w) and torch.allclose(adv_tok, b.adv[:, None] * want_w * b.mask)
    assert torch.equal(loss_mask, b.mask * keep) and 0 < loss_mask.sum() < b.mask.sum()


# ------------------------------------------------------------------------------------------------------
# the launcher contract


RUNS = {
    "dapo": ("dapo", []),
    "delta": ("delta", []),
    "qb": ("dapo", ["trainer.batching=query_preserved"]),
    "rb": ("dapo", ["trainer.reward_balance.enable=true"]),
    "arca": ("arca", []),
    "dfpo-seq": ("dfpo", ["trainer.batching=sequential"]),
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_plugin_overrides_compose_with_verls_config(tmp_path, monkeypatch, run):
    for var in ("VERL_USE_EXTERNAL_MODULES", plugin.ENV_RUN_CONFIG):  # the entry point exports both: restore after
        monkeypatch.setenv(var, "")
    from creditlab.engines.verl import main as vmain

    method, over = RUNS[run]
    cfg = _run_cfg(method, over)
    ov = plugin.plugin_overrides(cfg)
    path = _write_cfg(tmp_path, cfg)
    verl_cfg = _verl_cfg([*ov, f"+creditlab.config_path={path}"])
    actor = verl_cfg.actor_rollout_ref.actor
    assert verl_cfg.trainer.v1.trainer_mode == "creditlab_sync" and verl_cfg.trainer.use_v1
    assert actor.policy_loss.loss_mode == f"creditlab_{cfg['method']['policy_loss']}"
    assert verl_cfg.algorithm.adv_estimator == f"creditlab_{cfg['method']['advantage']}"
    assert actor.loss_agg_mode == cfg["method"]["loss_kwargs"]["agg"]
    if run in ("qb", "dfpo-seq"):  # verl's default is false too: the plug-in sets it explicitly, not by default
        assert "actor_rollout_ref.actor.shuffle=false" in ov and actor.shuffle is False
    assert verl_cfg.trainer.balance_batch is (run != "dfpo-seq")
    sampler = verl_cfg.trainer.v1.sampler
    if run == "rb":
        assert sampler.custom_sampler.name == "RewardBalancedSampler" and sampler.sampler_kwargs.rho == 0.25
        from verl.utils.import_utils import load_extern_object  # how verl's _build_replay_buffer loads it

        loaded = load_extern_object(sampler.custom_sampler.path, sampler.custom_sampler.name)
        assert loaded is samplers.RewardBalancedSampler
    else:
        assert sampler.custom_sampler.name is None
    if run == "arca":
        lora = cfg["trainer"]["lora"]
        assert verl_cfg.actor_rollout_ref.model.lora_rank == lora["rank"]
        assert list(verl_cfg.actor_rollout_ref.model.target_modules) == lora["target_modules"]
    else:
        assert verl_cfg.actor_rollout_ref.model.lora_rank == 0
    got = vmain.prepare(verl_cfg)
    assert got["method"]["name"] == cfg["method"]["name"]
    assert verl_cfg.ray_kwargs.ray_init.runtime_env.env_vars[plugin.ENV_RUN_CONFIG] == path


@pytest.mark.parametrize(
    "method,over,match",
    [
        ("dfpo", ["trainer.batching=verl_default"], "couples the rollouts of a group.*'verl_default'"),
        ("grpo_fix", ["trainer.batching=verl_default"], "couples the rollouts of a group"),
        ("dapo", ["trainer.batching=random"], "random and token_balanced are local-engine orders"),
        ("dapo", ["trainer.batching=token_balanced"], "not supported on the verl engine"),
        ("grpo", ["trainer.batching=sequential", "trainer.mini_batches=3"], "not a multiple of trainer.mini_batches=3"),
        ("dapo", ["trainer.batching=sign_partitioned", "trainer.mini_batches=3"], "not a multiple of trainer.mini_b"),
        ("dapo", ["trainer.batching=nope"], "not supported"),
        ("dapo", ["trainer.reward_balance.enable=true", "trainer.dynamic_sampling=true"], "dynamic sampling"),
        ("arca", ["trainer.lora.enable=false"], "lora.enable"),
    ],
)
def test_plugin_overrides_refuses_what_verl_cannot_run(method, over, match):
    cfg = _run_cfg(method, over)
    with pytest.raises(ValueError, match=match):
        plugin.plugin_overrides(cfg)


def test_group_coupled_plan_checks_use_the_job_size():
    """At paper sizes (model.verl), a group-coupled loss needs whole groups per data-parallel rank and a
    micro-batch budget of G whole sequences: the plug-in refuses the first and raises the second."""
    import copy

    cfg = _run_cfg("dfpo", ["trainer.batching=sequential"])
    t = cfg["trainer"]
    t.update(prompts_per_step=32, mini_batches=4, group_size=16, max_prompt_tokens=1000, max_new_tokens=3000)
    cfg["model"]["verl"] = {"nnodes": 1, "n_gpus_per_node": 8, "ulysses_sp": 2, "token_len_factor": 2}
    ov = plugin.plugin_overrides(cfg)  # dp = 4 ranks, 8 prompts per mini-batch: 2 whole groups per rank
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32000" in ov  # 16 x 4000 / sp 2 > the 2 x 4000
    t["group_size"] = 4
    assert not any("ppo_max_token_len_per_gpu" in o for o in plugin.plugin_overrides(cfg))  # 4 x 4000 / 2 fits
    bad = copy.deepcopy(cfg)
    bad["model"]["verl"]["n_gpus_per_node"] = 6  # dp 3: 8 prompts per mini-batch do not split into whole groups
    with pytest.raises(ValueError, match="straddle two ranks"):
        plugin.plugin_overrides(bad)
    gspo = _run_cfg("gspo", ["trainer.batching=sequential"])
    gspo["trainer"], gspo["model"]["verl"] = bad["trainer"], bad["model"]["verl"]
    assert "actor_rollout_ref.actor.shuffle=false" in plugin.plugin_overrides(gspo)  # not group-coupled: fine


def test_topk_proxy_runs_on_the_workers_as_in_the_local_engine():
    """DelTA's top-K proxy on verl: the plan accepts it (the workers provide the top-K log-probs and the LM head),
    workers.topk_logprobs is the local engine's log_softmax(h W^T).topk(K), and worker_credit with them equals
    delta_weights on the same inputs (a different credit from the default variant's)."""
    from creditlab.algos.credit.delta import delta_weights as local_delta

    cfg = _run_cfg("delta", ["method.credit.0.variant=topk_proxy", "+method.credit.0.topk=8"])
    plugin.plugin_overrides(cfg)
    assert vworkers.spec_topk({"credit": cfg["method"]["credit"]}) == 8
    b = _batch(d=16)
    W = torch.randn(64, 16, generator=torch.Generator().manual_seed(5))  # V covers the response ids (< 50)
    vals, ids = vworkers.topk_logprobs(b.hidden, W, 8, chunk_tokens=5)
    want = torch.log_softmax(b.hidden @ W.T, -1).topk(8, dim=-1)
    assert torch.allclose(vals, want.values, atol=1e-6) and torch.equal(ids, want.indices)
    kw = {k: v for k, v in cfg["method"]["credit"][0].items() if k != "name"}
    out = vworkers.worker_credit(
        {"credit": cfg["method"]["credit"]},
        responses=b.responses,
        mask=b.mask,
        old_logp=b.old,
        advantages=b.adv,
        uids=[str(g) for g in b.gids.tolist()],
        entropy=None,
        hidden=b.hidden,
        topk_logp=vals,
        topk_ids=ids,
        lm_head=W,
    )["weights"]
    ref = local_delta(b.responses, b.mask, b.old, b.adv, b.hidden, topk_logp=vals, topk_ids=ids, lm_head=W, **kw)
    assert torch.allclose(out, ref, atol=1e-6)
    default = vworkers.worker_credit(
        {"credit": [{"name": "delta"}]},
        responses=b.responses,
        mask=b.mask,
        old_logp=b.old,
        advantages=b.adv,
        uids=[str(g) for g in b.gids.tolist()],
        entropy=None,
        hidden=b.hidden,
    )["weights"]
    assert (out - default).abs().max() > 1e-4


# ------------------------------------------------------------------------------------------------------
# a real TransferQueue


_UIDS = itertools.count(1)


def _next_uid() -> str:
    """A prompt uid as verl makes them (uuid hex), but from a counter: the trainer orders batches by content (their
    prompts are made from the uid), so random uids would make the tests' batch orders random."""
    return uuid.UUID(int=next(_UIDS) * 0x9E3779B97F4A7C15 % (1 << 128)).hex


def _put_group(tq, rewards, step, partition="train", seq_lens=None):
    """One finished prompt group in TransferQueue as verl's agent loop writes it: trajectories
    ``{uid}_{session}_0`` (rm_scores with the reward on the last token, uid, response fields) and the prompt
    key ``{uid}`` tagged finished."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    uid = _next_uid()
    keys, fields, tags = [], [], []
    for s, r in enumerate(rewards):
        L = 3 + s if seq_lens is None else seq_lens[s]
        keys.append(f"{uid}_{s}_0")
        fields.append(
            {
                "rm_scores": torch.tensor([0.0] * (L - 1) + [float(r)]),
                "uid": uid,
                "prompts": torch.tensor(list(uid.encode())),
                "responses": torch.arange(L) + s,
                "response_mask": torch.ones(L, dtype=torch.int64),
            }
        )
        tags.append({"status": "success", "seq_len": 10 + L, "global_steps": step})
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
    tq.kv_batch_put(
        keys=[uid], partition_id=partition, tags=[{"is_prompt": True, "status": "finished", "global_steps": step}]
    )
    return uid, keys


def test_rb_sampler_against_a_real_transfer_queue(transfer_queue, tmp_path, monkeypatch):
    """The RB sampler selects exactly what the local engine's RewardBalancedBuffer selects, keeps the rest in
    TransferQueue, evicts (and clears) aged groups, and asks for another generation round when no balanced
    batch exists."""
    tq = transfer_queue
    clear_partition(tq)
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, _run_cfg("dapo", [RB_ON])))
    refills: list[int] = []
    pending: list[list[float]] = []

    def refill(n):  # the trainer's _add_prompts_to_generate: here the "rollouts" of the next round appear
        refills.append(n)
        for rewards in pending.pop(0):
            uids.append(_put_group(tq, rewards, step=9)[0])

    sampler = samplers.RewardBalancedSampler(
        "sync", {}, 8, "drop", {"rho": 0.25, "max_age": 1, "sign": "advantage"}, refill_fn=refill, poll_interval=0.01
    )
    local = RewardBalancedBuffer(2, 0.25, 1)  # the local engine's buffer, fed the same groups

    def local_add(rewards_list, round_):
        for u, rw in zip(uids[-len(rewards_list) :], rewards_list):
            zeros = torch.zeros(len(rw), dtype=torch.long)
            adv = registry.get("advantage", "grpo")(torch.tensor(rw, dtype=torch.float32), zeros)
            ((n_pos, n_neg, size),) = sign_counts(adv, torch.zeros(len(rw), dtype=torch.long)).values()
            local.add(u, n_pos, n_neg, size, round_)

    # round 0: the two oldest groups carry no signal (all right / all wrong): a swap must bring in signed ones
    round0 = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    uids = [_put_group(tq, rw, step=1)[0] for rw in round0]
    local_add(round0, 0)
    batch, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=2)
    want, _ = local.select(0)
    got = list(dict.fromkeys(ordering.uid_of(k) for k in batch.keys))
    assert sorted(got) == sorted(want) and len(batch.keys) == 2 * GROUP
    assert metrics["training/rb/emitted"] == 1.0 and metrics["training/rb/rounds"] == 1.0
    listed = tq.kv_list("train")["train"]
    assert not any(u in listed for u in got)  # selected prompt keys consumed (verl's _materialize_batch)
    assert all(k in listed for k in batch.keys)  # their rollouts stay until the trainer has trained on them
    waiting = [u for u in uids if u not in got]
    assert all(u in listed for u in waiting)  # the rest waits in TransferQueue
    tq.kv_clear(keys=batch.keys, partition_id="train")  # what PPOTrainer.fit does after the step

    # round 1: only signal-free groups -> no balanced batch -> one more generation round (refill)
    round1 = [[1, 1, 1, 1], [0, 0, 0, 0]]
    for rw in round1:
        uids.append(_put_group(tq, rw, step=2)[0])
    local_add(round1, 1)
    pending.append([[1, 0, 1, 0], [0, 1, 1, 1]])
    batch, metrics = sampler.sample(global_steps=2, partition_id="train", batch_size=2)
    assert refills == [2] and metrics["training/rb/rounds"] == 2.0
    assert local.select(1)[0] is None
    local_add([[1, 0, 1, 0], [0, 1, 1, 1]], 2)
    want, local_stats = local.select(2)
    got = list(dict.fromkeys(ordering.uid_of(k) for k in batch.keys))
    assert sorted(got) == sorted(want)
    assert metrics["training/rb/dropped"] == local_stats["rb_dropped"] > 0  # round-0 groups aged out at round 2
    listed = tq.kv_list("train")["train"]
    aged = [u for u in waiting]
    assert not any(u in listed or any(k.startswith(u) for k in listed) for u in aged)  # cleared from TransferQueue
    assert sampler.state_dict()["round"] == 3


def test_rb_sampler_on_exhausted_trains_the_oldest_groups(transfer_queue, tmp_path, monkeypatch):
    tq = transfer_queue
    clear_partition(tq)
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, _run_cfg("dapo", [RB_ON])))
    sampler = samplers.RewardBalancedSampler(
        "sync", {}, 8, "drop", {"rho": 0.25, "max_age": 2, "max_rounds": 1}, refill_fn=None, poll_interval=0.01
    )
    first = _put_group(tq, [1, 1, 1, 1], step=1)[0]
    second = _put_group(tq, [0, 0, 0, 0], step=1)[0]
    _put_group(tq, [1, 1, 1, 1], step=1)
    batch, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=2)
    assert metrics["training/rb/forced"] == 1.0
    assert sorted(dict.fromkeys(ordering.uid_of(k) for k in batch.keys)) == sorted([first, second])
    clear_partition(tq)


def _trainer_stub(verl_cfg, dp, **attrs):
    """A CreditlabTrainer object without verl's Ray init: the real class, its real methods, verl's config;
    the actor worker group reduced to its dispatch info (which ranks are data-parallel)."""
    t = object.__new__(vtrainer.CreditlabTrainer)
    t.config = verl_cfg
    t.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(dp))})
    t.use_critic, t.global_steps, t.seed, t.tokenizer = False, 1, 0, SimpleNamespace(eos_token_id=2)
    t.qb, t.sequential, t.group_coupled, t.batching = False, False, False, "token_balanced"
    t.sign_partitioned, t.advantage_name = False, "grpo"
    t.__dict__.update(attrs)
    return t


def _realised_minibatches(batch, dp, mini_rollouts):
    """The optimizer steps verl makes of a balanced batch: verl's own dispatch split (BatchData.chunk, through
    TransferQueue) and each rank's mini-batch iterator (tu.make_iterator, shuffle off)."""
    from verl.protocol import BatchData
    from verl.utils.transferqueue_utils import batch_meta2kv_batch_meta

    mbs: dict[int, list[tuple[int, str]]] = {}
    for rank, chunk in enumerate(BatchData(batch).chunk(dp)):
        keys = batch_meta2kv_batch_meta(chunk).keys
        rows = TensorDict({"i": torch.arange(len(keys))}, batch_size=[len(keys)])
        batches = tu.make_iterator(rows, mini_rollouts // dp, epochs=1, dataloader_kwargs={"shuffle": False})
        for m, mb in enumerate(batches):
            mbs.setdefault(m, []).extend((rank, keys[int(i)]) for i in mb["i"])
    return [mbs[m] for m in sorted(mbs)]


def test_qb_trainer_keeps_groups_whole_with_verls_balancing(transfer_queue):
    """Under verl's real dispatch and mini-batching, CreditlabTrainer._balance_batch (QB) puts every group
    whole into one optimizer step on one rank; verl's own _balance_batch scatters them, and the legacy
    RayPPOTrainer order (``verl_ray``) scatters more. The local engine's verl_default / verl_ray make the same
    optimizer steps as the verl engine's."""
    from transfer_queue import KVBatchMeta

    tq = transfer_queue
    clear_partition(tq)
    dp, prompts, mini = 2, 16, 4  # 16 prompts x 4 rollouts, mini-batches of 4 prompts, 2 ranks
    verl_cfg = _verl_cfg(
        [
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
            f"actor_rollout_ref.rollout.n={GROUP}",
            "actor_rollout_ref.actor.shuffle=false",
        ]
    )
    g = torch.Generator().manual_seed(0)
    keys, tags = [], []
    for _ in range(prompts):
        lens = torch.randint(5, 400, (GROUP,), generator=g).tolist()
        _, k = _put_group(tq, [0, 1, 0, 1], step=1, seq_lens=lens)
        keys += k
        tags += [{"seq_len": 10 + n} for n in lens]
    results = {}
    for name, stub in (("verl", {}), ("qb", {"qb": True}), ("ray", {"batching": "verl_ray"})):
        batch = KVBatchMeta(keys=list(keys), tags=[dict(t) for t in tags], partition_id="train")
        metrics: dict = {}
        t = _trainer_stub(verl_cfg, dp, **stub)
        batch = t._balance_batch(batch, metrics)
        realised = _realised_minibatches(batch, dp, mini * GROUP)
        assert [[batch.keys.index(k) for _, k in mb] for mb in realised] == [
            sorted(rows) for rows in ordering.verl_minibatches(len(batch), dp, mini * GROUP)
        ]  # our model of verl
        if name in ("verl", "ray"):  # the local engine's baseline orders make verl's real optimizer steps
            from creditlab.algos.batching import verl_default_minibatches, verl_ray_minibatches
            from creditlab.engines.verl.plugin import group_index

            data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["prompts", "responses"])
            order = ordering.content_order(list(data["prompts"].unbind()), list(data["responses"].unbind()))
            ck = [keys[i] for i in order]
            seq = torch.tensor([tags[i]["seq_len"] for i in order])
            local = (verl_default_minibatches if name == "verl" else verl_ray_minibatches)(
                group_index([ordering.uid_of(k) for k in ck]),
                len(realised),
                torch.Generator(),
                seq_lengths=seq,
                n_ranks=dp,
            )
            assert [sorted(ck[i] for i in mb.tolist()) for mb in local] == [sorted(k for _, k in mb) for mb in realised]
        steps, places = {}, {}  # per group: the optimizer steps / (step, rank) pairs its rollouts land in
        for m, mb in enumerate(realised):
            for rank, k in mb:
                steps.setdefault(ordering.uid_of(k), set()).add(m)
                places.setdefault(ordering.uid_of(k), set()).add((m, rank))
        frac = lambda d: sum(len(v) > 1 for v in d.values()) / len(d)
        results[name] = (frac(steps), frac(places), metrics)
    split_verl, scattered_verl, m_verl = results["verl"]
    split_qb, scattered_qb, m_qb = results["qb"]
    assert split_qb == scattered_qb == 0.0 and m_qb["creditlab/groups_split_frac"] == 0.0
    assert split_verl >= 0.25 and scattered_verl >= 0.5 and m_verl["creditlab/groups_split_frac"] == split_verl
    split_ray, _, m_ray = results["ray"]
    assert split_ray > split_verl and m_ray["creditlab/groups_split_frac"] == split_ray
    for m in (m_verl, m_qb, m_ray):  # both balance the ranks' token load (verl's log_seqlen_unbalance)
        assert m["global_seqlen/balanced_max"] - m["global_seqlen/balanced_min"] < 0.1 * m["global_seqlen/mean"]
    clear_partition(tq)


def test_sign_partitioned_order_gives_single_sign_optimizer_steps_under_verls_cuts(transfer_queue):
    """Paper C's sign-partitioned control on verl (trainer.batching=sign_partitioned): under verl's real dispatch and
    mini-batching every optimizer step holds rollouts of one advantage sign except at most the one where the sides
    meet, counted in ``creditlab/sign_mixed_minibatches``; verl's own order mixes the signs in every step."""
    from transfer_queue import KVBatchMeta

    tq = transfer_queue
    clear_partition(tq)
    dp, prompts, mini = 2, 8, 2  # 8 prompts x 4 rollouts, mini-batches of 2 prompts (4 steps), 2 ranks
    verl_cfg = _verl_cfg(
        [
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
            f"actor_rollout_ref.rollout.n={GROUP}",
            "actor_rollout_ref.actor.shuffle=false",
        ]
    )
    g = torch.Generator().manual_seed(1)
    keys, tags, sign = [], [], {}
    for p in range(prompts):
        rewards = [1, 0, 0, 0] if p % 3 else [1, 1, 0, 0]  # 11 positive rollouts of 32: the sides meet mid-step
        lens = torch.randint(5, 50, (GROUP,), generator=g).tolist()
        _, k = _put_group(tq, rewards, step=1, seq_lens=lens)
        mean = sum(rewards) / GROUP
        sign |= {key: r > mean for key, r in zip(k, rewards)}  # A_i > 0 (grpo: above the group mean)
        keys += k
        tags += [{"seq_len": 10 + n} for n in lens]
    mixed = {}
    for name, stub in (
        ("verl", {}),
        ("sign", {"sign_partitioned": True, "batching": "sign_partitioned", "advantage_name": "grpo"}),
    ):
        batch = KVBatchMeta(keys=list(keys), tags=[dict(t) for t in tags], partition_id="train")
        metrics: dict = {}
        batch = _trainer_stub(verl_cfg, dp, **stub)._balance_batch(batch, metrics)
        realised = _realised_minibatches(batch, dp, mini * GROUP)
        assert sorted(k for mb in realised for _, k in mb) == sorted(keys)
        mixed[name] = sum(len({sign[k] for _, k in mb}) > 1 for mb in realised)
        if name == "sign":
            assert metrics["creditlab/sign_mixed_minibatches"] == mixed[name]
    assert mixed["sign"] == 1 and mixed["verl"] == prompts // mini
    clear_partition(tq)


def test_zero_signal_frac_counts_groups_whose_advantages_all_vanish():
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.0])
    assert ordering.zero_signal_frac(adv, torch.tensor([0, 0, 1, 1, 2, 2])) == pytest.approx(2 / 3)
    assert ordering.zero_signal_frac(adv, torch.tensor([0, 1, 1, 1, 1, 2])) == pytest.approx(2 / 3)


def test_content_order_does_not_depend_on_arrival():
    """Two arrival orders of the same rollouts give the same content order (groups by prompt, rollouts by response)."""
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1, 2]), torch.tensor([3])]
    responses = [torch.tensor([5]), torch.tensor([6]), torch.tensor([7]), torch.tensor([8])]
    first = [
        (tuple(prompts[i].tolist()), tuple(responses[i].tolist())) for i in ordering.content_order(prompts, responses)
    ]
    perm = [3, 0, 2, 1]
    second = [
        (tuple(prompts[perm[i]].tolist()), tuple(responses[perm[i]].tolist()))
        for i in ordering.content_order([prompts[j] for j in perm], [responses[j] for j in perm])
    ]
    assert first == second and sorted(first) == sorted(
        zip(map(lambda t: tuple(t.tolist()), prompts), map(lambda t: tuple(t.tolist()), responses))
    )
    assert {first[0][0], first[1][0]} == {first[0][0]}  # a group's rollouts stay together


def test_sign_order_is_sequential_cuts_of_the_sides():
    """trainer.sign_order: a permutation; with the positives filling whole mini-batches exactly, no step mixes."""
    adv = torch.tensor([1.0, -1, 1, -1, 0, 1, -1, 1])  # 4 positive of 8: 2 mini-batches of 4 are single-sign
    order, per_rank, mixed = ordering.sign_order(adv, 2, 2, torch.Generator().manual_seed(0))
    assert sorted(order) == list(range(8)) and mixed == 0 and [len(r) for r in per_rank] == [4, 4]
    for rows in ordering.verl_minibatches(8, 2, 4):
        assert len({bool(adv[order[i]] > 0) for i in rows}) == 1
    with pytest.raises(ValueError, match="equal mini-batches"):
        ordering.sign_order(adv, 3, 2, torch.Generator())


def _put_interleaved_groups(tq, n_groups, step, generator, partition="train"):
    """n_groups finished groups of GROUP rollouts written to TransferQueue with the groups' rollouts interleaved
    (as verl's agent loop finishes them one by one), with the fields verl's micro-batching reads (input_ids =
    prompt + response) and ``row`` (the position in the returned keys, to identify rows downstream).
    Returns (keys in TransferQueue's order, their tags)."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    uids = [_next_uid() for _ in range(n_groups)]
    order = [(g, s) for s in range(GROUP) for g in range(n_groups)]  # round robin over the groups
    perm = torch.randperm(len(order), generator=generator).tolist()
    order = [order[i] for i in perm[: len(order) // 3]] + [order[i] for i in sorted(perm[len(order) // 3 :])]
    keys, fields, tags = [], [], []
    for g, s in order:
        L = int(torch.randint(5, 60, (1,), generator=generator))
        keys.append(f"{uids[g]}_{s}_0")
        fields.append(
            {
                "rm_scores": torch.tensor([0.0] * (L - 1) + [float(s % 2)]),
                "uid": uids[g],
                "prompts": torch.tensor(list(uids[g].encode())),
                "responses": torch.arange(L) + s,
                "response_mask": torch.ones(L, dtype=torch.int64),
                "input_ids": torch.arange(10 + L),
                "row": torch.tensor(len(keys) - 1),
            }
        )
        tags.append({"status": "success", "seq_len": 10 + L, "global_steps": step})
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
    tq.kv_batch_put(
        keys=uids,
        partition_id=partition,
        tags=[{"is_prompt": True, "status": "finished", "global_steps": step}] * n_groups,
    )
    return keys, tags


def test_sequential_order_survives_verls_mini_and_micro_batching(transfer_queue, tmp_path, monkeypatch):
    """trainer.batching=sequential (Paper E, here with DFPO) on verl: CreditlabTrainer._balance_batch orders the
    interleaved batch, _update_actor hands verl force_group_size = G, and verl's own dispatch (BatchData.chunk),
    worker input (_meta_to_realdata: TransferQueue fields + extra_info as non-tensor data), mini-batch iterator
    (tu.make_iterator with the trainer's dataloader_kwargs) and micro-batching (prepare_micro_batches, dynamic
    batch sizes) give: optimizer step m = the local engine's sequential mini-batch m of the group-contiguous
    batch, rows in order; every group whole on one rank and in one micro-batch; the group ids the loss gets."""
    from transfer_queue import KVBatchMeta
    from verl.protocol import BatchData
    from verl.utils.transferqueue_utils import _meta_to_realdata
    from verl.workers.engine.utils import prepare_micro_batches

    from creditlab.algos.batching import sequential_minibatches

    tq = transfer_queue
    clear_partition(tq)
    dp, prompts, mini = 2, 16, 4  # 16 prompts x 4 rollouts, mini-batches of 4 prompts (4 steps), 2 ranks
    cfg = _run_cfg(
        "dfpo",
        [
            "trainer.batching=sequential",
            f"trainer.prompts_per_step={prompts}",
            f"trainer.mini_batches={prompts // mini}",
            f"trainer.group_size={GROUP}",
        ],
    )
    path = _write_cfg(tmp_path, cfg)
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, path)
    budget = GROUP * 70  # tokens per micro-batch (x sp 1): a group (<= 4 x 70) always fits, two rarely do
    verl_cfg = _verl_cfg(
        [
            *plugin.plugin_overrides(cfg),
            f"+creditlab.config_path={path}",
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
            f"actor_rollout_ref.rollout.n={GROUP}",
            "data.max_prompt_length=10",
            "data.max_response_length=60",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        ]
    )
    assert verl_cfg.actor_rollout_ref.actor.shuffle is False and verl_cfg.trainer.balance_batch is False
    keys, tags = _put_interleaved_groups(tq, prompts, 1, torch.Generator().manual_seed(3))
    first_seen = list(dict.fromkeys(ordering.uid_of(k) for k in keys))
    assert [ordering.uid_of(k) for k in keys] != sorted(keys, key=lambda k: first_seen.index(ordering.uid_of(k)))

    t = _trainer_stub(verl_cfg, dp, run_cfg=cfg, use_reference_policy=False)
    t._setup_creditlab()
    assert t.sequential and t.group_coupled and t.group_size == GROUP
    metrics: dict = {}
    batch = t._balance_batch(KVBatchMeta(keys=list(keys), tags=[dict(x) for x in tags], partition_id="train"), metrics)
    assert metrics["creditlab/groups_split_frac"] == 0.0

    seen = {}

    class _ActorGroup:  # verl's worker group: dispatch to the ranks, each rank's input as verl's tqbridge makes it
        def update_actor(self, meta):
            for rank, chunk in enumerate(BatchData(meta).chunk(dp)):
                data = _meta_to_realdata(chunk)
                mini_per_rank = tu.pop(data, key="mini_batch_size") // dp  # TrainingWorker.train_mini_batch
                loader = tu.pop(data, key="dataloader_kwargs")
                seen.setdefault("force_group_size", set()).add(tu.get_non_tensor_data(data, "force_group_size", None))
                for m, mini_td in enumerate(
                    tu.make_iterator(
                        data,
                        mini_per_rank,
                        epochs=tu.pop(data, key="epochs"),
                        seed=tu.pop(data, key="seed"),
                        dataloader_kwargs=loader,
                    )
                ):
                    tu.assign_non_tensor(mini_td, use_dynamic_bsz=True, max_token_len_per_gpu=budget)  # train_batch
                    micro, _ = prepare_micro_batches(mini_td)
                    seen.setdefault(m, []).append((rank, mini_td, micro))
            return {"metrics": {"mfu": 0.0}}

    t.actor_rollout_wg = _ActorGroup()
    t.has_filters, t.options = False, plugin.verl_options(cfg)
    t._update_actor(batch, {})
    assert seen.pop("force_group_size") == {GROUP} and "force_group_size" not in batch.extra_info

    # the local engine's sequential mini-batches of the group-contiguous batch, in the batch's content order (the
    # trainer orders by content first: trainer.content_order), groups in order of first appearance there
    data = tq.kv_batch_get(keys=list(keys), partition_id="train", select_fields=["prompts", "responses"])
    by_content = [
        keys[i] for i in ordering.content_order(list(data["prompts"].unbind()), list(data["responses"].unbind()))
    ]
    seen_first = list(dict.fromkeys(ordering.uid_of(k) for k in by_content))
    contiguous = sorted(by_content, key=lambda k: seen_first.index(ordering.uid_of(k)))  # stable
    gids = plugin.group_index([ordering.uid_of(k) for k in contiguous])
    want = [[contiguous[i] for i in mb] for mb in sequential_minibatches(gids, prompts // mini, torch.Generator())]
    got, n_micro = [], 0
    for m in sorted(seen):
        rows = []
        for rank, mini_td, micro in sorted(seen[m], key=lambda x: x[0]):
            uids = list(mini_td["uid"])
            assert len(set(uids)) * GROUP == len(uids)  # whole groups on this rank
            rows += [keys[int(i)] for i in mini_td["row"]]
            assert [ordering.uid_of(keys[int(i)]) for i in mini_td["row"]] == uids
            for mb in micro:  # whole groups in every micro-batch, and the group ids the loss will see
                mb_uids = list(mb["uid"])
                assert all(mb_uids.count(u) == GROUP for u in mb_uids)
                ids = plugin.micro_batch_group_ids(mb)
                assert torch.equal(ids, plugin.group_index(mb_uids)) and ids.unique().numel() * GROUP == len(mb_uids)
            n_micro += len(micro)
        got.append(rows)
    assert got == want  # order kept: step m is the local engine's mini-batch m, rank by rank
    assert n_micro > len(want) * dp  # the token budget binds: more micro-batches than rank mini-batches
    # verl's micro-batching without force_group_size splits a group of the same mini-batches (somewhere: which
    # mini-batch depends on the batch's content order, i.e. on the random uids)
    split = False
    for m in seen:
        for _, mini_td, _ in seen[m]:
            if "force_group_size" in mini_td.keys():
                del mini_td["force_group_size"]
            micro, _ = prepare_micro_batches(mini_td)
            split |= any(list(mb["uid"]).count(u) < GROUP for mb in micro for u in mb["uid"])
    assert split
    clear_partition(tq)


def test_trainer_folds_credit_through_verls_compute_advantage(transfer_queue, tmp_path, monkeypatch):
    """CreditlabTrainer._compute_advantage runs verl's V1 _compute_advantage (our creditlab_grpo estimator) and
    writes A_i x dlogp weights back to TransferQueue; the token filter (forking) lands in the loss mask."""
    from transfer_queue import KVBatchMeta

    tq = transfer_queue
    clear_partition(tq)
    cfg = _run_cfg("dlogp", ["method.token_filter=[{name: forking, top_frac: 0.5}]"])
    path = _write_cfg(tmp_path, cfg)
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, path)
    verl_cfg = _verl_cfg(
        [*plugin.plugin_overrides(cfg), f"+creditlab.config_path={path}", f"actor_rollout_ref.rollout.n={GROUP}"]
    )
    g = torch.Generator().manual_seed(1)
    keys, olds = [], []
    for rewards in ([1, 0, 0, 1], [0, 0, 0, 1]):
        _, k = _put_group(tq, rewards, step=1)
        keys += k
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["response_mask"])
    lens = data["response_mask"].offsets().diff().tolist()
    olds = [-torch.rand(n, generator=g) * 2 for n in lens]
    tq.kv_batch_put(
        keys=keys,
        partition_id="train",
        fields=TensorDict(
            {"old_log_probs": _nt(olds), "entropy": _nt(torch.rand(n, generator=g) for n in lens)},
            batch_size=[len(keys)],
        ),
    )
    t = _trainer_stub(verl_cfg, 1, run_cfg=cfg, use_reference_policy=False)
    t._setup_creditlab()
    metrics: dict = {}
    batch = t._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), metrics)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", vtrainer.LOSS_MASK, "entropy"])
    rewards = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1], dtype=torch.float32)
    A = registry.get("advantage", "grpo")(rewards, torch.arange(8) // GROUP)
    for i, (adv_i, old_i) in enumerate(zip(got["advantages"].unbind(), olds)):
        assert torch.allclose(adv_i, A[i] * dlogp_weights(old_i, cfg["method"]["credit"][0]["alpha"]), atol=1e-6)
    mask = _nt(torch.ones(n) for n in lens)
    ent = torch.nested.to_padded_tensor(got["entropy"], 0.0)
    keep = registry.get("token_filter", "forking")(ent, torch.nested.to_padded_tensor(mask, 0.0), top_frac=0.5)
    assert torch.equal(torch.nested.to_padded_tensor(got[vtrainer.LOSS_MASK], 0.0), keep)
    assert 0 < metrics["creditlab/loss_token_frac"] < 1 and metrics["creditlab/eff_token_ratio"] < 1
    assert batch.keys == keys
    clear_partition(tq)


# ------------------------------------------------------------------------------------------------------
# workers: hidden-state capture and credit on data-parallel shards


@pytest.fixture
def cpu_engine(monkeypatch):
    """verl's real FSDPEngineWithLMHead around a tiny Qwen3 on CPU (no FSDP wrapping, no process group)."""
    return verl_cpu.cpu_engine(monkeypatch)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_hidden_capture_through_verls_engine_forward(cpu_engine, remove_padding):
    """Under capture_final_hidden, verl's forward_step returns ``hidden`` laid out like ``log_probs``: the
    response part (verl's response_from_nested) is the model's last hidden state (padded path), and
    log_softmax(h W^T) at the sampled token is verl's own log-prob (both paths)."""
    from verl.workers.engine.utils import postprocess_batch_func
    from verl.workers.utils.padding import response_from_nested

    g = torch.Generator().manual_seed(0)
    P, R = [3, 4, 2], [5, 2, 4]
    prompts = [torch.randint(3, 40, (p,), generator=g) for p in P]
    resps = [torch.randint(3, 40, (r,), generator=g) for r in R]
    ids = [torch.cat([a, b]) for a, b in zip(prompts, resps)]
    mb = TensorDict(
        {
            "input_ids": _nt(ids),
            "position_ids": _nt(torch.arange(len(x)) for x in ids),
            "prompts": _nt(prompts),
            "responses": _nt(resps),
            "response_mask": _nt(torch.ones(r, dtype=torch.int64) for r in R),
            "temperature": torch.ones(3),
        },
        batch_size=[3],
    )
    tu.assign_non_tensor(mb, use_remove_padding=remove_padding, calculate_entropy=True)
    with vworkers.capture_final_hidden(cpu_engine):
        _, out = cpu_engine.forward_step(mb, loss_function=None, forward_only=True)
    assert not hasattr(cpu_engine, "prepare_model_outputs") or "prepare_model_outputs" not in cpu_engine.__dict__
    mo = out["model_output"]
    h = response_from_nested(mo["hidden"], mb["response_mask"])
    lp = response_from_nested(mo["log_probs"], mb["response_mask"])
    W = cpu_engine.module.get_output_embeddings().weight
    for i in range(3):
        rec = torch.log_softmax(h[i] @ W.T, -1).gather(-1, resps[i][:, None]).squeeze(-1)
        assert (rec - lp[i]).abs().max() < 1e-5
        if not remove_padding:  # packed sequences on CPU attend across rows (no varlen kernel): compare padded only
            with torch.no_grad():
                states = cpu_engine.module(ids[i][None], output_hidden_states=True).hidden_states
                ref = states[-1][0, P[i] - 1 : P[i] + R[i] - 1]
            assert (h[i] - ref).abs().max() < 1e-5
    # verl's micro-batch reassembly (dynamic batch sizes: outputs come back reordered) keeps hidden aligned
    half = [{"model_output": {k: _nt(v.unbind()[j] for j in idx) for k, v in mo.items()}} for idx in ([2, 0], [1])]
    data = TensorDict({}, batch_size=[3])
    tu.assign_non_tensor(data, use_dynamic_bsz=True)
    merged = postprocess_batch_func(half, [[2, 0], [1]], data)["model_output"]
    for i in range(3):
        assert torch.equal(merged["hidden"].unbind()[i], mo["hidden"].unbind()[i])


def _thread_all_reduce(n_ranks):
    """A summing all-reduce across ``n_ranks`` threads (a barrier): the shape of torch.distributed's over ranks."""
    barrier, slots = threading.Barrier(n_ranks), {}

    def make(rank):
        def reduce(x):
            slots[rank] = x.detach().clone()
            barrier.wait()
            total = sum(slots[r] for r in range(n_ranks))
            barrier.wait()
            return total

        return reduce

    return make


def test_worker_credit_on_dp_shards_equals_the_global_batch():
    """DelTA's coefficients computed per data-parallel shard with the statistics all-reduced equal the
    one-process coefficients of the whole batch; per-rank statistics (the official code) differ. ARCA's
    per-trajectory weights need no reduction."""
    b = _batch(B=12, T=9, d=16, seed=3)
    base_hidden = b.hidden + 0.3 * torch.randn_like(b.hidden)
    uids = [f"u{i // GROUP}" for i in range(12)]
    whole = delta_weights(b.responses, b.mask, b.old, b.adv, b.hidden)
    arca_whole = arca_weights(b.hidden, base_hidden, b.mask)
    shards = [torch.arange(0, 6), torch.arange(6, 12)]
    results = {}
    for stats in ("global", "rank"):
        spec = {"credit": [{"name": "delta"}, {"name": "arca"}], "seed": 0, "step": 1, "dp_stats": stats}
        make, out = _thread_all_reduce(2), {}

        def run(rank, idx):
            out[rank] = vworkers.worker_credit(
                spec,
                responses=b.responses[idx],
                mask=b.mask[idx],
                old_logp=b.old[idx],
                advantages=b.adv[idx],
                uids=[uids[i] for i in idx],
                entropy=None,
                hidden=b.hidden[idx],
                base_hidden=base_hidden[idx],
                reduce=make(rank),
                rank=rank,
            )

        threads = [threading.Thread(target=run, args=(r, idx)) for r, idx in enumerate(shards)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        results[stats] = torch.cat([out[0]["weights"], out[1]["weights"]])
        residual = torch.cat([out[0]["residual"], out[1]["residual"]])
    want = whole * arca_whole
    assert (results["global"] - want).abs().max() < 1e-5
    assert (results["rank"] - want).abs().max() > 1e-3
    assert torch.allclose(residual, (b.hidden - base_hidden).norm(dim=-1) * b.mask, atol=1e-5)


def test_dp_all_reduce_sums_over_a_real_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        x = torch.tensor([1.0, 2.0])
        y = vworkers.dp_all_reduce(dist.group.WORLD)(x)
        assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    finally:
        dist.destroy_process_group()


def test_flipping_pass_reads_the_post_update_log_probs(transfer_queue):
    """The post-update pass: the worker's new ``log_probs`` (full sequences) minus ``old_log_probs`` on the
    response tokens, split by the sign of A_i (creditlab's flip_fractions)."""
    from transfer_queue import KVBatchMeta

    tq = transfer_queue
    clear_partition(tq)
    keys = _put_group(tq, [1, 0, 1, 0], step=1, seq_lens=[4, 4, 4, 4])[1]
    old = torch.zeros(4, 4)
    delta = torch.tensor([[0.1, 0.1, 0.0, -0.1]] * 2 + [[-0.1, -0.1, -0.1, 0.0]] * 2)
    order = [0, 2, 1, 3]  # rewards 1, 1, 0, 0 after reordering keys
    keys = [keys[i] for i in order]
    full = [torch.cat([torch.zeros(2), old[i] + delta[i], torch.zeros(1)]) for i in range(4)]  # prompt of 3
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])

    class _ActorGroup:  # stands in for verl's worker group: its compute_log_prob writes log_probs to TQ
        def compute_log_prob(self, meta):
            tq.kv_batch_put(
                keys=meta.keys,
                partition_id=meta.partition_id,
                fields=TensorDict({"log_probs": _nt(full)}, batch_size=[4]),
            )
            return meta

    tq.kv_batch_put(
        keys=keys,
        partition_id="train",
        fields=TensorDict(
            {"old_log_probs": _nt(old.unbind()), "advantages": _nt((adv[:, None] * torch.ones(4, 4)).unbind())},
            batch_size=[4],
        ),
    )
    t = _trainer_stub(_verl_cfg([]), 1)
    t.actor_rollout_wg = _ActorGroup()
    m = t._flipping_pass(KVBatchMeta(keys=keys, tags=[{}] * 4, partition_id="train"), eps=0.05)
    assert m["creditlab/flip/positive/boosted"] == 50.0 and m["creditlab/flip/positive/suppressed"] == 25.0
    assert m["creditlab/flip/negative/suppressed"] == 75.0 and m["creditlab/flip/negative/stable"] == 25.0
    clear_partition(tq)


def test_rb_waiting_groups_survive_a_transfer_queue_checkpoint(transfer_queue, tmp_path, monkeypatch):
    """What CreditlabTrainer._save/_load_checkpoint do for RB (verl saves TransferQueue only in async modes):
    the waiting groups come back from tq.save/load_checkpoint, and with the sampler's state they keep their
    age (here: aged out at the next round with max_age 0, as in an uninterrupted run)."""
    tq = transfer_queue
    clear_partition(tq)
    monkeypatch.setenv(plugin.ENV_RUN_CONFIG, _write_cfg(tmp_path, _run_cfg("dapo", [RB_ON])))
    kwargs = {"rho": 0.25, "max_age": 0}
    sampler = samplers.RewardBalancedSampler("sync", {}, 8, "drop", kwargs, poll_interval=0.01)
    waiting = _put_group(tq, [1, 1, 1, 1], step=1)[0]  # no signal: waits
    _put_group(tq, [1, 0, 1, 0], step=1)
    batch, _ = sampler.sample(global_steps=1, partition_id="train", batch_size=1)
    tq.kv_clear(keys=batch.keys, partition_id="train")
    tq.save_checkpoint(str(tmp_path / "tq"))
    state = sampler.state_dict()
    clear_partition(tq)
    assert waiting not in (tq.kv_list("train") or {}).get("train", {})
    tq.load_checkpoint(str(tmp_path / "tq"))
    assert waiting in tq.kv_list("train")["train"]
    resumed = samplers.RewardBalancedSampler("sync", {}, 8, "drop", kwargs, poll_interval=0.01)
    resumed.load_state_dict(state)
    fresh = _put_group(tq, [0, 1, 1, 0], step=2)[0]
    batch, metrics = resumed.sample(global_steps=2, partition_id="train", batch_size=1)
    assert metrics["training/rb/dropped"] == 1.0 and {ordering.uid_of(k) for k in batch.keys} == {fresh}
    assert waiting not in tq.kv_list("train")["train"]
    clear_partition(tq)


def test_credit_pass_end_to_end_with_a_lora_adapter(cpu_engine):
    """The worker's credit pass on verl's engine forward: adapter-on and adapter-off (verl's no_lora_adapter)
    forwards with hidden capture give ARCA's weights, the residual and the reference log-probs exactly as
    computed from the model directly; hidden states do not leave the pass."""
    from contextlib import nullcontext

    from verl.workers.utils.padding import response_from_nested

    from creditlab.engines.local.lora import wrap_lora

    lcfg = {"enable": True, "rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    peft_model = wrap_lora(cpu_engine.module, lcfg, seed=0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # a trained adapter: h^adapted != h^base
    cpu_engine.module = peft_model
    cpu_engine.disable_adapter = peft_model.disable_adapter

    class _TrainingWorker:  # stands in for verl's TrainingWorker.infer_batch (its metrics need a GPU): the
        engine = cpu_engine  # engine forward, with the adapter disabled when no_lora_adapter is set, as verl's

        def infer_batch(self, data):
            ctx = cpu_engine.disable_adapter() if tu.pop(data, key="no_lora_adapter", default=False) else nullcontext()
            with ctx:
                _, out = cpu_engine.forward_step(data, loss_function=None, forward_only=True)
            return TensorDict(dict(out["model_output"]), batch_size=data.batch_size)

    g = torch.Generator().manual_seed(5)
    P, R = [3, 2, 4, 3], [4, 5, 2, 3]
    prompts = [torch.randint(3, 40, (p,), generator=g) for p in P]
    resps = [torch.randint(3, 40, (r,), generator=g) for r in R]
    ids = [torch.cat([a, b]) for a, b in zip(prompts, resps)]
    data = TensorDict(
        {
            "input_ids": _nt(ids),
            "position_ids": _nt(torch.arange(len(x)) for x in ids),
            "prompts": _nt(prompts),
            "responses": _nt(resps),
            "response_mask": _nt(torch.ones(r, dtype=torch.int64) for r in R),
            "temperature": torch.ones(4),
            vworkers.SEQ_ADV: torch.tensor([1.0, -1.0, 0.5, -0.5]),
        },
        batch_size=[4],
    )
    data["uid"] = tu.get_tensordict({"uid": ["a", "a", "b", "b"]})["uid"]
    tu.assign_non_tensor(data, use_remove_padding=False, calculate_entropy=True)
    spec = {
        "credit": [{"name": "arca", "scale": "mean1", "eps": 1e-6}],
        "token_filter": [],
        "seed": 0,
        "step": 1,
        "fused_ref": True,
    }
    out = vworkers.credit_pass(SimpleNamespace(actor=_TrainingWorker()), data, spec)
    assert "hidden" not in out.keys()
    with torch.no_grad():
        on = [peft_model(x[None], output_hidden_states=True) for x in ids]
        with peft_model.disable_adapter():
            off = [peft_model(x[None], output_hidden_states=True) for x in ids]
    T = max(R)
    h_on, h_off, ref = torch.zeros(4, T, 32), torch.zeros(4, T, 32), torch.zeros(4, T)
    for i in range(4):
        sl = slice(P[i] - 1, P[i] + R[i] - 1)
        h_on[i, : R[i]], h_off[i, : R[i]] = on[i].hidden_states[-1][0, sl], off[i].hidden_states[-1][0, sl]
        ref[i, : R[i]] = torch.log_softmax(off[i].logits[0, sl], -1).gather(-1, resps[i][:, None]).squeeze(-1)
    mask = (torch.arange(T)[None] < torch.tensor(R)[:, None]).float()
    pad = lambda nt: torch.nested.to_padded_tensor(nt, 0.0)
    assert (pad(out[vworkers.OUT_WEIGHTS]) - arca_weights(h_on, h_off, mask)).abs().max() < 1e-4
    assert (pad(out[vworkers.OUT_RESIDUAL]) - (h_on - h_off).norm(dim=-1) * mask).abs().max() < 1e-5
    assert pad(out[vworkers.OUT_RESIDUAL]).max() > 0.01
    assert (pad(response_from_nested(out[vworkers.OUT_REF], data["response_mask"])) - ref).abs().max() < 1e-5


def test_metrics_line_gives_tables_the_local_engines_names():
    """A verl step's metrics.jsonl line: step 0-based, verl's names kept, creditlab's names beside them (the mapped
    verl metrics and the plug-in's ``creditlab/<k>`` as ``<k>``, e.g. ARCA's ``weight_gini`` read by the
    concentration table); non-numeric values dropped."""
    line = vtrainer.metrics_line(
        2,
        {
            "critic/rewards/mean": 0.5,
            "creditlab/weight_gini": 0.25,
            "creditlab/flip/all/boosted": 0.1,
            "training/note": "text",
        },
    )
    assert line["step"] == 1 and line["global_step"] == 2
    assert line["reward_mean"] == line["critic/rewards/mean"] == 0.5
    assert line["weight_gini"] == line["creditlab/weight_gini"] == 0.25 and line["flip/all/boosted"] == 0.1
    assert "training/note" not in line
