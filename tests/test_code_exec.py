"""The code-execution verifier: LCB-style judging, and hostile solutions ending as clean failed verdicts.

Every guard below is asserted, never skipped: on a machine where the sandbox lacks a layer (e.g. no
bubblewrap, so no filesystem isolation), the tests of that layer fail. ``sandbox_report()`` (printed
by ``test_sandbox_report``) says which layers are active. Every test is bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from creditlab.rewards.code import cases, extract, runner, sandbox

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
FAILED = {"fail", "timeout", "runtime_error", "memory", "compile_error", "sandbox_error"}
HARNESS_MARK = "def sweep(pid, kill_all)"  # in the command line of every harness / bwrap / forked child


def one_stdin(expected: str, inp: str = "") -> list[dict]:
    return [{"input": inp, "output": expected, "testtype": "stdin"}]


def _ours(uid: int, creators: set[int]) -> bool:
    """A sandbox uid made by this process, by one of ``creators``, or by a process that is gone."""
    if not sandbox.UID_BASE <= uid < sandbox.UID_BASE + (1 << 28):
        return False
    creator = (uid - sandbox.UID_BASE) // 64
    return creator in creators or not os.path.exists(f"/proc/{creator}")


def live_sandbox_processes(creators: set[int] = frozenset()) -> list[tuple[int, str]]:
    """Live (non-zombie) processes of our sandboxes: as root, by sandbox uid (each process's sandboxes
    have their own uids, so sandboxes of concurrent test runs do not count); else by the harness marker
    in the command line."""
    creators = {os.getpid(), *creators}
    root = os.geteuid() == 0
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().decode("utf-8", "replace")
            uid = os.stat(f"/proc/{name}").st_uid
        except (OSError, IndexError):
            continue
        if (root and _ours(uid, creators)) or (not root and HARNESS_MARK in cmd):
            found.append((int(name), cmd[:80]))
    return found


def assert_no_stray_processes(settle_s: float = 3.0, creators: set[int] = frozenset()) -> None:
    deadline = time.monotonic() + settle_s
    while (left := live_sandbox_processes(creators)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"sandbox processes left behind: {left}"


def assert_machine_usable() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 0 and out.stdout.strip().isdigit()
    v = runner.run_tests("print(int(input()) * 2)", one_stdin("42", "21"), time_limit_s=5)
    assert v.passed, v.to_dict()


# ----------------------------------------------------------------------------------------------
# Pure parts: extraction, test parsing, LCB comparison rules
# ----------------------------------------------------------------------------------------------


def test_extract_code():
    r = "x\n```python\na = 1\n```\ntext\n```\nb = 2\n```\n```python\nc = 3\n```\nend"
    assert extract.extract_code(r) == "c = 3\n"  # last python block, not the last block
    assert extract.extract_code("```\nplain = 1\n```\n```text\nz\n```") == "z\n"  # no python block: last block
    assert extract.extract_code("```py\nshort = 1\n```") == "short = 1\n"
    assert extract.extract_code("no code here") is None
    assert extract.extract_code("```python\nunclosed = 1\n") is None
    assert extract.extract_code("```python\n   \n```") is None


def test_parse_tests_shapes():
    tests, opts = cases.parse_tests(json.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]))
    assert tests == [cases.TestCase("1", "1", "stdin")] and opts == {}
    row = {
        "public_test_cases": json.dumps([{"input": "[1]\n2", "output": "3", "testtype": "functional"}]),
        "private_test_cases": [],
        "metadata": json.dumps({"func_name": "f"}),
        "time_limit_s": 2,
    }
    tests, opts = cases.parse_tests(row)
    assert tests == [cases.TestCase("[1]\n2", "3", "functional", "f")] and opts == {"time_limit_s": 2}
    with pytest.raises(ValueError):
        cases.parse_tests("1")
    with pytest.raises(ValueError):
        cases.TestCase("1", "1", "functional")  # functional without func_name


def test_lcb_comparison_rules():
    assert cases.stdout_matches("3\n", "3")
    assert cases.stdout_matches("  1 2 \r\n 3\n\n", "1 2\n3")
    assert cases.stdout_matches("1.50 2", "1.5 2.0")  # Decimal element-wise
    assert not cases.stdout_matches("1 2", "1\n2")  # line counts differ
    assert not cases.stdout_matches("1.5000001", "1.5")
    assert not cases.stdout_matches("yes", "YES")
    assert cases.return_matches("[0, 1]", "[0, 1]")
    assert cases.return_matches("1", "1.0")
    assert not cases.return_matches('{"1": 2}', "[1, 2]")
    big = "9" * 5000  # past Python's default 4300-digit str->int limit
    assert cases.return_matches(big, big)


# ----------------------------------------------------------------------------------------------
# Ordinary verdicts
# ----------------------------------------------------------------------------------------------


def test_correct_stdin_solutions_pass():
    tests = [
        {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
        {"input": "10 -4", "output": "6", "testtype": "stdin"},
    ]
    plain = "a, b = map(int, input().split())\nprint(a + b)\n"
    main_guard = (
        "import sys\ndef main():\n    a, b = map(int, sys.stdin.read().split())\n    print(a + b)\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    for code in (plain, main_guard):
        v = runner.run_tests(code, tests, time_limit_s=5)
        assert v.passed and v.reward == 1.0 and [t.verdict for t in v.tests] == ["pass", "pass"], v.to_dict()


def test_correct_functional_solutions_pass():
    meta = {"func_name": "twoSum"}
    tests = [
        {"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional", "metadata": meta},
        {"input": "[3,2,4]\n6", "output": "[1, 2]", "testtype": "functional", "metadata": meta},
    ]
    # List comes from LCB's preamble; a returned tuple counts as a list
    leetcode = (
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return (seen[target - x], i)\n"
        "            seen[x] = i\n"
    )
    function = (
        "def twoSum(nums, target):\n    for i in range(len(nums)):\n        for j in range(i):\n"
        "            if nums[i] + nums[j] == target:\n                return [j, i]\n"
    )
    for code in (leetcode, function):
        v = runner.run_tests(code, tests, time_limit_s=5)
        assert v.passed, v.to_dict()


def test_wrong_answer_fails_and_stops_like_lcb():
    tests = one_stdin("3", "1 2") + one_stdin("5", "2 3") + one_stdin("9", "4 5")
    v = runner.run_tests("print(3)", tests, time_limit_s=5)
    assert not v.passed and v.reward == 0.0
    assert [t.verdict for t in v.tests] == ["pass", "fail", "skipped"]
    v = runner.run_tests("print(3)", tests, time_limit_s=5, stop_at_first_failure=False)
    assert [t.verdict for t in v.tests] == ["pass", "fail", "fail"]
    wrong_type = [{"input": "1", "output": "[1]", "testtype": "functional", "func_name": "f"}]
    # a set never equals JSON
    assert runner.run_tests("def f(x):\n    return {x}", wrong_type).tests[0].verdict == "fail"


def test_syntax_error_is_compile_error():
    v = runner.run_tests("def f(:\n    pass\n", one_stdin("1") * 2)
    assert [t.verdict for t in v.tests] == ["compile_error", "compile_error"]
    assert "SyntaxError" in v.tests[0].detail


def test_exception_is_runtime_error():
    v = runner.run_tests("raise ValueError('boom')", one_stdin("1"))
    assert v.status == "runtime_error" and "ValueError" in v.tests[0].detail
    missing = [{"input": "1", "output": "1", "testtype": "functional", "func_name": "absent"}]
    assert runner.run_tests("def present(x):\n    return x", missing).status == "runtime_error"


def test_infinite_loop_is_timeout_bounded():
    v = runner.run_tests("while True:\n    pass\n", one_stdin("1"), time_limit_s=1.0)
    assert v.status == "timeout"  # (the module's pytest timeout bounds the call: no wall-clock assertion here)
    sleeper = runner.run_tests("import time\ntime.sleep(30)", one_stdin("1"), time_limit_s=1.0)  # wall clock, not CPU
    assert sleeper.status == "timeout"  # killed by the wall-clock limit: a sleeper left to wake would pass or fail


# ----------------------------------------------------------------------------------------------
# Hostile solutions
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bomb",
    [
        "import os\nwhile True: os.fork()",
        # keeps forking past the process limit, half of it in a detached session (out of the process group)
        (
            "import os\nif os.fork() == 0:\n    os.setsid()\nwhile True:\n    try:\n        os.fork()\n    "
            "except OSError:\n"
            "        pass\n"
        ),
    ],
)
def test_fork_bomb_is_contained(bomb):
    v = runner.run_tests(bomb, one_stdin("1"), time_limit_s=2.0)
    assert v.status in FAILED and v.status != "sandbox_error", v.to_dict()
    assert_no_stray_processes()
    assert_machine_usable()


def test_detached_daemon_is_killed():
    # a correct answer that leaves a detached sleeping process behind: the answer counts, the process must not survive
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nprint('ok')\n"
    v = runner.run_tests(code, one_stdin("ok"), time_limit_s=5)
    assert v.passed, v.to_dict()
    assert_no_stray_processes()


@pytest.mark.parametrize("code", ["x = bytearray(10**11)", "x = []\nwhile True:\n    x.append(' ' * 10**6)\n"])
def test_huge_allocation_is_memory(code):
    v = runner.run_tests(code, one_stdin("1"), time_limit_s=10, memory_mb=256)
    assert v.status == "memory", v.to_dict()
    assert_machine_usable()


def test_cannot_write_outside_scratch_dir():
    tag = uuid.uuid4().hex
    targets = [
        Path(tempfile.gettempdir()) / f"creditlab_pwned_{tag}",
        REPO / f"creditlab_pwned_{tag}",
        Path.home() / f"creditlab_pwned_{tag}",
    ]
    code = (
        "import os\n"
        f"for p in {[str(t) for t in targets]!r} + [os.path.join('..', 'creditlab_pwned_{tag}')]:\n"
        "    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\nprint('done')\n"
    )
    try:
        v = runner.run_tests(code, one_stdin("done"), time_limit_s=5)
        assert v.status in {"pass"} | FAILED
        for t in targets:
            assert not t.exists(), f"the solution created {t}"
        if v.scratch_dir:  # host scratch dir (fallback tiers): its parent must not have been written either
            assert not (Path(v.scratch_dir).parent / f"creditlab_pwned_{tag}").exists()
    finally:
        for t in targets + [Path(tempfile.gettempdir()) / f"creditlab_pwned_{tag}"]:
            t.unlink(missing_ok=True)


def test_cannot_read_files_outside_scratch_dir():
    # a world-readable file outside the scratch dir, like every project file; and the project's README itself
    with tempfile.TemporaryDirectory() as d:
        secret = Path(d) / "secret.txt"
        secret.write_text("TOP-SECRET-" + uuid.uuid4().hex)
        secret.chmod(0o644)
        os.chmod(d, 0o755)
        code = (
            "leaked = []\n"
            f"for p in {[str(secret), str(REPO / 'README.md'), str(Path(sandbox.__file__))]!r}:\n"
            "    try:\n        open(p).read(1)\n        leaked.append(p)\n    except OSError:\n        pass\n"
            "print('safe' if not leaked else 'LEAK ' + ' '.join(leaked))\n"
        )
        v = runner.run_tests(code, one_stdin("safe"), time_limit_s=5)
        assert v.passed, f"the solution could read host files: {v.tests[0].detail}"


def test_no_network():
    # Asserted: (1) no route to the outside (1.1.1.1:80); (2) no access to a server listening on the host's
    # loopback: the sandbox has its own network namespace, whose loopback is not the host's, so the
    # connection fails and the host server never sees it. A server the solution opens itself on its own
    # loopback is allowed (it reaches nothing outside).
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    code = (
        "import socket\nres = []\n"
        f"for addr in [('1.1.1.1', 80), ('127.0.0.1', {port})]:\n"
        "    try:\n        socket.create_connection(addr, timeout=3).close()\n        res.append('OPEN')\n"
        "    except OSError:\n        res.append('blocked')\n"
        "print(' '.join(res))\n"
    )
    try:
        v = runner.run_tests(code, one_stdin("blocked blocked"), time_limit_s=10)
        assert v.passed, f"network reachable from the sandbox: {v.tests[0].detail}"
        with pytest.raises(BlockingIOError):
            srv.accept()  # nothing ever connected to the host's server
    finally:
        srv.close()


def test_environment_is_scrubbed(monkeypatch):
    token = uuid.uuid4().hex
    monkeypatch.setenv("CREDITLAB_SECRET", token)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    code = (
        "import os, sys\n"
        f"leak = [k for k, v in os.environ.items() if k in ('CREDITLAB_SECRET', 'PYTHONPATH') or {token!r} in v]\n"
        "ok = not leak and os.environ.get('HOME') == os.getcwd() and sys.flags.isolated and sys.flags.no_site\n"
        "print('clean' if ok else 'LEAK %s %s' % (leak, dict(os.environ)))\n"
    )
    v = runner.run_tests(code, one_stdin("clean"), time_limit_s=5)
    assert v.passed, v.tests[0].detail
    assert token not in json.dumps(v.to_dict())


def test_scratch_dir_is_fresh_and_removed():
    name = f"creditlab_scratch_{uuid.uuid4().hex}"
    code = (
        f"import os\nfresh = not os.listdir('.') or os.listdir('.') == ['.io']\n"
        f"open({name!r}, 'w').write('x' * 1000)\n"
        "print('fresh' if fresh else 'dirty ' + str(os.listdir('.')))\n"
    )
    v = runner.run_tests(code, one_stdin("fresh"), time_limit_s=5)
    assert v.passed, v.tests[0].detail
    assert v.scratch_dir is None or not os.path.exists(v.scratch_dir)
    tmp = Path(tempfile.gettempdir())
    assert not list(tmp.glob(name)) and not list(tmp.glob(f"*/{name}"))


# ----------------------------------------------------------------------------------------------
# Many solutions, the reward, the scorer
# ----------------------------------------------------------------------------------------------


def test_verify_many_keeps_order():
    tests = one_stdin("3", "1 2") + one_stdin("7", "3 4")
    codes = [
        "a,b=map(int,input().split())\nprint(a+b)",
        "print(3)",
        None,
        "raise SystemExit(0)",
        "while True: pass",
        "def f(:",
    ]
    out = runner.verify_many([(c, tests) for c in codes], workers=2, time_limit_s=1.0)
    assert [v.status for v in out] == ["pass", "fail", "compile_error", "fail", "timeout", "compile_error"]
    per_item = runner.verify_many([{"code": "print(3)", "tests": tests, "stop_at_first_failure": False}], workers=2)
    assert [t.verdict for t in per_item[0].tests] == ["pass", "fail"]


def test_registered_reward_and_scorer():
    from creditlab.rewards.registry import get, get_reward_spec
    from creditlab.rewards.scorer import RewardScorer

    gold = json.dumps({"tests": one_stdin("3", "1 2"), "time_limit_s": 10})
    good = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert get("code_exec")(good, gold) == 1.0
    assert get("code_exec")("no code", gold) == 0.0
    assert get_reward_spec("code_exec").extract(good) == "a, b = map(int, input().split())\nprint(a + b)\n"
    slow = "```python\nwhile True:\n    pass\n```"
    # fork: the worker inherits the registration (spawn workers need code_exec imported by creditlab.rewards)
    with RewardScorer("code_exec", timeout_s=2.0, n_workers=1, start_method="fork") as scorer:
        assert scorer.score([good, good, "```python\nprint(4)\n```"], [gold] * 3) == [1.0, 1.0, 0.0]
        assert scorer.stats["n_cache_hits"] == 1
        worker_pids = {w.process.pid for w in scorer._workers}
        assert scorer.score([slow], [gold]) == [0.0]  # the scorer's hard timeout (2 s) fires before the 10 s limit
        assert scorer.stats["n_timeouts"] == 1
    assert_no_stray_processes(creators=worker_pids)  # the killed worker's sandbox died with it


def test_sandbox_report():
    report = sandbox.sandbox_report()
    print(json.dumps(report, indent=1))
    assert report["tier"] in ("bwrap", "unshare", "process"), report["notes"]
    for layer in ("process_per_solution", "rlimits", "process_count_limit", "wall_clock_kill", "scrubbed_env"):
        assert report["layers"][layer]["active"], (layer, report)


# ----------------------------------------------------------------------------------------------
# Attacks on the judge and on the harness (issue 21, item 1): each ends as that solution's verdict
# ----------------------------------------------------------------------------------------------

# token -> whether "1 <token>" equals "1.0 <token>" under LCB's rule (Decimals element-wise; NaN never equals,
# a token Decimal cannot read makes the line a plain string)
SPECIAL_DECIMALS = {
    "sNaN": False,
    "-sNaN": False,
    "sNaN123": False,
    "NaN": False,
    "-NaN": False,
    "Infinity": True,
    "-inf": True,
    "1e999999999999999999999": False,
    "1e-999999999999999999999": False,
    "9" * 5000 + "e999999999": True,
    "1e" + "9" * 5000: False,
}


def test_special_decimal_values_never_raise():
    for tok, equal in SPECIAL_DECIMALS.items():
        for p, g in [(tok, "1"), ("1", tok), (f"{tok} 2", f"1 {tok}"), (f"{tok}", f"{tok}0")]:
            assert cases.stdout_matches(p, g) is False, (p, g)
        assert cases.stdout_matches(f"1 {tok}", f"1.0 {tok}") is equal, tok
        assert cases.stdout_matches(tok, tok) is True  # identical lines are equal whatever they hold (LCB)
    assert cases.stdout_matches("inf", "Infinity") and not cases.stdout_matches("NaN 1", "NaN 1.0")


def test_special_decimal_output_is_only_that_solutions_verdict():
    # a stdin solution printing a signalling NaN made the trusted parent raise decimal.InvalidOperation,
    # and verify_many lost the verdicts of the whole batch
    tests = one_stdin("3", "1 2")
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    codes = [good, "print('sNaN')", "print('-sNaN123 7')", "print('1e999999999999999999999')", good]
    out = runner.verify_many([(c, tests) for c in codes], workers=2, time_limit_s=5)
    assert [v.status for v in out] == ["pass", "fail", "fail", "fail", "pass"], [v.to_dict() for v in out]


def _forging_solution(route: str, forged: dict[str, list], answers: dict[str, str]) -> str:
    """A stdin solution that, on the inputs in ``forged``, writes result lines (the harness's line protocol
    before issue 21: one JSON object per line) into every pipe that another process of the sandbox holds
    open for writing, reached through /proc/<pid>/fd (``proc_fd``) or pidfd_getfd (``pidfd_getfd``); then
    prints ``answers[input]`` (default: a wrong answer). When the tests run as root the pipes belong to root
    and their permissions already refuse the ``proc_fd`` route (it worked when the caller is not root);
    ``pidfd_getfd`` needs no permission on the pipe."""
    lines = {
        k: [
            json.dumps(
                {
                    "op": "result",
                    "status": "ok",
                    "output": o,
                    "truncated": False,
                    "wall_s": 0.0,
                    "cpu_s": 0.0,
                    "detail": "",
                }
            )
            for o in outs
        ]
        for k, outs in forged.items()
    }
    return f"""
