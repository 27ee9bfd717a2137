"""Selective extrapolation / token replacement decoding with two vLLM engines (Paper A, methods 3 and 4).

The stepping is the official script's (Hesse73/RLVR-Directions, ``extrapolate/extrapolate.py``,
``decode_with_two_models``): two ``vllm.LLM`` engines in one process (base and RL; in-process engine
cores, prefix caching, eager mode), a window of ``batch_size`` sequences; at every step each engine is
asked for one token with log-probs for every sequence of the window (the prompt plus the tokens chosen
so far, resubmitted; prefix caching reuses the KV of its full blocks), the next token of each sequence
is chosen from the two models' log-probs, sequences that emitted EOS or reached ``max_new_tokens``
leave the window and waiting prompts take their place.

The choice is creditlab's, not re-written here: :class:`creditlab.decoding.extrapolation.SelectiveRule`
(criterion, threshold, direction, gamma, top-k support, temperature / top-p; its ``choose`` is the local
decoder's step) on the engines' log-probs, with the local decoder's pre-drawn uniform
streams (:func:`creditlab.lm.sampler.draw_uniforms`, indexed by prompt and step). So the
semantics are those of :func:`creditlab.decoding.extrapolation.selective_generate`, and with the same
seed this decoder chooses the same tokens as the local one, sampling included, up to floating-point
differences between vLLM's and transformers' forwards (a token at a CDF boundary or an argmax tie).
View: with ``top_k_support=K`` (the paper-scale default, K = 50: the official script's ``logprobs=50``) each engine
is asked for its top-K log-probs only and the rule reads them as the local decoder reads its full rows cut to the
same view; ``top_k_support=None`` (the tiny default) asks for the whole vocabulary (``logprobs=-1``).
Differences from the official script, by design: the proposal is
drawn by the rule from pi_dec's top-K (full view: from pi_dec), not by vLLM's own sampler from the full
distribution; randomness comes from creditlab's streams
(the script: vLLM's seed for the proposal, ``np.random`` for the resample).

Cost: every step is two ``LLM.generate`` calls over the window, each returning K log-probs per sequence (V with
the full view: cheap for the tiny vocabularies, ~30-60 tokens, but ~152k per sequence per token per engine for
Qwen2.5; see docs/cluster.md, "vLLM evaluation").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from creditlab.decoding.extrapolation import FLAG_NAMES, N_STREAMS, SelectiveRule, decoding_pair, make_rule
from creditlab.engines.vllm.backend import VllmEngine
from creditlab.lm.sampler import (
    DEFAULT_BATCH_SIZE,
    Generation,
    SamplingParams,
    draw_uniforms,
)


def selective_decode(
    primary: VllmEngine,
    secondary: VllmEngine,
    prompt_ids: Sequence[Sequence[int]],
    rule: SelectiveRule,
    *,
    primary_lora: str | Path | None = None,
    secondary_lora: str | Path | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> tuple[Generation, dict[str, list[int]]]:
    """Selective extrapolation decoding of ``prompt_ids`` with two vLLM engines, stepped token by token.

    primary: the decoding model's engine (pi_base for ``rule.decode_with="base"``, pi_RL for "rl"), secondary:
    the other one; ``*_lora``: an adapter directory served on that engine with ``LoRARequest`` (the same
    engine may be passed twice, e.g. base = the engine alone and RL = the engine with a LoRA run's adapter).
    rule: the choice of every token (criterion, threshold, direction, gamma, support) and its
    :class:`SamplingParams` (token choice, length, stop tokens: one id or several for hub models, seed), built as
    :func:`creditlab.decoding.extrapolation.selective_generate` builds it. The return value is that
    function's: (generation, stats) with per-prompt ``n_tokens``, ``resampled`` and ``changed``.
    ``batch_size``: the window (sequences stepped together; None: the local default). Deterministic given the
    params' seed; the window does not change the tokens.
    """
    if primary.vocab_size != secondary.vocab_size:
        raise ValueError(f"the two models' vocabularies differ: {primary.vocab_size} vs {secondary.vocab_size}")
    max_new_tokens = rule.params.length()
    prompts = [list(p) for p in prompt_ids]
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    n = len(prompts)
    stops = set(rule.params.stop_ids)
    responses: list[list[int]] = [[] for _ in prompts]
    finished = [False] * n
    counts = torch.zeros(n, len(FLAG_NAMES), dtype=torch.long)
    if n == 0 or max_new_tokens == 0:
        return Generation(prompts, responses, finished), {"n_tokens": [0] * n, **{f: [0] * n for f in FLAG_NAMES}}
    uniforms = draw_uniforms(n, max_new_tokens, N_STREAMS, rule.params.seed)  # [n, T, 3]
    window = batch_size or DEFAULT_BATCH_SIZE
    active = list(range(min(window, n)))
    waiting = n - len(active)
    next_prompt = len(active)
    bar = None
    if progress:
        from creditlab.progress import progress as progress_bar

        bar = progress_bar(n, "vllm selective decoding", enabled=True)
    while active:
        contexts = [prompts[i] + responses[i] for i in active]
        lp_dec = primary.next_logprobs(contexts, lora=primary_lora, k=rule.top_k_support)
        lp_other = secondary.next_logprobs(contexts, lora=secondary_lora, k=rule.top_k_support)
        rows = torch.tensor(active)
        steps = torch.tensor([len(responses[i]) for i in active])
        tokens, flags = rule.choose_logprobs([lp_dec, lp_other], uniforms[rows, steps])
        counts[rows] += flags.long()
        still = []
        for i, tok in zip(active, tokens.tolist()):
            responses[i].append(tok)
            if tok in stops:
                finished[i] = True
            elif len(responses[i]) < max_new_tokens:
                still.append(i)
        done = len(active) - len(still)
        while len(still) < window and waiting:
            still.append(next_prompt)
            next_prompt += 1
            waiting -= 1
        active = still
        if bar is not None and done:
            bar.update(done)
    if bar is not None:
        bar.close()
    per_flag = counts.T.tolist()
    return (
        Generation(prompts, responses, finished),
        {"n_tokens": [len(r) for r in responses], **dict(zip(FLAG_NAMES, per_flag))},
    )


E = TypeVar("E")


@dataclass(frozen=True, eq=False)
class SelectiveEngines(Generic[E]):
    """Selective extrapolation on two vLLM engines, as a decoder the evaluator records: which engines (pi_base,
    pi_RL: engines in this process, or their names on a worker), their adapters and the decoder's options.

    base / rl: the engines of pi_base and pi_RL (may be the same engine), base_lora / rl_lora: adapter
    directories; options: criterion, threshold, gamma, decode_with, fire_when, top_k_support (as
    :func:`creditlab.decoding.extrapolation.make_selective_generate_fn`). Called in this process by
    :class:`VllmSelectiveGenerateFn`, through a worker by ``client.WorkerSelectiveGenerateFn``.
    """

    base: E
    rl: E
    options: dict[str, Any]
    base_lora: str | None = None
    rl_lora: str | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """JSON-able description of the decoder (metrics.json ``settings.decoder``)."""
        return {"name": "selective_extrapolation", "backend": "vllm", "rl_lora": self.rl_lora, **self.options}


@dataclass(frozen=True, eq=False)
class VllmSelectiveGenerateFn(SelectiveEngines[VllmEngine]):
    """A ``generate_fn`` for the evaluator: :func:`selective_decode` on two engines of this process."""

    def __call__(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> tuple[Generation, dict[str, list[int]]]:
        primary, secondary = decoding_pair(self.options, self.base, self.rl)
        p_lora, s_lora = decoding_pair(self.options, self.base_lora, self.rl_lora)
        rule = make_rule(**self.options, params=params)
        return selective_decode(
            primary,
            secondary,
            prompt_ids,
            rule,
            primary_lora=p_lora,
            secondary_lora=s_lora,
            batch_size=batch_size,
            progress=progress,
        )
