"""A training run longer than its SLURM allocation: read the allocation's end, pause in time, requeue, bounded.

SLURM ends a job at its time limit with SIGTERM then SIGKILL (KillWait, 30 s by default): far too little for a verl
run to write a checkpoint of a 32B model, and a job that dies by TIMEOUT loses every step since its last periodic
checkpoint and is reported FAILED. So a run never waits for the limit:

1. the train job reads when its allocation ends (:func:`allocation_deadline`: ``SLURM_JOB_END_TIME``, or slurmctld's
   ``squeue -o %e`` on SLURM < 23.02, which does not export it) and hands it to verl (:data:`ENV_DEADLINE`);
2. the trainer times each step and each checkpoint save (:class:`AllocationClock`); after a step, when the next one
   and a save would not end ``exit_grace_s`` before the deadline, it checkpoints that step, writes
   :data:`PAUSE_FILE` into the checkpoint directory and stops;
3. the train job sees the pause record of the step verl last checkpointed and requeues its own SLURM job
   (:func:`requeue`: ``scontrol requeue``, the same job id, so Snakemake's SLURM executor keeps waiting on it: a
   requeued job is PENDING again, never FAILED; SLURM holds it for AuthInfo's ``cred_expire`` + 1 s, 121 s by
   default, before it may start); the next allocation resumes from that checkpoint. At most ``max_requeues`` times
   (slurmctld's restart count, :func:`restart_count`), then the job fails with the count.

A crash is not a pause: it fails the job (the rule has no retries), and a re-run by hand resumes from the last
periodic checkpoint. Preemption and node failure are SLURM's (``--requeue``); they lose at most the steps since the
last periodic checkpoint (``trainer.checkpoint_every``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

ENV_DEADLINE = "CREDITLAB_DEADLINE"
"""Environment variable: the allocation's end, seconds since the epoch (float); unset or empty = no deadline."""
ENV_EXIT_GRACE = "CREDITLAB_EXIT_GRACE_S"
"""Environment variable: seconds to leave between the pause checkpoint and the deadline (the job's own exit)."""
PAUSE_FILE = "PAUSED.json"
"""Written into the run's checkpoint directory when the trainer stops for the allocation's end."""


def allocation_deadline(
    env: Mapping[str, str] | None = None, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> float | None:
    """When this SLURM job's allocation ends (seconds since the epoch), or None outside SLURM or without a limit.

    ``SLURM_JOB_END_TIME`` when SLURM exports it (>= 23.02), else slurmctld's end time of ``SLURM_JOB_ID``
    (``squeue -h -j ID -o %e``: local time ``YYYY-MM-DDTHH:MM:SS``, or ``N/A`` / ``Unknown`` without a limit).
    """
    env = os.environ if env is None else env
    end = env.get("SLURM_JOB_END_TIME", "")
    if end.isdigit() and int(end) > 0:
        return float(end)
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    out = run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=60)
    text = (out.stdout or "").strip()
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()  # local time, as slurmctld prints it
    except ValueError:
        return None  # N/A, Unknown (no time limit) or squeue failed: no deadline


