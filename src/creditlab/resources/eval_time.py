"""What one evaluation job costs in hours, at plan time: vLLM generation and judging, or Paper A's two-engine decoding.

``eval_estimate(run_cfg, suites, cluster, decode=None) -> EvalResources``: the ``evaluate`` job of a run (or its
``evaluate_decode`` job with a selective decoding) on the suites its tables read (``Plan.eval_suites``), from the
run's resolved ``eval`` settings, the suites' catalogue entries (``data.suites``: configs/suites/paper.yaml) and the
cluster's constants (configs/pipeline.yaml ``cluster:``). ``eval_job_minutes`` sizes the rules' SLURM wall time.

Sequences: per suite, questions x (``eval.k`` samples + one greedy), suite after suite (creditlab.eval.evaluate
generates a suite, then judges it). A response averages ``response_fraction`` of ``eval.max_new_tokens`` (math,
code; ``choice_response_fraction`` on multiple-choice suites), a prompt ``prompt_fraction`` of
``trainer.max_prompt_tokens``.

Generation (``evaluate``): one vLLM engine over the job's tensor-parallel GPUs (``eval.vllm.extra``). Decoding is
bound by reading the KV cache: per suite, vLLM holds as many sequences at once as its cache takes at their mean
context (prompt + half a response; at most :data:`VLLM_MAX_NUM_SEQS`), and each decode step of that batch lasts
``decode_step_s``; no faster than the FLOPs (2 x active parameters per token plus causal attention) at ``gen_mfu``,
and no shorter than a suite's longest response (``eval.max_new_tokens`` steps).

Judging: each answer on the job's judging workers (``eval_cores`` - 1: creditlab.jobs.common.judging_workers, the
SLURM profile's cpus_per_task of the evaluate rules): ``judge_answer_s`` per math or multiple-choice answer,
``code_startup_s`` + ``code_test_s`` per test case for code (every test run: LiveCodeBench's runner stops at the
first failure, so this bounds it).

Selective decoding (``evaluate_decode``, creditlab.engines.vllm.extrapolation): two engines stepped one token at a
time over a window of ``eval.batch_size`` sequences (the sampler's default when null), each step two
``LLM.generate`` calls that return top-K log-probs per sequence (K = the decoding's ``top_k_support``; the full
vocabulary when None). A step lasts ``decode_pair_step_s`` plus :data:`LOGPROB_ENTRY_S` per log-prob entry returned;
the job takes (response tokens / window + the longest response) steps per suite, plus judging. Each step resubmits
every context of the window; prefix caching keeps them only while one engine's KV cache (half the job's vLLM share
per GPU, less its weights) holds the window at its mean context: the excess is prefilled again at every step, both
engines, at 2 x active parameters FLOPs per token and ``train_mfu`` (a prefill is compute-bound, like training's
forwards).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditlab.resources.estimate import GB, Cluster
from creditlab.resources.shapes import shape_of

VLLM_MAX_NUM_SEQS = 1024
"""vLLM's default ``max_num_seqs`` for the ``LLM`` class on a GPU of >= 70 GiB (vllm engine/arg_utils.py
``_set_default_args``: 1024; 256 on smaller GPUs): the most sequences one engine decodes at once."""
LOGPROB_ENTRY_S = 1e-6
"""Seconds per log-prob entry a selective decoding step returns (vLLM's FlatLogprobs lists, the torch row the
engine fills per sequence) [ours: ~1 us per entry in Python]; the full view of a 152k vocabulary is ~0.15 s per
sequence per engine per token."""
UNSIZED_QUESTIONS = {"livecodebench-v6": 175}
"""Questions of a catalogue suite with ``n: null`` (its count is not checked at prepare time) [ours: reports of
LiveCodeBench v6's Feb-May 2025 window give ~130-175 problems; the larger]."""
DEFAULT_QUESTIONS = 500
"""Questions of any other suite without ``n`` [ours: MATH-500's size]."""
CODE_TESTS_PER_QUESTION = 60
"""Test cases per code question [LiveCodeBench code_generation README: "hidden test cases (over 59 on average)";
code_generation_lite prunes them, so this bounds its lists]."""
EVAL_JOB_MARGIN = 1.5
"""An evaluation job asks for this many times its estimate (assumed lengths and throughputs), as training jobs."""
EVAL_STARTUP_MINUTES = 20
"""Added to an evaluation job's wall time: vLLM's start (weights from the hub cache, CUDA graphs) and the suites'
loading [ours]."""


@dataclass
class EvalResources:
    """One evaluation job's estimate (hours) and its terms."""

    gpus: int
    suites: list[str]
    sequences: int
    """Generated sequences: questions x (k + 1), over the suites."""
    tokens: float
    """Expected response tokens, over the suites."""
    gen_hours: float
    judge_hours: float
    hours: float
    concurrency: int
    """Sequences decoded at once: vLLM's batch (plain: the largest over the suites), the decoding's window."""
    decode: str | None = None
    notes: list[str] = field(default_factory=list)


def suite_questions(name: str, entry: Mapping[str, Any] | None) -> int:
    """Questions of suite ``name`` from its catalogue entry: its ``sample.n``, else ``n``, else
    :data:`UNSIZED_QUESTIONS` / :data:`DEFAULT_QUESTIONS`."""
    entry = entry or {}
    sample = entry.get("sample") or {}
    if sample.get("n"):
        return int(sample["n"])
    if entry.get("n"):
        return int(entry["n"])
    return UNSIZED_QUESTIONS.get(name, DEFAULT_QUESTIONS)


def judge_seconds(kind: str, answers: int, cluster: Cluster) -> float:
    """CPU seconds to judge ``answers`` answers of a suite of verifier ``kind`` (before dividing over workers)."""
    if kind == "code":
        return answers * (cluster.code_startup_s + CODE_TESTS_PER_QUESTION * cluster.code_test_s)
    return answers * cluster.judge_answer_s


def eval_estimate(
    run_cfg: Mapping[str, Any],
    suites: Sequence[str],
    cluster: Cluster,
    decode: str | None = None,
    top_k_support: int | None = None,
) -> EvalResources:
    """The hours of the evaluation job of ``run_cfg`` (a resolved paper-scale run config) on ``suites`` (names in
    its ``data.suites`` catalogue); ``decode``: the selective decoding's name (``evaluate_decode``, its view
    ``top_k_support``: K or None for the full vocabulary), None for plain generation (``evaluate``)."""
    e, t = run_cfg["eval"], run_cfg["trainer"]
    catalogue = (run_cfg.get("data") or {}).get("suites") or {}
    extra = (e.get("vllm") or {}).get("extra") or {}
    tp = int(extra.get("tensor_parallel_size", 1))
    util = float(extra.get("gpu_memory_utilization", 0.9))
    shape = shape_of(run_cfg)
    per_q = int(e["k"]) + 1  # k samples and the greedy decode
    max_new = int(e["max_new_tokens"])
    p = cluster.prompt_fraction * int(t["max_prompt_tokens"])
    workers = max(1, int(cluster.eval_cores) - 1)
    kinds = {s: str((catalogue.get(s) or {}).get("kind", "math")) for s in suites}
    frac = {
        s: cluster.choice_response_fraction if k == "multiple_choice" else cluster.response_fraction
        for s, k in kinds.items()
    }
    resp = {s: f * max_new for s, f in frac.items()}  # mean response tokens per suite
    seqs = {s: suite_questions(s, catalogue.get(s)) * per_q for s in suites}
    n_seqs, tokens = sum(seqs.values()), sum(seqs[s] * resp[s] for s in suites)
    judge_s = sum(judge_seconds(kinds[s], seqs[s], cluster) for s in suites)
    notes = []
    # one engine's KV cache per GPU: its share of the GPU less its weight shard (two engines: half the share each)
    engines = 2 if decode else 1
    weights = 2 * shape.params() / tp
    pool = util / engines * cluster.gpu_mem_gb * GB - weights
    kv_per_tok = shape.kv_bytes_per_token() * math.ceil(shape.num_key_value_heads / tp) / shape.num_key_value_heads
    cache_tokens = max(pool, 0) / kv_per_tok
    gen_s, conc = 0.0, 1
    if decode is None:
        lk, hw, flops_s = shape.kv_layers, shape.attn_width, tp * cluster.peak_tflops * 1e12 * cluster.gen_mfu
        for s in suites:
            n, r = seqs[s], resp[s]
            c = int(max(1, min(VLLM_MAX_NUM_SEQS, cache_tokens // (p + r / 2), n)))
            flops = n * (2 * shape.active_params() * (p + r) + 4 * lk * hw * (p * r + r * r / 2) + 2 * lk * hw * p * p)
            gen_s += max(n * r * cluster.decode_step_s / c, flops / flops_s)
            gen_s += max_new * cluster.decode_step_s  # the suite's longest response
            conc = max(conc, c)
    else:
        from creditlab.lm.sampler import DEFAULT_BATCH_SIZE

        conc = int(e.get("batch_size") or DEFAULT_BATCH_SIZE)
        entries = shape.vocab_size if top_k_support is None else int(top_k_support)
        step_s = cluster.decode_pair_step_s + 2 * conc * entries * LOGPROB_ENTRY_S
        prefill_s = 2 * 2 * shape.active_params() / (tp * cluster.peak_tflops * 1e12 * cluster.train_mfu)
        for s in suites:
            n, r = seqs[s], resp[s]
            if not n:
                continue
            w = min(conc, n)
            # the contexts of a window an engine's cache cannot hold are prefilled again at every step
            overflow = max(0.0, w * (p + r / 2) - cache_tokens)
            gen_s += (n * r / w + max_new) * (step_s + overflow * prefill_s)
            if overflow:
                window_fit = int(cache_tokens // (p + r / 2))
                notes.append(
                    f"{s}: a window of {w} sequences at ~{p + r / 2:,.0f} tokens of context each exceeds one engine's "
                    f"KV cache (~{cache_tokens:,.0f} tokens): ~{overflow:,.0f} tokens prefilled again per step; "
                    f"eval.batch_size <= {window_fit} fits"
                )
    gen_h, judge_h = gen_s / 3600, judge_s / workers / 3600
    return EvalResources(
        gpus=tp,
        suites=list(suites),
        sequences=n_seqs,
        tokens=tokens,
        gen_hours=gen_h,
        judge_hours=judge_h,
        hours=gen_h + judge_h,
        concurrency=conc,
        decode=decode,
        notes=notes,
    )


def eval_refusal(res: EvalResources, cluster: Cluster) -> str | None:
    """Why an evaluation job cannot run in one allocation (its estimate and :data:`EVAL_STARTUP_MINUTES` past
    ``site_max_hours``: an evaluation does not checkpoint and requeue), with the numbers and what to change; None
    when it fits (its wall time, with :data:`EVAL_JOB_MARGIN`, is then capped at the site's limit)."""
    if res.hours * 60 + EVAL_STARTUP_MINUTES <= cluster.site_max_hours * 60:
        return None
    what = "selective decoding" if res.decode else "evaluation"
    change = (
        "a window (eval.batch_size) that one engine's KV cache holds ("
        + ("; ".join(res.notes) or "it does")
        + "), a smaller eval.k or eval.max_new_tokens, or more tensor-parallel GPUs"
        if res.decode
        else "more tensor-parallel GPUs (eval.vllm.extra.tensor_parallel_size, now "
        f"{res.gpus}: a larger KV cache decodes more sequences at once), fewer samples (eval.k) or a shorter "
        "eval.max_new_tokens, or fewer suites"
    )
    return (
        f"its {what} ({', '.join(res.suites)}: {res.sequences:,} sequences, ~{res.tokens / 1e9:.2f}B tokens, "
        f"{res.concurrency} at once on {res.gpus} GPU(s)) takes ~{res.hours:.0f} h ({res.gen_hours:.0f} h "
        f"generation, {res.judge_hours:.1f} h judging) > the site's {cluster.site_max_hours:.0f} h job limit "
        f"(cluster.site_max_hours; an evaluation does not requeue); change: {change}"
    )


def _wanted_minutes(res: EvalResources) -> int:
    return math.ceil(res.hours * EVAL_JOB_MARGIN * 60) + EVAL_STARTUP_MINUTES


def eval_job_minutes(res: EvalResources, cluster: Cluster) -> int:
    """SLURM wall time of an evaluation job (sbatch -t, minutes): :data:`EVAL_JOB_MARGIN` x its estimate plus
    :data:`EVAL_STARTUP_MINUTES`, within the site's longest job (``cluster.site_max_hours``; a longer one is refused
    at plan time, :func:`eval_refusal`)."""
    return int(min(_wanted_minutes(res), cluster.site_max_hours * 60))


def eval_job_key(run_key: str, decode: str | None) -> str:
    """An evaluation job's key: the run's key (``evaluate``), ``<run key>/decode-<name>`` (``evaluate_decode``), as
    its log path names it."""
    return run_key if decode is None else f"{run_key}/decode-{decode}"


def plan_evals(
    jobs: Sequence[tuple[str, str | None, Sequence[str], int | None]],
    configs: Mapping[str, Mapping[str, Any]],
    cluster: Cluster,
) -> tuple[dict[str, EvalResources], dict[str, str]]:
    """The estimates of a plan's evaluation jobs, ``(run key, decoding or None, suites, top_k_support)`` each, from
    their runs' resolved ``configs``: (job key -> EvalResources, job key -> why it is refused, :func:`eval_refusal`);
    job keys: :func:`eval_job_key`."""
    out: dict[str, EvalResources] = {}
    refused: dict[str, str] = {}
    for run_key, decode, suites, top_k in jobs:
        key = eval_job_key(run_key, decode)
        out[key] = res = eval_estimate(configs[run_key], suites, cluster, decode, top_k)
        why = eval_refusal(res, cluster)
        if why:
            refused[key] = why
    return out, refused
