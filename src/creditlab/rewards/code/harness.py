"""The code harness, run inside the sandbox: one forked, confined child per test (stdlib only, Python >= 3.8)."""
import builtins, io, json, mmap, os, resource, select, signal, stat, struct, sys, time, traceback
EXIT_OK, EXIT_EXC, EXIT_MEM, EXIT_UNREPR, EXIT_COMPILE, EXIT_GUARD = 0, 101, 102, 103, 104, 105
NONCE_LEN = 32
LIBC, CTYPES, SECCOMP, HARNESS_PID = None, None, None, os.getpid()
# Calls that reach into another process, denied to the solution (EPERM): ptrace, process_vm_readv,
# process_vm_writev, kcmp, perf_event_open, pidfd_open, pidfd_getfd, process_madvise.
DENIED = {"x86_64": (0xC000003E, (101, 310, 311, 312, 298, 434, 438, 440)),
          "aarch64": (0xC00000B7, (117, 270, 271, 272, 241, 434, 438, 440))}

def prctl(option, arg=0, ptr=None):
    ul = CTYPES.c_ulong
    return LIBC.prctl(option, ul(arg), ptr if ptr is not None else ul(0), ul(0), ul(0))

def seccomp_filter():
    # classic BPF: other architectures' calls (x86: i386 int 0x80, the x32 ABI) and DENIED -> EPERM; rest allowed
    machine = os.uname().machine
    if machine not in DENIED:
        return None
    arch, nrs = DENIED[machine]
    deny, allow = 0x00050001, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    checks = ([(0x35, 0x40000000)] if machine == "x86_64" else []) + [(0x15, nr) for nr in nrs]  # JGE, JEQ
    ins = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, deny), (0x20, 0, 0, 0)]  # ld arch; ...; ld nr
    ins += [(code, len(checks) - i, 0, k) for i, (code, k) in enumerate(checks)]
    ins += [(0x06, 0, 0, allow), (0x06, 0, 0, deny)]
    buf = CTYPES.create_string_buffer(b"".join(struct.pack("HBBI", *x) for x in ins))

    class Prog(CTYPES.Structure):
        _fields_ = [("len", CTYPES.c_ushort), ("filter", CTYPES.c_void_p)]
    return Prog(len(ins), CTYPES.addressof(buf)), buf

class Unrepresentable(Exception):
    pass

def plain(x, top):
    if x is None:
        return None
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, list) or (top and isinstance(x, tuple)):
        return [plain(v, False) for v in x]
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {str(k): plain(v, False) for k, v in x.items()}
    raise Unrepresentable(type(x).__name__)

