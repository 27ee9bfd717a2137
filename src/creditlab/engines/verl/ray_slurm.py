"""Ray on SLURM: bring up a Ray cluster over a SLURM allocation's nodes, run verl's driver on it, tear it down.

verl's trainer is a Ray program: `main_ppo` calls `ray.init()`, which on one node starts a local Ray
instance by itself. A job that spans several nodes needs the Ray cluster first:

1. the batch script runs on the allocation's first node: that node is the Ray head
   (`ray start --head --block`, a child process of this one);
2. every other node runs one Ray worker, all in one `srun` step (`--overlap`, one task per node,
   `--exclude=<head>`) that connects to the head;
3. once all nodes are alive in the cluster (bounded wait), the driver (verl's command) runs on the
   head with `RAY_ADDRESS` set, so its `ray.init()` joins the cluster instead of starting one;
4. whatever happens to the driver, the worker step and the head are stopped (process groups).

Ray 2.60 authenticates cluster connections with a token; each job makes a fresh one and hands it to the
head, the workers (srun passes the environment on) and the driver (`RAY_AUTH_MODE=token`,
`RAY_AUTH_TOKEN`), so concurrent jobs on shared nodes cannot join each other's clusters. The head's
address is the IP Ray itself picks for this node.

Usage (what the launcher wraps a multi-node training command with; `--` separates the driver):

    python -m creditlab.engines.verl.ray_slurm [--gpus-per-node G] [--force-cluster] -- <driver argv...>

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


def slurm_nodes(env: Mapping[str, str] | None = None) -> list[str]:
    """The allocation's host names, in SLURM's order (`scontrol show hostnames $SLURM_JOB_NODELIST`);
    [] outside a SLURM job."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
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


def head_command(ip: str, port: int, gpus_per_node: int | None) -> list[str]:
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
    return cmd + ([f"--num-gpus={gpus_per_node}"] if gpus_per_node is not None else [])


def worker_step_command(nodes: Sequence[str], address: str, gpus_per_node: int | None) -> list[str]:
    """One `srun` step running a blocking Ray worker on every node but the first (the head)."""
    workers = list(nodes[1:])
    if not workers:
        return []
    ray = [ray_bin(), "start", f"--address={address}", "--block", "--disable-usage-stats"]
    ray += [f"--num-gpus={gpus_per_node}"] if gpus_per_node is not None else []
    return [
        "srun",
        "--overlap",
        f"--nodes={len(workers)}",
        f"--ntasks={len(workers)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(workers)}",
        *ray,
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


def run_on_ray_cluster(
    argv: Sequence[str],
    gpus_per_node: int | None = None,
    force_cluster: bool = False,
    port: int = DEFAULT_PORT,
    timeout_s: float = READY_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run the driver `argv` on a Ray cluster over the SLURM allocation (see the module doc); its exit code."""
    env = dict(os.environ if env is None else env)
    nodes = slurm_nodes(env)
    if len(nodes) <= 1 and not force_cluster:
        return subprocess.run(list(argv), env=env).returncode
    env.update(auth_env())
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")})  # for wait_for_nodes' ray.init
    ip = node_ip()
    address = f"{ip}:{port}"
    procs: list[subprocess.Popen] = []
    try:
        print(
            f"ray_slurm: head {ip} ({nodes[0] if nodes else 'this host'}), {max(len(nodes), 1)} node(s)",
            file=sys.stderr,
            flush=True,
        )
        procs.append(subprocess.Popen(head_command(ip, port, gpus_per_node), env=env, start_new_session=True))
        workers = worker_step_command(nodes, address, gpus_per_node)
        if workers:
            procs.append(subprocess.Popen(workers, env=env, start_new_session=True))
        wait_for_nodes(address, max(len(nodes), 1), procs, timeout_s)
        print(f"ray_slurm: cluster up at {address}; running {' '.join(argv[:4])} ...", file=sys.stderr, flush=True)
        return subprocess.run(list(argv), env={**env, "RAY_ADDRESS": address}).returncode
    finally:
        for proc in reversed(procs):
            stop_group(proc)


def main(args: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m creditlab.engines.verl.ray_slurm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs Ray offers per node (default: detected)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for every node")
    p.add_argument("--force-cluster", action="store_true", help="start a Ray cluster even on one node")
    p.add_argument("driver", nargs=argparse.REMAINDER, help="-- then the driver's command")
    a = p.parse_args(args)
    driver = a.driver[1:] if a.driver[:1] == ["--"] else a.driver
    if not driver:
        p.error("no driver command (after --)")
    sys.exit(run_on_ray_cluster(driver, a.gpus_per_node, a.force_cluster, a.port, a.timeout))


if __name__ == "__main__":
    main()
