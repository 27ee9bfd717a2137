"""The order a build takes its jobs in (creditlab.resources.order): warm-ups, then runs by compute, longest first."""

from __future__ import annotations

import math

import pytest

from creditlab.plan import build_plan, composed_configs
from creditlab.resources.order import WARMUP_PRIORITY, train_compute, train_priority, warmup_priority

TOY = {  # a one-layer network small enough to count by hand
    "model": {
        "arch": {
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 4,
            "intermediate_size": 16,
            "tie_word_embeddings": True,
            "vocab_size": 10,
        }
    },
    "trainer": {"max_new_tokens": 4, "prompts_per_step": 2, "group_size": 3, "steps": 5, "ppo_epochs": 1},
}


def test_train_compute_by_hand():
    # layer: q 8x8, k and v 8x4 each, o 8x8 (192); MLP 3 x 8 x 16 (384); two norms of 8 and the q/k norms of 4 (24)
    # model: embedding 10 x 8 (tied head) + 600 + final norm 8 = 688 parameters, all active (the tied head multiplies)
    # compute: 688 x 4 tokens (no prompt budget) x 2 x 3 rollouts x 5 steps x (rollout + 1 epoch)
    assert train_compute(TOY) == 688 * 4 * 6 * 5 * 2
    assert train_priority(TOY) == pytest.approx(math.log2(165120))
    assert warmup_priority(TOY) == pytest.approx(WARMUP_PRIORITY + 688 / 1e6)
    assert warmup_priority(None) == WARMUP_PRIORITY
    longer = {**TOY, "trainer": {**TOY["trainer"], "steps": 10}}
    assert train_priority(longer) == pytest.approx(train_priority(TOY) + 1.0)  # twice the compute: one more


@pytest.fixture(scope="module")
def tiny_configs():
    plan = build_plan({"scale": "tiny", "papers": ["delta", "cancellation"], "seeds": [0], "results": "results"})
    return composed_configs(plan.runs.values())


def test_tiny_m_runs_start_first_and_train_40_steps(tiny_configs):
    """The two papers whose 45-minute budget needs it train tiny-m for 40 steps (design note 66); tiny-m's warm-up
    starts first and its runs, 1.3x a tiny-s run's compute at 40 steps, before the tiny-s runs."""
    by_backbone: dict[str, list[dict]] = {}
    for key, cfg in tiny_configs.items():
        by_backbone.setdefault(key.split("/")[1], []).append(cfg)
    assert {c["trainer"]["steps"] for c in by_backbone["tiny-m"]} == {40}
    assert {c["trainer"]["steps"] for c in by_backbone["tiny-s"]} == {80}
    assert {c["trainer"]["steps"] for c in by_backbone["tiny-olmo"]} == {80}
    trains = {bb: [train_priority(c) for c in cfgs] for bb, cfgs in by_backbone.items()}
    assert min(trains["tiny-m"]) > max(trains["tiny-s"] + trains["tiny-olmo"])
    warmups = {bb: warmup_priority(cfgs[0]) for bb, cfgs in by_backbone.items()}
    assert max(warmups, key=warmups.get) == "tiny-m"
    assert min(warmups.values()) > max(p for ps in trains.values() for p in ps)
