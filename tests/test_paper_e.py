"""Paper E (DFPO, token gradient cancellation): GSPO, GRPO-fix, DFPO and the cancellation residual.

Each piece is checked against a direct (loop) reading of its equation; the cancellation claims are
checked on the real gradient (autograd w.r.t. a logp leaf).
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict

import pytest
import torch

from creditlab.algos import registry
from creditlab.algos.advantages import grpo_advantages
from creditlab.algos.cancellation import (
    cancellation_residual,
    group_coefficients,
    loss_token_coefficients,
    shared_tokens,
    within_group_transform,
)
from creditlab.algos.losses import (
    aggregation_row_weights,
    dapo_loss,
    dfpo_loss,
    dfpo_weights,
    grpo_fix_loss,
    grpo_pruned,
    gspo_loss,
    gspo_seq_log_ratio,
)
from creditlab.plan import PlanError, check_registered, compose

D = torch.float64
GRPO_KW = {"eps_low": 0.2, "eps_high": 0.2, "dual_clip_c": None, "agg": "seq-mean-token-mean"}


def _grpo(logp, old, adv, mask, **kw):
    return dapo_loss(logp, old, adv, mask, **(GRPO_KW | kw))


def _groups(seed: int, n_groups: int = 4, G: int = 5, T: int = 9, shift: float = 0.3, shuffle: bool = True):
    """Random batch of several groups (rows shuffled), GRPO advantages, random lengths >= 1."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * G
    gid = torch.arange(n_groups).repeat_interleave(G) * 7 + 3  # non-contiguous ids
    rewards = torch.randint(0, 2, (B,), generator=g).to(D) + 0.1 * torch.rand(B, generator=g, dtype=D)
    if shuffle:
        perm = torch.randperm(B, generator=g)
        gid, rewards = gid[perm], rewards[perm]
    A = grpo_advantages(rewards, gid)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logp = old + shift * torch.randn(B, T, generator=g, dtype=D)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lens[:, None]).to(D)
    adv = A[:, None].expand(B, T).clone()
    return logp, old, adv, mask, gid, A


