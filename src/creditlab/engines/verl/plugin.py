"""creditlab's verl plug-in: our methods registered in verl's registries, and the overrides a run needs.

Loaded in every verl process through ``VERL_USE_EXTERNAL_MODULES=creditlab.engines.verl.plugin`` (verl's
``__init__`` imports it; verl 0.9.1). It imports only verl's registries (``verl.trainer.ppo.core_algos``),
never the trainer or worker stack: those are imported by the entry point ``creditlab.engines.verl.main``.

What it registers (nothing about a method is written here; every function below looks the method up in
``creditlab.algos.registry`` and only adapts verl's shapes and arguments):

* ``creditlab_<loss>`` in verl's ``POLICY_LOSS_REGISTRY`` (``core_algos.register_policy_loss``) for every
  creditlab policy loss (``dapo``, ``sapo``, ``gspo``, ``fipo``, ...). verl calls a policy loss as
  ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)``
  with Tensor[B, T] response tensors of one micro-batch and the global normalisers in
  ``config.global_batch_info`` (``dp_size``, ``batch_num_tokens``, ``global_batch_size``); see
  :func:`verl_policy_loss`. verl's loss receives only advantages, so credit weights are folded into them
  (A_{i,t} = A_i w_{i,t}, :func:`fold_credit`) before the update, by the trainer.
* ``creditlab_<advantage>`` in verl's ``ADV_ESTIMATOR_REGISTRY`` (``core_algos.register_adv_est``) for
  every creditlab advantage (``grpo``, ``rloo``, ``dr_grpo``): ``fn(token_level_rewards, response_mask,
  index, config)`` -> (advantages, returns), Tensor[B, T] each (:func:`verl_advantage`).

Method hyperparameters (``method.loss_kwargs``, ``method.advantage_kwargs``, credit settings) are read from
the resolved run config, the YAML the launcher passes as ``+creditlab.config_path=<path>``; the entry point
exports that path to every Ray process as ``CREDITLAB_RUN_CONFIG`` (:func:`run_config`).

:func:`plugin_overrides` is the contract with the launcher: the Hydra overrides of verl's config that
select these registrations (and our trainer, sampler, LoRA) for one run.
"""

from __future__ import annotations

import contextvars
import inspect
import math
import os
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import torch
import yaml
from torch import Tensor

from creditlab.algos import registry
from creditlab.algos.credit.base import (
    REF_INPUTS,
    CreditInputs,
    compose_credit,
    credit_inputs_of,
    method_entries,
    required_inputs_of,
)
from creditlab.algos.losses import AGG_MODES
from creditlab.engines.verl.sizing import token_len_per_gpu, verl_sizes

PLUGIN_MODULE = "creditlab.engines.verl.plugin"
ENV_RUN_CONFIG = "CREDITLAB_RUN_CONFIG"
"""Environment variable holding the path of the resolved run config (YAML) in every verl process."""
TRAINER_MODE = "creditlab_sync"
"""``trainer.v1.trainer_mode`` of our trainer (``creditlab.engines.verl.trainer.CreditlabTrainer``)."""
PREFIX = "creditlab_"
"""Prefix of our names in verl's registries: ``creditlab_dapo`` (loss), ``creditlab_grpo`` (advantage)."""
SAMPLER_PATH = "pkg://creditlab.engines.verl.samplers"
SAMPLER_NAME = "RewardBalancedSampler"
"""RB as verl's custom replay buffer (samplers.py)."""
DAPO_SAMPLER_PATH = "pkg://creditlab.engines.verl.samplers"
DAPO_SAMPLER_NAME = "CappedDapoSampler"
"""verl's replay buffer with DAPO's filter and the max_num_gen_batches cap verl 0.9.1 ignores (samplers.py)."""
GROUP_BATCHINGS = ("sequential", "query_preserved")
"""trainer.batching values that keep every group whole in one mini-batch and on one rank under verl (the orders
of ``trainer.CreditlabTrainer._balance_batch``): what a group-coupled loss needs."""
ORDERED_BATCHINGS = (*GROUP_BATCHINGS, "sign_partitioned", "verl_ray")
"""trainer.batching values whose row order our trainer lays out for verl's contiguous mini-batch cuts: they need
``actor.shuffle=false`` (verl 0.9.1's default), which the plug-in sets."""
WORKER_INPUTS = frozenset({"hidden", "base_hidden", "lm_head", "topk_logp", "topk_ids"})
"""CreditInputs that live on the GPU workers (hidden states are never shipped to the driver): a credit
function or token filter naming one of them runs inside the workers' old-log-prob pass."""
"""CreditInputs from the reference pass (the forward with the LoRA adapter disabled)."""
VERL_PROVIDED = frozenset(
    {
        "responses",
        "mask",
        "old_logp",
        "advantages",
        "group_ids",
        "entropy",
        "rng",
        "hidden",
        "ref_logp",
        "base_hidden",
        "topk_logp",
        "topk_ids",
        "lm_head",
    }
)
"""CreditInputs the verl engine provides (ref_logp / base_hidden only with LoRA: ``trainer.lora.enable``; the top-K
next-token log-probs and the LM-head weight on the workers, for a credit entry that sets ``topk``: DelTA's
``topk_proxy``, workers.topk_logprobs)."""

