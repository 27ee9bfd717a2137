"""The SLURM profile end to end: a real SLURM cluster on localhost (Debian's slurm-wlm + munge, started here:
tests/slurm_cluster.py) runs a slice of the `micro` DAG submitted through workflow/profiles/slurm/config.yaml —
data prep, warm-up, three RL runs, their evaluations and Paper A's ablation table, every job through sbatch — on
its node `localhost` (this machine).

The same cluster has eight nodes of the papers' shape (n1..n8, a DGX H100 each: 224 CPUs, 2 TB, 8 GPUs, declared
with SlurmdParameters=config_overrides; one slurmd each, all on this machine). On them, every paper-scale job of
`snakemake -n --profile workflow/profiles/slurm --config scale=paper` (its resources: the rules' and the profile's)
is submitted as the cluster environment's plugins build it (envs/cluster.txt: executor 2.6.1, jobstep 0.6.1, their
own code from .venv/cluster-slurm-plugins: tests/slurm_plugins.py): its sbatch call is accepted, and inside it the
jobstep plugin's own run_job starts the job step, which reports where it runs and what it got. And a two-node
training run goes through its launch for real on n1+n2 up to verl's ray.init (tests/verl_ray_probe.py): the Ray
cluster over both nodes, the driver joining it with the ray.init arguments verl builds from the launcher's command.

What this cluster cannot show (TaskPlugin=task/none, GRES on dummy device files, one machine): that a step is
confined to its CPUs, memory and GPUs (no cgroups), that a CUDA process sees the GPUs CUDA_VISIBLE_DEVICES names
(there are none), NCCL or any traffic between real hosts (the nodes share one host and one IP), the site's own
limits (partitions, QOS, accounts: this cluster has no accounting), and run times.

The profile is used as it is but for what names this throwaway cluster and fits its 2 cores: partitions,
account (no accounting here), GPU counts, memory, cores, wall times, and a faster status polling
(`_test_profile` lists which keys; every other one is the file's). The cluster has fake GPUs (GRES
without devices), so the GPU rules' `gpu:` requests are really scheduled. Its one concession to the plugin:
an `srun` shim that restores SLURM_CONF, which the jobstep plugin strips (see tests/slurm_cluster.py).

Without the SLURM/munge packages, or not as root, this test FAILS (it does not skip): CI installs them
with `make install` (tools/sysdeps.sh, tools/sysdeps.d/slurm.sh).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import slurm_plugins
from slurm_cluster import LocalSlurmCluster, unavailable_reason

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow/profiles/slurm/config.yaml"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TIMEOUT_S = 480  # the snakemake run, under `timeout -k 10`: 194-275 s measured on 2 shared cores

# the ablation table of Paper A at micro: 10 jobs (1 warm-up, 3 RL runs, 3 evaluations) on one backbone
TARGET = "micro/tables/dlogp/ablation.csv"
EXPECTED_RULES = {"init_tracking": 1, "prepare_data": 1, "warmup": 1, "train": 3, "evaluate": 3, "table": 1}
GPU_RULES = {"warmup", "train", "evaluate"}

# what the test changes in the real profile, and nothing else
PLACEHOLDER = re.compile(r"^CHANGE_ME")
OVERRIDDEN_TOP = {"slurm-init-seconds-before-status-checks": 1, "seconds-between-status-checks": 1}
OVERRIDDEN_RES = {"runtime": 30, "mem_mb": 2500, "cpus_per_task": 1}

DGX_NODES = 8  # the largest paper-scale job: 8 nodes x 8 GPUs (Qwen3-Next-80B, where the plan has it)
PAPER_TIMEOUT_S = 300  # the paper-scale dry run, under `timeout -k 10`: 40-75 s measured on 2 shared cores
JOBS_TIMEOUT_S = 240  # every distinct paper-scale job through sbatch and its job step


@pytest.fixture(scope="module")
def slurm_cluster():
    reason = unavailable_reason()
    if reason:
        pytest.fail(f"cannot start the local SLURM cluster: {reason}", pytrace=False)
    cluster = LocalSlurmCluster(gpus=2, dgx_nodes=DGX_NODES)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.leftover_pids, f"processes of the test cluster survived stop(): {cluster.leftover_pids}"


def _test_profile(real: dict, cluster: LocalSlurmCluster) -> dict:
    """The real profile with this cluster's partition, no account, GPUs and sizes that fit this machine,
    and fast status polling. Every other key and value is the real file's."""
    prof = copy.deepcopy(real)
    for key, value in OVERRIDDEN_TOP.items():
        prof[key] = value
    blocks = [prof["default-resources"], *prof["set-resources"].values()]
    for res in blocks:
        if "slurm_partition" in res:
            assert PLACEHOLDER.match(res["slurm_partition"]), res  # a value users must change, marked as such
            res["slurm_partition"] = cluster.partition
        if "slurm_account" in res:
            assert PLACEHOLDER.match(res["slurm_account"]), res
            del res["slurm_account"]  # no accounting here: the plugin's account check (sacctmgr/sshare) cannot pass
        for key, value in OVERRIDDEN_RES.items():
            if key in res:
                res[key] = value
        if "gpu" in res:
            res["gpu"] = 1  # a fake GPU of the 2 the node has: two GPU jobs side by side
    return prof


