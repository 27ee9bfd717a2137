"""Which verifier judges a record, for both engines: its kind (read from its ``source``) and that kind's reward.

One routing for every place a response is scored: the verl reward function
(:func:`creditlab.engines.verl.reward.compute_score`, keyed by verl's ``data_source`` = our record's
``source``), the verl parquet writer (:mod:`creditlab.data.verl_format`, which refuses a source nothing
routes) and the evaluator (``creditlab evaluate``: one scorer per suite, the reward of the suite's kind).

Kinds, by ``source`` (case-insensitive) [ours]:

* ``multiple_choice``: GPQA (names containing ``gpqa``), MMLU-Pro (``mmlu``) and the tiny multiple-choice task
  (``tiny_choice``, :mod:`creditlab.data.transfer`): reward ``multiple_choice``;
* ``code``: LiveCodeBench (``livecodebench``, ``code_generation``) and the tiny code task (``tiny_code``,
  :mod:`creditlab.data.transfer`):
  reward ``code_exec`` (sandboxed execution against the record's tests);
* ``math``: names containing ``math``, ``aime``, ``amc``, ``hmmt``, ``brumo``, ``minerva``, ``olympiad``,
  ``deepmath``, ``arith``: the run's own math reward (``trainer.reward``: ``math_verify``, the papers',
  or ``dapo_answer``).

Anything else raises ValueError: a dataset nobody routed is never silently scored as math.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

KINDS = ("math", "multiple_choice", "code")
"""The verifier families."""

KIND_REWARDS: Mapping[str, str] = {"multiple_choice": "multiple_choice", "code": "code_exec"}
"""The registered reward of each non-math kind (math: the run's ``trainer.reward``)."""

_MC_MARKERS = ("gpqa", "mmlu", "tiny_choice")
_CODE_MARKERS = ("livecodebench", "code_generation", "tiny_code")
_MATH_MARKERS = ("math", "aime", "amc", "hmmt", "brumo", "minerva", "olympiad", "deepmath", "arith")


def data_source_kind(data_source: str) -> str:
    """``"multiple_choice"``, ``"code"`` or ``"math"`` for a record ``source`` / verl ``data_source``.

    Raises:
        ValueError: for a source no verifier is routed to.
    """
    name = data_source.lower()
    if any(marker in name for marker in _MC_MARKERS):
        return "multiple_choice"
    if any(marker in name for marker in _CODE_MARKERS):
        return "code"
    if any(marker in name for marker in _MATH_MARKERS):
        return "math"
    raise ValueError(
        f"no creditlab reward for data_source {data_source!r} (kinds by name: multiple_choice "
        f"{_MC_MARKERS}, code {_CODE_MARKERS}, math {_MATH_MARKERS})"
    )


def reward_of_kind(kind: str, math_reward: str) -> str:
    """The registered reward that judges records of ``kind`` (math: ``math_reward``, the run's own)."""
    if kind not in KINDS:
        raise ValueError(f"unknown verifier kind {kind!r}; valid: {KINDS}")
    return math_reward if kind == "math" else KIND_REWARDS[kind]


def records_kind(records: Iterable[Mapping], where: str) -> str:
    """The one kind of a suite's records (ValueError naming ``where`` when they mix kinds or are unrouted)."""
    kinds = {data_source_kind(str(rec["source"])) for rec in records}
    if len(kinds) != 1:
        raise ValueError(f"{where}: records of {len(kinds)} verifier kinds {sorted(kinds)}; a suite has one")
    return kinds.pop()