VERL_DEFAULTS: dict[str, Any] = {
    "device": "cuda",  # cuda (GPU clusters) | cpu (scale smoke: verl's loop on a CPU, engines/verl/cpu.py)
    "sp_check": False,  # with Ulysses sp > 1: also compute hidden-state credit from an sp=1 forward, log the gap
    "credit_dp_stats": "rank",  # DelTA's batch statistics: per data-parallel rank, no all-reduce (the official code)
    #                             | "global" (summed over the ranks: an ablation row [ours]); see DP_STATS
    "flipping": {"enable": False, "eps": 1e-3, "every": 1},  # post-update log-prob pass (Paper C, Alg. 1)
    "filter_metric": "acc",  # DAPO's dynamic sampling drops groups whose `acc` (verifier score) ties | "reward"
    #                          (the shaped reward: scale smoke, whose random stand-ins never score, so acc always ties)
}
"""Options of the plug-in read from an optional ``verl:`` section of the run config [ours]; the launcher
may leave it out. (RB's rounds and exhaustion policy are ``trainer.reward_balance``'s, shared with the local engine.)"""


DP_STATS = ("rank", "global")
"""``verl.credit_dp_stats``: where the batch statistics of a worker-side credit function that takes ``all_reduce``
(DelTA: centroids, gamma, the lambda normaliser) come from. ``rank``: this data-parallel rank's rollouts alone, the
official code [code: RUCBM/DelTA verl-DelTA/verl/workers/actor/dp_actor.py ``compute_log_prob_h``: sums over the
rank's micro-batches, no all-reduce; fsdp_workers.py dispatches it per data-parallel rank]. A Ulysses group is one
data-parallel rank: its sp ranks hold the same rollouts, the hidden states are all-gathered in the group and only its
output rank computes the credit (workers.credit_pass), so the group shares one set of statistics, as the authors'
sp ranks (each computes the same statistics from the gathered h). ``global``: summed over the data-parallel group
(workers.dp_all_reduce; verl's ``get_data_parallel_group``, the Ulysses mesh's ``dp`` dimension): the coefficients of
the whole batch, whatever the number of ranks [ours]."""


# ------------------------------------------------------------------------------------------------------
# run config


@lru_cache(maxsize=4)
def _load_yaml(path: str, mtime: float) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def run_config(path: str | None = None) -> dict | None:
    """The resolved run config (the dict the local engine gets: method, trainer, model, ...), read from
    ``path`` or from ``$CREDITLAB_RUN_CONFIG``; None when neither is set. Cached per (path, mtime)."""
    path = path or os.environ.get(ENV_RUN_CONFIG)
    if not path:
        return None
    return _load_yaml(path, os.path.getmtime(path))


