"""Paper C coupling pieces (analysis/coupling.py): the output-layer kernel proxy and the masking experiment."""

import pytest
import torch

from conftest import make_trainer
from creditlab.algos.cancellation import loss_token_coefficients
from creditlab.analysis.coupling import (
    PARAMS,
    POOLS,
    SETS,
    coupling_kernel_proxy,
    masking_experiment,
    output_similarity,
)
from creditlab.lm.batch import pack, response_forward
from creditlab.models.tiny import build_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tr = make_trainer("dapo", tmp_path_factory.mktemp("coupling"))
    ro, _ = tr.collect(0)
    batch = pack(ro.prompts, ro.responses, tr.tok.pad_token_id)
    adv = tr.advantage_fn(torch.tensor(ro.rewards), torch.tensor(ro.group_ids))
    mask = batch.response_mask
    adv_tok = adv[:, None] * mask
    return tr, batch, adv_tok, mask


def _pick_tokens(batch, n=12, seed=0):
    """~n valid response positions: all of the most frequent token id's first few, then random ones."""
    valid = batch.response_mask > 0
    ys = batch.responses
    ids, counts = torch.unique(ys[valid], return_counts=True)
    top = ids[counts.argmax()]
    same = (valid & (ys == top)).nonzero()[:4]
    rest = valid.nonzero()
    rest = rest[torch.randperm(rest.shape[0], generator=torch.Generator().manual_seed(seed))]
    picked = [tuple(x) for x in same.tolist()]
    for x in rest.tolist():
        if len(picked) == n:
            break
        if tuple(x) not in picked:
            picked.append(tuple(x))
    return picked


def _gram(grads):
    g = torch.stack([x.reshape(-1).double() for x in grads])
    return g @ g.T


def _proxy_inputs(model, batch, picked):
    with torch.no_grad():
        h = response_forward(model, batch, with_hidden=True).hidden
    W = model.get_output_embeddings().weight.detach()
    hs = torch.stack([h[b, t] for b, t in picked]).double()
    probs = torch.softmax(hs @ W.double().T, -1)
    ys = torch.stack([batch.responses[b, t] for b, t in picked])
    return hs, probs, ys


def _assert_close_scaled(a, b, rel=1e-5):
    scale = b.abs().max()
    assert (a - b).abs().max() <= rel * scale, float((a - b).abs().max() / scale)


