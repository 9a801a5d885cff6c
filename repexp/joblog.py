"""A job's output, kept per execution, and the cause of its failure (standard library only).

Snakemake deletes a rule's `log:` before each attempt, and the rule's shell writes it anew
(`> {log} 2>&1`), so an attempt's output is gone once the next one starts. `repexp run --log {log}`
therefore copies everything this process and its children (the trainer) write to stdout and stderr
into `<name>.execution-<N>.log` beside the log (repexp.layout.execution_log), N being this job's
execution number: 1 + the highest such file's, so an attempt never overwrites another's log, even
where Snakemake's attempt number starts again (after `--unlock`). The node's MLflow run carries the
same number (`repexp.execution`) and the file's path (`repexp.log`).

The last 64 KiB of that output also stay in memory: when a child fails, `cause()` finds the last
line of its last Python traceback (`OSError: [Errno 28] No space left on device`) even where the
disk was too full to write the log, and the node records it as the failure's cause.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Optional

from repexp import layout

TAIL_BYTES = 64 * 1024
JOIN_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 5.0  # at most this long for the pumps to read what a child left in the pipes
DRAIN_SETTLE_S = 0.05  # nothing new for this long: everything written so far has been read
TRACEBACK = "Traceback (most recent call last):"


class JobLog:
    """stdout and stderr of this process (file descriptors 1 and 2, inherited by children) routed
    through pipes: each goes on to where it went before and into the execution's log file."""

    def __init__(self, log: str | os.PathLike):
        self.log = Path(log)
        self.execution = max(layout.execution_logs(self.log), default=0) + 1
        self.path = layout.execution_log(self.log, self.execution)
        self._tail = bytearray()
        self._seen = 0  # bytes seen so far: `mark()` and `cause(since=)`
        self._lock = threading.Lock()
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        self._reads: list[int] = []  # the pipes' read ends, to see whether anything is still unread
        self._file = None

    def start(self) -> JobLog:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "xb", buffering=0)  # noqa: SIM115 - closed by stop()
        except OSError as err:  # a full disk: the output still goes where it went, and its tail is kept
            print(f"repexp: cannot write {self.path} ({err}); this execution's output is in {self.log} only",
                  file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd in (1, 2):
            read_end, write_end = os.pipe()
            self._saved[fd] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            self._reads.append(read_end)
            thread = threading.Thread(target=self._pump, args=(read_end, self._saved[fd]), daemon=True,
                                      name=f"joblog-{fd}")
            thread.start()
            self._threads.append(thread)
        return self

    def _pump(self, read_end: int, target: int) -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                with self._lock:  # first: `cause()` sees a chunk as soon as it has left the pipe
                    self._seen += len(chunk)
                    self._tail += chunk
                    del self._tail[:-TAIL_BYTES]
                for write in (lambda: os.write(target, chunk), lambda: self._file and self._file.write(chunk)):
                    try:
                        write()
                    except OSError:  # a full disk: keep reading, so the writer never blocks
                        pass

    def stop(self) -> None:
        """Back to the original stdout and stderr; the pipes close once no child holds them."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # the pipe's last write end here: its reader gets the rest, then its end
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT_S)
        for saved in self._saved.values():
            os.close(saved)
        self._saved.clear()
        if self._file is not None:
            self._file.close()

    def _drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Wait until the pumps have read everything written so far (a child that just exited may have
        left its last lines in a pipe): nothing unread in any pipe, and nothing new for a moment."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = self._seen
            if not any(_unread(fd) for fd in self._reads):
                time.sleep(DRAIN_SETTLE_S)
                if self._seen == seen and not any(_unread(fd) for fd in self._reads):
                    return
            else:
                time.sleep(DRAIN_SETTLE_S / 5)

    def mark(self) -> int:
        """A position in the output, for `cause(since=...)`."""
        self._drain()
        with self._lock:
            return self._seen

    def cause(self, since: int = 0) -> Optional[str]:
        """The exception line of the last Python traceback written after `since`, or None."""
        self._drain()
        with self._lock:
            start = max(0, len(self._tail) - (self._seen - since))
            text = bytes(self._tail[start:]).decode("utf-8", "replace")
        return last_exception(text)


def _unread(fd: int) -> int:
    """Bytes waiting in a pipe (0 once it is closed)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def last_exception(text: str) -> Optional[str]:
    """The exception line (`OSError: [Errno 28] No space left on device`) of the last traceback in
    `text`: the first unindented line after its last "Traceback (most recent call last):"."""
    head, found, body = text.rpartition(TRACEBACK)
    if not found:
        return None
    for line in body.splitlines()[1:]:
        if line.strip() and not line[0].isspace():
            return line.strip()
    return None


_current: Optional[JobLog] = None


def start(log: str | os.PathLike) -> JobLog:
    """Route this process's output through a JobLog (see the module's docstring) until `stop()`."""
    global _current
    _current = JobLog(log).start()
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None


def current() -> Optional[JobLog]:
    """The JobLog of this process (`repexp run --log`), or None."""
    return _current
