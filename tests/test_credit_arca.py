"""ARCA (Paper D): within-trajectory normalisation, Gini, EffN/T and the five token weightings, each
against a direct loop-by-loop reading of the paper's equations (python floats, explicit loops)."""

from __future__ import annotations

import math

import pytest
import torch

from creditlab.algos import registry
from creditlab.algos.credit.arca import (
    adapter_residual_norm,
    arca_divergence_weights,
    arca_entropy_reduction_weights,
    arca_surprisal_weights,
    arca_uniform_weights,
    arca_weights,
    effective_token_ratio,
    gini,
    normalize_within_trajectory,
    weight_diagnostics,
)
from creditlab.algos.credit.base import CreditInputs, apply_credit

torch.set_num_threads(1)

NAMES = ("arca_uniform", "arca_surprisal", "arca_entropy_reduction", "arca_divergence", "arca")
EPS = 1e-6


# ------------------------------------------------------------------------------------------------
# direct readings of the equations


def ref_normalize(a, valid, eps):
    """eq. 8 row by row: w_t = (a_t + eps) / sum_k (a_k + eps) over valid k; 0 elsewhere."""
    out = []
    for row, vrow in zip(a, valid):
        den = sum(row[t] + eps for t in range(len(row)) if vrow[t])
        out.append([(row[t] + eps) / den if vrow[t] and den > 0 else 0.0 for t in range(len(row))])
    return out


def ref_scale(w, valid, scale):
    if scale == "sum1":
        return w
    return [[x * sum(vrow) for x in row] for row, vrow in zip(w, valid)]


def ref_gini_pairs(x):
    """G = sum_i sum_j |x_i - x_j| / (2 n^2 mean x)."""
    n = len(x)
    mean = sum(x) / n
    tot = 0.0
    for i in range(n):
        for j in range(n):
            tot += abs(x[i] - x[j])
    return tot / (2 * n * n * mean)


def ref_effn(x):
    """EffN/T = 1 / (T sum_t p_t^2), p = x / sum x."""
    s = sum(x)
    return 1.0 / (len(x) * sum((v / s) ** 2 for v in x))


