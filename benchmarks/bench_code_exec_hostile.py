"""Code-execution verifier under attack: `verify_many` throughput on a batch with a share of hostile solutions.

N solutions (default 100) of `bench_code_exec.py`'s two problems: (1 - share) of them the ordinary mix
(60% correct, 20% wrong, 8% runtime error, 7% compile error, 5% infinite loop), `--hostile-share` (default
20%) hostile ones, round-robin over the kinds below, shuffled. Reported: solutions per second of
`verify_many` (best and every run), per-kind verdicts, whether the ordinary solutions got their intended
verdicts, and `hostile_passes` (hostile solutions that were paid: must be 0). A run in which `verify_many`
raises is reported with the exception (the whole batch's verdicts lost).

`--kinds survivable` leaves out the two attacks that the verifier before issue 21 could not survive
(`special_decimal`: the batch raised `decimal.InvalidOperation`; `huge_number`: minutes of the parent's
time per solution), so that it can be compared with the fixed one on the same batch:

    python benchmarks/bench_code_exec_hostile.py [--kinds all|survivable] [--n 100] [--workers 2] [--repeats 2]
    # the code before a change, same script: PYTHONPATH=<a checkout of the old src> python benchmarks/...

Writes benchmarks/results/code_exec_hostile.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

from _common import write_result  # noqa: E402  (benchmarks/ is the script's directory)
from bench_code_exec import FUNC_TESTS, STDIN_TESTS, make_items  # noqa: E402

from creditlab.rewards.code.runner import run_tests, verify_many
from creditlab.rewards.code.sandbox import sandbox_report

# The stdin problem's expected outputs, which a forging solution writes as results of every test.
_FORGED = [
    json.dumps(
        {
            "op": "result",
            "status": "ok",
            "output": t["output"],
            "truncated": False,
            "wall_s": 0.0,
            "cpu_s": 0.0,
            "detail": "",
        }
    )
    for t in STDIN_TESTS
]

_FORGE = """
import ctypes, fcntl, os, stat
LINES = %r
libc = ctypes.CDLL(None, use_errno=True)
seen = set()
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        pfd = os.pidfd_open(int(name))
    except OSError:
        continue
    for fd in range(32):
        n = libc.syscall(438, pfd, fd, 0)  # pidfd_getfd: a copy of the harness's answer pipe
        if n < 0:
            continue
        st = os.fstat(n)
        if stat.S_ISFIFO(st.st_mode) and fcntl.fcntl(n, fcntl.F_GETFL) & 3 == 1 and st.st_ino not in seen:
            seen.add(st.st_ino)
            os.write(n, "".join(line + "\\n" for line in LINES).encode())
        os.close(n)
    os.close(pfd)
print("WRONG")
""" % (_FORGED,)

_HUGE_NUMBER = """
import os
class Solution:
    def topK(self, xs, k):
        digits = "9" * 2_000_000  # where the harness reads the return value, then exit before it writes it
        for d, _, files in os.walk("/tmp"):
            for name in files:
                try:
                    with open(os.path.join(d, name), "w") as fh:
                        fh.write(digits)
                except OSError:
                    pass
        os._exit(0)
"""

# kind -> (problem, code)
HOSTILE = {
    "infinite_loop": ("stdin", "while True:\n    pass\n"),
    "sleeper": ("stdin", "import time\ntime.sleep(60)\n"),
    "fork_bomb": ("stdin", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    "memory_hog": ("stdin", "x = []\nwhile True:\n    x.append(' ' * 10**6)\n"),
    "output_flood": ("stdin", "import sys\nwhile True:\n    sys.stdout.write('9' * 65536)\n"),
    "detached_daemon": (
        "stdin",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nprint('WRONG')\n",
    ),
    "shm_flood": (
        "stdin",
        "for i in range(12):\n    try:\n"
        "        open('/dev/shm/f%d' % i, 'wb').write(b'x' * (16 << 20))\n"
        "    except OSError:\n        break\nprint('WRONG')\n",
    ),
    "forged_pass": ("stdin", _FORGE),
    "special_decimal": ("stdin", "print('sNaN')\n"),
    "huge_number": ("functional", _HUGE_NUMBER),
}
NOT_SURVIVED_BEFORE = ("special_decimal", "huge_number")


def make_batch(n: int, share: float, kinds: list[str], seed: int = 0) -> list[tuple[str, list[dict], str]]:
    n_hostile = round(n * share)
    items = make_items(n - n_hostile, seed)
    for i in range(n_hostile):
        kind = kinds[i % len(kinds)]
        problem, code = HOSTILE[kind]
        items.append((code, STDIN_TESTS if problem == "stdin" else FUNC_TESTS, "hostile:" + kind))
    random.Random(seed + 1).shuffle(items)
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--hostile-share", type=float, default=0.2)
    ap.add_argument("--kinds", choices=("all", "survivable"), default="all")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=1.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "code_exec_hostile.json"))
    a = ap.parse_args()
    kinds = [k for k in HOSTILE if a.kinds == "all" or k not in NOT_SURVIVED_BEFORE]
    report = sandbox_report()
    items = make_batch(a.n, a.hostile_share, kinds)
    kw = {"time_limit_s": a.time_limit, "memory_mb": 512}
    run_tests("print(1)", [{"input": "", "output": "1", "testtype": "stdin"}], **kw)  # probe the plan, warm up

    seconds: list[float] = []
    errors: list[str] = []
    statuses: list[str] = []
    for rep in range(a.repeats):
        t0 = time.perf_counter()
        try:
            out = verify_many([(code, tests) for code, tests, _ in items], workers=a.workers, **kw)
        except Exception as e:  # the verifier before issue 21: one solution cost the batch
            errors.append(f"{type(e).__name__}: {str(e)[:200]}")
            print(f"repeat {rep}: verify_many raised {errors[-1]} after {time.perf_counter() - t0:.1f} s", flush=True)
            continue
        seconds.append(time.perf_counter() - t0)
        statuses = [v.status for v in out]
        print(f"repeat {rep}: {a.n / seconds[-1]:.2f} solutions/s ({seconds[-1]:.1f} s)", flush=True)

    by_kind: dict[str, dict[str, int]] = {}
    ordinary_ok = hostile_passes = 0
    for (_, _, intent), status in zip(items, statuses):
        if intent.startswith("hostile:"):
            counts = by_kind.setdefault(intent.split(":", 1)[1], {})
            counts[status] = counts.get(status, 0) + 1
            hostile_passes += status == "pass"
        else:
            ordinary_ok += status == intent
    n_hostile = sum(i[2].startswith("hostile:") for i in items)
    write_result(
        {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at the end",
            "sandbox": {
                "tier": report["tier"],
                "interpreter": report["interpreter"],
                "active_layers": [k for k, v in report["layers"].items() if v["active"]],
            },
            "n_solutions": a.n,
            "n_hostile": n_hostile,
            "hostile_kinds": kinds,
            "tests_per_solution": 5,
            "time_limit_s": a.time_limit,
            "workers": a.workers,
            "solutions_per_s_best": a.n / min(seconds) if seconds else None,
            "seconds_all_runs": seconds,
            "runs_that_raised": errors,
            "ordinary_verdicts_as_intended": f"{ordinary_ok}/{a.n - n_hostile}" if statuses else None,
            "hostile_passes": hostile_passes if statuses else None,
            "hostile_verdicts": by_kind,
        },
        a.out,
    )


if __name__ == "__main__":
    main()
