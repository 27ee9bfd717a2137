"""After a kill -9 of Snakemake, `make run` resumes (issue 21): tools/snakemake_run.py clears the stale lock.

A tiny workflow in a temporary directory: a Snakemake run of it is killed with SIGKILL while its job sleeps,
which leaves `.snakemake/locks/` behind exactly as a killed pipeline does. No wall-clock assertion: waits
are polls with generous deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = BIN / "snakemake"
sys.path.insert(0, str(ROOT / "tools"))
from snakemake_run import lock_holders, runs_pipeline_job, runs_snakemake  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/cwd").exists() or not SNAKEMAKE.exists(), reason="needs Linux /proc and the venv's snakemake"
)

SNAKEFILE = """\
rule all:
    input: "out.txt"

rule make_out:
    output: "out.txt"
    shell: "if [ -e slow ]; then sleep 600; fi; touch {output}"
"""


@pytest.fixture
def workflow(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    profile = tmp_path / "workflow" / "profiles" / "default"
    profile.mkdir(parents=True)
    (profile / "config.yaml").write_text("cores: 1\n")
    (tmp_path / "results").mkdir()  # `make run` then writes results/report.html
    return tmp_path


def _locks(directory: Path) -> list[str]:
    locks = directory / ".snakemake" / "locks"
    return sorted(p.name for p in locks.glob("*.lock")) if locks.is_dir() else []


def _start_locked_run(directory: Path) -> subprocess.Popen:
    """A Snakemake run whose job sleeps, in its own process group; returns once it holds the lock."""
    (directory / "slow").touch()
    proc = subprocess.Popen(
        [str(SNAKEMAKE), "--cores", "1"],
        cwd=directory,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not _locks(directory):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"snakemake did not lock {directory} (exit code {proc.poll()})")
        time.sleep(0.2)
    return proc


def _kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the run and its job (the process group this test started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_make_run_resumes_after_snakemake_was_killed(workflow: Path) -> None:
    _kill_run(_start_locked_run(workflow))
    assert _locks(workflow) == ["0.input.lock", "0.output.lock"]  # what a killed Snakemake leaves
    (workflow / "slow").unlink()
    plain = _run([str(SNAKEMAKE), "--cores", "1"], workflow)
    assert plain.returncode != 0 and "LockException" in plain.stdout + plain.stderr  # the issue
    # `make run` (its install prerequisite taken as done) in the tiny workflow's directory
    made = _run(["make", "-f", str(ROOT / "Makefile"), "-o", "install", "run", f"BIN={BIN}", "CORES=1"], workflow)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "snakemake --unlock" in made.stderr
    assert (workflow / "out.txt").exists() and (workflow / "results" / "report.html").exists()
    assert _locks(workflow) == []


def test_a_running_snakemake_keeps_its_lock(workflow: Path) -> None:
    proc = _start_locked_run(workflow)
    try:
        assert [pid for pid, _ in lock_holders(workflow)] == [proc.pid]
        second = _run(
            [str(BIN / "python"), str(ROOT / "tools" / "snakemake_run.py"), str(SNAKEMAKE), "--cores", "1"], workflow
        )
        assert second.returncode != 0 and "LockException" in second.stdout + second.stderr
        assert "lock kept" in second.stderr and f"pid {proc.pid}" in second.stderr
        assert _locks(workflow) == ["0.input.lock", "0.output.lock"] and proc.poll() is None
    finally:
        _kill_run(proc)
    assert lock_holders(workflow) == []


def test_a_job_left_by_a_killed_snakemake_keeps_the_lock(tmp_path: Path) -> None:
    """`kill -9` of Snakemake alone leaves its jobs running: a job of the pipeline in the directory (seen in a
    /proc of our making) holds the lock as Snakemake would; other processes there do not."""
    work, proc = tmp_path / "work", tmp_path / "proc"
    work.mkdir()
    processes = {
        101: [".venv/bin/python", "-m", "creditlab", "--results", "results", "--scale", "tiny", "train", "--run", "x"],
        102: [".venv/bin/python", "-m", "creditlab", "mlflow-ui"],  # not a job
        103: ["bash", "-c", "sleep 1"],
        104: ["/usr/bin/python3", "/x/.venv/bin/snakemake", "--cores", "1"],  # Snakemake, but elsewhere
    }
    for pid, argv in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (proc / str(pid) / "cwd").symlink_to(work if pid != 104 else tmp_path)
    assert [pid for pid, _ in lock_holders(work, proc=proc)] == [101]
    assert lock_holders(work, proc=tmp_path / "no-proc") is None


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/x/.venv/bin/python3", "/x/.venv/bin/snakemake", "--cores", "1"], True),
        ([".venv/bin/python", "-m", "snakemake", "--keep-going"], True),
        (["python3", "-u", "-m", "snakemake"], True),
        (["snakemake", "-n"], True),
        (["/x/.venv/bin/python", "tools/snakemake_run.py", "/x/.venv/bin/snakemake", "--cores", "2"], False),
        (["bash", "-c", "snakemake --cores 1"], False),  # a shell is not the Snakemake holding the lock
        (["vim", "snakemake"], False),
        ([], False),
    ],
)
def test_runs_snakemake(argv: list[str], expected: bool) -> None:
    assert runs_snakemake(argv) is expected


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/x/.venv/bin/python", "-m", "creditlab", "--results", "results", "--scale", "tiny", "train"], True),
        (["python3", "-u", "-m", "creditlab", "--results=r", "evaluate"], True),
        (["/x/.venv/bin/python", "-m", "creditlab", "mlflow-ui"], False),
        (["python", "-m", "pytest", "--results"], False),
        (["bash", "-c", "python -m creditlab --results r train"], False),  # its python child is the job
    ],
)
def test_runs_pipeline_job(argv: list[str], expected: bool) -> None:
    assert runs_pipeline_job(argv) is expected