import ctypes, fcntl, os, stat, sys
ROUTE, LINES, ANSWERS = {route!r}, {lines!r}, {answers!r}
inp = sys.stdin.read().strip()

def open_writer(pid, fd):
    if ROUTE == "proc_fd":
        with open("/proc/%d/fdinfo/%d" % (pid, fd)) as f:
            flags = int(f.read().split("flags:")[1].split()[0], 8)
        return os.open("/proc/%d/fd/%d" % (pid, fd), os.O_WRONLY) if flags & 3 == 1 else None
    libc = ctypes.CDLL(None, use_errno=True)
    pfd = os.pidfd_open(pid)
    try:
        n = libc.syscall(438, pfd, fd, 0)  # pidfd_getfd (the same number on every architecture)
    finally:
        os.close(pfd)
    if n < 0:
        return None
    if fcntl.fcntl(n, fcntl.F_GETFL) & 3 != 1:
        os.close(n)
        return None
    return n

if inp in LINES:
    seen = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        for fd in range(64):
            try:
                w = open_writer(int(name), fd)
            except (OSError, IndexError, ValueError):
                continue
            if w is None:
                continue
            st = os.fstat(w)
            if stat.S_ISFIFO(st.st_mode) and st.st_ino not in seen:
                seen.add(st.st_ino)
                os.write(w, "".join(line + "\\n" for line in LINES[inp]).encode())
            os.close(w)
