"""Paper B main-table baselines: SAPO and FIPO policy losses, the forking-tokens filter, their configs.

Each function is checked against a direct (loop) reading of its equation on random tensors.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from creditlab.algos import registry
from creditlab.algos.credit.base import CreditInputs, apply_credit
from creditlab.algos.credit.forking import forking_tokens_mask
from creditlab.algos.losses import dapo_loss, discounted_future_sum, fipo_loss, fipo_weights, sapo_loss
from creditlab.plan import PlanError, check_registered, compose

D = torch.float64


def _batch(seed: int, B: int = 5, T: int = 9, scale: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logp = (old + scale * torch.randn(B, T, generator=g, dtype=D)).requires_grad_(True)
    A = torch.randn(B, generator=g, dtype=D)
    A[0] = 0.0  # a zero-advantage rollout: tau_neg, as verl's ``A > 0 else tau_neg``
    adv = A[:, None] * (0.5 + torch.rand(B, T, generator=g, dtype=D))  # per-token credit weights
    lens = torch.randint(1, T + 1, (B,), generator=g)
    lens[1] = T
    mask = (torch.arange(T)[None, :] < lens[:, None]).to(D)
    return logp, old, adv, mask


# ----------------------------------------------------------------------------------------- SAPO
def _sapo_reference(logp, old, adv, mask, tau_pos, tau_neg):
    """Loss and d loss / d logp, token by token (seq-mean-token-mean)."""
    B, T = logp.shape
    lp = logp.detach()
    loss, grad = 0.0, torch.zeros(B, T, dtype=D)
    for i in range(B):
        n = int(mask[i].sum())
        for t in range(T):
            if mask[i, t] == 0:
                continue
            r = math.exp(float(lp[i, t] - old[i, t]))
            a = float(adv[i, t])
            tau = tau_pos if a > 0 else tau_neg
            s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
            loss += -(4.0 / tau) * s * a / n / B
            grad[i, t] = -(4.0 / tau) * s * (1 - s) * tau * r * a / n / B  # d/dlogp, dr/dlogp = r
    return loss, grad


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.6, 2.5)])
def test_sapo_loss_and_gradient_match_the_equation(taus):
    logp, old, adv, mask = _batch(0)
    loss, stats = sapo_loss(logp, old, adv, mask, tau_pos=taus[0], tau_neg=taus[1])
    loss.backward()
    ref_loss, ref_grad = _sapo_reference(logp, old, adv, mask, *taus)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(logp.grad, ref_grad, rtol=1e-9, atol=1e-12)
    assert set(stats) == {"sapo_gate_mean", "approx_kl", "ratio_mean"}


def test_sapo_tau_switches_on_the_sign_of_the_advantage():
    old = torch.zeros(1, 3, dtype=D)
    logp = torch.full((1, 3), math.log(1.5), dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    gate = lambda tau: 4.0 / tau / (1 + math.exp(-tau * 0.5))  # noqa: E731
    for a, tau in ((1.0, 0.7), (-1.0, 1.9), (0.0, 1.9)):
        _, st = sapo_loss(logp, old, torch.full((1, 3), a, dtype=D), mask, tau_pos=0.7, tau_neg=1.9)
        assert st["sapo_gate_mean"] == pytest.approx(gate(tau))
    loss, _ = sapo_loss(
        logp, old, torch.tensor([[2.0, -3.0, 0.0]], dtype=D), mask, tau_pos=0.7, tau_neg=1.9, agg="token-mean"
    )
    assert loss.item() == pytest.approx((-2.0 * gate(0.7) + 3.0 * gate(1.9)) / 3)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_sapo_gradient_at_ratio_one_is_the_plain_policy_gradient(agg):
    _, old, adv, mask = _batch(1)
    logp = old.clone().requires_grad_(True)
    loss, _ = sapo_loss(logp, old, adv, mask, tau_pos=1.0, tau_neg=1.05, agg=agg)
    loss.backward()
    lp2 = old.clone().requires_grad_(True)
    from creditlab.algos.losses import aggregate

    aggregate(-adv * lp2, mask, agg).backward()  # -A grad logp (4/tau * sigmoid'(0) * tau = 1)
    torch.testing.assert_close(logp.grad, lp2.grad, rtol=1e-12, atol=1e-14)
    assert loss.item() == pytest.approx(aggregate(-adv * torch.where(adv > 0, 2.0, 2.0 / 1.05), mask, agg).item())


def test_sapo_denom_overrides_token_mean_normaliser():
    logp, old, adv, mask = _batch(2)
    l1, _ = sapo_loss(logp, old, adv, mask, agg="token-mean")
    l2, _ = sapo_loss(logp, old, adv, mask, agg="token-mean", denom=2 * mask.sum().item())
    assert l2.item() == pytest.approx(l1.item() / 2)
    with pytest.raises(ValueError):
        sapo_loss(logp, old, adv, mask, tau_neg=0.0)


# ----------------------------------------------------------------------------------------- FIPO
def _fipo_reference(logp, old, adv, mask, *, c=10.0, halflife=32.0, w_min=1.0, w_max=1.2, safety=10.0, neg=(0.8, 1.0)):
    """Weights (double loop over t, k per response i) and the kept-response mask."""
    B, T = logp.shape
    g = 2.0 ** (-1.0 / halflife)
    d = (logp.detach() - old).clamp(-20, 20)
    w = torch.zeros(B, T, dtype=D)
    keep = torch.ones(B, dtype=D)
    for i in range(B):
        n_dual = 0
        for t in range(T):
            fkl = 0.0
            for k in range(t, T):
                m = float(mask[i, k]) * (1.0 if float(d[i, k]) <= math.log(c) else 0.0)
                fkl += g ** (k - t) * m * float(d[i, k])
            wt = min(max(math.exp(fkl), w_min), w_max)
            r = math.exp(float(d[i, t]))
            if adv[i, t] < 0 and r > safety:
                wt = min(max(wt, neg[0]), neg[1])
            w[i, t] = wt
            n_dual += int(mask[i, t] > 0 and adv[i, t] < 0 and r > c)
        keep[i] = 0.0 if n_dual > 1 else 1.0
    return w, keep


def _fipo_batch(seed: int):
    logp, old, adv, mask = _batch(seed, B=6, T=11, scale=0.3)
    with torch.no_grad():
        adv[2] = -adv[2].abs() - 0.1  # row 2: A < 0, one token beyond c = 10 -> capped, kept
        logp[2, 3] = old[2, 3] + 3.0
        adv[1] = -adv[1].abs() - 0.1  # row 1 (full length): two tokens beyond c -> dropped
        logp[1, 2] = old[1, 2] + 3.0
        logp[1, 7] = old[1, 7] + 2.5
        adv[3] = adv[3].abs() + 0.1  # row 3: A > 0 beyond c: not capped, excluded from FutureKL
        logp[3, 0] = old[3, 0] + 4.0
        mask[4, 6:] = 0  # padding with shifts: must not enter FutureKL nor the drop count
        adv[4] = -adv[4].abs() - 0.1
        logp[4, 6] = old[4, 6] + 1.5
        logp[4, 8] = old[4, 8] + 5.0
        logp[4, 9] = old[4, 9] + 5.0
        mask[5] = 1.0  # row 5: A > 0, a mid-response token beyond c must not enter FutureKL
        adv[5] = adv[5].abs() + 0.1
        logp[5] = old[5] - 0.2
        logp[5, 6] = old[5, 6] + 2.5
    return logp, old, adv, mask


@pytest.mark.parametrize("kw", [{}, {"halflife": 2.0, "w_min": 0.5, "w_max": 1.5, "safety": 3.0, "neg": (0.7, 0.9)}])
def test_fipo_weights_match_a_double_loop(kw):
    logp, old, adv, mask = _fipo_batch(3)
    ref_w, _ = _fipo_reference(logp, old, adv, mask, **kw)
    names = {"halflife": "decay_halflife", "safety": "safety_thresh", "neg": "neg_w_range"}
    w, fkl = fipo_weights(logp, old, adv, mask, **{names.get(k, k): v for k, v in kw.items()})
    valid = mask > 0
    torch.testing.assert_close(w[valid], ref_w[valid], rtol=1e-6, atol=1e-6)
    lo, hi = kw.get("w_min", 1.0), kw.get("w_max", 1.2)
    neg_lo, neg_hi = kw.get("neg", (0.8, 1.0))
    capped = (adv < 0) & ((logp - old).exp() > kw.get("safety", 10.0))
    assert ((w >= lo) & (w <= hi))[~capped].all()
    assert ((w >= neg_lo) & (w <= neg_hi))[capped].all() and capped[2, 3]
    assert (w[valid] == hi).any() and (w[valid] == lo).any()  # both clip bounds are exercised


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 256])
def test_discounted_future_sum_is_chunk_independent(chunk):
    x = torch.randn(4, 11, generator=torch.Generator().manual_seed(4), dtype=D)
    g = 0.8
    ref = torch.tensor(
        [[sum(g ** (k - t) * float(x[i, k]) for k in range(t, 11)) for t in range(11)] for i in range(4)], dtype=D
    )
    torch.testing.assert_close(discounted_future_sum(x, g, chunk=chunk), ref, rtol=1e-12, atol=1e-12)


def test_fipo_loss_is_dapo_on_weighted_advantages_with_dropped_responses():
    logp, old, adv, mask = _fipo_batch(5)
    w, keep = _fipo_reference(logp, old, adv, mask)
    assert keep.tolist() == [1, 0, 1, 1, 1, 1]  # only row 1 (two dual-clipped tokens) is dropped
    loss, st = fipo_loss(logp, old, adv, mask)
    (g1,) = torch.autograd.grad(loss, logp)
    ref, _ = dapo_loss(logp, old, adv * w, mask * keep[:, None], eps_low=0.2, eps_high=0.28, dual_clip_c=10.0)
    (g2,) = torch.autograd.grad(ref, logp)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(g1, g2, rtol=1e-6, atol=1e-9)
    assert g1[1].abs().sum() == 0  # the dropped response gets no gradient ...
    # ... and is out of the token-mean normaliser: the loss is a sum over kept tokens / their count
    kept = mask * keep[:, None]
    per_tok, _ = dapo_loss(logp, old, adv * w, kept, agg="seq-mean-token-sum")
    assert loss.item() == pytest.approx(per_tok.item() * mask.shape[0] / kept.sum().item(), rel=1e-6)
    n_nonempty = int((mask.sum(-1) > 0).sum())
    assert st["fipo_dropped_frac"] == pytest.approx(1 / n_nonempty)
    assert st["fipo_neg_capped_frac"] > 0
    # the drop can be switched off
    loss_nd, st_nd = fipo_loss(logp, old, adv, mask, max_dual_clip_tokens=None)
    ref_nd, _ = dapo_loss(logp, old, adv * w, mask)
    assert loss_nd.item() == pytest.approx(ref_nd.item(), rel=1e-6) and st_nd["fipo_dropped_frac"] == 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_fipo_equals_dapo_at_ratio_one(agg):
    _, old, adv, mask = _batch(6)
    lp1, lp2 = old.clone().requires_grad_(True), old.clone().requires_grad_(True)
    l1, st1 = fipo_loss(lp1, old, adv, mask, agg=agg, denom=None)
    l2, st2 = dapo_loss(lp2, old, adv, mask, agg=agg)
    l1.backward()
    l2.backward()
    assert l1.item() == l2.item()
    assert torch.equal(lp1.grad, lp2.grad)
    assert st1["fipo_weight_mean"] == 1.0 and st1["fipo_dropped_frac"] == 0.0
    assert {k: st1[k] for k in st2} == st2


def test_fipo_denom_and_bad_bound():
    logp, old, adv, mask = _fipo_batch(7)
    l1, _ = fipo_loss(logp, old, adv, mask, max_dual_clip_tokens=None)
    l2, _ = fipo_loss(logp, old, adv, mask, max_dual_clip_tokens=None, denom=3 * mask.sum().item())
    assert l2.item() == pytest.approx(l1.item() / 3)
    with pytest.raises(ValueError, match="dual-clip"):
        fipo_loss(logp, old, adv, mask, dual_clip_c=1.1)


# -------------------------------------------------------------------------------- forking tokens
def _entropy_batch(seed: int, B: int = 7, T: int = 40):
    g = torch.Generator().manual_seed(seed)
    ent = torch.rand(B, T, generator=g, dtype=torch.float32) * 3
    lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lens[:, None]).float()
    ent = torch.where(mask > 0, ent, torch.full_like(ent, 100.0))  # padding entropy is huge: must be ignored
    return ent, mask


@pytest.mark.parametrize("top_frac", [0.2, 0.5, 0.05, 1.0])
def test_forking_selects_exactly_the_top_entropy_valid_tokens(top_frac):
    ent, mask = _entropy_batch(8)
    keep = forking_tokens_mask(ent, mask, top_frac=top_frac)
    assert keep.dtype == torch.float32 and set(keep.unique().tolist()) <= {0.0, 1.0}
    assert (keep <= mask).all()  # padding never selected
    valid = mask > 0
    n = int(valid.sum())
    n_sel = int(keep.sum())
    assert n_sel == 1 + math.floor(top_frac * (n - 1))  # distinct entropies
    assert abs(n_sel / n - top_frac) <= 1.0 / n
    sel, rest = ent[keep > 0], ent[valid & (keep == 0)]
    assert rest.numel() == 0 or sel.min() > rest.max()  # exactly the highest ones
    tau = torch.quantile(ent[valid], 1 - top_frac)  # the documented threshold
    assert torch.equal(keep > 0, valid & (ent >= tau))


def test_forking_ties_and_empty_batch():
    ent = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5], [2.0, 0.1, 0.2, 0.3, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    keep = forking_tokens_mask(ent, mask, top_frac=0.2)
    assert keep.tolist() == [[0, 1, 1, 1, 0], [1, 0, 0, 0, 0]]  # all ties at the threshold kept
    assert forking_tokens_mask(ent, torch.zeros_like(mask)).sum() == 0
    with pytest.raises(ValueError):
        forking_tokens_mask(ent, mask, top_frac=0.0)


def test_forking_through_apply_credit_and_the_loss_on_selected_tokens_only():
    ent, mask = _entropy_batch(9, B=4, T=12)
    B, T = mask.shape
    g = torch.Generator().manual_seed(10)
    old = -torch.rand(B, T, generator=g)
    inputs = CreditInputs(
        responses=torch.zeros(B, T, dtype=torch.long),
        mask=mask,
        old_logp=old,
        advantages=torch.randn(B, generator=g),
        group_ids=torch.zeros(B, dtype=torch.long),
        entropy=ent,
    )
    keep = apply_credit(registry.get("token_filter", "forking"), inputs, {"top_frac": 0.2})
    assert torch.equal(keep, forking_tokens_mask(ent, mask, 0.2))
    logp = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = inputs.advantages[:, None].expand(B, T)
    loss, _ = dapo_loss(logp, old, adv, mask * keep)
    r = (logp.detach() - old).exp()
    per = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.28))
    per = torch.where(adv < 0, torch.minimum(per, -adv * 10.0), per)
    sel = keep > 0
    assert loss.item() == pytest.approx(per[sel].sum().item() / sel.sum().item(), rel=1e-6)
    (grad,) = torch.autograd.grad(loss, logp)
    assert (grad[~sel] == 0).all()


# ------------------------------------------------------------------------------- registry/configs
def test_registered_names():
    assert {"sapo", "fipo", "dapo"} <= set(registry.names("policy_loss"))
    assert registry.get("token_filter", "forking") is forking_tokens_mask
    with pytest.raises(KeyError, match="valid choices"):
        registry.get("token_filter", "forkin")


def _accepted_kwargs(fn) -> set[str]:
    params = list(inspect.signature(fn).parameters.values())
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.fixture(scope="module")
def composed():
    return {m: compose(scale="micro", backbone="micro-s", method=m) for m in ("dapo", "forking", "sapo", "fipo")}


def test_method_configs_compose_and_are_registered(composed):
    for name, cfg in composed.items():
        check_registered(cfg, name)
        m = cfg["method"]
        loss_fn = registry.get("policy_loss", m["policy_loss"])
        assert set(m["loss_kwargs"]) <= _accepted_kwargs(loss_fn), name
        logp, old, adv, mask = _batch(11)
        loss, _ = loss_fn(logp, old, adv, mask, **m["loss_kwargs"])
        assert torch.isfinite(loss)
    assert composed["dapo"]["method"]["token_filter"] == []
    assert composed["forking"]["method"]["token_filter"] == [{"name": "forking", "top_frac": 0.2}]
    assert composed["forking"]["method"]["loss_kwargs"] == composed["dapo"]["method"]["loss_kwargs"]
    sapo = composed["sapo"]["method"]
    assert sapo["policy_loss"] == "sapo" and sapo["token_filter"] == [] and sapo["credit"] == []
    assert sapo["loss_kwargs"] == {"tau_pos": 1.0, "tau_neg": 1.05, "agg": "seq-mean-token-mean"}  # no eps leak
    fipo = composed["fipo"]["method"]
    assert fipo["policy_loss"] == "fipo" and fipo["advantage"] == "grpo"
    assert fipo["loss_kwargs"] == {
        "eps_low": 0.2,
        "eps_high": 0.28,
        "dual_clip_c": 10.0,
        "decay_halflife": 32.0,
        "w_min": 1.0,
        "w_max": 1.2,
        "safety_thresh": 10.0,
        "neg_w_range": [0.8, 1.0],
        "max_dual_clip_tokens": 1,
        "agg": "token-mean",
    }


def test_unknown_token_filter_fails_with_the_valid_choices(composed):
    cfg = {**composed["forking"], "method": {**composed["forking"]["method"], "token_filter": [{"name": "forkin"}]}}
    with pytest.raises(PlanError, match=r"unknown token_filter 'forkin'; valid choices: \[.*'forking'"):
        check_registered(cfg, "micro/micro-s/forking/s0")
