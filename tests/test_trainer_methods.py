"""One real local-engine step of the Paper E methods: group ids reach group-coupled losses, groups stay
whole, and the cancellation diagnostic and solution-probability drift are logged every step."""

from __future__ import annotations

import pytest

from conftest import make_trainer


@pytest.mark.parametrize("method", ["grpo", "gspo", "grpo_fix", "dfpo"])
def test_step_logs_cancellation_residual(method, tmp_path):
    t = make_trainer(method, tmp_path, ["trainer.batching=sequential", "trainer.mini_batches=2"])
    m = t.train_step(0)
    assert m["grad_norm"] > 0
    assert 0.0 <= m["cancel_rel_residual"] <= 1.0
    assert m["solution_logp_mean"] < 0
    if method in ("grpo_fix", "dfpo"):
        assert "cancel_group_coef_rel" in m


def test_dfpo_cancels_where_gspo_does_not(tmp_path):
    """With 2 PPO epochs the ratios move off 1: GSPO's sequence weights differ within a group, DFPO's
    projected weights keep sum_i A_i w_i = 0 (the group coefficient) in every mini-batch."""
    over = ["trainer.batching=sequential", "trainer.mini_batches=2", "trainer.ppo_epochs=2", "trainer.lr=0.01"]
    dfpo = make_trainer("dfpo", tmp_path, over).train_step(0)
    gspo = make_trainer("gspo", tmp_path, over).train_step(0)
    assert dfpo["cancel_group_coef_rel"] < 1e-6
    assert gspo["cancel_group_coef_rel"] > 1e-4


def test_group_coupled_loss_refuses_scattered_groups(tmp_path):
    """Refused when the trainer is built (algos/compat.py, the check the plan runs), before any step."""
    with pytest.raises(ValueError, match="split a group"):
        make_trainer("dfpo", tmp_path, ["trainer.batching=random", "trainer.mini_batches=2"])


def test_table_curves_key_is_validated_and_used():
    from creditlab.papers.load import load_paper
    from creditlab.plan import CONFIG_DIR

    spec = load_paper(CONFIG_DIR / "papers" / "dfpo.yaml")
    assert "cancel_rel_residual" in spec.table("main").curves
    assert spec.table("compute").curves == ("reward_mean", "response_len_mean", "entropy_mean")


def test_trainer_diagnostic_gradient_equals_the_loss_only_autograd():
    """The trainer reads d loss / d logp off its one backward (retain_grad); it equals autograd on the loss
    alone (algos.cancellation.loss_token_coefficients), through a model forward."""
    import torch

    from creditlab.algos import registry
    from creditlab.algos.cancellation import loss_token_coefficients

    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 5, generator=g, requires_grad=True)
    logp = torch.log_softmax(torch.randn(4, 6, 3, generator=g) @ w, -1)[..., 0]  # [4, 6] through "a model"
    old, adv, mask = (
        logp.detach() + 0.05 * torch.randn(4, 6, generator=g),
        torch.randn(4, 6, generator=g),
        torch.ones(4, 6),
    )
    loss_fn = registry.get("policy_loss", "dapo")
    logp.retain_grad()
    loss_fn(logp, old, adv, mask)[0].backward()
    torch.testing.assert_close(logp.grad, loss_token_coefficients(loss_fn, logp, old, adv, mask))


@pytest.mark.parametrize("method", ["dapo", "delta", "dfpo"])
def test_forward_chunks_give_the_same_update(method, tmp_path):
    """trainer.forward_chunk_tokens only changes padding: from the same model and rollouts, the step's loss and the
    trained weights equal the one-forward step's up to float rounding (DelTA reads h_t of the chunked old forward,
    DFPO's group-coupled loss sees its whole mini-batch)."""
    import torch

    over = ["trainer.batching=sequential", "trainer.mini_batches=2", "trainer.lr=0.01"]
    one = make_trainer(method, tmp_path / "0", over + ["trainer.forward_chunk_tokens=0"])
    many = make_trainer(method, tmp_path / "96", over + ["trainer.forward_chunk_tokens=96"])
    before = torch.cat([p.detach().flatten().clone() for p in one.model.parameters()])
    assert torch.equal(before, torch.cat([p.detach().flatten() for p in many.model.parameters()]))
    m1, m3 = one.train_step(0), many.train_step(0)
    assert m1["response_len_mean"] == m3["response_len_mean"]  # the same rollouts
    assert m3["loss"] == pytest.approx(m1["loss"], rel=1e-4, abs=1e-7)
    after1 = torch.cat([p.detach().flatten() for p in one.model.parameters()])
    after3 = torch.cat([p.detach().flatten() for p in many.model.parameters()])
    moved, diff = (after1 - before).abs(), (after3 - after1).abs()
    assert moved.max() > 0
    # AdamW's first step is ~lr * sign(g): a float-level change of a near-zero gradient can move one weight by a
    # visible share of lr, so the bound is on the mean; a wrong row in the reassembly moves weights by O(lr)
    assert diff.max() <= 1e-2 * moved.max()
    assert diff.mean() <= 1e-4 * moved.mean()
