"""Process isolation of the code harness: which sandbox tier runs here, how it starts, and how it is torn down.

Isolation layers (:func:`sandbox_report` says which are active on this machine):

1. **A fresh process per solution**: the caller (e.g. a reward-scorer worker) starts it as its own
   child, in a new session; inside, the harness forks a new child per test.
2. **rlimits** on every test child: CPU seconds (``ceil(time_limit)+1``), address space
   (``memory_mb``), file size (``max_output_mb``), open files (256), core dumps (0, also on the
   harness); on the harness: process count (``max_procs``, counting the sandbox's own uid / user
   namespace only).
3. **Wall clock**: the harness SIGKILLs a test's process group at ``time_limit_s`` and then every
   other process of the sandbox (``kill(-1)`` inside its pid namespace / as its unique uid); the
   parent SIGKILLs the whole session (taking the pid namespace down) when the harness does not
   answer within ``time_limit_s + GRACE_S`` (:mod:`creditlab.rewards.code.runner`), and at the end
   sweeps the sandbox uid. Together with the process-count limit this is what ends fork bombs
   (``RLIMIT_NPROC`` alone does nothing for uid 0, hence layer 7).
4. **Scrubbed environment**: no inherited variables (no secrets, no ``PYTHONPATH``), ``HOME`` =
   the scratch dir, interpreter in isolated mode without ``site`` (``python -I -S``): only the
   standard library is importable.

Tier ``bwrap`` (bubblewrap, Debian package ``bubblewrap``; ``make install`` installs it when root):

5. **Namespaces**: new pid, network (no interface but its own loopback: no outside network and no
   host service, not even on the host's 127.0.0.1), IPC, UTS and cgroup namespaces;
   ``--die-with-parent``: the sandbox dies with the thread that started it (e.g. a reward worker
   killed on timeout); ``--new-session`` (no terminal injection).
6. **Filesystem**: a new mount namespace whose root is an empty read-only tmpfs with ``/usr``
   (and the interpreter's install prefix if elsewhere) bound read-only and nosuid; no ``/etc``, no
   home, no project files; ``/tmp``, ``/dev/shm`` (64 MB) and the working dir ``/sandbox`` are
   size-capped tmpfs that vanish with the sandbox (the scratch dir is gone even when the caller is
   SIGKILLed); ``/dev`` itself (bwrap's device tmpfs) is read-only.
7. **Unprivileged uid**: as root, bwrap itself runs as a unique unprivileged uid
   (:data:`UID_BASE` + 64 x caller pid + slot) in a user namespace with nested user namespaces
   disabled, so ``RLIMIT_NPROC`` is enforced and the uid owns nothing on the host. That uid must
   reach the interpreter: this Python's base install when world-readable, else the system
   ``/usr/bin/python3`` (an install under ``/root``, e.g. pyenv, is not). Last resort: bwrap as
   root keeping only CAP_SETUID/SETGID, the harness dropping to the unique uid before reading
   anything (nested user namespaces then stay possible). As non-root, bwrap runs unprivileged
   (uid 65534 inside, mapped to the caller).

Every tier:

8. **The harness out of the solution's reach** (see the trust model in :mod:`creditlab.rewards.code`):
   non-dumpable (required: the harness refuses to run otherwise), pid 1 of its pid namespace in the
   ``bwrap`` (``--as-pid-1``) and ``unshare`` tiers, and on x86_64 / aarch64 a seccomp filter on every process of
   the solution
   (``ptrace``, ``process_vm_readv/writev``, ``kcmp``, ``perf_event_open``, ``pidfd_open``,
   ``pidfd_getfd``, ``process_madvise`` and other architectures' system calls fail with EPERM; a
   filter that cannot be installed is a ``sandbox_error``).

Fallback tiers when bwrap is missing or fails its probe (any tier can be forced with env
``CREDITLAB_CODE_SANDBOX=bwrap|unshare|process``; ``auto`` is the default; whether an evaluation may score code under
the tier it gets is :mod:`creditlab.rewards.code.policy`'s to say):

* ``unshare`` (util-linux ``unshare --user --net --pid --mount-proc`` behind
  ``setpriv --pdeathsig KILL``): pid + network namespaces, as root under a unique unprivileged
  uid; **no filesystem isolation**: the solution can read world-readable files (the project is
  world-readable) and write where that uid may (``/tmp``). The scratch dir is a host temp dir
  removed afterwards (left behind if the caller is SIGKILLed; the next sandbox plan of any
  process removes those of dead callers).
* ``process``: no namespaces: **no network and no filesystem isolation**. As root, the unique uid
  still gives the process-count limit and a complete kill of the sandbox's processes. As
  non-root, the process-count limit is the caller's whole uid plus ``max_procs`` and cleanup
  kills the processes whose environment carries the run's tag (a solution that re-executes
  itself with a clean environment after ``setsid`` can escape it until its CPU limit).

The fallbacks keep layers 1-4 and 8, so infinite loops, fork bombs and huge allocations still end as
clean failed verdicts; the network, file and ``/dev/shm`` tests of ``tests/test_code_exec.py`` fail on them, on
purpose. Not provided by any tier: a bound on the *total* memory of a sandbox (each process has
its own address-space limit, so the worst case is ``max_procs x memory_mb``; that needs a memory
cgroup; note that bwrap's tmpfs, ``/tmp`` 256 MB, ``/dev/shm`` 64 MB and ``/sandbox``
``scratch_mb``, are RAM too, as are System V shared memory segments and memfds, bounded only by the
kernel's per-namespace limits and the per-process limits) and a general syscall filter (the seccomp
filter denies only the process-access calls). The non-root ``process`` tier runs the solution as
the caller's uid: it can reach the caller itself (``/proc/<pid>/fd``, ``/mem``), so no verdict
from that tier is safe against a hostile solution. Killed sandbox processes may stay zombies for a moment
until the host's init reaps them; they hold no memory or CPU.

Registered reward (kind ``"reward"``): ``code_exec`` -- :func:`code_exec_score`, 1.0 if the code
extracted from the response passes every test of ``gold`` (JSON, see :func:`parse_tests`), else
0.0. Importing this module also adds a :class:`~creditlab.rewards.math_verify_reward.RewardSpec`

The harness itself is :mod:`creditlab.rewards.code.harness`, a module file whose text (:data:`HARNESS`) every
tier passes to ``python -I -S -c``: nothing of the project is mounted into the sandbox.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

HARNESS = resources.files(__package__).joinpath("harness.py").read_text(encoding="utf-8")
"""Source of :mod:`creditlab.rewards.code.harness`, what the sandbox runs (``python -I -S -c HARNESS``)."""

UID_BASE = 1_800_000_000  # unique sandbox uids: UID_BASE + pid * 64 + slot (pid_max <= 2**22)
UID_SLOTS = 64
_TMP_MB = 256  # size cap of the sandbox's /tmp (test input/output files live there)
_SHM_MB = 64  # size cap of the sandbox's /dev/shm (POSIX shared memory, multiprocessing's semaphores)
_SECCOMP_ARCH = os.uname().machine in ("x86_64", "aarch64")  # where the harness's seccomp filter applies
NOFILE = 256
_TAG = "CREDITLAB_SANDBOX_RUN"


def _world_accessible(path: str) -> bool:
    """Every directory on the way is o+x and the file o+r/x: usable by an unrelated uid."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(1, len(parts)):
        d = os.sep.join(parts[:i]) or os.sep
        if not os.stat(d).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o005 == 0o005)


