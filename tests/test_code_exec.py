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

from creditlab.rewards import code_exec as ce

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
FAILED = {"fail", "timeout", "runtime_error", "memory", "compile_error", "sandbox_error"}
HARNESS_MARK = "def sweep(pid, kill_all)"  # in the command line of every harness / bwrap / forked child


def one_stdin(expected: str, inp: str = "") -> list[dict]:
    return [{"input": inp, "output": expected, "testtype": "stdin"}]


def _ours(uid: int, creators: set[int]) -> bool:
    """A sandbox uid made by this process, by one of ``creators``, or by a process that is gone."""
    if not ce.UID_BASE <= uid < ce.UID_BASE + (1 << 28):
        return False
    creator = (uid - ce.UID_BASE) // 64
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
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                         timeout=30, check=False)
    assert out.returncode == 0 and out.stdout.strip().isdigit()
    v = ce.run_tests("print(int(input()) * 2)", one_stdin("42", "21"), time_limit_s=5)
    assert v.passed, v.to_dict()


# ----------------------------------------------------------------------------------------------
# Pure parts: extraction, test parsing, LCB comparison rules
# ----------------------------------------------------------------------------------------------


def test_extract_code():
    r = "x\n```python\na = 1\n```\ntext\n```\nb = 2\n```\n```python\nc = 3\n```\nend"
    assert ce.extract_code(r) == "c = 3\n"  # last python block, not the last block
    assert ce.extract_code("```\nplain = 1\n```\n```text\nz\n```") == "z\n"  # no python block: last block
    assert ce.extract_code("```py\nshort = 1\n```") == "short = 1\n"
    assert ce.extract_code("no code here") is None
    assert ce.extract_code("```python\nunclosed = 1\n") is None
    assert ce.extract_code("```python\n   \n```") is None


def test_parse_tests_shapes():
    tests, opts = ce.parse_tests(json.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]))
    assert tests == [ce.TestCase("1", "1", "stdin")] and opts == {}
    row = {"public_test_cases": json.dumps([{"input": "[1]\n2", "output": "3", "testtype": "functional"}]),
           "private_test_cases": [], "metadata": json.dumps({"func_name": "f"}), "time_limit_s": 2}
    tests, opts = ce.parse_tests(row)
    assert tests == [ce.TestCase("[1]\n2", "3", "functional", "f")] and opts == {"time_limit_s": 2}
    with pytest.raises(ValueError):
        ce.parse_tests("1")
    with pytest.raises(ValueError):
        ce.TestCase("1", "1", "functional")  # functional without func_name


def test_lcb_comparison_rules():
    assert ce.stdout_matches("3\n", "3")
    assert ce.stdout_matches("  1 2 \r\n 3\n\n", "1 2\n3")
    assert ce.stdout_matches("1.50 2", "1.5 2.0")  # Decimal element-wise
    assert not ce.stdout_matches("1 2", "1\n2")  # line counts differ
    assert not ce.stdout_matches("1.5000001", "1.5")
    assert not ce.stdout_matches("yes", "YES")
    assert ce.return_matches("[0, 1]", "[0, 1]")
    assert ce.return_matches("1", "1.0")
    assert not ce.return_matches('{"1": 2}', "[1, 2]")
    big = "9" * 5000  # past Python's default 4300-digit str->int limit
    assert ce.return_matches(big, big)


# ----------------------------------------------------------------------------------------------
# Ordinary verdicts
# ----------------------------------------------------------------------------------------------


def test_correct_stdin_solutions_pass():
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
             {"input": "10 -4", "output": "6", "testtype": "stdin"}]
    plain = "a, b = map(int, input().split())\nprint(a + b)\n"
    main_guard = ("import sys\ndef main():\n    a, b = map(int, sys.stdin.read().split())\n    print(a + b)\n"
                  "if __name__ == '__main__':\n    main()\n")
    for code in (plain, main_guard):
        v = ce.run_tests(code, tests, time_limit_s=5)
        assert v.passed and v.reward == 1.0 and [t.verdict for t in v.tests] == ["pass", "pass"], v.to_dict()