print(ANSWERS.get(inp, "WRONG"))
"""


FORGE_TESTS = one_stdin("3", "1 2") + one_stdin("7", "3 4") + one_stdin("11", "5 6")


@pytest.mark.parametrize("route", ["proc_fd", "pidfd_getfd"])
def test_solution_cannot_forge_passes(route):
    # a wrong solution writes a passing result for every test into the harness's answer pipe
    code = _forging_solution(route, {"1 2": ["3", "7", "11"]}, {})
    v = runner.run_tests(code, FORGE_TESTS, time_limit_s=5)
    assert [t.verdict for t in v.tests] == ["fail", "skipped", "skipped"], v.to_dict()
    assert "WRONG" in v.tests[0].detail


@pytest.mark.parametrize("route", ["proc_fd", "pidfd_getfd"])
def test_solution_cannot_shift_results(route):
    # a correct solution that injects one extra (failing) result: every real result would land on the next test
    code = _forging_solution(route, {"1 2": ["nope"]}, {"1 2": "3", "3 4": "7", "5 6": "11"})
    v = runner.run_tests(code, FORGE_TESTS, time_limit_s=5, stop_at_first_failure=False)
    assert [t.verdict for t in v.tests] == ["pass", "pass", "pass"], v.to_dict()


@pytest.mark.parametrize("route", ["proc_fd", "pidfd_getfd"])
def test_forged_non_string_output_is_not_a_parent_error(route):
    # a forged non-string output made the parent raise (str methods on a list); now it cannot even be forged
    code = _forging_solution(route, {"1 2": [["x"], {"a": 1}, 7]}, {})
    out = runner.verify_many([(code, FORGE_TESTS), ("print(3)", FORGE_TESTS[:1])], workers=2, time_limit_s=5)
    assert [v.status for v in out] == ["fail", "pass"], [v.to_dict() for v in out]


def test_harness_is_out_of_the_solutions_reach():
    # what the forging attacks need: access to a process of the sandbox that is not the solution's own.
    # Every other process (the harness; before issue 21 also bwrap's pid 1, which held the harness's pipes)
    # must refuse ptrace, process_vm_readv, pidfd_getfd and its /proc/<pid>/fd.
    code = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
got = []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    pid = int(name)
    if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE (released when this process exits)
        got.append("ptrace %d" % pid)
    local, remote = IOVec(ctypes.addressof(buf), 8), IOVec(id(os), 8)  # os exists at that address in a forked parent
    if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
        got.append("process_vm_readv %d" % pid)
    try:
        pfd = os.pidfd_open(pid)
        for fd in range(16):
            n = libc.syscall(438, pfd, fd, 0)
            if n >= 0:
                got.append("pidfd_getfd %d" % pid)
                break
    except OSError:
        pass
    try:
        os.listdir("/proc/%d/fd" % pid)
        got.append("proc_fd %d" % pid)
    except OSError:
        pass
if os.uname().machine in ("x86_64", "aarch64"):  # second layer: these calls are denied to the solution (seccomp)
    try:
        os.close(os.pidfd_open(os.getpid()))
        got.append("no-seccomp")
    except OSError:
        pass
print("isolated" if not got else " ".join(got))
"""
    v = runner.run_tests(code, one_stdin("isolated"), time_limit_s=10)
    assert v.passed, v.to_dict()


