"""Tests of the batched KV-cache sampler (creditlab.lm.sampler) on a random tiny Qwen3."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import dataclasses  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import creditlab.lm.sampler as sampler_module  # noqa: E402
from creditlab.lm.sampler import (  # noqa: E402
    ATTN_IMPL,
    DecodeState,
    SamplingParams,
    decode_attention_enabled,
    filter_logits,
    generate,
    generate_with,
    inverse_cdf,
    left_pad,
    nucleus,
)
from creditlab.models.tiny import build_model  # noqa: E402

ARCH = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
)
VOCAB, PAD, BOS, EOS = 40, 0, 1, 2
NO_EOS = -1  # an id that is never generated
torch.set_num_threads(1)


def _model(seed: int) -> torch.nn.Module:
    return build_model(ARCH, VOCAB, PAD, BOS, EOS, seed=seed).eval()


@pytest.fixture(scope="module")
def model():
    return _model(0)


def _prompts(n: int, lo: int = 3, hi: int = 14, seed: int = 0) -> list[list[int]]:
    """n prompts of random lengths in [lo, hi], BOS then ids in [3, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [[BOS] + torch.randint(3, VOCAB, (k - 1,), generator=g).tolist() for k in lengths]


def _next_logits(model, prompt: list[int]) -> torch.Tensor:
    """Next-token logits [V] after ``prompt`` from a plain full forward (no cache, no padding)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].float()


def _truncate_at(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square of counts [V] against probs [V]; bins with expected < 5 are pooled."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    if exp[-1] < 5:  # pool too small to be its own bin: merge it into the smallest big bin
        j = int(exp[:-1].argmin())
        obs[j] += obs[-1]
        exp[j] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def _chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) (Wilson-Hilferty; z = 3.719 <-> p = 1e-4)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _first_token_counts(model, prompt: list[int], n: int, seed: int = 0, **kw) -> torch.Tensor:
    gen = generate(model, [prompt] * n, SamplingParams(max_new_tokens=1, eos_id=NO_EOS, seed=seed, **kw))
    first = torch.tensor([r[0] for r in gen.response_ids])
    return torch.bincount(first, minlength=VOCAB).double()


def _eos_hit_by_some_rows(model, prompts: list[list[int]], max_new: int) -> int:
    """A token that greedy decoding emits in some rows but not in others (to use as EOS)."""
    free = generate(model, prompts, SamplingParams(max_new_tokens=max_new, eos_id=NO_EOS, greedy=True)).response_ids
    rows_with = {t: sum(t in r for r in free) for t in range(3, VOCAB)}
    return max((t for t in rows_with if 0 < rows_with[t] < len(prompts)), key=lambda t: rows_with[t])


# ------------------------------------------------------------------------------------------------ greedy
def test_greedy_matches_hf_generate(model):
    prompts = _prompts(12)
    eos = _eos_hit_by_some_rows(model, prompts, 24)
    ours = generate(model, prompts, SamplingParams(max_new_tokens=24, eos_id=eos, greedy=True))

    ids, mask = left_pad(prompts, PAD)
    with torch.no_grad():
        hf = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=PAD
        )
    hf_rows = [_truncate_at(row, eos) for row in hf[:, ids.shape[1] :].tolist()]  # HF pads after EOS
    assert ours.response_ids == hf_rows
    assert ours.finished == [eos in r for r in hf_rows]
    assert any(ours.finished) and not all(ours.finished)
    assert all(len(r) == 24 for r, done in zip(ours.response_ids, ours.finished) if not done)


def test_greedy_batched_equals_each_prompt_alone(model):
    prompts = _prompts(9, lo=2, hi=20, seed=1)
    params = SamplingParams(max_new_tokens=16, eos_id=NO_EOS, greedy=True)
    batched = generate(model, prompts, params)
    alone = [generate(model, [p], params).response_ids[0] for p in prompts]
    assert batched.response_ids == alone
    assert batched.prompt_ids == prompts


def test_greedy_step_logits_match_full_forward(model):
    """The cached logits at every step equal a full forward over prompt + generated tokens."""
    prompts = _prompts(4, seed=2)
    ids, mask = left_pad(prompts, PAD)
    state = DecodeState(model)
    gen = generate(model, prompts, SamplingParams(max_new_tokens=6, eos_id=NO_EOS, greedy=True))
    with torch.no_grad(), decode_attention_enabled(model):
        logits = state.prefill(ids, mask, max_new_tokens=6)
        for t in range(6):
            expected = torch.stack([_next_logits(model, p + r[:t]) for p, r in zip(prompts, gen.response_ids)])
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
            logits = state.step(torch.tensor([r[t] for r in gen.response_ids]))


# ------------------------------------------------------------------------------------------------ EOS
def test_eos_stops_row_and_is_included(model):
    prompts = _prompts(40, seed=3)
    free = generate(model, prompts, SamplingParams(max_new_tokens=30, eos_id=NO_EOS, seed=7))
    gen = generate(model, prompts, SamplingParams(max_new_tokens=30, eos_id=EOS, seed=7))
    assert any(gen.finished) and not all(gen.finished)
    for resp, done, full in zip(gen.response_ids, gen.finished, free.response_ids):
        assert EOS not in resp[:-1]  # nothing generated after EOS
        assert done == (resp[-1] == EOS)
        assert done or len(resp) == 30
        # same per-(prompt, step) random stream: stopping at EOS truncates the EOS-free sample
        assert resp == _truncate_at(full, EOS)


def test_all_rows_done_early_and_zero_tokens(model):
    prompts = _prompts(3, seed=4)
    first = generate(model, prompts, SamplingParams(max_new_tokens=1, eos_id=NO_EOS, greedy=True)).response_ids
    eos = first[0][0]
    gen = generate(model, prompts[:1], SamplingParams(max_new_tokens=50, eos_id=eos, greedy=True))
    assert gen.response_ids == [[eos]] and gen.finished == [True]
    empty = generate(model, prompts, SamplingParams(max_new_tokens=0, eos_id=EOS))
    assert empty.response_ids == [[], [], []] and empty.finished == [False] * 3
    assert generate(model, [], SamplingParams(max_new_tokens=5, eos_id=EOS)).response_ids == []


@pytest.mark.parametrize("fraction", [1e-9, 0.5, 2.0])  # compact at every EOS, sometimes, never
def test_row_compaction_does_not_change_outputs(model, monkeypatch, fraction):
    prompts = _prompts(24, seed=13)
    params = SamplingParams(max_new_tokens=25, eos_id=EOS, seed=5)
    reference = generate(model, prompts, params)
    monkeypatch.setattr(sampler_module, "COMPACT_FRACTION", fraction)
    assert generate(model, prompts, params) == reference
    assert 3 < sum(reference.finished) < 21


def test_sampling_params_stop_tokens_and_padding_id(model, monkeypatch):
    """eos_id: one id, several (a list kept as a tuple) or None (no stop token); the padding id is not an input."""
    params = SamplingParams(max_new_tokens=3, eos_id=[EOS, 5])
    assert params.eos_id == (EOS, 5) and params.stop_ids == (EOS, 5) and params.length() == 3
    assert SamplingParams(eos_id=EOS).stop_ids == (EOS,) and SamplingParams().stop_ids == ()
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams().length()
    with pytest.raises(TypeError):
        SamplingParams(True)  # keyword-only
    prompts = _prompts(10, lo=2, hi=16, seed=14)
    free = generate(model, prompts, SamplingParams(max_new_tokens=15, seed=2))  # eos_id None
    assert free == generate(model, prompts, SamplingParams(max_new_tokens=15, eos_id=NO_EOS, seed=2))
    assert not any(free.finished) and all(len(r) == 15 for r in free.response_ids)
    stopped = generate(model, prompts, SamplingParams(max_new_tokens=15, eos_id=EOS, seed=2))
    assert any(stopped.finished) and not all(stopped.finished)
    # prompts are left-padded (and finished rows fed) with PAD_ID: any id of the vocabulary gives the same outputs
    monkeypatch.setattr(sampler_module, "PAD_ID", VOCAB - 1)
    assert generate(model, prompts, SamplingParams(max_new_tokens=15, eos_id=EOS, seed=2)) == stopped


# ------------------------------------------------------------------------------------------------ randomness
def test_sampling_is_reproducible_and_batch_size_invariant(model):
    prompts = _prompts(20, seed=5)
    params = SamplingParams(max_new_tokens=20, eos_id=EOS, temperature=1.2, top_p=0.9, seed=11)
    a = generate(model, prompts, params)
    b = generate(model, prompts, params)
    c = generate(model, prompts, dataclasses.replace(params, seed=12))
    d = generate(model, prompts, params, batch_size=3)
    assert a == b
    assert a.response_ids != c.response_ids
    assert d == a  # randomness is keyed by (prompt index, step), not by batch


def test_first_token_frequencies_match_tempered_softmax(model):
    prompt = _prompts(1, seed=6)[0]
    probs = torch.softmax(_next_logits(model, prompt).double() / 0.7, -1)
    counts = _first_token_counts(model, prompt, 6000, temperature=0.7)
    stat, df = _chi2_stat(counts, probs)
    assert stat < _chi2_critical(df)
    # power check: the untempered distribution is rejected by the same test
    stat_wrong, df_wrong = _chi2_stat(counts, torch.softmax(_next_logits(model, prompt).double(), -1))
    assert stat_wrong > _chi2_critical(df_wrong)


def test_second_token_distribution_through_the_cache(model):
    prompt = _prompts(1, seed=8)[0]
    gen = generate(model, [prompt] * 6000, SamplingParams(max_new_tokens=2, eos_id=NO_EOS, seed=3))
    first = torch.tensor([r[0] for r in gen.response_ids])
    a = int(torch.bincount(first).argmax())
    second = torch.tensor([r[1] for r in gen.response_ids if r[0] == a])
    counts = torch.bincount(second, minlength=VOCAB).double()
    stat, df = _chi2_stat(counts, torch.softmax(_next_logits(model, prompt + [a]).double(), -1))
    assert stat < _chi2_critical(df)


@pytest.mark.parametrize("top_p,top_k", [(0.7, 0), (1.0, 6), (0.8, 10)])
def test_top_p_top_k_sample_only_the_nucleus(model, top_p, top_k):
    prompt = _prompts(1, seed=9)[0]
    logits = _next_logits(model, prompt)
    params = SamplingParams(temperature=1.3, top_p=top_p, top_k=top_k)
    kept = torch.isfinite(_hf_warped(logits[None], params))[0]
    assert 1 < int(kept.sum()) < VOCAB
    counts = _first_token_counts(model, prompt, 5000, temperature=1.3, top_p=top_p, top_k=top_k)
    assert counts[~kept].sum() == 0
    probs = torch.softmax((logits / 1.3).masked_fill(~kept, float("-inf")).double(), -1)
    stat, df = _chi2_stat(counts, probs)
    assert stat < _chi2_critical(df)


def _hf_warped(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """HF's temperature -> top-k -> top-p warpers on logits [B, V] (removed tokens at -inf)."""
    out = TemperatureLogitsWarper(params.temperature)(None, logits)
    if params.top_k:
        out = TopKLogitsWarper(params.top_k)(None, out)
    if params.top_p < 1:
        out = TopPLogitsWarper(params.top_p)(None, out)
    return out


@pytest.mark.parametrize("top_p,top_k", [(0.5, 0), (0.9, 0), (0.95, 7), (1.0, 3), (0.3, 12)])
def test_filters_equal_hf_warpers(top_p, top_k):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, VOCAB, generator=g) * 3
    logits[:8, :5] = 2.0  # ties
    logits[8] = float("-inf")
    logits[8, [3, 9, 17, 30]] = 1.0  # exact cumulative mass 0.25, 0.5, 0.75: HF removes cum <= 1 - top_p
    params = SamplingParams(temperature=0.8, top_p=top_p, top_k=top_k)
    ours = filter_logits(logits, params)
    if top_p < 1:
        sorted_logits, order = nucleus(ours, top_p)
        ours = torch.full_like(ours, float("-inf")).scatter(1, order, sorted_logits)
    expected = _hf_warped(logits, params)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(expected))
    torch.testing.assert_close(ours[torch.isfinite(ours)], expected[torch.isfinite(expected)])