# ------------------------------------------------------------------------------------- registry
def test_registry_names_and_signatures():
    names = registry.names("policy_loss")
    for n in ("gspo", "grpo_fix", "dfpo", "dapo"):
        assert n in names
    for n in ("grpo_fix", "dfpo"):
        p = inspect.signature(registry.get("policy_loss", n)).parameters["group_ids"]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None
    assert "group_ids" not in inspect.signature(registry.get("policy_loss", "gspo")).parameters
    logp, old, adv, mask, gid, _ = _groups(0)
    for n in ("grpo_fix", "dfpo"):
        with pytest.raises(ValueError, match="needs group_ids"):
            registry.get("policy_loss", n)(logp, old, adv, mask)
    # GRPO-fix's shared tokens are token ids: the engines pass `responses` to a loss that names it
    p = inspect.signature(grpo_fix_loss).parameters["responses"]
    assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None
    with pytest.raises(ValueError, match="needs responses"):
        grpo_fix_loss(logp, old, adv, mask, group_ids=gid)
    with pytest.raises(ValueError, match="responses has shape"):
        grpo_fix_loss(logp, old, adv, mask, group_ids=gid, responses=torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregation_row_weights_match_aggregate(agg):
    _, _, _, mask, _, _ = _groups(1)
    mask[2] = 0.0  # an empty row
    n = aggregation_row_weights(mask, agg)
    B, L = mask.shape[0], mask.sum(-1)
    want = {
        "token-mean": torch.where(L > 0, 1 / mask.sum(), 0.0),
        "seq-mean-token-mean": torch.where(L > 0, 1 / (B * L.clamp(min=1)), 0.0),
        "seq-mean-token-sum": torch.where(L > 0, torch.full_like(L, 1 / B), 0.0),
    }[agg]
    torch.testing.assert_close(n, want)
    if agg == "token-mean":
        want50 = torch.where(L > 0, 1 / 50.0, 0.0).to(D)
        torch.testing.assert_close(aggregation_row_weights(mask, agg, denom=50.0), want50)


# ----------------------------------------------------------------------------------------- GSPO
def _seq_batch(seed: int, B: int = 8, T: int = 7):
    """Per-row ratio shifts around GSPO's tiny trust region (some rows clipped, some not)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    shifts = torch.tensor([-1e-3, -1e-4, 0.0, 1e-4, 2e-3, -2e-3, 5e-5, 3e-4], dtype=D)[:B]
    logp = old + shifts[:, None] + 1e-5 * torch.randn(B, T, generator=g, dtype=D)
    A = torch.tensor([1.0, -1.0, 0.5, -0.7, 1.2, -0.3, 0.9, -1.1], dtype=D)[:B]
    lens = torch.tensor([7, 3, 5, 1, 7, 6, 2, 4])[:B]
    mask = (torch.arange(T)[None, :] < lens[:, None]).to(D)
    return logp, old, A[:, None].expand(B, T).clone(), mask


def test_gspo_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    logp, old, _, mask = _groups(2)[:4]
    s = gspo_seq_log_ratio(logp, old, mask).exp()
    for i in range(mask.shape[0]):
        L = int(mask[i].sum())
        prod = math.prod(math.exp(float(logp[i, t] - old[i, t])) for t in range(L))
        assert s[i].item() == pytest.approx(prod ** (1.0 / L), rel=1e-12)


def _gspo_reference(logp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    """Loss and d loss / d logp of GSPO-token, rollout by rollout (seq-mean-token-mean)."""
    B, T = logp.shape
    loss, grad = 0.0, torch.zeros(B, T, dtype=D)
    n_clipped = 0
    for i in range(B):
        L = int(mask[i].sum())
        s = math.exp(sum(float(logp[i, t] - old[i, t]) for t in range(L)) / L)
        for t in range(L):
            a = float(adv[i, t])
            sc = min(max(s, 1 - eps_low), 1 + eps_high)
            loss += -min(s * a, sc * a) / L / B
            clipped = (a > 0 and s > 1 + eps_high) or (a < 0 and s < 1 - eps_low)
            grad[i, t] = 0.0 if clipped else -a * s / L / B  # d s_{i,t} / d logp_{i,t} = s_i
        n_clipped += clipped
    return loss, grad, n_clipped


def test_gspo_loss_and_gradient_match_the_equation():
    logp, old, adv, mask = _seq_batch(3)
    ref_loss, ref_grad, n_clipped = _gspo_reference(logp, old, adv, mask)
    assert 0 < n_clipped < logp.shape[0]  # both branches exercised
    lp = logp.clone().requires_grad_(True)
    loss, stats = gspo_loss(lp, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(ref_loss, rel=1e-10)
    torch.testing.assert_close(lp.grad, ref_grad, rtol=1e-9, atol=1e-15)
    assert stats["seq_clipfrac"] == pytest.approx(n_clipped / logp.shape[0])
    assert set(stats) >= {"clipfrac", "seq_clipfrac", "seq_ratio_mean", "approx_kl", "ratio_mean"}


# ---------------------------------------------------------------------------------------- DFPO
@pytest.mark.parametrize("transform", ["min_replace", "project"])
@pytest.mark.parametrize("weight,eps", [("seq_ratio", (3e-4, 4e-4)), ("token_mean", (0.2, 0.2))])
def test_dfpo_transformed_weights_cancel_in_every_group(transform, weight, eps):
    n_nonzero = n_clipped = 0
    # seq_ratio: shifts around GSPO's trust region (min_replace zeroes a group with a clipped rollout)
    for seed in range(3):
        logp, old, adv, mask, gid, A = _groups(10 + seed, shift=1e-3 if weight == "seq_ratio" else 0.3)
        c, parts = dfpo_weights(
            logp, old, adv, mask, gid, weight=weight, transform=transform, eps_low=eps[0], eps_high=eps[1]
        )
        torch.testing.assert_close(parts["adv"], A)
        coef = group_coefficients(A, c, gid)
        scale = (A.abs() * parts["w"].abs()).sum()
        assert coef.abs().max() <= 1e-12 * scale
        n_nonzero += int((c != 0).sum())
        n_clipped += int((parts["clipped"] > 0).sum())
        if transform == "min_replace":  # constant within the group: the group's smallest weight
            for g in gid.unique():
                sel = gid == g
                torch.testing.assert_close(c[sel], parts["w"][sel].min().expand(int(sel.sum())))
        else:  # w~ - w is parallel to A within each group
            for g in gid.unique():
                sel = gid == g
                a, w = A[sel], parts["w"][sel]
                torch.testing.assert_close(c[sel], w - (a @ w) / (a @ a) * a)
        # ... and the real gradient: dL/dlogp_{i,t} = -A_i c_i on valid tokens, so sum_i mean_t g_{i,t} = 0
        gcoef = loss_token_coefficients(
            dfpo_loss,
            logp,
            old,
            adv,
            mask,
            group_ids=gid,
            weight=weight,
            transform=transform,
            eps_low=eps[0],
            eps_high=eps[1],
        )
        torch.testing.assert_close(gcoef, -A[:, None] * c[:, None] * mask)
        res = cancellation_residual(gcoef, torch.zeros_like(mask, dtype=torch.long), mask, gid, adv=A)
        assert res["group_coef"].abs().max() <= 1e-12 * gcoef.abs().sum()
    assert n_nonzero > 0 and n_clipped > 0


def test_dfpo_projection_cancels_for_any_advantages_and_skips_zero_groups():
    g = torch.Generator().manual_seed(5)
    gid = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    A = torch.randn(8, generator=g, dtype=D)  # not zero-sum: a partial group in a mini-batch
    A[5:] = 0.0
    w = torch.rand(8, generator=g, dtype=D)
    wt = within_group_transform(w, A, gid, "project")
    assert group_coefficients(A, wt, gid).abs().max() < 1e-14
    torch.testing.assert_close(wt[5:], w[5:])  # ||A|| = 0: unchanged
    active = torch.tensor([True, False, True, True, True, True, True, True])
    wm = within_group_transform(w, A, gid, "min_replace", active)
    assert wm[1] == w[1] and wm[0] == wm[2] == torch.minimum(w[0], w[2])
    with pytest.raises(ValueError, match="valid choices"):
        within_group_transform(w, A, gid, "minreplace")


def test_dfpo_without_transform_is_gspo():
    logp, old, adv, mask = _seq_batch(4)
    gid = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    g_dfpo = loss_token_coefficients(dfpo_loss, logp, old, adv, mask, group_ids=gid, transform="none")
    g_gspo = loss_token_coefficients(gspo_loss, logp, old, adv, mask)
    torch.testing.assert_close(g_dfpo, g_gspo, rtol=1e-9, atol=1e-15)


# ------------------------------------------------------------------------------------ GRPO-fix
def _tokens(seed: int, shape, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_shared_tokens_match_a_direct_reading():
    """Paper E's one definition of a shared token: a valid token whose id occurs (valid) in >= 2 distinct
    rollouts of its group, at any position; checked occurrence by occurrence."""
    _, _, _, mask, gid, _ = _groups(20, n_groups=3, G=4, T=7)
    mask[5] = 0.0  # an empty row: none of its tokens exist
    tok = _tokens(1, mask.shape, 9)
    st = shared_tokens(tok, mask, gid)
    B, T = mask.shape
    occ = defaultdict(set)  # (group id, token id) -> rollouts with a valid occurrence
    for i in range(B):
        for t in range(T):
            if mask[i, t] > 0:
                occ[int(gid[i]), int(tok[i, t])].add(i)
    want = torch.tensor(
        [[mask[i, t] > 0 and len(occ[int(gid[i]), int(tok[i, t])]) >= 2 for t in range(T)] for i in range(B)]
    )
    assert torch.equal(st.shared, want) and 0 < int(want.sum()) < int((mask > 0).sum())
    assert len(st.key_group) == len(occ) and st.n_groups == 3 and (st.key[mask == 0] == -1).all()
    groups = gid.unique().tolist()
    for i in range(B):  # one key per (group, token id) pair, with its group and its rollout count
        for t in range(T):
            if mask[i, t] > 0:
                k = int(st.key[i, t])
                assert groups[int(st.key_group[k])] == int(gid[i])
                assert int(st.key_rollouts[k]) == len(occ[int(gid[i]), int(tok[i, t])])
                same = st.key == k
                assert torch.equal(same, (gid[:, None] == gid[i]) & (tok == tok[i, t]) & (mask > 0))
    # a token repeated inside one rollout is not shared; the same id in another group does not count
    one = shared_tokens(torch.tensor([[4, 4, 1], [2, 3, 1], [4, 5, 6]]), torch.ones(3, 3), torch.tensor([0, 0, 1]))
    assert one.shared.tolist() == [[False, False, True], [False, False, True], [False, False, False]]
    assert shared_tokens(tok, torch.zeros_like(mask), gid).shared.sum() == 0  # no valid token


def _grpo_fix_reference(logp, old, adv, mask, gid, tok):
    """d loss / d logp of GRPO-fix, token by token: a shared token id (>= 2 rollouts of the group, any position)
    pruned at any of its occurrences in the group is pruned at all of them; others keep GRPO's own clip."""
    B, T = logp.shape
    own = grpo_pruned(logp, old, adv, mask)
    occ = defaultdict(list)
    for j in range(B):
        for s in range(T):
            if mask[j, s] > 0:
                occ[int(gid[j]), int(tok[j, s])].append((j, s))
    grad = torch.zeros(B, T, dtype=D)
    pruned = torch.zeros(B, T, dtype=torch.bool)
    for i in range(B):
        L = int(mask[i].sum())
        for t in range(L):
            o = occ[int(gid[i]), int(tok[i, t])]
            shared = len({j for j, _ in o}) >= 2
            pruned[i, t] = any(bool(own[j, s]) for j, s in o) if shared else bool(own[i, t])
            if not pruned[i, t]:
                grad[i, t] = -float(adv[i, t]) * math.exp(float(logp[i, t] - old[i, t])) / L / B
    return grad, pruned, own


def test_grpo_fix_prunes_a_shared_token_at_every_occurrence_in_its_group():
    logp, old, adv, mask, gid, _ = _groups(6, shift=0.12)
    tok = _tokens(2, mask.shape, 40)
    lp = logp.clone().requires_grad_(True)
    loss, stats = grpo_fix_loss(lp, old, adv, mask, group_ids=gid, responses=tok)
    loss.backward()
    ref_loss, _ = _grpo(logp, old, adv, mask)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)  # values unchanged, only gradients
    want, pruned, own = _grpo_fix_reference(logp, old, adv, mask, gid, tok)
    torch.testing.assert_close(lp.grad, want, rtol=1e-10, atol=1e-15)
    shared = shared_tokens(tok, mask, gid).shared
    valid = mask > 0
    assert stats["grpo_fix_pruned_frac"] == pytest.approx(int(pruned.sum()) / int(valid.sum()))
    assert stats["grpo_fix_shared_frac"] == pytest.approx(int(shared.sum()) / int(valid.sum()))
    # the cancellation diagnostic scores the same shared tokens
    res = cancellation_residual(lp.grad, tok, mask, gid)
    assert res["shared_token_frac"] == pytest.approx(stats["grpo_fix_shared_frac"])
    # every case occurs: pruned through another occurrence of a shared id, shared and trained, unshared with
    # GRPO's own clip, unshared and trained
    assert (shared & pruned & ~own).any() and (shared & ~pruned & valid).any()
    assert (~shared & own).any() and (~shared & ~pruned & valid).any()
    # not the position reading (a position pruned in any rollout of the group is pruned in all)
    by_pos = torch.zeros_like(pruned)
    for i in range(mask.shape[0]):
        sel = (gid == gid[i])[:, None] & valid
        by_pos[i] = (own & sel).any(0) & valid[i]
    assert not torch.equal(by_pos, pruned)


