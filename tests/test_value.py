"""Counterfactual token value (Paper C, SPEC item 6): creditlab.analysis.value."""

import math

import pytest
import torch

from conftest import make_trainer
from creditlab.analysis.value import (
    BRANCH_STATE,
    BRANCH_WITH,
    CLASSES,
    gap_vs_entropy,
    item_seed,
    sample_balanced_items,
    sample_continuations,
    token_values_mc,
    value_gap,
)
from creditlab.lm.sampler import SamplingParams, generate

MAX_NEW, TEMP, TOP_P = 32, 1.0, 0.9


class GoldInText:
    """Reward 1 when the gold string occurs in the decoded response: a known function of the text."""

    def __init__(self):
        self.calls = 0

    def score(self, texts, golds):
        self.calls += 1
        return [float(g in t) for t, g in zip(texts, golds)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tr = make_trainer("grpo", tmp_path_factory.mktemp("value"))
    ro, _ = tr.collect(0)
    golds = [tr.records[g % len(tr.records)]["answer"] for g in ro.group_ids]
    return tr, ro, golds


def _direct(tr, ro, golds, i, t, branch, n, seed):
    """Mean reward of one branch of item (i, t), recomputed by hand with generate."""
    cut = t + 1 if branch == BRANCH_WITH else t
    head = list(ro.responses[i][:cut])
    budget = MAX_NEW - cut
    if head and head[-1] == tr.tok.eos_token_id:
        budget = 0
    if budget > 0:
        gen = generate(tr.model, [list(ro.prompts[i]) + head] * n, _params(tr, budget, item_seed(seed, i, t, branch)))
        conts = gen.response_ids
    else:
        conts = [[] for _ in range(n)]
    texts = tr.tok.batch_decode([head + c for c in conts], skip_special_tokens=True)
    return sum(float(golds[i] in s) for s in texts) / n


def _params(tr, max_new_tokens=MAX_NEW, seed=0):
    """The continuations' sampling (the tokenizer's EOS)."""
    return SamplingParams(
        max_new_tokens=max_new_tokens, eos_id=tr.tok.eos_token_id, temperature=TEMP, top_p=TOP_P, seed=seed
    )


def _items(ro, eos):
    """A few ordinary items, one at the last slot of a full-length response (budget 0 for s + y), and
    one EOS token (s + y terminal)."""
    long = [i for i, r in enumerate(ro.responses) if len(r) > 6]
    items = [(long[0], 0), (long[1], 1), (long[2], 5)]
    full = next(i for i, r in enumerate(ro.responses) if len(r) == MAX_NEW)
    items.append((full, MAX_NEW - 1))
    ended = next(i for i, r in enumerate(ro.responses) if r and r[-1] == eos)
    items.append((ended, len(ro.responses[ended]) - 1))
    return items


def test_continuations_match_generate(world):
    tr, ro, _ = world
    prefixes = [list(ro.prompts[0]) + list(ro.responses[0][:4]), list(ro.prompts[2]), list(ro.prompts[5]) + [7]]
    budgets, seeds, n = [28, 32, 0], [11, 12, 13], 3
    conts = sample_continuations(
        tr.model,
        prefixes,
        budgets,
        seeds,
        _params(tr),
        n=n,
        chunk=4,
    )
    for k in range(2):
        gen = generate(tr.model, [prefixes[k]] * n, _params(tr, budgets[k], seeds[k]))
        assert conts[k] == gen.response_ids
    assert conts[2] == [[], [], []]


def test_values_against_direct_generate(world):
    tr, ro, golds = world
    items = _items(ro, tr.tok.eos_token_id)
    probs = torch.tensor([0.3, 0.5, 0.2, 0.9, 0.6])
    n, seed = 6, 5
    scorer = GoldInText()
    out = token_values_mc(
        tr.model,
        tr.tok,
        scorer,
        ro.prompts,
        ro.responses,
        golds,
        items,
        probs,
        SamplingParams(max_new_tokens=MAX_NEW, temperature=TEMP, top_p=TOP_P, seed=seed),  # eos: the tokenizer's
        n=n,
    )
    assert scorer.calls == 1  # all continuations scored in one batch
    assert set(out) == {"value", "r_with", "r_state"} and all(v.shape == (len(items),) for v in out.values())
    for k, (i, t) in enumerate(items):
        assert out["r_with"][k].item() == pytest.approx(_direct(tr, ro, golds, i, t, BRANCH_WITH, n, seed))
        assert out["r_state"][k].item() == pytest.approx(_direct(tr, ro, golds, i, t, BRANCH_STATE, n, seed))
    want = (out["r_with"] - out["r_state"]) / (1 - probs)
    torch.testing.assert_close(out["value"], want)
    # the terminal branches are deterministic: a single reading of the response itself
    for k in (3, 4):
        i, t = items[k]
        whole = tr.tok.batch_decode([ro.responses[i][: t + 1]], skip_special_tokens=True)[0]
        assert out["r_with"][k].item() == float(golds[i] in whole)


def test_determinism_and_item_independence(world):
    tr, ro, golds = world
    items = [(0, 2), (2, 1), (4, 0)]
    probs = torch.tensor([0.1, 0.4, 0.7])
    params = _params(tr, seed=3)
    a = token_values_mc(tr.model, tr.tok, GoldInText(), ro.prompts, ro.responses, golds, items, probs, params, n=8)
    b = token_values_mc(tr.model, tr.tok, GoldInText(), ro.prompts, ro.responses, golds, items, probs, params, n=8)
    for key in a:
        assert torch.equal(a[key], b[key])
    # an item's estimate does not depend on the other items of the call
    one = token_values_mc(
        tr.model, tr.tok, GoldInText(), ro.prompts, ro.responses, golds, items[1:2], probs[1:2], params, n=8
    )
    for key in a:
        assert torch.equal(one[key], a[key][1:2])
    # the seed matters: the sampled continuations change
    s1 = sample_continuations(
        tr.model,
        [ro.prompts[0]],
        [MAX_NEW],
        [item_seed(3, 0, 0, 1)],
        _params(tr),
        n=4,
    )
    s2 = sample_continuations(
        tr.model,
        [ro.prompts[0]],
        [MAX_NEW],
        [item_seed(4, 0, 0, 1)],
        _params(tr),
        n=4,
    )
    assert s1 != s2


class LengthParity:
    """Reward 1 for odd-length texts: a reward that varies across continuations."""

    def score(self, texts, golds):
        return [float(len(t) % 2) for t in texts]


def test_one_minus_p_clamp(world):
    tr, ro, golds = world
    items = [(1, 0)] * 4  # the same item: same seeds, same r_with / r_state
    probs = torch.tensor([0.5, 0.97, 1.0, 0.0])
    out = token_values_mc(
        tr.model,
        tr.tok,
        LengthParity(),
        ro.prompts,
        ro.responses,
        golds,
        items,
        probs,
        _params(tr, seed=1),
        n=8,
        eps=0.1,
    )
    diff = out["r_with"] - out["r_state"]
    assert torch.equal(out["r_with"], out["r_with"][:1].expand(4)) and torch.equal(diff, diff[:1].expand(4))
    torch.testing.assert_close(out["value"], diff * torch.tensor([1 / 0.5, 1 / 0.1, 1 / 0.1, 1.0]))
    assert torch.isfinite(out["value"]).all()


def test_empty_items(world):
    tr, ro, golds = world
    out = token_values_mc(
        tr.model,
        tr.tok,
        GoldInText(),
        ro.prompts,
        ro.responses,
        golds,
        [],
        torch.zeros(0),
        _params(tr),
        n=2,
    )
    assert all(v.shape == (0,) for v in out.values())


def test_value_gap_hand_computed():
    values = torch.tensor([1.0, 2.0, 3.0, 10.0, -1.0, 0.5, float("nan")])
    delta = torch.tensor([0.2, 0.3, 0.05, 0.5, -0.2, -0.3, 0.4])
    r = value_gap(values, delta, eps=0.1, n_boot=2000, seed=0)
    # boosted: 1, 2, 10 (the NaN value is dropped); suppressed: -1, 0.5; 3.0 is stable (|delta| <= eps)
    assert (r["n_boosted"], r["n_suppressed"]) == (3, 2)
    assert r["mean_boosted"] == pytest.approx(13 / 3) and r["mean_suppressed"] == pytest.approx(-0.25)
    assert r["gap"] == pytest.approx(13 / 3 + 0.25)
    # bootstrap range: every resampled gap lies in [min boosted - max suppressed, max boosted - min suppressed]
    assert 1.0 - 0.5 <= r["ci_low"] <= r["gap"] <= r["ci_high"] <= 10.0 + 1.0
    assert value_gap(values, delta, eps=0.1, n_boot=2000, seed=0) == r  # seeded
    # constant within each class: every bootstrap gap is the gap
    c = value_gap(torch.tensor([2.0, 2.0, -1.0, -1.0]), torch.tensor([1.0, 1.0, -1.0, -1.0]), eps=0.0, n_boot=50)
    assert c["gap"] == c["ci_low"] == c["ci_high"] == 3.0


def test_value_gap_empty_class():
    r = value_gap(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.6]), eps=0.1)
    assert (r["n_boosted"], r["n_suppressed"]) == (2, 0)
    assert r["mean_boosted"] == 1.5
    assert all(math.isnan(r[k]) for k in ("gap", "ci_low", "ci_high", "mean_suppressed"))
    e = value_gap(torch.zeros(0), torch.zeros(0), eps=0.1)
    assert (e["n_boosted"], e["n_suppressed"]) == (0, 0) and math.isnan(e["gap"])


