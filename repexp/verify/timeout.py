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


class _Deadline:
    __slots__ = ("limit", "thread_id", "clock", "cpu_start", "wall_start", "done", "fired", "deciding")

    def __init__(self, limit: float, thread_id: int) -> None:
        self.limit = limit
        self.thread_id = thread_id
        try:  # the thread's CPU-time clock (Linux), so limits measure work rather than machine load
            self.clock: Optional[int] = time.pthread_getcpuclockid(thread_id)
        except (AttributeError, OSError):
            self.clock = None
        self.cpu_start = time.clock_gettime(self.clock) if self.clock is not None else 0.0
        self.wall_start = time.monotonic()
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


class _Watchdog:
    """One daemon thread per process that raises VerifyTimeout in threads that overran their limit.

    Protocol with the guarded thread (`disarm`): the owner sets `done` and then takes the
    deadline's `deciding` lock for good; the watchdog only fires while holding that lock
    (taken without blocking) and only if `done` is unset. So once `disarm` has the lock,
    no exception can be fired any more, and one fired earlier but not yet raised is
    cleared, so a timeout never escapes the guarded block.
    """

    TICK_S = 0.05  # armed deadlines are checked on this grid: few wake-ups however many calls are made

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: set[_Deadline] = set()
        self._thread: Optional[threading.Thread] = None

    def arm(self, seconds: float) -> _Deadline:
        deadline = _Deadline(seconds, threading.get_ident())
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="repexp-verify-watchdog", daemon=True)
                self._thread.start()
            if not self._armed:
                self._cond.notify()
            self._armed.add(deadline)
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        deadline.done = True
        deadline.deciding.acquire()  # waits only while the watchdog is mid-decision (microseconds)
        if deadline.fired:
            _set_async_exc(deadline.thread_id, ctypes.py_object())  # NULL: drop a not-yet-raised timeout

    def _finished(self, deadline: _Deadline) -> bool:
        """Fire the deadline if it overran; True once it is fired or disarmed (dropped from the watch)."""
        if not deadline.deciding.acquire(blocking=False):
            return True  # its owner is disarming it
        try:
            if deadline.done:
                return True
            if deadline.used() < deadline.limit:
                return False
            deadline.fired = True
            _set_async_exc(deadline.thread_id, ctypes.py_object(VerifyTimeout))
            return True
        finally:
            deadline.deciding.release()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._armed:
                    self._cond.wait()
                self._cond.wait(timeout=self.TICK_S)
                self._armed = {deadline for deadline in self._armed if not self._finished(deadline)}

    def reset_after_fork(self) -> None:
        self.__init__()


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.reset_after_fork)


class time_limit:
    """`with time_limit(seconds):` raises VerifyTimeout in this thread after `seconds` of its CPU time.

    CPU time (not wall time) so a busy machine does not turn slow but legitimate comparisons into
    timeouts; wall time where a thread CPU clock is unavailable. `seconds=None` or <= 0 disables it.
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

