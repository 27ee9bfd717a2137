"""Verifiable rewards: math-verify / DAPO answer checks, and a hang-proof cached batch scorer.

Importing this package registers the rewards under kind ``"reward"`` (``math_verify``,
``dapo_answer``, ``multiple_choice``, ``code_exec``) in :mod:`creditlab.algos.registry` and their
extract/judge pairs in ``REWARD_SPECS`` (what the scorer's worker processes run).
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
from creditlab.rewards import multiple_choice  # noqa: F401,E402  (registers its reward)
from creditlab.rewards.code import reward as _code_reward  # noqa: F401,E402  (registers code_exec)
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
