"""DelTA (Paper B): the coefficients against a direct reading of the algorithm, the gradient proxies
against autograd, the memory bound, token selection, and the trainer's use of them (no extra forward)."""

from __future__ import annotations

import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import make_trainer
from creditlab.algos import registry
from creditlab.algos.credit.base import CreditInputs, apply_credit
from creditlab.algos.credit.delta import (
    COEF_VARIANTS,
    delta_coefficients,
    delta_weights,
    lm_head_row_proxy,
    topk_hidden_proxy,
)

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------
# a direct, unoptimised reading of SPEC Paper B steps 1-6 (python loops, explicit distances)


def reference(v, adv, lam_min=0.8, lam_max=1.2, K=1, variant="full"):
    v, adv = v.double(), adv.double()
    N = len(adv)
    P = [n for n in range(N) if adv[n] > 0]
    M = [n for n in range(N) if adv[n] < 0]
    if variant == "no_refine":
        K = 0

    def dist(n, mu):
        return float(((v[n] - mu) ** 2).sum())

    def centroid(idx, w):
        tot = sum(w[n] for n in idx)
        return sum(w[n] * v[n] for n in idx) / tot

    def margin(n, mu_pos, mu_neg):
        own, other = (mu_pos, mu_neg) if adv[n] > 0 else (mu_neg, mu_pos)
        if variant == "within_side":
            side = P if adv[n] > 0 else M
            return sum(dist(j, own) for j in side) / len(side) - dist(n, own)
        return dist(n, other) - dist(n, own)

    def pop_std(values):  # the official floor is on the variance (test_gamma_floor_is_the_official_variance_floor)
        mean = sum(values) / len(values)
        return max(sum((x - mean) ** 2 for x in values) / len(values), 1e-8) ** 0.5

    def h(x):
        if variant == "hard":
            return 1.0 if x > 0 else 0.0
        return 1.0 / (1.0 + torch.exp(torch.tensor(-x, dtype=torch.float64)).item())

    absA = {n: abs(float(adv[n])) for n in range(N)}
    mu_pos, mu_neg = centroid(P, absA), centroid(M, absA)
    m = {n: margin(n, mu_pos, mu_neg) for n in P + M}

    def gammas(m):
        if variant == "fixed_gamma":
            return 1.0, 1.0
        return pop_std([m[n] for n in P]), pop_std([m[n] for n in M])

    g_pos, g_neg = gammas(m)
    for _ in range(K):
        alpha = {n: h(m[n] / (g_pos if adv[n] > 0 else g_neg)) * absA[n] for n in P + M}
        new_pos = centroid(P, alpha) if sum(alpha[n] for n in P) > 0 else mu_pos
        new_neg = centroid(M, alpha) if sum(alpha[n] for n in M) > 0 else mu_neg
        g_pos, g_neg = gammas(m)
        mu_pos, mu_neg = new_pos, new_neg
        m = {n: margin(n, mu_pos, mu_neg) for n in P + M}
    lam = []
    for n in range(N):
        if adv[n] == 0:
            lam.append(0.0 if variant == "no_range" else lam_min)
            continue
        a = h(m[n] / (g_pos if adv[n] > 0 else g_neg))
        lam.append(a if variant == "no_range" else lam_min + (lam_max - lam_min) * a)
    lam = torch.tensor(lam, dtype=torch.float64)
    if variant != "no_norm":
        lam = lam * N / lam.sum()
    return lam


