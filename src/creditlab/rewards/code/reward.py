"""The registered reward ``code_exec``: 1.0 iff the response's extracted code passes every test of its gold.

Registered reward (:mod:`creditlab.rewards.registry`): ``code_exec`` -- :func:`code_exec_score`, 1.0 if the code
extracted from the response passes every test of ``gold`` (JSON, see
:func:`~creditlab.rewards.code.cases.parse_tests`), else 0.0. Importing this module also registers its
:class:`~creditlab.rewards.registry.RewardSpec` (extract =
:func:`~creditlab.rewards.code.extract.extract_code`, judge = :func:`judge_code_exec`), so
``RewardScorer("code_exec", timeout_s=...)`` works: each distinct ``(extracted code, gold)`` is
judged once (the verdict is a deterministic function of the pair given the limits; a timeout
decided under heavy load is cached like any verdict) and the scorer's hard per-sample timeout
sits on top (it must exceed the judge's own bound,
:func:`~creditlab.rewards.code.runner.max_run_seconds`; when it fires, the worker is killed and its
sandbox dies with it). Scorer workers started with ``spawn`` see the reward only if
``creditlab.rewards`` imports this module.
"""

from __future__ import annotations

import logging

from creditlab.rewards.code.cases import parse_tests
from creditlab.rewards.code.extract import extract_code
from creditlab.rewards.code.runner import run_tests
from creditlab.rewards.registry import RewardSpec, add_spec, register

log = logging.getLogger(__name__)

CODE_EXEC_CORRECT, CODE_EXEC_WRONG = 1.0, 0.0


def judge_code_exec(code: str, gold: str) -> float:
    """1.0 if ``code`` passes every test of ``gold`` (see :func:`parse_tests`), else 0.0.

    A gold that describes no tests scores 0.0 instead of raising (the reward scorer warms its
    workers up with ``judge("1", "1")``: a JSON scalar is only logged at debug level; a malformed
    test list is a data bug and logs a warning).
    """
    try:
        tests, options = parse_tests(gold)
    except (ValueError, TypeError, KeyError) as e:
        scalar = isinstance(gold, str) and gold.strip()[:1] not in ("[", "{")
        (log.debug if scalar else log.warning)("code_exec: gold is not a test spec (%s); scoring 0", e)
        return CODE_EXEC_WRONG
    return run_tests(code, tests, **options).reward


@register("code_exec")
def code_exec_score(response: str, gold: str) -> float:
    """Code-execution reward of a response: 1.0 iff its last fenced (python) block passes all tests."""
    code = extract_code(response)
    if code is None:
        return CODE_EXEC_WRONG
    return judge_code_exec(code, gold)


add_spec(
    RewardSpec(
        name="code_exec", extract=extract_code, judge=judge_code_exec, failure=CODE_EXEC_WRONG, cache_tag="code_exec/v2"
    )
)  # v2: issue 21 (v1 verdicts may hold forged passes)
