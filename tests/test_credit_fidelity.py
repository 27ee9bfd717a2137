"""Credit fidelity (issue 23): creditlab.analysis.credit_fidelity and fidelity_gains.

The metrics against a direct computation, the coupled Monte Carlo estimator against a brute-force decode of every
(prefix, continuation) and its standard error against an exact advantage, the planted check (the metric reaches
its ceiling with the oracle and fails with a shuffled one), the signed credit of a few methods against their
formulas, the start resolution, and a micro-scale run of the analyses declared in configs/papers/headtohead.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from conftest import make_trainer
from creditlab import paths
from creditlab.algos.credit.base import CreditInputs
from creditlab.analysis.credit_fidelity import (
    BRANCH,
    bootstrap_fidelity,
    coupled_outcomes,
    fidelity_metrics,
    planted_check,
    sampling_probs,
    signed_credit,
    token_truth,
    top_set,
)
from creditlab.analysis.value import item_seed, sample_continuations
from creditlab.lm.batch import pack, response_forward, response_logprobs
from creditlab.lm.sampler import SamplingParams, draw_uniforms


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A random-init micro model (high entropy everywhere: every token can matter) and 64 of its rollouts."""
    tr = make_trainer("dapo", tmp_path_factory.mktemp("fidelity"), ["trainer.prompts_per_step=16"])
    tr.model.eval()
    ro, _ = tr.collect(0)
    return tr, ro


