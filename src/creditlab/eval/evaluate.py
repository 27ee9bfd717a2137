"""Evaluate a causal LM on benchmark suites: greedy + k samples per question, scored and summarised.

For each suite: render and tokenize every question, decode one greedy response and ``k`` sampled
responses (temperature / top-p) per question with the local KV-cache sampler, score them with a
:class:`~creditlab.rewards.scorer.RewardScorer` (correct = score > 0), write every generation to
``out_dir/<suite>.jsonl`` and summarise greedy accuracy, avg@k and unbiased pass@j with bootstrap
CIs. ``out_dir/metrics.json`` holds the summary of every suite, per-question counts (so that
tables can recompute any metric) and averages over suites, plain and question-count weighted.

Reproducibility: the sampling seed of a suite is derived from ``seed`` and the suite name only, so a
suite's samples do not depend on which other suites are evaluated or in which order.

Decoders: by default the model is decoded with the plain sampler; ``generate_fn`` (a
:class:`GenerateFn`, e.g. :func:`creditlab.decoding.extrapolation.make_selective_generate_fn`)
replaces it, with the same scoring, files and bootstrap CIs. Per-sequence decode counters it returns
(e.g. ``resampled``) are written to every jsonl row, and a suite's summary gets
``replacement_rate`` = resampled tokens / generated tokens over its samples (``greedy_*`` for the
greedy generations) and ``changed_rate`` likewise when they are present.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from creditlab.data.schema import render_record_prompt
from creditlab.eval.metrics import per_question_metrics, summarize_suite
from creditlab.lm.sampler import Generation, SamplingParams, generate
from creditlab.progress import progress as progress_bar
from creditlab.rewards.scorer import RewardScorer
from creditlab.stats import bootstrap_average

GREEDY_SAMPLE = -1
"""Value of the ``sample`` field of the greedy generation in the per-sample jsonl."""

N_BOOT, ALPHA = 2000, 0.05
"""Bootstrap resamples and (1 - confidence level) of every CI in metrics.json."""


DecodeStats = dict[str, list[int]]
"""Per-sequence integer counters of a decoder, e.g. {"n_tokens": [...], "resampled": [...]}."""

RATE_STATS = {"resampled": "replacement_rate", "changed": "changed_rate"}
"""Decode counter -> summary key of its rate (counter total / generated tokens)."""


class GenerateFn(Protocol):
    """A decoder for the evaluator: ``fn(prompt_ids, params, *, batch_size, progress) -> (Generation, stats)``.

    params: what decides the outputs (:class:`creditlab.lm.sampler.SamplingParams`: greedy or temperature / top-p,
    length, stop tokens, seed), passed on as is; batch_size / progress as in :func:`creditlab.lm.sampler.generate`.
    stats: per-sequence counters (empty for plain decoding). An optional ``settings`` attribute (a JSON-able dict)
    is recorded in metrics.json under ``settings.decoder``.
    """

    def __call__(
        self, prompt_ids: list[list[int]], params: SamplingParams, *, batch_size: int | None, progress: bool
    ) -> tuple[Generation, DecodeStats]: ...


def plain_generate_fn(model: torch.nn.Module) -> GenerateFn:
    """The default decoder: the plain sampler on ``model``, no decode counters."""

    def fn(prompt_ids: list[list[int]], params: SamplingParams, **loop: Any) -> tuple[Generation, DecodeStats]:
        return generate(model, prompt_ids, params, **loop), {}

    return fn


def stop_token_ids(tokenizer: Any, model_dir: str | Path) -> list[int]:
    """A hub model's stop tokens: the tokenizer's EOS and its checkpoint's generation_config.json
    ``eos_token_id`` (an id or a list; chat models end a turn with a token other than the tokenizer's EOS, e.g.
    Qwen's ``<|im_end|>``), what vLLM stops on by default and so what verl's rollout stopped on."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    if not ids:
        raise ValueError(
            f"no stop token: tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no EOS and "
            f"{gen} names no eos_token_id"
        )
    return list(dict.fromkeys(int(i) for i in ids))


def suite_seed(seed: int, suite: str) -> int:
    """Sampling seed of ``suite``: a deterministic function of ``seed`` and the suite name (31 bits)."""
    return (seed * 1_000_003 + zlib.crc32(suite.encode("utf-8"))) % (2**31 - 1)


def encode_prompts(
    tokenizer: Any,
    records: Sequence[dict],
    template: str,
    chat: bool = False,
    chat_kwargs: dict[str, Any] | None = None,
) -> tuple[list[str], list[list[int]]]:
    """Rendered prompts and their token ids for each record (:func:`creditlab.data.schema.render_record_prompt`).

    ``chat`` False (tiny models): the text as is, the tokenizer adding BOS. ``chat`` True (hub models, as verl
    trains them): the text is the user message of a one-turn conversation rendered by the tokenizer's chat
    template with the generation prompt (``apply_chat_template(..., add_generation_prompt=True)``, verl 0.9.1's
    rollout prompt), ``chat_kwargs`` passed to it; the returned prompt is the rendered conversation.
    """
    texts = [render_record_prompt(rec, template) for rec in records]
    if not chat:
        return texts, [list(tokenizer(p)["input_ids"]) for p in texts]
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"eval.chat_template is on but tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template"
        )
    kw = dict(add_generation_prompt=True, **(chat_kwargs or {}))
    prompts, ids = [], []
    for text in texts:
        messages = [{"role": "user", "content": text}]
        prompts.append(tokenizer.apply_chat_template(messages, tokenize=False, **kw))
        tokens = tokenizer.apply_chat_template(messages, tokenize=True, **kw)
        ids.append(list(tokens["input_ids"] if isinstance(tokens, Mapping) else tokens))
    return prompts, ids


