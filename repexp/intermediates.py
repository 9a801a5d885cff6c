"""The files between jobs: their content identity, and whether the jobs about to run can read what
they need (issue 27, item 3). Standard library only (and the stdlib-only repexp.layout, repexp.io): the
Snakefile calls it while it is parsed and in `onstart`, before any job, on the submit host.

    record_content(path)      a producer (repexp model, repexp download model, repexp data prepare), after
                              writing its output: the content's SHA-256 in a sidecar beside it
    settle(paths)             every workflow start: a rebuild whose content did not change gets back the
                              modification time the jobs made from it were built against
    check_pending(jobs, ...)  onstart: the reruns of finished jobs that only a deleted intermediate
                              causes, and pointers to missing files (select.json -> checkpoint,
                              merged.json -> merged model); problems as messages, and the workflow stops
    pending_jobs(dag)         the adapter: Snakemake's DAG of the run about to start as `Pending` records

Why (docs/pipeline.md, docs/reliability.md). Snakemake judges "outdated" by modification time and
compares contents only of files up to 1 MB, never of a directory, so a model directory deleted and
rebuilt byte for byte is newer than every training made from it, and all of them rerun. The sidecar
`.<name>.content.json` (not a Snakemake output, so it outlives the output) keeps the digest and the
time the jobs downstream were built against; a rebuild with the same digest gets that time back at
the next start (on a directory, on `.snakemake_timestamp`, which Snakemake reads for its time).
Snakemake also reruns, before any job, everything downstream of a job it reruns, so `check_pending`
stops such a run and names the command that rebuilds the missing file alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Optional

from repexp import layout
from repexp.io import write_json_atomic

SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"  # Snakemake's carrier of a directory output's time
CHUNK = 1 << 20


# --------------------------------------------------------------------------- content identity


sidecar = layout.content_sidecar  # `<dir>/.<name>.content.json` beside the output `<dir>/<name>`


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob("*") if p.is_file() and p.name != SNAKEMAKE_TIMESTAMP),
                  key=lambda p: p.relative_to(path).as_posix())


def content_digest(path: str | os.PathLike) -> str:
    """SHA-256 over a file's bytes, or over a directory's files (relative path, size, bytes; not
    Snakemake's timestamp file), so a byte-identical rebuild has the same digest."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in _files(path):
        if path.is_dir():
            digest.update(f"{file.relative_to(path).as_posix()}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _signature(path: Path) -> Optional[str]:
    """A directory's files by name, size and modification time: the cheap check, at a workflow
    start, that nothing changed its content since it was hashed (Snakemake only touches the
    directory's timestamp file). None for a file, which Snakemake touches itself after its job:
    a file is hashed again instead (data splits: small)."""
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for file in _files(path):
        stat = file.stat()
        digest.update(f"{file.relative_to(path).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def read_sidecar(path: str | os.PathLike) -> Optional[dict]:
    try:
        entry = json.loads(sidecar(path).read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) else None


def record_content(path: str | os.PathLike) -> dict:
    """After a producer wrote `path`: its digest into the sidecar. The same digest as recorded before
    keeps the recorded `mtime` and marks the output `rebuilt` (the next start restores the time);
    another digest (or none before) leaves `mtime` to the next start, which takes the output's own."""
    path = Path(path)
    digest = content_digest(path)
    previous = read_sidecar(path) or {}
    same = previous.get("sha256") == digest and previous.get("mtime") is not None
    entry = {"sha256": digest, "kind": "directory" if path.is_dir() else "file",
             "signature": _signature(path), "mtime": previous["mtime"] if same else None, "rebuilt": same}
    write_json_atomic(sidecar(path), entry)
    return entry


def visible_mtime(path: Path) -> float:
    """The time Snakemake reads for an output: a directory's timestamp file when it has one."""
    stamp = path / SNAKEMAKE_TIMESTAMP
    return (stamp if path.is_dir() and stamp.exists() else path).stat().st_mtime


def _unchanged(path: Path, entry: dict) -> bool:
    if entry.get("kind") == "directory":
        return path.is_dir() and entry.get("signature") == _signature(path)
    return path.is_file() and content_digest(path) == entry["sha256"]


def settle(paths: Iterable[str | os.PathLike]) -> list[str]:
    """At a workflow start, for each output with a sidecar: a `rebuilt` one whose content is still the
    recorded one gets its recorded time back; otherwise the sidecar learns the output's current time.
    Returns a line per restored output. Missing outputs and unreadable sidecars are left alone."""
    restored = []
    for path in map(Path, paths):
        entry = read_sidecar(path)
        if entry is None or not path.exists():
            continue
        try:
            current = visible_mtime(path)
            if entry.get("rebuilt") and entry.get("mtime") is not None and _unchanged(path, entry):
                if current != entry["mtime"]:
                    carrier = path / SNAKEMAKE_TIMESTAMP if path.is_dir() else path
                    if carrier is not path:  # a directory's time is its timestamp file's
                        carrier.touch(exist_ok=True)
                    os.utime(carrier, (entry["mtime"], entry["mtime"]))
                    restored.append(f"{path}: rebuilt with the same content (sha256 {entry['sha256'][:12]}); "
                                    "its time is set back, so nothing made from it reruns")
                write_json_atomic(sidecar(path), {**entry, "rebuilt": False})
            elif entry.get("mtime") != current or entry.get("rebuilt"):
                write_json_atomic(sidecar(path), {**entry, "mtime": current, "rebuilt": False})
        except OSError:  # a read-only or vanished output: Snakemake's own times apply
            continue
    return restored


# --------------------------------------------------------------------------- pending jobs


@dataclass(frozen=True)
class Pending:
    """One job of the run about to start, as the check needs it (built from Snakemake's DAG by
    `pending_jobs`, or by hand in tests)."""

    key: int
    rule: str
    label: str  # "train gsm8k/trl_grpo_s42"
    outputs: tuple[str, ...]
    complete: bool  # every output exists: it ran before
    missing: bool  # pending because outputs are missing
    propagated: bool  # pending because a job upstream reruns
    other: bool  # any other reason: forced, params, code, input changed, newer input, ...
    upstream: tuple[int, ...] = ()  # keys of the pending jobs it reads from
    pointer: Optional[str] = None  # select.json / merged.json it reads (merge, eval of trained runs)


@dataclass
class Reruns:
    roots: list[Pending]  # rebuilds of deleted files, in the order they can be built
    finished: list[Pending]  # the finished jobs Snakemake would rerun only because of them


def needless_reruns(jobs: Sequence[Pending]) -> Reruns:
    """Finished jobs pending only because upstream jobs rerun, where every such chain starts at a job
    that reruns because an output of it is missing (a deleted intermediate) and for no other reason."""
    by_key = {job.key: job for job in jobs}
    graph = {job.key: [key for key in job.upstream if key in by_key] for job in jobs}
    order = [by_key[key] for key in TopologicalSorter(graph).static_order()]
    origin: dict[int, set[int]] = {}  # job -> the rebuilds its rerun comes from
    for job in order:
        upstream = [origin.get(key) for key in graph[job.key]]
        traced = bool(upstream) and all(source is not None for source in upstream)
        if job.missing and not job.other:
            origin[job.key] = {job.key}.union(*upstream) if traced else {job.key}
        elif job.complete and job.propagated and not job.other and traced:
            origin[job.key] = set().union(*upstream)
    finished = [job for job in jobs if job.key in origin and not job.missing]
    involved = set().union(*(origin[job.key] for job in finished)) if finished else set()
    return Reruns(roots=[job for job in order if job.key in involved], finished=finished)


def pointer_gaps(jobs: Sequence[Pending]) -> list[str]:
    """Pending jobs whose model pointer exists (its select/merge job is not rerun) but names a
    checkpoint or merged model that is gone: they would fail; nothing in the DAG can rebuild a
    deleted best-dev checkpoint short of training again."""
    rewritten = {path for job in jobs for path in job.outputs}
    problems = []
    for job in jobs:
        if not job.pointer or job.pointer in rewritten or not os.path.exists(job.pointer):
            continue
        try:
            pointer = json.loads(Path(job.pointer).read_text())
        except (OSError, ValueError):
            continue  # the job itself names an unreadable pointer
        key = "checkpoint_dir" if job.rule == "merge" else "model_path"
        target = pointer.get(key)
        if not target or os.path.exists(target):
            continue
        run_dir = pointer.get("run_dir") or str(Path(job.pointer).parent)
        checkpoint = pointer.get("checkpoint_dir")
        merged = key == "model_path" and pointer.get("backend") == "verl"
        if merged and checkpoint and os.path.exists(checkpoint):
            fix = f"merge it again from its checkpoint with --forcerun {job.pointer}"
        else:
            fix = (f"restore it, or train the run again with --forcerun {Path(run_dir) / layout.DONE} "
                   "(the finished run directory is moved to .superseded/ beside it, nothing is deleted)")
        what = "merged model" if merged else "checkpoint"
        problems.append(f"{job.pointer} names the {what} {target} (step {pointer.get('checkpoint_step', '?')}), "
                        f"which is missing; {job.label} would read it. To go on: {fix}.")
    return problems


def check_pending(jobs: Sequence[Pending], command: Sequence[str] = ("snakemake",),
                  targets: Iterable[str] = ()) -> list[str]:
    """The problems that stop a run before any job: messages, empty if none. `command` is the
    Snakemake command line of this run, `targets` its targets (for the commands the messages give)."""
    problems = pointer_gaps(jobs)
    options = _options(command, targets)
    reruns = needless_reruns(jobs)
    if reruns.finished:
        counts = Counter(job.rule for job in reruns.finished)
        listed = ", ".join(f"{rule} x{n}" for rule, n in sorted(counts.items()))
        gone = {root.key: [path for path in root.outputs if not os.path.exists(path)] for root in reruns.roots}
        missing = ", ".join(f"{' '.join(gone[root.key])} ({root.label})" for root in reruns.roots)
        alone = [shlex.join(["snakemake", *gone[root.key], *options]) for root in reruns.roots]
        them = "them" if len(reruns.roots) > 1 else "it"
        in_order = " (one command after the other)" if len(alone) > 1 else ""
        rules = " ".join(sorted({root.rule for root in reruns.roots}))
        problems.append(
            f"missing: {missing}. Rebuilding {them} in this run would make Snakemake rerun {len(reruns.finished)} "
            f"finished job(s) made from {them} ({listed}): a rebuilt file is new to Snakemake, whatever its content. "
            f"Rebuild {them} alone first{in_order}:\n      " + "\n      ".join(alone)
            + "\n    then run this command again: a rebuild with the same content keeps every job made from it (its "
            f"time is set back at the next start). To rerun those jobs anyway, add --forcerun {rules}.")
    return problems


# Options that ask for reruns: not carried into the command that rebuilds a file alone
_FORCE_FLAGS = {"--forceall", "-F", "--forcetargets", "-f"}
_FORCE_LISTS = {"--forcerun", "-R"}  # followed by rule or file names


def _options(command: Sequence[str], targets: Iterable[str]) -> list[str]:
    """This run's command line without its program, its targets and its force options."""
    targets, options, skipping = set(targets), [], False
    for arg in list(command)[1:]:
        if skipping and not arg.startswith("-"):
            continue
        skipping = arg in _FORCE_LISTS
        if arg in targets or arg in _FORCE_FLAGS or skipping or arg.split("=")[0] in _FORCE_LISTS:
            continue
        options.append(arg)
    return options


# --------------------------------------------------------------------------- Snakemake adapter

# Reason fields (snakemake.jobs.Reason) other than "output missing" and "upstream reruns"
_OTHER_REASONS = ("updated_input", "incomplete_output", "forced", "noio", "nooutput", "pipe", "service",
                  "code_changed", "params_changed", "software_stack_changed", "input_changed",
                  "unfinished_queue_input")


def pending_jobs(dag) -> list[Pending]:
    """The jobs Snakemake's DAG will run, as `Pending` records (duck-typed: no Snakemake import)."""
    jobs = list(dag.needrun_jobs())
    keys = {id(job): number for number, job in enumerate(jobs)}
    records = []
    for job in jobs:
        reason = dag.reason(job)
        outputs = tuple(str(path) for path in job.output)
        wildcards = "/".join(str(value) for value in (getattr(job, "wildcards_dict", None) or {}).values())
        pointer = getattr(job.input, "pointer", None) if "pointer" in getattr(job.input, "keys", lambda: [])() else None
        records.append(Pending(
            key=keys[id(job)], rule=job.rule.name, label=f"{job.rule.name} {wildcards}".strip(), outputs=outputs,
            complete=bool(outputs) and all(os.path.exists(path) for path in outputs),
            missing=bool(reason.missing_output), propagated=bool(reason.updated_input_run),
            other=any(bool(getattr(reason, name, False)) for name in _OTHER_REASONS),
            upstream=tuple(keys[id(dep)] for dep in dag.dependencies[job] if id(dep) in keys),
            pointer=str(pointer) if pointer else None,
        ))
    return records
