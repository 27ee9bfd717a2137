"""Verifiable rewards: math-verify / DAPO answer checks, multiple choice, code execution, a hang-proof
cached batch scorer, and a thread-safe service around it.

Registration is here, on purpose: this ``__init__`` imports every reward module, each of which registers its
reward (score function and extract/judge split) in :mod:`creditlab.rewards.registry`: ``math_verify`` and
``dapo_answer`` (:mod:`~creditlab.rewards.math_verify_reward`), ``multiple_choice``
(:mod:`~creditlab.rewards.multiple_choice`), ``code_exec`` (:mod:`creditlab.rewards.code.reward`). Python runs
this file before any module under ``creditlab.rewards``, so whoever imports one (the registry, the scorer, a scorer
worker process) sees every reward. A new reward module is added to the imports below.
"""

from creditlab.rewards import math_verify_reward, multiple_choice  # noqa: F401  (register their rewards)
from creditlab.rewards.code import reward as _code_reward  # noqa: F401  (registers code_exec)
from creditlab.rewards.math_verify_reward import (
    dapo_answer_score,
    extract_dapo_answer,
    extract_last_boxed,
    math_verify_score,
    normalize_dapo_answer,
)
from creditlab.rewards.registry import REWARD_SPECS, RewardSpec, get_reward_spec
from creditlab.rewards.scorer import RewardScorer
from creditlab.rewards.service import RewardService, reward_service

__all__ = [
    "REWARD_SPECS",
    "RewardScorer",
    "RewardService",
    "RewardSpec",
    "dapo_answer_score",
    "extract_dapo_answer",
    "extract_last_boxed",
    "get_reward_spec",
    "math_verify_score",
    "normalize_dapo_answer",
    "reward_service",
]
