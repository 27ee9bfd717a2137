"""The SLURM profile end to end: a real one-node SLURM cluster on localhost (Debian's slurm-wlm + munge,
started here: tests/slurm_cluster.py) runs a slice of the `micro` DAG submitted through
workflow/profiles/slurm/config.yaml — data prep, warm-up, three RL runs, their evaluations and
Paper A's ablation table, every job through sbatch.

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
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

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


@pytest.fixture(scope="module")
def slurm_cluster():
    reason = unavailable_reason()
    if reason:
        pytest.fail(f"cannot start the local SLURM cluster: {reason}", pytrace=False)
    cluster = LocalSlurmCluster(gpus=2)
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
    assert per_rule["train"]["gpu"] == "1" and per_rule["train"]["nodes"] == "1"
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


def test_ray_cluster_on_a_slurm_allocation(slurm_cluster, tmp_path):
    """A verl job's Ray bootstrap (creditlab.engines.verl.ray_slurm) inside a real SLURM job: the node list
    comes from scontrol, a token-authenticated Ray head starts on the batch node, the driver joins it through
    RAY_ADDRESS (not a Ray of its own), and the head is gone when the job ends. One node here: the worker
    `srun` step for the other nodes of a multi-node allocation is composed, not run (unit test below)."""
    import json
    import socket as _socket

    out = tmp_path / "ray.out"
    driver = (
        "import json, os, ray; ray.init(logging_level='ERROR'); "
        "print('RESULT', json.dumps({'address': os.environ.get('RAY_ADDRESS'), 'nodes': len(ray.nodes()), "
        "'auth': os.environ.get('RAY_AUTH_MODE')}))"
    )
    port = _socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    script = tmp_path / "ray_job.sh"
    script.write_text(
        "#!/bin/bash\n"
        + " ".join(
            [
                sys.executable,
                "-m",
                "creditlab.engines.verl.ray_slurm",
                "--force-cluster",
                "--port",
                str(free),
                "--timeout",
                "240",
                "--",
                sys.executable,
                "-c",
                repr(driver),
            ]
        )
        + "\n"
    )
    script.chmod(0o755)
    env = {**slurm_cluster.env, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [
            "timeout",
            "-k",
            "10",
            "400",
            "sbatch",
            "--wait",
            f"--partition={slurm_cluster.partition}",
            "--nodes=1",
            "--cpus-per-task=1",
            "--mem=3000",
            f"--output={out}",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    log = out.read_text() if out.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + log[-3000:]
    result = json.loads(log.split("RESULT ", 1)[1].splitlines()[0])
    assert result["nodes"] == 1 and result["auth"] == "token"
    assert result["address"] and result["address"].endswith(f":{free}"), result
    assert f"ray_slurm: head {result['address'].rsplit(':', 1)[0]} ({slurm_cluster.node}), 1 node(s)" in log, log[
        -2000:
    ]


def test_ray_worker_step_spans_the_other_nodes():
    from creditlab.engines.verl.ray_slurm import worker_step_command

    assert worker_step_command(["n1"], "10.0.0.1:6379", 8) == []
    cmd = worker_step_command(["n1", "n2", "n3"], "10.0.0.1:6379", 8)
    assert cmd[:6] == ["srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n2,n3"]
    assert cmd[-4:] == ["--address=10.0.0.1:6379", "--block", "--disable-usage-stats", "--num-gpus=8"]
