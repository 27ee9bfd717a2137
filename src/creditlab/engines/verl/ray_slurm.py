"""Ray on SLURM: bring up a Ray cluster over a SLURM allocation's nodes, run verl's driver on it, tear it down.

verl's trainer is a Ray program: `main_ppo` calls `ray.init()`, which on one node starts a local Ray
instance by itself. A job that spans several nodes needs the Ray cluster first:

1. the node this runs on is the Ray head (`ray start --head --block`, a child process of this one). Under
   Snakemake's SLURM plugins that is the job step the jobstep plugin starts on the allocation's first node
   (`srun -n1 --gpus=<the node's GPUs> ...`: one task, one node, the train rule's `gpus` resource);
2. every other node of the allocation runs one Ray worker, all in one `srun --overlap` step (one task per node,
   `--nodelist=<the other nodes>`, each with the node's CPUs and GPUs: `--cpus-per-task`, `--gpus-per-node`)
   that connects to the head. The allocation's nodes come from slurmctld (`scontrol show job $SLURM_JOB_ID`):
   inside a job step SLURM_JOB_NODELIST names the step's nodes only. The step is started with the SLURM
   variables of the job step this runs in removed (as the jobstep plugin does for its own `srun`): srun reads
   them as options (e.g. the step's GPU count), and the worker step asks for what it needs itself;
3. once all nodes are alive in the cluster (bounded wait), the driver (verl's command) runs on the
   head with `RAY_ADDRESS` set, so its `ray.init()` joins the cluster instead of starting one. Ray refuses
   `num_cpus` / `num_gpus` from a driver that joins a cluster: each node's CPUs and GPUs are given to
   `ray start` here (`--num-cpus`, `--num-gpus`), and the launcher leaves them out of verl's
   `ray_kwargs.ray_init` on this path (creditlab.engines.verl.launch.verl_command);
4. whatever happens to the driver, the worker step and the head are stopped (process groups), and the head's
   record of its address (`ray_current_cluster` in Ray's temp dir, which a stopped head leaves behind) is removed:
   a later `ray.init()` without an address on this node (a one-node run of another job) would follow it to a dead
   cluster and wait for it (seen here: over six minutes, then the job was cancelled).

Ray 2.60 authenticates cluster connections with a token; each job makes a fresh one and hands it to the
head, the workers (srun passes the environment on) and the driver (`RAY_AUTH_MODE=token`,
`RAY_AUTH_TOKEN`), so concurrent jobs on shared nodes cannot join each other's clusters. The head's
address is the IP Ray itself picks for this node.

Usage (what the launcher wraps a multi-node training command with; `--` separates the driver):

    python -m creditlab.engines.verl.ray_slurm [--gpus-per-node G] [--num-cpus C] [--force-cluster] -- <driver argv...>

Outside SLURM, or on one node without ``--force-cluster``, the driver simply runs (verl starts its own Ray).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from creditlab.procs import stop_group

DEFAULT_PORT = 6379
READY_TIMEOUT_S = 300.0


# what a job step's srun keeps of the SLURM variables (as snakemake-executor-plugin-slurm-jobstep 0.6.1 does, plus
# SLURM_CONF: where the cluster's configuration is when it is not in /etc/slurm)
KEEP_SLURM_VARS = frozenset(
    {
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_MAX",
        "SLURM_ARRAY_TASK_STEP",
        "SLURM_CLUSTER_NAME",
        "SLURM_SUBMIT_DIR",
        "SLURM_SUBMIT_HOST",
        "SLURM_CONF",
    }
)


def job_nodelist(env: Mapping[str, str]) -> str | None:
    """The job's node list (compressed, e.g. ``n[1-4]``) as slurmctld has it: `scontrol show job $SLURM_JOB_ID`.
    A job step's own SLURM_JOB_NODELIST names the step's nodes (seen with slurm 22.05 inside the jobstep plugin's
    `srun -n1` step of a two-node job: ``n1``), so it is only the fallback, when slurmctld gives no answer."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job:
        proc = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30, env=dict(env)
        )
        for item in proc.stdout.split() if proc.returncode == 0 else []:
            key, _, value = item.partition("=")
            if key == "NodeList" and value and value != "(null)":
                return value
    return env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")


def slurm_nodes(env: Mapping[str, str] | None = None) -> list[str]:
    """The allocation's host names, in SLURM's order (`scontrol show hostnames <job_nodelist>`); [] outside a
    SLURM job."""
    env = os.environ if env is None else env
    nodelist = job_nodelist(env)
    if not nodelist:
        return []
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=dict(env),
    )
    return out.stdout.split()