def _inputs(N=60, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(N, d, generator=g)
    adv = torch.randn(N // 6, generator=g).repeat_interleave(6)  # 6 tokens per rollout
    adv[:6] = 0.0  # one rollout of a group with equal rewards
    return v, adv


@pytest.mark.parametrize("variant", [v for v in COEF_VARIANTS if v != "random"])
@pytest.mark.parametrize("K", [0, 1, 3])
def test_coefficients_match_direct_reading(variant, K):
    v, adv = _inputs(seed=K)
    got = delta_coefficients(v, adv, refine_steps=K, variant=variant, chunk_size=7)  # several chunks
    want = reference(v, adv, K=K, variant=variant)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_coefficients_range_mean_and_zero_advantage_tokens():
    v, adv = _inputs(N=600, d=16)
    lam = delta_coefficients(v, adv)
    assert lam.mean().item() == pytest.approx(1.0, abs=1e-5)
    raw = delta_coefficients(v, adv, variant="no_norm")
    assert raw.min() >= 0.8 - 1e-6 and raw.max() <= 1.2 + 1e-6
    assert torch.allclose(raw[adv == 0], torch.tensor(0.8))
    # the normalised coefficients are the raw ones rescaled
    torch.testing.assert_close(lam, raw * len(raw) / raw.sum())


def test_random_variant_is_seeded_uniform_then_normalised():
    v, adv = _inputs(N=6000, d=4)
    a = delta_coefficients(v, adv, variant="random", generator=torch.Generator().manual_seed(1))
    b = delta_coefficients(v, adv, variant="random", generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    assert a.mean().item() == pytest.approx(1.0, abs=1e-5)
    raw = a[adv != 0] * (a[adv == 0][0] / 0.8) ** -1  # undo the normalisation
    assert raw.min() >= 0.8 - 1e-5 and raw.max() <= 1.2 + 1e-5


def test_one_sided_batch_is_neutral():
    v, _ = _inputs()
    adv = torch.ones(len(v))
    lam = delta_coefficients(v, adv, variant="no_norm")
    torch.testing.assert_close(lam, torch.full_like(lam, 1.0))  # alpha* = 0.5 -> lambda = 1.0


def test_gamma_floor_is_the_official_variance_floor():
    """gamma_s = sqrt(max(var_s, 1e-8)), as RUCBM/DelTA computes it (verl-DelTA/verl/workers/actor/dp_actor.py,
    compute_log_prob_h: ``eps = 1e-8``; ``gamma_pos = gamma_time * torch.sqrt(torch.clamp(m_pos_sumsq / m_pos_count
    - m_pos_mean ** 2, min=eps))``, gamma_time = 1), not max(std, 1e-8). Each side's tokens here have identical
    margins (variance 0), m = ||mu_-||^2 = 2.5e-5 on both sides: the official gamma is 1e-4, alpha* = sigmoid(0.25);
    a floor on the std (1e-8) gave sigmoid(2500) = 1, lambda = lam_max."""
    v = torch.tensor([[0.0, 0.0]] * 4 + [[0.005, 0.002], [0.005, -0.002]] * 2 + [[1.0, 1.0]] * 2)
    adv = torch.tensor([1.0] * 4 + [-1.0] * 4 + [0.0] * 2)  # positive at the origin, negative around (0.005, 0)

    def official_gamma(m):  # a direct reading of the official equation (one-pass moments, floor on the variance)
        mean = sum(m) / len(m)
        return max(sum(x * x for x in m) / len(m) - mean**2, 1e-8) ** 0.5

    mu_pos, mu_neg = torch.zeros(2, dtype=torch.float64), torch.tensor([0.005, 0.0], dtype=torch.float64)
    vd = v.double()
    m_pos = [float(((vd[n] - mu_neg) ** 2).sum() - ((vd[n] - mu_pos) ** 2).sum()) for n in range(4)]
    m_neg = [float(((vd[n] - mu_pos) ** 2).sum() - ((vd[n] - mu_neg) ** 2).sum()) for n in range(4, 8)]
    assert official_gamma(m_pos) == pytest.approx(1e-4) and official_gamma(m_neg) == pytest.approx(1e-4)
    # K = 1: every token of a side has the same alpha, so the refined centroids are the initial ones
    lam = [0.8 + 0.4 / (1.0 + math.exp(-x / official_gamma(m))) for m in (m_pos, m_neg) for x in m] + [0.8, 0.8]
    want = torch.tensor(lam, dtype=torch.float64)
    want = want * len(want) / want.sum()
    for K in (0, 1):
        got = delta_coefficients(v, adv, refine_steps=K)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.double(), reference(v, adv, K=K), rtol=1e-5, atol=1e-6)
    raw = delta_coefficients(v, adv, variant="no_norm")
    assert raw[:8].max().item() == pytest.approx(0.8 + 0.4 / (1.0 + math.exp(-0.25)), abs=1e-5)  # not lam_max


def test_closer_to_own_centroid_gets_more_credit():
    # two well separated clouds: a positive token sitting in the negative cloud is down-weighted
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(50, 3, generator=g) + torch.tensor([5.0, 0, 0])
    neg = torch.randn(50, 3, generator=g) - torch.tensor([5.0, 0, 0])
    stray = -torch.tensor([[5.0, 0, 0]])
    v = torch.cat([pos, neg, stray])
    adv = torch.cat([torch.ones(50), -torch.ones(50), torch.ones(1)])
    lam = delta_coefficients(v, adv, variant="no_norm")
    assert lam[-1] < 0.85 and lam[:50].mean() > 1.1


def test_unknown_variant_lists_choices():
    v, adv = _inputs()
    with pytest.raises(ValueError, match="valid choices"):
        delta_coefficients(v, adv, variant="nope")


class _Sizes(TorchDispatchMode):
    """Records the element count of every tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("variant", COEF_VARIANTS)
def test_memory_is_linear_in_tokens_no_n_by_n(variant):
    N, d = 3000, 4
    v, adv = _inputs(N=N, d=d)
    with _Sizes() as sizes:
        delta_coefficients(
            v, adv, refine_steps=2, variant=variant, chunk_size=512, generator=torch.Generator().manual_seed(0)
        )
    assert sizes.largest <= N * d  # never an N x N (9e6) or N x 2 x d tensor


# ------------------------------------------------------------------------------------------------
# the proxies against autograd


def test_lm_head_row_proxy_is_the_gradient_of_logp_wrt_the_sampled_row():
    g = torch.Generator().manual_seed(0)
    N, d, V = 9, 6, 11
    h = torch.randn(N, d, generator=g)
    W = torch.randn(V, d, generator=g, requires_grad=True)
    y = torch.randint(V, (N,), generator=g)
    for n in range(N):
        logp = torch.log_softmax(h[n] @ W.T, -1)[y[n]]
        (grad,) = torch.autograd.grad(logp, W)
        proxy = lm_head_row_proxy(logp.detach()[None], h[n : n + 1])[0]
        torch.testing.assert_close(proxy, grad[y[n]])


def test_topk_hidden_proxy_with_full_support_is_the_gradient_wrt_h():
    g = torch.Generator().manual_seed(1)
    N, d, V = 7, 5, 9
    W = torch.randn(V, d, generator=g)
    h = torch.randn(N, d, generator=g, requires_grad=True)
    y = torch.randint(V, (N,), generator=g)
    logprobs = torch.log_softmax(h @ W.T, -1)
    (grad,) = torch.autograd.grad(logprobs.gather(1, y[:, None]).sum(), h)
    top = torch.topk(logprobs.detach(), V, dim=-1)
    torch.testing.assert_close(topk_hidden_proxy(y, top.values, top.indices, W, chunk_elems=20), grad)
    # with K < V it keeps the sampled row and the K most probable rows only
    k = 3
    top = torch.topk(logprobs.detach(), k, dim=-1)
    want = W[y] - (top.values.exp()[..., None] * W[top.indices]).sum(1)
    torch.testing.assert_close(topk_hidden_proxy(y, top.values, top.indices, W), want)


def test_engine_forward_gives_the_proxy_inputs(tiny_model_batch):
    """(1 - p) h from response_forward equals autograd's d log p / d W_y through the real model."""
    from creditlab.lm.batch import response_forward

    model, batch = tiny_model_batch
    with torch.no_grad():
        out = response_forward(model, batch, with_hidden=True)
    W = model.get_output_embeddings().weight
    b, t = 1, 2
    hid = out.hidden[b, t].detach()
    y = batch.responses[b, t]
    W_leaf = W.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(W_leaf @ hid, -1)[y]
    torch.testing.assert_close(logp.detach(), out.logp[b, t], rtol=1e-4, atol=1e-5)
    (grad,) = torch.autograd.grad(logp, W_leaf)
    torch.testing.assert_close(lm_head_row_proxy(out.logp[b, t][None], hid[None])[0], grad[y], rtol=1e-4, atol=1e-5)


@pytest.fixture
def tiny_model_batch():
    from creditlab.lm.batch import pack
    from creditlab.models.tiny import build_model

    arch = dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
    )
    model = build_model(arch, vocab_size=13, pad_id=0, bos_id=1, eos_id=2, seed=0).eval()
    batch = pack([[1, 5, 6], [1, 7]], [[8, 9, 10, 2], [11, 2]], pad_id=0)
    return model, batch


# ------------------------------------------------------------------------------------------------
# the registered credit function and token filter on a [B, T] batch


def _batch(B=12, T=7, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    adv = torch.randn(B, generator=g)
    adv[:2] = 0.0
    return CreditInputs(
        responses=torch.randint(5, (B, T), generator=g),
        mask=mask,
        old_logp=-torch.rand(B, T, generator=g),
        advantages=adv,
        group_ids=torch.arange(B) // 4,
        hidden=torch.randn(B, T, d, generator=g),
        rng=torch.Generator().manual_seed(3),
    )


def test_delta_weights_scatter_the_coefficients_of_the_valid_tokens():
    inp = _batch()
    w = apply_credit(registry.get("credit", "delta"), inp, {})
    valid = inp.mask.bool()
    v = (1 - inp.old_logp.exp())[..., None] * inp.hidden
    want = delta_coefficients(v[valid], inp.advantages[:, None].expand_as(inp.mask)[valid])
    torch.testing.assert_close(w[valid], want)
    assert torch.all(w[~valid] == 0)
    assert w[valid].mean().item() == pytest.approx(1.0, abs=1e-5)


def test_topk_variant_needs_topk_inputs():
    inp = _batch()
    with pytest.raises(ValueError, match="topk"):
        delta_weights(inp.responses, inp.mask, inp.old_logp, inp.advantages, inp.hidden, variant="topk_proxy")


@pytest.mark.parametrize("mode", ["top", "bottom", "random"])
def test_selection_keeps_half_of_the_informative_tokens(mode):
    inp = _batch(B=16, T=9)
    sel = apply_credit(registry.get("token_filter", "delta_select"), inp, {"mode": mode, "frac": 0.5})
    cand = inp.mask.bool() & (inp.advantages != 0)[:, None]
    assert int(sel.sum()) == round(0.5 * int(cand.sum()))
    assert torch.all(sel[~cand] == 0)
    lam = delta_weights(inp.responses, inp.mask, inp.old_logp, inp.advantages, inp.hidden)
    kept, dropped = lam[cand & sel.bool()], lam[cand & ~sel.bool()]
    if mode == "top":
        assert kept.min() >= dropped.max()
    if mode == "bottom":
        assert kept.max() <= dropped.min()


# ------------------------------------------------------------------------------------------------
# the local engine: DelTA reuses the old-log-prob forward (no extra forward pass)


def _trainer(method, tmp_path, overrides=()):
    return make_trainer(method, tmp_path, overrides)


def _count_forwards(trainer):
    calls = []
    inner = trainer.model.model
    original = inner.forward

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return original(*args, **kwargs)

    inner.forward = counted
    return calls


VARIANT_RUNS = [("delta", [f"method.credit.0.variant={v}"]) for v in COEF_VARIANTS] + [
    ("delta", ["method.credit.0.variant=topk_proxy", "+method.credit.0.topk=4"]),
    ("delta_select", []),
    ("delta_select", ["method.token_filter.0.mode=random"]),
]


@pytest.mark.parametrize("method,overrides", VARIANT_RUNS)
def test_trainer_step_runs_delta_with_no_extra_forward(method, overrides, tmp_path):
    base = _trainer("dapo", tmp_path)
    t = _trainer(method, tmp_path, overrides)
    n_base, n_delta = _count_forwards(base), _count_forwards(t)
    base.train_step(0)
    m = t.train_step(0)
    assert len(n_delta) == len(n_base)  # same forwards (sampler steps, one old forward, the updates)
    if method == "delta":
        if not any(o.endswith("no_norm") for o in overrides):  # no_norm skips the mean-1 rescaling
            assert m["credit_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert m["credit_weight_std"] > 0
        assert m["loss_token_frac"] == 1.0
        table = t.token_credit_table(lambda i: t.tok.decode([i]))
        assert table["n_tokens"] > 0 and sum(r["count"] for r in table["tokens"]) == table["n_tokens"]
    else:
        assert m["loss_token_frac"] == pytest.approx(0.5, abs=0.01)  # every group informative here
    assert m["t_credit"] >= 0


@pytest.mark.parametrize("method", ["forking", "sapo", "fipo"])
def test_trainer_step_runs_the_paper_b_baselines(method, tmp_path):
    t = _trainer(method, tmp_path, ["trainer.mini_batches=2"])
    m = t.train_step(0)
    assert m["loss"] == m["loss"] and m["grad_norm"] > 0  # finite loss, a real update
    if method == "forking":
        assert m["loss_token_frac"] == pytest.approx(0.2, abs=0.02)
