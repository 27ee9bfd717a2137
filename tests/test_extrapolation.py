"""Tests of selective extrapolation decoding (creditlab.decoding.extrapolation / criteria).

References are direct readings: per-token Python loops for the extrapolated distribution and the
criteria, a brute-force per-token mixture for one decoding step, and a teacher-forced decoder (full
forwards without cache, one row and one step at a time) for whole sequences.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from scipy.stats import chisquare  # noqa: E402

from creditlab.data.tokenizer import build_tokenizer  # noqa: E402
from creditlab.decoding import criteria as crit  # noqa: E402
from creditlab.decoding.extrapolation import (  # noqa: E402
    CRITERION,
    PROPOSAL,
    RESAMPLE,
    extrapolated_logprobs,
    make_rule,
    make_selective_generate_fn,
    selective_generate,
    top_k_support,
)
from creditlab.eval.evaluate import evaluate_model  # noqa: E402
from creditlab.lm.sampler import SamplingParams, choose_tokens, draw_uniforms, generate  # noqa: E402
from creditlab.models.tiny import build_model  # noqa: E402
from creditlab.rewards import RewardScorer  # noqa: E402

torch.set_num_threads(1)

ARCH = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
)
VOCAB, PAD, BOS, EOS = 27, 0, 1, 2
INF = math.inf


def _model(seed: int, vocab: int = VOCAB, scale: float = 3.0) -> torch.nn.Module:
    """Random tiny Qwen3 whose (tied) output embedding is scaled so its distributions are peaked."""
    model = build_model(ARCH, vocab, PAD, BOS, EOS, seed=seed).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    return _model(0)


@pytest.fixture(scope="module")
def rl() -> torch.nn.Module:
    return _model(1)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g).tolist()
    return [[BOS] + torch.randint(3, VOCAB, (k,), generator=g).tolist() for k in lengths]


def _next_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Next-token logits [V] after ``ids`` from a plain full forward (no cache, no padding)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def _rand_logp(rows: int, vocab: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(scale * torch.randn(rows, vocab, generator=g, dtype=torch.float64), -1)


# ------------------------------------------------------------------------------------------- distribution
def test_extrapolated_logprobs_direct_reading() -> None:
    lp_rl, lp_base = _rand_logp(4, 9, 0), _rand_logp(4, 9, 1)
    for gamma in (0.0, 0.1, 0.7, -0.5):
        out = extrapolated_logprobs(lp_rl, lp_base, gamma)
        assert torch.logsumexp(out, -1) == pytest.approx([0.0] * 4, abs=1e-12)
        for i in range(4):
            w = [(1 + gamma) * float(lp_rl[i, v]) - gamma * float(lp_base[i, v]) for v in range(9)]
            z = math.log(sum(math.exp(x) for x in w))
            assert out[i].tolist() == pytest.approx([x - z for x in w], abs=1e-12)
            # probability space: pi_RL reweighted by exp(gamma * Δlog p)
            p = [math.exp(float(lp_rl[i, v]) + gamma * float(lp_rl[i, v] - lp_base[i, v])) for v in range(9)]
            assert out[i].exp().tolist() == pytest.approx([x / sum(p) for x in p], abs=1e-12)
    assert torch.equal(extrapolated_logprobs(lp_rl, lp_base, 0.0), torch.log_softmax(lp_rl, -1))
    # unnormalised inputs: any per-row constant cancels
    assert torch.allclose(
        extrapolated_logprobs(lp_rl + 3.0, lp_base - 1.0, 0.2), extrapolated_logprobs(lp_rl, lp_base, 0.2), atol=1e-12
    )


def _direct_kl(p: list[float], q: list[float]) -> float:
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q) if a > 0)


def test_criteria_against_direct_per_token_computation() -> None:
    rows, vocab = 6, 11
    lp_rl, lp_base = _rand_logp(rows, vocab, 2), _rand_logp(rows, vocab, 3)
    token = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(4))
    u = torch.rand(rows, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for i in range(rows):
        p, q = lp_rl[i].exp().tolist(), lp_base[i].exp().tolist()
        m = [(a + b) / 2 for a, b in zip(p, q)]
        y = int(token[i])
        expected = {
            "dlogp": math.log(p[y]) - math.log(q[y]),
            "kl": _direct_kl(p, q),
            "reverse_kl": _direct_kl(q, p),
            "js": 0.5 * _direct_kl(p, m) + 0.5 * _direct_kl(q, m),
            "sym_kl": 0.5 * (_direct_kl(p, q) + _direct_kl(q, p)),
            "random": float(u[i]),
        }
        for name, value in expected.items():
            score = crit.get_criterion(name)(lp_rl, lp_base, token, uniforms=u)
            assert float(score[i]) == pytest.approx(value, abs=1e-10), name
        for decoder, dist in (("base", q), ("rl", p)):
            score = crit.get_criterion("entropy")(lp_rl, lp_base, token, decoder=decoder)
            assert float(score[i]) == pytest.approx(-sum(a * math.log(a) for a in dist), abs=1e-10)
    with pytest.raises(ValueError, match="uniforms"):
        crit.get_criterion("random")(lp_rl, lp_base, token)


def test_criteria_registry_directions_and_zero_probabilities() -> None:
    assert crit.criterion_names() == sorted(["dlogp", "kl", "reverse_kl", "js", "sym_kl", "entropy", "random"])
    assert crit.get_criterion("dlogp") is crit.CRITERIA[0]
    dlogp = crit.get_criterion("dlogp")
    assert (dlogp.direction("base"), dlogp.direction("rl")) == ("le", "ge")
    assert all(
        crit.get_criterion(n).direction(d) == "ge"
        for n in ("kl", "reverse_kl", "js", "entropy")
        for d in ("base", "rl")
    )
    assert crit.get_criterion("random").direction("base") == "le"
    s = torch.tensor([-1.0, 0.0, 1.0])
    assert crit.fires(s, 0.0, "le").tolist() == [True, True, False]
    assert crit.fires(s, 0.0, "ge").tolist() == [False, True, True]
    with pytest.raises(KeyError, match="valid choices"):
        crit.get_criterion("nope")
    # zero-probability tokens contribute nothing (no NaN from 0 * -inf)
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.0]]))
    lq = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    assert float(crit.kl_divergence(lp, lq)) == pytest.approx(math.log(2))
    assert float(crit.entropy(lp)) == pytest.approx(math.log(2))
    m = [0.375, 0.375, 0.25]
    expected_js = 0.5 * _direct_kl([0.5, 0.5, 0], m) + 0.5 * _direct_kl([0.25, 0.25, 0.5], m)
    assert float(crit.js_score(lp, lq, torch.tensor([0]))) == pytest.approx(expected_js)


def test_top_k_support_direct_reading() -> None:
    lp_dec, lp_other = _rand_logp(3, 8, 6), _rand_logp(3, 8, 7)
    token = torch.tensor([0, 5, 7])
    support, filled = top_k_support(lp_dec, lp_other, token, 3)
    for i in range(3):
        dec_top = sorted(range(8), key=lambda v: -float(lp_dec[i, v]))[:3]
        other_top = sorted(range(8), key=lambda v: -float(lp_other[i, v]))[:3]
        pad = min(float(lp_other[i, v]) for v in other_top)
        assert {v for v in range(8) if support[i, v]} == set(dec_top) | {int(token[i])}
        assert filled[i].tolist() == [float(lp_other[i, v]) if v in other_top else pad for v in range(8)]
    full, same = top_k_support(lp_dec, lp_other, token, 100)
    assert bool(full.all()) and torch.equal(same, lp_other)


# ------------------------------------------------------------------------------------------- one step, exact
def _direct_sampling_probs(logp: list[float], temperature: float, top_p: float) -> list[float]:
    """Token probabilities after temperature then HF top-p (keep a token if the mass of the strictly
    more likely tokens is < top_p), by a plain loop; -inf entries have probability 0."""
    w = [x / temperature for x in logp]
    mx = max(w)
    e = [math.exp(x - mx) if x > -INF else 0.0 for x in w]
    p = [x / sum(e) for x in e]
    order = sorted(range(len(p)), key=lambda v: -p[v])
    keep, mass = set(), 0.0
    for v in order:
        if mass < top_p and p[v] > 0:
            keep.add(v)
        mass += p[v]
    kept = sum(p[v] for v in keep)
    return [p[v] / kept if v in keep else 0.0 for v in range(len(p))]


def _direct_resample_probs(lp_rl, lp_base, dec_is_rl, gamma, k, y, temperature, top_p) -> list[float]:
    """The resampling distribution after proposal y: extrapolation over the (top-k) support, by loops."""
    vocab = len(lp_rl)
    lp_dec, lp_other = (lp_rl, lp_base) if dec_is_rl else (lp_base, lp_rl)
    support, other = set(range(vocab)), list(lp_other)
    if k is not None:
        support = set(sorted(range(vocab), key=lambda v: -lp_dec[v])[:k]) | {y}
        pad = sorted(lp_other, reverse=True)[k - 1]
        other = [x if x >= pad else pad for x in lp_other]
    rl_, base_ = (lp_dec, other) if dec_is_rl else (other, lp_dec)
    w = [(1 + gamma) * rl_[v] - gamma * base_[v] if v in support else -INF for v in range(vocab)]
    return _direct_sampling_probs(w, temperature, top_p)


def _tau_for_half_mass(dl: list[float], q: list[float], direction: str) -> float:
    """The threshold at which the criterion fires on the proposal mass closest to 1/2 (dl: Δlog p per
    token, q: proposal probabilities, direction "le" / "ge")."""
    order = sorted(range(len(dl)), key=lambda v: dl[v], reverse=direction == "ge")
    masses = torch.tensor([q[v] for v in order], dtype=torch.float64).cumsum(0)
    return dl[order[int((masses - 0.5).abs().argmin())]]


CASES = [  # decode_with, gamma, top_k_support
    ("base", 0.3, None),
    ("base", 0.0, None),
    ("rl", 0.5, None),
    ("base", 0.3, 4),
]


@pytest.mark.parametrize("decode_with,gamma,k", CASES)
def test_first_step_matches_brute_force_mixture(base, rl, decode_with, gamma, k) -> None:
    """Emitted-token distribution P(y) = q(y)(1 - f(y)) + sum_y' q(y') f(y') r_y'(y), with q the
    proposal, f the criterion and r_y' the resampling distribution, vs the decoder's rule evaluated on
    a product grid of proposal x resample uniforms (exact up to the grid's resolution)."""
    temperature, top_p = 1.5, 0.9
    prompt = [BOS, 5, 9, 12, 4]
    lg_rl, lg_base = _next_logits(rl, prompt), _next_logits(base, prompt)
    lp_rl, lp_base = lg_rl.log_softmax(-1).tolist(), lg_base.log_softmax(-1).tolist()
    dec_is_rl = decode_with == "rl"
    dl = [a - b for a, b in zip(lp_rl, lp_base)]
    q = _direct_sampling_probs(lp_rl if dec_is_rl else lp_base, temperature, top_p)
    if k is not None:  # the top-k view: proposal from the decoder's top k, Δlog p on the padded union
        cut_rl, cut_base = _cut(torch.tensor([lp_rl]), k), _cut(torch.tensor([lp_base]), k)
        q = _direct_sampling_probs((cut_rl if dec_is_rl else cut_base)[0].tolist(), temperature, top_p)
        pad_d, pad_o = _padded_union(*((cut_rl, cut_base) if dec_is_rl else (cut_base, cut_rl)), k)
        pad_rl, pad_base = (pad_d, pad_o) if dec_is_rl else (pad_o, pad_d)
        dl = [a - b if a > -INF else -INF for a, b in zip(pad_rl[0].tolist(), pad_base[0].tolist())]
    tau = _tau_for_half_mass(dl, q, "ge" if dec_is_rl else "le")
    fired = [(d >= tau) if dec_is_rl else (d <= tau) for d in dl]
    r = {y: _direct_resample_probs(lp_rl, lp_base, dec_is_rl, gamma, k, y, temperature, top_p) for y in range(VOCAB)}
    exact = [q[y] * (not fired[y]) + sum(q[z] * r[z][y] for z in range(VOCAB) if fired[z]) for y in range(VOCAB)]
    assert 0.2 < sum(q[z] for z in range(VOCAB) if fired[z]) < 0.95  # both branches matter

    n0, n1 = 400, 400
    u0 = ((torch.arange(n0) + 0.5) / n0).repeat_interleave(n1)
    u1 = ((torch.arange(n1) + 0.5) / n1).repeat(n0)
    uniforms = torch.zeros(n0 * n1, 3)
    uniforms[:, PROPOSAL], uniforms[:, RESAMPLE] = u0, u1
    rule = make_rule(
        "dlogp",
        threshold=tau,
        gamma=gamma,
        decode_with=decode_with,
        top_k_support=k,
        params=SamplingParams(temperature=temperature, top_p=top_p),
    )
    dec, other = (lg_rl, lg_base) if dec_is_rl else (lg_base, lg_rl)
    tokens, flags = rule.choose([dec.expand(n0 * n1, -1), other.expand(n0 * n1, -1)], uniforms)
    freq = torch.bincount(tokens, minlength=VOCAB).double() / (n0 * n1)
    # grid error: each token's proposal / resample interval is counted within one grid point
    mass_fired = sum(q[z] for z in range(VOCAB) if fired[z])
    bound = [1 / n0 + sum(r[z][y] for z in range(VOCAB) if fired[z]) / n0 + mass_fired / n1 for y in range(VOCAB)]
    for y in range(VOCAB):
        assert abs(float(freq[y]) - exact[y]) <= bound[y] + 1e-9, (y, float(freq[y]), exact[y], bound[y])
    assert float(flags[:, 0].double().mean()) == pytest.approx(mass_fired, abs=VOCAB / n0)
    assert bool((flags[:, 1] <= flags[:, 0]).all())


def test_always_fires_with_gamma_zero_is_pi_rl_and_never_fires_is_base(base, rl) -> None:
    prompt = [BOS, 7, 3, 20]
    lg_rl, lg_base = _next_logits(rl, prompt), _next_logits(base, prompt)
    n = 5000
    u = ((torch.arange(n) + 0.5) / n)[:, None].repeat(1, 3)
    for threshold, target in ((INF, lg_rl), (-INF, lg_base)):
        rule = make_rule("dlogp", threshold=threshold, gamma=0.0, params=SamplingParams(top_p=0.9))
        tokens, flags = rule.choose([lg_base.expand(n, -1), lg_rl.expand(n, -1)], u)
        expected = _direct_sampling_probs(target.log_softmax(-1).tolist(), 1.0, 0.9)
        freq = torch.bincount(tokens, minlength=VOCAB).double() / n
        assert freq.tolist() == pytest.approx(expected, abs=1 / n + 1e-9)
        assert bool(flags[:, 0].all()) == (threshold == INF) and bool(flags[:, 0].any()) == (threshold == INF)


def test_first_step_end_to_end_chi_square(base, rl) -> None:
    """The real decoder (pre-drawn pseudo-random uniforms, KV caches) on many copies of one prompt."""
    prompt = [BOS, 5, 9, 12, 4]
    lp_rl = _next_logits(rl, prompt).log_softmax(-1).tolist()
    lp_base = _next_logits(base, prompt).log_softmax(-1).tolist()
    q = _direct_sampling_probs(lp_base, 1.0, 1.0)
    tau = _tau_for_half_mass([a - b for a, b in zip(lp_rl, lp_base)], q, "le")
    fired = [a - b <= tau for a, b in zip(lp_rl, lp_base)]
    r = _direct_resample_probs(lp_rl, lp_base, False, 0.4, None, 0, 1.0, 1.0)
    mass = sum(q[z] for z in range(VOCAB) if fired[z])
    exact = [q[y] * (not fired[y]) + mass * r[y] for y in range(VOCAB)]
    n = 20000
    gen, stats = selective_generate(
        base, rl, [prompt] * n, SamplingParams(max_new_tokens=1, eos_id=-1, seed=11), threshold=tau, gamma=0.4
    )
    counts = torch.bincount(torch.tensor([r_[0] for r_ in gen.response_ids]), minlength=VOCAB).double()
    expected = torch.tensor(exact, dtype=torch.float64) * n
    big = expected >= 5
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() > 0:  # pool the rare tokens into one bin
        obs, exp = torch.cat([obs, counts[~big].sum()[None]]), torch.cat([exp, expected[~big].sum()[None]])
    obs, exp = obs.numpy(), exp.numpy()
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    assert sum(stats["resampled"]) / n == pytest.approx(mass, abs=4 * math.sqrt(mass * (1 - mass) / n))


# ------------------------------------------------------------------------------------------- whole sequences
def _cut(lp: torch.Tensor, k: int) -> torch.Tensor:
    """One row [1, V] cut to its k largest entries (-inf elsewhere), by a loop."""
    keep = sorted(range(lp.shape[-1]), key=lambda v: -float(lp[0, v]))[:k]
    return torch.tensor([[float(lp[0, v]) if v in keep else -INF for v in range(lp.shape[-1])]])


def _padded_union(lp_d: torch.Tensor, lp_o: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two cut rows on the union of their finite entries, each missing entry padded with its row's k-th value."""
    union = [v for v in range(lp_d.shape[-1]) if lp_d[0, v] > -INF or lp_o[0, v] > -INF]
    out = []
    for lp in (lp_d, lp_o):
        pad = sorted((float(x) for x in lp[0] if x > -INF), reverse=True)[k - 1]
        out.append(torch.tensor([[max(float(lp[0, v]), pad) if v in union else -INF for v in range(lp.shape[-1])]]))
    return out[0], out[1]


def _reference_decode(primary, secondary, prompts, responses, *, rule, seed, max_new):
    """Teacher-forced reference: for every row and step, recompute from full forwards (no cache) what
    the rule emits given the decoded prefix and the row's pre-drawn uniforms; also count the flags.

    Returns (tokens the reference would emit at each decoded position, resampled, changed) per row.
    """
    uniforms = draw_uniforms(len(prompts), max_new, 3, seed)
    out, resampled, changed = [], [], []
    for i, (p, resp) in enumerate(zip(prompts, responses)):
        toks, n_res, n_chg = [], 0, 0
        for t in range(len(resp)):
            ld, lo = _next_logits(primary, p + resp[:t])[None], _next_logits(secondary, p + resp[:t])[None]
            u = uniforms[i, t]
            lp_d, lp_o = ld.log_softmax(-1), lo.log_softmax(-1)
            if rule.top_k_support is None:
                y = choose_tokens(ld, rule.params, u[PROPOSAL][None])
                crit_d, crit_o = lp_d, lp_o
            else:  # the top-K view: what engines asked for K log-probs return (the module's own_view / union_view)
                k = rule.top_k_support
                lp_d, lp_o = _cut(lp_d, k), _cut(lp_o, k)
                y = choose_tokens(lp_d, rule.params, u[PROPOSAL][None])
                crit_d, crit_o = _padded_union(lp_d, lp_o, k)
            lp_rl, lp_base = (crit_d, crit_o) if rule.decode_with == "rl" else (crit_o, crit_d)
            score = float(rule.criterion(lp_rl, lp_base, y, decoder=rule.decode_with, uniforms=u[CRITERION][None]))
            fire = score <= rule.threshold if rule.direction == "le" else score >= rule.threshold
            tok = int(y)
            if fire:
                extra = rule.resample_logprobs(lp_d, lp_o, y)
                tok = int(choose_tokens(extra, rule.params, u[RESAMPLE][None]))
            toks.append(tok)
            n_res += fire
            n_chg += fire and tok != int(y)
        out.append(toks)
        resampled.append(n_res)
        changed.append(n_chg)
    return out, resampled, changed


SEQ_CASES = [  # criterion, threshold, gamma, decode_with, fire_when, top_k_support, greedy
    ("dlogp", -0.3, 0.5, "base", None, None, False),
    ("dlogp", 0.3, 0.2, "rl", None, None, False),
    ("dlogp", 0.0, 0.2, "base", "ge", None, False),
    ("kl", 0.1, 0.3, "base", None, 5, False),
    ("random", 0.3, 0.0, "base", None, None, False),
    ("entropy", 2.1, 0.1, "rl", None, None, True),
    ("dlogp", INF, 0.0, "base", None, None, False),  # always fires, replace-only: samples pi_RL
]


@pytest.mark.parametrize("criterion,threshold,gamma,decode_with,fire_when,k,greedy", SEQ_CASES)
def test_sequences_match_teacher_forced_reference(
    base, rl, criterion, threshold, gamma, decode_with, fire_when, k, greedy
) -> None:
    prompts = _prompts(9, seed=1)
    primary, secondary = (rl, base) if decode_with == "rl" else (base, rl)
    settings = dict(
        criterion=criterion,
        threshold=threshold,
        gamma=gamma,
        decode_with=decode_with,
        fire_when=fire_when,
        top_k_support=k,
    )
    params = SamplingParams(max_new_tokens=12, eos_id=EOS, seed=7, greedy=greedy, temperature=0.9, top_p=0.95)
    gen, stats = selective_generate(primary, secondary, prompts, params, batch_size=4, **settings)
    rule = make_rule(**settings, params=SamplingParams(greedy=greedy, temperature=0.9, top_p=0.95))
    ref, resampled, changed = _reference_decode(
        primary, secondary, prompts, gen.response_ids, rule=rule, seed=7, max_new=12
    )
    assert ref == gen.response_ids
    assert stats["resampled"] == resampled and stats["changed"] == changed
    assert stats["n_tokens"] == [len(r) for r in gen.response_ids]
    assert gen.finished == [bool(r) and r[-1] == EOS for r in gen.response_ids]
    assert all(len(r) == 12 or r[-1] == EOS for r in gen.response_ids)
    if threshold == INF:
        assert stats["resampled"] == stats["n_tokens"]
    else:
        assert 0 < sum(resampled) < sum(stats["n_tokens"])  # the case exercises both branches


def test_never_fires_is_token_identical_to_the_plain_sampler(base, rl) -> None:
    prompts = _prompts(12, seed=2)
    params = SamplingParams(max_new_tokens=15, eos_id=EOS, seed=3, temperature=0.7, top_p=0.9)
    plain = generate(base, prompts, params)
    gen, stats = selective_generate(base, rl, prompts, params, threshold=-INF, gamma=0.5)
    assert gen == plain and sum(stats["resampled"]) == 0 and sum(stats["changed"]) == 0
    gen_rl, _ = selective_generate(rl, base, prompts, params, threshold=INF, gamma=0.5, decode_with="rl")
    assert gen_rl == generate(rl, prompts, params)  # dlogp fires on >= tau when pi_RL decodes


def test_greedy_edge_cases_match_single_model_greedy(base, rl) -> None:
    prompts = _prompts(8, seed=3)
    params = SamplingParams(max_new_tokens=10, eos_id=EOS, greedy=True)
    never, _ = selective_generate(base, rl, prompts, params, threshold=-INF, gamma=0.3)
    always, stats = selective_generate(base, rl, prompts, params, threshold=INF, gamma=0.0)
    assert never == generate(base, prompts, params)
    assert always == generate(rl, prompts, params)  # replace-only everywhere = pi_RL
    assert stats["resampled"] == stats["n_tokens"]


def test_deterministic_and_batch_size_invariant(base, rl) -> None:
    prompts = _prompts(10, seed=4)
    kw = dict(criterion="random", threshold=0.4, gamma=0.2)
    params = SamplingParams(max_new_tokens=10, eos_id=EOS, seed=5)
    a = selective_generate(base, rl, prompts, params, **kw)
    assert selective_generate(base, rl, prompts, params, **kw) == a
    assert selective_generate(base, rl, prompts, params, batch_size=3, **kw) == a
    assert selective_generate(base, rl, prompts, replace(params, seed=6), **kw)[0] != a[0]


def test_bad_settings_fail_early(base, rl) -> None:
    kw = dict(threshold=0.0, gamma=0.1)
    params = SamplingParams(max_new_tokens=2, eos_id=EOS)
    with pytest.raises(ValueError, match="decode_with"):
        selective_generate(base, rl, [[BOS]], params, decode_with="both", **kw)
    with pytest.raises(ValueError, match="top_k_support"):
        make_selective_generate_fn(base, rl, threshold=0.0, gamma=0.1, top_k_support=0)
    with pytest.raises(KeyError):
        make_selective_generate_fn(base, rl, criterion="nope", threshold=0.0, gamma=0.1)
    with pytest.raises(ValueError, match="direction"):
        selective_generate(base, rl, [[BOS]], params, fire_when="lt", **kw)
    empty, stats = selective_generate(base, rl, [[BOS]], SamplingParams(max_new_tokens=0, eos_id=EOS), **kw)
    assert empty.response_ids == [[]] and stats == {"n_tokens": [0], "resampled": [0], "changed": [0]}


# ------------------------------------------------------------------------------------------- evaluation hook
def _records(n: int) -> list[dict]:
    return [{"id": f"t/{i}", "question": f"{i}+{i + 1}", "answer": str(2 * i + 1)} for i in range(n)]


def test_evaluate_model_with_selective_generate_fn(tmp_path: Path) -> None:
    tok = build_tokenizer(["0123456789+-*= ", "Answer: \\boxed{12}"])
    vocab = len(tok)
    base_m, rl_m = _model(0, vocab), _model(1, vocab)
    rl_m.train()
    suites = {"s": _records(4)}
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=2)
    kw = dict(k=3, ks=[1, 3], template="tiny", batch_size=5, progress=False)
    with RewardScorer("math_verify", timeout_s=5.0) as scorer:
        fn = make_selective_generate_fn(base_m, rl_m, threshold=-0.2, gamma=0.3)
        result = evaluate_model(
            None, tok, suites, params, generate_fn=fn, scorer=scorer, out_dir=tmp_path / "sel", **kw
        )
        plain = evaluate_model(base_m, tok, suites, params, scorer=scorer, out_dir=tmp_path / "plain", **kw)
        never = make_selective_generate_fn(base_m, rl_m, threshold=-INF, gamma=0.3)
        evaluate_model(None, tok, suites, params, generate_fn=never, scorer=scorer, out_dir=tmp_path / "never", **kw)
    assert rl_m.training and not base_m.training  # modes restored
    rows = [json.loads(line) for line in (tmp_path / "sel" / "s.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * (1 + 3)
    assert all(0 <= r["changed"] <= r["resampled"] <= r["n_tokens"] for r in rows)
    samples = [r for r in rows if r["sample"] >= 0]
    assert len({r["n_tokens"] for r in samples}) > 1  # so that token-weighted rates differ from row means
    summary = result["suites"]["s"]
    assert summary["replacement_rate"] == pytest.approx(
        sum(r["resampled"] for r in samples) / sum(r["n_tokens"] for r in samples)
    )
    assert summary["changed_rate"] == pytest.approx(
        sum(r["changed"] for r in samples) / sum(r["n_tokens"] for r in samples)
    )
    greedy = [r for r in rows if r["sample"] < 0]
    assert summary["greedy_replacement_rate"] == pytest.approx(
        sum(r["resampled"] for r in greedy) / sum(r["n_tokens"] for r in greedy)
    )
    assert 0 < summary["replacement_rate"] < 1
    on_disk = json.loads((tmp_path / "sel" / "metrics.json").read_text())
    assert on_disk["settings"]["decoder"]["name"] == "selective_extrapolation"
    assert on_disk["settings"]["decoder"]["threshold"] == -0.2
    assert on_disk["suites"]["s"]["replacement_rate"] == summary["replacement_rate"]
    # plain decoding: no decode counters; a criterion that never fires: the same generations
    plain_rows = [json.loads(line) for line in (tmp_path / "plain" / "s.jsonl").read_text().splitlines()]
    never_rows = [json.loads(line) for line in (tmp_path / "never" / "s.jsonl").read_text().splitlines()]
    assert "resampled" not in plain_rows[0] and "replacement_rate" not in plain["suites"]["s"]
    assert [r["response"] for r in never_rows] == [r["response"] for r in plain_rows]
    assert all(r["resampled"] == 0 for r in never_rows)
    with pytest.raises(ValueError, match="model or a generate_fn"):
        evaluate_model(None, tok, suites, params, scorer=None, out_dir=tmp_path / "x", **kw)


# ------------------------------------------------------------------------------------------- the top-K view
def test_top_k_view_covering_the_vocabulary_is_the_full_view(base, rl) -> None:
    """K >= V: the top-K view (the paper-scale default, K = 50) chooses the same tokens, with the same resample
    counts, as the full view (the tiny default), for sampling and every criterion family."""
    prompts = _prompts(12, seed=3)
    params = SamplingParams(max_new_tokens=10, eos_id=EOS, seed=5, temperature=1.2, top_p=0.95)
    for criterion, threshold in (("dlogp", -0.2), ("kl", 0.05), ("entropy", 1.0)):
        settings = dict(criterion=criterion, threshold=threshold, gamma=0.3)
        full, s_full = selective_generate(base, rl, prompts, params, top_k_support=None, **settings)
        for k in (VOCAB, 50):
            view, s_view = selective_generate(base, rl, prompts, params, top_k_support=k, **settings)
            assert view.response_ids == full.response_ids and s_view == s_full, (criterion, k)
        assert sum(s_full["resampled"]) > 0
    cut, _ = selective_generate(
        base, rl, prompts, params, top_k_support=3, criterion="dlogp", threshold=-0.2, gamma=0.3
    )
    assert cut.response_ids != full.response_ids  # a K below the support of the models' rows is another decoder


def test_rule_on_engine_top_k_rows_equals_the_rule_on_full_rows() -> None:
    """What a vLLM engine asked for K log-probs returns (each row's log-probs cut to its top K, -inf elsewhere,
    read by ``choose_logprobs`` as the vLLM decoder does) gives the rule the same tokens and flags as the local
    decoder's full logits: both backends decode the same top-K view."""
    from creditlab.decoding.extrapolation import own_view

    g = torch.Generator().manual_seed(0)
    dec, other = 3 * torch.randn(256, 40, generator=g), 3 * torch.randn(256, 40, generator=g)
    uniforms = torch.rand(256, 3, generator=g)
    for criterion, threshold, gamma in (("dlogp", -0.5, 0.3), ("kl", 0.5, 0.0), ("entropy", 1.0, 0.5)):
        rule = make_rule(
            criterion, threshold=threshold, gamma=gamma, top_k_support=6, params=SamplingParams(temperature=0.9)
        )
        full = rule.choose([dec, other], uniforms)
        cut = rule.choose_logprobs([own_view(dec.log_softmax(-1), 6), own_view(other.log_softmax(-1), 6)], uniforms)
        assert torch.equal(full[0], cut[0]) and torch.equal(full[1], cut[1]), criterion
        assert 0 < float(full[1][:, 0].float().mean()) < 1  # both branches