def test_grpo_fix_without_clipping_is_grpo():
    logp, old, adv, mask, gid, _ = _groups(7, shift=0.02)
    g_fix = loss_token_coefficients(
        grpo_fix_loss, logp, old, adv, mask, group_ids=gid, responses=_tokens(3, mask.shape, 5)
    )
    g_grpo = loss_token_coefficients(_grpo, logp, old, adv, mask)
    torch.testing.assert_close(g_fix, g_grpo)


# ----------------------------------------------------------------------------- residual diagnostic
def _residual_reference(g, tok, mask, gid):
    """Per-group (residual, total) by dictionaries, occurrence by occurrence."""
    sums, abss, rollouts = defaultdict(float), defaultdict(float), defaultdict(set)
    for i in range(g.shape[0]):
        for t in range(g.shape[1]):
            if mask[i, t] > 0:
                k = (int(gid[i]), int(tok[i, t]))
                sums[k] += float(g[i, t])
                abss[k] += abs(float(g[i, t]))
                rollouts[k].add(i)
    res, tot = defaultdict(float), defaultdict(float)
    for k in sums:
        if len(rollouts[k]) >= 2:
            res[k[0]] += abs(sums[k])
            tot[k[0]] += abss[k]
    return res, tot


def test_cancellation_residual_matches_a_direct_reading():
    logp, old, adv, mask, gid, A = _groups(8, n_groups=3, G=4, T=8)
    tok = torch.randint(0, 6, mask.shape, generator=torch.Generator().manual_seed(0))
    g = loss_token_coefficients(_grpo, logp, old, adv, mask)
    out = cancellation_residual(g, tok, mask, gid, adv=A)
    res, tot = _residual_reference(g, tok, mask, gid)
    groups = out["groups"].tolist()
    torch.testing.assert_close(out["residual"], torch.tensor([res[k] for k in groups], dtype=D))
    torch.testing.assert_close(out["total"], torch.tensor([tot[k] for k in groups], dtype=D))
    rels = [res[k] / tot[k] for k in groups if tot[k] > 0]
    assert out["rel_residual"] == pytest.approx(sum(rels) / len(rels))
    assert out["rel_residual_pooled"] == pytest.approx(sum(res.values()) / sum(tot.values()))
    # group coefficient: sum_i A_i w_i with w_i = -mean_t g_{i,t} / A_i
    L = mask.sum(-1)
    for k, c in zip(groups, out["group_coef"]):
        sel = gid == k
        w = -(g[sel] * mask[sel]).sum(-1) / L[sel] / A[sel]
        assert c.item() == pytest.approx((A[sel] * w).sum().item(), abs=1e-12)
    torch.testing.assert_close(out["w"], -(g * mask).sum(-1) / L / A)


