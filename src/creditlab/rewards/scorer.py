"""Hang-proof, cached batch scoring of responses with a verifiable reward.

math-verify's own timeout is a ``signal.alarm`` that cannot interrupt C-level big-number arithmetic
(``\\boxed{9^{9^{9^9}}}`` may never return), and it does not work outside the main thread. So
:class:`RewardScorer` judges answers in persistent worker processes, one sample in flight per
worker, and the parent enforces a hard per-sample wall-clock timeout: a worker that runs past it
is SIGKILLed, the sample gets the reward's failure score (0.0 for ``math_verify``, -1.0 for
``dapo_answer``) and is counted, a fresh worker is started, and scoring carries on. A worker that
crashes is handled the same way. The pipeline never waits on a worker longer than the timeout.

Caching: the score of a response depends only on ``(extracted answer, gold)``; most rollouts of a
question repeat the same answer, so the scorer judges each distinct pair once (memory cache, and
within a batch), and optionally persists results in a small SQLite file (``cache_path``) that later
runs reuse. Timeouts are cached in memory only: a timeout under load is not a verdict to keep.

Start method (measured on 2 CPU cores; a worker (re)start = process start + math-verify import
and warm-up): ``spawn`` (default) starts a fresh interpreter, ~1 s per (re)start when the caller
runs as ``python -m ...`` (the pipeline's CLI, pytest; a caller run as a *script* also re-imports
that script in every worker, as with any spawn). It is safe in a parent that holds torch thread
pools, tqdm or MLflow threads (``fork`` of a multi-threaded process can deadlock the child), and the
worker is the parent's own child, so the kernel kills it when the parent dies (PR_SET_PDEATHSIG):
a worker stuck in C-level arithmetic cannot outlive a killed pipeline. ``fork`` (~0.8 s restart:
the child still imports math-verify) and ``forkserver`` (~0.15 s) are accepted but weaker: fork
inherits the state of the parent's threads; forkserver workers are children of the fork server,
which stays alive while they do, so a stuck worker survives a SIGKILLed parent (observed). Restarts
only follow a timeout (which already costs ``timeout_s``) or a crash, so the safe default costs
little.

Linux's parent-death signal fires when the *thread* that started a worker exits: use a scorer from
one long-lived thread (a worker that died this way is replaced at the next submission, unblamed).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import signal
import sqlite3
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import TracebackType
from typing import Any

from creditlab.rewards.registry import RewardSpec, get_reward_spec

# With start_method="forkserver": imported once by the fork server so that workers start warm
# ("__main__" is the multiprocessing default; Python 3.11's fork server ignores it, so workers of a
# caller run as a script re-import that script on every start).
_FORKSERVER_PRELOAD = ["__main__", "math_verify", "creditlab.rewards.math_verify_reward"]
_PR_SET_PDEATHSIG = 1
_READY = "ready"
# How long a fresh worker may take to import math-verify and warm up before we give up loudly.
STARTUP_TIMEOUT_S = 120.0


# ----------------------------------------------------------------------------------------------
# Worker process
# ----------------------------------------------------------------------------------------------


def _worker_main(conn: Connection, reward: str) -> None:
    """Worker loop: receive ``(task_id, answer, gold)``, send ``(task_id, score, ok)``; None stops.

    Runs the reward's judge with math-verify's internal signal timeout disabled: the parent owns
    the timeout. A judge exception yields the failure score with ``ok=False``.
    """
    from creditlab.rewards.math_verify_reward import quiet_math_verify_logs

    _die_with_parent()
    quiet_math_verify_logs()
    spec = get_reward_spec(reward)
    spec.judge("1", "1")  # warm up lazy imports and parsers before declaring readiness
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent went away
        if msg is None:
            return
        task_id, answer, gold = msg
        try:
            score, ok = float(spec.judge(answer, gold)), True
        except Exception:  # noqa: BLE001 - any judge failure is a wrong answer, not a crash
            score, ok = spec.failure, False
        conn.send((task_id, score, ok))


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when its parent (thread) dies.

    A worker stuck in C-level arithmetic never notices a closed pipe, so without this it would
    outlive a crashed pipeline, holding a core. Effective with ``spawn`` and ``fork``; under
    ``forkserver`` the parent is the fork server. No-op where prctl is unavailable.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


@dataclass(eq=False)
class _Worker:
    """Parent-side handle of one worker: process, pipe end, state and the in-flight task."""

    process: Any
    conn: Connection
    state: str = "starting"  # starting -> idle <-> busy; dead once killed
    task: int | None = None
    deadline: float = field(default_factory=lambda: time.monotonic() + STARTUP_TIMEOUT_S)

    @classmethod
    def start(cls, ctx: Any, reward: str) -> "_Worker":
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_worker_main, args=(child_conn, reward), daemon=True)
        process.start()
        child_conn.close()
        return cls(process=process, conn=parent_conn)

    def submit(self, task_id: int, answer: str, gold: str, timeout_s: float) -> None:
        self.conn.send((task_id, answer, gold))
        self.state, self.task = "busy", task_id
        self.deadline = time.monotonic() + timeout_s

    def kill(self) -> None:
        """SIGKILL the process (if alive), reap it and close the pipe."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()
        self.state = "dead"

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within a second."""
        try:
            if self.state != "busy":
                self.conn.send(None)
            self.process.join(timeout=1.0)
        except (OSError, ValueError):
            pass
        self.kill()


# ----------------------------------------------------------------------------------------------
# Persistent cache
# ----------------------------------------------------------------------------------------------


class _SqliteCache:
    """``(reward tag, answer, gold) -> score`` in a SQLite file, safe for concurrent jobs (WAL)."""

    def __init__(self, path: Path, tag: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tag = tag
        self.db = sqlite3.connect(str(path), timeout=60.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS scores (reward TEXT, answer TEXT, gold TEXT, score REAL,"
            " PRIMARY KEY (reward, answer, gold)) WITHOUT ROWID"
        )
        self.db.commit()

    @staticmethod
    def _key(text: str) -> str | bytes:
        """``text`` as stored: itself, or, when it holds a lone surrogate (``"\\ud800"``, which UTF-8 and
        so SQLite's TEXT cannot hold), its ``surrogatepass`` bytes as a BLOB. A BLOB never equals a TEXT
        in SQLite, and those bytes are not valid UTF-8, so no such key meets an ordinary one (unlike a
        ``backslashreplace`` spelling, which is the 6-character text ``\\ud800``)."""
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")

    def get(self, answer: str, gold: str) -> float | None:
        row = self.db.execute(
            "SELECT score FROM scores WHERE reward=? AND answer=? AND gold=?",
            (self.tag, self._key(answer), self._key(gold)),
        ).fetchone()
        return None if row is None else float(row[0])

    def put_many(self, items: list[tuple[str, str, float]]) -> None:
        if items:
            self.db.executemany(
                "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?)",
                [(self.tag, self._key(a), self._key(g), s) for a, g, s in items],
            )
            self.db.commit()

    def close(self) -> None:
        self.db.close()


# ----------------------------------------------------------------------------------------------
# Scorer
# ----------------------------------------------------------------------------------------------


class RewardScorer:
    """Score ``(response, gold)`` pairs with a registered reward in sandboxed, persistent workers.

    Use as a context manager::

        with RewardScorer("math_verify", timeout_s=5.0, cache_path=Path("results/reward_cache.sqlite")) as s:
            rewards = s.score(responses, golds)

    Args:
        reward: reward name (``"math_verify"`` or ``"dapo_answer"``).
        timeout_s: hard wall-clock limit per judged sample, from hand-off to the worker.
        n_workers: worker processes judging in parallel.
        cache: reuse scores of already judged ``(answer, gold)`` pairs (memory, plus ``cache_path``).
            With ``cache=False`` every sample with an answer is judged.
        cache_path: optional SQLite file persisting the cache across runs (only with ``cache``).
        start_method: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"`` (see module docstring).
        max_cached: bound of the memory cache: a batch whose verdicts would take it past ``max_cached`` pairs
            empties it first (for a scorer that lives as long as a training run, :mod:`creditlab.rewards.service`).
            None (default): unbounded.

    Not thread-safe: call :meth:`score` from one thread at a time.
    """

    def __init__(
        self,
        reward: str = "math_verify",
        timeout_s: float = 5.0,
        n_workers: int = 1,
        cache: bool = True,
        cache_path: str | Path | None = None,
        start_method: str = "spawn",
        max_cached: int | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.spec: RewardSpec = get_reward_spec(reward)
        self.reward = reward
        self.timeout_s = float(timeout_s)
        self.n_workers = n_workers
        self.cache = cache
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self.start_method = start_method
        self.max_cached = max_cached
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = []
        self._memory: dict[tuple[str, str], float] = {}
        self._disk: _SqliteCache | None = None
        self._stats = dict.fromkeys(
            (
                "n_scored",
                "n_cache_hits",
                "n_judged",
                "n_no_answer",
                "n_timeouts",
                "n_crashes",
                "n_errors",
                "n_worker_restarts",
            ),
            0,
        )
        self._seconds = 0.0

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "RewardScorer":
        self.open()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        """Open the persistent cache and start the workers (waits until they are ready)."""
        if self.cache and self.cache_path is not None and self._disk is None:
            self._disk = _SqliteCache(self.cache_path, self.spec.cache_tag)
        if not self._workers:
            if self.start_method == "forkserver":
                self._ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
            self._workers = [_Worker.start(self._ctx, self.reward) for _ in range(self.n_workers)]
            self._drive({}, deque(), {})  # wait for readiness

    def close(self) -> None:
        """Stop the workers and close the cache file. Idempotent."""
        for w in self._workers:
            w.stop()
        self._workers = []
        if self._disk is not None:
            self._disk.close()
            self._disk = None

    # -- public API ------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, float]:
        """Counters since construction.

        ``n_scored`` samples returned; ``n_cache_hits`` served from the cache or from an identical
        pair earlier in the same batch; ``n_judged`` judge calls; ``n_no_answer`` responses without
        an extractable answer; ``n_timeouts`` / ``n_crashes`` / ``n_errors`` judge calls that ran
        past the timeout / killed their worker / raised; ``n_worker_restarts``; ``seconds`` spent in
        :meth:`score`.
        """
        return {**self._stats, "seconds": self._seconds}

    def extract(self, response: str) -> str | None:
        """The answer the reward reads from ``response`` (None if there is none)."""
        return self.spec.extract(response)

    def score(self, responses: list[str], golds: list[str]) -> list[float]:
        """Score each response against its gold answer; never blocks longer than the timeouts."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        t0 = time.monotonic()
        if not self._workers:
            self.open()
        scores: list[float | None] = [None] * len(responses)
        tasks: dict[int, tuple[str, str]] = {}  # task id -> (answer, gold)
        waiting: dict[int, list[int]] = {}  # task id -> sample indices
        by_key: dict[tuple[str, str], int] = {}
        for i, (response, gold) in enumerate(zip(responses, golds)):
            answer = self.spec.extract(response)
            if answer is None:
                scores[i] = self.spec.failure
                self._stats["n_no_answer"] += 1
                continue
            key = (answer, str(gold))
            cached = self._lookup(key) if self.cache else None
            if cached is not None:
                scores[i] = cached
                self._stats["n_cache_hits"] += 1
            elif self.cache and key in by_key:
                waiting[by_key[key]].append(i)
                self._stats["n_cache_hits"] += 1
            else:
                task_id = len(tasks)
                tasks[task_id], waiting[task_id] = key, [i]
                by_key[key] = task_id
        results: dict[int, tuple[float, bool]] = {}
        try:
            self._drive(tasks, deque(tasks), results)
        except BaseException:  # e.g. KeyboardInterrupt: no worker may keep a stale answer in flight
            self._replace_busy_workers()
            raise
        self._record(tasks, results)
        for task_id, idxs in waiting.items():
            for i in idxs:
                scores[i] = results[task_id][0]
        self._stats["n_scored"] += len(responses)
        self._seconds += time.monotonic() - t0
        return [float(s) for s in scores]  # type: ignore[arg-type]

    # -- internals -------------------------------------------------------------------------------

    def _lookup(self, key: tuple[str, str]) -> float | None:
        if key in self._memory:
            return self._memory[key]
        if self._disk is not None:
            value = self._disk.get(*key)
            if value is not None:
                self._memory[key] = value
            return value
        return None

    def _record(self, tasks: dict[int, tuple[str, str]], results: dict[int, tuple[float, bool]]) -> None:
        """Cache judged pairs: all in memory, only real verdicts (not timeouts/crashes) on disk."""
        if not self.cache:
            return
        if self.max_cached is not None and len(self._memory) + len(results) > self.max_cached:
            self._memory.clear()
        durable = []
        for task_id, (score, durable_ok) in results.items():
            self._memory[tasks[task_id]] = score
            if durable_ok:
                durable.append((*tasks[task_id], score))
        if self._disk is not None:
            self._disk.put_many(durable)

    def _drive(
        self, tasks: dict[int, tuple[str, str]], queue: deque[int], results: dict[int, tuple[float, bool]]
    ) -> None:
        """Feed queued tasks to idle workers until all are answered (and all workers are ready).

        ``results[task_id] = (score, durable)``; ``durable`` is False for timeouts and crashes.
        """
        while queue or any(w.state != "idle" for w in self._workers):
            for w in self._workers:
                if w.state == "idle" and queue:
                    task_id = queue.popleft()
                    if not self._submit(w, task_id, *tasks[task_id]):
                        queue.appendleft(task_id)  # worker died while idle: not the sample's fault
            pending = [w for w in self._workers if w.state != "idle"]
            if not pending:
                continue
            budget = max(0.0, min(w.deadline for w in pending) - time.monotonic())
            ready = set(wait([w.conn for w in pending], timeout=budget))
            for w in pending:
                if w.conn in ready:
                    self._receive(w, results)
            now = time.monotonic()
            for w in pending:
                if w.state in ("starting", "busy") and now >= w.deadline and w.conn not in ready:
                    self._on_timeout(w, results)

    def _submit(self, w: _Worker, task_id: int, answer: str, gold: str) -> bool:
        try:
            w.submit(task_id, answer, gold, self.timeout_s)
            return True
        except (OSError, ValueError):
            self._replace(w)
            return False

    def _receive(self, w: _Worker, results: dict[int, tuple[float, bool]]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):  # the worker died
            if w.state == "starting":
                raise RuntimeError(f"reward worker failed to start (exit code {w.process.exitcode})")
            self._stats["n_crashes"] += 1
            self._fail_task(w, results)
            return
        if msg == _READY:
            w.state = "idle"
            return
        task_id, score, ok = msg
        self._stats["n_judged"] += 1
        self._stats["n_errors"] += int(not ok)
        results[task_id] = (score, True)
        w.state, w.task = "idle", None

    def _on_timeout(self, w: _Worker, results: dict[int, tuple[float, bool]]) -> None:
        if w.state == "starting":
            w.kill()
            raise RuntimeError(f"reward worker not ready after {STARTUP_TIMEOUT_S:.0f} s")
        self._stats["n_timeouts"] += 1
        self._fail_task(w, results)

    def _fail_task(self, w: _Worker, results: dict[int, tuple[float, bool]]) -> None:
        assert w.task is not None
        self._stats["n_judged"] += 1
        results[w.task] = (self.spec.failure, False)
        self._replace(w)

    def _replace_busy_workers(self) -> None:
        for w in list(self._workers):
            if w.state == "busy":
                self._replace(w)

    def _replace(self, w: _Worker) -> None:
        """Kill ``w`` and put a fresh worker in its slot (it becomes usable once ready)."""
        w.kill()
        fresh = _Worker.start(self._ctx, self.reward)
        self._workers[self._workers.index(w)] = fresh
        self._stats["n_worker_restarts"] += 1