def test_inverse_cdf_never_picks_zero_probability_entries():
    probs = torch.tensor([[0.0, 0.0, 0.3, 0.0, 0.7, 0.0], [0.0, 0.5, 0.0, 0.5, 0.0, 0.0]])
    below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    assert inverse_cdf(probs, torch.zeros(2)).tolist() == [2, 1]
    assert inverse_cdf(probs, torch.full((2,), float(below_one))).tolist() == [4, 3]
    assert inverse_cdf(probs, torch.tensor([0.3, 0.5])).tolist() == [4, 3]  # boundaries go right
    assert inverse_cdf(probs * 7.0, torch.tensor([0.29, 0.49])).tolist() == [2, 1]  # unnormalised


# ------------------------------------------------------------------------------------------------ multi-model
def test_generate_with_two_states(model):
    other = _model(1)
    prompts = _prompts(10, seed=10)
    params = SamplingParams(temperature=0.9, max_new_tokens=20, eos_id=EOS, seed=4)
    second_only = generate_with([DecodeState(model), DecodeState(other)], lambda ls: ls[1], prompts, params)
    assert second_only == generate(other, prompts, params)

    def mix(ls: list[torch.Tensor]) -> torch.Tensor:
        lp_a, lp_b = (torch.log_softmax(x, -1) for x in ls)
        return lp_a + 0.5 * (lp_a - lp_b)

    mixed = generate_with(
        [DecodeState(model), DecodeState(other)], mix, prompts, dataclasses.replace(params, greedy=True)
    )
    # reference: recompute the mixed argmax with full forwards on the chosen prefix
    for p, r in zip(prompts, mixed.response_ids):
        for t, tok in enumerate(r):
            logits = mix([_next_logits(model, p + r[:t])[None], _next_logits(other, p + r[:t])[None]])
            assert int(logits.argmax()) == tok


