"""A run longer than its SLURM allocation (creditlab.allocation): the deadline, the pause rule, the bounded requeue,
and verl's trainer stopping after the step it checkpointed (the train job's side: test_paper_scale)."""

from __future__ import annotations

import subprocess
from datetime import datetime
from types import SimpleNamespace

import pytest

from creditlab import allocation
from creditlab.allocation import AllocationClock, allocation_deadline, requeue
from creditlab.jobs.common import judging_workers


def _ran(stdout: str = "", rc: int = 0, record: list | None = None):
    def run(argv, **kw):
        if record is not None:
            record.append(argv)
        return subprocess.CompletedProcess(argv, rc, stdout=stdout, stderr="no such job" if rc else "")

    return run


def test_the_deadline_is_slurms_end_time():
    assert allocation_deadline({}) is None  # not a SLURM job
    assert allocation_deadline({"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1790000000"}) == 1790000000.0
    seen = []  # SLURM < 23.02 (this machine's 22.05) exports no end time: slurmctld's, in local time
    end = allocation_deadline({"SLURM_JOB_ID": "7"}, run=_ran("2026-11-28T10:30:00\n", record=seen))
    assert seen == [["squeue", "-h", "-j", "7", "-o", "%e"]]
    assert end == datetime(2026, 11, 28, 10, 30).timestamp()
    for unlimited in ("N/A", "Unknown", ""):
        assert allocation_deadline({"SLURM_JOB_ID": "7"}, run=_ran(unlimited)) is None


def test_the_clock_pauses_when_the_next_step_and_save_would_not_end_in_time():
    now = [1000.0]
    clock = AllocationClock(deadline=1000.0 + 2000, exit_grace_s=300, clock=lambda: now[0])
    assert not clock.pause_due()  # no step timed yet: the first step always runs
    clock.observe(step_s=600)
    clock.observe(save_s=200)
    # 1000 + 1.5 x 600 + 200 + 300 = 2400 < 3000: another step fits
    assert not clock.pause_due() and clock.left_s() == 2000
    now[0] = 1500.0  # 1500 + 900 + 200 + 300 = 2900 < 3000
    assert not clock.pause_due()
    now[0] = 1600.0  # = 3000: the next step could end after the save had to
    assert clock.pause_due()
    clock.observe(step_s=100)  # the longest step counts, not the last
    assert clock.step_s == 600 and clock.pause_due()
    assert not AllocationClock(None, 0).pause_due()
    env = {allocation.ENV_DEADLINE: "3000.5", allocation.ENV_EXIT_GRACE: "900"}
    from_env = AllocationClock.from_env(env)
    assert (from_env.deadline, from_env.exit_grace_s) == (3000.5, 900.0)
    assert AllocationClock.from_env({}).deadline is None


def test_requeue_is_bounded_and_needs_slurm():
    seen = []
    line = requeue(5, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2"}, run=_ran(record=seen))
    assert seen == [["scontrol", "requeue", "42"]] and "requeue 3 of at most 5" in line
    with pytest.raises(allocation.RequeueRefused, match="requeued 5 times"):
        requeue(5, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "5"}, run=_ran(record=seen))
    # in a job step of Snakemake's jobstep executor SLURM_RESTART_COUNT is gone: slurmctld's count
    seen.clear()
    line = requeue(5, {"SLURM_JOB_ID": "42"}, run=_ran("JobId=42 JobName=x Restarts=4 BatchFlag=1", record=seen))
    assert seen == [["scontrol", "show", "job", "-o", "42"], ["scontrol", "requeue", "42"]] and "5 of at most" in line
    seen.clear()
    with pytest.raises(allocation.RequeueRefused, match="not a SLURM job"):
        requeue(5, {}, run=_ran(record=seen))
    with pytest.raises(allocation.RequeueRefused, match="no such job"):
        requeue(5, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "0"}, run=_ran(rc=1, record=seen))
    with pytest.raises(allocation.RequeueRefused, match="requeue count"):
        requeue(5, {"SLURM_JOB_ID": "42"}, run=_ran(rc=1, record=seen))
    assert seen == [["scontrol", "requeue", "42"], ["scontrol", "show", "job", "-o", "42"]]


def test_pause_records_round_trip(tmp_path):
    clock = AllocationClock(5000.0, 60, clock=lambda: 4000.0)
    clock.observe(step_s=120, save_s=30)
    allocation.write_pause(tmp_path, 17, clock)
    assert allocation.read_pause(tmp_path) == {"step": 17, "left_s": 1000.0, "step_s": 120.0, "save_s": 30.0}
    allocation.clear_pause(tmp_path)
    assert allocation.read_pause(tmp_path) is None


def test_verls_trainer_checkpoints_and_stops_before_the_allocation_ends(tmp_path):
    """CreditlabTrainer after a step: no pause while steps fit; when the next would not, it saves the step (unless
    the step saved anyway), writes the pause record and raises at the next step's start, after verl logged."""
    from creditlab.engines.verl.trainer import AllocationPaused, CreditlabTrainer

    now = [0.0]
    trainer = CreditlabTrainer.__new__(CreditlabTrainer)
    trainer.allocation = AllocationClock(deadline=1000.0, exit_grace_s=100, clock=lambda: now[0])
    trainer.total_training_steps = 10
    trainer.config = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(tmp_path)))
    saves = []
    trainer._save_checkpoint_now = lambda: saves.append(now[0])
    trainer._allocation_check(1, step_s=200.0, saved=False)  # 0 + 300 + 0 + 100 < 1000
    trainer.on_step_begin()  # no pause: verl's own hook runs
    assert saves == [] and allocation.read_pause(tmp_path) is None
    now[0] = 600.0  # 600 + 300 + 100 >= 1000: checkpoint step 2 and stop
    trainer._allocation_check(2, step_s=200.0, saved=False)
    assert saves == [600.0] and allocation.read_pause(tmp_path)["step"] == 2
    with pytest.raises(AllocationPaused, match="step 2 checkpointed"):
        trainer.on_step_begin()
    # a step that saved on schedule is not saved twice; the last step never pauses (the run ends anyway)
    trainer2 = CreditlabTrainer.__new__(CreditlabTrainer)
    trainer2.__dict__.update({k: v for k, v in trainer.__dict__.items() if k != "_pause_after"})
    saves.clear()
    trainer2._allocation_check(4, step_s=200.0, saved=True)
    assert saves == [] and trainer2._pause_after == 4
    trainer3 = CreditlabTrainer.__new__(CreditlabTrainer)
    trainer3.__dict__.update({k: v for k, v in trainer.__dict__.items() if k != "_pause_after"})
    trainer3._allocation_check(10, step_s=200.0, saved=True)
    assert getattr(trainer3, "_pause_after", None) is None


def test_evaluation_judges_with_the_granted_cores():
    assert judging_workers({"SLURM_CPUS_PER_TASK": "8"}) == 7
    assert judging_workers({"SLURM_CPUS_PER_TASK": "1"}) == 1
    import os

    assert judging_workers({}) == max(1, len(os.sched_getaffinity(0)) - 1)