def test_solution_cannot_stop_or_kill_its_harness():
    # the harness is pid 1 of the sandbox's pid namespace: the kernel drops the solution's signals to it (before
    # issue 21 it was pid 2 and a kill made the run a sandbox_error; a SIGSTOP hung it until the parent's timeout)
    code = (
        "import os, signal\n"
        "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):\n"
        "    for target in (1, -1):\n"
        "        try:\n            os.kill(target, sig)\n        except OSError:\n            pass\n"
        "print(int(input()) * 2)\n"
    )
    v = runner.run_tests(code, one_stdin("42", "21") + one_stdin("8", "4"), time_limit_s=5)
    assert v.passed, v.to_dict()


def test_solution_cannot_learn_the_nonce(monkeypatch):
    # the per-run nonce that authenticates the harness's answers must not be in the solution's memory (a fork of
    # the harness): the harness keeps it in a page that forks see zeroed. The solution scans all its readable
    # memory for it; the nonce is given as a list of ints, so its text never exists there unless it leaked.
    nonce = os.urandom(16)
    real_urandom = os.urandom
    monkeypatch.setattr(runner.os, "urandom", lambda n: nonce if n == len(nonce) else real_urandom(n))
    needle = list(nonce.hex().encode())
    code = f"""
N = {needle!r}
head = bytes(N[:4])
found = 0
with open("/proc/self/maps") as f:
    regions = [line.split() for line in f]
with open("/proc/self/mem", "rb", buffering=0) as mem:
    for r in regions:
        lo, hi = (int(x, 16) for x in r[0].split("-"))
        if r[1][0] != "r" or (len(r) > 5 and r[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
            continue
        try:
            mem.seek(lo)
            chunk = mem.read(hi - lo)
        except (OSError, ValueError, OverflowError):
            continue
        pos = chunk.find(head)
        while pos >= 0:
            if list(chunk[pos:pos + len(N)]) == N:
                found += 1
            pos = chunk.find(head, pos + 1)
print("found %d" % found)
"""
    v = runner.run_tests(code, one_stdin("found 0"), time_limit_s=20, memory_mb=1024)
    assert v.passed, v.to_dict()