def _write_jsonl_atomic(rows: Sequence[dict], path: Path) -> None:
    """Write ``rows`` as JSON lines to ``path`` via a temporary file: readers never see a partial file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _check_args(suites: dict[str, list[dict]], k: int, ks: Sequence[int]) -> None:
    """Fail before any decoding on arguments that could only fail after it."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    bad = [j for j in ks if not 1 <= j <= k]
    if bad:
        raise ValueError(f"every pass@j needs 1 <= j <= k={k}; got {bad}")
    empty = [name for name, recs in suites.items() if not recs]
    if empty:
        raise ValueError(f"suite(s) without records: {empty}")


def _decode_suite(
    generate_fn: GenerateFn,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    *,
    k: int,
    batch_size: int | None,
    progress: bool,
) -> tuple[Generation, Generation, DecodeStats]:
    """Greedy generation (one per prompt; ``params`` made greedy), sampled generation (k per prompt, question-major,
    with ``params``) and the decode counters of both, concatenated in that order (only counters both calls
    returned)."""
    loop = dict(batch_size=batch_size, progress=progress)
    greedy, greedy_stats = generate_fn(prompt_ids, replace(params, greedy=True), **loop)
    repeated = [ids for ids in prompt_ids for _ in range(k)]
    sampled, sampled_stats = generate_fn(repeated, params, **loop)
    stats = {
        name: list(greedy_stats[name]) + list(sampled_stats[name]) for name in greedy_stats if name in sampled_stats
    }
    return greedy, sampled, stats