class AllocationClock:
    """Decides after each step whether the run must checkpoint and stop before its allocation ends.

    deadline: seconds since the epoch (None: never pause); exit_grace_s: time kept free after the pause checkpoint
    (the train job's exit, Ray's shutdown, the requeue). Pause when
    ``now + 1.5 x (longest step so far) + (longest save so far) + exit_grace_s >= deadline``: the next step would
    not finish and checkpoint in time. Before a step has been timed, nothing pauses (the first step always runs).
    """

    def __init__(self, deadline: float | None, exit_grace_s: float, clock: Callable[[], float] = time.time) -> None:
        self.deadline, self.exit_grace_s, self.clock = deadline, float(exit_grace_s), clock
        self.step_s = 0.0
        self.save_s = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AllocationClock:
        """The clock of :data:`ENV_DEADLINE` and :data:`ENV_EXIT_GRACE` (no deadline when unset)."""
        env = os.environ if env is None else env
        raw = env.get(ENV_DEADLINE, "")
        return cls(float(raw) if raw else None, float(env.get(ENV_EXIT_GRACE, "0") or 0))

    def observe(self, step_s: float = 0.0, save_s: float = 0.0) -> None:
        """Record a step's wall time and, when it saved, its checkpoint's."""
        self.step_s, self.save_s = max(self.step_s, float(step_s)), max(self.save_s, float(save_s))

    def pause_due(self) -> bool:
        """Whether to checkpoint now and stop (see the class)."""
        if self.deadline is None or self.step_s <= 0:
            return False
        return self.clock() + 1.5 * self.step_s + self.save_s + self.exit_grace_s >= self.deadline

    def left_s(self) -> float | None:
        """Seconds to the deadline (None without one)."""
        return None if self.deadline is None else self.deadline - self.clock()


def write_pause(ckpt_dir: str | Path, step: int, clock: AllocationClock) -> Path:
    """Record that the run stopped after checkpointing ``step`` for the allocation's end (read by the train job)."""
    path = Path(ckpt_dir) / PAUSE_FILE
    record = {"step": int(step), "left_s": clock.left_s(), "step_s": clock.step_s, "save_s": clock.save_s}
    path.write_text(json.dumps(record))
    return path


def read_pause(ckpt_dir: str | Path) -> dict | None:
    """The pause record in ``ckpt_dir``, or None."""
    path = Path(ckpt_dir) / PAUSE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def clear_pause(ckpt_dir: str | Path) -> None:
    """Remove a pause record (a resumed run starts without one)."""
    (Path(ckpt_dir) / PAUSE_FILE).unlink(missing_ok=True)


def restart_count(
    job: str, env: Mapping[str, str] | None = None, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> int:
    """How often SLURM job `job` was requeued: ``SLURM_RESTART_COUNT`` in the batch script, else slurmctld's
    ``Restarts=`` (``scontrol show job -o``): Snakemake's jobstep executor strips ``SLURM_*`` variables but the job id
    from the job step it starts, so a rule's command never sees the count (seen on SLURM 22.05)."""
    env = os.environ if env is None else env
    raw = env.get("SLURM_RESTART_COUNT", "")
    if raw.isdigit():
        return int(raw)
    out = run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60)
    found = re.search(r"\bRestarts=(\d+)", out.stdout or "")
    if out.returncode != 0 or not found:
        raise RequeueRefused(f"cannot read the requeue count of SLURM job {job}: {(out.stderr or '').strip()}")
    return int(found.group(1))


class RequeueRefused(SystemExit):
    """The run paused more often than ``max_requeues`` allows, or not under SLURM."""


def requeue(
    max_requeues: int,
    env: Mapping[str, str] | None = None,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> str:
    """Requeue this SLURM job (``scontrol requeue $SLURM_JOB_ID``) and return a line for the log.

    SLURM then ends this allocation and queues the same job id again; ``SLURM_RESTART_COUNT`` counts the requeues.
    Raises :class:`RequeueRefused` outside SLURM, past ``max_requeues`` or when scontrol fails.
    """
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        raise RequeueRefused("the run paused for an allocation's end but this is not a SLURM job: re-run to resume")
    restarts = restart_count(job, env, run)
    if restarts >= max_requeues:
        raise RequeueRefused(
            f"SLURM job {job} was requeued {restarts} times (trainer.allocation.max_requeues = {max_requeues}): "
            f"not requeued again; raise the limit or the site's wall time, and re-run to resume"
        )
    out = run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RequeueRefused(f"scontrol requeue {job} failed ({out.returncode}): {(out.stderr or '').strip()}")
    return f"requeued SLURM job {job} (requeue {restarts + 1} of at most {max_requeues})"
