"""The noise floor's pieces (creditlab.analysis.noise): exact probe scores by teacher forcing against a direct
product of next-token probabilities, the t test's power against simulation, the MDE against its definition."""

import math

import numpy as np
import pytest
import torch

from creditlab.analysis import noise


def test_power_matches_a_simulated_two_sample_t_test():
    """power_two_sample(d, sd, n) is the rejection rate of scipy's two-sided t test on simulated arms."""
    from scipy import stats

    rng = np.random.default_rng(0)
    for n, d in ((3, 2.0), (5, 1.5), (10, 0.8)):
        a = rng.normal(0.0, 1.0, size=(20_000, n))
        b = rng.normal(d, 1.0, size=(20_000, n))
        rate = float(np.mean(stats.ttest_ind(a, b, axis=1).pvalue < 0.05))
        assert noise.power_two_sample(d, 1.0, n) == pytest.approx(rate, abs=0.015)
    assert noise.power_two_sample(0.0, 1.0, 5) == pytest.approx(0.05, abs=1e-9)
    for n, d in ((4, 1.5), (6, 1.0)):  # the one-sample test (mechanisms' within-run contrasts)
        x = rng.normal(d, 1.0, size=(20_000, n))
        rate = float(np.mean(stats.ttest_1samp(x, 0.0, axis=1).pvalue < 0.05))
        assert noise.power_one_sample(d, 1.0, n) == pytest.approx(rate, abs=0.015)


def test_mde_is_the_effect_at_eighty_percent_power_and_the_normal_formula_for_many_seeds():
    for n, sd in ((3, 0.7), (5, 2.0), (20, 1.0)):
        d = noise.mde_two_sample(sd, n)
        assert noise.power_two_sample(d, sd, n) == pytest.approx(0.8, abs=1e-6)
        assert noise.power_two_sample(0.95 * d, sd, n) < 0.8
    z = 1.959964 + 0.841621  # z_{0.975} + z_{0.8}
    assert noise.mde_two_sample(1.0, 400) == pytest.approx(z * math.sqrt(2 / 400), rel=0.01)
    assert math.isnan(noise.mde_two_sample(1.0, 1))
    assert noise.seeds_needed(noise.mde_two_sample(1.0, 6), 1.0) == 6


def test_summarize_reports_sd_and_mde_per_metric():
    per_seed = {0: {"a": 1.0, "b": 5.0}, 1: {"a": 2.0, "b": 5.0}, 2: {"a": 3.0}}
    s = noise.summarize(per_seed, ns=(1, 3))
    assert s["a"]["sd"] == pytest.approx(1.0) and s["a"]["mean"] == pytest.approx(2.0)
    assert s["a"]["mde"]["3"] == pytest.approx(noise.mde_two_sample(1.0, 3))
    assert s["b"]["sd"] == 0.0 and s["b"]["n_seeds"] == 2


def test_gold_scores_are_the_product_of_the_gold_tokens_next_token_probabilities():
    from creditlab.data.synthetic import generate_split
    from creditlab.data.tokenizer import build_tokenizer
    from creditlab.models.tiny import build_model
    from creditlab.plan import compose

    cfg = compose("micro", "micro-s", "dapo", [])
    records = generate_split(0, 6, [1, 2], [1, 2])
    tok = build_tokenizer([r["question"] + r["solution"] for r in records] + ["Q: A:\n \\boxed{}0123456789+-*"])
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    prompts, responses, spans = noise.probe_set(records, tok, "tiny")
    for r, resp, (a, b) in zip(records, responses, spans):
        assert tok.decode(resp[a:b]).replace(" ", "") == r["answer"]  # the span is the boxed answer's tokens
    got = noise.gold_scores(model, prompts, responses, spans, tok.pad_token_id, rows=4)  # two chunks
    model.eval()
    for k, (p, r) in enumerate(zip(prompts, responses)):
        ids = torch.tensor([p + r])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double()
        lp = torch.log_softmax(logits, -1)
        per_token = torch.stack([lp[len(p) - 1 + t, r[t]] for t in range(len(r))])
        a, b = spans[k]
        assert float(got["gold_logp"][k]) == pytest.approx(float(per_token.sum()), abs=1e-4)
        assert float(got["answer_logp"][k]) == pytest.approx(float(per_token[a:b].sum()), abs=1e-4)
        assert float(got["gold_p"][k]) == pytest.approx(math.exp(float(per_token.sum())), rel=1e-3)
