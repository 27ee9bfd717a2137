"""Tests of creditlab.eval.evaluate with a tiny random Qwen3 model and a hand-made model of known outputs."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from types import SimpleNamespace

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

import creditlab.eval.evaluate as evaluate_mod
from creditlab.eval.evaluate import GREEDY_SAMPLE, evaluate_model
from creditlab.eval.metrics import summarize_suite
from creditlab.lm.sampler import SamplingParams
from creditlab.rewards import RewardScorer
from creditlab.stats import pass_at_k

torch.set_num_threads(1)

ROW_FIELDS = {"id", "suite", "sample", "prompt", "response", "pred", "gold", "correct", "score", "n_tokens", "finished"}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level stand-in tokenizer over printable ASCII; BOS prepended on encode."""
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def make_suite(name: str, n: int, offset: int) -> list[dict]:
    return [
        {"id": f"{name}/{i:03d}", "question": f"{10 + i}+{offset}", "answer": str(10 + i + offset), "meta": {}}
        for i in range(n)
    ]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer("math_verify", timeout_s=5.0) as s:
        yield s


@pytest.fixture(scope="module")
def tiny_model(tokenizer) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg)


PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.7, seed=5)
EVAL_KW = dict(k=3, ks=[1, 2, 3], template="tiny")


def test_real_model_writes_complete_consistent_files(tmp_path: Path, tiny_model, tokenizer, scorer) -> None:
    suites = {"alpha": make_suite("alpha", 5, 3), "beta": make_suite("beta", 3, 7)}
    tiny_model.train()
    result = evaluate_model(
        tiny_model,
        tokenizer,
        suites,
        PARAMS,
        scorer=scorer,
        out_dir=tmp_path / "ev",
        batch_size=4,
        progress=False,
        **EVAL_KW,
    )
    assert tiny_model.training  # mode restored
    on_disk = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    assert on_disk["k"] == 3 and on_disk["ks"] == [1, 2, 3]
    assert on_disk["settings"]["top_p"] == 0.7 and on_disk["settings"]["template"] == "tiny"
    assert set(on_disk["average"]) == {"greedy", "avg@3", "pass@1", "pass@2", "pass@3"}
    for name, records in suites.items():
        rows = read_jsonl(tmp_path / "ev" / f"{name}.jsonl")
        assert len(rows) == len(records) * (EVAL_KW["k"] + 1)
        assert all(set(r) == ROW_FIELDS for r in rows)
        assert [r["sample"] for r in rows] == [GREEDY_SAMPLE, 0, 1, 2] * len(records)
        assert [r["id"] for r in rows] == [rec["id"] for rec in records for _ in range(4)]
        for r, rec in zip(rows[::4], records):
            assert r["prompt"] == f"Q: {rec['question']}\nA:" and r["gold"] == rec["answer"]
        for r in rows:
            assert r["suite"] == name
            assert 1 <= r["n_tokens"] <= PARAMS.max_new_tokens
            assert r["correct"] == (r["score"] > 0)
            assert r["n_tokens"] == PARAMS.max_new_tokens or r["finished"]  # stopped early only on EOS
        summary = on_disk["suites"][name]
        pq = summary["per_question"]
        assert summary["n_questions"] == len(records) and pq["n"] == 3
        assert pq["ids"] == [rec["id"] for rec in records]
        assert pq["greedy"] == [int(r["correct"]) for r in rows if r["sample"] == GREEDY_SAMPLE]
        assert pq["c"] == [sum(r["correct"] for r in rows[4 * i + 1 : 4 * i + 4]) for i in range(len(records))]
        sampled = [r for r in rows if r["sample"] != GREEDY_SAMPLE]
        assert summary["mean_response_tokens"] == pytest.approx(np.mean([r["n_tokens"] for r in sampled]))
        assert summary["truncated_frac"] == pytest.approx(np.mean([not r["finished"] for r in sampled]))
        # Sampled responses of a question differ from each other (T=1): the k samples are not copies.
        assert len({r["response"] for r in sampled}) > 1


def test_real_model_is_deterministic_per_suite(tmp_path: Path, tiny_model, tokenizer, scorer) -> None:
    both = {"alpha": make_suite("alpha", 4, 3), "beta": make_suite("beta", 3, 7)}
    evaluate_model(
        tiny_model, tokenizer, both, PARAMS, scorer=scorer, out_dir=tmp_path / "a", progress=False, **EVAL_KW
    )
    evaluate_model(
        tiny_model,
        tokenizer,
        {"beta": both["beta"]},
        PARAMS,
        scorer=scorer,
        out_dir=tmp_path / "b",
        progress=False,
        batch_size=2,
        **EVAL_KW,
    )
    assert read_jsonl(tmp_path / "a" / "beta.jsonl") == read_jsonl(tmp_path / "b" / "beta.jsonl")


