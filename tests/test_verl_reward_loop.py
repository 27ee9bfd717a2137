"""creditlab's verl reward function where verl calls it: worker threads, other processes, verl's own reward loop.

verl 0.9.1 scores each sample with ``await loop.run_in_executor(None, compute_score ...)`` (its reward-loop
managers, ``verl/experimental/reward_loop/reward_manager/dapo.py`` l. 84-93), i.e. on a worker thread of a
``RewardLoopWorker`` process, where math-verify's ``signal.alarm`` timeout raised ``ValueError`` (issue 28,
problem 1). Every test bounds its time with a pytest timeout, never with a clock: a hostile answer
(``\\boxed{9^{9^{9^{9}}}}``, C-level arithmetic that never returns in time) must score 0.0 and not hang the batch.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from creditlab.engines.verl import plugin
from creditlab.engines.verl import reward as verl_reward
from creditlab.engines.verl.launch import REWARD_FILE, REWARD_FN
from creditlab.rewards import service

TIMEOUT_S = 5.0
"""trainer.reward_timeout_s of the tests' run config (the hostile answer costs this much, once)."""
HOSTILE = "Let me compute. \\boxed{9^{9^{9^{9}}}}"
CODE_GOLD = json.dumps({"tests": [{"input": "1 2", "output": "3", "testtype": "stdin"}], "time_limit_s": 10})
CODE_RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

# (data_source, solution_str, ground_truth, extra_info) -> expected score
CASES = [
    (("math_dapo", "so \\boxed{2}", "2", None), 1.0),
    (("math_dapo", "so \\boxed{3}", "2", None), 0.0),
    (("aime25", "\\boxed{\\frac{1}{2}}", "0.5", {}), 1.0),
    (("gpqa-diamond", "Answer: B", "B", {"meta": json.dumps({"n_options": 4})}), 1.0),
    (("mmlu-pro", "the answer is (J)", "C", {}), 0.0),
]


def _kwargs(case: tuple) -> dict:
    data_source, solution_str, ground_truth, extra_info = case
    return dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info)


def _score_in_threads(cases: list[tuple]) -> list[float]:
    """Every case on its own worker thread, all at once (as verl's executor does); run in a spawned process too."""
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        return list(pool.map(lambda c: verl_reward.compute_score(**_kwargs(c)), cases))


def _score_in_a_process(cases: list[tuple]) -> tuple[list[float], list[float]]:
    """In a fresh process: the cases on its main thread, then on worker threads."""
    return [verl_reward.compute_score(**_kwargs(c)) for c in cases], _score_in_threads(cases)


@pytest.fixture(scope="module")
def run_config(tmp_path_factory: pytest.TempPathFactory):
    """A run config exported as the plug-in does (``$CREDITLAB_RUN_CONFIG``) with a short reward timeout."""
    path = tmp_path_factory.mktemp("run") / "config.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"reward": "math_verify", "reward_timeout_s": TIMEOUT_S}}))
    with pytest.MonkeyPatch.context() as mp_env:
        mp_env.setenv(plugin.ENV_RUN_CONFIG, str(path))
        yield path
    service.close_services()


def test_reward_timeout_comes_from_the_run_config(run_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert verl_reward.reward_timeout_s() == TIMEOUT_S
    monkeypatch.delenv(plugin.ENV_RUN_CONFIG)
    assert verl_reward.reward_timeout_s() == service.DEFAULT_TIMEOUT_S


@pytest.mark.timeout(600)
def test_compute_score_in_threads(run_config: Path) -> None:
    """Math (through the reward service), multiple choice and code (in-process) on worker threads, concurrently."""
    cases = [
        *CASES,
        (("tiny_code", CODE_RIGHT, CODE_GOLD, {}), 1.0),
        (("tiny_code", "```python\nprint(4)\n```", CODE_GOLD, {}), 0.0),
    ]
    assert _score_in_threads([c for c, _ in cases]) == [want for _, want in cases]
    # a plain threading.Thread too (the reproduction of issue 28)
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(verl_reward.compute_score("math_dapo", "so \\boxed{2}", "2")))
    thread.start()
    thread.join()
    assert got == [1.0]