def test_profile_is_complete_and_commented():
    """Every entry of the profile has a comment; partitions and account are marked CHANGE ME; the GPU
    rules ask for GPUs and the CPU-only ones do not; the status command does not depend on accounting."""
    text = PROFILE.read_text()
    for line in text.splitlines():
        if re.match(r"^\s*[\w-]+:", line):
            assert "#" in line, f"profile entry without a comment: {line!r}"
    prof = yaml.safe_load(text)
    assert prof["executor"] == "slurm" and prof["slurm-status-command"] == "squeue"
    assert prof["slurm-requeue"] is True and prof["retries"] >= 1
    sets = prof["set-resources"]
    assert all(sets[r].get("gpu", 0) >= 1 for r in ("warmup", "diagnose", "analysis"))
    # a training job's nodes and GPUs, an evaluation's GPUs, come from its run's config (rule resources); the
    # profile must not override them
    assert "gpu" not in sets["train"] and "nodes" not in sets["train"]
    assert all("gpu" not in sets[r] and "slurm_partition" in sets[r] for r in ("evaluate", "evaluate_decode"))
    assert all(
        "gpu" not in sets.get(r, {}) and "gres" not in sets.get(r, {})
        for r in ("init_tracking", "prepare_data", "table", "ledger", "figure", "token_credit_figure")
    )
    assert "gpu" not in prof["default-resources"]
    # no --ntasks-per-gpu from the cluster set's executor plugin (2.6.1 adds one task per GPU unless <= 0)
    assert prof["default-resources"]["tasks_per_gpu"] <= 0
    assert all(sets[r].get("tasks_per_gpu", 0) <= 0 for r in sets)
    assert "gpus" not in sets["train"]  # the job step's GPUs: the rule's (one node's), like nodes and gpu
    rules = set(
        re.findall(r"^rule (\w+):", "".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk")), re.M)
    )
    assert set(sets) <= rules, set(sets) - rules  # no typo in a rule name
    for line in text.splitlines():
        if "CHANGE_ME" in line and not line.lstrip().startswith("#"):
            assert "CHANGE ME" in line, line


def _env() -> dict:
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def test_snakemake_reads_the_profile(tmp_path):
    """Snakemake and the plugin accept every key of the real profile (a typo is an error), and the resources
    reach the jobs as meant: a dry run of the micro slice with the file as it is."""
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            "timeout",
            "-k",
            "10",
            "300",
            SNAKEMAKE,
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--profile",
            str(PROFILE.parent),
            "-n",
            "--verbose",
            str(results / TARGET),
            "--config",
            "scale=micro",
            f"results={results}",
            "papers=[dlogp]",
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=330,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"Using profile {PROFILE.parent}" in out
    per_rule = {}
    for rule, res in re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", out, re.M):
        per_rule[rule] = dict(kv.split("=", 1) for kv in res.split(", "))
    assert set(per_rule) == set(EXPECTED_RULES), out[-3000:]
    # micro: one GPU per run (the rule's own value: at paper scale, the run's model.verl nodes x GPUs)
    assert per_rule["train"]["gpu"] == "1" and per_rule["train"]["nodes"] == "1" and per_rule["train"]["gpus"] == "1"
    assert all(r["tasks_per_gpu"] == "0" for r in per_rule.values())
    assert per_rule["train"]["slurm_partition"] == "CHANGE_ME_gpu_partition"
    assert per_rule["evaluate"]["gpu"] == "1" and per_rule["train"]["mem_mb"] == "400000"  # rule's 3000 replaced
    for rule in ("init_tracking", "prepare_data", "table"):
        assert "gpu" not in per_rule[rule] and per_rule[rule]["slurm_partition"] == "CHANGE_ME_cpu_partition", rule
    assert all(r["slurm_account"] == "CHANGE_ME_account" for r in per_rule.values())


@pytest.mark.e2e
def test_micro_dag_through_sbatch(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    real = yaml.safe_load(PROFILE.read_text())
    prof = _test_profile(real, cluster)
    profile_dir = tmp_path / "profile"
    profile_dir.mkdir()
    (profile_dir / "config.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    work = tmp_path / "work"
    work.mkdir()
    results = work / "results"

    env = cluster.env | {"HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # jobs run `<this python> -m snakemake` again on the node: this venv first on PATH (after the cluster's shim)
    bin_dirs = [str(cluster.bin), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join(bin_dirs + [p for p in env["PATH"].split(os.pathsep) if p not in bin_dirs])
    cmd = [
        "timeout",
        "-k",
        "10",
        str(TIMEOUT_S),
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        "--profile",
        str(profile_dir),
        str(results / TARGET),
        "--config",
        "scale=micro",
        f"results={results}",
        "papers=[dlogp]",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S + 30)
    wall = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    jobs = cluster.jobs()
    detail = (
        f"rc={proc.returncode} after {wall:.0f} s\n{out[-6000:]}\n--- squeue:\n"
        + cluster.cmd("squeue", "--states=all", "-o", "%i %j %T %k", check=False).stdout
        + "\n"
        + cluster.log_tail(15)
    )
    assert proc.returncode == 0, detail
    print(f"micro DAG slice through SLURM: {len(jobs)} jobs in {wall:.0f} s")

    # the outputs
    micro = results / "micro"
    for f in (
        micro / "tables/dlogp/ablation.csv",
        micro / "tables/dlogp/ablation.md",
        micro / "figures/dlogp/ablation_training_curves.png",
        micro / "runs/micro-s/ppl-ds/s0/DONE",
        micro / "evals/micro-s/dlogp-ds-a0.2/s0/metrics.json",
        micro / "models/micro-s/base/DONE",
    ):
        assert f.is_file(), f

    # every job went through sbatch: slurmctld knows one finished batch job per DAG job, named by the profile's
    # prefix, with the plugin's rule comment, all in the test partition, none failed or retried
    submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", out))
    assert len(submitted) == sum(EXPECTED_RULES.values()), out[-4000:]
    ours = [j for j in jobs if j.get("JobName", "").startswith("creditlab_")]
    assert {j["JobId"] for j in ours} == set(submitted.values()), jobs
    per_rule = {}
    for j in ours:
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", j
        assert j["BatchFlag"] == "1" and j["Partition"] == cluster.partition and j["NodeList"] == cluster.node, j
        rule = re.match(r"rule_(\w+?)(?:_wildcards_.*)?$", j["Comment"]).group(1)
        per_rule.setdefault(rule, []).append(j)
        asks_gpu = "gpu" in j.get("TresPerJob", "")
        assert asks_gpu == (rule in GPU_RULES), (rule, j.get("TresPerJob"))  # set-resources reached sbatch
        assert j["MinMemoryNode"] == f"{OVERRIDDEN_RES['mem_mb']}M", j  # default- and set-resources reached sbatch
    assert {r: len(js) for r, js in per_rule.items()} == EXPECTED_RULES

    # the job bodies ran inside those SLURM jobs: each RL run's MLflow run carries the SLURM job id of a train job
    with sqlite3.connect(results / "mlflow.db") as db:
        tagged = dict(
            db.execute(
                "select a.value, b.value from tags a join tags b on a.run_uuid = b.run_uuid "
                "where a.key = 'run_key' and b.key = 'slurm_job_id' and a.value like 'micro/micro-s/%/s0'"
            ).fetchall()
        )
    assert set(tagged) == {f"micro/micro-s/{r}/s0" for r in ("ppl-ds", "dominate-ds", "dlogp-ds-a0.2")}, tagged
    assert set(tagged.values()) == {j["JobId"] for j in per_rule["train"]}, tagged

    # the plugin's per-job SLURM logs (kept: slurm-keep-successful-logs), one per job, named by job id
    logs = {p.stem for p in (work / ".snakemake/slurm_logs").rglob("*.log")}
    assert logs == set(submitted.values()), logs


REQUEUE_RULE = """
rule all:
    input: "done.json"

rule long_train:  # a training job whose allocation ends before its run: the first attempt requeues itself
    output: "done.json"
    shell: "{python} attempt.py"
"""
REQUEUE_ATTEMPT = """
import json, os, sys, time
from creditlab import allocation

job = os.environ["SLURM_JOB_ID"]
restarts = allocation.restart_count(job)  # SLURM_RESTART_COUNT is stripped by the jobstep executor: slurmctld's
seen = dict(job=job, restarts=restarts, deadline=allocation.allocation_deadline(), now=time.time())
with open(f"attempt{restarts}.json", "w") as f:
    json.dump(seen, f)
if restarts == 0:  # as the train job after verl paused: requeue this job, then end this attempt with an error
    print(allocation.requeue(3), file=sys.stderr)
    sys.exit(1)
with open("done.json", "w") as f:
    json.dump(seen, f)
"""


@pytest.mark.e2e
def test_a_job_that_requeues_itself_is_waited_for_not_failed(slurm_cluster, tmp_path):
    """creditlab.allocation on a real slurmctld (22.05, no SLURM_JOB_END_TIME): the job reads its allocation's end from
    squeue, requeues itself with scontrol and exits 1, as the train job does when verl paused; the profile's SLURM
    executor keeps waiting on the same job id (PENDING again, never FAILED), the second allocation finishes, and
    Snakemake's run succeeds without a retry."""
    cluster = slurm_cluster
    prof = _test_profile(yaml.safe_load(PROFILE.read_text()), cluster)
    prof["default-resources"]["runtime"] = 20  # minutes: the deadline the job must read back
    profile_dir = tmp_path / "profile"
    profile_dir.mkdir()
    (profile_dir / "config.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    work = tmp_path / "work"
    work.mkdir()
    (work / "Snakefile").write_text(REQUEUE_RULE.replace("{python}", sys.executable))
    (work / "attempt.py").write_text(REQUEUE_ATTEMPT)
    env = cluster.env | {"HF_HUB_OFFLINE": "1"}
    bin_dirs = [str(cluster.bin), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join(bin_dirs + [p for p in env["PATH"].split(os.pathsep) if p not in bin_dirs])
    cmd = ["timeout", "-k", "10", "400", SNAKEMAKE, "--directory", str(work), "--profile", str(profile_dir)]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=430)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:] + cluster.log_tail(15)
    first, done = json.loads((work / "attempt0.json").read_text()), json.loads((work / "done.json").read_text())
    assert done["job"] == first["job"] and done["restarts"] == 1  # the same SLURM job, requeued once
    assert out.count("has been submitted with SLURM jobid") == 1 and "Trying to restart" not in out, out[-3000:]
    # the deadline read from squeue: the job's start (at or before the first attempt's now) + its 20-minute limit
    assert first["now"] < first["deadline"] <= first["now"] + 20 * 60 + 5, first
    job = next(j for j in cluster.jobs() if j["JobId"] == first["job"])
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", job


# ------------------------------------------------------------------------------------- the papers' shape


def _paper_dry_run(tmp: Path) -> str:
    """`snakemake -n --verbose` of the paper-scale DAG with the real profile: every job and its resources."""
    proc = subprocess.run(
        ["timeout", "-k", "10", str(PAPER_TIMEOUT_S), SNAKEMAKE, "--snakefile", str(REPO / "Snakefile")]
        + ["--directory", str(tmp), "--profile", str(PROFILE.parent), "-n", "--verbose"]
        + ["--config", "scale=paper", f"results={tmp / 'results'}"],
        cwd=tmp,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=PAPER_TIMEOUT_S + 30,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def parse_dry_run(out: str) -> list[dict]:
    """The jobs SLURM would get from a dry run's listing: rule, wildcards, threads, resources (ints where they are
    ints). Jobs without a command (rule `all`) are not submitted: Snakemake finishes them itself."""
    jobs = []
    for m in re.finditer(r"^rule (\w+):\n((?:    .*\n)+)(?:Shell command: (.*))?", out, re.M):
        fields = dict(line.strip().split(": ", 1) for line in m.group(2).splitlines() if ": " in line)
        if m.group(3) in (None, "None"):
            continue
        res = dict(kv.split("=", 1) for kv in fields["resources"].split(", "))
        wildcards = dict(kv.split("=", 1) for kv in fields["wildcards"].split(", ")) if "wildcards" in fields else {}
        jobs.append(
            {
                "rule": m.group(1),
                "wildcards": wildcards,
                "threads": int(fields.get("threads", 1)),
                "resources": {k: slurm_plugins.resource_value(v) for k, v in res.items()},
            }
        )
    return jobs


@pytest.fixture(scope="module")
def paper_jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper-dry-run")
    t0 = time.monotonic()
    jobs = parse_dry_run(_paper_dry_run(tmp))
    print(f"paper-scale dry run with the SLURM profile: {len(jobs)} jobs in {time.monotonic() - t0:.0f} s")
    return jobs


@pytest.fixture(scope="module")
def cluster_plugins():
    reason = slurm_plugins.missing_reason()
    if reason:
        pytest.fail(f"the cluster environment's SLURM plugins are missing: {reason}", pytrace=False)
    return slurm_plugins.pinned()


def _job_env(cluster: LocalSlurmCluster) -> dict:
    """The environment a job is submitted with (sbatch --export=ALL passes it on): the cluster's, this venv first on
    PATH (after the srun shim), the pinned plugins first on PYTHONPATH."""
    env = cluster.env | {"HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    bin_dirs = [str(cluster.bin), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join(bin_dirs + [p for p in env["PATH"].split(os.pathsep) if p not in bin_dirs])
    return slurm_plugins.plugins_env(env)


def _specs(jobs: list[dict], cluster: LocalSlurmCluster, work: Path, settings: dict) -> list[dict]:
    """The jobs as sbatch-calls gets them: on the DGX partition, no account, the job step command a placeholder."""
    helper = str(REPO / "tests/slurm_plugins.py")
    specs = []
    for i, job in enumerate(jobs):
        res = dict(job["resources"])
        for key in ("slurm_partition", "slurm_account"):
            assert key not in res or PLACEHOLDER.match(str(res[key])), res  # what the test replaces
        res.pop("slurm_account", None)
        res["slurm_partition"] = cluster.dgx_partition
        wildcards = "_".join(job["wildcards"].values())
        specs.append(
            {
                **job,
                "resources": res,
                "jobid": i,
                "job_name": "paper-shape-check",  # not the profile's prefix: the micro DAG test counts those
                "comment": f"rule_{job['rule']}" + (f"_wildcards_{wildcards}" if wildcards else ""),
                "logfile": str(work / "logs" / f"rule_{job['rule']}" / "%j.log"),
                "partition_arg": f" -p {shlex.quote(cluster.dgx_partition)}",
                "account_arg": "",
                "workdir": str(work),
                "settings": settings,
                "exec": f"{sys.executable} {helper} jobstep @SPEC@",
            }
        )
    return specs


def _sbatch_calls(specs: list[dict], work: Path, env: dict) -> tuple[dict, list[dict]]:
    """Each spec's sbatch call, built by the pinned executor plugin in a process of its own."""
    jobs_file, out_file = work / "jobs.json", work / "calls.json"
    jobs_file.write_text(json.dumps(specs))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests/slurm_plugins.py"), "sbatch-calls", str(jobs_file), str(out_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(out_file.read_text())
    return out["versions"], out["jobs"]


def _shape(call: str) -> str:
    """An sbatch call without what names the one job (its comment: rule and wildcards)."""
    return re.sub(r" --comment \S+", "", call)


def _submit(call: str, spec_file: Path, env: dict, cluster: LocalSlurmCluster) -> str:
    """Run the plugin's sbatch call as it does (a shell command; --parsable: the job id), with the job step's spec;
    the log's directory first (run_job makes it)."""
    Path(json.loads(spec_file.read_text())["logfile"]).parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        call.replace("@SPEC@", str(spec_file)), shell=True, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"sbatch refused {call}:\n{proc.stderr}\n{cluster.log_tail(10)}"
    return proc.stdout.strip().split(";")[0]


def _wait_jobs(cluster: LocalSlurmCluster, ids: list[str], timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {j["JobId"]: j for j in cluster.jobs() if j["JobId"] in ids}
        if all(j["JobState"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for j in jobs.values()):
            return jobs
        time.sleep(1)
    raise AssertionError(
        f"jobs not finished after {timeout} s:\n"
        + cluster.cmd("squeue", "--states=all", "-o", "%i %j %T %r %N", check=False).stdout
        + cluster.log_tail(15)
    )


def _gpus(value: str | None) -> int:
    return len([g for g in (value or "").split(",") if g.strip()])


def test_every_paper_scale_job_starts_on_nodes_of_the_papers_shape(
    slurm_cluster, paper_jobs, cluster_plugins, tmp_path
):
    """Every paper-scale job's sbatch request, as the cluster set's executor plugin (2.6.1) builds it from the job's
    resources (the rules' and the profile's), is accepted by a cluster of DGX H100-shaped nodes, and inside each the
    jobstep plugin (0.6.1) starts its job step: on the job's first node, with the job's CPUs per task and the GPUs
    of one node (a training job on several nodes: that node's 8, not the job's 16-64). One job per distinct request
    (the requests of the paper's ~300 jobs differ only by their comment otherwise), all submitted at once."""
    cluster = slurm_cluster
    assert cluster_plugins == {slurm_plugins.EXECUTOR: "2.6.1", slurm_plugins.JOBSTEP: "0.6.1"}  # envs/cluster.txt
    real = yaml.safe_load(PROFILE.read_text())
    settings = {"requeue": bool(real.get("slurm-requeue")), "qos": None, "reservation": None}
    env = _job_env(cluster)
    versions, calls = _sbatch_calls(_specs(paper_jobs, cluster, tmp_path, settings), tmp_path, env)
    assert versions == cluster_plugins
    assert len(calls) == len(paper_jobs) > 200
    # every job names its nodes (the profile's default 1, a training run its own): a bare --gpus=N lets SLURM spread
    # the GPUs over several partly busy nodes, where the one-node job step is refused (seen: an evaluate job's
    # `srun --gpus=4` "Invalid generic resource (gres) specification" when the jobs below run at once)
    bare = [c["sbatch"].split(" --wrap")[0] for c in calls if not re.search(r" --nodes=\d+", c["sbatch"])]
    assert not bare, bare[:3]
    nodes_needed = max(int(c["resources"].get("nodes") or 1) for c in calls)
    assert nodes_needed <= len(cluster.dgx_nodes), nodes_needed

    shapes: dict[str, dict] = {}
    for c in calls:
        shapes.setdefault(_shape(c["sbatch"]), c)
    rules = {c["rule"] for c in shapes.values()}
    assert rules == {j["rule"] for j in paper_jobs} and len(shapes) < 40, sorted(shapes)
    submitted = {}
    t0 = time.monotonic()
    for i, c in enumerate(shapes.values()):
        spec_file = tmp_path / f"step{i}.json"
        c = {**c, "record": str(tmp_path / f"record{i}.json"), "probe": str(tmp_path / f"probe{i}.json")}
        c["step_exec"] = f"{sys.executable} {REPO / 'tests/slurm_plugins.py'} probe {c['probe']}"
        spec_file.write_text(json.dumps(c))
        submitted[_submit(c["sbatch"], spec_file, env, cluster)] = c
    done = _wait_jobs(cluster, list(submitted), JOBS_TIMEOUT_S)
    print(
        f"{len(shapes)} distinct paper-scale job requests (of {len(calls)} jobs) ran in {time.monotonic() - t0:.0f} s"
    )

    for job_id, c in submitted.items():
        j, res = done[job_id], c["resources"]
        record = json.loads(Path(c["record"]).read_text()) if Path(c["record"]).exists() else {}
        step_line = (record.get("srun") or "").split(sys.executable)[0]
        print(f"{c['rule']}: {c['sbatch'].split(' --wrap')[0]}\n  step: {step_line}")
        log = Path(c["logfile"].replace("%j", job_id))
        what = f"{c['rule']} {c['sbatch'].split(' --wrap')[0]}\nstep: {record.get('srun')}\n" + (
            log.read_text()[-3000:] if log.exists() else ""
        )
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", (j, what)
        nodes = int(res.get("nodes") or 1)
        gpus_per_node = int(res.get("gpus") or res.get("gpu") or 0)  # the step's: `gpus` (train), else `gpu`
        cpus = int(res["cpus_per_task"])
        # the allocation: the nodes asked for, one task of cpus_per_task CPUs per node (whole cores: 2 threads each)
        assert int(j["NumNodes"]) == nodes and int(j["NumCPUs"]) == nodes * (cpus + cpus % 2), (j, what)
        assert "--ntasks-per-gpu" not in c["sbatch"], what
        # the job step: the jobstep plugin's srun line, one task on the job's first node, its CPUs, one node's GPUs
        assert record["versions"] == cluster_plugins and record["srun"].startswith("srun -n1 "), what
        step = json.loads(Path(c["probe"]).read_text())
        first = cluster.cmd("scontrol", "show", "hostnames", j["NodeList"]).stdout.split()[0]
        assert step["SLURMD_NODENAME"] == first and step["SLURM_STEP_NUM_NODES"] == "1", (step, what)
        assert step["SLURM_STEP_NUM_TASKS"] == "1" and step["SLURM_CPUS_PER_TASK"] == str(cpus), (step, what)
        assert _gpus(step["CUDA_VISIBLE_DEVICES"]) == gpus_per_node, (step, what)
        if c["rule"] == "train":
            assert gpus_per_node == int(res["gpu"]) // nodes and f"--gpus={gpus_per_node} " in record["srun"], what
    trains = {
        (int(c["resources"]["nodes"]), int(c["resources"]["gpu"])) for c in shapes.values() if c["rule"] == "train"
    }
    # ARCA's 1 GPU; 7-8B: 1 x 8; 14B: 2 x 8; 32B: 4 x 8 (80B: 8 x 8, where the plan has Qwen3-Next runs)
    assert {(1, 1), (1, 8), (2, 16), (4, 32)} <= trains and all(g == 8 * n for n, g in trains if n > 1), trains


def test_multi_node_run_joins_its_ray_cluster_with_the_launchers_arguments(
    slurm_cluster, paper_jobs, cluster_plugins, tmp_path
):
    """A two-node paper-scale training job (Qwen3-14B: 2 nodes x 8 GPUs), as the cluster set's plugins submit and
    start it, launched as `creditlab train` launches verl, up to verl's ray.init: the job step on the first node runs
    the launcher's command (ray_slurm: a Ray head there, a worker step on the other node), and the driver, verl's
    own main (Hydra config from the launcher's overrides, run_ppo), calls ray.init with the arguments verl builds
    from them, which join the job's Ray cluster: both nodes, 8 GPUs and the job's 32 CPUs each; a probe stands in
    for verl's trainer (tests/verl_ray_probe.py)."""
    import socket as _socket

    cluster = slurm_cluster
    job = next(j for j in paper_jobs if j["rule"] == "train" and j["resources"].get("nodes") == 2)
    w = job["wildcards"]
    real = yaml.safe_load(PROFILE.read_text())
    env = _job_env(cluster)
    spec = _specs([job], cluster, tmp_path, {"requeue": bool(real.get("slurm-requeue"))})[0]
    _, (c,) = _sbatch_calls([spec], tmp_path, env)
    with _socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = tmp_path / "results"
    c["record"] = str(tmp_path / "record.json")
    c["step_exec"] = shlex.join(
        [sys.executable, str(REPO / "tests/verl_ray_probe.py"), "launch", w["backbone"], w["run"], w["seed"]]
        + [str(results), str(port)]
    )
    spec_file = tmp_path / "step.json"
    spec_file.write_text(json.dumps(c))
    t0 = time.monotonic()
    job_id = _submit(c["sbatch"], spec_file, env, cluster)
    j = _wait_jobs(cluster, [job_id], 420)[job_id]
    wall = time.monotonic() - t0
    run_dir = results / "paper/runs" / w["backbone"] / w["run"] / f"s{w['seed']}"
    log = Path(c["logfile"].replace("%j", job_id))
    text = log.read_text() if log.exists() else ""
    driver = json.loads((run_dir / "ray_driver.json").read_text()) if (run_dir / "ray_driver.json").exists() else {}
    detail = f"{driver.get('ray_init_error') or driver.get('error')}\n{j}\n{driver}\n{text[-5000:]}"
    assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", detail
    print(f"two-node launch to verl's ray.init: {wall:.0f} s")

    record = json.loads(Path(c["record"]).read_text())
    assert re.match(r"srun -n1 --cpu-bind=q\s+--cpus-per-task=32\s+--gpus=8\s+--nodes=2 ", record["srun"]), record
    nodes = cluster.cmd("scontrol", "show", "hostnames", j["NodeList"]).stdout.split()
    assert len(nodes) == 2
    launched = json.loads((run_dir / "launch.json").read_text())
    from creditlab.engines.verl import launch

    # the launcher: Ray over the allocation first, each node's CPUs (the job step's) and GPUs to `ray start`,
    # none to verl's ray.init
    assert launched["slurm_cpus"] == 32
    assert launched["argv"][1:8] == ["-m", launch.RAY_SLURM, "--gpus-per-node", "8", "--num-cpus", "32", "--"]
    assert not any(a.startswith("ray_kwargs.ray_init.num_cpus=") for a in launched["argv"])
    assert f"ray_slurm: head {driver['RAY_ADDRESS'].rsplit(':', 1)[0]} ({nodes[0]}), 2 node(s)" in text, text[-3000:]
    # verl's ray.init: its own arguments (ray_kwargs.ray_init + verl's runtime env, with the plug-in's variables),
    # joining the cluster at RAY_ADDRESS rather than starting one
    kwargs = driver["ray_init_kwargs"]
    assert driver["ray_init_args"] == [] and set(kwargs) == {"num_cpus", "runtime_env"} and kwargs["num_cpus"] is None
    env_vars = kwargs["runtime_env"]["env_vars"]
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == launch.PLUGIN_MODULE and "CREDITLAB_RUN_CONFIG" in env_vars
    assert driver["gcs_address"] == driver["RAY_ADDRESS"] and driver["RAY_ADDRESS"].endswith(f":{port}"), driver
    assert "error" not in driver, driver
    probe = json.loads((run_dir / "ray_probe.json").read_text())
    assert probe["actor_env"]["VERL_USE_EXTERNAL_MODULES"] == launch.PLUGIN_MODULE, probe
    got = sorted((n["SLURMD_NODENAME"], n["CPU"], n["GPU"], _gpus(n["SLURM_STEP_GPUS"])) for n in probe["nodes"])
    assert got == [(nodes[0], 32.0, 8.0, 8), (nodes[1], 32.0, 8.0, 8)], probe
    # the stopped head's address is not left for a later bare ray.init() on the node to follow
    from ray._common.utils import get_ray_address_file

    current = Path(get_ray_address_file(None))
    assert not (current.exists() and current.read_text().strip() == driver["RAY_ADDRESS"]), current


def test_ray_worker_step_spans_the_other_nodes():
    from creditlab.engines.verl.ray_slurm import step_env, this_node, worker_step_command

    assert worker_step_command(["n1"], "10.0.0.1:6379", 8) == []
    cmd = worker_step_command(["n1", "n2", "n3"], "10.0.0.1:6379", 8, 32)
    assert cmd[:6] == ["srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n2,n3"]
    assert cmd[6:8] == ["--cpus-per-task=32", "--gpus-per-node=8"]
    assert cmd[-5:] == ["--address=10.0.0.1:6379", "--block", "--disable-usage-stats", "--num-cpus=32", "--num-gpus=8"]
    # the head is the node this runs on, wherever SLURM placed the job step
    assert worker_step_command(["n1", "n2", "n3"], "10.0.0.1:6379", None, head="n2")[5] == "--nodelist=n1,n3"
    assert this_node(["n1", "n2"], {"SLURMD_NODENAME": "n2"}) == "n2" and this_node(["n1", "n2"], {}) == "n1"
    # the worker step's srun gets none of the job step's SLURM settings (it would read them as options)
    env = {"SLURM_JOB_ID": "7", "SLURM_CONF": "/c", "SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS": "1", "SRUN_X": "1"}
    assert step_env({**env, "PATH": "/bin"}) == {"SLURM_JOB_ID": "7", "SLURM_CONF": "/c", "PATH": "/bin"}


def test_launcher_gives_the_cpus_to_ray_start_on_several_nodes(tmp_path):
    """Problem 2 of issue 28 in the launcher: the job's CPUs per node (slurm_cpus) go to verl's ray.init on one node,
    where it starts Ray; on several nodes the driver joins ray_slurm's cluster, where Ray refuses num_cpus, so they
    go to each node's `ray start` instead (the SLURM test above runs the latter for real)."""
    from creditlab.engines.verl import launch
    from creditlab.plan import build_plan, run_config

    plan = build_plan({"scale": "paper", "papers": ["delta"], "seeds": [0], "results": str(tmp_path)}, validate=False)
    for backbone, nnodes in (("qwen3-8b-base", 1), ("qwen3-14b-base", 2)):
        cfg = run_config(plan.get(backbone, "dapo", 0))
        assert cfg["model"]["verl"]["nnodes"] == nnodes
        rp = launch.RunPaths.of(cfg, tmp_path, model_path="/m")
        argv, _ = launch.verl_command(cfg, rp, python="py", num_cpus=32, plugin_overrides=lambda c: [])
        in_ray_init = [a for a in argv if a.startswith("ray_kwargs.ray_init.num_cpus=")]
        if nnodes == 1:
            assert argv[:3] == ["py", "-m", launch.VERL_MAIN] and in_ray_init == ["ray_kwargs.ray_init.num_cpus=32"]
        else:
            assert argv[:9] == ["py", "-m", launch.RAY_SLURM, "--gpus-per-node", "8", "--num-cpus", "32", "--", "py"]
            assert in_ray_init == []
