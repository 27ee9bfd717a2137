"""Code-execution verifier throughput: `verify_many` on N workers against running the solutions one by one.

N synthetic solutions (default 200) of two LiveCodeBench-style problems (a stdin one, 5 tests, and a
functional one, 5 tests), mixed as generated code is: 60% correct, 20% wrong answer (on a late test),
8% runtime error, 7% compile error, 5% infinite loop (timeout at the 1 s per-test limit). Every solution
runs in its own sandbox (see `creditlab.rewards.code.sandbox.sandbox_report`). The two arms run alternately
(`--repeats` times each); reported: verified solutions per second of each arm (best and all runs), the
speed-up, and that both arms gave the same verdicts. Writes benchmarks/results/code_exec.json.

    python benchmarks/bench_code_exec.py [--n 200] [--workers 2] [--repeats 2] [--time-limit 1.0]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from pathlib import Path

from _common import write_result  # noqa: E402  (benchmarks/ is the script's directory)

from creditlab.rewards.code.runner import run_tests, verify_many
from creditlab.rewards.code.sandbox import sandbox_report

STDIN_TESTS = [
    {"input": f"{a} {b}\n", "output": f"{a + b}\n", "testtype": "stdin"}
    for a, b in [(1, 2), (10, -4), (123456789, 987654321), (0, 0), (-5, -7)]
]
FUNC_TESTS = [
    {
        "input": f"{xs}\n{k}",
        "output": str(sorted(xs)[-k:][::-1]),
        "testtype": "functional",
        "metadata": {"func_name": "topK"},
    }
    for xs, k in [([3, 1, 2], 1), ([5, 9, 1, 7], 2), ([4, 4, 4], 3), (list(range(50)), 5), ([-1, -2], 2)]
]

STDIN = {
    "pass": "a, b = map(int, input().split())\nprint(a + b)\n",
    "fail": "a, b = map(int, input().split())\nprint(a + b if a >= 0 else a - b)\n",  # wrong on the last test
    "runtime_error": "a, b = map(int, input().split())\nprint(a + b + 0 // a)\n",  # ZeroDivisionError on test 4
    "compile_error": "a, b = map(int, input().split()\nprint(a + b)\n",
    "timeout": "a, b = map(int, input().split())\nwhile a != b + 1:\n    a += 0\nprint(a)\n",
}
FUNC = {
    "pass": "class Solution:\n    def topK(self, xs: List[int], k: int) -> List[int]:\n"
    "        return heapq.nlargest(k, xs)\n",
    "fail": "class Solution:\n    def topK(self, xs, k):\n        return sorted(xs)[-k:]\n",  # wrong order when k > 1
    "runtime_error": "class Solution:\n    def topK(self, xs, k):\n"
    "        return heapq.nlargest(k, xs) if k < 3 else xs[99]\n",  # IndexError on test 3
    "compile_error": "class Solution:\n    def topK(self, xs, k)\n        return xs\n",
    "timeout": "class Solution:\n    def topK(self, xs, k):\n        while True:\n            pass\n",
}
MIX = {"pass": 0.60, "fail": 0.20, "runtime_error": 0.08, "compile_error": 0.07, "timeout": 0.05}


def make_items(n: int, seed: int = 0) -> list[tuple[str, list[dict], str]]:
    """(code, tests, intended outcome) for n solutions, half per problem, in a shuffled order."""
    kinds = [k for k, share in MIX.items() for _ in range(round(share * n))]
    kinds = (kinds + ["pass"] * n)[:n]
    items = [((STDIN, STDIN_TESTS) if i % 2 == 0 else (FUNC, FUNC_TESTS)) for i in range(n)]
    out = [(codes[k], tests, k) for (codes, tests), k in zip(items, kinds)]
    random.Random(seed).shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=1.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "code_exec.json"))
    a = ap.parse_args()
    report = sandbox_report()
    items = make_items(a.n)
    kw = {"time_limit_s": a.time_limit, "memory_mb": 512}
    run_tests(STDIN["pass"], STDIN_TESTS, **kw)  # warm the page cache and the probed plan

    runs: dict[str, list[float]] = {"one_by_one": [], f"verify_many_{a.workers}": []}
    verdicts: dict[str, list[str]] = {}
    for rep in range(a.repeats):
        for arm in list(runs) if rep % 2 == 0 else list(runs)[::-1]:
            t0 = time.perf_counter()
            if arm == "one_by_one":
                out = [run_tests(code, tests, **kw) for code, tests, _ in items]
            else:
                out = verify_many([(code, tests) for code, tests, _ in items], workers=a.workers, **kw)
            runs[arm].append(time.perf_counter() - t0)
            verdicts[arm] = [v.status for v in out]
            print(f"repeat {rep} {arm}: {a.n / runs[arm][-1]:.2f} solutions/s ({runs[arm][-1]:.1f} s)", flush=True)

    seq, par = runs["one_by_one"], runs[f"verify_many_{a.workers}"]
    intended = [k for _, _, k in items]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end",
        "sandbox": {
            "tier": report["tier"],
            "interpreter": report["interpreter"],
            "active_layers": [k for k, v in report["layers"].items() if v["active"]],
        },
        "n_solutions": a.n,
        "tests_per_solution": 5,
        "time_limit_s": a.time_limit,
        "mix": {k: intended.count(k) for k in MIX},
        "verdicts": {s: verdicts["one_by_one"].count(s) for s in sorted(set(verdicts["one_by_one"]))},
        "same_verdicts_both_arms": verdicts["one_by_one"] == verdicts[f"verify_many_{a.workers}"],
        "verdicts_match_intent": verdicts["one_by_one"] == intended,
        "solutions_per_s": {"one_by_one": a.n / min(seq), f"verify_many_{a.workers}": a.n / min(par)},
        "speedup": min(seq) / min(par),
        "seconds_all_runs": runs,
    }
    write_result(result, a.out)


if __name__ == "__main__":
    main()
