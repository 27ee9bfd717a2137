"""Run Snakemake after clearing a lock that a killed Snakemake left behind (what `make run` calls).

    python tools/snakemake_run.py SNAKEMAKE [ARGS...]

Snakemake locks its working directory (``.snakemake/locks/*.lock``) while it runs and removes the lock when it
ends. Killed with SIGKILL (``kill -9``, the OOM killer, a lost login session or node) it cannot, and every
later run in that directory stops with ``LockException`` until ``snakemake --unlock``. This wrapper runs
``SNAKEMAKE ARGS... --unlock`` first when lock files exist and no Snakemake process is running in this
directory, then replaces itself with ``SNAKEMAKE ARGS...``.

The lock is kept while a process (any user's that ``/proc`` shows) whose working directory is this one runs
Snakemake (``snakemake ...``, ``python .../snakemake ...``, ``python -m snakemake``) or a job of the pipeline
(``python -m creditlab --results ...``, the rules' command: a ``kill -9`` of Snakemake alone leaves its jobs
running, and a re-run would start the same job a second time on the same checkpoint). It is also kept when
``/proc`` cannot be read (not Linux). Snakemake then refuses to start, as it must while another run writes the
same files. A process on another machine sharing this directory over a network file system is not visible
here; run ``snakemake --unlock`` by hand in that case only once you know it has stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOCK_DIR = Path(".snakemake") / "locks"


def runs_snakemake(argv: list[str]) -> bool:
    """True when a process with command line ``argv`` is Snakemake itself (not a script named after it)."""
    if not argv:
        return False
    prog = os.path.basename(argv[0])
    if prog == "snakemake":
        return True
    if prog.startswith("python"):
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":  # interpreter options: -u, -X ..., -I
            rest = rest[1:]
        if rest[:2] == ["-m", "snakemake"]:
            return True
        return bool(rest) and os.path.basename(rest[0]) == "snakemake"
    return False


def runs_pipeline_job(argv: list[str]) -> bool:
    """True for a job of the pipeline's rules: ``python [options] -m creditlab ... --results ...``."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return False
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest = rest[1:]
    return rest[:2] == ["-m", "creditlab"] and any(a == "--results" or a.startswith("--results=") for a in rest)


def lock_holders(directory: Path, proc: Path = Path("/proc")) -> list[tuple[int, str]] | None:
    """``(pid, command line)`` of the Snakemake processes and pipeline jobs working in ``directory``;
    None when processes cannot be listed."""
    if not proc.is_dir():
        return None
    here = directory.resolve()
    me = os.getpid()
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # gone meanwhile, or another user's process we may not inspect
            continue
        if cwd == here and (runs_snakemake(argv) or runs_pipeline_job(argv)):
            out.append((int(entry.name), " ".join(argv)))
    return sorted(out)


def has_lock(directory: Path) -> bool:
    locks = directory / LOCK_DIR
    return locks.is_dir() and any(locks.glob("*.lock"))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    snakemake, args = argv[0], argv[1:]
    here = Path.cwd()
    if has_lock(here):
        holders = lock_holders(here)
        if holders is None:
            print(f"{LOCK_DIR}/ holds a lock; processes cannot be listed here: left alone", file=sys.stderr)
        elif holders:
            shown = "; ".join(f"pid {pid}: {cmd[:120]}" for pid, cmd in holders[:3])
            print(
                f"{LOCK_DIR}/ holds a lock and {len(holders)} process(es) of a run still work in {here} "
                f"({shown}): lock kept; wait for them or stop them, then re-run",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(
                f"{LOCK_DIR}/ holds a lock but nothing of a run works in {here} (a killed Snakemake's): "
                "snakemake --unlock",
                file=sys.stderr,
                flush=True,
            )
            subprocess.run([snakemake, *args, "--unlock"], check=True)
    os.execv(snakemake, [snakemake, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
