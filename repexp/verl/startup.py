"""Where a verl training's start-up goes: marks appended by each process, turned into phase durations.

verl 0.9.1 builds a run one piece after another: imports, Ray, the TaskRunner actor, TransferQueue, the
trainer's tokenizer and data, the actor worker (FSDP model, then RepExp's frozen representation model),
the reward workers and vLLM replicas, the agent-loop workers, then the first validation and the first
step. Each process appends ``{"mark": name, "t": epoch seconds, "pid": pid}`` to the file named by
``REPEXP_STARTUP_LOG`` (set by `repexp.verl.train` before Ray starts; Ray workers on the node inherit
it; without it `mark` does nothing). `phases` is pure: the time from each present mark to the next one
in `MARKS` order, so a mark a process never wrote (no frozen model for GRPO, a worker on another node)
folds its phase into the next one. `repexp.verl.train` writes the result to ``<run_dir>/startup.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

ENV = "REPEXP_STARTUP_LOG"
# when the node wrapper started the entry point's process (epoch seconds; `repexp.train.trainer_env`)
ENV_STARTED = "REPEXP_TRAINER_STARTED"

# (mark, what happened between the previous mark and this one), in the order a run passes them
MARKS: tuple[tuple[str, str], ...] = (
    ("process", "the entry point's process started"),
    ("imported", "imports of torch, Ray, Hydra and verl in the entry point"),
    ("task_runner", "ray.init and the TaskRunner actor (a new process importing verl)"),
    ("trainer", "the TaskRunner importing the trainer, printing the config, starting TransferQueue's actors"),
    ("data", "tokenizer, datasets and data loaders"),
    ("actor_begin", "the actor worker's process spawned and importing"),
    ("actor_fsdp", "the policy's FSDP wrap (weights, optimizer)"),
    ("actor_end", "RepExp's frozen representation model (absent for other methods)"),
    ("servers", "reward-loop workers, vLLM replicas (engine start, KV cache, CUDA graphs), weight sync"),
    ("agent_loop", "checkpoint resume and the agent-loop workers"),
    ("validation_begin", "the trainer's loggers (MLflow run attach)"),
    ("validation_end", "the first validation (dev rollouts and grading)"),
    ("first_step", "the first training step"),
)
# the run's own work starts at the first validation: everything before it is start-up
STARTUP_END = "validation_begin"


def mark(name: str) -> None:
    """Append one mark, now, to the log the environment names (a no-op without one)."""
    path = os.environ.get(ENV)
    if path:
        write_mark(Path(path), name, time.time())


def write_mark(path: Path, name: str, t: float) -> None:
    if name not in dict(MARKS):
        raise ValueError(f"unknown start-up mark {name!r}")
    with open(path, "a") as handle:  # one short line per write: processes append side by side
        handle.write(json.dumps({"mark": name, "t": t, "pid": os.getpid()}) + "\n")


def read_marks(path: Path) -> dict[str, float]:
    """Each mark's latest time (several ranks or a repeated call: the last one ends the phase)."""
    found: dict[str, float] = {}
    if not Path(path).exists():
        return found
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed process
            continue
        found[row["mark"]] = max(found.get(row["mark"], row["t"]), row["t"])
    return found


def phases(marks: dict[str, float]) -> list[dict]:
    """Seconds from each present mark to the next present one, in `MARKS` order."""
    present = [(name, what, marks[name]) for name, what in MARKS if name in marks]
    return [{"phase": name, "what": what, "seconds": round(t - previous, 3)}
            for (_, _, previous), (name, what, t) in zip(present, present[1:])]


def summary(marks: dict[str, float]) -> dict:
    """Phases plus the start-up total (process start to the first validation) and the time to the first
    step's end, as written to startup.json."""
    out: dict = {"phases": phases(marks)}
    if "process" in marks and STARTUP_END in marks:
        out["startup_s"] = round(marks[STARTUP_END] - marks["process"], 3)
    if "process" in marks and "first_step" in marks:
        out["to_first_step_s"] = round(marks["first_step"] - marks["process"], 3)
    return out


def table(rows: Iterable[dict]) -> str:
    """The phases as aligned text lines (printed by the entry point)."""
    return "\n".join(f"  {row['phase']:<17} {row['seconds']:8.1f} s  {row['what']}" for row in rows)
