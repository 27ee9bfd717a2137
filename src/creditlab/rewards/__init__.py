"""Verifiable rewards: math-verify / DAPO answer checks, and a hang-proof cached batch scorer.

Importing this package registers the rewards under kind ``"reward"`` (``math_verify``,
``dapo_answer``) in :mod:`creditlab.algos.registry`.
"""

from creditlab.rewards.math_verify_reward import (
    REWARD_SPECS,
    RewardSpec,
    dapo_answer_score,
    extract_dapo_answer,
    extract_last_boxed,
    get_reward_spec,
    math_verify_score,
    normalize_dapo_answer,
)
from creditlab.rewards.scorer import RewardScorer

__all__ = [
    "REWARD_SPECS",
    "RewardScorer",
    "RewardSpec",
    "dapo_answer_score",
    "extract_dapo_answer",
    "extract_last_boxed",
    "get_reward_spec",
    "math_verify_score",
    "normalize_dapo_answer",
]