def test_gap_vs_entropy():
    g = torch.Generator().manual_seed(0)
    m = 37
    values = torch.randn(m, generator=g)
    delta = torch.randn(m, generator=g)
    entropy = torch.randperm(m, generator=g).double() / 7  # distinct entropies
    rows = gap_vs_entropy(values, delta, entropy, eps=0.2, n_boot=200)
    assert [r["fraction"] for r in rows] == pytest.approx([0.1 * k for k in range(1, 11)])
    full = value_gap(values, delta, eps=0.2, n_boot=200)
    assert rows[-1]["n_tokens"] == m
    assert all(rows[-1][k] == full[k] for k in full)
    for r in rows:
        k = math.ceil(r["fraction"] * m - 1e-9)
        assert r["n_tokens"] == k
        top = entropy >= r["entropy_min"]  # the subset is exactly the k highest-entropy tokens
        assert int(top.sum()) == k
        sub = value_gap(values[top], delta[top], eps=0.2, n_boot=0)
        assert r["gap"] == pytest.approx(sub["gap"], nan_ok=True)
        assert (r["n_boosted"], r["n_suppressed"]) == (sub["n_boosted"], sub["n_suppressed"])


def test_sample_balanced_items():
    g = torch.Generator().manual_seed(1)
    B, T, eps, max_p, per = 12, 20, 0.1, 0.8, 5
    delta = torch.randn(B, T, generator=g) * 0.3
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    adv = torch.tensor([1.0, -1.0, 0.0] * 4)
    probs = torch.rand(B, T, generator=g)
    items, labels = sample_balanced_items(delta, mask, adv, eps, per, max_p, probs, torch.Generator().manual_seed(7))
    assert len(items) == len(labels) == len(set(items))
    for name in CLASSES:
        boosted, pos = name.startswith("boosted"), name.endswith("pos")
        avail = sum(
            1
            for i in range(B)
            for t in range(T)
            if mask[i, t] > 0
            and probs[i, t] <= max_p
            and (delta[i, t] > eps if boosted else delta[i, t] < -eps)
            and (adv[i] > 0 if pos else adv[i] < 0)
        )
        assert labels.count(name) == min(per, avail) and avail > per
    for (i, t), name in zip(items, labels):
        assert mask[i, t] > 0 and probs[i, t] <= max_p
        assert (delta[i, t] > eps) if name.startswith("boosted") else (delta[i, t] < -eps)
        assert (adv[i] > 0) if name.endswith("pos") else (adv[i] < 0)
    again = sample_balanced_items(delta, mask, adv, eps, per, max_p, probs, torch.Generator().manual_seed(7))
    assert again == (items, labels)
    few, few_labels = sample_balanced_items(delta, mask, adv, eps, 1000, max_p, probs, torch.Generator())
    assert len(few) > 4 * per  # capped by availability, not by per_class
