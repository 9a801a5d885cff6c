"""The timeout guard: `time_limit(seconds)` raises `VerifyTimeout` in the thread that overran.

Math-Verify's own guard uses SIGALRM, which works only in the main thread, so it is switched
off and replaced by this one: one watchdog thread per process raises the exception *in the
thread that overran* (`PyThreadState_SetAsyncExc`). It works in any thread of any process
(main or not, pool workers, verl/TRL reward threads) and costs microseconds per call; like a
signal it is delivered between bytecodes, so it stops runaway sympy loops
(`\\prod_{k=1}^{10^9} k`) but not one long C call (the process pool's hard limit covers that).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import math
import os
import threading
import time
from typing import Any, Optional


class VerifyTimeout(BaseException):
    """Raised inside a thread whose `time_limit` expired.

    A BaseException so that sympy's broad `except Exception` handlers cannot swallow it.
    """


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def _thread_cpu_clock(thread_id: int) -> Optional[int]:
    """The CPU-time clock of a thread (Linux), so limits measure work rather than machine load."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return None


class _Deadline:
    __slots__ = ("limit", "thread_id", "clock", "cpu_start", "wall_start", "when", "seq", "done", "fired", "deciding")

    def __init__(self, limit: float, thread_id: int, seq: int) -> None:
        self.limit = limit
        self.thread_id = thread_id
        self.clock = _thread_cpu_clock(thread_id)
        self.cpu_start = time.clock_gettime(self.clock) if self.clock is not None else 0.0
        self.wall_start = time.monotonic()
        self.when = self.wall_start + limit  # CPU time never runs ahead of wall time: first check then
        self.seq = seq
        self.done = False
        self.fired = False
        self.deciding = threading.Lock()  # held by the watchdog while it decides; by the owner once done

    def used(self) -> float:
        if self.clock is not None:
            try:
                return time.clock_gettime(self.clock) - self.cpu_start
            except OSError:
                pass
        return time.monotonic() - self.wall_start

    def __lt__(self, other: _Deadline) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class _Watchdog:
    """One daemon thread per process that raises VerifyTimeout in threads that overran their limit.

    Protocol with the guarded thread (`disarm`): the owner sets `done` and then takes the
    deadline's `deciding` lock for good; the watchdog only fires while holding that lock
    (taken without blocking) and only if `done` is unset. So once `disarm` has the lock,
    no exception can be fired any more, and one fired earlier but not yet raised is
    cleared, so a timeout never escapes the guarded block.
    """

    TICK_S = 0.05  # checks are rounded to this grid: few wake-ups however many calls are made

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[_Deadline] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def arm(self, seconds: float) -> _Deadline:
        deadline = _Deadline(seconds, threading.get_ident(), next(self._seq))
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="repexp-verify-watchdog", daemon=True)
                self._thread.start()
            first = not self._heap or deadline < self._heap[0]
            heapq.heappush(self._heap, deadline)
            if first:
                self._cond.notify()
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        deadline.done = True
        deadline.deciding.acquire()  # waits only while the watchdog is mid-decision (microseconds)
        if deadline.fired:
            _set_async_exc(deadline.thread_id, ctypes.py_object())  # NULL: drop a not-yet-raised timeout

    def _decide(self, deadline: _Deadline) -> Optional[_Deadline]:
        """Fire, drop, or return the deadline to check again later."""
        if not deadline.deciding.acquire(blocking=False):
            return None  # its owner is disarming it
        try:
            if deadline.done:
                return None
            used = deadline.used()
            if used >= deadline.limit:
                deadline.fired = True
                _set_async_exc(deadline.thread_id, ctypes.py_object(VerifyTimeout))
                return None
            deadline.when = time.monotonic() + (deadline.limit - used)
            return deadline
        finally:
            deadline.deciding.release()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                now = time.monotonic()
                head = self._heap[0].when
                if head > now:
                    wake = math.ceil(head / self.TICK_S) * self.TICK_S
                    self._cond.wait(timeout=max(wake - now, 0.0))
                    continue
                due = []
                while self._heap and self._heap[0].when <= now:
                    due.append(heapq.heappop(self._heap))
                for deadline in due:
                    again = self._decide(deadline)
                    if again is not None:
                        heapq.heappush(self._heap, again)

    def reset_after_fork(self) -> None:
        self.__init__()


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.reset_after_fork)


class time_limit:
    """`with time_limit(seconds):` raises VerifyTimeout in this thread after `seconds` of its CPU time.

    Works in any thread. CPU time (not wall time) so a busy machine does not turn slow
    but legitimate comparisons into timeouts; where a thread CPU clock is unavailable,
    wall time is used. Python-level work is interrupted between bytecodes; a single long
    C call only when it returns (the process pool's wall-clock hard limit covers that).
    `seconds=None` or <= 0 disables the guard.
    """

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self._deadline: Optional[_Deadline] = None

    def __enter__(self) -> time_limit:
        if self.seconds is not None and self.seconds > 0:
            self._deadline = _WATCHDOG.arm(float(self.seconds))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._deadline is not None:
            _WATCHDOG.disarm(self._deadline)

