"""Walltime chunks: a training job ends itself, with a checkpoint, before its allocation does.

The budget of a training run is its steps (`train.total_steps`, the same for every arm). On SLURM
one allocation (`resources.train.runtime`, sbatch `--time`) is only a *chunk* of that budget:

    repexp run train (the node)                       the trainer (TRL or verl)
    ─────────────────────────                     ─────────────────────────
    allocation_end()  ── SLURM's EndTime ──►      ChunkClock(deadline = end − walltime_margin)
                                                  after every step: ends_chunk()?
                                                    yes → save a complete checkpoint, write
                                                          CHUNK_END {"step"}, return without DONE
    CHUNK_END found → MLflow run ends KILLED,
    tagged; requeue() = `scontrol requeue`  ──►   SLURM starts the same job id again with a fresh
                                                  allocation; the trainer resumes from that
                                                  checkpoint (the usual resume path)

A requeue rather than a Snakemake retry: the number of chunks then follows from the steps left,
with no retry count to estimate in advance, and a chunk end takes the same path as a preemption
(SLURM requeues a preempted job itself; jobs are submitted with `--requeue`, docs/slurm.md).
Where the requeue is refused (a cluster that forbids it), `repexp run train` exits with
`CHUNK_EXIT_STATUS` and Snakemake's `retries` of the train rule start the next chunk instead.

Pure: no framework imports; SLURM is asked through its command-line clients only.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from repexp import layout
from repexp.io import read_json, write_json_atomic

# `repexp run train` after a chunk whose requeue SLURM refused (EX_TEMPFAIL: "try again"): Snakemake
# counts it as a failed attempt and its retries run the next chunk.
CHUNK_EXIT_STATUS = 75
# How long `repexp run train` waits to be stopped by its own requeue before it gives up and exits.
REQUEUE_WAIT_S = 300
SLURM_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # squeue's %e (local time)


def allocation_end(env: Mapping[str, str] = os.environ) -> Optional[float]:
    """When this SLURM job's allocation ends (epoch seconds); None outside SLURM or without a limit.

    `SLURM_JOB_END_TIME` where SLURM exports it (23.02 and later), else `squeue -o %e`, which
    also reflects a time limit changed after submission."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    exported = env.get("SLURM_JOB_END_TIME", "").strip()
    if exported.isdigit() and int(exported) > 0:
        return float(exported)
    listed = _slurm_output(["squeue", "--noheader", "--jobs", job_id, "--format=%e"])
    return None if listed is None else parse_slurm_time(listed.strip())


def restart_count(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """How often SLURM requeued this job (0 in its first allocation); None outside SLURM.

    From `scontrol show job` (`Restarts=`): Snakemake's jobstep strips `SLURM_RESTART_COUNT`
    from the environment of the rule's command."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    found = re.search(r"\bRestarts=(\d+)", _slurm_output(["scontrol", "show", "job", job_id]) or "")
    return int(found.group(1)) if found else None


SLURM_QUERY_TRIES = 5  # a busy slurmctld refuses a client now and then ("Socket timed out"): ask again
SLURM_QUERY_PAUSE_S = 2.0


def _slurm_output(command: list[str]) -> Optional[str]:
    """A SLURM client's stdout; None when it is missing, or still hangs or fails after SLURM_QUERY_TRIES."""
    for attempt in range(SLURM_QUERY_TRIES):
        if attempt:
            time.sleep(SLURM_QUERY_PAUSE_S)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            return None  # no SLURM client on this host: asking again changes nothing
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return proc.stdout
    return None


def parse_slurm_time(text: str) -> Optional[float]:
    """squeue's local `YYYY-MM-DDTHH:MM:SS` as epoch seconds; None for N/A, Unknown, UNLIMITED."""
    try:
        return time.mktime(time.strptime(text, SLURM_TIME_FORMAT))
    except ValueError:
        return None


def chunk_deadline(end: Optional[float], margin_minutes: float) -> Optional[float]:
    """The time by which a chunk's last checkpoint must be complete: `margin_minutes` before the end."""
    return None if end is None else end - 60.0 * margin_minutes


@dataclass
class ChunkClock:
    """Decides, at the end of each training step, whether the next one still fits before `deadline`.

    The cost of a step is the longest interval between two step ends seen so far in this chunk
    (it includes the validations and scheduled saves in between); a chunk-end save is assumed to
    cost as much as the longest save seen, or as a step before any was seen. The first step of a
    chunk is always trained: a chunk never ends without progress."""

    deadline: Optional[float]  # epoch seconds; None: no walltime, chunks never end
    longest_step_s: float = 0.0
    longest_save_s: Optional[float] = None
    last_step_end: float = field(default_factory=time.time)

    def start(self, now: Optional[float] = None) -> None:
        """Training begins (after start-up): the first step is measured from here."""
        self.last_step_end = time.time() if now is None else now

    def step_ended(self, now: Optional[float] = None) -> None:
        now = time.time() if now is None else now
        self.longest_step_s = max(self.longest_step_s, now - self.last_step_end)
        self.last_step_end = now

    def save_took(self, seconds: float) -> None:
        self.longest_save_s = max(self.longest_save_s or 0.0, seconds)

    def ends_chunk(self, now: Optional[float] = None) -> bool:
        """Whether to save and stop now: another step and a save would not end before the deadline."""
        if self.deadline is None:
            return False
        now = time.time() if now is None else now
        save = self.longest_step_s if self.longest_save_s is None else self.longest_save_s
        return now + self.longest_step_s + save >= self.deadline


def write_chunk_end(run_dir: str | Path, step: int, deadline: Optional[float]) -> None:
    """The trainer's note that it stopped at `step` (checkpoint complete) for the walltime."""
    write_json_atomic(Path(run_dir) / layout.CHUNK_END, {"step": step, "deadline": deadline, "at": time.time()})


def read_chunk_end(run_dir: str | Path) -> Optional[dict]:
    path = Path(run_dir) / layout.CHUNK_END
    return read_json(path) if path.exists() else None


def requeue(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """Ask SLURM to requeue this job (it is stopped and starts again with a fresh allocation).
    Returns None when SLURM accepted, else why not."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return "not a SLURM job"
    try:
        proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scontrol requeue {job_id}: {err}"
    if proc.returncode:
        return f"scontrol requeue {job_id} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
    return None