@dataclass
class Plan:
    tier: str  # bwrap | unshare | process | none
    interpreter: str
    prefix: str  # install prefix bound into the bwrap sandbox
    root: bool
    unique_uid: bool  # the sandbox runs as a unique uid (root only): NPROC enforced, whole-uid kill
    prefix_cmd: list[str] = field(default_factory=list)
    privileged: bool = False  # bwrap started as root (keeps CAP_SETUID/SETGID for the harness's uid drop)
    error: str = ""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _free: list[int] = field(default_factory=lambda: list(range(UID_SLOTS)), repr=False)

    def acquire_uid(self) -> int | None:
        if not self.unique_uid:
            return None
        with self._lock:
            if not self._free:
                raise RuntimeError(f"more than {UID_SLOTS} concurrent sandboxes in one process")
            slot = self._free.pop(0)
        return UID_BASE + os.getpid() * UID_SLOTS + slot

    def release_uid(self, uid: int | None) -> None:
        if uid is not None:
            with self._lock:
                self._free.append((uid - UID_BASE) % UID_SLOTS)

    @property
    def pid_namespace(self) -> bool:
        return self.tier in ("bwrap", "unshare")

    @property
    def kill_all(self) -> bool:
        """Whether ``kill(-1)`` from the harness hits only the sandbox's own processes."""
        return self.pid_namespace or self.unique_uid

    def command(
        self, uid: int | None, scratch: str | None, scratch_mb: int, token: str = ""
    ) -> tuple[list[str], dict[str, Any]]:
        """argv and Popen keyword arguments that start the harness (``token`` tags its processes' environ)."""
        harness = [self.interpreter, "-I", "-S", "-c", HARNESS]
        env = {"HOME": scratch or "/sandbox", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", _TAG: token}
        kw: dict[str, Any] = {"env": env, "start_new_session": True, "close_fds": True}
        if self.tier == "bwrap":
            kw["env"] = {}
            if self.privileged:  # the harness drops to the unique uid itself
                return _bwrap_argv(self, scratch_mb) + harness + [str(uid)], kw
            if uid is not None:  # root: bwrap itself runs unprivileged as the unique uid
                kw.update(user=uid, group=uid, extra_groups=[])
            return _bwrap_argv(self, scratch_mb) + harness + ["-"], kw
        kw["cwd"] = scratch
        if uid is not None:  # root: the whole process tree runs as the unique uid
            kw.update(user=uid, group=uid, extra_groups=[])
        return self.prefix_cmd + harness + ["-"], kw


def _bwrap_argv(plan: Plan, scratch_mb: int) -> list[str]:
    # --as-pid-1: the harness is the namespace's pid 1. Without it bwrap's own pid 1 (same uid, dumpable) holds
    # the harness's pipes, and a solution could open them through /proc/1/fd or take them with pidfd_getfd.
    a = [
        shutil.which("bwrap") or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--as-pid-1",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if plan.privileged:  # bwrap as root: the harness drops to the unique uid at once
        a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        a += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    a += [
        "--clearenv",
        "--setenv",
        "HOME",
        "/sandbox",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            a += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            a += ["--ro-bind", d, d]
    a += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    if plan.prefix and not (plan.prefix + "/").startswith("/usr/"):
        parts = plan.prefix.strip("/").split("/")
        for i in range(1, len(parts)):
            a += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
        a += ["--ro-bind", plan.prefix, plan.prefix]
    # /dev is bwrap's own tmpfs (uncapped, owned by the sandbox uid): read-only, with a capped /dev/shm on top
    a += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--remount-ro",
        "/dev",
        "--size",
        str(_SHM_MB << 20),
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
        "--size",
        str(_TMP_MB << 20),
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--size",
        str(scratch_mb << 20),
        "--perms",
        "1777",
        "--tmpfs",
        "/sandbox",
        "--chdir",
        "/sandbox",
        "--remount-ro",
        "/",
    ]
    return a


def _interpreters(root: bool) -> list[tuple[str, str]]:
    """(interpreter, install prefix) candidates: this Python's base install, then the system one."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    out = [(base, os.path.realpath(sys.base_prefix))]
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(p):
            out.append((os.path.realpath(p), os.path.dirname(os.path.dirname(os.path.realpath(p)))))
    return out


def _probe(plan: Plan) -> str:
    """Run a trivial program through the plan; '' if it works, else the reason."""
    uid = plan.acquire_uid()
    check = (
        "import os,sys\n"
        "print(os.getuid(), os.getcwd(), sorted(os.environ), file=sys.stderr)\n"
        "print('creditlab-sandbox-ok')\n"
    )
    try:
        argv, kw = plan.command(uid, tempfile.gettempdir() if plan.tier != "bwrap" else None, 16)
        argv = argv[: argv.index("-c") + 1] + [
            (
                f"import os\nu={uid!r}\nos.setgroups([]); os.setresgid(u,u,u); os.setresuid(u,u,u)\n"
                if plan.privileged
                else ""
            )
            + check
        ]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **kw)
        if p.returncode != 0 or "creditlab-sandbox-ok" not in p.stdout:
            return f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
        return ""
    except (OSError, subprocess.SubprocessError) as e:
        return repr(e)
    finally:
        plan.release_uid(uid)
        if uid is not None:
            kill_uid(uid)


def _has_pdeathsig_setpriv() -> bool:
    if not shutil.which("setpriv"):
        return False
    try:
        out = subprocess.run(["setpriv", "--help"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--pdeathsig" in out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_stale() -> None:
    """Clean up after sandboxes whose caller was killed (fallback tiers leave these behind): host scratch
    dirs and, as root, live processes of sandbox uids whose creating process is gone."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        m = re.fullmatch(r"creditlab-code-(\d+)-.*", name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            rmtree(os.path.join(tmp, name))
    if os.geteuid() == 0:
        stale: set[int] = set()
        for name in os.listdir("/proc"):
            try:
                uid = os.stat(f"/proc/{name}").st_uid if name.isdigit() else -1
            except OSError:
                continue
            if UID_BASE <= uid < UID_BASE + (1 << 28) and not _pid_alive((uid - UID_BASE) // UID_SLOTS):
                stale.add(uid)
        for uid in stale:
            kill_uid(uid)


_PLAN: Plan | None = None
_PLAN_LOCK = threading.Lock()


def _make_plan() -> Plan:
    forced = os.environ.get("CREDITLAB_CODE_SANDBOX", "auto")
    if forced not in ("auto", "bwrap", "unshare", "process"):
        raise ValueError(f"CREDITLAB_CODE_SANDBOX must be auto|bwrap|unshare|process, got {forced!r}")
    root = os.geteuid() == 0
    reasons = []
    tiers = ["bwrap", "unshare", "process"] if forced == "auto" else [forced]
    for tier in tiers:
        if tier == "bwrap" and not shutil.which("bwrap"):
            reasons.append("bwrap: not installed (Debian package bubblewrap)")
            continue
        if tier == "unshare" and not shutil.which("unshare"):
            reasons.append("unshare: not installed")
            continue
        # setpriv --pdeathsig: the sandbox dies with the thread that started it, as bwrap --die-with-parent
        prefix_cmd = [shutil.which("setpriv") or "setpriv", "--pdeathsig", "KILL"] if _has_pdeathsig_setpriv() else []
        if tier == "unshare":
            prefix_cmd += [
                shutil.which("unshare") or "unshare",
                "--user",
                "--net",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--mount-proc",
            ]
        # As root, the whole sandbox preferably runs as an unrelated uid, which must reach the
        # interpreter; privileged bwrap (root sets up, the harness drops the uid) is the last resort.
        candidates = [(interp, prefix, False) for interp, prefix in _interpreters(root)]
        if root and tier == "bwrap":
            candidates.append((*_interpreters(root)[0], True))
        for interp, prefix, privileged in candidates:
            if root and not privileged and not _world_accessible(interp):
                reasons.append(f"{tier}: {interp} is not accessible to an unprivileged uid")
                continue
            plan = Plan(tier, interp, prefix, root, unique_uid=root, prefix_cmd=prefix_cmd, privileged=privileged)
            why = _probe(plan)
            if not why:
                plan.error = "; ".join(reasons)
                return plan
            reasons.append(f"{tier}{' (privileged)' if privileged else ''} with {interp}: {why}")
    return Plan("none", "", "", root, False, error="no usable sandbox: " + "; ".join(reasons))


def get_plan() -> Plan:
    """The sandbox plan of this process, probed once (stale sandboxes of dead callers are cleaned up first)."""
    global _PLAN
    with _PLAN_LOCK:
        if _PLAN is None:
            _reap_stale()
            _PLAN = _make_plan()
            if _PLAN.error:
                log.warning("code_exec sandbox: tier %s (%s)", _PLAN.tier, _PLAN.error)
        return _PLAN


def reset_sandbox_plan() -> None:
    """Forget the probed tier (e.g. after changing ``CREDITLAB_CODE_SANDBOX``)."""
    global _PLAN
    with _PLAN_LOCK:
        _PLAN = None


def sandbox_report() -> dict[str, Any]:
    """Which isolation layers are active here: the tier, the interpreter and one line per layer."""
    p = get_plan()
    ns = p.tier == "bwrap"
    nproc = (
        f"enforced per sandbox (unique uid {UID_BASE}+)"
        if p.unique_uid
        else "enforced per sandbox (user namespace)"
        if p.tier in ("bwrap", "unshare")
        else "enforced on the caller's whole uid (shared with the pipeline)"
    )
    layers = {
        "process_per_solution": (p.tier != "none", "new session; a forked child per test"),
        "rlimits": (p.tier != "none", f"CPU, address space, file size, {NOFILE} open files, no core dumps"),
        "process_count_limit": (p.tier != "none" and (p.unique_uid or p.tier != "process"), nproc),
        "wall_clock_kill": (
            p.tier != "none",
            "harness kills each test's group and then "
            + ("every sandbox process" if p.kill_all else "only that group")
            + "; parent kills the session"
            + (" and the pid namespace" if p.pid_namespace else ""),
        ),
        "scrubbed_env": (p.tier != "none", "no inherited variables; python -I -S"),
        "unprivileged_uid": (
            p.unique_uid or not p.root,
            "unique uid per sandbox" if p.unique_uid else "caller's uid (not root)" if not p.root else "runs as root",
        ),
        "pid_namespace": (p.pid_namespace, p.tier),
        "network_namespace": (p.tier in ("bwrap", "unshare"), "own loopback only" if p.tier != "process" else "none"),
        "filesystem_isolation": (
            ns,
            "empty read-only root, /usr + interpreter read-only" if ns else "none: host files readable",
        ),
        "scratch_dir": (
            p.tier != "none",
            "size-capped tmpfs inside the sandbox" if ns else "host temp dir, removed after",
        ),
        "nested_user_namespaces_blocked": (
            ns and not p.privileged,
            "bwrap --disable-userns" if ns and not p.privileged else "no",
        ),
        "total_memory_cap": (False, "per-process address space only (no memory cgroup)"),
        "harness_isolation": (
            p.tier != "none" and (p.root or p.tier != "process"),
            "harness non-dumpable"
            + (", pid 1 of its pid namespace" if p.pid_namespace else "")
            + "; answers carry a per-run nonce the solution cannot read"
            + (
                ""
                if p.root or p.tier != "process"
                else "; but the solution runs as the caller's uid and can reach the caller"
            ),
        ),
        "syscall_filter": (
            p.tier != "none" and _SECCOMP_ARCH,
            "seccomp on the solution: process-access calls denied (ptrace, process_vm_*, pidfd_*, "
            "kcmp, perf_event_open)"
            if _SECCOMP_ARCH
            else f"none on {os.uname().machine}",
        ),
    }
    return {
        "tier": p.tier,
        "interpreter": p.interpreter,
        "root": p.root,
        "notes": p.error,
        "layers": {k: {"active": bool(a), "detail": d} for k, (a, d) in layers.items()},
    }


def kill_tagged(token: str, settle_s: float = 2.0) -> None:
    """SIGKILL the caller-uid processes whose initial environment carries ``token`` (non-root ``process``
    tier: the solution runs as the caller, so its uid cannot tell its processes apart)."""
    needle, me, uid = f"{_TAG}={token}".encode(), os.getpid(), os.getuid()
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        os.kill(int(name), signal.SIGKILL)
                        found = True
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.01)


def _live_pids_of_uid(uid: int) -> list[int]:
    """Processes of ``uid`` that are not zombies (a zombie holds no resources; its reaper may be slow)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        state = f.read().rsplit(b")", 1)[1].split()[0]
                    if state not in (b"Z", b"X"):
                        pids.append(int(name))
            except (OSError, IndexError):
                pass
    return pids


def kill_uid(uid: int, settle_s: float = 2.0) -> int:
    """SIGKILL every live process of ``uid`` (root only) until none is left; returns how many were seen."""
    seen, deadline = 0, time.monotonic() + settle_s
    while True:
        pids = _live_pids_of_uid(uid)
        if not pids or time.monotonic() > deadline:
            return seen
        seen += len(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def kill_session(proc: subprocess.Popen) -> None:
    """End the sandbox and reap it.

    First the clean way: end of input, the harness exits, bwrap's pid 1 follows and takes the pid
    namespace down, every process being reaped by its parent. If that takes over a second (a
    wedged or killed harness), SIGKILL the whole session (the namespace goes down with its pid 1;
    its zombie is then left to the host's init).
    """
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            f.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed processes are reaped at once
        log.error("code_exec: sandbox %d not reaped after SIGKILL", proc.pid)


def rmtree(path: str) -> None:
    """Remove a host scratch dir, whatever permissions the solution left on its files."""

    def fix(func, p, _exc):  # the solution may have removed permissions on its own files
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)


def count_own_tasks() -> int:
    """Threads of the caller's uid (what ``RLIMIT_NPROC`` counts in the non-root ``process`` tier)."""
    uid, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return n
