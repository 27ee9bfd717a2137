"""Running solutions: one solution's tests in a fresh sandbox (:func:`run_tests`), many at once (:func:`verify_many`).

:func:`run_tests` starts the harness through the sandbox plan of :mod:`creditlab.rewards.code.sandbox`,
sends it the run's configuration and one test input at a time over :mod:`creditlab.rewards.code.protocol`,
judges every answer by the rules of :mod:`creditlab.rewards.code.cases`, and tears the sandbox down;
it never takes longer than :func:`max_run_seconds` and never raises for a solution's doing.
:func:`verify_many` runs many solutions on worker threads, each in its own sandbox, so that one
solution's failure never costs the batch.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from creditlab.rewards.code.cases import TestCase, TestVerdict, Verdict, truncate
from creditlab.rewards.code.protocol import NONCE_BYTES, Channel, SandboxGone, checked, judge_answer
from creditlab.rewards.code.sandbox import (
    NOFILE,
    UID_SLOTS,
    count_own_tasks,
    get_plan,
    kill_session,
    kill_tagged,
    kill_uid,
    rmtree,
)

log = logging.getLogger(__name__)

STARTUP_S = 20.0  # bwrap + interpreter start + preamble imports, under load
GRACE_S = 3.0  # per test, on top of time_limit_s, before the parent gives up on the harness

# LiveCodeBench's import preamble (testing_util.import_string), re-stated as module lists.
_STAR_IMPORTS = (
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
    "builtins",
    "typing",
)
_PLAIN_IMPORTS = _STAR_IMPORTS[:16]
PREAMBLE = (
    "".join(f"from {m} import *\n" for m in _STAR_IMPORTS)
    + "".join(f"import {m}\n" for m in _PLAIN_IMPORTS)
    + "sys.setrecursionlimit(50000)\n"
)


def max_run_seconds(n_tests: int, time_limit_s: float = 6.0) -> float:
    """Upper bound on one :func:`run_tests` call (startup, compile check, every test, kill)."""
    return STARTUP_S + (n_tests + 1) * (time_limit_s + GRACE_S) + 5.0


def run_tests(
    code: str,
    tests: Sequence[TestCase | Mapping[str, Any]],
    *,
    time_limit_s: float = 6.0,
    memory_mb: int = 1024,
    func_name: str | None = None,
    stop_at_first_failure: bool = True,
    max_output_mb: int = 16,
    max_procs: int = 32,
    scratch_mb: int = 64,
    preamble: bool = True,
) -> Verdict:
    """Run ``code`` against ``tests`` in a fresh sandbox; never takes longer than :func:`max_run_seconds`.

    Args:
        code: Python source (e.g. from :func:`~creditlab.rewards.code.extract.extract_code`).
        tests: :class:`TestCase` objects or LCB dicts (``func_name`` fills in functional tests).
        time_limit_s: wall-clock limit per test (LCB: 6 s); the CPU limit is ``ceil(it)+1`` s.
        memory_mb: address-space limit of each process of the solution.
        stop_at_first_failure: as LCB, later tests are ``skipped`` once one fails.
        max_output_mb: limit on stdout / any written file, per test.
        max_procs: processes + threads the sandbox may hold at once (harness included).
        scratch_mb: size of the working-dir tmpfs (bwrap tier).
        preamble: prepend LCB's star-import preamble.
    """
    t_start = time.monotonic()
    cases = [t if isinstance(t, TestCase) else TestCase.from_dict(t, func_name) for t in tests]
    plan = get_plan()
    if plan.tier == "none":
        return Verdict(
            [TestVerdict(i, "sandbox_error", detail=plan.error) for i in range(len(cases))],
            plan.tier,
            time.monotonic() - t_start,
            detail=plan.error,
        )
    results: list[TestVerdict] = []
    detail = ""
    uid = plan.acquire_uid()
    scratch, token = None, ""
    proc: subprocess.Popen | None = None
    try:
        if plan.tier != "bwrap":
            scratch = tempfile.mkdtemp(prefix=f"creditlab-code-{os.getpid()}-")
            if uid is not None:
                os.chown(scratch, uid, uid)
        cfg = {
            "code": code,
            "time_limit_s": float(time_limit_s),
            "max_procs": int(max_procs),
            "kill_all": plan.kill_all,
            "iodir": os.path.join(scratch, ".io") if scratch else "/tmp/.io",
            "preamble": PREAMBLE if preamble else "",
            "preload": list(_STAR_IMPORTS),
            "limits": {
                "cpu_s": math.ceil(time_limit_s) + 1,
                "as_bytes": int(memory_mb) << 20,
                "fsize_bytes": int(max_output_mb) << 20,
                "nofile": NOFILE,
            },
        }
        if plan.tier == "process" and not plan.root:  # RLIMIT_NPROC counts the caller's whole uid here
            cfg["max_procs"] = count_own_tasks() + int(max_procs)
        token = os.urandom(8).hex()
        nonce = os.urandom(NONCE_BYTES).hex().encode()
        argv, kw = plan.command(uid, scratch, scratch_mb, token)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
        ch = Channel(proc, max_line=(int(max_output_mb) << 20) * 6 + (1 << 16), nonce=nonce)
        step = time_limit_s + GRACE_S
        try:
            ch.send(cfg, time.monotonic() + STARTUP_S, prefix=nonce)
            compiled = checked(ch.recv(time.monotonic() + STARTUP_S + step), "compiled", -1)
            if compiled.get("status") == "compile_error":
                msg = truncate(compiled.get("detail", ""), 600)
                results = [TestVerdict(i, "compile_error", detail=msg) for i in range(len(cases))]
            elif compiled.get("status") != "ok":  # the compile check itself timed out / crashed
                v = judge_answer(cases[0], compiled) if cases else None
                results = [
                    TestVerdict(i, v.verdict if v else "sandbox_error", detail=v.detail if v else "")
                    for i in range(len(cases))
                ]
            else:
                for i, test in enumerate(cases):
                    ch.send(
                        {"i": i, "input": test.input, "testtype": test.testtype, "func_name": test.func_name},
                        time.monotonic() + step,
                    )
                    v = judge_answer(test, checked(ch.recv(time.monotonic() + step), "result", i))
                    v.index = i
                    results.append(v)
                    if stop_at_first_failure and v.verdict != "pass":
                        break
        except (TimeoutError, SandboxGone, ValueError, RecursionError) as e:  # a malformed channel included
            code_ = proc.poll()
            detail = f"{e} (harness exit {code_}); harness stderr: {ch.stderr_tail()}".strip()
            results.append(TestVerdict(len(results), "sandbox_error", detail=truncate(detail, 600)))
        except Exception as e:  # pragma: no cover - a bug here: this solution's verdict only
            log.exception("code_exec: run failed")
            detail = f"verifier error: {e!r}"
            results.append(TestVerdict(len(results), "sandbox_error", detail=truncate(detail, 600)))
    except OSError as e:
        detail = f"could not start the sandbox: {e!r}"
        results.append(TestVerdict(len(results), "sandbox_error", detail=detail))
    finally:
        if proc is not None:
            kill_session(proc)
        if uid is not None:
            kill_uid(uid)
        elif plan.tier == "process" and token:
            kill_tagged(token)
        plan.release_uid(uid)
        if scratch:
            rmtree(scratch)
    for i in range(len(results), len(cases)):
        results.append(TestVerdict(i, "skipped"))
    return Verdict(results, plan.tier, time.monotonic() - t_start, scratch, detail)


def verify_many(
    items: Iterable[tuple[str | None, Sequence[Any]] | Mapping[str, Any]],
    *,
    workers: int | None = None,
    **kwargs: Any,
) -> list[Verdict]:
    """Verify many solutions concurrently, each in its own sandbox; results in input order.

    ``items``: ``(code, tests)`` pairs or dicts with ``code``, ``tests`` and optional per-item
    :func:`run_tests` options; a ``None`` code yields a ``compile_error`` verdict for every test
    without starting a sandbox. At most ``workers`` (default ``os.cpu_count()``) sandboxes run at
    once (threads only wait on pipes), so the batch takes at most
    ``ceil(N / workers) * max_run_seconds``. ``kwargs`` are :func:`run_tests` options for all.
    """
    jobs: list[tuple[str | None, Sequence[Any], dict[str, Any]]] = []
    for it in items:
        if isinstance(it, Mapping):
            extra = {k: v for k, v in it.items() if k not in ("code", "tests")}
            jobs.append((it.get("code"), it["tests"], {**kwargs, **extra}))
        else:
            jobs.append((it[0], it[1], dict(kwargs)))
    n_workers = max(1, workers or os.cpu_count() or 1)
    get_plan()  # probe once, before the threads start

    def one(job: tuple[str | None, Sequence[Any], dict[str, Any]]) -> Verdict:
        code, tests, kw = job
        if code is None:
            return Verdict(
                [TestVerdict(i, "compile_error", detail="no code") for i in range(len(tests))], get_plan().tier, 0.0
            )
        try:
            return run_tests(code, tests, **kw)
        except Exception as e:  # one solution's problem (e.g. a malformed test) never costs the batch
            log.exception("code_exec: verifying one solution failed")
            n = len(tests) if isinstance(tests, Sequence) else 1
            return Verdict(
                [TestVerdict(i, "sandbox_error", detail=truncate(repr(e), 600)) for i in range(max(n, 1))],
                get_plan().tier,
                0.0,
                detail=repr(e),
            )

    if n_workers == 1 or len(jobs) <= 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=min(n_workers, len(jobs), UID_SLOTS)) as pool:
        return list(pool.map(one, jobs))
