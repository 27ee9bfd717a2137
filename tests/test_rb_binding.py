"""analysis/rb_binding: RB's generation rounds per update replayed from rollout groups, through the real buffer."""

from __future__ import annotations

import numpy as np
import pytest

from creditlab.analysis.rb_binding import mix_weights, replay_rounds


def _groups(n_right: list[int], G: int = 8, letters: list[int] | None = None) -> list[dict]:
    letters = letters or [0] * len(n_right)
    return [{"rewards": np.array([1.0] * k + [0.0] * (G - k)), "letters": m} for k, m in zip(n_right, letters)]


def test_a_world_whose_every_group_is_balanced_never_waits():
    """2 right of 8 in every group: a batch's positive share is exactly rho = 0.25, its negative share 0.75."""
    r = replay_rounds(_groups([2] * 10), n_groups=4, steps=50)
    assert r["rb_rounds"] == 1.0 and r["rb_dropped"] == 0.0 and r["rb_forced"] == 0.0
    assert r["rb_pos_frac"] == pytest.approx(0.25) and r["rb_neg_frac"] == pytest.approx(0.75)
    assert r["reward_mean"] == pytest.approx(0.25) and r["mixed_frac"] == 1.0


def test_scarce_positives_make_rb_wait_and_an_impossible_balance_trains_unbalanced():
    """1 right of 8 at most: no 4-group batch reaches rho = 0.25 positives (4 of 32 rollouts at most), so every update
    takes max_rounds rounds and is forced; tied groups count in a batch's size but are neither sign."""
    r = replay_rounds(_groups([1, 0, 8]), n_groups=4, max_rounds=3, steps=30)
    assert r["rb_rounds"] == 3.0 and r["rb_forced"] == 1.0
    # half the groups 4/8, half all wrong: a round of 4 draws is balanced unless it holds 3+ tied groups
    # (P = 5/16), so RB waits on some updates and never on most
    r = replay_rounds(_groups([4, 0]), n_groups=4, steps=400, seed=1)
    assert 1.0 < r["rb_rounds"] < 1.5 and r["rb_forced"] == 0.0


def test_the_letter_mix_reweights_the_draws_and_an_unknown_count_is_refused():
    g = _groups([0, 0, 8, 8, 8], letters=[2, 2, 0, 0, 0])
    w = mix_weights(g, {0: 0.25, 2: 0.75})
    assert w.tolist() == pytest.approx([0.375, 0.375, 0.25 / 3, 0.25 / 3, 0.25 / 3])
    assert mix_weights(g, None).tolist() == pytest.approx([0.2] * 5)
    with pytest.raises(ValueError, match="no group has 3 rule letters"):
        mix_weights(g, {3: 1.0})
    # every draw from the all-right (0-letter) groups: tied, never balanced
    assert replay_rounds(g, n_groups=2, mix={0: 1.0}, max_rounds=2, steps=10)["rb_forced"] == 1.0
