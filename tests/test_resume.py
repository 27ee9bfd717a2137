"""A training job killed with SIGKILL mid-run and re-run ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def _cli(results: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "creditlab", "--quiet", "--results", str(results), "--scale", "micro", *args]


def _env() -> dict[str, str]:
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _run(results: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cli(results, *args), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rows]  # timings differ


def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    a = tmp_path / "a" / "results"
    for verb in (["prepare"], ["init-tracking"], ["warmup", "--backbone", "micro-s"]):
        _run(a, *verb)
    b = tmp_path / "b" / "results"
    shutil.copytree(a, b)
    train = ["train", "--backbone", "micro-s", "--run", "dapo-ds", "--seed", "0"]
    run_rel = Path("micro/runs/micro-s/dapo-ds/s0")
    ckpt = b / "micro/checkpoints/micro-s/dapo-ds/s0/state.pt"

    _run(a, *train)  # uninterrupted reference

    proc = subprocess.Popen(_cli(b, *train), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    assert not (b / run_rel / "DONE").exists()
    step_at_kill = torch.load(ckpt, weights_only=False)["step"]
    assert 0 < step_at_kill < 4

    resumed = _run(b, *train)
    assert f"resuming micro/micro-s/dapo-ds/s0 from step {step_at_kill}" in resumed.stderr
    done = json.loads((b / run_rel / "DONE").read_text())
    assert done["steps_done"] == done["steps_requested"] == 4 and done["resumed_at"] == step_at_kill

    assert _metrics(a / run_rel) == _metrics(b / run_rel)
    wa, wb = load_file(a / run_rel / "final/model.safetensors"), load_file(b / run_rel / "final/model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