def test_output_similarity_expanded_equals_dot_form():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(9, 7, generator=g, dtype=torch.float64) * 2, -1)
    tokens = torch.tensor([0, 3, 3, 6, 0, 1, 3, 2, 6])
    e = torch.nn.functional.one_hot(tokens, 7).double()
    dot = (e - probs) @ (e - probs).T
    s = output_similarity(probs, tokens)
    assert s.shape == (9, 9)
    torch.testing.assert_close(s, dot, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s.T)
    h = torch.randn(9, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(coupling_kernel_proxy(h, probs, tokens), (h @ h.T) * dot)
    with pytest.raises(ValueError):
        output_similarity(probs, tokens[:3])


def test_kernel_proxy_matches_autograd_lm_head_gradients(setup):
    """K_ij = <d logp_i/dW, d logp_j/dW>_F with W the LM head, one autograd backward per token.

    The micro model ties its embeddings (config ``tie_word_embeddings``; asserted below), so the
    gradient of log p w.r.t. ``lm_head.weight`` also holds the input-embedding path: there the exact
    reference is the gradient through the LM-head *use* only, logits = h @ Wc.T with
    Wc = W.detach().clone().requires_grad_() (and we check that the shared weight's full gradient
    indeed differs). On an untied copy of the same architecture the reference is the plain gradient
    w.r.t. ``lm_head.weight`` of the real forward.
    """
    tr, batch, _, _ = setup
    model = tr.model
    picked = _pick_tokens(batch)
    ys = batch.responses
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
        with torch.no_grad():
            out = response_forward(model, batch, with_hidden=True)
        Wc = model.lm_head.weight.detach().clone().requires_grad_(True)
        logp = torch.log_softmax(out.hidden @ Wc.T, -1).gather(-1, ys[..., None])[..., 0]
        torch.testing.assert_close(logp.detach(), out.logp)  # hidden is the LM-head input
        grads = [torch.autograd.grad(logp[b, t], Wc, retain_graph=True)[0] for b, t in picked]
        # the tied weight's full gradient (LM head + input embedding paths) is not the LM-head one
        full = response_forward(model, batch)
        g_full = torch.autograd.grad(full.logp[picked[0]], model.lm_head.weight)[0]
        assert not torch.allclose(g_full, grads[0], atol=1e-4)
    else:
        out = response_forward(model, batch)
        grads = [torch.autograd.grad(out.logp[b, t], model.lm_head.weight, retain_graph=True)[0] for b, t in picked]
    hs, probs, yy = _proxy_inputs(model, batch, picked)
    K = coupling_kernel_proxy(hs, probs, yy)
    G = _gram(grads)
    assert (K.diagonal() > 0).all() and (yy[:, None] == yy[None, :]).sum() > len(picked)  # same-id pairs present
    _assert_close_scaled(K, G)

    # untied copy of the same architecture: the real lm_head.weight gradient of the real forward
    arch = dict(tr.cfg["model"]["arch"], tie_word_embeddings=False)
    tok = tr.tok
    untied = build_model(arch, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, seed=1)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    out = response_forward(untied, batch)
    grads = [torch.autograd.grad(out.logp[b, t], untied.lm_head.weight, retain_graph=True)[0] for b, t in picked]
    hs, probs, yy = _proxy_inputs(untied, batch, picked)
    _assert_close_scaled(coupling_kernel_proxy(hs, probs, yy), _gram(grads))


def test_masking_experiment_leaves_model_unchanged(setup):
    tr, batch, adv_tok, mask = setup
    model = tr.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    for params in PARAMS:
        res = masking_experiment(
            model,
            batch,
            adv_tok,
            mask,
            tr.loss_fn,
            loss_kwargs=tr.mcfg["loss_kwargs"],
            params=params,
            lr=0.1,
            n_candidates=3,
            generator=torch.Generator().manual_seed(1),
        )
        assert res["params"] == params and res["lr"] == 0.1
        assert set(res["sets"]) == set(SETS)
        assert len(res["candidates"]) == 3
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_masking_sets_and_pool(setup):
    tr, batch, adv_tok, mask = setup
    kw = dict(loss_kwargs=tr.mcfg["loss_kwargs"], lr=0.05, n_candidates=6)
    res = masking_experiment(
        tr.model, batch, adv_tok, mask, tr.loss_fn, generator=torch.Generator().manual_seed(2), **kw
    )
    res_all = masking_experiment(
        tr.model, batch, adv_tok, mask, tr.loss_fn, pool="all", generator=torch.Generator().manual_seed(2), **kw
    )
    n_valid = int(mask.sum())
    for rec, rec_all in zip(res["candidates"], res_all["candidates"]):
        assert (rec["row"], rec["pos"]) == (rec_all["row"], rec_all["pos"])  # same candidates
        sz = {k: (v["size"] if v else 0) for k, v in rec["sets"].items()}
        assert sz["same_lowconf"] <= min(sz["same"], sz["lowconf"])
        assert sz["random"] == max(1, sz["same_lowconf"])
        assert sz["lowconf"] < n_valid  # same-sign pool: about half the tokens, never the candidate
        assert rec_all["sets"]["lowconf"]["size"] > sz["lowconf"]
        assert rec["p"] < 0.9 and rec["adv"] != 0
    for s in res["sets"].values():
        assert s["n"] + s["n_skipped"] == 6
        assert 0.0 <= s["boost_rate"] <= 100.0


def test_masking_effect_first_order_lm_head(setup):
    """LM-head only, tiny lr: M = lr/N sign(A_c) sum_{s in S} A_s K_cs (DAPO token-mean at ratio 1)."""
    tr, batch, adv_tok, mask = setup
    model, lr = tr.model, 1e-4
    res = masking_experiment(
        model,
        batch,
        adv_tok,
        mask,
        tr.loss_fn,
        loss_kwargs=tr.mcfg["loss_kwargs"],
        params="lm_head",
        lr=lr,
        n_candidates=8,
        generator=torch.Generator().manual_seed(3),
    )
    valid = mask > 0
    with torch.no_grad():
        out = response_forward(model, batch, with_hidden=True)
    W = model.get_output_embeddings().weight.detach().double()
    h = out.hidden[valid].double()
    probs = torch.softmax(h @ W.T, -1)
    ys, A, p = batch.responses[valid], adv_tok[valid].double(), out.logp[valid].exp()
    pos = {tuple(x): i for i, x in enumerate(valid.nonzero().tolist())}
    K = coupling_kernel_proxy(h, probs, ys)
    N = mask.sum().double()
    checked = 0
    for rec in res["candidates"]:
        c = pos[(rec["row"], rec["pos"])]
        sign = torch.sign(A[c])
        pool = torch.sign(A) == sign
        pool[c] = False
        members = {"same": pool & (ys == ys[c]), "lowconf": pool & (p < 0.5)}
        members["same_lowconf"] = members["same"] & members["lowconf"]
        for name, S in members.items():
            got = rec["sets"][name]
            if got is None:
                assert S.sum() == 0
                continue
            assert got["size"] == int(S.sum())
            pred = float(lr / N * sign * (A[S] * K[c, S]).sum())
            assert got["effect"] == pytest.approx(pred, rel=1e-2, abs=1e-10), (name, got, pred)
            assert got["proxy_effect"] == pytest.approx(pred, rel=1e-6, abs=1e-12)
            checked += 1
        r = rec["sets"]["random"]
        assert r["effect"] == pytest.approx(r["proxy_effect"], rel=1e-2, abs=1e-10)
    assert checked >= 12


def test_masking_full_params_first_order(setup):
    """Full-parameter step (tied weight moved once, both paths): Δ_normal = -lr <dL/dθ, dlogp_c/dθ> + O(lr²).

    Rows where the pad id is an attended input are left out: ``nn.Embedding(padding_idx)`` gives the pad
    row no input-path gradient, so autograd's dlogp_c/dθ is not the true derivative there (the random-init
    micro model does sample the pad id). The step itself moves that row through the tied LM-head path, as
    the trainer's optimizer does, and the measured Δ includes its input-path effect.
    """
    tr, batch, adv_tok, mask = setup
    pad = tr.tok.pad_token_id
    keep = torch.tensor(
        [i for i in range(mask.shape[0]) if not ((batch.input_ids[i] == pad) & (batch.attention_mask[i] > 0)).any()]
    )
    assert keep.numel() >= 4
    batch, adv_tok, mask = batch.select(keep), adv_tok[keep], mask[keep]
    adv_tok, mask = adv_tok[:, : batch.response_len], mask[:, : batch.response_len]
    model, lr = tr.model, 1e-3
    kw = tr.mcfg["loss_kwargs"]
    res = masking_experiment(
        model,
        batch,
        adv_tok,
        mask,
        tr.loss_fn,
        loss_kwargs=kw,
        params="full",
        lr=lr,
        n_candidates=3,
        generator=torch.Generator().manual_seed(4),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    out = response_forward(model, batch)
    coef = loss_token_coefficients(tr.loss_fn, out.logp, out.logp.detach(), adv_tok, mask, **kw)
    gL = torch.autograd.grad(out.logp, params, grad_outputs=coef, retain_graph=True)
    for rec in res["candidates"]:
        gc = torch.autograd.grad(out.logp[rec["row"], rec["pos"]], params, retain_graph=True)
        pred = -lr * sum(float((a.double() * b.double()).sum()) for a, b in zip(gL, gc))
        assert rec["delta_normal"] == pytest.approx(pred, rel=5e-2, abs=2e-6), (rec["delta_normal"], pred)
    model.train()


def test_masking_validation(setup):
    tr, batch, adv_tok, mask = setup

    def run(**kw):
        return masking_experiment(tr.model, batch, adv_tok, mask, tr.loss_fn, **({"lr": 0.1} | kw))

    with pytest.raises(ValueError, match=r"params 'encoder'.*valid choices: \['lm_head', 'full'\]"):
        run(params="encoder")
    with pytest.raises(ValueError, match=r"pool 'opposite'.*valid choices: \['same_sign', 'all'\]"):
        run(pool="opposite")
    with pytest.raises(ValueError, match="lr"):
        run(lr=0.0)
    with pytest.raises(ValueError, match="n_candidates"):
        run(n_candidates=0)
    with pytest.raises(ValueError, match="adv_tok"):
        masking_experiment(tr.model, batch, adv_tok[:, :3], mask, tr.loss_fn, lr=0.1)
    assert POOLS == ("same_sign", "all") and PARAMS == ("lm_head", "full")
