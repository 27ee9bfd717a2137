"""Δlog p paper: reweighting functions against direct readings, and Lemma 3.1 with autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from creditlab.algos import registry
from creditlab.algos.credit.base import CreditInputs, apply_credit
from creditlab.algos.credit.dlogp import dlogp_weights, dominate_weights, ppl_weights


def _logp(B=6, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(B, T, generator=g) * 4


def test_dlogp_and_dominate_elementwise():
    lp = _logp()
    w, d = dlogp_weights(lp, alpha=0.2), dominate_weights(lp, c=0.2)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            p = math.exp(lp[i, t].item())
            assert w[i, t].item() == pytest.approx(1 + 0.2 * (1 - p), rel=1e-6)
            assert d[i, t].item() == pytest.approx(0.2 * p + 0.8, rel=1e-6)
    assert (w >= 1).all() and (w <= 1.2).all()


@pytest.mark.parametrize("variant", ["ppl", "ppl-norm", "ppl-norm-clamp"])
def test_ppl_variants_direct_reading(variant):
    lp = _logp(B=8, T=6, seed=1)
    mask = torch.ones(8, 6)
    mask[1, 3:] = 0
    mask[5, 1:] = 0
    gids = torch.tensor([7, 7, 3, 3, 7, 3, 7, 3])
    w = ppl_weights(lp, mask, gids, c=0.5, variant=variant)
    assert w.shape == (8, 1)
    L = [-(sum(lp[i, t].item() for t in range(6) if mask[i, t]) / mask[i].sum().item()) for i in range(8)]
    for i in range(8):
        if variant == "ppl":
            expect = 1 - 0.5 * L[i]
        else:
            peers = [L[j] for j in range(8) if gids[j] == gids[i]]
            z = (L[i] - np.mean(peers)) / (np.std(peers) + 1e-6)
            expect = 1 - 0.5 * z
            if variant == "ppl-norm-clamp":
                expect = min(max(expect, 0.8), 1.2)
        assert w[i, 0].item() == pytest.approx(expect, rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="valid choices"):
        ppl_weights(lp, mask, gids, variant="ppl-max")


def test_registered_and_applied_from_a_batch():
    lp = _logp(B=4, T=3)
    batch = CreditInputs(
        responses=torch.zeros(4, 3, dtype=torch.long),
        mask=torch.ones(4, 3),
        old_logp=lp,
        advantages=torch.zeros(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    w = apply_credit(registry.get("credit", "dlogp"), batch, {"alpha": 0.1})
    torch.testing.assert_close(w, 1 + 0.1 * (1 - lp.exp()))
    w = apply_credit(registry.get("credit", "ppl"), batch, {"c": 0.1})
    assert w.shape == (4, 3) and torch.all(w[:, 0:1] == w)  # one weight per response
    with pytest.raises(ValueError, match="needs \\['hidden'\\]"):
        apply_credit(lambda old_logp, hidden: old_logp, batch, {})


@pytest.mark.parametrize("seed", range(5))
def test_lemma_3_1_logit_gradient_l1_norm(seed):
    """||grad_z (w log softmax(z)_y)||_1 = 2 |w| (1 - p_y)."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(50, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    y = int(torch.randint(0, 50, (1,), generator=g))
    w = float(torch.randn(1, generator=g))
    (w * torch.log_softmax(z, -1)[y]).backward()
    p = torch.softmax(z.detach(), -1)[y].item()
    assert z.grad.abs().sum().item() == pytest.approx(2 * abs(w) * (1 - p), rel=1e-10)