def this_node(nodes: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The node of the allocation this process runs on (SLURMD_NODENAME, else the first node): the Ray head."""
    name = env.get("SLURMD_NODENAME")
    return name if name in nodes else (nodes[0] if nodes else None)


def step_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the job step's SLURM variables, for an `srun` that starts a step of its own."""
    return {
        k: v
        for k, v in env.items()
        if not (k.startswith(("SRUN_", "SBATCH_")) or (k.startswith("SLURM_") and k not in KEEP_SLURM_VARS))
    }


def ray_bin() -> str:
    """The `ray` command of this Python environment (jobs must use the same Ray as the driver)."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def node_ip() -> str:
    """This node's IP as Ray determines it (the address other nodes reach the head at)."""
    from ray._private.services import get_node_ip_address

    return get_node_ip_address()


def auth_env() -> dict[str, str]:
    """A fresh Ray authentication token for one job's cluster."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _resources(gpus_per_node: int | None, num_cpus: int | None) -> list[str]:
    return ([f"--num-cpus={num_cpus}"] if num_cpus is not None else []) + (
        [f"--num-gpus={gpus_per_node}"] if gpus_per_node is not None else []
    )


def head_command(ip: str, port: int, gpus_per_node: int | None, num_cpus: int | None = None) -> list[str]:
    """`ray start` of the head node (blocking: the process lives as long as the head)."""
    cmd = [
        ray_bin(),
        "start",
        "--head",
        f"--node-ip-address={ip}",
        f"--port={port}",
        "--block",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    return cmd + _resources(gpus_per_node, num_cpus)


def worker_step_command(
    nodes: Sequence[str],
    address: str,
    gpus_per_node: int | None,
    num_cpus: int | None = None,
    head: str | None = None,
) -> list[str]:
    """One `srun` step running a blocking Ray worker on every node but the head (`head`, default the first), each
    task with the node's CPUs (`num_cpus`: --cpus-per-task) and GPUs (--gpus-per-node)."""
    head = nodes[0] if head is None and nodes else head
    workers = [n for n in nodes if n != head]
    if not workers:
        return []
    ray = [ray_bin(), "start", f"--address={address}", "--block", "--disable-usage-stats"]
    return [
        "srun",
        "--overlap",
        f"--nodes={len(workers)}",
        f"--ntasks={len(workers)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(workers)}",
        *([f"--cpus-per-task={num_cpus}"] if num_cpus is not None else []),
        *([f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
        *ray,
        *_resources(gpus_per_node, num_cpus),
    ]


def wait_for_nodes(address: str, n: int, procs: Sequence[subprocess.Popen], timeout_s: float) -> None:
    """Wait until `n` nodes are alive in the Ray cluster at `address`: connect once (retrying while the head
    comes up), poll `ray.nodes()`, disconnect. Fails early if a Ray process died, late on the timeout."""
    import ray

    deadline = time.monotonic() + timeout_s

    def check_alive() -> None:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"Ray process {proc.args[:3]} exited with {proc.returncode} before the cluster was up"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray cluster at {address}: not {n} nodes alive after {timeout_s:.0f}s")

    while not ray.is_initialized():
        check_alive()
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, RuntimeError):
            time.sleep(2.0)
    try:
        while sum(1 for node in ray.nodes() if node["Alive"]) < n:
            check_alive()
            time.sleep(2.0)
    finally:
        ray.shutdown()


def forget_address(address: str) -> None:
    """Remove Ray's record of the current cluster on this node (`ray_current_cluster`, written by `ray start
    --head`) if it names `address`: `ray stop` would, a head stopped by a signal does not."""
    try:
        from ray._common.utils import get_ray_address_file

        path = Path(get_ray_address_file(None))
        if path.read_text().strip() == address:
            path.unlink()
    except (ImportError, OSError):
        pass


def run_on_ray_cluster(
    argv: Sequence[str],
    gpus_per_node: int | None = None,
    force_cluster: bool = False,
    port: int = DEFAULT_PORT,
    timeout_s: float = READY_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    num_cpus: int | None = None,
) -> int:
    """Run the driver `argv` on a Ray cluster over the SLURM allocation (see the module doc); its exit code.
    `num_cpus` / `gpus_per_node`: what Ray offers on each node (None: what Ray detects)."""
    env = dict(os.environ if env is None else env)
    nodes = slurm_nodes(env)
    if len(nodes) <= 1 and not force_cluster:
        return subprocess.run(list(argv), env=env).returncode
    env.update(auth_env())
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")})  # for wait_for_nodes' ray.init
    ip = node_ip()
    address = f"{ip}:{port}"
    head = this_node(nodes, env)
    procs: list[subprocess.Popen] = []
    try:
        print(
            f"ray_slurm: head {ip} ({head or 'this host'}), {max(len(nodes), 1)} node(s)",
            file=sys.stderr,
            flush=True,
        )
        procs.append(subprocess.Popen(head_command(ip, port, gpus_per_node, num_cpus), env=env, start_new_session=True))
        workers = worker_step_command(nodes, address, gpus_per_node, num_cpus, head=head)
        if workers:
            print(f"ray_slurm: workers: {' '.join(workers)}", file=sys.stderr, flush=True)
            procs.append(subprocess.Popen(workers, env=step_env(env), start_new_session=True))
        wait_for_nodes(address, max(len(nodes), 1), procs, timeout_s)
        print(f"ray_slurm: cluster up at {address}; running {' '.join(argv[:4])} ...", file=sys.stderr, flush=True)
        return subprocess.run(list(argv), env={**env, "RAY_ADDRESS": address}).returncode
    finally:
        for proc in reversed(procs):
            stop_group(proc)
        forget_address(address)


def main(args: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m creditlab.engines.verl.ray_slurm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs Ray offers per node (default: detected)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray offers per node (default: detected)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for every node")
    p.add_argument("--force-cluster", action="store_true", help="start a Ray cluster even on one node")
    p.add_argument("driver", nargs=argparse.REMAINDER, help="-- then the driver's command")
    a = p.parse_args(args)
    driver = a.driver[1:] if a.driver[:1] == ["--"] else a.driver
    if not driver:
        p.error("no driver command (after --)")
    sys.exit(run_on_ray_cluster(driver, a.gpus_per_node, a.force_cluster, a.port, a.timeout, num_cpus=a.num_cpus))


if __name__ == "__main__":
    main()
