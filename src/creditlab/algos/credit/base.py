"""What credit functions see (CreditInputs), how they are called (apply_credit), identity ``none``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from creditlab.algos.registry import get, register


@dataclass
class CreditInputs:
    """Plain tensors describing one rollout batch (B rollouts, T response positions).

    responses: Tensor[B, T] long   sampled token ids (right padded)
    mask:      Tensor[B, T] float  1 on valid response tokens
    old_logp:  Tensor[B, T]        log pi_old(o_t | q, o_<t) from the old-log-prob forward
    advantages: Tensor[B]          sequence advantages A_i
    group_ids: Tensor[B] long      prompt group of each rollout
    hidden:    Tensor[B, T, d]     final hidden states h_t (LM-head input) from the same forward, or None
    entropy:   Tensor[B, T]        entropy of pi_old at each position, or None
    ref_logp:  Tensor[B, T]        reference-model log-probs, or None
    topk_logp: Tensor[B, T, K]     log-probs of the K most probable tokens at each position, or None
    topk_ids:  Tensor[B, T, K]     their token ids, or None
    lm_head:   Tensor[V, d]        the LM-head weight (detached), or None
    rng:       torch.Generator     seeded from (seed, step) by the engine, for randomised variants
    base_hidden: Tensor[B, T, d]   final hidden states of the same forward with the LoRA adapter disabled
                                   (the reference pass; ARCA's h^base), or None
    """

    responses: Tensor
    mask: Tensor
    old_logp: Tensor
    advantages: Tensor
    group_ids: Tensor
    hidden: Tensor | None = None
    entropy: Tensor | None = None
    ref_logp: Tensor | None = None
    topk_logp: Tensor | None = None
    topk_ids: Tensor | None = None
    lm_head: Tensor | None = None
    rng: torch.Generator | None = None
    base_hidden: Tensor | None = None


INPUT_FIELDS = tuple(CreditInputs.__dataclass_fields__)
REF_INPUTS = frozenset({"ref_logp", "base_hidden"})
"""The inputs only a reference (adapter-disabled) pass provides: a function naming one needs LoRA."""


def credit_inputs_of(fn) -> tuple[str, ...]:
    """The CreditInputs fields ``fn`` takes, read from its signature (``old_logp``, ``hidden``, ...)."""
    return tuple(p for p in inspect.signature(fn).parameters if p in INPUT_FIELDS)


def required_inputs_of(fn) -> tuple[str, ...]:
    """The CreditInputs fields ``fn`` cannot do without (those without a default)."""
    params = inspect.signature(fn).parameters
    return tuple(n for n in credit_inputs_of(fn) if params[n].default is inspect.Parameter.empty)


def apply_credit(fn, batch: CreditInputs, kwargs: dict) -> Tensor:
    """Call a registered credit function or token filter with the batch tensors it names plus its kwargs.

    Credit functions keep plain tensor signatures (``dlogp_weights(old_logp, alpha)``); this is the one
    place that maps a rollout batch onto them. An argument with a default (``topk_logp=None``) is
    optional: the function checks it when a setting needs it. Returns Tensor[B, T] (a per-rollout
    Tensor[B, 1] is broadcast). Several credit functions compose by multiplying their outputs; token
    filters (kind ``"token_filter"``, 0/1 outputs) multiply the loss mask instead.
    """
    missing = [n for n in required_inputs_of(fn) if getattr(batch, n) is None]
    if missing:
        raise ValueError(f"credit function {fn.__name__} needs {missing}, which this engine did not provide")
    w = fn(**{n: getattr(batch, n) for n in credit_inputs_of(fn)}, **kwargs)
    return w.expand_as(batch.old_logp)


def method_entries(kind: str, items: list[dict] | None) -> list[tuple[Callable, dict]]:
    """Method config entries ``[{name, **kwargs}]`` of ``kind`` (credit, token_filter) -> [(function, kwargs)]."""
    return [(get(kind, c["name"]), {k: v for k, v in c.items() if k != "name"}) for c in items or []]


def compose_credit(fns: list[tuple[Callable, dict]], inputs: CreditInputs, extra: dict | None = None) -> Tensor:
    """Product of ``apply_credit(fn, inputs, kwargs)`` over ``fns``: credit functions compose by multiplying
    their weights, token filters by multiplying their 0/1 masks; ones when empty. ``extra`` kwargs go to the
    functions whose signature names them (the verl workers' ``all_reduce``). Returns Tensor[B, T] float32."""
    out = torch.ones(inputs.old_logp.shape, dtype=torch.float32, device=inputs.old_logp.device)
    for fn, kw in fns:
        params = inspect.signature(fn).parameters
        more = {k: v for k, v in (extra or {}).items() if k in params}
        out = out * apply_credit(fn, inputs, {**kw, **more}).float()
    return out


def named_inputs(fn, inputs: dict) -> dict:
    """The entries of ``inputs`` that ``fn``'s signature names."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in inputs.items() if k in params}


def credit_stream(fn, kwargs: dict, extra: dict | None = None):
    """The streamed form of a credit function or token filter that holds per-token states (``fn.stream``: DelTA's),
    built from its config ``kwargs`` (plus the ``extra`` its constructor names), or None.

    A stream reads a batch one micro-batch at a time, over one or more passes, holding O(d) statistics instead of
    every token's d-vector: ``while not s.done: [s.update(**micro-batch inputs)...]; s.end_pass()``; ``update``
    returns Tensor[B_mb, T] on the last pass (else None); ``s.finish(values, **batch inputs)`` maps the whole
    batch's values (Tensor[B, T], rollouts in the batch's order) to the function's output. The inputs are the
    CreditInputs fields the methods' signatures name. :func:`run_in_memory` is the one-micro-batch driver."""
    make = getattr(fn, "stream", None)
    return None if make is None else make(**kwargs, **named_inputs(make, extra or {}))


def run_in_memory(stream, inputs: dict) -> Tensor:
    """Drive a credit stream (:func:`credit_stream`) over one micro-batch holding the whole batch: ``inputs`` are the
    batch's tensors by CreditInputs name. Returns ``stream.finish`` of the last pass's values (Tensor[B, T])."""
    values = None
    while not stream.done:
        values = stream.update(**named_inputs(stream.update, inputs))
        stream.end_pass()
    return stream.finish(values, **named_inputs(stream.finish, inputs))


@register("credit", "none")
def no_credit(old_logp: Tensor) -> Tensor:
    """w_{i,t} = 1 for every token: plain GRPO/DAPO. Tensor[B, T] -> Tensor[B, T]."""
    return torch.ones_like(old_logp)


class TokenCredit:
    """Mean credit weight per generated token id over a run (DelTA's token clouds, Figure 4; ``token_credit.json``),
    accumulated by either engine from each step's weights. ``sums``: Tensor[2, V] float64 (sum of weights; count),
    grown when a larger token id arrives."""

    def __init__(self, vocab: int = 0):
        self.sums = torch.zeros(2, vocab, dtype=torch.float64)

    def add(self, responses: Tensor, mask: Tensor, weights: Tensor) -> None:
        """responses: Tensor[B, T] token ids; mask, weights: Tensor[B, T] (weights broadcastable, e.g. [B, 1])."""
        valid = mask.bool().cpu()
        ids = responses.cpu()[valid].long()
        w = torch.broadcast_to(weights.detach().cpu(), valid.shape)[valid].double()
        if ids.numel() and int(ids.max()) >= self.sums.shape[1]:
            self.sums = torch.cat(
                [self.sums, torch.zeros(2, int(ids.max()) + 1 - self.sums.shape[1], dtype=torch.float64)], 1
            )
        self.sums[0].index_add_(0, ids, w)
        self.sums[1].index_add_(0, ids, torch.ones_like(w))

    def table(self, decode: Callable[[int], str], steps: int) -> dict:
        """The token_credit.json object: every token seen, by mean weight (highest first)."""
        sums, counts = self.sums
        rows = [
            {"token": decode(i), "id": i, "count": int(counts[i]), "mean": float(sums[i] / counts[i])}
            for i in torch.nonzero(counts > 0).flatten().tolist()
        ]
        rows.sort(key=lambda r: -r["mean"])
        return {"tokens": rows, "n_tokens": int(counts.sum()), "steps": int(steps), "weight": "credit"}
