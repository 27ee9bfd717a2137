"""verl custom reward function: one ``compute_score`` for every data source creditlab trains on.

verl calls a custom reward function (``custom_reward_function.path=<this file>``,
``custom_reward_function.name=compute_score``) from its reward managers as
``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``
-- the signature of verl's ``verl.utils.reward_score.default_compute_score(data_source,
solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None, concurrent_semaphore=None,
memory_limit_mb=None, **kwargs)``; extra keyword arguments are accepted and ignored. It returns a
float (verl also accepts a dict with a ``"score"`` key; we return plain floats).

Dispatch on ``data_source`` by :func:`creditlab.rewards.routing.data_source_kind` (the one routing of
both engines and the evaluator):

* ``multiple_choice`` (GPQA, MMLU-Pro) -> :func:`creditlab.rewards.multiple_choice.multiple_choice_score`,
  with the option count from ``extra_info`` (``n_options`` or ``meta.n_options``), else 4 for GPQA and 10
  for MMLU-Pro;
* ``code`` (LiveCodeBench, the tiny code task) -> the code-execution verifier of
  :mod:`creditlab.rewards.code.reward` (imported lazily, on the first code sample), given the tests JSON of
  the record's ``answer`` and ``func_name`` / ``starter_code`` from ``extra_info``;
* ``math`` -> reward ``math_verify`` (:func:`creditlab.rewards.math_verify_reward.math_verify_score`, the papers'
  reward; verl's own ``math_dapo`` scorer is not used even for ``math_dapo``-named sources), judged by this
  process's :func:`creditlab.rewards.service.reward_service` (:func:`math_service`);
* anything else raises ``NotImplementedError``, as verl's default does.

Threads and hangs: verl 0.9.1's reward-loop managers call this function on worker threads
(``loop.run_in_executor``: ``verl/experimental/reward_loop/reward_manager/dapo.py`` l. 84-93, ``naive.py``
l. 75-84), in each ``RewardLoopWorker`` process (``reward_loop.py`` l. 138-155). So no verifier here may rely on
``signal.alarm`` (math-verify's own timeout: a ``ValueError`` off the main thread) and none may hang a training
step. Math answers are judged by the process-wide reward service, on every thread alike: worker processes owned by
one daemon thread, a hard per-sample timeout of the run config's ``trainer.reward_timeout_s`` (read through
:func:`creditlab.engines.verl.plugin.run_config`, i.e. ``$CREDITLAB_RUN_CONFIG``; without one,
:data:`creditlab.rewards.service.DEFAULT_TIMEOUT_S`), after which the worker is killed and the answer scores 0.0
(``\\boxed{9^{9^{9^9}}}`` included). Multiple choice is pure string work, linear in the response, and runs
in-process on the calling thread; code runs in its own sandbox (:mod:`creditlab.rewards.code.sandbox`) with its own
wall-clock limits, also from any thread (that verifier runs solutions on worker threads itself).

``extra_info`` is the verl parquet column of that name; we read ``n_options``, ``func_name`` and
``starter_code`` either at its top level or inside ``meta`` (a dict, or the JSON string our parquet
files store).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from creditlab.rewards.multiple_choice import multiple_choice_score
from creditlab.rewards.routing import data_source_kind  # noqa: F401 - the one routing, re-exported for verl
from creditlab.rewards.service import DEFAULT_TIMEOUT_S, RewardService, reward_service

GPQA_N_OPTIONS = 4
MMLU_PRO_N_OPTIONS = 10
MATH_REWARD = "math_verify"
"""The registered reward of every math data source under verl (the papers')."""


def reward_timeout_s() -> float:
    """``trainer.reward_timeout_s`` of the run config (``$CREDITLAB_RUN_CONFIG``), else :data:`DEFAULT_TIMEOUT_S`."""
    from creditlab.engines.verl.plugin import run_config  # noqa: PLC0415 - torch and verl: only when scoring

    value = ((run_config() or {}).get("trainer") or {}).get("reward_timeout_s")
    return DEFAULT_TIMEOUT_S if value is None else float(value)


def math_service() -> RewardService:
    """The reward service that judges math answers in this process (started on first use)."""
    return reward_service(MATH_REWARD, timeout_s=reward_timeout_s())


def _info(extra_info: Mapping[str, Any] | None, key: str) -> Any:
    """``extra_info[key]``, else ``extra_info["meta"][key]`` (meta may be a JSON string), else None."""
    if not extra_info:
        return None
    if extra_info.get(key) is not None:
        return extra_info[key]
    meta = extra_info.get("meta")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    if isinstance(meta, Mapping):
        return meta.get(key)
    return None


def code_exec_reward() -> Callable[..., float]:
    """The code-execution reward, imported on first use (the module may pull heavy sandboxing).

    Looks for ``code_exec_score`` in :mod:`creditlab.rewards.code.reward`, else the function that
    module registers as reward ``code_exec``. Its contract: ``fn(response, gold, **kw) -> float``
    with ``gold`` the tests JSON; keyword arguments it declares among ``func_name`` /
    ``starter_code`` are passed (see :func:`_score_code`).
    """
    from creditlab.rewards.code import reward as code_reward  # noqa: PLC0415 - lazy on purpose

    fn = getattr(code_reward, "code_exec_score", None)
    if fn is None:
        from creditlab.rewards import registry

        fn = registry.get("code_exec")
    return fn


def _score_code(solution_str: str, ground_truth: str, extra_info: Mapping[str, Any] | None) -> float:
    fn = code_exec_reward()
    wanted = {"func_name": _info(extra_info, "func_name"), "starter_code": _info(extra_info, "starter_code")}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in wanted.items() if v is not None and (takes_any or k in params)}
    return float(fn(solution_str, ground_truth, **kwargs))


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """Score one verl sample with creditlab's verifier for its ``data_source`` (see module docstring).

    Raises:
        NotImplementedError: for a data source we have no verifier for.
    """
    try:
        kind = data_source_kind(data_source)
    except ValueError as err:
        raise NotImplementedError(str(err)) from err
    if kind == "multiple_choice":
        n_options = _info(extra_info, "n_options")
        if n_options is None:
            n_options = GPQA_N_OPTIONS if "gpqa" in data_source.lower() else MMLU_PRO_N_OPTIONS
        return float(multiple_choice_score(solution_str, str(ground_truth), n_options=int(n_options)))
    if kind == "code":
        return _score_code(solution_str, ground_truth, extra_info)
    return math_service().score_one(solution_str, str(ground_truth))