def test_malformed_harness_answers_are_sandbox_errors(monkeypatch):
    # the parent validates every answer: nonce, one answer per request, field types. A harness (here a fake
    # one, standing for a subverted harness) that breaks the protocol yields sandbox_error for that solution
    # only, never an exception in the parent.
    fake = r"""
import json, os, sys
nonce = b""
while len(nonce) < 32:
    nonce += os.read(0, 32 - len(nonce))
pin = os.fdopen(0, "rb")
cfg = json.loads(pin.readline())
mode = cfg["code"].strip()

def send(obj, prefix=None):
    os.write(1, (nonce if prefix is None else prefix) + b" " + json.dumps(obj).encode() + b"\n")

ok = {"status": "ok", "wall_s": 0.0, "cpu_s": 0.0, "detail": ""}
send({"op": "compiled", "i": -1, **ok})
for line in pin:
    i = json.loads(line)["i"]
    res = {"op": "result", "i": i, **ok, "output": "3", "truncated": False}
    if mode == "no_nonce":
        os.write(1, json.dumps(res).encode() + b"\n")
    elif mode == "wrong_nonce":
        send(res, b"0" * 32)
    elif mode == "list_output":
        send({**res, "output": ["3"]})
    elif mode == "bool_index":
        send({**res, "i": True if i == 1 else i})
    elif mode == "wrong_index":
        send({**res, "i": i + 1})
    elif mode == "two_answers":
        send(res)
        send(res)
    elif mode == "not_an_object":
        send([res])
    elif mode == "bad_status":
        send({**res, "status": ["ok"]})
    elif mode == "nan_time":
        os.write(1, nonce + b" " + json.dumps({**res, "wall_s": float("nan")}).encode() + b"\n")
    elif mode == "string_truncated":
        send({**res, "truncated": "no"})
    else:
        send(res)
"""
    monkeypatch.setattr(sandbox, "HARNESS", fake)
    tests = one_stdin("3", "1 2") + one_stdin("3", "3 4")
    modes = [
        "honest",
        "no_nonce",
        "wrong_nonce",
        "list_output",
        "bool_index",
        "wrong_index",
        "two_answers",
        "not_an_object",
        "bad_status",
        "nan_time",
        "string_truncated",
    ]
    out = runner.verify_many([(m, tests) for m in modes], workers=2, time_limit_s=5, stop_at_first_failure=False)
    assert out[0].passed, out[0].to_dict()
    for mode, v in zip(modes[1:], out[1:]):
        assert "sandbox_error" in [t.verdict for t in v.tests] and not v.passed, (mode, v.to_dict())