def batch(B=4, T=9, d=6, seed=0):
    """Random rollout batch with right padding of varied lengths, one full row and one empty row."""
    g = torch.Generator().manual_seed(seed)
    lengths = [T, 5, 1, 0][:B] + [3] * max(0, B - 4)
    mask = torch.zeros(B, T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    old_logp = -torch.rand(B, T, generator=g) * 3
    ref_logp = old_logp + 0.3 * torch.randn(B, T, generator=g)
    entropy = torch.rand(B, T, generator=g) * 2
    hidden = torch.randn(B, T, d, generator=g)
    base_hidden = hidden + 0.5 * torch.randn(B, T, d, generator=g)
    # garbage on padding must not leak
    pad = mask == 0
    old_logp[pad] = float("nan")
    entropy[pad] = 1e6
    return dict(
        mask=mask, old_logp=old_logp, ref_logp=ref_logp, entropy=entropy, hidden=hidden, base_hidden=base_hidden
    )


def valid_of(mask):
    return [[bool(v) for v in row] for row in mask.tolist()]


def ref_scores(name, b):
    """a_t of each weighting, loop by loop (padding values 0: ref_normalize ignores them)."""
    valid = valid_of(b["mask"])
    B, T = b["mask"].shape
    a = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not valid[i][t]:
                continue
            if name == "arca_uniform":
                a[i][t] = 1.0
            elif name == "arca_surprisal":
                a[i][t] = -float(b["old_logp"][i, t])
            elif name == "arca_entropy_reduction":
                last = t + 1 >= T or not valid[i][t + 1]
                a[i][t] = 0.0 if last else max(0.0, float(b["entropy"][i, t]) - float(b["entropy"][i, t + 1]))
            elif name == "arca_divergence":
                a[i][t] = abs(float(b["old_logp"][i, t]) - float(b["ref_logp"][i, t]))
            elif name == "arca":
                a[i][t] = math.sqrt(
                    sum(
                        (float(b["hidden"][i, t, k]) - float(b["base_hidden"][i, t, k])) ** 2
                        for k in range(b["hidden"].shape[-1])
                    )
                )
    return a


FNS = {
    "arca_uniform": lambda b, **kw: arca_uniform_weights(b["mask"], **kw),
    "arca_surprisal": lambda b, **kw: arca_surprisal_weights(b["old_logp"], b["mask"], **kw),
    "arca_entropy_reduction": lambda b, **kw: arca_entropy_reduction_weights(b["entropy"], b["mask"], **kw),
    "arca_divergence": lambda b, **kw: arca_divergence_weights(b["old_logp"], b["ref_logp"], b["mask"], **kw),
    "arca": lambda b, **kw: arca_weights(b["hidden"], b["base_hidden"], b["mask"], **kw),
}


# ------------------------------------------------------------------------------------------------
# normalisation


def test_normalize_sums_to_one_zero_padding_empty_rows():
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(5, 7, generator=g) * 4
    mask = torch.zeros(5, 7)
    for i, n in enumerate([7, 4, 1, 0, 6]):
        mask[i, :n] = 1
    scores[mask == 0] = float("nan")  # padding garbage
    w = normalize_within_trajectory(scores, mask, 1e-3)
    assert torch.isfinite(w).all()
    sums = w.sum(-1)
    assert torch.allclose(sums[[0, 1, 2, 4]], torch.ones(4))
    assert sums[3] == 0 and (w[3] == 0).all()
    assert (w[mask == 0] == 0).all()
    expect = ref_normalize(torch.nan_to_num(scores).tolist(), valid_of(mask), 1e-3)
    assert torch.allclose(w, torch.tensor(expect), atol=1e-6)
    # eps = 0 with all-zero scores: zeros, not NaN
    w0 = normalize_within_trajectory(torch.zeros(2, 3), torch.ones(2, 3), 0.0)
    assert (w0 == 0).all()
    # eps dominating: uniform
    wu = normalize_within_trajectory(torch.rand(1, 4, generator=g) * 1e-9, torch.ones(1, 4), 1.0)
    assert torch.allclose(wu, torch.full((1, 4), 0.25))
    with pytest.raises(ValueError):
        normalize_within_trajectory(scores, mask, -1.0)


# ------------------------------------------------------------------------------------------------
# concentration measures


def test_gini_against_pairwise_loop():
    g = torch.Generator().manual_seed(2)
    w = torch.rand(6, 11, generator=g) ** 3
    mask = torch.zeros(6, 11)
    lengths = [11, 7, 2, 1, 0, 5]
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    w[mask == 0] = 123.0  # padding must be ignored
    G = gini(w, mask)
    for i, n in enumerate(lengths):
        if n == 0:
            assert G[i] == 0
            continue
        assert G[i].item() == pytest.approx(ref_gini_pairs(w[i, :n].tolist()), abs=1e-5)
    assert G[3] == 0  # one token: 0
    # uniform -> 0, one-hot -> 1 - 1/n, scale invariant
    assert torch.allclose(gini(torch.full((2, 8), 0.3), torch.ones(2, 8)), torch.zeros(2), atol=1e-7)
    oh = torch.zeros(1, 8)
    oh[0, 3] = 1.0
    assert gini(oh, torch.ones(1, 8)).item() == pytest.approx(1 - 1 / 8)
    assert torch.allclose(gini(w * 7.0, mask), G, atol=1e-6)


def test_effective_token_ratio_against_loop():
    g = torch.Generator().manual_seed(3)
    w = torch.rand(5, 9, generator=g)
    mask = torch.zeros(5, 9)
    lengths = [9, 4, 1, 0, 6]
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    w[mask == 0] = 50.0
    r = effective_token_ratio(w, mask)
    for i, n in enumerate(lengths):
        if n == 0:
            assert r[i] == 0
        else:
            assert r[i].item() == pytest.approx(ref_effn(w[i, :n].tolist()), rel=1e-5)
    assert torch.allclose(effective_token_ratio(torch.full((1, 6), 2.0), torch.ones(1, 6)), torch.ones(1))
    oh = torch.zeros(1, 6)
    oh[0, 0] = 1.0
    assert effective_token_ratio(oh, torch.ones(1, 6)).item() == pytest.approx(1 / 6)


# ------------------------------------------------------------------------------------------------
# the five weightings


@pytest.mark.parametrize("scale", ["mean1", "sum1"])
@pytest.mark.parametrize("name", NAMES)
def test_weighting_against_loop(name, scale):
    b = batch()
    eps = 1e-3
    w = FNS[name](b, eps=eps, scale=scale)
    valid = valid_of(b["mask"])
    expect = ref_scale(ref_normalize(ref_scores(name, b), valid, eps), valid, scale)
    assert w.shape == b["mask"].shape
    assert torch.isfinite(w).all()
    assert torch.allclose(w, torch.tensor(expect), atol=1e-5, rtol=1e-5)
    assert (w[b["mask"] == 0] == 0).all()
    sums = w.sum(-1)
    n = b["mask"].sum(-1)
    target = n if scale == "mean1" else (n > 0).float()
    assert torch.allclose(sums, target, atol=1e-4)


def test_default_eps_is_documented_value():
    b = batch()
    w = FNS["arca"](b)
    expect = ref_scale(ref_normalize(ref_scores("arca", b), valid_of(b["mask"]), EPS), valid_of(b["mask"]), "mean1")
    assert torch.allclose(w, torch.tensor(expect), atol=1e-5)


def test_mean1_uniform_is_ones_on_valid_tokens():
    b = batch()
    w = arca_uniform_weights(b["mask"])
    assert torch.equal(w, b["mask"])
    assert torch.allclose(arca_uniform_weights(b["mask"], scale="sum1").sum(-1), (b["mask"].sum(-1) > 0).float())
    # a constant score under any scheme == uniform
    h = torch.randn(2, 5, 3)
    const = arca_weights(h + 1.0, h, torch.ones(2, 5))  # residual norm sqrt(3) everywhere
    assert torch.allclose(const, torch.ones(2, 5))
    with pytest.raises(ValueError, match="scale"):
        arca_uniform_weights(b["mask"], scale="sum")


def test_entropy_reduction_last_token_zero():
    entropy = torch.tensor([[3.0, 1.0, 2.0, 0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    # a = [2, 0, 1.5, 0 (last valid; next is padding)]
    w = arca_entropy_reduction_weights(entropy, mask, eps=0.0, scale="sum1")
    assert torch.allclose(w, torch.tensor([[2 / 3.5, 0.0, 1.5 / 3.5, 0.0, 0.0]]))


# ------------------------------------------------------------------------------------------------
# apply_credit, registry, diagnostics


def inputs_of(b, with_base=True):
    B, T = b["mask"].shape
    return CreditInputs(
        responses=torch.zeros(B, T, dtype=torch.long),
        mask=b["mask"],
        old_logp=b["old_logp"],
        advantages=torch.randn(B),
        group_ids=torch.arange(B) // 2,
        hidden=b["hidden"],
        entropy=b["entropy"],
        ref_logp=b["ref_logp"],
        base_hidden=b["base_hidden"] if with_base else None,
    )


@pytest.mark.parametrize("name", NAMES)
def test_apply_credit_each(name):
    b = batch()
    fn = registry.get("credit", name)
    w = apply_credit(fn, inputs_of(b), {"eps": 1e-3, "scale": "mean1"})
    assert torch.allclose(w, FNS[name](b, eps=1e-3))
    w_default = apply_credit(fn, inputs_of(b), {})
    assert w_default.shape == b["mask"].shape and torch.isfinite(w_default).all()


def test_arca_needs_base_hidden():
    b = batch()
    with pytest.raises(ValueError, match="base_hidden"):
        apply_credit(registry.get("credit", "arca"), inputs_of(b, with_base=False), {})
    with pytest.raises(ValueError, match="base_hidden"):
        arca_weights(b["hidden"], None, b["mask"])
    with pytest.raises(ValueError, match="shape"):
        arca_weights(b["hidden"], b["base_hidden"][:, :, :2], b["mask"])


def test_registry_names():
    names = registry.names("credit")
    for n in NAMES:
        assert n in names


def test_weight_diagnostics():
    b = batch()
    res = adapter_residual_norm(b["hidden"], b["base_hidden"])
    w = arca_weights(b["hidden"], b["base_hidden"], b["mask"])
    d = weight_diagnostics(w, b["mask"], residual=res)
    valid = valid_of(b["mask"])
    rows = [i for i in range(len(valid)) if any(valid[i])]
    ws = [[float(w[i, t]) for t in range(len(valid[i])) if valid[i][t]] for i in rows]
    assert d["weight_gini"] == pytest.approx(sum(ref_gini_pairs(x) for x in ws) / len(ws), abs=1e-5)
    assert d["eff_token_ratio"] == pytest.approx(sum(ref_effn(x) for x in ws) / len(ws), rel=1e-5)
    flat = [ref_scores("arca", b)[i][t] for i in range(len(valid)) for t in range(len(valid[i])) if valid[i][t]]
    assert d["arca_residual_mean"] == pytest.approx(sum(flat) / len(flat), rel=1e-5)
    assert d["arca_residual_max"] == pytest.approx(max(flat), rel=1e-5)
    assert set(weight_diagnostics(w, b["mask"])) == {"weight_gini", "eff_token_ratio"}
    u = weight_diagnostics(arca_uniform_weights(b["mask"]), b["mask"])
    assert u["weight_gini"] == pytest.approx(0.0, abs=1e-6) and u["eff_token_ratio"] == pytest.approx(1.0)
    empty = weight_diagnostics(torch.zeros(2, 3), torch.zeros(2, 3), residual=torch.zeros(2, 3))
    assert all(math.isnan(v) for v in empty.values())
