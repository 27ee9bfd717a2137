"""A throwaway SLURM cluster on localhost, for tests (tests/test_slurm.py).

Debian's slurm-wlm packages (slurmctld, slurmd, slurm-client) and munge, installed by `make install`
(tools/sysdeps.d/slurm.sh). Everything the cluster has is its own: a fresh munge key and munged socket, a
slurm.conf in a private directory (clients find it through SLURM_CONF in `cluster.env`, never
/etc/slurm), free TCP ports picked at start, state, spool and logs in that directory. No accounting
(no slurmdbd): job states come from slurmctld (`squeue`/`scontrol`), which keeps finished jobs for
MinJobAge seconds. Node `localhost` is this machine (its CPUs and memory, from `slurmd -C`) with `gpus`
file-less GPUs (GRES bound to dummy device files: jobs asking for GPUs are scheduled, they get none), alone in
partition `partition` (the default). With `dgx_nodes=K`, nodes n1..nK of the papers' shape join it in partition
`dgx_partition`: each a DGX H100 as slurmctld sees it (`DGX_H100`: 224 CPUs, 2 TB, 8 GPUs), declared through
`SlurmdParameters=config_overrides` (slurmd reports the configured hardware, not this machine's), each its own
`slurmd -N nI` on its own port of this host (one host, several slurmd: Debian's slurm is built for it). Jobs
there are scheduled, placed and started as on such nodes; they run on this machine's cores, and what they get
of a "GPU" is SLURM's bookkeeping (GRES counts, CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS in a step's
environment), no device. `TaskPlugin=task/none`: nothing is confined (no cgroup: CPU, memory, devices).

    with LocalSlurmCluster(root) as cluster:       # starts munged, slurmctld, slurmd; waits for an idle node
        subprocess.run(["sbatch", ...], env=cluster.env)
    # stopped: jobs cancelled, daemons and every process of the cluster killed, `root` removed

Every process of the cluster (daemons, job steps, jobs: sbatch passes the environment on) carries
CREDITLAB_SLURM_CLUSTER=<id> in its environment, which is how `stop()` finds the job steps that outlive
slurmd. The daemons run in the foreground as children of this process with a parent-death signal; a
watchdog process in its own session cleans up (kills the rest, removes the directory) if this process dies
without calling `stop()` (SIGTERM/SIGKILL from `timeout -k`, a crash). Needs root (slurmd runs jobs as their
submitting user). Every SLURM command runs under a timeout.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

# command -> Debian package providing it (the same map as tools/sysdeps.d/slurm.sh)
REQUIRED = {
    "munged": "munge",
    "munge": "munge",
    "unmunge": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "squeue": "slurm-client",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
}
TOKEN_VAR = "CREDITLAB_SLURM_CLUSTER"
# a DGX H100 (2 x Xeon Platinum 8480C: 2 x 56 cores x 2 threads; 2 TB; 8 H100) as slurm.conf would declare it
DGX_H100 = {
    "CPUs": 224,
    "Boards": 1,
    "SocketsPerBoard": 2,
    "CoresPerSocket": 56,
    "ThreadsPerCore": 2,
    "RealMemory": 2_000_000,
}
DGX_GPUS = 8


def which(cmd: str) -> str | None:
    """`cmd` on PATH, or in the sbin directories a non-root PATH lacks (munged, slurmctld, slurmd)."""
    return shutil.which(cmd) or shutil.which(cmd, path="/usr/sbin:/usr/local/sbin:/sbin")


def unavailable_reason() -> str | None:
    """Why a local cluster cannot be started here (None: it can)."""
    missing = sorted({pkg for cmd, pkg in REQUIRED.items() if which(cmd) is None})
    if missing:
        pkgs = " ".join(missing)
        return (
            f"SLURM/munge commands missing (Debian packages: {pkgs}). `make install` apt-installs them as root "
            f"(tools/sysdeps.sh, tools/sysdeps.d/slurm.sh); otherwise: apt-get install {pkgs}"
        )
    if os.geteuid() != 0:
        return "the local SLURM test cluster must be started as root (slurmd runs jobs as their submitting user)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def token_pids(token: str) -> list[int]:
    """Live processes whose environment carries CREDITLAB_SLURM_CLUSTER=<token> (zombies have none)."""
    needle, me, pids = f"{TOKEN_VAR}={token}".encode(), os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != me:
            try:
                environ = Path(f"/proc/{d}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                pids.append(int(d))
    return pids


def kill_token_processes(token: str, rounds: int = 20) -> list[int]:
    """SIGTERM, then SIGKILL (slurmstepd and srun ignore SIGTERM) every process of the cluster; the survivors."""
    for attempt in range(rounds):
        pids = token_pids(token)
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM if attempt < 4 else signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    return token_pids(token)


def _watchdog(fd: int, token: str, root: str) -> None:
    """The cleaner of last resort, in its own session: once the process that started the cluster closes its end
    of the pipe or dies (even by SIGKILL, e.g. `timeout -k` around pytest), kill whatever of the cluster is left
    (daemons die with their parent, but job steps and jobs do not) and remove its directory."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            os.read(fd, 1)  # b"" (EOF) when the writer is gone; nothing is ever written
            break
        except InterruptedError:
            continue
    kill_token_processes(token)
    if root:
        shutil.rmtree(root, ignore_errors=True)