def _shared_example(permute: bool):
    """Two groups of 4; every rollout of a group has the same token multiset (identical sequences, or
    permutations of one with ``permute``); ratio 1 except one token clipped in ONE rollout per group."""
    T, G = 6, 4
    gen = torch.Generator().manual_seed(9)
    gid = torch.tensor([0] * G + [1] * G)
    A = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], dtype=D), gid)
    base = torch.tensor([[3, 5, 3, 7, 2, 9], [4, 4, 1, 8, 6, 1]])
    tok = torch.cat([base[0].repeat(G, 1), base[1].repeat(G, 1)])
    if permute:
        tok = torch.stack([row[torch.randperm(T, generator=gen)] for row in tok])
    old = -torch.rand(2 * G, T, generator=gen, dtype=D) * 2
    logp = old.clone()
    assert A[0] > 0 and A[5] < 0
    logp[0, 2] += math.log(1.5)  # A > 0, r = 1.5: pruned by the min-clip in rollout 0 only
    logp[5, 3] += math.log(0.6)  # A < 0, r = 0.6: pruned in rollout 5 only
    mask = torch.ones(2 * G, T, dtype=D)
    return logp, old, A[:, None].expand(2 * G, T).clone(), mask, gid, tok, A


def test_grpo_with_group_constant_weights_has_zero_residual():
    logp, old, adv, mask, gid, tok, A = _shared_example(permute=True)
    g = loss_token_coefficients(_grpo, old, old, adv, mask)  # ratio 1 everywhere, equal lengths
    out = cancellation_residual(g, tok, mask, gid, adv=A)
    assert out["rel_residual"] < 1e-12 and out["group_coef_rel"] < 1e-12
    assert out["shared_token_frac"] == 1.0 and out["n_groups_scored"] == 2