def test_correct_functional_solutions_pass():
    meta = {"func_name": "twoSum"}
    tests = [{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional", "metadata": meta},
             {"input": "[3,2,4]\n6", "output": "[1, 2]", "testtype": "functional", "metadata": meta}]
    # List comes from LCB's preamble; a returned tuple counts as a list
    leetcode = ("class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
                "        seen = {}\n        for i, x in enumerate(nums):\n"
                "            if target - x in seen:\n                return (seen[target - x], i)\n"
                "            seen[x] = i\n")
    function = ("def twoSum(nums, target):\n    for i in range(len(nums)):\n        for j in range(i):\n"
                "            if nums[i] + nums[j] == target:\n                return [j, i]\n")
    for code in (leetcode, function):
        v = ce.run_tests(code, tests, time_limit_s=5)
        assert v.passed, v.to_dict()


def test_wrong_answer_fails_and_stops_like_lcb():
    tests = one_stdin("3", "1 2") + one_stdin("5", "2 3") + one_stdin("9", "4 5")
    v = ce.run_tests("print(3)", tests, time_limit_s=5)
    assert not v.passed and v.reward == 0.0
    assert [t.verdict for t in v.tests] == ["pass", "fail", "skipped"]
    v = ce.run_tests("print(3)", tests, time_limit_s=5, stop_at_first_failure=False)
    assert [t.verdict for t in v.tests] == ["pass", "fail", "fail"]
    wrong_type = [{"input": "1", "output": "[1]", "testtype": "functional", "func_name": "f"}]
    assert ce.run_tests("def f(x):\n    return {x}", wrong_type).tests[0].verdict == "fail"  # a set never equals JSON


def test_syntax_error_is_compile_error():
    v = ce.run_tests("def f(:\n    pass\n", one_stdin("1") * 2)
    assert [t.verdict for t in v.tests] == ["compile_error", "compile_error"]
    assert "SyntaxError" in v.tests[0].detail


def test_exception_is_runtime_error():
    v = ce.run_tests("raise ValueError('boom')", one_stdin("1"))
    assert v.status == "runtime_error" and "ValueError" in v.tests[0].detail
    missing = [{"input": "1", "output": "1", "testtype": "functional", "func_name": "absent"}]
    assert ce.run_tests("def present(x):\n    return x", missing).status == "runtime_error"


def test_infinite_loop_is_timeout_bounded():
    t0 = time.monotonic()
    v = ce.run_tests("while True:\n    pass\n", one_stdin("1"), time_limit_s=1.0)
    assert v.status == "timeout"
    assert time.monotonic() - t0 < 1.0 + 5.0
    sleeper = ce.run_tests("import time\ntime.sleep(30)", one_stdin("1"), time_limit_s=1.0)  # wall clock, not CPU
    assert sleeper.status == "timeout" and sleeper.wall_s < 6.0


# ----------------------------------------------------------------------------------------------
# Hostile solutions
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bomb", [
    "import os\nwhile True: os.fork()",
    # keeps forking past the process limit, half of it in a detached session (out of the process group)
    ("import os\nif os.fork() == 0:\n    os.setsid()\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
     "        pass\n"),
])
def test_fork_bomb_is_contained(bomb):
    t0 = time.monotonic()
    v = ce.run_tests(bomb, one_stdin("1"), time_limit_s=2.0)
    assert v.status in FAILED and v.status != "sandbox_error", v.to_dict()
    assert time.monotonic() - t0 < 2.0 + 10.0
    assert_no_stray_processes()
    assert_machine_usable()


def test_detached_daemon_is_killed():
    # a correct answer that leaves a detached sleeping process behind: the answer counts, the process must not survive
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nprint('ok')\n"
    v = ce.run_tests(code, one_stdin("ok"), time_limit_s=5)
    assert v.passed, v.to_dict()
    assert_no_stray_processes()


@pytest.mark.parametrize("code", ["x = bytearray(10**11)",
                                  "x = []\nwhile True:\n    x.append(' ' * 10**6)\n"])
def test_huge_allocation_is_memory(code):
    v = ce.run_tests(code, one_stdin("1"), time_limit_s=10, memory_mb=256)
    assert v.status == "memory", v.to_dict()
    assert_machine_usable()


def test_cannot_write_outside_scratch_dir():
    tag = uuid.uuid4().hex
    targets = [Path(tempfile.gettempdir()) / f"creditlab_pwned_{tag}", REPO / f"creditlab_pwned_{tag}",
               Path.home() / f"creditlab_pwned_{tag}"]
    code = ("import os\n"
            f"for p in {[str(t) for t in targets]!r} + [os.path.join('..', 'creditlab_pwned_{tag}')]:\n"
            "    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\nprint('done')\n")
    try:
        v = ce.run_tests(code, one_stdin("done"), time_limit_s=5)
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
        code = ("leaked = []\n"
                f"for p in {[str(secret), str(REPO / 'README.md'), str(Path(ce.__file__))]!r}:\n"
                "    try:\n        open(p).read(1)\n        leaked.append(p)\n    except OSError:\n        pass\n"
                "print('safe' if not leaked else 'LEAK ' + ' '.join(leaked))\n")
        v = ce.run_tests(code, one_stdin("safe"), time_limit_s=5)
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
    code = ("import socket\nres = []\n"
            f"for addr in [('1.1.1.1', 80), ('127.0.0.1', {port})]:\n"
            "    try:\n        socket.create_connection(addr, timeout=3).close()\n        res.append('OPEN')\n"
            "    except OSError:\n        res.append('blocked')\n"
            "print(' '.join(res))\n")
    try:
        v = ce.run_tests(code, one_stdin("blocked blocked"), time_limit_s=10)
        assert v.passed, f"network reachable from the sandbox: {v.tests[0].detail}"
        with pytest.raises(BlockingIOError):
            srv.accept()  # nothing ever connected to the host's server
    finally:
        srv.close()


