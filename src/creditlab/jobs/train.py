"""The `train` job: one planned run on the local engine or verl, resumed from its checkpoints.

Writes the run's final/, metrics.jsonl, token_credit.json, its MLflow run and DONE.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from creditlab import allocation, paths
from creditlab.data.io import read_records
from creditlab.data.rule_arith import select_rl_prompts
from creditlab.engines.local.sft import save_model
from creditlab.engines.local.trainer import Trainer, write_history
from creditlab.jobs.common import load_model, load_tokenizer, setup, start_run_tracker, write_json
from creditlab.models.sources import check_prepared_world
from creditlab.plan import run_config
from creditlab.rewards.scorer import RewardScorer
from creditlab.tracking.mlflow_tracker import tracking_uri
from creditlab.tracking.provenance import git_commit


def train(results: str | Path, plan, backbone: str, run_name: str, seed: int, *, quiet: bool = False) -> None:
    """Train run (backbone, run_name, seed) of the plan, resuming from its checkpoint if a previous attempt was
    killed: on verl when its config says ``trainer.engine: verl`` (:func:`train_verl`), else on the local engine."""
    run = plan.get(backbone, run_name, seed)
    if not run.trains:
        raise SystemExit(f"run {run.key!r} is the base model: nothing to train")
    cfg = run_config(run)
    if cfg["trainer"].get("engine", "local") == "verl":
        train_verl(results, run, cfg)
        return
    setup(cfg)
    fill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    run_dir, ckpt_dir = paths.fmt(paths.RUN_DIR, **fill), paths.fmt(paths.CKPT_DIR, **fill)
    data_dir = paths.fmt(paths.DATA_DIR, **fill)
    try:
        check_prepared_world(data_dir, cfg)  # before the run directory exists: nothing of another world is written
    except ValueError as err:
        raise SystemExit(f"train {run.key}: {err}") from None
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    tok = load_tokenizer(data_dir)
    model = load_model(paths.fmt(paths.BASE_DIR, **fill))
    tracker = start_run_tracker(results, run, cfg, run_dir)
    with tracker:  # ends the MLflow run FAILED if anything below raises
        t0 = time.perf_counter()
        with RewardScorer(cfg["trainer"]["reward"], timeout_s=cfg["trainer"]["reward_timeout_s"]) as scorer:
            trainer = Trainer(
                cfg,
                model,
                tok,
                select_rl_prompts(read_records(data_dir / "train.parquet"), cfg["data"].get("rl_prompts")),
                scorer,
                ckpt_dir,
                log_fn=tracker.log_metrics,
                progress=not quiet,
            )
            resumed_at = trainer.step if trainer.maybe_resume() else None
            if resumed_at is not None:
                print(f"resuming {run.key} from step {resumed_at}", file=sys.stderr)
            history = trainer.fit()
            reward_stats = scorer.stats
        write_history(history, run_dir / "metrics.jsonl")
        write_json(trainer.token_credit_table(lambda i: tok.decode([i])), run_dir / "token_credit.json")
        save_model(trainer.export_model(), tok, run_dir / "final")  # LoRA: merged, the format of every run
        trainer.save_adapter(run_dir / "adapter")  # LoRA: the adapter alone too (peft), beside final/
        tracker.log_metrics({f"reward_worker/{k}": float(v) for k, v in reward_stats.items()}, trainer.step)
        tracker.log_artifact(run_dir / "config.yaml")
        tracker.log_artifact(run_dir / "token_credit.json")
    steps = cfg["trainer"]["steps"]
    if trainer.step != steps:
        raise SystemExit(f"{run.key}: trained {trainer.step} steps of {steps}; not marking DONE")
    done = {
        "run_key": run.key,
        "steps_done": trainer.step,
        "steps_requested": steps,
        "resumed_at": resumed_at,
        "seconds_this_attempt": time.perf_counter() - t0,
        "mlflow_run_id": tracker.run_id,
        "commit": git_commit(),
    }
    write_json(done, run_dir / "DONE")


def train_verl(results: str | Path, run, cfg: dict[str, Any], launcher=None) -> None:
    """Paper scale: train one run with verl (engines/verl/launch.py), resuming from its checkpoints.

    Writes the resolved config.yaml, creates or resumes the run's MLflow run (Tracker.start, as at tiny scale) and
    hands its id to verl (MLFLOW_RUN_ID), runs ``python -m creditlab.engines.verl.main <overrides>`` with its output
    streamed to this job's log, then checks that verl checkpointed the last step, converts that checkpoint to a
    Hugging Face model in final/ (verl's model merger) and writes DONE. A killed job leaves its checkpoints in
    results/paper/checkpoints/... (outside the declared outputs): the re-run resumes (trainer.resume_mode=auto).
    The verl plug-in writes metrics.jsonl (and token_credit.json) into the run directory (the directory of
    +creditlab.config_path). `launcher` (tests) replaces creditlab.engines.verl.launch.
    """
    from creditlab.engines.verl import launch as verl_launch  # imports verl: the verl engine's runs only

    launch = launcher or verl_launch
    fill = dict(results=results, scale=run.scale, backbone=run.backbone, run=run.run, seed=run.seed)
    run_dir, ckpt_dir = paths.fmt(paths.RUN_DIR, **fill), paths.fmt(paths.CKPT_DIR, **fill)
    base_done = paths.fmt(paths.BASE_DONE, **fill)
    model_path = json.loads(base_done.read_text()).get("path") if base_done.is_file() else None
    run_paths = launch.RunPaths.of(cfg, results, model_path=model_path)
    launch.preflight(cfg)  # fail before creating anything on a run verl would reject on the GPUs
    run_dir.mkdir(parents=True, exist_ok=True)
    run_paths.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    steps = int(cfg["trainer"]["steps"])
    resumed_at = launch.steps_done(ckpt_dir) or None
    alloc = cfg["trainer"]["allocation"]
    allocation.clear_pause(ckpt_dir)
    deadline = allocation.allocation_deadline()
    tracker = start_run_tracker(results, run, cfg, run_dir)
    with tracker:  # ends the MLflow run FAILED if anything below raises (SystemExit included)
        t0 = time.perf_counter()
        argv, env = launch.verl_command(
            cfg,
            run_paths,
            mlflow_run_id=tracker.run_id,
            tracking_uri=tracking_uri(Path(results)),
            num_cpus=slurm_cpus(),
        )
        if deadline is not None:  # the trainer checkpoints and stops before the allocation ends (creditlab.allocation)
            env[allocation.ENV_DEADLINE], env[allocation.ENV_EXIT_GRACE] = str(deadline), str(alloc["exit_grace_s"])
        print(
            f"{run.key}: {'resuming from step ' + str(resumed_at) if resumed_at else 'starting'}; "
            f"{' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(argv)}",
            file=sys.stderr,
            flush=True,
        )
        rc = launch.run_streaming(argv, env, cwd=run_dir)  # verl's Hydra writes its outputs/ under the run dir
        pause = allocation.read_pause(ckpt_dir)
        if rc != 0 and pause and pause["step"] == launch.steps_done(ckpt_dir):  # stopped for the allocation's end
            raise pause_for_next_allocation(run.key, pause, steps, int(alloc["max_requeues"]))
        if rc != 0:
            raise SystemExit(
                f"{run.key}: verl exited with status {rc}; its checkpoints stay in {ckpt_dir} and a "
                f"re-run resumes from the last one"
            )
        done_steps = launch.steps_done(ckpt_dir)
        if done_steps != steps:
            raise SystemExit(f"{run.key}: verl checkpointed step {done_steps} of {steps}; not marking DONE")
        rc = launch.run_streaming(launch.merge_command(ckpt_dir, done_steps, run_dir / "final"), launch.merge_env(cfg))
        if rc != 0:
            raise SystemExit(f"{run.key}: verl's model merger exited with status {rc} (step {done_steps} -> final/)")
        launch.finish_merged(run_dir / "final", cfg)
        if not paths.fmt(paths.RUN_METRICS, **fill).is_file():
            raise SystemExit(f"{run.key}: no metrics.jsonl in {run_dir}: the verl plug-in writes one line per step")
        tracker.log_artifact(run_paths.config_path)
        if (run_dir / "token_credit.json").is_file():  # written by the plug-in for runs with credit or filters
            tracker.log_artifact(run_dir / "token_credit.json")
    done = {
        "run_key": run.key,
        "engine": "verl",
        "steps_done": done_steps,
        "steps_requested": steps,
        "resumed_at": resumed_at,
        "seconds_this_attempt": time.perf_counter() - t0,
        "model_path": run_paths.model_path,
        "checkpoint": str(ckpt_dir / f"global_step_{done_steps}"),
        "mlflow_run_id": tracker.run_id,
        "commit": git_commit(),
    }
    write_json(done, run_dir / "DONE")
    if cfg["trainer"]["prune_checkpoints"]:
        pruned = launch.prune_checkpoints(ckpt_dir, keep_step=done_steps)
        if pruned:
            print(f"{run.key}: final/ written; pruned checkpoints of steps {pruned}", file=sys.stderr, flush=True)


class AllocationEnded(SystemExit):
    """The verl run checkpointed a step and stopped before its SLURM allocation's end, and this job was requeued
    (the next allocation resumes from that step). Its MLflow run stays resumable: SCHEDULED, not FAILED."""

    mlflow_status = "SCHEDULED"


def pause_for_next_allocation(key: str, pause: dict, steps: int, max_requeues: int) -> AllocationEnded:
    """Requeue this SLURM job after a pause (creditlab.allocation.requeue: bounded, RequeueRefused outside SLURM),
    log why, and return the exception that ends this attempt."""
    line = allocation.requeue(max_requeues)
    print(
        f"{key}: the allocation ends in {pause['left_s']:.0f} s; step {pause['step']} of {steps} checkpointed "
        f"(longest step {pause['step_s']:.0f} s, save {pause['save_s']:.0f} s); {line}",
        file=sys.stderr,
        flush=True,
    )
    return AllocationEnded(f"{key}: paused at step {pause['step']} of {steps}; resumes in the next allocation")


def slurm_cpus() -> int | None:
    """CPUs Ray may use on each node of this job: SLURM's allocation (verl: 'use a fixed number when using SLURM'),
    else None. In the job step Snakemake's jobstep plugin starts (`srun -n1 --cpus-per-task=C`), SLURM_CPUS_PER_TASK
    is C, the profile's cpus_per_task: the job's CPUs on every node (one task per node). The launcher gives it to
    verl's ray.init on one node, to each node's `ray start` on several (launch.verl_command)."""
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None