HUGE_RETURN = r"""
import os
def f(x):
    # the largest number the output cap allows, written where the harness reads the return value (every file
    # of the harness's i/o dir), then exit cleanly before the harness writes the real one
    digits = "9" * 2_000_000
    for root in ("/tmp", os.getcwd()):
        for d, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(d, name), "w") as fh:
                        fh.write(digits)
                except OSError:
                    pass
    os._exit(0)
"""


@pytest.mark.timeout(120)
def test_huge_printed_number_is_judged_within_the_solutions_budget():
    # int(Decimal(...)) of 2 million digits took the parent 182 s; the verdict must come in seconds. Run in a
    # subprocess with a bounded timeout (no wall-clock assertion: the timeout only stops a hung judge).
    prog = (
        "import json, sys\nfrom creditlab.rewards.code import runner\n"
        "tests = [{'input': '1', 'output': '1', 'testtype': 'functional', 'func_name': 'f'}]\n"
        "stdin_tests = [{'input': '', 'output': '1 2', 'testtype': 'stdin'}]\n"
        "big = runner.run_tests(sys.argv[1], tests, time_limit_s=10)\n"
        "printed = runner.run_tests(\"print('9' * 2_000_000, '8' * 2_000_000)\", stdin_tests, time_limit_s=10)\n"
        "print(json.dumps([big.status, printed.status]))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", prog, HUGE_RETURN], capture_output=True, text=True, timeout=90, check=False, cwd=REPO
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == ["fail", "fail"], p.stdout[-2000:]
    assert cases.return_matches("9" * 2_000_000, "9" * 2_000_000)  # huge integers still compare (as digit strings)
    assert not cases.return_matches("9" * 2_000_000, "9" * 1_999_999 + "8")
    assert cases.return_matches("[" + "1" * 5000 + ", 2]", "[" + "1" * 5000 + ", 2.0]")
    assert not cases.return_matches("1" + "0" * 5000, "1e5000")  # an int that large never equals a float (inf)
    # millions of tiny containers: not parsed (the trusted parent would spend seconds and ~0.5 GB on them)
    assert not cases.return_matches("[" + "[], " * 4_000_000 + "[]]", "[[]]")
    # what json.dumps makes of a value equal to the gold still matches, however much longer its text is
    assert cases.return_matches(json.dumps([False] * 1000), json.dumps([0] * 1000, separators=(",", ":")))
    assert cases.return_matches(json.dumps("\U0001f600" * 1000), json.dumps("\U0001f600" * 1000, ensure_ascii=False))


def test_dev_shm_and_dev_are_capped():
    # /dev/shm was an uncapped tmpfs (3 GB in 3 s, host shared memory grew); /dev itself was writable too
    code = r"""
import errno, os
report = []
try:
    open("/dev/creditlab_probe", "w").write("x")
    report.append("dev-writable")
except OSError:
    pass
total, capped, names = 0, False, []
chunk = b"x" * (1 << 20)
try:
    for i in range(12):  # 12 files of up to 16 MB (the file-size limit), 192 MB in all
        names.append("/dev/shm/creditlab_probe_%d_%d" % (os.getpid(), i))
        with open(names[-1], "wb") as f:
            for _ in range(16):
                f.write(chunk)
                f.flush()
                total += len(chunk)
except OSError as e:
    capped = e.errno in (errno.ENOSPC, errno.EFBIG) and total <= (128 << 20)
finally:  # the fallback tiers write to the host's /dev/shm
    for name in names:
        try:
            os.unlink(name)
        except OSError:
            pass
if not capped:
    report.append("shm-uncapped %d MB" % (total >> 20))
print(" ".join(report) or "capped")
"""
    v = runner.run_tests(code, one_stdin("capped"), time_limit_s=20, max_output_mb=16)
    assert v.passed, v.to_dict()
