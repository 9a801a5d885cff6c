"""Process pool for Math-Verify work: `ProcessPool`, under `repexp.verify.scoring.VerifierPool`.

`ProcessPool` is a chunked pool with per-item progress and a hard per-item wall-clock limit: a
worker that sends nothing for `hard_timeout` seconds (stuck in one C call, which the in-thread
watchdog of `repexp.verify.timeout` cannot interrupt) is killed and replaced; its current item
gets `stuck_value`, the rest of its chunk is re-queued.

The pool uses the `spawn` start method (safe next to torch/CUDA threads), so scripts
that call `score_batch` with workers > 1 need an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

logger = logging.getLogger("repexp.verify")


class _Worker:
    def __init__(self, process: Any, conn: Any) -> None:
        self.process = process
        self.conn = conn
        self.ready = False
        self.inflight: collections.deque = collections.deque()  # indices sent, not yet answered
        self.last_progress = time.monotonic()


def _worker_loop(conn: Any, fn: Callable[[Any], Any], initializer: Optional[Callable[[], Any]]) -> None:
    # Pool workers must not inherit the parent's SIGINT handling of a Ctrl-C: the parent cleans up.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer()
    conn.send(("ready", None, None))
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for index, item in chunk:
            try:
                conn.send(("result", index, fn(item)))
            except Exception as err:  # reported to the parent, which raises it with the item
                conn.send(("error", index, f"{type(err).__name__}: {err}"))


class ProcessPool:
    """See the module docstring; `fn(item)` runs in the workers (it must be picklable by reference)."""

    START_TIMEOUT_S = 120.0  # a spawned worker must import and warm up within this

    def __init__(self, fn: Callable[[Any], Any], workers: int, *, hard_timeout: float, stuck_value: Any = 0.0,
                 initializer: Optional[Callable[[], Any]] = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.fn, self.workers, self.initializer = fn, workers, initializer
        self.hard_timeout = hard_timeout
        self.stuck_value = stuck_value
        self._ctx = multiprocessing.get_context("spawn")  # safe next to torch/CUDA threads
        self._pool: list[_Worker] = []
        self.killed = 0  # workers killed for being stuck (reported by benchmarks/tests)

    def _limit(self, worker: _Worker) -> float:
        return self.hard_timeout if worker.ready else self.START_TIMEOUT_S

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_loop, args=(child_conn, self.fn, self.initializer), daemon=True,
                                    name="repexp-verify-worker")
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _kill(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()

    def map(self, items: Sequence[Any], chunk_size: int = 64) -> list[Any]:
        results: list[Any] = [None] * len(items)
        done = [False] * len(items)
        remaining = len(items)
        queue: collections.deque = collections.deque(
            list(range(i, min(i + chunk_size, len(items)))) for i in range(0, len(items), chunk_size)
        )
        while len(self._pool) < min(self.workers, len(queue)):
            self._pool.append(self._spawn())
        while remaining:
            now = time.monotonic()
            for worker in self._pool:
                if worker.ready and not worker.inflight and queue:
                    chunk = queue.popleft()
                    worker.conn.send([(i, items[i]) for i in chunk])
                    worker.inflight.extend(chunk)
                    worker.last_progress = now
            busy = [w for w in self._pool if w.inflight or not w.ready]
            limits = [w.last_progress + self._limit(w) for w in busy]
            wait_s = max(0.0, min(limits) - now) if limits else 0.1
            ready_conns = multiprocessing.connection.wait([w.conn for w in busy], timeout=wait_s)
            for worker in busy:
                if worker.conn not in ready_conns:
                    continue
                try:
                    while worker.conn.poll():
                        kind, index, payload = worker.conn.recv()
                        worker.last_progress = time.monotonic()
                        if kind == "ready":
                            worker.ready = True
                            continue
                        if kind == "error":
                            raise RuntimeError(f"verifier worker failed on item {items[index]!r:.300}: {payload}")
                        worker.inflight.popleft()
                        if not done[index]:
                            results[index], done[index] = payload, True
                            remaining -= 1
                except (EOFError, OSError):
                    self._replace(worker, queue, results, done, reason="died")
                    remaining = len(items) - sum(done)
            now = time.monotonic()
            for worker in list(self._pool):
                limit = self._limit(worker)
                if (worker.inflight or not worker.ready) and now - worker.last_progress > limit:
                    if not worker.ready:
                        raise RuntimeError(f"verifier worker did not start within {limit:.0f}s")
                    self._replace(worker, queue, results, done, reason=f"made no progress for {limit:.1f}s")
                    remaining = len(items) - sum(done)
        return results

    def _replace(self, worker: _Worker, queue: collections.deque, results: list, done: list, *, reason: str) -> None:
        """Kill `worker`; its current item scores `stuck_value`, the rest of its chunk is re-queued."""
        self._kill(worker)
        self.killed += 1
        if worker.inflight:
            stuck = worker.inflight.popleft()
            if not done[stuck]:
                results[stuck], done[stuck] = self.stuck_value, True
                logger.warning("verifier worker %s on an item; killed it and scored the item %r", reason,
                               self.stuck_value)
            if worker.inflight:
                queue.appendleft(list(worker.inflight))
        self._pool[self._pool.index(worker)] = self._spawn()

    def close(self) -> None:
        for worker in self._pool:
            try:
                worker.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for worker in self._pool:
            worker.process.join(timeout=2)
            self._kill(worker)
        self._pool = []


def default_workers() -> int:
    """CPUs this process may use (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
