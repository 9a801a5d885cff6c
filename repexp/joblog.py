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

import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from repexp import layout

TAIL_BYTES = 64 * 1024
JOIN_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 5.0  # at most this long for the pumps to read what a child left in the pipes
# written into both pipes by `_drain`: a pipe is first in, first out, so once a pump has read it, it has
# read everything written before it (a child that just exited included); never passed on
SENTINEL = b"\x00repexp-joblog-drained\x00"
TRACEBACK = "Traceback (most recent call last):"


class JobLog:
    """stdout and stderr of this process (file descriptors 1 and 2, inherited by children) routed
    through pipes: each goes on to where it went before and into the execution's log file."""

    def __init__(self, log: str | os.PathLike):
        self.log = Path(log)
        self.execution = max(layout.execution_logs(self.log), default=0) + 1
        self.path = layout.execution_log(self.log, self.execution)
        # per stream (1: stdout, 2: stderr): its last TAIL_BYTES and the bytes seen so far; a traceback is
        # read from stderr's alone, so stdout written at the same time never cuts into it
        self._tail = {1: bytearray(), 2: bytearray()}
        self._seen = {1: 0, 2: 0}
        self._lock = threading.Lock()
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        self._drained: list[threading.Event] = []  # one per pipe: its pump has read the last SENTINEL
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
            drained = threading.Event()
            self._drained.append(drained)
            thread = threading.Thread(target=self._pump, args=(fd, read_end, self._saved[fd], drained), daemon=True,
                                      name=f"joblog-{fd}")
            thread.start()
            self._threads.append(thread)
        return self

    def _pump(self, fd: int, read_end: int, target: int, drained: threading.Event) -> None:
        held = b""  # the end of a chunk that may be the start of a SENTINEL cut by the read
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                data = held + chunk
                found = SENTINEL in data
                data, held = _split_held(data.replace(SENTINEL, b""))
                self._take(fd, data, target)
                if found:
                    drained.set()  # after the bytes before it were taken: `cause()` sees them
            self._take(fd, held, target)

    def _take(self, fd: int, data: bytes, target: int) -> None:
        if not data:
            return
        with self._lock:  # first: `cause()` sees a chunk as soon as it has left the pipe
            self._seen[fd] += len(data)
            self._tail[fd] += data
            del self._tail[fd][:-TAIL_BYTES]
        for write in (lambda: os.write(target, data), lambda: self._file and self._file.write(data)):
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
        left its last lines in a pipe): a SENTINEL written into each pipe now comes out after them."""
        if not self._saved:  # stopped: the pumps read their pipes to the end before `stop` returned
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for drained in self._drained:
            drained.clear()
        for fd in self._saved:  # 1 and 2: the pipes' write ends while the log runs
            try:
                os.write(fd, SENTINEL)  # shorter than PIPE_BUF: one piece in the pipe
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for drained in self._drained:
            drained.wait(max(0.0, deadline - time.monotonic()))

    def mark(self) -> int:
        """A position in the output (stderr's), for `cause(since=...)`."""
        self._drain()
        with self._lock:
            return self._seen[2]

    def cause(self, since: int = 0) -> Optional[str]:
        """The exception line of the last Python traceback written after `since`, or None."""
        self._drain()
        with self._lock:
            start = max(0, len(self._tail[2]) - (self._seen[2] - since))
            text = bytes(self._tail[2][start:]).decode("utf-8", "replace")
        return last_exception(text)


def _split_held(data: bytes) -> tuple[bytes, bytes]:
    """(what can go on now, the end kept back because it may be a SENTINEL's start cut by the read)."""
    for size in range(min(len(SENTINEL) - 1, len(data)), 0, -1):
        if data.endswith(SENTINEL[:size]):
            return data[:-size], data[-size:]
    return data, b""


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