def _generation_rows(
    suite: str,
    records: Sequence[dict],
    prompts: Sequence[str],
    responses: list[list[int]],
    finished: list[bool],
    k: int,
    tokenizer: Any,
    scorer: RewardScorer,
    stats: DecodeStats | None = None,
) -> list[dict]:
    """One jsonl row per generation: the Q greedy ones first in ``responses``, then Q*k samples.

    Rows are returned grouped by question: greedy (sample -1), then samples 0..k-1. ``stats``: decode
    counters aligned with ``responses``, added to the rows (``n_tokens`` is always the response length).
    """
    q = len(records)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in responses]
    golds = [str(rec["answer"]) for rec in records]
    owner = list(range(q)) + [i for i in range(q) for _ in range(k)]  # generation -> question
    sample = [GREEDY_SAMPLE] * q + [j for _ in range(q) for j in range(k)]
    scores = scorer.score(texts, [golds[i] for i in owner])
    order = sorted(range(len(owner)), key=lambda g: (owner[g], sample[g]))
    return [
        {
            "id": records[owner[g]]["id"],
            "suite": suite,
            "sample": sample[g],
            "prompt": prompts[owner[g]],
            "response": texts[g],
            "pred": scorer.extract(texts[g]),
            "gold": golds[owner[g]],
            "correct": bool(scores[g] > 0),
            "score": scores[g],
            "n_tokens": len(responses[g]),
            "finished": bool(finished[g]),
            **{name: int(values[g]) for name, values in (stats or {}).items() if name != "n_tokens"},
        }
        for g in order
    ]


def _per_question_decode_counts(rows: Sequence[dict], q: int, k: int) -> dict[str, list[int]]:
    """Per question, over its k samples: generated tokens and each decode counter (e.g. resampled).

    Empty for plain decoding (no counters). Lets tables bootstrap e.g. a replacement rate over questions.
    """
    counters = [name for name in RATE_STATS if name in rows[0]] if rows else []
    if not counters:
        return {}

    def per_q(field: str) -> list[int]:
        return np.array([r[field] for r in rows], dtype=np.int64).reshape(q, k + 1)[:, 1:].sum(1).tolist()

    return {"tokens": per_q("n_tokens"), **{name: per_q(name) for name in counters}}


