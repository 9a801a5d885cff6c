"""Child processes that stop when their job is stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

# SLURM (walltime, preemption, scancel) and Snakemake stop a job with SIGTERM; Ctrl-C sends SIGINT.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (one owned by another user counts)."""
    try:
        with contextlib.suppress(PermissionError):  # another user's process
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def forwarding_signals(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """While inside, SIGTERM/SIGINT sent to this process go to `proc` instead (it decides how to stop)."""

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        yield proc
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_status(returncode: int) -> int:
    """A shell-style exit status: a child killed by signal N reports 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(what: str, status: int) -> str:
    """One wording for a failed command, whoever ran it: "`repexp eval` exited with status 143
    (SIGTERM)" (a shell-style status; a signal's name when it is 128 + N or a negative returncode)."""
    status = exit_status(status)
    name = next((sig.name for sig in signal.Signals if sig == status - 128), None)
    return f"{what} exited with status {status}" + (f" ({name})" if name else "")