def test_asymmetric_clipping_breaks_cancellation_and_the_fixes_restore_it():
    logp, old, adv, mask, gid, tok, A = _shared_example(permute=False)
    res = {}
    for name, fn, kw in [
        ("grpo", _grpo, {}),
        ("gspo", gspo_loss, {}),
        ("grpo_fix", grpo_fix_loss, {"group_ids": gid, "responses": tok}),
        ("dfpo_project", dfpo_loss, {"group_ids": gid, "transform": "project"}),
        (
            "dfpo_min",
            dfpo_loss,
            {"group_ids": gid, "transform": "min_replace", "weight": "token_mean", "eps_low": 0.2, "eps_high": 0.2},
        ),
    ]:
        g = loss_token_coefficients(fn, logp, old, adv, mask, **kw)
        assert g.abs().sum() > 0, name
        res[name] = cancellation_residual(g, tok, mask, gid, adv=A)["rel_residual"]
    assert res["grpo"] > 0.01 and res["gspo"] > 0.01
    assert res["grpo_fix"] < 1e-12 and res["dfpo_project"] < 1e-12 and res["dfpo_min"] < 1e-12
    # permuted sequences (same multiset, different positions): DFPO and GRPO-fix (shared tokens are token ids,
    # at any position) still cancel exactly
    logp, old, adv, mask, gid, tok, A = _shared_example(permute=True)
    g = loss_token_coefficients(grpo_fix_loss, logp, old, adv, mask, group_ids=gid, responses=tok)
    assert g.abs().sum() > 0 and cancellation_residual(g, tok, mask, gid)["rel_residual"] < 1e-12
    for transform in ("project", "min_replace"):
        g = loss_token_coefficients(
            dfpo_loss,
            logp,
            old,
            adv,
            mask,
            group_ids=gid,
            transform=transform,
            weight="token_mean",
            eps_low=0.2,
            eps_high=0.2,
        )
        assert cancellation_residual(g, tok, mask, gid)["rel_residual"] < 1e-12
    g = loss_token_coefficients(_grpo, logp, old, adv, mask)
    assert cancellation_residual(g, tok, mask, gid)["rel_residual"] > 0.01