# ------------------------------------------------------------------------------------------------------ metrics
def test_metrics_match_a_direct_computation():
    rng = np.random.default_rng(0)
    n = 400
    truth = np.where(rng.random(n) < 0.7, 0.0, rng.normal(size=n).round(2))  # mostly exact zeros, as measured
    credit = np.repeat(rng.normal(size=n // 10), 10) * (1 + 0.3 * rng.random(n) * (rng.random(n) < 0.5))  # ties
    m = fidelity_metrics(credit, truth, top_frac=0.1, null_eps=0.05)
    assert m["spearman"] == pytest.approx(spearmanr(credit, truth).statistic, abs=1e-12)
    q_a, q_c = np.percentile(np.abs(truth), 90), np.percentile(np.abs(credit), 90)
    T = {i for i in range(n) if abs(truth[i]) >= q_a and truth[i] != 0}
    P = {i for i in range(n) if abs(credit[i]) >= q_c and credit[i] != 0}
    assert m["precision"] == pytest.approx(len(T & P) / len(P)) and m["recall"] == pytest.approx(len(T & P) / len(T))
    assert (m["n_top"], m["n_pred"]) == (len(T), len(P))
    null = sum(abs(credit[i]) for i in range(n) if abs(truth[i]) < 0.05) / sum(abs(credit))
    assert m["null_share"] == pytest.approx(null)
    assert set(np.nonzero(top_set(truth, 0.1))[0]) == T
    # scale free; a constant credit has no rank correlation; a credit with no mass has no share
    assert fidelity_metrics(3.0 * credit, truth)["spearman"] == pytest.approx(m["spearman"])
    assert math.isnan(fidelity_metrics(np.ones(n), truth)["spearman"])
    assert math.isnan(fidelity_metrics(np.zeros(n), truth)["null_share"])

    h1, h2 = truth + rng.normal(0, 0.3, n), truth + rng.normal(0, 0.3, n)
    clusters = np.arange(n) // 8
    res = bootstrap_fidelity(
        {"uniform": credit, "other": -credit},
        truth,
        clusters,
        half1=h1,
        half2=h2,
        baseline="uniform",
        n_boot=200,
        seed=1,
    )
    assert res["methods"]["uniform"]["spearman"] == pytest.approx(m["spearman"])
    assert res["methods"]["other"]["delta_spearman"] == pytest.approx(-2 * m["spearman"])
    assert res["methods"]["uniform"]["delta_spearman_ci"] == [0.0, 0.0]  # paired: the same resamples
    r = spearmanr(h1, h2).statistic
    assert res["ceiling"]["split_half"] == pytest.approx(r)
    assert res["ceiling"]["ceiling"] == pytest.approx(math.sqrt(2 * r / (1 + r)))
    lo, hi = res["methods"]["uniform"]["spearman_ci"]
    assert lo <= m["spearman"] <= hi and res["n_clusters"] == n // 8


def test_weighted_spearman_is_a_weighted_correlation_of_ranks():
    """spearman_w: the Pearson correlation of the average-tie ranks with weights 1 - p (a direct weighted formula);
    unit weights give Spearman; weight on the tokens where a credit agrees with the truth lifts it above the plain
    Spearman, which the other tokens dilute."""
    from scipy.stats import rankdata

    rng = np.random.default_rng(3)
    n = 300
    truth = np.where(rng.random(n) < 0.8, 0.0, rng.normal(size=n))
    credit = truth + rng.normal(0, 0.5, n)
    w = rng.random(n)
    rc, rt = rankdata(credit), rankdata(truth)
    cov = lambda x, y: np.sum(w * (x - np.sum(w * x) / w.sum()) * (y - np.sum(w * y) / w.sum()))
    direct = cov(rc, rt) / math.sqrt(cov(rc, rc) * cov(rt, rt))
    m = fidelity_metrics(credit, truth, weights=w)
    assert m["spearman_w"] == pytest.approx(direct, abs=1e-12)
    assert fidelity_metrics(credit, truth, weights=np.ones(n))["spearman_w"] == pytest.approx(m["spearman"])
    assert math.isnan(fidelity_metrics(credit, truth)["spearman_w"])  # no weights: not computed
    mono = np.where(truth != 0, truth, rng.normal(size=n))  # agrees with the truth on its non-zero tokens only
    only = fidelity_metrics(mono, truth, weights=(truth != 0).astype(float))
    plain = fidelity_metrics(mono, truth)["spearman"]
    assert plain < 0.5 and only["spearman_w"] > 0.85
    res = bootstrap_fidelity({"c": credit}, truth, np.arange(n) // 6, weights=w, n_boot=100, seed=0)
    lo, hi = res["methods"]["c"]["spearman_w_ci"]
    assert res["methods"]["c"]["spearman_w"] == pytest.approx(direct) and lo <= direct <= hi


# ------------------------------------------------------------------------------------------------ the estimator
def _setup(tr, seed: int = 0) -> SamplingParams:
    """The rollouts' sampling (the trainer's settings, the tokenizer's EOS)."""
    t = tr.tcfg
    return SamplingParams(
        max_new_tokens=t["max_new_tokens"],
        temperature=t["temperature"],
        top_p=t["top_p"],
        eos_id=tr.tok.eos_token_id,
        seed=seed,
    )


def test_coupled_outcomes_equal_a_brute_force_decode_of_every_prefix(world):
    """The coupling's shortcut (a resampled token equal to the rollout's continues as the next prefix's continuation,
    only deviations are decoded) gives exactly the outcomes of decoding every (prefix, continuation) from scratch
    with the same uniforms through the project's sampler."""
    tr, ro = world
    rows = list(range(0, 64, 8))
    P, R = [ro.prompts[i] for i in rows], [ro.responses[i] for i in rows]
    reward = lambda toks, golds: [float(sum(x) % 3 == 0) for x in toks]
    K, seed = 4, 5
    params = _setup(tr, seed)
    mc = coupled_outcomes(tr.model, P, R, [None] * len(rows), reward, params, K=K, pad_id=tr.tok.pad_token_id)
    prefixes, budgets, us, heads, where = [], [], [], [], []
    for i, resp in enumerate(R):
        U = draw_uniforms(K, params.max_new_tokens, 1, item_seed(seed, i, 0, BRANCH))[..., 0]
        for t in range(len(resp)):
            for j in range(K):
                budget = params.max_new_tokens - t
                prefixes.append(list(P[i]) + list(resp[:t]))
                budgets.append(budget)
                us.append(U[j, t : t + budget][None])
                heads.append(list(resp[:t]))
                where.append((i, j, t))
    conts = sample_continuations(
        tr.model,
        prefixes,
        budgets,
        [0] * len(prefixes),
        params,
        n=1,
        uniforms=us,
    )
    brute = reward([h + c[0] for h, c in zip(heads, conts)], [None] * len(heads))
    mismatches = sum(float(mc["C"][i][j, t]) != b for (i, j, t), b in zip(where, brute))
    assert mismatches == 0
    for i, resp in enumerate(R):  # the last column is the rollout's own reward
        assert torch.all(mc["C"][i][:, len(resp)] == reward([list(resp)], [None])[0])
    assert 0 < mc["deviations"] < mc["pairs"] == K * sum(map(len, R))


def test_standard_error_is_calibrated_against_an_exact_advantage(world):
    """Reward = 1 iff the first response token has an even id: the first token's true advantage is exactly
    1[y even] - p(even | prompt) (one forward), every later token's is 0. The estimate is unbiased and its paired
    standard error is the right size: the standardised errors have mean square ~1."""
    tr, ro = world
    params = dataclasses.replace(_setup(tr, seed=3), max_new_tokens=6)
    P, R = ro.prompts, [r[:6] for r in ro.responses]
    even = lambda toks, golds: [float(bool(x) and x[0] % 2 == 0) for x in toks]
    K = 32
    mc = coupled_outcomes(tr.model, P, R, [None] * len(R), even, params, K=K, pad_id=tr.tok.pad_token_id)
    truth = token_truth(mc["C"])
    with torch.no_grad():
        lp = response_logprobs(tr.model, pack(P, R, tr.tok.pad_token_id))[:, 0]
    probs = sampling_probs(lp, params)
    p_even = probs[:, 0::2].sum(-1).double()
    exact = torch.tensor([float(r[0] % 2 == 0) for r in R], dtype=torch.float64) - p_even
    a0 = torch.stack([a[0] for a in truth["adv"]])
    se0 = torch.stack([s[0] for s in truth["se"]])
    for i, c in enumerate(mc["C"]):  # the standard error is the paired one, from the outcomes
        d = c[:, 1:] - c[:, :-1]
        assert torch.allclose(truth["se"][i], d.std(0, unbiased=True) / math.sqrt(K))
        assert torch.all(truth["adv"][i][1:] == 0) and torch.all(truth["se"][i][1:] == 0)  # nothing after matters
    z = ((a0 - exact) / se0)[se0 > 0]
    assert z.numel() > 40
    assert 0.6 < float((z**2).mean()) < 1.6
    assert abs(float(z.mean())) < 3 / math.sqrt(z.numel())


# ------------------------------------------------------------------------------------------------- planted check
def test_planted_check_reaches_the_ceiling_with_the_oracle_and_fails_with_a_shuffled_one(world):
    tr, ro = world
    params = dataclasses.replace(_setup(tr, seed=0), max_new_tokens=6)  # the planted responses' length
    res = planted_check(tr.model, ro.prompts, ro.responses, params, K=16, pad_id=tr.tok.pad_token_id, n_boot=200)
    m, ceiling = res["methods"], res["ceiling"]["ceiling"]
    assert res["max_abs_after_first"] == 0.0  # nothing after the marked token changes the reward: exactly 0
    assert ceiling > 0.5
    assert m["oracle"]["spearman"] >= ceiling - 0.1
    assert abs(m["shuffled oracle"]["spearman"]) < 0.15
    assert m["sequence advantage spread"]["spearman"] < m["oracle"]["spearman"] - 0.2
    assert m["oracle"]["null_share"] < m["shuffled oracle"]["null_share"]
    assert m["oracle"]["precision"] > 2 * m["shuffled oracle"]["precision"]


# ---------------------------------------------------------------------------------------------------- the credit
def test_signed_credit_is_each_methods_per_token_gradient(world):
    tr, ro = world
    batch = pack(ro.prompts, ro.responses, tr.tok.pad_token_id)
    with torch.no_grad():
        old = response_forward(tr.model, batch, with_entropy=True, with_hidden=True)
    mask = batch.response_mask
    gids = torch.tensor(ro.group_ids)
    rewards = torch.tensor(ro.rewards, dtype=torch.float32)
    inputs = CreditInputs(
        responses=batch.responses,
        mask=mask,
        old_logp=old.logp,
        advantages=None,
        group_ids=gids,
        hidden=old.hidden,
        entropy=old.entropy,
        rng=torch.Generator().manual_seed(0),
    )
    adv = tr.advantage_fn(rewards, gids).double()[:, None]
    dapo = {"advantage": "grpo", "policy_loss": "dapo", "loss_kwargs": {"agg": "token-mean"}, "credit": []}
    grpo = dapo | {"loss_kwargs": {"agg": "seq-mean-token-mean", "dual_clip_c": None}}
    dlogp = dapo | {"credit": [{"name": "dlogp", "alpha": 0.2}]}
    N, B, L = mask.sum(), mask.shape[0], mask.sum(-1, keepdim=True)
    torch.testing.assert_close(signed_credit(dapo, inputs, rewards, old.logp), (adv * mask / N).double())
    torch.testing.assert_close(signed_credit(grpo, inputs, rewards, old.logp), (adv * mask / (B * L)).double())
    w = 1 + 0.2 * (1 - old.logp.exp())
    torch.testing.assert_close(
        signed_credit(dlogp, inputs, rewards, old.logp), (adv * w * mask / N).double(), rtol=1e-5, atol=1e-9
    )


def test_starts_resolve_against_the_runs_config():
    from creditlab.plan import StartRefused, resolve_start

    local = {"trainer": {"steps": 80, "checkpoint_every": 10}}
    verl = {"trainer": {"steps": 220, "checkpoint_every": 20, "keep_checkpoints": 2, "engine": "verl"}}
    assert resolve_start("base", local) == ("base", None) and resolve_start("trained", local) == ("trained", None)
    assert resolve_start("trained@50%", local) == ("trained", 40)
    assert resolve_start("trained@33", local) == ("trained", 33)  # the local engine replays any step
    assert resolve_start("trained@100%", local) == ("trained", None)  # the last step is the final state
    with pytest.raises(StartRefused, match="trains 80 steps only"):
        resolve_start("trained@81", local)
    assert resolve_start("trained@95%", verl) == ("trained", 200)  # rounded down to a checkpoint
    with pytest.raises(StartRefused, match="keeps the last 2 checkpoints"):
        resolve_start("trained@50%", verl)


# ------------------------------------------------------------------------------------------ micro end to end
@pytest.fixture(scope="module")
def micro_results(tmp_path_factory):
    """Micro data and a random-init micro-s base model (no warm-up: a random policy's response lengths vary, and
    the overlong penalty makes its groups informative)."""
    from transformers import AutoTokenizer

    from creditlab.data.prepare import prepare_tiny
    from creditlab.models.tiny import build_model
    from creditlab.plan import check_world, compose, world_run_overrides

    results = tmp_path_factory.mktemp("cf") / "results"
    cfg = compose("micro", "micro-s", overrides=list(world_run_overrides(check_world(None, "micro"), "micro")))
    data = paths.fmt(paths.DATA_DIR, results=results, scale="micro")
    prepare_tiny(cfg["data"], data)
    tok = AutoTokenizer.from_pretrained(str(data / "tokenizer"))
    model = build_model(cfg["model"]["arch"], len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, 0)
    base = paths.fmt(paths.BASE_DIR, results=results, scale="micro", backbone="micro-s")
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return results


def _plan(scale: str, validate: bool = False):
    import yaml

    from creditlab.plan import CONFIG_DIR, build_plan

    cfg = yaml.safe_load((CONFIG_DIR / "pipeline.yaml").read_text()) | {"scale": scale, "papers": ["headtohead"]}
    return build_plan(cfg, validate=validate)


def test_micro_end_to_end(micro_results, monkeypatch):
    """headtohead's credit_fidelity_mid at micro scale (the dapo run replayed to its step 2 of 4, every method of
    the declared list through its own config), then fidelity_gains: "not built" without the table, tested with one."""
    import pandas as pd

    from creditlab.jobs.analyze import run_analysis

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the results dir's local store
    plan = _plan("micro")
    res = run_analysis(micro_results, plan, "headtohead", "credit_fidelity_mid")
    out = dict(results=micro_results, scale="micro", paper="headtohead", analysis="credit_fidelity_mid")
    for p in (paths.ANALYSIS_JSON, paths.ANALYSIS_MD, paths.ANALYSIS_PNG, paths.ANALYSIS_HTML):
        assert paths.fmt(p, **out).is_file()
    state = res["provenance"]["start_state"]
    assert state["source"] == "replay" and state["step"] == 2 and res["step"] == 2
    assert res["truth"]["rollouts"] > 0 and res["truth"]["tokens"] > 0 and res["K"] == 32
    assert res["truth"]["reward_check_max_abs"] == 0.0  # the truth's reward of each rollout is the trainer's
    labels = [m["label"] for m in res["methods"]]
    assert labels[0] == "DAPO (uniform)" and "ARCA" in labels and "Δlog p direction (π − π_base)" in labels
    by = {m["label"]: m for m in res["methods"]}
    # FIPO's weights are exactly 1 at the rollout policy: its credit is DAPO's
    assert by["FIPO"]["spearman"] == pytest.approx(by["DAPO (uniform)"]["spearman"])
    assert "warmed-up base model" in res["reference"]
    md = paths.fmt(paths.ANALYSIS_MD, **out).read_text()
    assert "ceiling" in md and "Planted check" in md and "replayed" in md

    gains = run_analysis(micro_results, plan, "headtohead", "fidelity_gains")
    assert gains["status"].startswith("not built")
    # a table with a versus column for the declared runs (numbers made up for the test: the computation only)
    rows = [m for m in res["methods"] if m["kind"] == "run" and m["policy"] == "rollout"]
    csv = paths.fmt(paths.TABLE_CSV, results=micro_results, scale="micro", paper="headtohead", table="main")
    csv.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        [
            {
                "row": m["label"],
                "run": m["name"],
                "column": "Claim vs DAPO",
                "unit": "pp vs dapo",
                "ours_mean": float("nan") if m["name"] == "dapo" else float(k),
                "ours_lo": k - 1.0,
                "ours_hi": k + 1.0,
                "p_adj": 1.0,
                "verdict": "reference" if m["name"] == "dapo" else "noise",
            }
            for k, m in enumerate(rows)
        ]
    ).to_csv(csv, index=False)
    gains = run_analysis(micro_results, plan, "headtohead", "fidelity_gains")
    assert gains["status"] == "built"
    studies = {s["fidelity"]: s for s in gains["studies"]}
    assert studies["credit_fidelity"]["status"].startswith("not built")
    mid = studies["credit_fidelity_mid"]
    assert mid["status"] == "tested" and mid["n"] == len({m["name"] for m in rows})
    x = [p["fidelity"] for p in mid["points"]]
    y = [p["gain"] for p in mid["points"]]
    assert mid["spearman"] == pytest.approx(spearmanr(x, y).statistic) and 0 < mid["p_spearman"] <= 1
    assert (
        json.loads(paths.fmt(paths.ANALYSIS_JSON, **(out | {"analysis": "fidelity_gains"})).read_text())["status"]
        == "built"
    )


def test_plan_refuses_at_paper_scale_with_the_reasons():
    plan = _plan("paper", validate=True)
    skipped = plan.skipped_analyses
    assert "max_decode_tokens" in skipped[("headtohead", "credit_fidelity")]
    assert "keeps the last 2 checkpoints" in skipped[("headtohead", "credit_fidelity_mid")]
    assert "refused" in skipped[("headtohead", "fidelity_gains")]
    assert not [a for a in plan.analyses if a[0] == "headtohead"]