def test_environment_is_scrubbed(monkeypatch):
    token = uuid.uuid4().hex
    monkeypatch.setenv("CREDITLAB_SECRET", token)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    code = ("import os, sys\n"
            f"leak = [k for k, v in os.environ.items() if k in ('CREDITLAB_SECRET', 'PYTHONPATH') or {token!r} in v]\n"
            "ok = not leak and os.environ.get('HOME') == os.getcwd() and sys.flags.isolated and sys.flags.no_site\n"
            "print('clean' if ok else 'LEAK %s %s' % (leak, dict(os.environ)))\n")
    v = ce.run_tests(code, one_stdin("clean"), time_limit_s=5)
    assert v.passed, v.tests[0].detail
    assert token not in json.dumps(v.to_dict())


def test_scratch_dir_is_fresh_and_removed():
    name = f"creditlab_scratch_{uuid.uuid4().hex}"
    code = (f"import os\nfresh = not os.listdir('.') or os.listdir('.') == ['.io']\n"
            f"open({name!r}, 'w').write('x' * 1000)\n"
            "print('fresh' if fresh else 'dirty ' + str(os.listdir('.')))\n")
    v = ce.run_tests(code, one_stdin("fresh"), time_limit_s=5)
    assert v.passed, v.tests[0].detail
    assert v.scratch_dir is None or not os.path.exists(v.scratch_dir)
    tmp = Path(tempfile.gettempdir())
    assert not list(tmp.glob(name)) and not list(tmp.glob(f"*/{name}"))


# ----------------------------------------------------------------------------------------------
# Many solutions, the reward, the scorer
# ----------------------------------------------------------------------------------------------


def test_verify_many_keeps_order():
    tests = one_stdin("3", "1 2") + one_stdin("7", "3 4")
    codes = ["a,b=map(int,input().split())\nprint(a+b)", "print(3)", None, "raise SystemExit(0)",
             "while True: pass", "def f(:"]
    t0 = time.monotonic()
    out = ce.verify_many([(c, tests) for c in codes], workers=2, time_limit_s=1.0)
    assert [v.status for v in out] == ["pass", "fail", "compile_error", "fail", "timeout", "compile_error"]
    assert time.monotonic() - t0 < 20
    per_item = ce.verify_many([{"code": "print(3)", "tests": tests, "stop_at_first_failure": False}], workers=2)
    assert [t.verdict for t in per_item[0].tests] == ["pass", "fail"]


def test_registered_reward_and_scorer():
    from creditlab.algos.registry import get
    from creditlab.rewards.math_verify_reward import get_reward_spec
    from creditlab.rewards.scorer import RewardScorer

    gold = json.dumps({"tests": one_stdin("3", "1 2"), "time_limit_s": 10})
    good = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert get("reward", "code_exec")(good, gold) == 1.0
    assert get("reward", "code_exec")("no code", gold) == 0.0
    assert get_reward_spec("code_exec").extract(good) == "a, b = map(int, input().split())\nprint(a + b)\n"
    slow = "```python\nwhile True:\n    pass\n```"
    # fork: the worker inherits the registration (spawn workers need code_exec imported by creditlab.rewards)
    with RewardScorer("code_exec", timeout_s=2.0, n_workers=1, start_method="fork") as scorer:
        assert scorer.score([good, good, "```python\nprint(4)\n```"], [gold] * 3) == [1.0, 1.0, 0.0]
        assert scorer.stats["n_cache_hits"] == 1
        t0 = time.monotonic()
        worker_pids = {w.process.pid for w in scorer._workers}
        assert scorer.score([slow], [gold]) == [0.0]  # the scorer's hard timeout (2 s) fires before the 10 s limit
        assert scorer.stats["n_timeouts"] == 1 and time.monotonic() - t0 < 8
    assert_no_stray_processes(creators=worker_pids)  # the killed worker's sandbox died with it


def test_sandbox_report():
    report = ce.sandbox_report()
    print(json.dumps(report, indent=1))
    assert report["tier"] in ("bwrap", "unshare", "process"), report["notes"]
    for layer in ("process_per_solution", "rlimits", "process_count_limit", "wall_clock_kill", "scrubbed_env"):
        assert report["layers"][layer]["active"], (layer, report)