def _suite_arrays(rows: Sequence[dict], q: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """greedy [Q] and samples [Q, k] 0/1 arrays from rows grouped by question (greedy first)."""
    per_question = np.array([r["correct"] for r in rows], dtype=np.float64).reshape(q, k + 1)
    return per_question[:, 0], per_question[:, 1:]


def _length_stats(rows: Sequence[dict], greedy: bool) -> dict[str, float]:
    """Mean length, truncated fraction and the :data:`RATE_STATS` rates of the greedy or sampled rows.

    rate = sum of the counter / sum of n_tokens (0 when nothing was generated).
    """
    chosen = [r for r in rows if (r["sample"] == GREEDY_SAMPLE) == greedy]
    out = {
        "mean_response_tokens": float(np.mean([r["n_tokens"] for r in chosen])),
        "truncated_frac": float(np.mean([not r["finished"] for r in chosen])),
    }
    total = sum(r["n_tokens"] for r in chosen)
    for counter, key in RATE_STATS.items():
        if counter in chosen[0]:
            out[key] = sum(r[counter] for r in chosen) / total if total else 0.0
    return out


def evaluate_suite(
    model: torch.nn.Module | None,
    tokenizer: Any,
    suite: str,
    records: list[dict],
    params: SamplingParams,
    *,
    k: int,
    ks: Sequence[int],
    template: str,
    scorer: RewardScorer,
    out_dir: Path,
    batch_size: int | None = None,
    progress: bool = True,
    generate_fn: GenerateFn | None = None,
    chat: bool = False,
    chat_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Decode, score and summarise one suite; writes ``out_dir/<suite>.jsonl``; returns its summary.

    Prompts: :func:`encode_prompts` (``chat``: the tokenizer's chat template). ``scorer`` judges every
    generation of the suite (the reward of its verifier kind).

    params: the sampled generations' settings (the greedy one is ``params`` made greedy); its seed is the suite's own
    (see :func:`suite_seed`); ``eos_id`` None: the tokenizer's EOS. The summary's
    ``mean_response_tokens`` / ``truncated_frac`` (and ``replacement_rate`` / ``changed_rate`` when
    the decoder reports them) are over the k sampled generations (greedy ones under ``greedy_*``);
    ``n_tokens`` counts the EOS token when it was emitted. ``generate_fn`` None: the plain sampler on
    ``model``; otherwise it decodes and ``model`` is unused.
    """
    if len({rec["id"] for rec in records}) != len(records):
        raise ValueError(f"suite {suite!r} has duplicate record ids")
    t0 = time.perf_counter()
    prompts, prompt_ids = encode_prompts(tokenizer, records, template, chat, chat_kwargs)
    if params.eos_id is None:
        params = replace(params, eos_id=tokenizer.eos_token_id)
    greedy_gen, sampled_gen, stats = _decode_suite(
        generate_fn or plain_generate_fn(model), prompt_ids, params, k=k, batch_size=batch_size, progress=progress
    )
    responses = list(greedy_gen.response_ids) + list(sampled_gen.response_ids)
    finished = list(greedy_gen.finished) + list(sampled_gen.finished)
    rows = _generation_rows(suite, records, prompts, responses, finished, k, tokenizer, scorer, stats)
    _write_jsonl_atomic(rows, out_dir / f"{suite}.jsonl")
    greedy, samples = _suite_arrays(rows, len(records), k)
    sampled_stats, greedy_stats = _length_stats(rows, greedy=False), _length_stats(rows, greedy=True)
    return {
        "n_questions": len(records),
        "k": k,
        "metrics": summarize_suite(greedy, samples, ks, n_boot=N_BOOT, alpha=ALPHA),
        "per_question": {
            "ids": [rec["id"] for rec in records],
            "greedy": greedy.astype(int).tolist(),
            "n": k,
            "c": samples.sum(axis=1).astype(int).tolist(),
            **_per_question_decode_counts(rows, len(records), k),
        },
        **sampled_stats,
        **{f"greedy_{name}": value for name, value in greedy_stats.items()},
        "seed": params.seed,
        "reward": scorer.reward,
        "seconds": time.perf_counter() - t0,
    }


def _one_or_per_suite(values: dict[str, Any]) -> Any:
    """The one value of a per-suite (or per-reward) mapping when all are equal (one scorer), else the mapping."""
    distinct = list({json.dumps(v, sort_keys=True): v for v in values.values()}.values())
    return distinct[0] if len(distinct) == 1 else values


def _reward_stats(scorers: Mapping[str, RewardScorer]) -> dict[str, Any]:
    """The scorer's counters (one scorer), else ``{reward: counters}`` per distinct scorer."""
    distinct = list({id(sc): sc for sc in scorers.values()}.values())
    return distinct[0].stats if len(distinct) == 1 else {sc.reward: sc.stats for sc in distinct}


def average_over_suites(suite_results: dict[str, dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """Every metric averaged over suites, ``plain`` (mean of suite means) and ``count`` (weighted by
    question count), each ``{"mean", "lo", "hi"}`` with a stratified bootstrap CI over questions."""
    per_suite: dict[str, list[np.ndarray]] = {}
    for res in suite_results.values():
        pq = res["per_question"]
        n, c = pq["n"], np.asarray(pq["c"])
        samples = (np.arange(n)[None, :] < c[:, None]).astype(np.float64)  # any layout with c correct
        for name, values in per_question_metrics(pq["greedy"], samples, ks).items():
            per_suite.setdefault(name, []).append(values)
    out: dict[str, Any] = {}
    for name, arrays in per_suite.items():
        out[name] = {}
        for weighting in ("plain", "count"):
            mean, lo, hi = bootstrap_average(arrays, weighting=weighting, n_boot=N_BOOT, alpha=ALPHA)
            out[name][weighting] = {"mean": mean, "lo": lo, "hi": hi}
    return out


def evaluate_model(
    model: torch.nn.Module | None,
    tokenizer: Any,
    suites: dict[str, list[dict]],
    params: SamplingParams,
    *,
    k: int,
    ks: list[int],
    template: str,
    scorer: RewardScorer | Mapping[str, RewardScorer],
    out_dir: Path,
    batch_size: int | None = None,
    progress: bool = True,
    generate_fn: GenerateFn | None = None,
    chat: bool = False,
    chat_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` on every suite; write ``<suite>.jsonl`` files and ``metrics.json`` in ``out_dir``.

    ``scorer``: one scorer for every suite, or one per suite name (each suite judged by the reward of its
    verifier kind: :mod:`creditlab.rewards.routing`). ``chat`` / ``chat_kwargs``: prompts through the
    tokenizer's chat template (hub models). params: how the k samples are decoded (temperature / top-p, length, stop
    tokens: ``eos_id`` None = the tokenizer's EOS); its seed is the evaluation's, each suite decodes with its own
    (:func:`suite_seed`).

    suites: suite name -> records (dicts with at least ``id``, ``question``, ``answer``).
    Per question: one greedy decode and ``k`` samples with ``params``. Returns (and
    writes) ``{"suites": {name: evaluate_suite(...)}, "average": average_over_suites(...), "k", "ks",
    "settings": {...}, "reward_stats": {...}}``; all accuracies are fractions in [0, 1]. The model
    is run in eval mode and restored to its previous mode afterwards.

    ``generate_fn`` (see :class:`GenerateFn`) replaces the plain sampler; ``model`` may then be None
    (the decoder handles its own models). Its decode counters go to the jsonl rows and the suite
    summaries (see the module docstring), its ``settings`` to ``settings.decoder``.
    """
    if model is None and generate_fn is None:
        raise ValueError("evaluate_model needs a model or a generate_fn")
    _check_args(suites, k, ks)
    scorers = dict(scorer) if isinstance(scorer, Mapping) else {name: scorer for name in suites}
    if set(scorers) != set(suites):
        raise ValueError(f"one scorer per suite: suites {sorted(suites)}, scorers {sorted(scorers)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    was_training = model is not None and model.training
    if model is not None:
        model.eval()
    results: dict[str, dict[str, Any]] = {}
    try:
        bar = progress_bar(len(suites), "eval suites", enabled=progress, every_s=0)
        for name in suites:
            results[name] = evaluate_suite(
                model,
                tokenizer,
                name,
                suites[name],
                replace(params, seed=suite_seed(params.seed, name)),
                k=k,
                ks=ks,
                template=template,
                scorer=scorers[name],
                out_dir=out_dir,
                batch_size=batch_size,
                progress=progress,
                generate_fn=generate_fn,
                chat=chat,
                chat_kwargs=chat_kwargs,
            )
            bar.set_postfix(suite=name, greedy=f"{results[name]['metrics']['greedy']['mean']:.3f}")
            bar.update(1)
        bar.close()
    finally:
        if model is not None:
            model.train(was_training)
    result = {
        "suites": results,
        "average": average_over_suites(results, ks),
        "k": k,
        "ks": list(ks),
        "settings": {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_new_tokens": params.max_new_tokens,
            "seed": params.seed,
            "template": template,
            "chat_template": chat,
            "chat_kwargs": chat_kwargs or {},
            "eos_id": list(params.eos_id) if isinstance(params.eos_id, tuple) else params.eos_id,
            "batch_size": batch_size,
            "reward": _one_or_per_suite({n: sc.reward for n, sc in scorers.items()}),
            "reward_timeout_s": _one_or_per_suite({n: sc.timeout_s for n, sc in scorers.items()}),
            "n_boot": N_BOOT,
            "alpha": ALPHA,
            "decoder": getattr(generate_fn, "settings", None) or {"name": "sampler"},
        },
        "reward_stats": _reward_stats(scorers),
    }
    _write_json_atomic(result, out_dir / "metrics.json")
    return result
