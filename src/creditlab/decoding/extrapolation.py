"""Test-time selective extrapolation and selective token replacement (Paper A, methods 3 and 4).

Two models decode together: the *decoding* model (pi_base, or pi_RL in the "extrapolate pi_RL
itself" variant) proposes each token and the other model only scores it. At each step, per row:

1. propose y ~ pi_dec (temperature, then top-p), from the proposal random stream;
2. score the position with a criterion (:mod:`creditlab.decoding.criteria`) on the two models'
   full-vocabulary log-probs at temperature 1; for ``dlogp`` with the base model decoding it fires
   when Δlog p(y) = log pi_RL(y) - log pi_base(y) <= tau;
3. where it fires, resample the position from the extrapolated policy

       log pi_extra = log_softmax((1 + gamma) log pi_RL - gamma log pi_base)

   (then temperature, then top-p), from the resample random stream; elsewhere keep y.

gamma = 0 is *replace-only* (resample from pi_RL): the token replacement study. Per sequence the
decoder counts its generated tokens, the resampled positions (criterion fired; the replacement rate
is resampled / tokens) and the resamples that changed the token.

Support. By default the decoder sees both models over the full vocabulary, exactly. With ``top_k_support=K`` it sees
them as the official vLLM script does, through each model's top-K log-probs only (``logprobs=50``: the view the
paper-scale decodings use, ``creditlab.papers.spec.OFFICIAL_TOP_K``, since a 152k-entry row per token per engine
would dominate their cost): the vLLM engines are asked for K log-probs and the local decoder cuts its full rows to
the same view (:func:`own_view`), so both backends choose the same tokens. On that view: the proposal is drawn from
the decoding model's top-K (renormalised; the script samples it from vLLM's full distribution, which its top-p
nucleus almost always keeps inside the top 50); the criterion reads both models on the union of their top-K sets,
each model's missing entries padded with its K-th log-prob (:func:`union_view`: the script's ``pad_lp = min(...)``;
exact for ``dlogp`` on the proposed token [code], the padding of the distribution criteria (kl, entropy, ...) ours);
the resampling support is the decoding model's top-K tokens plus the proposed token, with the other model's log-prob
of a support token outside its own top-K padded the same way. K >= V is the full view.

Randomness: three pre-drawn uniform streams per (prompt, step) (see
:mod:`creditlab.lm.sampler`): proposal (stream 0, the plain sampler's stream, so a
criterion that never fires gives exactly the plain sampler's tokens for the same seed), resample and
criterion (the ``random`` criterion). Results do not depend on ``batch_size``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor

from creditlab.decoding.criteria import Criterion, Decoder, Direction, fires, get_criterion
from creditlab.lm.sampler import (
    Chooser,
    DecodeState,
    Generation,
    SamplingParams,
    choose_tokens,
    decode_with_chooser,
)

T = TypeVar("T")

PROPOSAL, RESAMPLE, CRITERION = 0, 1, 2
"""Indices of the random streams (uniforms[:, s]) used by the selective decoder."""
N_STREAMS = 3

FLAG_NAMES = ("resampled", "changed")
"""Per-row flags of a step: the criterion fired; the resampled token differs from the proposal."""


def extrapolated_logprobs(logp_rl: Tensor, logp_base: Tensor, gamma: float) -> Tensor:
    """log pi_extra = log_softmax((1 + gamma) log pi_RL - gamma log pi_base) over the last axis.

    logp_rl, logp_base: [..., V] log-probabilities (any per-row additive constant cancels).
    Returns normalised log-probs [..., V]. gamma = 0 gives log pi_RL (replace-only); in probability
    space pi_extra is pi_RL reweighted by exp(gamma Δlog p).
    """
    if gamma == 0:
        return torch.log_softmax(logp_rl, dim=-1)
    return torch.log_softmax((1.0 + gamma) * logp_rl - gamma * logp_base, dim=-1)


def own_view(logp: Tensor, k: int) -> Tensor:
    """A model's row as its engine shows it when asked for its top-k log-probs: logp [B, V] with -inf outside each
    row's k largest entries. Idempotent: a row already cut to its top-k (vLLM's) is returned as it is."""
    k = min(int(k), logp.shape[-1])
    top = logp.topk(k, dim=-1)
    return torch.full_like(logp, -math.inf).scatter_(1, top.indices, top.values)


def union_view(logp_dec: Tensor, logp_other: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Both models on the union U of their top-k sets, as the criteria read them on the top-k view: each row
    [B, V] keeps its own top-k log-probs, its entries in U outside its own top-k are padded with its k-th log-prob
    (the script's pad), -inf outside U. The same whether the rows are full or already cut to their top-k."""
    k = min(int(k), logp_dec.shape[-1])
    in_u = torch.zeros_like(logp_dec, dtype=torch.bool)
    in_u.scatter_(1, logp_dec.topk(k, dim=-1).indices, True).scatter_(1, logp_other.topk(k, dim=-1).indices, True)
    out = []
    for lp in (logp_dec, logp_other):
        kth = lp.topk(k, dim=-1).values[:, -1:]
        out.append(torch.where(in_u, torch.maximum(lp, kth), torch.full_like(lp, -math.inf)))
    return out[0], out[1]