def verl_options(run_cfg: dict | None) -> dict[str, Any]:
    """:data:`VERL_DEFAULTS` updated by the run config's ``verl:`` section (one level deep)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in VERL_DEFAULTS.items()}
    for k, v in ((run_cfg or {}).get("verl") or {}).items():
        if k not in out:
            raise KeyError(f"unknown verl option {k!r}; valid choices: {sorted(out)}")
        out[k] = {**out[k], **v} if isinstance(out[k], dict) else v
    if out["credit_dp_stats"] not in DP_STATS:
        raise ValueError(f"verl.credit_dp_stats={out['credit_dp_stats']!r}; valid choices: {list(DP_STATS)}")
    return out


def method_kwargs(kind: str, name: str, run_cfg: dict | None) -> dict[str, Any]:
    """The run config's kwargs for a registered function: ``method.loss_kwargs`` when ``method.policy_loss``
    is ``name`` (kind ``policy_loss``), ``method.advantage_kwargs`` when ``method.advantage`` is ``name``
    (kind ``advantage``); {} otherwise (the function's own defaults)."""
    m = (run_cfg or {}).get("method") or {}
    key, kw = {"policy_loss": ("policy_loss", "loss_kwargs"), "advantage": ("advantage", "advantage_kwargs")}[kind]
    return dict(m.get(kw) or {}) if m.get(key) == name else {}


def runs_on_worker(fn: Callable) -> bool:
    """Whether a credit function / token filter needs inputs that exist only on the GPU workers."""
    return bool(set(credit_inputs_of(fn)) & WORKER_INPUTS)


# ------------------------------------------------------------------------------------------------------
# group ids of the micro-batch (group-coupled losses)


_GROUP_IDS: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar("creditlab_group_ids", default=None)
_RESPONSES: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar("creditlab_responses", default=None)


def needs_group_ids(name: str) -> bool:
    """Whether creditlab's policy loss ``name`` couples the rollouts of a group (its signature names group_ids)."""
    return "group_ids" in inspect.signature(registry.get("policy_loss", name)).parameters


def loss_name(loss_mode: str) -> str | None:
    """creditlab's loss name of a verl ``policy_loss.loss_mode`` (``creditlab_dfpo`` -> ``dfpo``); None for verl's."""
    if not loss_mode.startswith(PREFIX):
        return None
    name = loss_mode[len(PREFIX) :]
    return name if name in registry.names("policy_loss") else None


@contextmanager
def group_ids_of_micro_batch(group_ids: Tensor, responses: Tensor | None = None):
    """While active, :func:`current_group_ids` returns ``group_ids`` (Tensor[B] of the micro-batch's rows) and
    :func:`current_responses` ``responses`` (Tensor[B, T'] token ids, right-padded, or None)."""
    token, token_r = _GROUP_IDS.set(group_ids), _RESPONSES.set(responses)
    try:
        yield
    finally:
        _RESPONSES.reset(token_r)
        _GROUP_IDS.reset(token)


def current_responses(width: int) -> Tensor | None:
    """The token ids of the micro-batch whose loss verl is computing (set by :func:`with_group_ids`), right-padded
    with 0 or cut to ``width`` columns (the loss's Tensor[B, T]; beyond a row's length the mask is 0), else None."""
    r = _RESPONSES.get()
    if r is None:
        return None
    r = r[:, :width]
    return torch.nn.functional.pad(r, (0, width - r.shape[1])) if r.shape[1] < width else r


def micro_batch_responses(data: Any) -> Tensor | None:
    """Tensor[B, T'] long token ids of a verl micro-batch's ``responses`` (nested: right-padded with 0), or None
    when the micro-batch has no such field (verl's actor micro-batches have it: ``no_padding_2_padding`` reads it)."""
    if "responses" not in data.keys():  # noqa: SIM118 - a TensorDict has no `in`
        return None
    r = data["responses"]
    if getattr(r, "is_nested", False):
        r = torch.nn.utils.rnn.pad_sequence(list(r.unbind()), batch_first=True)
    return r.long()


def current_group_ids() -> Tensor | None:
    """The group ids of the micro-batch whose loss verl is computing (set by :func:`with_group_ids`), else None."""
    return _GROUP_IDS.get()


def micro_batch_group_ids(data: Any) -> Tensor:
    """Tensor[B] long group ids of a verl micro-batch (TensorDict) from its ``uid`` field (verl's prompt uid per
    rollout; a non-tensor stack that ``tu.index_select_tensor_dict`` / ``chunk_tensordict`` slice row by row)."""
    if "uid" not in data.keys():  # noqa: SIM118 - a TensorDict has no `in`
        raise ValueError(
            "the micro-batch has no `uid` field (verl's prompt uid of every rollout): a group-coupled "
            "policy loss cannot tell the groups apart"
        )
    return group_index(list(data["uid"]))


def with_group_ids(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """verl's worker loss ``loss_fn`` (``functools.partial(verl.workers.utils.losses.ppo_loss, config=...)``,
    called by the engine's ``forward_step`` as ``loss_fn(model_output=..., data=micro_batch, dp_group=...)``)
    with the micro-batch's group ids (:func:`micro_batch_group_ids`) and token ids (:func:`micro_batch_responses`)
    visible to the registered policy loss for the duration of the call (:func:`current_group_ids`,
    :func:`current_responses`). Everything else is verl's ``ppo_loss``."""

    def loss(*args: Any, **kwargs: Any):
        data = kwargs["data"] if "data" in kwargs else args[1]
        with group_ids_of_micro_batch(micro_batch_group_ids(data), micro_batch_responses(data)):
            return loss_fn(*args, **kwargs)

    loss.creditlab_group_ids = True  # type: ignore[attr-defined]
    loss.__wrapped__ = loss_fn  # type: ignore[attr-defined]
    return loss


# ------------------------------------------------------------------------------------------------------
# policy losses


def _global_scale(mask: Tensor, agg: str, info: dict) -> tuple[float | None, float]:
    """(denom, scale) turning creditlab's per-micro-batch ``aggregate`` into verl's global one.

    verl (``core_algos.agg_loss``) normalises a micro-batch's loss by the whole mini-batch over all
    data-parallel ranks and multiplies by dp_size (FSDP averages gradients over ranks):
      token-mean:          sum m l / batch_num_tokens * dp      -> ours with denom = batch_num_tokens / dp
      seq-mean-token-*:    sum_i l_i / global_batch_size * dp   -> ours (mean over the B local rows) * scale,
                           scale = B dp / global_batch_size; without global info verl divides by the
                           non-empty rows: scale = B / n_nonempty.
    mask: Tensor[B, T]. Both are exact rescalings (the loss is linear in the per-token terms).
    """
    dp = int(info.get("dp_size") or 1)
    if agg == "token-mean":
        n = info.get("batch_num_tokens")
        return (None if n is None else float(n) / dp), 1.0
    B = mask.shape[0]
    gbs = info.get("global_batch_size")
    if gbs is not None:
        return None, B * dp / float(gbs)
    if dp > 1:
        raise ValueError("global_batch_size is required when dp_size > 1 (verl's agg_loss)")
    return None, B / max(1, int((mask.sum(-1) > 0).sum()))


def verl_policy_loss(name: str, loss_kwargs: dict | None = None) -> Callable[..., tuple[Tensor, dict]]:
    """verl-signature wrapper of creditlab's registered policy loss ``name``.

    The returned ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
    config=None, rollout_is_weights=None) -> (loss, metrics)`` takes Tensor[B, T] each (``advantages``:
    A_i times any credit weights, already folded in) and calls ``registry.get("policy_loss", name)`` with
    ``loss_kwargs`` (None: the run config's ``method.loss_kwargs``, :func:`method_kwargs`), the aggregation
    ``loss_agg_mode`` and verl's global normalisers from ``config.global_batch_info`` (:func:`_global_scale`).
    A group-coupled loss (``needs_group_ids``: grpo_fix, dfpo) also gets ``group_ids`` = :func:`current_group_ids`
    (the micro-batch's groups; ValueError outside :func:`with_group_ids`); its groups must be whole in the
    micro-batch (the trainer's order and verl's ``force_group_size``), so that the per-micro-batch loss, rescaled
    by verl's global normalisers, is the mini-batch's loss restricted to those groups. A loss whose signature
    names ``responses`` (grpo_fix: its shared tokens are token ids) gets the micro-batch's token ids,
    :func:`current_responses` (ValueError outside :func:`with_group_ids`).
    Metrics are verl's style: ``actor/<stat>`` (and ``actor/pg_clipfrac`` for our ``clipfrac``).
    """
    fn = registry.get("policy_loss", name)
    grouped = needs_group_ids(name)
    takes_tokens = "responses" in inspect.signature(fn).parameters

    def loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ):
        kwargs = dict(method_kwargs("policy_loss", name, run_config()) if loss_kwargs is None else loss_kwargs)
        agg = kwargs.pop("agg", loss_agg_mode)
        if agg != loss_agg_mode:
            raise ValueError(
                f"method.loss_kwargs.agg={agg!r} but verl's actor.loss_agg_mode={loss_agg_mode!r}; "
                "plugin_overrides() sets the verl key from the run config"
            )
        if agg not in AGG_MODES:
            raise ValueError(f"loss aggregation {agg!r} has no creditlab form; valid choices: {list(AGG_MODES)}")
        if rollout_is_weights is not None:
            raise NotImplementedError(
                "creditlab losses take no rollout importance weights (algorithm.rollout_correction must stay off)"
            )
        mask = response_mask.to(log_prob.dtype)
        info = dict(getattr(config, "global_batch_info", None) or {})
        denom, scale = _global_scale(mask, agg, info)
        if grouped:
            gids = current_group_ids()
            if gids is None:
                raise ValueError(
                    f"policy loss {name!r} couples the rollouts of a group and needs the group ids of the "
                    "micro-batch: verl's ppo_loss must run inside plugin.with_group_ids (creditlab's "
                    "worker, workers.CreditlabActorRolloutRefWorker, installs it)"
                )
            if gids.shape != log_prob.shape[:1]:
                raise ValueError(f"{gids.numel()} group ids for a micro-batch of {log_prob.shape[0]} rows")
            kwargs["group_ids"] = gids.to(log_prob.device)
        if takes_tokens:
            resp = current_responses(log_prob.shape[1])
            if resp is None:
                raise ValueError(
                    f"policy loss {name!r} needs the token ids of the micro-batch (verl's `responses`): "
                    "verl's ppo_loss must run inside plugin.with_group_ids on a micro-batch with them"
                )
            if resp.shape[0] != log_prob.shape[0]:
                raise ValueError(f"{resp.shape[0]} responses for a micro-batch of {log_prob.shape[0]} rows")
            kwargs["responses"] = resp.to(log_prob.device)
        value, stats = fn(log_prob, old_log_prob, advantages, mask, agg=agg, denom=denom, **kwargs)
        metrics = {f"actor/{k}": v for k, v in stats.items()}
        if "clipfrac" in stats:
            metrics["actor/pg_clipfrac"] = stats["clipfrac"]
        return value * scale, metrics

    loss.__name__ = loss.__qualname__ = f"{PREFIX}{name}"
    loss.__doc__ = f"verl policy loss wrapping creditlab's {name!r} (see verl_policy_loss)."
    return loss


# ------------------------------------------------------------------------------------------------------
# advantages


def group_index(index: Any) -> Tensor:
    """verl's per-rollout prompt ``uid`` (np.ndarray of str, or a list) -> Tensor[B] long group ids."""
    _, inv = np.unique(np.asarray(list(index), dtype=object).astype(str), return_inverse=True)
    return torch.as_tensor(inv.reshape(-1), dtype=torch.long)


def sequence_advantages(name: str, rewards: Tensor, group_ids: Tensor, kwargs: dict | None = None) -> Tensor:
    """creditlab's registered advantage ``name`` with the run config's kwargs: Tensor[B] -> Tensor[B]."""
    kw = method_kwargs("advantage", name, run_config()) if kwargs is None else kwargs
    return registry.get("advantage", name)(rewards, group_ids, **kw)


def verl_advantage(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """verl-signature advantage estimator for creditlab's ``name``:
    ``fn(token_level_rewards, response_mask, index=None, config=None, **_) -> (advantages, returns)``,
    Tensor[B, T] each: the sequence advantage A_i (rewards = token_level_rewards summed over the response,
    groups = ``index``, verl's prompt uids) broadcast over the valid tokens. Credit weights are folded in
    later, by the trainer (:func:`fold_credit`): a verl estimator sees no log-probs."""

    def estimator(token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, config: Any = None, **_):
        if index is None:
            raise ValueError(f"advantage {name!r} needs the prompt uids (verl's `index`)")
        groups = group_index(index).to(token_level_rewards.device)  # a CPU index of a GPU batch fails in index_add_
        adv = sequence_advantages(name, token_level_rewards.sum(-1), groups)
        adv = adv.to(token_level_rewards.dtype)[:, None] * response_mask
        return adv, adv

    estimator.__name__ = estimator.__qualname__ = f"{PREFIX}{name}"
    return estimator


# ------------------------------------------------------------------------------------------------------
# credit folding (driver side)


def fold_credit(
    inputs: CreditInputs,
    credit: list[tuple[Callable, dict]],
    token_filters: list[tuple[Callable, dict]],
    worker_weights: Tensor | None = None,
    worker_filter: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token advantages and loss mask for verl's loss, from the run's credit functions and token filters.

    weights  w = prod(credit functions run here) * worker_weights (those that ran in the workers)
    adv_tok  = A_i w_{i,t} m_{i,t}           (what verl's loss receives as ``advantages``)
    loss_mask = m * prod(token filters run here) * worker_filter (restricts the loss and its token-mean)
    inputs: CreditInputs of B rollouts x T response positions (advantages: Tensor[B] sequence advantages);
    worker_*: Tensor[B, T] or None. Returns (adv_tok, loss_mask, w), Tensor[B, T] float32 each.
    """
    w = compose_credit(credit, inputs)
    if worker_weights is not None:
        w = w * worker_weights.float()
    mask = inputs.mask.float()
    loss_mask = mask * compose_credit(token_filters, inputs)
    if worker_filter is not None:
        loss_mask = loss_mask * worker_filter.float()
    adv_tok = inputs.advantages.float()[:, None] * w * mask
    return adv_tok, loss_mask, w


# ------------------------------------------------------------------------------------------------------
# the launcher contract


def _resolved_loss_kwargs(name: str, kwargs: dict) -> dict[str, Any]:
    """The loss's keyword defaults updated by ``kwargs`` (what the loss will actually use)."""
    params = inspect.signature(registry.get("policy_loss", name)).parameters
    out = {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    out.update(kwargs)
    return out


def _check_inputs(run_cfg: dict) -> None:
    """Fail at plan time when a credit function / token filter needs an input the verl engine lacks."""
    m, lora = run_cfg["method"], (run_cfg["trainer"].get("lora") or {}).get("enable", False)
    provided = VERL_PROVIDED if lora else VERL_PROVIDED - REF_INPUTS
    for kind, key in (("credit", "credit"), ("token_filter", "token_filter")):
        for fn, _ in method_entries(kind, m.get(key)):
            missing = sorted(set(required_inputs_of(fn)) - provided)
            if missing:
                hint = " (set trainer.lora.enable=true)" if set(missing) <= REF_INPUTS else ""
                raise ValueError(f"{kind} {fn.__name__} needs {missing}, which the verl engine does not provide{hint}")


def _batching_overrides(run_cfg: dict, loss: str) -> list[str]:
    """The batching part of :func:`plugin_overrides` (see there); raises ValueError for what verl cannot keep."""
    t = run_cfg["trainer"]
    actor = "actor_rollout_ref.actor"
    batching = t.get("batching", "verl_default")
    ordered = (*GROUP_BATCHINGS, "sign_partitioned")  # orders cut into equal mini-batches of whole prompts
    if batching not in ("verl_default", *ORDERED_BATCHINGS):
        raise ValueError(
            f"trainer.batching={batching!r} is not supported on the verl engine (random and "
            "token_balanced are local-engine orders; verl_default is verl 0.9.1's V1 balancing, verl_ray the "
            f"legacy RayPPOTrainer's the papers ran); valid choices: {['verl_default', *ORDERED_BATCHINGS]}"
        )
    grouped = needs_group_ids(loss)
    if grouped and batching not in GROUP_BATCHINGS:
        raise ValueError(
            f"policy loss {loss!r} couples the rollouts of a group: every group must be whole in one "
            "mini-batch, on one rank and in one micro-batch, which "
            f"trainer.batching={batching!r} does not give on verl (verl balances rollouts one by one, "
            "scattering groups); valid choices: "
            f"{list(GROUP_BATCHINGS)}"
        )
    out = []
    if batching in ORDERED_BATCHINGS:
        out.append(f"{actor}.shuffle=false")  # verl's mini-batch iterator keeps each rank's order
    if batching == "sequential":
        out.append("trainer.balance_batch=false")  # the legacy trainer's switch; V1 always calls _balance_batch,
        #                                           which our trainer overrides with the sequential order
    if batching not in ordered:
        return out
    prompts, mini, g = int(t["prompts_per_step"]), int(t["mini_batches"]), int(t["group_size"])
    if mini < 1 or prompts % mini:
        raise ValueError(
            f"trainer.batching={batching!r} needs equal mini-batches of whole prompts, but "
            f"trainer.prompts_per_step={prompts} is not a multiple of trainer.mini_batches={mini}"
        )
    sizes = verl_sizes(run_cfg)
    if not grouped or sizes is None:
        return out
    dp, sp = sizes
    if (prompts // mini) % dp:
        raise ValueError(
            f"policy loss {loss!r} couples the rollouts of a group: a mini-batch of {prompts // mini} "
            f"prompts does not split into whole groups over {dp} data-parallel ranks (a group would "
            "straddle two ranks); the prompts per mini-batch must be a multiple of the data-parallel size"
        )
    # micro-batches: the trainer sets verl's force_group_size = G, so dynamic batch sizes never split a group; a
    # micro-batch then must hold G whole sequences (rearrange_micro_batches raises at run time otherwise); the
    # launcher's budget (sizing.token_len_per_gpu) is the one it passes to verl
    need = math.ceil(g * (int(t["max_prompt_tokens"]) + int(t["max_new_tokens"])) / sp)
    if need > token_len_per_gpu(run_cfg):
        out.append(f"{actor}.ppo_max_token_len_per_gpu={need}")
    return out


def plugin_overrides(run_cfg: dict) -> list[str]:
    """verl Hydra overrides selecting creditlab's registrations for one run (appended by the launcher).

    run_cfg: the resolved run config (``python -m creditlab show-config ...``). Returns override strings:
      always   ``trainer.use_v1=true``, ``trainer.v1.trainer_mode=creditlab_sync`` (our trainer),
               ``algorithm.adv_estimator=creditlab_<method.advantage>``,
               ``actor_rollout_ref.actor.policy_loss.loss_mode=creditlab_<method.policy_loss>``,
               ``actor_rollout_ref.actor.loss_agg_mode=<agg>``, no KL (loss and reward), no entropy bonus,
               and verl's own copies of the loss hyperparameters it has fields for (clip_ratio_low/high/c,
               tau_pos/neg: the loss itself reads method.loss_kwargs);
      QB       ``actor_rollout_ref.actor.shuffle=false`` (the trainer then keeps groups whole);
      sequential ``actor_rollout_ref.actor.shuffle=false`` and ``trainer.balance_batch=false``: the trainer keeps
               the batch's groups contiguous in their order and lays them out so that verl's dispatch (equal
               contiguous chunks per rank) and mini-batch iterator (contiguous slices, no shuffle) realise the local
               engine's sequential mini-batches (``trainer.sequential_order``);
      sign-partitioned ``actor_rollout_ref.actor.shuffle=false``: the trainer orders the rollouts by advantage sign
               so that verl's equal mini-batches each hold one sign but for the one where the sides meet
               (``trainer.sign_order``; the local engine's sign mini-batches have unequal sizes instead);
      group-coupled losses (grpo_fix, dfpo) need QB or sequential, whole groups per rank (prompts per mini-batch a
               multiple of the data-parallel size) and, since the trainer sets verl's ``force_group_size = G``,
               a micro-batch budget of G whole sequences: ``actor.ppo_max_token_len_per_gpu`` is raised to
               ceil(G (max_prompt_tokens + max_new_tokens) / ulysses_sp) where the launcher's is smaller;
      RB       ``trainer.v1.sampler.custom_sampler.{path,name}`` (our sampler) and its ``sampler_kwargs``;
      dynamic sampling ``trainer.v1.sampler.custom_sampler`` = ``samplers.CappedDapoSampler`` with ``sampler_kwargs``
               filter_metric / train_batch_size / max_num_gen_batches (trainer.max_gen_batches): verl's own replay
               buffer ignores the cap; this one enforces it and raises when a step exhausts it;
      LoRA     ``actor_rollout_ref.model.lora_rank/lora_alpha/target_modules`` (ARCA's reference pass);
      hidden-state credit (DelTA, ARCA) ``actor_rollout_ref.model.use_fused_kernels=false``.
    Raises ValueError for what the verl engine cannot run as configured (unsupported batchings, group-coupled losses
    without whole groups, credit inputs it does not provide, RB with dynamic sampling).
    """
    m, t = run_cfg["method"], run_cfg["trainer"]
    loss, adv = m["policy_loss"], m["advantage"]
    registry.get("policy_loss", loss)
    registry.get("advantage", adv)
    kw = _resolved_loss_kwargs(loss, dict(m.get("loss_kwargs") or {}))
    if kw.get("agg") not in AGG_MODES:
        raise ValueError(f"loss aggregation {kw.get('agg')!r}; valid choices: {list(AGG_MODES)}")
    _check_inputs(run_cfg)
    actor = "actor_rollout_ref.actor"
    out = [
        "trainer.use_v1=true",
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
        f"algorithm.adv_estimator={PREFIX}{adv}",
        f"{actor}.policy_loss.loss_mode={PREFIX}{loss}",
        f"{actor}.loss_agg_mode={kw['agg']}",
        f"{actor}.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        f"{actor}.entropy_coeff=0",
    ]
    mirror = {
        "eps_low": "clip_ratio_low",
        "eps_high": "clip_ratio_high",
        "dual_clip_c": "clip_ratio_c",
        "tau_pos": "tau_pos",
        "tau_neg": "tau_neg",
    }
    out += [f"{actor}.{v}={kw[k]}" for k, v in mirror.items() if kw.get(k) is not None]
    out += _batching_overrides(run_cfg, loss)

    rb = t.get("reward_balance") or {}
    if rb.get("enable"):
        if t.get("dynamic_sampling"):
            raise ValueError(
                "reward-balanced batching replaces verl's replay buffer, whose DAPO group filter "
                "(dynamic sampling) it does not implement: turn one of them off"
            )
        sk = "+trainer.v1.sampler.sampler_kwargs"
        out += [
            f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
            f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
            f"{sk}.rho={rb['rho']}",
            f"{sk}.max_age={rb['max_age']}",
            f"{sk}.sign={rb['sign']}",
            f"{sk}.reward_threshold={rb.get('reward_threshold', 0.5)}",
            f"{sk}.max_rounds={rb.get('max_rounds', 4)}",
            f"{sk}.on_exhausted={rb.get('on_exhausted', 'train_unbalanced')}",
        ]
    if t.get("dynamic_sampling"):  # verl's replay buffer ignores max_num_gen_batches: ours enforces it
        sk = "+trainer.v1.sampler.sampler_kwargs"
        out += [
            f"trainer.v1.sampler.custom_sampler.path={DAPO_SAMPLER_PATH}",
            f"trainer.v1.sampler.custom_sampler.name={DAPO_SAMPLER_NAME}",
            f"{sk}.filter_metric={verl_options(run_cfg)['filter_metric']}",
            f"{sk}.train_batch_size={int(t['prompts_per_step'])}",
            f"{sk}.max_num_gen_batches={int(t['max_gen_batches'])}",
        ]

    if any(runs_on_worker(fn) for kind in ("credit", "token_filter") for fn, _ in method_entries(kind, m.get(kind))):
        out.append("actor_rollout_ref.model.use_fused_kernels=false")  # hidden states come from the LM-head call

    lora = t.get("lora") or {}
    if lora.get("enable"):
        mods = ",".join(lora["target_modules"])
        out += [
            f"actor_rollout_ref.model.lora_rank={lora['rank']}",
            f"actor_rollout_ref.model.lora_alpha={lora['alpha']}",
            f"actor_rollout_ref.model.target_modules=[{mods}]",
        ]
    return out


# ------------------------------------------------------------------------------------------------------
# registration (runs on import, in every verl process)


def register_all() -> dict[str, list[str]]:
    """Register every creditlab policy loss and advantage in verl's registries (idempotent).

    Returns the names registered: {"policy_loss": [...], "advantage": [...]}.
    """
    from verl.trainer.ppo import core_algos

    losses = []
    for name in registry.names("policy_loss"):
        core_algos.register_policy_loss(f"{PREFIX}{name}")(verl_policy_loss(name))
        losses.append(f"{PREFIX}{name}")
    advs = []
    for name in registry.names("advantage"):
        key = f"{PREFIX}{name}"
        old = core_algos.ADV_ESTIMATOR_REGISTRY.get(key)
        if old is None or getattr(old, "__module__", None) != __name__:
            core_algos.register_adv_est(key)(verl_advantage(name))
        advs.append(key)
    return {"policy_loss": losses, "advantage": advs}


if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":  # a smoke run: verl on a CPU (engines/verl/cpu.py)
    from creditlab.engines.verl import cpu as _cpu

    _cpu.install()

REGISTERED = register_all()
