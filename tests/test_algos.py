"""Advantages and the DAPO loss against direct, loop-based readings of their equations."""

import math

import pytest
import torch

from creditlab.algos import registry
from creditlab.algos.advantages import dr_grpo_advantages, grpo_advantages, rloo_advantages
from creditlab.algos.losses import aggregate, dapo_loss


def _groups(rewards, gids):
    out = {}
    for i, g in enumerate(gids):
        out.setdefault(g, []).append(i)
    return out


def test_grpo_matches_direct_reading():
    torch.manual_seed(0)
    gids = torch.tensor([3, 1, 3, 1, 3, 2, 1, 3])  # shuffled groups, sizes 4, 3, 1
    rewards = torch.randint(0, 2, (8,)).float()
    rewards[5] = 1.0
    adv = grpo_advantages(rewards, gids)
    for g, idx in _groups(rewards, gids.tolist()).items():
        rs = [rewards[i].item() for i in idx]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1)) if len(rs) > 1 else 1.0
        for i in idx:
            assert adv[i].item() == pytest.approx((rewards[i].item() - mean) / (std + 1e-6), abs=1e-5)
    # matches torch.std (unbiased) on one group
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    a = grpo_advantages(r, torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(a, (r - r.mean()) / (r.std() + 1e-6))


def test_dr_grpo_and_rloo():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.25])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    torch.testing.assert_close(dr_grpo_advantages(r, g), torch.tensor([0.5, -0.5, -0.5, 0.5, 0.125, -0.125]))
    expect = []
    for i in range(6):
        peers = [r[j].item() for j in range(6) if g[j] == g[i] and j != i]
        expect.append(r[i].item() - sum(peers) / len(peers))
    torch.testing.assert_close(rloo_advantages(r, g), torch.tensor(expect))


def test_registry_lookup_and_error():
    assert registry.get("advantage", "grpo") is grpo_advantages
    with pytest.raises(KeyError, match="valid choices"):
        registry.get("advantage", "nope")
    assert "dapo" in registry.names("policy_loss")


def _direct_dapo(logp, old, adv, mask, el, eh, c):
    num, den = 0.0, 0.0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            r = math.exp(logp[i, t] - old[i, t])
            a = adv[i, t].item()
            l = max(-a * r, -a * min(max(r, 1 - el), 1 + eh))
            if a < 0:
                l = min(l, -a * c)
            num += l
            den += 1
    return num / den


def test_dapo_loss_matches_direct_reading_and_gradient_flows():
    torch.manual_seed(1)
    B, T = 4, 6
    old = -torch.rand(B, T) * 3
    logp = (old + torch.randn(B, T) * 0.8).requires_grad_(True)  # wide ratios: clip + dual clip fire
    adv = torch.randn(B, 1).expand(B, T).clone()
    mask = (torch.rand(B, T) > 0.2).float()
    loss, stats = dapo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    assert loss.item() == pytest.approx(_direct_dapo(logp.detach(), old, adv, mask, 0.2, 0.28, 3.0), rel=1e-5)
    assert 0 < stats["clipfrac"] < 1
    loss.backward()
    assert logp.grad is not None and torch.all(logp.grad[mask == 0] == 0)


def test_aggregation_modes():
    l = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(l, m, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(l, m, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(l, m, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError, match="valid choices"):
        aggregate(l, m, "bogus")
