"""The parent's side of the harness protocol: nonce-checked answers under deadlines, validated, made verdicts.

Trust model. Generated code is hostile. Expected outputs never enter the sandbox: the trusted
parent sends one test *input* at a time to a small harness inside the sandbox
(:mod:`creditlab.rewards.code.harness`), the harness runs the solution in a fresh forked child per
test and returns its raw stdout (or JSON return value), and the parent compares
(:mod:`creditlab.rewards.code.cases`). The solution runs as the harness's uid, so the harness puts
itself out of its reach (layer 8 of :mod:`creditlab.rewards.code.sandbox`). The parent validates
every answer strictly: each line starts with a per-run random nonce, sent to the harness before
anything else and kept in a page that forked children see zeroed (``MADV_WIPEONFORK``), so the
solution cannot know it; exactly one answer per request, for that request's test; every field
typed. Anything else is that solution's ``sandbox_error``. A solution can therefore only make its
own verdict worse, never fake a pass without producing the right output. A judging error is that
test's ``sandbox_error``, never an exception.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from creditlab.rewards.code.cases import TestCase, TestVerdict, return_matches, stdout_matches, truncate

log = logging.getLogger(__name__)


class SandboxGone(Exception):
    """The harness is gone or unusable (it closed its pipes, exited, or sent an answer over the size limit)."""


class Malformed(SandboxGone):
    """An answer that breaks the protocol (no or a wrong nonce, a second answer, a wrong field type)."""


NONCE_BYTES = 16  # sent as 32 hex characters, the first bytes of the harness's input
_HARNESS_STATUSES = frozenset(
    {"ok", "exception", "memory", "unrepresentable", "compile_error", "guard", "timeout", "signal", "exit"}
)


def _is_seconds(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x) and x >= 0


def checked(msg: Any, op: str, index: int) -> dict[str, Any]:
    """A harness answer, validated field by field; raises :class:`Malformed` otherwise."""
    if not isinstance(msg, dict):
        raise Malformed(f"harness answer is not an object ({type(msg).__name__})")
    if msg.get("op") != op or type(msg.get("i")) is not int or msg["i"] != index:
        raise Malformed(f"harness answer for {msg.get('op')!r} #{msg.get('i')!r}, expected {op!r} #{index}")
    status = msg.get("status")
    if type(status) is not str or status not in _HARNESS_STATUSES:
        raise Malformed(f"harness status {truncate(repr(status), 60)}")
    if not (_is_seconds(msg.get("wall_s")) and _is_seconds(msg.get("cpu_s"))) or type(msg.get("detail")) is not str:
        raise Malformed("harness answer with malformed times or detail")
    if status == "ok" and op == "result":
        if not (msg.get("output") is None or type(msg.get("output")) is str) or type(msg.get("truncated")) is not bool:
            raise Malformed("harness answer with a malformed output")
    return msg


class Channel:
    """Line-delimited JSON with the harness over its stdin/stdout, every call under a deadline.

    Every answer line starts with the run's nonce (random, sent to the harness before anything else;
    the solution cannot learn it) and must be the only data the harness sent since the last request.
    """

    def __init__(self, proc: subprocess.Popen, max_line: int, nonce: bytes) -> None:
        self.proc, self.max_line, self.nonce = proc, max_line, nonce
        self.wfd, self.rfd, self.efd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (self.wfd, self.rfd, self.efd):
            os.set_blocking(fd, False)
        self.buf, self.err = bytearray(), bytearray()
        self.err_open = True

    def _drain_err(self) -> None:
        try:
            chunk = os.read(self.efd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.err_open = False
        elif len(self.err) < 1 << 16:
            self.err += chunk

    def send(self, obj: Any, deadline: float, prefix: bytes = b"") -> None:
        data = memoryview(prefix + json.dumps(obj).encode("utf-8") + b"\n")
        poll = select.poll()
        poll.register(self.wfd, select.POLLOUT)
        if self.err_open:
            poll.register(self.efd, select.POLLIN)
        while data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("harness did not take the test input in time")
            for fd, ev in poll.poll(left * 1000):
                if fd == self.efd:
                    self._drain_err()
                    if not self.err_open:
                        poll.unregister(self.efd)
                elif ev & (select.POLLERR | select.POLLHUP):
                    raise SandboxGone("harness closed its input")
                else:
                    try:
                        data = data[os.write(self.wfd, data) :]
                    except BlockingIOError:
                        pass
                    except (BrokenPipeError, OSError) as e:
                        raise SandboxGone("harness closed its input") from e

    def recv(self, deadline: float) -> dict[str, Any]:
        poll = select.poll()
        poll.register(self.rfd, select.POLLIN)
        if self.err_open:
            poll.register(self.efd, select.POLLIN)
        start = 0
        while True:
            nl = self.buf.find(b"\n", start)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                if self.buf:
                    raise Malformed("harness sent more than one answer")
                if not line.startswith(self.nonce + b" "):
                    raise Malformed("harness answer without the run's nonce")
                return json.loads(line[len(self.nonce) + 1 :])
            start = len(self.buf)
            if len(self.buf) > self.max_line:
                raise SandboxGone("harness answer over the size limit")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("harness did not answer in time")
            for fd, _ev in poll.poll(left * 1000):
                if fd == self.efd:
                    self._drain_err()
                    if not self.err_open:
                        poll.unregister(self.efd)
                    continue
                try:
                    chunk = os.read(self.rfd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise SandboxGone("harness exited")
                self.buf += chunk

    def stderr_tail(self) -> str:
        try:
            while self.err_open:
                before = len(self.err)
                self._drain_err()
                if len(self.err) == before:
                    break
        except OSError:
            pass
        return self.err.decode("utf-8", "replace")[-1500:]


def judge_answer(test: TestCase, res: Mapping[str, Any]) -> TestVerdict:
    """The verdict of one (validated) harness answer; never raises: a judging error is a ``sandbox_error``."""
    status, wall, cpu, detail = res.get("status"), res.get("wall_s"), res.get("cpu_s"), res.get("detail", "")
    verdict = {
        "timeout": "timeout",
        "memory": "memory",
        "exception": "runtime_error",
        "signal": "runtime_error",
        "exit": "runtime_error",
        "unrepresentable": "fail",
        "compile_error": "compile_error",
    }.get(status)
    try:
        if status == "ok":
            out = res.get("output")
            if out is None:
                verdict, detail = "fail", "no output"
            elif res.get("truncated"):
                verdict, detail = "fail", "output over the size limit"
            elif test.testtype == "stdin":
                verdict = "pass" if stdout_matches(out, test.output) else "fail"
            else:
                verdict = "pass" if return_matches(out, test.output) else "fail"
            if verdict == "fail" and not detail:
                detail = "wrong answer: got " + truncate(out or "")
        elif status == "guard":
            verdict, detail = "sandbox_error", "the sandbox could not confine the solution (prctl / seccomp failed)"
        elif verdict is None:
            verdict, detail = "sandbox_error", f"unknown harness status {status!r}"
        return TestVerdict(-1, verdict, wall, cpu, truncate(str(detail), 600))
    except Exception as e:  # pragma: no cover - a bug of the judge: this test's verdict only
        log.exception("code_exec: judging failed")
        return TestVerdict(-1, "sandbox_error", detail=truncate(f"judging failed: {e!r}", 600))
