"""The SLURM plugins of the cluster environment (envs/cluster.txt: snakemake-executor-plugin-slurm 2.6.1,
snakemake-executor-plugin-slurm-jobstep 0.6.1), run by their own code for tests/test_slurm.py.

They cannot be .venv's (its executor plugin is 2.8.0, and 2.6.1 needs pandas < 3): tools/slurm-plugins-env.sh
installs both, --no-deps, into .venv/cluster-slurm-plugins, and the commands below run with that directory first on
PYTHONPATH (`plugins_env`), each in a process of its own:

    python tests/slurm_plugins.py sbatch-calls JOBS.json OUT.json   # each job's sbatch call, as 2.6.1 builds it
    python tests/slurm_plugins.py jobstep SPEC.json                 # inside a SLURM job: the job step, as 0.6.1 runs it
    python tests/slurm_plugins.py probe OUT.json                    # inside a job step: what the step got

A job is given as Snakemake's dry run prints it (rule, wildcards, resources, threads) and becomes an object with what
the plugins read of a Snakemake job (`resources` with attribute access, `threads`, `name`, `is_group()`).

`sbatch-calls`: `get_submit_command(job, params)` + `set_gres_string(job)` + `--wrap="<command>"`, the call the
executor's `run_job` makes (2.6.1 __init__.py ~1076-1126), with the params it passes: the job name, log file and
comment, the account and partition arguments (the test cluster's partition, no account: it has no accounting) and
the working directory. `jobstep`: the jobstep plugin's own `Executor.run_job` (0.6.1 __init__.py ~96-258), on an
executor object carrying only what run_job reads (settings, logger, reporting); `format_job_exec(job)`, which in a
real run is the `python -m snakemake ...` that runs the rule, returns the spec's command. run_job builds the
`srun -n1 ...` line, strips the SLURM variables as it does, starts the step and waits for it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "envs/cluster.txt"
PLUGINS_DIR = REPO / ".venv/cluster-slurm-plugins"
BUILD = "bash tools/slurm-plugins-env.sh"
EXECUTOR, JOBSTEP = "snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep"


def pinned() -> dict[str, str]:
    """The two plugins' versions in envs/cluster.txt."""
    text = PINS.read_text()
    return {pkg: re.search(rf"^{re.escape(pkg)}==(\S+)", text, re.M).group(1) for pkg in (EXECUTOR, JOBSTEP)}


def missing_reason() -> str | None:
    """Why the pinned plugins cannot be used here (None: they can)."""
    want = pinned()
    have = {pkg: list(PLUGINS_DIR.glob(f"{pkg.replace('-', '_')}-*.dist-info")) for pkg in want}
    for pkg, version in want.items():
        if [d.name for d in have[pkg]] != [f"{pkg.replace('-', '_')}-{version}.dist-info"]:
            return f"{pkg}=={version} (envs/cluster.txt) is not in {PLUGINS_DIR}: run `{BUILD}` (make install does)"
    return None


def plugins_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the pinned plugins first on PYTHONPATH (then the project's src and tests)."""
    path = [str(PLUGINS_DIR), str(REPO / "src"), str(REPO / "tests")]
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in path]
    return {**env, "PYTHONPATH": os.pathsep.join(path + old)}


class Resources(dict):
    """A job's resources as the plugins read them: `.get(key)`, `.key`, `.keys()`."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def resource_value(text: str):
    """A resource value of Snakemake's dry-run listing: int where it is one; '<TBD>' (decided at run time) None."""
    if text == "<TBD>":
        return None
    return int(text) if re.fullmatch(r"-?\d+", text) else text


class Job:
    """What the plugins read of a Snakemake job (hashable: the jobstep keys its steps by job)."""

    def __init__(self, spec: dict):
        self.name = spec["rule"]
        self.resources = Resources({k: v for k, v in spec["resources"].items() if v is not None})
        self.threads = int(spec.get("threads", 1))
        self.jobid = spec.get("jobid", 0)

    def is_group(self) -> bool:
        return False


def as_job(spec: dict) -> Job:
    return Job(spec)


