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