class ClusterError(RuntimeError):
    pass


class LocalSlurmCluster:
    """Node `node` (this machine, 127.0.0.1) in partition `partition` (default) with `gpus` GRES gpus; with
    `dgx_nodes` K > 0 also nodes n1..nK of the papers' shape (`dgx_shape`, `dgx_gpus` GPUs each) in partition
    `dgx_partition`."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        gpus: int = 2,
        partition: str = "creditlab-test",
        node: str = "localhost",
        min_job_age: int = 3600,
        dgx_nodes: int = 0,
        dgx_partition: str = "creditlab-dgx",
        dgx_shape: dict[str, int] | None = None,
        dgx_gpus: int = DGX_GPUS,
    ):
        self._own_root = root is None
        # short path: unix sockets (munged, slurmstepd) must fit in 108 bytes
        self.root = Path(tempfile.mkdtemp(prefix="creditlab-slurm-", dir="/tmp")) if root is None else Path(root)
        self.gpus, self.partition, self.node, self.min_job_age = gpus, partition, node, min_job_age
        self.dgx_nodes = [f"n{i}" for i in range(1, dgx_nodes + 1)]
        self.dgx_partition, self.dgx_gpus = dgx_partition, dgx_gpus
        self.dgx_shape = dict(DGX_H100 if dgx_shape is None else dgx_shape)
        self.token = f"creditlab-slurm-{uuid.uuid4().hex[:12]}"
        self.conf = self.root / "etc/slurm.conf"
        self.munge_socket = self.root / "munge/munge.socket"
        self.logs = self.root / "log"
        self.procs: dict[str, subprocess.Popen] = {}
        self.leftover_pids: list[int] = []
        self._watchdog_proc: subprocess.Popen | None = None
        self._watchdog_fd: int | None = None
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_"))
        }
        self.env.update(SLURM_CONF=str(self.conf), **{TOKEN_VAR: self.token})
        # srun shim first on PATH: snakemake-executor-plugin-slurm-jobstep (0.6.1) removes every SLURM_* variable
        # but a few from the environment of the `srun` it runs inside each job, SLURM_CONF included, and srun
        # then looks for /etc/slurm/slurm.conf (a real cluster's place, not this one's)
        self.bin = self.root / "bin"
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env.get('PATH', os.defpath)}"

    # ------------------------------------------------------------------ commands
    def cmd(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster (bounded)."""
        try:
            proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise ClusterError(f"{' '.join(args)}: no answer in {timeout} s") from err
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still knows (finished ones for MinJobAge s): `scontrol show job -o` fields."""
        out = self.cmd("scontrol", "show", "job", "-o").stdout
        jobs = []
        for line in out.splitlines():
            if not line.strip() or line.startswith("No jobs"):
                continue
            fields = {}
            for item in line.split():
                key, sep, value = item.partition("=")
                if sep and key not in fields:
                    fields[key] = value
            jobs.append(fields)
        return jobs

    @property
    def nodes(self) -> list[str]:
        """Every node of the cluster: this machine's first, then the DGX-shaped ones."""
        return [self.node, *self.dgx_nodes]

    def node_state(self) -> str:
        return self.cmd("sinfo", "-h", "-N", "-n", self.node, "-o", "%T", timeout=15).stdout.strip().lower()

    def node_states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", timeout=15).stdout
        return {n: st.lower() for n, st in (line.split() for line in out.splitlines() if line.strip())}

    def _all_idle(self):
        states = self.node_states()
        return all(states.get(n) == "idle" for n in self.nodes) or states

    def log_tail(self, n: int = 30) -> str:
        parts = []
        for f in sorted(self.logs.glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-n:]
            parts.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # ------------------------------------------------------------------ start
    def _write_config(self) -> None:
        for d in ("etc", "munge", "munge-key", "state", "spool", "log", "dev", "bin"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        srun = self.bin / "srun"
        srun.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {which("srun")} "$@"\n')
        srun.chmod(0o755)
        key = self.root / "munge-key/munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (self.root / "munge-key").chmod(0o700)
        (self.root / "munge").chmod(0o755)

        # this machine as the node: slurmd -C prints CPUs, sockets, cores, threads, RealMemory
        probe = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True, timeout=30, env=self.env)
        hw = dict(
            re.findall(r"(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=(\d+)", probe.stdout)
        )
        if "CPUs" not in hw or "RealMemory" not in hw:
            raise ClusterError(f"slurmd -C gave no node configuration: {probe.stdout!r} {probe.stderr!r}")
        hw["RealMemory"] = str(int(hw["RealMemory"]) * 95 // 100)  # a margin: memory reported later may be lower
        node_hw = " ".join(f"{k}={v}" for k, v in hw.items())

        gpu_files = []
        for i in range(max(self.gpus, self.dgx_gpus if self.dgx_nodes else 0)):  # GRES gpus need a device file
            # each (the nodes share them); a char device like /dev/null if possible
            dev = self.root / f"dev/gpu{i}"
            try:
                os.mknod(dev, 0o600 | 0o020000, os.makedev(1, 3))
            except OSError:
                dev.touch()  # a plain file: slurmd logs an error for it but still counts the GPU
            gpu_files.append(str(dev))
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        self.node_ports = {self.node: self.slurmd_port, **{n: _free_port() for n in self.dgx_nodes}}
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        dgx_hw = " ".join(f"{k}={v}" for k, v in self.dgx_shape.items())
        dgx_gres = f" Gres=gpu:{self.dgx_gpus}" if self.dgx_gpus else ""
        # Several slurmd on one host: each node its own Port, started as `slurmd -N <node>`, all at 127.0.0.1. With
        # node `localhost` beside them, slurmctld 22.05 (find_node_record) refuses two layouts ("fatal: Duplicated
        # NodeHostName"): NodeHostname=localhost on the DGX nodes (a node name matches a host name), and node
        # `localhost` listed first (a lone node called "localhost" answers to any name). So: the DGX nodes first,
        # with their own names as host names (the default).
        dgx_lines = "".join(
            f"NodeName={n} NodeAddr=127.0.0.1 Port={self.node_ports[n]} {dgx_hw}{dgx_gres} State=UNKNOWN\n"
            for n in self.dgx_nodes
        )
        if self.dgx_nodes:
            dgx_lines += (
                f"PartitionName={self.dgx_partition} Nodes={','.join(self.dgx_nodes)} MaxTime=INFINITE State=UP\n"
            )
        r = self.root
        self.conf.write_text(f"""\
# generated by tests/slurm_cluster.py: a throwaway cluster ({self.token})
ClusterName=creditlabtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=45
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={self.logs}/slurmctld.log
SlurmdLogFile={self.logs}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MinJobAge={self.min_job_age}
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
{dgx_lines}NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} Port={self.slurmd_port} {node_hw}{gres} \
State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        (self.conf.parent / "gres.conf").write_text(
            "".join(f"NodeName={self.node} Name=gpu File={f}\n" for f in gpu_files[: self.gpus])
            + "".join(f"NodeName={n} Name=gpu File={f}\n" for n in self.dgx_nodes for f in gpu_files[: self.dgx_gpus])
        )
        for n in self.nodes:
            (r / "spool" / n).mkdir(parents=True, exist_ok=True)

    def _spawn(self, name: str, args: list[str]) -> None:
        out = open(self.logs / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.root,
            preexec_fn=_die_with_parent,
        )
        out.close()
        (self.root / f"{name}.child.pid").write_text(str(self.procs[name].pid))

    def _wait(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited ({proc.returncode}) while waiting for {what}\n{self.log_tail()}"
                        + "".join(
                            f"\n--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in self.logs.glob("*.out")
                        )
                    )
            try:
                last = ok()
                if last is True:
                    return
            except ClusterError as err:
                last = err
            time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout} s waiting for {what} (last: {last})\n{self.log_tail()}")

    def start(self, timeout: float = 90) -> "LocalSlurmCluster":
        reason = unavailable_reason()
        if reason:
            raise ClusterError(reason)
        try:
            self._start_watchdog()
            self._write_config()
            self._spawn(
                "munged",
                [
                    which("munged"),
                    "--foreground",
                    "--force",
                    f"--socket={self.munge_socket}",
                    f"--key-file={self.root}/munge-key/munge.key",
                    f"--pid-file={self.root}/munged.pid",
                    f"--log-file={self.logs}/munged.log",
                    f"--seed-file={self.root}/munge/munged.seed",
                ],
            )
            self._wait("munged", self._munge_ok, timeout=20)
            self._spawn("slurmctld", [which("slurmctld"), "-D", "-f", str(self.conf)])
            self._wait(
                "slurmctld",
                lambda: "UP" in self.cmd("scontrol", "ping", timeout=10, check=False).stdout,
                timeout=timeout / 2,
            )
            for n in self.nodes:
                self._spawn(f"slurmd-{n}", [which("slurmd"), "-D", "-f", str(self.conf), "-N", n])
            self._wait(f"nodes {','.join(self.nodes)} idle", self._all_idle, timeout=timeout / 2)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_watchdog(self) -> None:
        read_fd, self._watchdog_fd = os.pipe()
        env = {k: v for k, v in self.env.items() if k != TOKEN_VAR}  # not one of the processes it kills
        code = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import slurm_cluster; "
            f"slurm_cluster._watchdog({read_fd}, {self.token!r}, {str(self.root) if self._own_root else ''!r})"
        )
        self._watchdog_proc = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(read_fd,),
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(read_fd)

    def _munge_ok(self):
        if not self.munge_socket.exists():
            return "no socket yet"
        enc = subprocess.run([which("munge"), "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10)
        dec = subprocess.run(
            [which("unmunge"), "-S", str(self.munge_socket)], input=enc.stdout, capture_output=True, timeout=10
        )
        return dec.returncode == 0 or dec.stderr.decode(errors="replace")

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what is left of the cluster, remove its directory."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            try:
                ids = self.cmd("squeue", "-h", "-o", "%i", timeout=15, check=False).stdout.split()
                if ids:
                    self.cmd("scancel", *ids, timeout=15, check=False)
                    deadline = time.monotonic() + 20
                    while (
                        time.monotonic() < deadline
                        and self.cmd(
                            "squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i", timeout=15, check=False
                        ).stdout.strip()
                    ):
                        time.sleep(0.5)
            except ClusterError:
                pass
        for name in [*(f"slurmd-{n}" for n in self.nodes), "slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        # job steps and jobs left behind (slurmstepd outlives slurmd by design)
        self.leftover_pids = kill_token_processes(self.token)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._watchdog_fd is not None:  # the watchdog finds nothing left, and exits
            os.close(self._watchdog_fd)
            self._watchdog_fd = None
            try:
                self._watchdog_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._watchdog_proc.kill()
                self._watchdog_proc.wait(timeout=10)

    def __enter__(self) -> "LocalSlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