def _check_versions() -> dict[str, str]:
    """The plugins imported are the pinned ones, from PLUGINS_DIR (not .venv's)."""
    from importlib.metadata import version

    import snakemake_executor_plugin_slurm
    import snakemake_executor_plugin_slurm_jobstep

    got = {EXECUTOR: version(EXECUTOR), JOBSTEP: version(JOBSTEP)}
    for mod in (snakemake_executor_plugin_slurm, snakemake_executor_plugin_slurm_jobstep):
        if not Path(mod.__file__).resolve().is_relative_to(PLUGINS_DIR.resolve()):
            raise SystemExit(f"{mod.__name__} imported from {mod.__file__}, not from {PLUGINS_DIR}")
    if got != pinned():
        raise SystemExit(f"plugin versions {got} are not envs/cluster.txt's {pinned()}")
    return got


def sbatch_calls(jobs_file: str, out_file: str) -> None:
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    versions = _check_versions()
    out = []
    for spec in json.loads(Path(jobs_file).read_text()):
        job = as_job(spec)
        params = {
            "run_uuid": spec["job_name"],
            "slurm_logfile": spec["logfile"],
            "comment_str": spec["comment"],
            "account": spec.get("account_arg", ""),
            "partition": spec["partition_arg"],
            "workdir": spec["workdir"],
        }
        settings = SimpleNamespace(**{"requeue": False, "qos": None, "reservation": None, **spec.get("settings", {})})
        call = get_submit_command(job, params, settings=settings)
        call += set_gres_string(job)
        call += ' --wrap="{}"'.format(spec["exec"].replace('"', '\\"'))
        out.append({**spec, "sbatch": call})
    Path(out_file).write_text(json.dumps({"versions": versions, "jobs": out}, indent=1))


def jobstep(spec_file: str) -> None:
    """Inside a SLURM job: the jobstep plugin's run_job for the spec's job, its `srun` line recorded."""
    from snakemake_executor_plugin_slurm_jobstep import Executor

    versions = _check_versions()
    spec = json.loads(Path(spec_file).read_text())
    job = as_job(spec)
    record = {"versions": versions, "batch_host": os.environ.get("SLURMD_NODENAME"), "debug": []}

    class Log:
        def debug(self, msg):
            record["debug"].append(str(msg))

        def error(self, msg):
            record.setdefault("errors", []).append(str(msg))

        info = warning = debug

    executor = SimpleNamespace(
        workflow=SimpleNamespace(executor_settings=SimpleNamespace(pass_command_as_script=False, array_execs="")),
        logger=Log(),
        jobid=os.getenv("SLURM_JOB_ID"),
        gpu_job=os.getenv("SLURM_GPUS"),
        job_array_task=os.getenv("SLURM_ARRAY_TASK_ID") is not None,
        format_job_exec=lambda _job: spec["step_exec"],
        report_job_submission=lambda info: record.setdefault("reported", []).append("submitted"),
        report_job_success=lambda info: record.setdefault("reported", []).append("success"),
        report_job_error=lambda info, *a, **k: record.setdefault("reported", []).append("error"),
    )
    try:
        Executor.run_job(executor, job)
    finally:
        calls = [m.split(": ", 1)[1] for m in record["debug"] if m.startswith("The call for this job is: ")]
        record["srun"] = calls[0] if calls else None
        Path(spec["record"]).write_text(json.dumps(record, indent=1))
    sys.exit(0 if record.get("reported", [])[-1:] == ["success"] else 1)


STEP_VARS = (
    "SLURMD_NODENAME",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_ON_NODE",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_JOB_NODELIST",
)


def step_view(env=None) -> dict:
    """What a job step got, from its environment."""
    env = os.environ if env is None else env
    return {"host": socket.gethostname(), **{k: env.get(k) for k in STEP_VARS}}


def probe(out_file: str) -> None:
    Path(out_file).write_text(json.dumps(step_view()))


if __name__ == "__main__":
    verb, *args = sys.argv[1:]
    {"sbatch-calls": sbatch_calls, "jobstep": jobstep, "probe": probe}[verb](*args)