def top_k_support(logp_dec: Tensor, logp_other: Tensor, token: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The official script's restricted view of the two models (see the module docstring).

    logp_dec, logp_other: [B, V] log-probs of the decoding and the other model; token [B] the
    proposed tokens. Returns (support [B, V] bool: the decoder's top-k tokens and the proposed token,
    other_filled [B, V]: logp_other with every value below its own k-th largest raised to it, i.e.
    tokens outside the other model's top-k get the minimum of its top-k log-probs).
    """
    k = min(k, logp_dec.shape[-1])
    support = torch.zeros_like(logp_dec, dtype=torch.bool)
    support.scatter_(1, logp_dec.topk(k, dim=-1).indices, True)
    support.scatter_(1, token[:, None], True)
    kth_other = logp_other.topk(k, dim=-1).values[:, -1:]  # [B, 1]
    return support, torch.maximum(logp_other, kth_other)


@dataclass(frozen=True)
class SelectiveRule:
    """One step of selective extrapolation decoding, as a sampler :class:`Chooser` over [decoder, other].

    criterion fires with ``direction`` against ``threshold``; resampling uses ``gamma`` (0 =
    replace-only) and ``top_k_support`` (None = exact full vocabulary); ``params``: the token choice (temperature /
    top-p, or greedy) of both the proposal and the resample, and the length, stop tokens and seed of a decode.
    """

    criterion: Criterion
    threshold: float
    gamma: float
    decode_with: Decoder = "base"
    direction: Direction = "le"
    top_k_support: int | None = None
    params: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if self.decode_with not in ("base", "rl"):
            raise ValueError(f"decode_with must be 'base' or 'rl', got {self.decode_with!r}")
        if self.direction not in ("le", "ge"):
            raise ValueError(f"direction must be 'le' or 'ge', got {self.direction!r}")
        if self.top_k_support is not None and self.top_k_support < 1:
            raise ValueError(f"top_k_support must be >= 1 or None, got {self.top_k_support}")
        if not math.isfinite(self.gamma):
            raise ValueError(f"gamma must be finite, got {self.gamma}")

    def rl_base(self, lp_dec: Tensor, lp_other: Tensor) -> tuple[Tensor, Tensor]:
        """(log pi_RL, log pi_base) from the decoding / other model's log-probs."""
        return (lp_dec, lp_other) if self.decode_with == "rl" else (lp_other, lp_dec)

    def resample_logprobs(self, lp_dec: Tensor, lp_other: Tensor, proposal: Tensor) -> Tensor:
        """The resampling distribution [B, V] (log-probs, -inf outside the support) of rows [B, V]."""
        if self.top_k_support is None:
            return extrapolated_logprobs(*self.rl_base(lp_dec, lp_other), self.gamma)
        support, other = top_k_support(lp_dec, lp_other, proposal, self.top_k_support)
        # off the support the values do not matter (masked below), but must be finite: a top-K view is -inf there
        dec, other = lp_dec.masked_fill(~support, 0.0), other.masked_fill(~support, 0.0)
        extra = extrapolated_logprobs(*self.rl_base(dec, other), self.gamma)
        return torch.log_softmax(extra.masked_fill(~support, -math.inf), dim=-1)

    def fire(self, lp_dec: Tensor, lp_other: Tensor, proposal: Tensor, uniforms: Tensor) -> Tensor:
        """Bool [B]: where the criterion fires for the proposed tokens [B] (uniforms [B] its stream)."""
        lp_rl, lp_base = self.rl_base(lp_dec, lp_other)
        score = self.criterion(lp_rl, lp_base, proposal, decoder=self.decode_with, uniforms=uniforms)
        return fires(score, self.threshold, self.direction)

    def choose(self, logits: list[Tensor], uniforms: Tensor) -> tuple[Tensor, Tensor]:
        """Sampler hook: logits [decoder [B, V], other [B, V]], uniforms [B, 3] -> (tokens [B], flags [B, 2]).

        Only the rows where the criterion fires are resampled (one batched gather, no per-row loop).
        """
        return self._choose(logits, uniforms, normalised=False)

    def choose_logprobs(self, logprobs: list[Tensor], uniforms: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`choose` on rows that are log-probs already, as an engine returns them: the full vocabulary, or with
        ``top_k_support=K`` each row's top K only (-inf elsewhere; its values are not renormalised)."""
        return self._choose(logprobs, uniforms, normalised=True)

    def _choose(self, rows: list[Tensor], uniforms: Tensor, normalised: bool) -> tuple[Tensor, Tensor]:
        dec_rows, other_rows = rows
        lp_dec, lp_other = dec_rows, other_rows
        if not normalised:
            lp_dec, lp_other = torch.log_softmax(dec_rows, dim=-1), torch.log_softmax(other_rows, dim=-1)
        if self.top_k_support is None:
            proposal = choose_tokens(dec_rows, self.params, uniforms[:, PROPOSAL])
            fired = self.fire(lp_dec, lp_other, proposal, uniforms[:, CRITERION])
        else:  # the top-K view (module docstring): the same on full rows and on an engine's top-K rows
            lp_dec, lp_other = own_view(lp_dec, self.top_k_support), own_view(lp_other, self.top_k_support)
            proposal = choose_tokens(lp_dec, self.params, uniforms[:, PROPOSAL])
            fired = self.fire(*union_view(lp_dec, lp_other, self.top_k_support), proposal, uniforms[:, CRITERION])
        tokens = proposal.clone()
        rows_fired = fired.nonzero().squeeze(1)
        if rows_fired.numel():
            extra = self.resample_logprobs(lp_dec[rows_fired], lp_other[rows_fired], proposal[rows_fired])
            tokens[rows_fired] = choose_tokens(extra, self.params, uniforms[rows_fired, RESAMPLE])
        return tokens, torch.stack([fired, tokens != proposal], dim=1)

    def chooser(self) -> Chooser:
        """This rule as the sampler's :class:`Chooser` (3 streams, flags :data:`FLAG_NAMES`)."""
        return Chooser(self.choose, n_streams=N_STREAMS, flag_names=FLAG_NAMES)


def make_rule(
    criterion: str = "dlogp",
    *,
    threshold: float,
    gamma: float,
    decode_with: Decoder = "base",
    fire_when: Direction | None = None,
    top_k_support: int | None = None,
    params: SamplingParams = SamplingParams(),
) -> SelectiveRule:
    """A :class:`SelectiveRule` from settings; ``fire_when`` None = the criterion's default direction."""
    crit = get_criterion(criterion)
    return SelectiveRule(
        crit,
        float(threshold),
        float(gamma),
        decode_with,
        fire_when or crit.direction(decode_with),
        top_k_support,
        params,
    )


def selective_generate(
    primary: torch.nn.Module,
    secondary: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    criterion: str = "dlogp",
    threshold: float,
    gamma: float,
    decode_with: Decoder = "base",
    fire_when: Direction | None = None,
    top_k_support: int | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> tuple[Generation, dict[str, list[int]]]:
    """Selective extrapolation decoding of ``prompt_ids`` with two models in one batched loop.

    primary: the decoding model, pi_base when ``decode_with="base"`` (default) and pi_RL when
    ``decode_with="rl"``; secondary: the other one. Both models' KV caches are stepped together.
    criterion / threshold / fire_when: when to resample (``fire_when`` None = the criterion's default
    for ``decode_with``, e.g. dlogp fires on Δlog p <= tau for "base" and >= tau for "rl");
    gamma: extrapolation strength (0 = replace-only, resample from pi_RL); top_k_support: None =
    exact full vocabulary, K = the official script's top-K view; params: the token choice (greedy /
    temperature / top_p, applied to both the proposal and the resample; greedy: argmax of each), length,
    stop tokens and seed.

    Returns (generation, stats) with per-prompt lists stats["n_tokens"] (generated tokens, EOS
    included), stats["resampled"] (positions where the criterion fired) and stats["changed"]
    (resampled positions whose token differs from the proposal). Deterministic given ``params.seed``.
    """
    rule = make_rule(
        criterion,
        threshold=threshold,
        gamma=gamma,
        decode_with=decode_with,
        fire_when=fire_when,
        top_k_support=top_k_support,
        params=params,
    )
    return decode_with_rule(primary, secondary, prompt_ids, rule, batch_size=batch_size, progress=progress)


def decode_with_rule(
    primary: torch.nn.Module,
    secondary: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    rule: SelectiveRule,
    *,
    batch_size: int | None = None,
    progress: bool = False,
) -> tuple[Generation, dict[str, list[int]]]:
    """Selective decoding of ``prompt_ids`` by ``rule`` (its criterion, direction, gamma, support and
    :class:`SamplingParams`), both models' KV caches stepped together in one batched loop: the local counterpart
    of :func:`creditlab.engines.vllm.extrapolation.selective_decode`. Returns what :func:`selective_generate`
    returns."""
    states = [DecodeState(primary), DecodeState(secondary)]
    generation, flags = decode_with_chooser(
        states, rule.chooser(), prompt_ids, rule.params, batch_size=batch_size, progress=progress
    )
    return generation, {"n_tokens": [len(r) for r in generation.response_ids], **flags}


def decoding_pair(options: Mapping[str, Any], base: T, rl: T) -> tuple[T, T]:
    """(primary, secondary) of a selective decoder's ``options``: the decoding model (``decode_with``, default
    "base") first, the other one second. ``base`` / ``rl`` are models, engines or their adapters."""
    return (rl, base) if options.get("decode_with", "base") == "rl" else (base, rl)


@contextmanager
def eval_mode(*models: torch.nn.Module) -> Iterator[None]:
    """Put ``models`` in eval mode inside the block; restore each one's train/eval mode after."""
    modes = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        yield
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


@dataclass(frozen=True, eq=False)
class SelectiveGenerateFn:
    """A ``generate_fn`` for :func:`creditlab.eval.evaluate.evaluate_model`: selective decoding.

    Built by :func:`make_selective_generate_fn`; calling it with the evaluator's :class:`SamplingParams` runs
    :func:`decode_with_rule` with the stored models and settings (both models in eval mode during the call), as
    :func:`selective_generate` does. ``settings`` is recorded in metrics.json by the evaluator.
    """

    base_model: torch.nn.Module
    rl_model: torch.nn.Module
    options: dict[str, Any]

    @property
    def settings(self) -> dict[str, Any]:
        """JSON-able description of the decoder."""
        return {"name": "selective_extrapolation", **self.options}

    def __call__(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> tuple[Generation, dict[str, list[int]]]:
        primary, secondary = decoding_pair(self.options, self.base_model, self.rl_model)
        rule = make_rule(**self.options, params=params)
        with eval_mode(primary, secondary):
            return decode_with_rule(primary, secondary, prompt_ids, rule, batch_size=batch_size, progress=progress)


def make_selective_generate_fn(
    base_model: torch.nn.Module,
    rl_model: torch.nn.Module,
    *,
    criterion: str = "dlogp",
    threshold: float,
    gamma: float,
    decode_with: Decoder = "base",
    fire_when: Direction | None = None,
    top_k_support: int | None = None,
) -> SelectiveGenerateFn:
    """A ``generate_fn`` decoding with :func:`selective_generate` (settings as there), for the evaluator.

    The settings are validated here, before any decoding.
    """
    options = dict(
        criterion=criterion,
        threshold=float(threshold),
        gamma=float(gamma),
        decode_with=decode_with,
        fire_when=fire_when,
        top_k_support=top_k_support,
    )
    make_rule(**options)  # validate now rather than inside the evaluation
    return SelectiveGenerateFn(base_model, rl_model, options)