def test_the_length_normaliser_must_be_inside_the_transformed_weight():
    """Unequal lengths, one token (id 0) shared once by every rollout, ratio 1: 1/L_i breaks cancellation
    unless it is transformed with the weight (norm_in_weight)."""
    gid = torch.tensor([0, 0, 0, 0])
    A = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D), gid)
    lens = torch.tensor([2, 5, 3, 6])
    T = 6
    mask = (torch.arange(T)[None, :] < lens[:, None]).to(D)
    tok = torch.arange(1, 4 * T + 1).reshape(4, T)  # all distinct...
    tok[:, 0] = 0  # ...but token 0, shared
    old = -torch.ones(4, T, dtype=D)
    adv = A[:, None].expand(4, T).clone()
    rel = {}
    for nin in (True, False):
        g = loss_token_coefficients(
            dfpo_loss, old, old, adv, mask, group_ids=gid, transform="project", norm_in_weight=nin
        )
        rel[nin] = cancellation_residual(g, tok, mask, gid)["rel_residual"]
    g = loss_token_coefficients(_grpo, old, old, adv, mask)
    assert rel[True] < 1e-12 and rel[False] > 0.01
    assert cancellation_residual(g, tok, mask, gid)["rel_residual"] > 0.01


def test_losses_tolerate_empty_rows_and_float32():
    logp, old, adv, mask, gid, _ = _groups(12)
    mask[3] = 0.0
    f = torch.float32
    tok = _tokens(4, mask.shape, 6)
    for name, kw in [
        ("gspo", {}),
        ("grpo_fix", {"group_ids": gid, "responses": tok}),
        ("dfpo", {"group_ids": gid}),
        ("dfpo", {"group_ids": gid, "transform": "min_replace"}),
    ]:
        lp = logp.to(f).requires_grad_(True)
        loss, stats = registry.get("policy_loss", name)(lp, old.to(f), adv.to(f), mask.to(f), **kw)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp.grad).all() and lp.grad[3].abs().sum() == 0, name
        assert all(isinstance(v, float) and math.isfinite(v) for v in stats.values()), (name, stats)


# ------------------------------------------------------------------------------------- configs
def test_method_configs_compose_and_are_registered():
    _, _, _, mask, gid, _ = _groups(13)
    logp, old, adv = _groups(13)[:3]
    for method, loss_name in [("gspo", "gspo"), ("grpo_fix", "grpo_fix"), ("dfpo", "dfpo"), ("grpo", "dapo")]:
        cfg = compose(scale="micro", backbone="micro-s", method=method)
        if loss_name in ("grpo_fix", "dfpo"):  # group-coupled: the scale's default (random) batching splits groups
            with pytest.raises(PlanError, match=r"\[rule whole_groups\]"):
                check_registered(cfg, method)
            cfg = compose(scale="micro", backbone="micro-s", method=method, overrides=["trainer.batching=sequential"])
        check_registered(cfg, method)
        m = cfg["method"]
        assert m["policy_loss"] == loss_name and m["advantage"] == "grpo" and m["credit"] == []
        fn = registry.get("policy_loss", loss_name)
        params = inspect.signature(fn).parameters
        assert set(m["loss_kwargs"]) <= {p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY}
        kw = (
            dict(m["loss_kwargs"])
            | ({"group_ids": gid} if "group_ids" in params else {})
            | ({"responses": _tokens(5, mask.shape, 6)} if "responses" in params else {})
        )
        loss, _ = fn(logp.clone().requires_grad_(True), old, adv, mask, **kw)
        assert torch.isfinite(loss)
    assert compose(scale="micro", backbone="micro-s", method="gspo")["method"]["loss_kwargs"] == {
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "max_log_ratio": 10.0,
        "agg": "seq-mean-token-mean",
    }  # no dapo leak
    assert compose(scale="micro", backbone="micro-s", method="grpo")["method"]["loss_kwargs"] == GRPO_KW
