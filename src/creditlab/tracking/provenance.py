"""Provenance of a run: which code (git commit) produced it, on which host.

Both functions are cheap and never raise: provenance is recorded on every run and table, so a
missing `git` binary or a copy of the code outside a repository must degrade to "unknown" rather
than stop the pipeline.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

UNKNOWN_COMMIT = "unknown"
_GIT_TIMEOUT_S = 10.0


def _git(args: list[str], cwd: Path) -> str | None:
    """Run `git <args>` in `cwd`; return its stripped stdout, or None when git fails."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(repo_dir: str | Path | None = None) -> str:
    """Return the commit sha of the code, with "-dirty" if tracked files have uncommitted changes.

    `repo_dir` defaults to the directory of this module, so the commit is that of the creditlab
    source that is running, whatever the working directory. Untracked files do not make the tree
    dirty (results/ and scratch files would otherwise always do). Returns "unknown" outside a git
    repository, in a repository without commits, or when git is not installed.
    """
    cwd = Path(repo_dir) if repo_dir is not None else Path(__file__).resolve().parent
    if not cwd.is_dir():
        return UNKNOWN_COMMIT
    sha = _git(["rev-parse", "--verify", "HEAD"], cwd)
    if not sha:
        return UNKNOWN_COMMIT
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return f"{sha}-dirty" if status else sha


def _cpu_count() -> int:
    """CPUs this process may use (the affinity mask under SLURM/cgroups), else the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _torch_device() -> str | None:
    """The default torch device, only if torch is already imported (importing it costs seconds)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # a broken CUDA install must not break provenance  # noqa: BLE001
        return "cpu"


def host_info() -> dict[str, str | int]:
    """Describe the host: hostname, usable CPU count, platform, python, SLURM job and torch device.

    `torch_device` is present only when torch is already imported by the caller.
    """
    info: dict[str, str | int] = {
        "hostname": socket.gethostname(),
        "cpu_count": _cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
    }
    device = _torch_device()
    if device is not None:
        info["torch_device"] = device
    return info
