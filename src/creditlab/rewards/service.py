"""A process-wide, thread-safe reward service: callers on any thread score through one RewardScorer on its own thread.

Why a service: verl 0.9.1's reward-loop managers call a synchronous ``compute_score`` through
``loop.run_in_executor``, i.e. on worker threads of the event loop's default executor
(``verl/experimental/reward_loop/reward_manager/dapo.py`` l. 84-93, ``naive.py`` l. 75-84). There, math-verify's
own timeout (``signal.alarm``) raises ``ValueError: ... doesn't support threaded environment``, and without it
nothing stops an answer that hangs the judge (``\\boxed{9^{9^{9^9}}}``: C-level big-number arithmetic, which no
signal interrupts either). :class:`~creditlab.rewards.scorer.RewardScorer` is the one hang-proof judge (worker
processes, a hard per-sample wall-clock timeout, SIGKILL and replace), but it is not thread-safe, and its workers
die with the *thread* that started them (PR_SET_PDEATHSIG). So :class:`RewardService` gives it one owner: a daemon
thread that starts the scorer's workers and then serves a queue; a caller, on any thread, hands over its
``(response, gold)`` pairs and blocks on a future until the owner has scored them.

* Batching: the owner takes every request waiting in the queue and scores them in one
  :meth:`RewardScorer.score` call, so concurrent callers (verl scores the samples of a batch concurrently) are
  judged in parallel on the scorer's workers and share its cache.
* Bounded: a caller waits for at most the batch in progress and its own batch; a sample judged past
  ``timeout_s`` (or whose worker crashes) scores the reward's failure value (0.0 for ``math_verify``) and its
  worker is replaced. A scorer error (a worker that cannot start) is raised in every caller of that batch, and
  the owner starts a fresh scorer for the next one.
* One service per ``(reward, timeout_s, n_workers)`` per process (:func:`reward_service`), started on first use,
  closed at interpreter exit; a forked child starts its own (the parent's owner thread is not inherited).

Defaults [ours]: :data:`DEFAULT_TIMEOUT_S` = 10 s, the paper scale's ``trainer.reward_timeout_s``
(``configs/scale/paper.yaml``), for callers that have no run config; :data:`DEFAULT_N_WORKERS` = 2 worker
processes per service (verl starts ``reward.num_workers`` reward-loop processes, 8 by default, each with its own
service: 16 judges per run; a judge call takes milliseconds and most samples are cache hits).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from creditlab.rewards.scorer import RewardScorer

DEFAULT_TIMEOUT_S = 10.0
"""Per-sample timeout (seconds) of a service whose caller has no run config [ours: paper.yaml's reward_timeout_s]."""
DEFAULT_N_WORKERS = 2
"""Judge processes per service [ours]."""
MAX_CACHED = 200_000
"""Memory cache bound of a service's scorer (``RewardScorer(max_cached=...)``): a training run is long."""
_JOIN_S = 5.0  # how long close() waits for the owner thread (it may be judging a sample that will time out)


@dataclass(eq=False)
class _Request:
    responses: list[str]
    golds: list[str]
    future: Future = field(default_factory=Future)


class RewardService:
    """Score ``(response, gold)`` pairs from any thread with a :class:`RewardScorer` owned by one daemon thread.

    Args:
        reward: registered reward name (``"math_verify"``, ``"dapo_answer"``, ...).
        timeout_s: the scorer's hard per-sample wall-clock timeout.
        n_workers: the scorer's worker processes.
        start_method: the scorer's start method (``"spawn"``: see :mod:`creditlab.rewards.scorer`).

    The constructor returns once the workers are ready (it raises what starting them raised).
    """

    def __init__(
        self,
        reward: str = "math_verify",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        n_workers: int = DEFAULT_N_WORKERS,
        start_method: str = "spawn",
    ) -> None:
        self.reward, self.timeout_s = reward, float(timeout_s)
        self.n_workers, self.start_method = n_workers, start_method
        self._scorer = self._new_scorer()  # validates the arguments here, in the caller
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        ready: Future = Future()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name=f"creditlab-reward-{reward}", daemon=True
        )
        self._thread.start()
        try:
            ready.result()
        except BaseException:
            self._closed = True
            raise

    # -- public API ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the workers failed to start)."""
        return self._closed

    @property
    def stats(self) -> dict[str, float]:
        """The scorer's counters (:attr:`RewardScorer.stats`: ``n_timeouts``, ``n_worker_restarts``, ...)."""
        return self._scorer.stats

    def score(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]:
        """Scores of ``responses`` against ``golds``; blocks until the owner thread has judged them.

        Raises:
            RuntimeError: the service is closed.
            ValueError: the two lists differ in length.
        """
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        request = _Request([str(r) for r in responses], [str(g) for g in golds])
        with self._lock:  # a request is either queued before close()'s stop marker, or refused
            if self._closed:
                raise RuntimeError(f"reward service {self.reward!r} is closed")
            self._requests.put(request)
        return request.future.result()

    def score_one(self, response: str, gold: str) -> float:
        """The score of one response (:meth:`score`)."""
        return self.score([response], [gold])[0]

    def close(self) -> None:
        """Answer the queued requests, stop the workers and the owner thread (waits up to a few seconds). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._requests.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_JOIN_S)

    # -- owner thread ----------------------------------------------------------------------------

    def _new_scorer(self) -> RewardScorer:
        return RewardScorer(
            self.reward,
            timeout_s=self.timeout_s,
            n_workers=self.n_workers,
            start_method=self.start_method,
            max_cached=MAX_CACHED,
        )

    def _serve(self, ready: Future) -> None:
        """The owner thread: start the workers, then score queued requests in batches until the stop marker."""
        try:
            self._scorer.open()
        except BaseException as err:  # noqa: BLE001 - handed to the constructor's caller
            self._scorer.close()
            ready.set_exception(err)
            return
        ready.set_result(None)
        try:
            stop = False
            while not stop:
                batch = [self._requests.get()]
                while True:
                    try:
                        batch.append(self._requests.get_nowait())
                    except queue.Empty:
                        break
                stop = any(r is None for r in batch)
                self._answer([r for r in batch if r is not None])
        finally:
            self._scorer.close()

    def _answer(self, batch: list[_Request]) -> None:
        if not batch:
            return
        responses = [r for req in batch for r in req.responses]
        golds = [g for req in batch for g in req.golds]
        try:
            scores = self._scorer.score(responses, golds)
        except Exception as err:  # noqa: BLE001 - every waiting caller gets it; the next batch gets a fresh scorer
            for req in batch:
                req.future.set_exception(err)
            self._scorer.close()
            self._scorer = self._new_scorer()
            return
        start = 0
        for req in batch:
            req.future.set_result(scores[start : start + len(req.responses)])
            start += len(req.responses)


# ----------------------------------------------------------------------------------------------
# The process-wide services
# ----------------------------------------------------------------------------------------------

_SERVICES: dict[tuple[str, float, int], RewardService] = {}
_SERVICES_LOCK = threading.Lock()


def reward_service(
    reward: str = "math_verify", timeout_s: float = DEFAULT_TIMEOUT_S, n_workers: int = DEFAULT_N_WORKERS
) -> RewardService:
    """This process's :class:`RewardService` for ``(reward, timeout_s, n_workers)``, started on first use."""
    key = (reward, float(timeout_s), int(n_workers))
    with _SERVICES_LOCK:
        service = _SERVICES.get(key)
        if service is None or service.closed:
            service = _SERVICES[key] = RewardService(reward, timeout_s=timeout_s, n_workers=n_workers)
        return service


def close_services() -> None:
    """Close every service of this process (at interpreter exit; tests). Later calls start fresh ones."""
    with _SERVICES_LOCK:
        services = list(_SERVICES.values())
        _SERVICES.clear()
    for service in services:
        service.close()


def _forget_services_in_child() -> None:
    """After a fork: the parent's owner threads do not exist here; start fresh services on first use."""
    global _SERVICES_LOCK
    _SERVICES.clear()
    _SERVICES_LOCK = threading.Lock()


atexit.register(close_services)
os.register_at_fork(after_in_child=_forget_services_in_child)
