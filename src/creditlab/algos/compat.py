"""Which compositions of methods are well defined: checked on a run's resolved config before any job starts.

Methods compose through the registries: a run has ONE advantage, ONE policy loss and ONE batching, and any number
of credit functions (their weights multiply the advantage: A~_{i,t} = A_i prod_f w^f_{i,t}) and token filters
(their 0/1 masks multiply the loss mask). Most compositions are therefore well defined by construction (DelTA x
Δlog p, DelTA + QB + RB, GSPO with credit weights = GSPO-token with A_{i,t}). A few are not, because one method's
equation assumes something another one breaks; each rule below says which assumption, and `check_method` raises
`IllDefinedComposition` with that reason (the plan turns it into a PlanError naming the run).

Rules (SPEC.md notation; the trainer config's batching, mini-batches and reward balance, the method's loss, credit
functions and token filters):

1. ``reference_pass``: a credit function or filter that reads the reference pass (``ref_logp``, ``base_hidden``:
   ARCA's a_t = ||h_t^adapted - h_t^base||, the policy divergence |log pi - log pi_ref|) needs a LoRA adapter:
   the reference is the same model with the adapter disabled. Without ``trainer.lora.enable`` it is undefined.
2. ``whole_groups``: a group-coupled loss (one whose signature takes ``group_ids``: GRPO-fix's symmetric clip mask,
   DFPO's within-group transform with sum_{i in g} A_i w~_i = 0) is defined over every rollout of a group in one
   mini-batch; a batching that can split a group (``algos.batching.keeps_groups_whole`` false) leaves it undefined.
3. ``rollout_weight_transform``: DFPO makes sum_{i in g} A_i w~_i = 0 for ONE weight per rollout (its transform
   sees A_i = the rollout's mean advantage); a credit weight lambda_{i,t} or a token filter m_{i,t} multiplies the
   coefficient of token t by a factor that differs between the rollouts of the group after the transform, so
   sum_i A_i lambda_{i,t} w~_i != 0 and the cancellation DFPO exists to guarantee is void. Refused unless its
   transform is ``none`` (plain GSPO gradient).
4. ``sequence_ratio_filter``: a sequence-ratio loss (GSPO; DFPO with ``weight: seq_ratio``) uses
   s_i = exp(mean_{t valid} log r_{i,t}), the length-normalised likelihood ratio of the whole response; a token
   filter changes the tokens that mean runs over, so s_i would become the ratio of a token subset chosen per step,
   not the response's. (Credit weights are fine: they scale A_{i,t}, not s_i.)
5. ``balanced_updates``: reward-balanced batching (RB) exists so that every update sees >= rho positive and >= rho
   negative rollouts; sign-partitioned mini-batches put the two signs in different updates. Together they
   contradict each other.
6. ``rb_replaces_filter``: reward-balanced batching chooses which generated groups an update trains on, and so does
   DAPO's dynamic sampling (keep groups whose rewards differ, generate more until the batch is full); on verl the RB
   sampler replaces the replay buffer that implements the filter. One selection per run: both engines refuse both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from creditlab.algos import registry
from creditlab.algos.batching import keeps_groups_whole
from creditlab.algos.credit.base import REF_INPUTS, credit_inputs_of, method_entries

SEQUENCE_RATIO_LOSSES = {"gspo": None, "dfpo": ("weight", "seq_ratio")}
"""Policy losses whose importance ratio is GSPO's sequence ratio s_i: name -> None (always) or (loss kwarg, value)
(only with that setting; its default when the kwarg is absent is read from the loss's signature)."""

ROLLOUT_WEIGHT_TRANSFORMS = {"dfpo": ("transform", "none")}
"""Policy losses that transform one weight per rollout within a group: name -> (loss kwarg, the value that turns
the transform off)."""


class IllDefinedComposition(ValueError):
    """A run's methods do not compose (the message names the rule and why)."""


def _loss_setting(loss: str, kwargs: Mapping[str, Any], key: str) -> Any:
    import inspect

    if key in kwargs:
        return kwargs[key]
    p = inspect.signature(registry.get("policy_loss", loss)).parameters.get(key)
    return None if p is None else p.default


def _names(entries: list | None) -> list[str]:
    return [e["name"] for e in entries or [] if e["name"] != "none"]


def check_method(method: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """Raise IllDefinedComposition if the run's method (config ``method``) and trainer settings (``trainer``) do not
    compose (module doc: the rules and their reasons). ``method``: advantage, policy_loss, loss_kwargs, credit,
    token_filter; ``trainer``: batching, mini_batches, prompts_per_step, reward_balance.enable, lora.enable."""
    loss, lkw = method["policy_loss"], dict(method.get("loss_kwargs") or {})
    credit, filters = _names(method.get("credit")), _names(method.get("token_filter"))
    name = method.get("name", loss)
    fns = method_entries("credit", method.get("credit")) + method_entries("token_filter", method.get("token_filter"))
    needs_ref = sorted({n for fn, _ in fns for n in credit_inputs_of(fn) if n in REF_INPUTS})
    lora = bool((trainer.get("lora") or {}).get("enable"))
    if needs_ref and not lora:
        raise IllDefinedComposition(
            f"method {name!r} needs {needs_ref} from the reference pass (the forward with the LoRA adapter disabled; "
            f"e.g. ARCA's ||h^adapted - h^base||): without an adapter there is no reference, set "
            f"trainer.lora.enable=true [rule reference_pass]"
        )
    import inspect

    batching, M, P = trainer["batching"], int(trainer["mini_batches"]), int(trainer["prompts_per_step"])
    if "group_ids" in inspect.signature(registry.get("policy_loss", loss)).parameters and not keeps_groups_whole(
        batching, P, M
    ):
        raise IllDefinedComposition(
            f"policy loss {loss!r} couples the rollouts of a group (it is defined on whole groups), but batching "
            f"{batching!r} with {M} mini-batches of {P} prompts can split a group across mini-batches; use "
            f"trainer.batching=query_preserved (or sequential with prompts_per_step a multiple of mini_batches) "
            f"[rule whole_groups]"
        )
    if loss in ROLLOUT_WEIGHT_TRANSFORMS:
        key, off = ROLLOUT_WEIGHT_TRANSFORMS[loss]
        if _loss_setting(loss, lkw, key) != off and (credit or filters):
            raise IllDefinedComposition(
                f"policy loss {loss!r} transforms one weight per rollout so that sum_i A_i w_i = 0 within a group; "
                f"the per-token factors of {credit + filters} multiply token t's coefficient differently in each "
                f"rollout after the transform, so the sum is no longer 0 and the loss's cancellation guarantee is "
                f"void (allowed only with loss_kwargs.{key}={off}) [rule rollout_weight_transform]"
            )
    if loss in SEQUENCE_RATIO_LOSSES and filters:
        cond = SEQUENCE_RATIO_LOSSES[loss]
        if cond is None or _loss_setting(loss, lkw, cond[0]) == cond[1]:
            raise IllDefinedComposition(
                f"policy loss {loss!r} uses the sequence ratio s_i = exp(mean_t log r_i,t) of the whole response; "
                f"token filter(s) {filters} would make it the ratio of a token subset chosen per step; credit "
                f"weights compose with it, token filters do not [rule sequence_ratio_filter]"
            )
    rb_on = bool((trainer.get("reward_balance") or {}).get("enable"))
    if rb_on and trainer.get("dynamic_sampling"):
        raise IllDefinedComposition(
            "reward-balanced batching (RB) and dynamic sampling both choose which generated groups an update trains "
            "on (and generate more until they can); on verl the RB sampler replaces the replay buffer that implements "
            "DAPO's group filter: set trainer.dynamic_sampling=false or trainer.reward_balance.enable=false "
            "[rule rb_replaces_filter]"
        )
    if batching == "sign_partitioned" and rb_on:
        raise IllDefinedComposition(
            "reward-balanced batching (RB) makes every update see >= rho positive and >= rho negative rollouts; "
            "batching 'sign_partitioned' puts the two signs in different mini-batches (updates): the two contradict "
            "each other [rule balanced_updates]"
        )