# ------------------------------------------------------------------------------------------------ misc
def test_model_attention_restored_and_bad_args(model):
    before = model.config._attn_implementation
    assert before != ATTN_IMPL
    params = SamplingParams(max_new_tokens=3, eos_id=EOS)
    generate(model, _prompts(2), params, progress=True)
    assert model.config._attn_implementation == before
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(max_new_tokens=3, eos_id=EOS, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=3, eos_id=EOS, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(max_new_tokens=3, eos_id=EOS, top_k=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=-1, eos_id=EOS)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, _prompts(2), SamplingParams(eos_id=EOS))  # a decoder needs a length
    with pytest.raises(ValueError):
        generate(model, [[BOS], []], params)
    assert model.config._attn_implementation == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(model):
    prompts = _prompts(8, seed=12)
    greedy = SamplingParams(max_new_tokens=12, eos_id=NO_EOS, greedy=True)
    cpu = generate(model, prompts, greedy)
    gpu_model = _model(0).cuda()
    gpu = generate(gpu_model, prompts, greedy)
    assert gpu.response_ids == cpu.response_ids
    sampled = generate(gpu_model, prompts, SamplingParams(max_new_tokens=12, eos_id=EOS, seed=1))
    assert all(len(r) <= 12 for r in sampled.response_ids)
