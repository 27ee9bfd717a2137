"""The evaluation jobs' time model (creditlab.resources.eval_time): its arithmetic on a hand-computed case, the
paper-scale evaluation issue 30 names (MMLU-Pro and LiveCodeBench past the old 240 minutes), the rules' wall time
within the site's limit, and the plan's refusal of an evaluation longer than that."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from creditlab.plan import build_plan
from creditlab.resources import eval_estimate, eval_job_key, eval_job_minutes, load_cluster
from creditlab.resources.eval_time import CODE_TESTS_PER_QUESTION, LOGPROB_ENTRY_S, eval_refusal

REPO = Path(__file__).resolve().parents[1]
CLUSTER = dataclasses.replace(
    load_cluster(),
    response_fraction=0.5,
    choice_response_fraction=0.1,
    prompt_fraction=0.25,
    decode_step_s=0.02,
    peak_tflops=1e6,  # generation bound by decode steps, not FLOPs
    eval_cores=8,
    judge_answer_s=0.1,
    code_startup_s=1.0,
    code_test_s=0.5,
    decode_pair_step_s=0.2,
)
ARCH = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 100,
}
SUITES = {
    "m": {"kind": "math", "n": 10},
    "c": {"kind": "code", "n": 2},
    "q": {"kind": "multiple_choice", "n": 999, "sample": {"n": 5}},  # sample.n wins over n
}


def _cfg(batch_size=None) -> dict:
    """A toy run: k = 3 samples (+ greedy), 1000-token answers, prompts of 400 tokens, one GPU."""
    return {
        "scale": "toy",
        "model": {"name": "toy", "arch": ARCH},
        "trainer": {"max_prompt_tokens": 400},
        "data": {"suites": SUITES},
        "eval": {
            "k": 3,
            "max_new_tokens": 1000,
            "batch_size": batch_size,
            "vllm": {"extra": {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.8}},
        },
    }


def test_generation_and_judging_arithmetic():
    """Per suite: questions x 4 sequences; math and code answers of 500 tokens, multiple choice of 100; the KV cache
    holds every sequence, so each suite decodes at once: its tokens x 20 ms / its sequences, plus its longest
    answer's 1000 steps of 20 ms. Judging on 7 workers: 0.1 s per math / choice answer, 1 + 60 x 0.5 s per code
    answer."""
    res = eval_estimate(_cfg(), ["m", "c", "q"], CLUSTER)
    assert res.sequences == 40 + 8 + 20
    assert res.tokens == 40 * 500 + 8 * 500 + 20 * 100
    gen_s = (40 * 500 * 0.02 / 40 + 20) + (8 * 500 * 0.02 / 8 + 20) + (20 * 100 * 0.02 / 20 + 20)
    assert res.gen_hours * 3600 == pytest.approx(gen_s)  # 30 + 30 + 22 s
    judge_s = (40 * 0.1 + 8 * (1.0 + CODE_TESTS_PER_QUESTION * 0.5) + 20 * 0.1) / 7
    assert res.judge_hours * 3600 == pytest.approx(judge_s)
    assert res.hours == pytest.approx(res.gen_hours + res.judge_hours)
    assert res.concurrency == 40 and res.gpus == 1
    # a slow GPU: FLOP-bound (2 x active parameters per token, causal attention), the tail unchanged
    slow = dataclasses.replace(CLUSTER, peak_tflops=1e-6, gen_mfu=0.5)
    from creditlab.resources.shapes import shape_of

    shape, p, r = shape_of(_cfg()), 100.0, 500.0
    lk, hw = shape.kv_layers, shape.attn_width
    flops = 40 * (2 * shape.active_params() * (p + r) + 4 * lk * hw * (p * r + r * r / 2) + 2 * lk * hw * p * p)
    one = eval_estimate(_cfg(), ["m"], slow)
    assert one.gen_hours * 3600 == pytest.approx(flops / (1e-6 * 1e12 * 0.5) + 20)


def test_selective_decoding_arithmetic():
    """Two engines stepped a token at a time over a window of 16: 40 x 500 / 16 + 1000 steps, each 0.2 s plus
    2 engines x 16 sequences x 50 log-probs x 1 us; a full-vocabulary view returns 100 each."""
    res = eval_estimate(_cfg(batch_size=16), ["m"], CLUSTER, decode="extrap", top_k_support=50)
    steps = 40 * 500 / 16 + 1000
    assert res.gen_hours * 3600 == pytest.approx(steps * (0.2 + 2 * 16 * 50 * LOGPROB_ENTRY_S))
    assert res.concurrency == 16 and not res.notes
    full = eval_estimate(_cfg(batch_size=16), ["m"], CLUSTER, decode="extrap", top_k_support=None)
    assert full.gen_hours * 3600 == pytest.approx(steps * (0.2 + 2 * 16 * 100 * LOGPROB_ENTRY_S))
    # a GPU whose cache cannot hold the window: its excess is prefilled again at every step, and said
    tiny = dataclasses.replace(CLUSTER, gpu_mem_gb=0.001, gpu_reserved_gb=0.0)
    over = eval_estimate(_cfg(batch_size=16), ["m"], tiny, decode="extrap", top_k_support=50)
    assert over.gen_hours > res.gen_hours and "prefilled again per step" in over.notes[0]
    assert "eval.batch_size <=" in over.notes[0]


PIPELINE = {"scale": "paper", "seeds": [0], "results": "results"}


@lru_cache(maxsize=None)
def _plan(papers: tuple[str, ...], **cluster):
    return build_plan({**PIPELINE, "papers": list(papers), **({"cluster": cluster} if cluster else {})})


def test_mmlu_pro_and_livecodebench_need_more_than_240_minutes():
    """Issue 30: DelTA's transfer evaluation of Qwen3-8B (its math suites, GPQA-D, MMLU-Pro: 12,032 questions x 17
    samples, LiveCodeBench v6 with code execution) needs far more than the 240 minutes the profile gave every
    evaluation; the rule's wall time now covers the estimate and stays within the site's limit; the other jobs'
    never exceed it either."""
    plan = _plan(("delta",))
    res = plan.eval_resources["paper/qwen3-8b-base/delta/s0"]
    assert {"mmlu-pro", "livecodebench-v6"} <= set(res.suites)
    assert res.sequences >= 12032 * 17
    assert res.hours * 60 > 240 and res.judge_hours > 1  # 175 x 17 LiveCodeBench answers' tests on 7 workers
    minutes = eval_job_minutes(res, plan.cluster)
    assert res.hours * 60 < minutes <= plan.cluster.site_max_hours * 60
    assert all(
        eval_job_minutes(r, plan.cluster) <= plan.cluster.site_max_hours * 60 for r in plan.eval_resources.values()
    )
    lines = plan.resource_lines()
    assert any(line.startswith("paper/qwen3-8b-base/delta/s0 ") and line.endswith(" yes") for line in lines)


def test_plan_refuses_an_evaluation_longer_than_the_site_allows():
    """On a site whose jobs last at most 12 h, the transfer evaluations are refused with their numbers and what to
    change; the table reading them is not built and the plan says why; no job's wall time passes the limit."""
    plan = _plan(("delta",), site_max_hours=12)
    key = eval_job_key("paper/qwen3-8b-base/delta/s0", None)
    why = plan.refused_evals[key]
    assert "> the site's 12 h job limit" in why and "tensor_parallel_size" in why and "eval.k" in why
    assert ("delta", "transfer") in plan.refused_tables and ("delta", "transfer") not in plan.tables
    assert any(n.startswith("table delta/transfer reads runs refused") and key in n for n in plan.notes())
    assert all(eval_job_minutes(r, plan.cluster) <= 12 * 60 for r in plan.eval_resources.values())
    assert eval_refusal(plan.eval_resources[key], plan.cluster) == why
    assert any(line.startswith(key + " ") and line.endswith(" NO") for line in plan.resource_lines())


def test_profile_leaves_the_evaluations_wall_time_to_the_rules():
    """The SLURM profile sets no runtime for the evaluate rules (set-resources would override the rule's estimate),
    and its cpus_per_task is the cluster's eval_cores the judging is sized from."""
    prof = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    for rule in ("evaluate", "evaluate_decode"):
        assert "runtime" not in prof["set-resources"][rule]
        assert prof["set-resources"][rule]["cpus_per_task"] == load_cluster().eval_cores
    text = (REPO / "workflow/rules/evaluate.smk").read_text()
    assert "runtime=eval_runtime" in text and "runtime=decode_runtime" in text