class ScriptedGenerate:
    """Stand-in for the sampler: greedy is right on even questions; question q gets c_q = q mod (k+1)
    correct samples (the first c_q copies of its prompt), wrong answers are truncated (no EOS)."""

    def __init__(self, tokenizer, records: list[dict], template: str) -> None:
        self.tok = tokenizer
        self.index = {tuple(tokenizer(f"Q: {r['question']}\nA:")["input_ids"]): q for q, r in enumerate(records)}
        self.golds = [r["answer"] for r in records]

    def correct_counts(self, k: int) -> list[int]:
        return [q % (k + 1) for q in range(len(self.golds))]

    def _ids(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"][1:]  # drop BOS

    def __call__(self, model, prompt_ids, params: SamplingParams, **kwargs) -> SimpleNamespace:
        greedy = params.greedy
        seen: dict[int, int] = {}
        k = max(1, len(prompt_ids) // len(self.golds))
        responses, finished = [], []
        for ids in prompt_ids:
            q = self.index[tuple(ids)]
            j = seen[q] = seen.get(q, -1) + 1
            right = (q % 2 == 0) if greedy else (j < self.correct_counts(k)[q])
            gold = self.golds[q]
            if right:
                responses.append(self._ids(f" {gold} \\boxed{{{gold}}}") + [self.tok.eos_token_id])
            else:
                responses.append(self._ids(f" \\boxed{{{int(gold) + 1}}}"))
            finished.append(right)
        return SimpleNamespace(response_ids=responses, finished=finished)


def test_known_outputs_give_expected_metrics(tmp_path: Path, tokenizer, scorer, monkeypatch) -> None:
    records = make_suite("known", 9, 2)
    k, ks = 4, [1, 2, 4]
    fake = ScriptedGenerate(tokenizer, records, "tiny")
    monkeypatch.setattr(evaluate_mod, "generate", fake)
    params = SamplingParams(max_new_tokens=32, temperature=1.0, top_p=0.7, seed=0)
    result = evaluate_model(
        torch.nn.Linear(1, 1),
        tokenizer,
        {"known": records},
        params,
        k=k,
        ks=ks,
        template="tiny",
        scorer=scorer,
        out_dir=tmp_path,
        progress=False,
    )
    summary = result["suites"]["known"]
    counts = fake.correct_counts(k)
    greedy = [int(q % 2 == 0) for q in range(len(records))]
    assert summary["per_question"]["c"] == counts
    assert summary["per_question"]["greedy"] == greedy
    metrics = summary["metrics"]
    assert metrics["greedy"]["mean"] == pytest.approx(5 / 9)
    assert metrics["avg@4"]["mean"] == pytest.approx(sum(counts) / (k * len(records)))
    for j in ks:
        expected = np.mean([pass_at_k(k, c, j) for c in counts])
        assert metrics[f"pass@{j}"]["mean"] == pytest.approx(expected)
    samples = np.array([[int(j < c) for j in range(k)] for c in counts])
    assert metrics == summarize_suite(np.array(greedy), samples, ks)
    assert summary["truncated_frac"] == pytest.approx(1 - sum(counts) / (k * len(records)))
    rows = read_jsonl(tmp_path / "known.jsonl")
    right = [r for r in rows if r["correct"]]
    assert all(r["pred"] == r["gold"] and r["finished"] and r["score"] == 1.0 for r in right)
    assert all(r["pred"] == str(int(r["gold"]) + 1) for r in rows if not r["correct"])
    # Only one suite: both averages equal the suite's own value.
    assert result["average"]["greedy"]["count"]["mean"] == pytest.approx(5 / 9)
    assert result["average"]["greedy"]["plain"]["mean"] == pytest.approx(5 / 9)


def test_average_over_suites_plain_vs_count(tmp_path: Path, tokenizer, scorer, monkeypatch) -> None:
    small, large = make_suite("small", 2, 1), make_suite("large", 6, 4)
    fake_small, fake_large = ScriptedGenerate(tokenizer, small, "tiny"), ScriptedGenerate(tokenizer, large, "tiny")

    def fake(model, prompt_ids, params, **kw):
        return (fake_small if tuple(prompt_ids[0]) in fake_small.index else fake_large)(model, prompt_ids, params, **kw)

    monkeypatch.setattr(evaluate_mod, "generate", fake)
    params = SamplingParams(max_new_tokens=32, temperature=1.0, top_p=1.0, seed=0)
    result = evaluate_model(
        torch.nn.Linear(1, 1),
        tokenizer,
        {"small": small, "large": large},
        params,
        k=2,
        ks=[1],
        template="tiny",
        scorer=scorer,
        out_dir=tmp_path,
        progress=False,
    )
    # greedy right on even questions: small 1/2, large 3/6 -> both 0.5; use pass@1 instead:
    # c_q = q mod 3 of k=2 -> small: (0 + 1) / 4, large: (0 + 1 + 2 + 0 + 1 + 2) / 12
    s_mean, l_mean = 1 / 4, 6 / 12
    avg = result["average"]["pass@1"]
    assert avg["plain"]["mean"] == pytest.approx((s_mean + l_mean) / 2)
    assert avg["count"]["mean"] == pytest.approx((2 * s_mean + 6 * l_mean) / 8)


def test_bad_arguments_fail_before_decoding(tmp_path: Path, tokenizer, scorer) -> None:
    model = torch.nn.Linear(1, 1)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0)
    kw = dict(template="tiny", scorer=scorer, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="pass@j"):
        evaluate_model(model, tokenizer, {"a": make_suite("a", 2, 1)}, params, k=2, ks=[4], **kw)
    with pytest.raises(ValueError, match="without records"):
        evaluate_model(model, tokenizer, {"a": []}, params, k=2, ks=[1], **kw)