def child(cfg, test, paths):
    code = EXIT_EXC
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Confined before any of its code runs: dumpable again (its /proc entries keep the sandbox's uid, so
        # kill sweeps find it; the harness stays non-dumpable) and, where known, the process-access calls denied.
        if prctl(4, 1) != 0 or (SECCOMP is not None and (
                prctl(38, 1) != 0 or prctl(22, 2, CTYPES.byref(SECCOMP[0])) != 0)):  # NO_NEW_PRIVS; SECCOMP filter
            code = EXIT_GUARD
            return
        prctl(1, signal.SIGKILL)  # die with the harness (e.g. when its caller is killed)
        if os.getppid() != HARNESS_PID:
            return
        fds = [os.open(paths["in"], os.O_RDONLY),
               os.open(paths["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
               os.open(paths["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)]
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        os.closerange(3, 1 << 16)
        lim = cfg["limits"]
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim["as_bytes"], lim["as_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize_bytes"], lim["fsize_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
        raw = [io.FileIO(fd, mode, closefd=False) for fd, mode in ((0, "r"), (1, "w"), (2, "w"))]
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(raw[0]), encoding="utf-8", errors="replace")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(raw[1], 1 << 16), encoding="utf-8",
                                                       errors="replace")
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(raw[2], encoding="utf-8", errors="backslashreplace",
                                                       write_through=True)
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(50000)
        try:
            compiled = compile(cfg["code"], "<solution>", "exec")
        except BaseException:
            traceback.print_exc(limit=0)
            code = EXIT_COMPILE
            return
        if test is None:
            code = EXIT_OK
            return
        functional = test["testtype"] == "functional"
        ns = {"__name__": "solution" if functional else "__main__", "__builtins__": builtins}
        if cfg["preamble"]:
            exec(cfg["preamble"], ns)
        if not functional:
            try:
                exec(compiled, ns)
            except SystemExit:
                pass
            sys.stdout.flush()
        else:
            exec(compiled, ns)
            name = test["func_name"]
            if "class Solution" in cfg["code"] and "Solution" in ns:
                fn = getattr(ns["Solution"](), name, None)
            else:
                fn = ns.get(name)
            if fn is None:
                raise AttributeError("solution defines no function " + repr(name))
            args = [json.loads(line) for line in test["input"].split("\n")]
            out = fn(*args)
            payload = json.dumps(plain(out, True))
            sys.stdout.flush()
            with open(paths["ret"], "w", encoding="utf-8") as f:
                f.write(payload)
        code = EXIT_OK
    except MemoryError:
        code = EXIT_MEM
        try:
            os.write(2, b"MemoryError\n")
        except BaseException:
            pass
    except Unrepresentable as e:
        code = EXIT_UNREPR
        try:
            os.write(2, ("return value is not JSON-equal to anything: " + str(e) + "\n").encode())
        except BaseException:
            pass
    except BaseException:
        code = EXIT_EXC
        try:
            traceback.print_exc(limit=-3)
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
        except BaseException:
            if code == EXIT_OK:
                code = EXIT_EXC
        os._exit(code)

def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

def others_alive():
    # live (non-zombie) processes of this uid other than this one and pid 1
    me, uid = os.getpid(), os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, 1):
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/%s/stat" % name, "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return True
        except (OSError, IndexError):
            pass
    return False

def sweep(pid, kill_all):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    reap()
    if kill_all:  # every other process of this uid (in the pid namespace / of the unique uid)
        for _ in range(200):
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                break
            reap()
            if not others_alive():
                break
            time.sleep(0.005)
        reap()

def wait(pid, deadline):
    try:
        pfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pfd = None
    try:
        while True:
            got, status, ru = os.wait4(pid, os.WNOHANG)
            if got == pid:
                return status, ru, False
            left = deadline - time.monotonic()
            if left <= 0:
                for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                    try:
                        kill()
                    except OSError:
                        pass
                _, status, ru = os.wait4(pid, 0)
                return status, ru, True
            if pfd is not None:
                select.select([pfd], [], [], left)
            else:
                time.sleep(min(0.005, left))
    finally:
        if pfd is not None:
            os.close(pfd)

def read_capped(path, cap):
    # a regular file only (the solution may have put a link, a FIFO or a device there)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, False
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None, False
            data = f.read(cap + 1)
    except OSError:
        return None, False
    return data[:cap].decode("utf-8", "replace"), len(data) > cap

def run(cfg, test, paths):
    for key in ("in", "out", "err", "ret"):
        try:
            os.unlink(paths[key])
        except OSError:
            pass
    with os.fdopen(os.open(paths["in"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
        f.write(test["input"] if test is not None and test["testtype"] == "stdin" else "")
    limit = cfg["time_limit_s"]
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(cfg, test, paths)
        os._exit(EXIT_EXC)
    status, ru, timed_out = wait(pid, t0 + limit)
    wall = time.monotonic() - t0
    sweep(pid, cfg["kill_all"])
    cpu = ru.ru_utime + ru.ru_stime
    res = {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}
    detail, _ = read_capped(paths["err"], 4000)
    res["detail"] = (detail or "")[-1500:]
    if timed_out:
        res["status"] = "timeout"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        hit_cpu = sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= cfg["limits"]["cpu_s"] - 0.05)
        res["status"] = "timeout" if hit_cpu else "signal"
        res["detail"] = ("killed by signal %d\n" % sig) + res["detail"]
    else:
        code = os.WEXITSTATUS(status)
        res["status"] = {EXIT_OK: "ok", EXIT_EXC: "exception", EXIT_MEM: "memory", EXIT_UNREPR: "unrepresentable",
                         EXIT_COMPILE: "compile_error", EXIT_GUARD: "guard"}.get(code, "exit")
        if res["status"] == "exit":
            res["detail"] = ("exit code %d\n" % code) + res["detail"]
        if res["status"] == "exception" and res["detail"].rstrip().endswith("MemoryError"):
            res["status"] = "memory"
    if res["status"] == "ok" and test is not None:
        path = paths["ret"] if test["testtype"] == "functional" else paths["out"]
        res["output"], res["truncated"] = read_capped(path, cfg["limits"]["fsize_bytes"])
    return res

def read_nonce():
    # The parent's per-run nonce, read straight from the pipe into a page that forked children see zeroed
    # (MADV_WIPEONFORK; else not at all): the solution, a fork of this process, cannot learn it.
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        page.madvise(getattr(mmap, "MADV_WIPEONFORK", 18))
    except OSError:
        page.madvise(mmap.MADV_DONTFORK)
    view = memoryview(page)[:NONCE_LEN]
    got = 0
    while got < NONCE_LEN:
        n = os.readv(0, [view[got:]])
        if n <= 0:
            os._exit(3)
        got += n
    return view

def main():
    uid = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "-" else None
    if uid is not None:  # as root: drop to the sandbox's unique uid before reading anything
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    global LIBC, CTYPES, SECCOMP
    try:
        import ctypes
        CTYPES, LIBC = ctypes, ctypes.CDLL(None, use_errno=True)
        # Out of the solution's reach (same uid): a non-dumpable process refuses ptrace, pidfd_getfd,
        # process_vm_readv/writev and its /proc/<pid>/fd, /mem to anyone without CAP_SYS_PTRACE.
        if prctl(4, 0) != 0:  # PR_SET_DUMPABLE (after the uid drop, which resets it)
            raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (reset by setuid: set after)
        prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the solution are reaped here, not by init
        SECCOMP = seccomp_filter()
        nonce = read_nonce()
    except Exception as e:
        os.write(2, ("harness: cannot put itself out of the solution's reach: %r\n" % (e,)).encode())
        os._exit(3)
    # As pid 1 of its pid namespace (bwrap --as-pid-1, unshare --fork) the kernel drops every signal the
    # solution sends it that has no handler: SIGINT gets none (the solution's processes get Python's back).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    pin = os.fdopen(os.dup(0), "rb")
    pout = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    cfg = json.loads(pin.readline())
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = cfg["max_procs"] if hard == resource.RLIM_INFINITY else min(cfg["max_procs"], hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    iodir = cfg["iodir"]
    os.makedirs(iodir, mode=0o700, exist_ok=True)
    paths = {k: os.path.join(iodir, k) for k in ("in", "out", "err", "ret")}
    if cfg["preamble"]:
        for m in cfg["preload"]:
            try:
                __import__(m)
            except Exception:
                pass

    def write_all(data):
        data = memoryview(data)
        while data:
            data = data[os.write(pout, data):]

    def send(obj):  # one line per request: the nonce (from its page, never copied), a space, JSON
        write_all(nonce)
        write_all(b" " + json.dumps(obj).encode("utf-8") + b"\n")

    send({"op": "compiled", "i": -1, **run(cfg, None, paths)})
    for line in pin:
        test = json.loads(line)
        send({"op": "result", "i": test["i"], **run(cfg, test, paths)})

if __name__ == "__main__":
    main()

# How this file is used: creditlab.rewards.code.sandbox reads its text and starts it as
# ``python -I -S -c <text> <uid or ->``, as pid 1 of the sandbox (nothing of the project is mounted there, so it
# is never imported inside). Hence: the standard library only, Python >= 3.8 (the system python3 may run it),
# no import from creditlab. Line 1 stays a one-line docstring and these notes stay at the end, so that the line
# numbers quoted in verdict details (tracebacks of "<string>") are those of the harness's code.
# The protocol (its parent side: creditlab.rewards.code.protocol): the parent writes the run's nonce (32 hex
# characters), then one JSON line of configuration, then one JSON line per test input; the harness answers each
# with one line, the nonce, a space and JSON (op "compiled" first, then op "result" per test). The solution runs
# as the harness's uid, so the harness keeps itself out of its reach: non-dumpable, pid 1 of its pid namespace
# (bwrap --as-pid-1, unshare --fork), a seccomp filter on the solution's processes, the nonce in a page forked
# children see zeroed (MADV_WIPEONFORK).
