"""rankcredit_weights against a direct reading of its equation (loops over groups and tokens), and the registration
that creditlab finds through the package's entry point."""

import torch
from rankcredit.methods import rankcredit_weights

from creditlab.algos import registry


def _direct(old_logp, mask, group_ids, beta):
    """w_{i,t} = 1 + beta (r_{i,t} - 1/2), r the mid-rank of -old_logp_{i,t} among the valid tokens of its group,
    scaled to [0, 1]; 1 on padding."""
    B, T = old_logp.shape
    w = torch.ones(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            if mask[i, t] == 0:
                continue
            s = -old_logp[i, t].item()
            group = [
                -old_logp[j, u].item()
                for j in range(B)
                if group_ids[j] == group_ids[i]
                for u in range(T)
                if mask[j, u] > 0
            ]
            n = len(group)
            less = sum(v < s for v in group)
            ties = sum(v == s for v in group)
            r = (less + (ties - 1) / 2) / (n - 1) if n > 1 else 0.5
            w[i, t] = 1 + beta * (r - 0.5)
    return w


def test_weights_equal_the_equation_with_ties_padding_and_a_single_token_group():
    g = torch.Generator().manual_seed(0)
    old_logp = -torch.rand(7, 6, generator=g, dtype=torch.float64)
    old_logp[0, 1] = old_logp[1, 2] = old_logp[2, 0]  # a three-way tie in group 0
    mask = (torch.rand(7, 6, generator=g) > 0.3).double()
    mask[6] = 0
    mask[6, 0] = 1  # group 2: one valid token
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    got = rankcredit_weights(old_logp, mask, group_ids, beta=0.8)
    want = _direct(old_logp, mask, group_ids, 0.8)
    assert torch.allclose(got, want, atol=1e-12)
    assert got[6, 0] == 1.0 and (got[mask == 0] == 1).all()
    for gid in (0, 1):  # mid-ranks average 1/2: the weights average 1 over a group
        sel = (mask > 0) & (group_ids == gid)[:, None]
        assert torch.isclose(got[sel].mean(), torch.tensor(1.0, dtype=torch.float64))


def test_creditlab_finds_it_by_name():
    assert registry.get("credit", "rankcredit") is rankcredit_weights