@pytest.mark.timeout(600)
def test_compute_score_in_a_spawned_process(run_config: Path) -> None:
    """A fresh process (as a Ray worker is) scores on its main thread and on worker threads alike."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        main, threaded = pool.submit(_score_in_a_process, [c for c, _ in CASES]).result()
    assert main == threaded == [want for _, want in CASES]


def _data_proto(tokenizer, samples: list[tuple[str, str, str]], prompt_len: int = 4):
    """A verl DataProto as the rollout hands it to the reward loop: left-padded prompts, right-padded responses."""
    import numpy as np
    import torch
    from verl import DataProto

    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for _, text, _ in samples]
    resp_len = max(len(x) for x in ids) + 2
    pad = tokenizer.pad_token_id
    responses = torch.tensor([x + [pad] * (resp_len - len(x)) for x in ids])
    prompts = torch.full((len(samples), prompt_len), pad)
    prompts[:, -1] = tokenizer.bos_token_id
    attention = torch.zeros(len(samples), prompt_len + resp_len, dtype=torch.long)
    attention[:, prompt_len - 1] = 1
    for i, x in enumerate(ids):
        attention[i, prompt_len : prompt_len + len(x)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
        },
        non_tensors={
            "data_source": np.array([s for s, _, _ in samples], dtype=object),
            "reward_model": np.array([{"ground_truth": g, "style": "rule"} for _, _, g in samples], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(samples))], dtype=object),
        },
    )


@pytest.mark.timeout(600)
def test_verl_dapo_reward_loop_scores_a_hostile_answer_zero(run_config: Path, tmp_path: Path) -> None:
    """verl's own RewardLoopWorker (what each reward-loop Ray actor runs), with the DAPO manager and our
    compute_score loaded from ``reward.custom_reward_function.path/name`` as the launcher sets them, scores a
    batch with a right, a wrong and a hostile answer on its executor threads: 1, 0 and the failure value 0
    (a timeout of the reward service, not a parse error), and returns (bounded by this test's pytest timeout)."""
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    from creditlab.data.tokenizer import build_tokenizer

    samples = [
        ("math_dapo", "So the answer is \\boxed{42}.", "42"),
        ("math_dapo", "So the answer is \\boxed{41}.", "42"),
        ("math_dapo", HOSTILE, "42"),
        ("gpqa-diamond", "Answer: C", "C"),
    ]
    tokenizer = build_tokenizer([text for _, text, _ in samples])
    tokenizer.save_pretrained(tmp_path / "tok")
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": str(tmp_path / "tok"), "tokenizer_path": None}},
            "reward": {
                "reward_manager": {"source": "register", "name": "dapo"},
                "custom_reward_function": {"path": str(REWARD_FILE), "name": REWARD_FN, "reward_kwargs": {}},
                "reward_kwargs": {
                    "max_resp_len": 256,
                    "overlong_buffer_cfg": {"enable": False, "len": 16, "penalty_factor": 1.0, "log": False},
                },
                "reward_model": {"enable": False},
            },
        }
    )
    timeouts_before = verl_reward.math_service().stats["n_timeouts"]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # verl's get_event_loop() binds the manager to it, as in a Ray async actor
    try:
        worker = RewardLoopWorker(config)
        assert isinstance(worker.reward_manager, DAPORewardManager)
        assert not worker.reward_manager.is_async_reward_score  # so verl runs it with run_in_executor
        outputs = loop.run_until_complete(worker.compute_score_batch(_data_proto(tokenizer, samples)))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert [o["reward_score"] for o in outputs] == [1.0, 0.0, 0.0, 1.0]
    assert [o["reward_extra_info"]["acc"] for o in outputs] == [1.0, 0.0, 0.0, 1.0]
    assert verl_reward.math_service().stats["n_timeouts"] == timeouts_before + 1
