"""The files between jobs: their content identity, and whether the jobs about to run can read what
they need. Standard library only (and the stdlib-only repexp.layout, repexp.io): the
Snakefile calls it while it is parsed and in `onstart`, before any job, on the submit host.

    record_content(path)      a producer (repexp model, repexp download model, repexp data prepare), after
                              writing its output: the content's SHA-256 in a sidecar beside it
    settle(paths)             every workflow start: an output whose time changed but not its content (a
                              rebuild with the same bytes, a copy without times) gets back the
                              modification time the jobs made from it were built against
    check_pending(jobs, ...)  onstart: the reruns of finished jobs that only a deleted intermediate
                              causes, finished trainings that only new times of unchanged inputs would
                              retrain, and pointers to missing files (select.json -> checkpoint,
                              merged.json -> merged model); problems as messages, and the workflow stops
    pending_jobs(dag)         the adapter: Snakemake's DAG of the run about to start as `Pending` records

Why (docs/pipeline.md, docs/reliability.md). Snakemake judges "outdated" by modification time and
compares contents only of files up to 1 MB, never of a directory, so a model directory deleted and
rebuilt byte for byte, or a results directory copied without times (`cp -r`, `rsync` without `-t`:
every file touched one by one), is newer than the trainings made from it, and all of them rerun.
The sidecar `.<name>.content.json` (not a Snakemake output, so it outlives the output) keeps the
digest and the time the jobs downstream were built against; an output with the same digest gets
that time back at the next start (on a directory, on `.snakemake_timestamp`, which Snakemake reads
for its time).
Snakemake also reruns, before any job, everything downstream of a job it reruns, so `check_pending`
stops such a run and names the command that rebuilds the missing file alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
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
    another digest (or none before) leaves `mtime` to the next start, which takes the output's own.
    `produced` (now, after the output was written, before any job made from it started) stands in for
    `mtime` until that start: where the output was copied without times in between, no job made from
    it is older than that time. `inode` tells such a copy of a file (a new file) from Snakemake's own
    touch of its outputs after the job (the same file)."""
    path = Path(path)
    digest = content_digest(path)
    previous = read_sidecar(path) or {}
    same = previous.get("sha256") == digest and previous.get("mtime") is not None
    entry = {"sha256": digest, "kind": "directory" if path.is_dir() else "file", "signature": _signature(path),
             "mtime": previous["mtime"] if same else None, "rebuilt": same, "produced": time.time(),
             "inode": path.stat().st_ino}
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


def _same_content(path: Path, entry: dict) -> bool:
    """Whether `path` still holds the recorded content, whatever its files' times: a directory whose
    signature (names, sizes, times) changed is hashed again (a copy without times changes every time)."""
    if entry.get("kind") == "directory" and path.is_dir() and entry.get("signature") == _signature(path):
        return True
    return content_digest(path) == entry["sha256"]


def _times_moved(path: Path, entry: dict, current: float) -> bool:
    """Whether the output's times are no longer those of its production: its time is not the recorded
    one, or, before any start recorded one, it was copied since its producer hashed it (a directory's
    files' times changed: its signature; a file is another file: its inode). Snakemake touches every
    output right after its job, so a file's own time cannot tell."""
    if entry.get("mtime") is not None:
        return current != entry["mtime"]
    if entry.get("produced") is None:
        return False
    if entry.get("kind") == "directory":
        return entry.get("signature") != _signature(path)
    return entry.get("inode") is not None and path.stat().st_ino != entry["inode"]


def _set_time(path: Path, mtime: float) -> None:
    carrier = path / SNAKEMAKE_TIMESTAMP if path.is_dir() else path
    if carrier is not path:  # a directory's time is its timestamp file's
        carrier.touch(exist_ok=True)
    os.utime(carrier, (mtime, mtime))


def settle(paths: Iterable[str | os.PathLike]) -> list[str]:
    """At a workflow start, for each output with a sidecar whose time is not the recorded one: if it
    still holds the recorded content (a rebuild with the same bytes, a copy of the results directory
    without times such as `cp -r`, a `touch`), it gets the recorded time back, the time the jobs made
    from it were built against, so none of them reruns; if its content changed, the sidecar learns
    its new time and everything made from it reruns. Returns a line per output whose time was set
    back. Missing outputs and unreadable sidecars are left alone."""
    restored = []
    for path in map(Path, paths):
        entry = read_sidecar(path)
        if entry is None or not path.exists():
            continue
        try:
            current, recorded = visible_mtime(path), entry.get("mtime")
            if entry.get("rebuilt") and recorded is not None and _unchanged(path, entry):
                if current != recorded:
                    _set_time(path, recorded)
                    restored.append(f"{path}: rebuilt with the same content (sha256 {entry['sha256'][:12]}); "
                                    "its time is set back, so nothing made from it reruns")
                write_json_atomic(sidecar(path), {**entry, "rebuilt": False})
            elif not entry.get("rebuilt") and _times_moved(path, entry, current) and _same_content(path, entry):
                target = recorded if recorded is not None else entry["produced"]
                _set_time(path, target)
                write_json_atomic(sidecar(path), {**entry, "mtime": target, "signature": _signature(path)})
                restored.append(f"{path}: its time changed but not its content (sha256 {entry['sha256'][:12]}: "
                                "copied without times, or touched); its time is set back, so nothing made from it "
                                "reruns (to rerun on purpose: --forcerun RULE)")
            elif recorded != current or entry.get("rebuilt"):
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
    newer: tuple[str, ...] = ()  # inputs newer than its outputs, when that is its only reason to run


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


def _recorded_inputs(job: Pending) -> Optional[dict[str, str]]:
    """The input digests a training recorded when it started (its node state beside its output), or None."""
    try:
        state = json.loads((Path(job.outputs[0]).parent / layout.NODE_STATE).read_text()) if job.outputs else {}
    except (OSError, ValueError):
        return None
    recorded = state.get("inputs") if isinstance(state, dict) else None
    return recorded if isinstance(recorded, dict) else None


def retrained_for_times(jobs: Sequence[Pending]) -> list[tuple[Pending, dict[str, str]]]:
    """Finished trainings pending only because inputs are newer than their `DONE`, where every such
    input still holds the content the training recorded when it started (`inputs` in its node state,
    repexp.train): new times alone (a copy without times that `settle` could not undo) would retrain
    them. Each with the digests that matched."""
    found = []
    for job in jobs:
        recorded = _recorded_inputs(job) if job.complete and job.newer else None
        if recorded is not None and all(path in recorded for path in job.newer):
            try:
                same = all(content_digest(path) == recorded[path] for path in job.newer)
            except OSError:
                continue
            if same:
                found.append((job, {path: recorded[path] for path in job.newer}))
    return found


def check_pending(jobs: Sequence[Pending], command: Sequence[str] = ("snakemake",),
                  targets: Iterable[str] = ()) -> list[str]:
    """The problems that stop a run before any job: messages, empty if none. `command` is the
    Snakemake command line of this run, `targets` its targets (for the commands the messages give)."""
    problems = pointer_gaps(jobs)
    options = _options(command, targets)
    retrains = retrained_for_times(jobs)
    if retrains:
        newer = {path: digest for _, digests in retrains for path, digest in digests.items()}
        listed = ", ".join(f"{path} (sha256 {digest[:12]})" for path, digest in sorted(newer.items()))
        trained = {job.key for job, _ in retrains}
        # other finished jobs outdated only by the same files, which the trainings showed unchanged (test-time)
        same = [job for job in jobs if job.key not in trained and job.complete and job.newer
                and set(job.newer) <= set(newer) and _recorded_inputs(job) is None]
        others = Counter(job.rule for job in same)
        also = (" (and, outdated by the same files: " + ", ".join(f"{rule} x{n}" for rule, n in sorted(others.items()))
                + ")") if same else ""
        outputs = [path for job in [job for job, _ in retrains] + same for path in job.outputs]
        problems.append(
            f"{', '.join(job.label for job, _ in retrains)}: finished, and would be retrained only because "
            f"{listed} {'is' if len(newer) == 1 else 'are'} newer than {'its' if len(retrains) == 1 else 'their'} "
            "output, with the very content they were trained on (the times changed: a results directory copied "
            f"without times?). Accept the finished jobs as they are{also}:\n      "
            + shlex.join(["snakemake", "--touch", *outputs, *options])
            + "\n    then run this command again. To retrain anyway, add --forcerun train.")
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
            + f"\n    then run this command again. {_after_rebuild(sum(gone.values(), []))} "
            f"To rerun those jobs anyway, add --forcerun {rules}.")
    return problems


def _after_rebuild(paths: Sequence[str]) -> str:
    """What the next run does with the jobs made from the rebuilt `paths`: an output with a content
    sidecar (a model, a data split) gets its recorded time back when its content is the same; any other
    file is spared only by Snakemake's own checksum, kept in `.snakemake/metadata` for files up to 1 MB."""
    with_sidecar = [path for path in paths if read_sidecar(path) is not None]
    others = [path for path in paths if path not in with_sidecar]
    said = []
    if with_sidecar:
        said.append(f"A rebuild of {', '.join(with_sidecar)} with the same content keeps every job made from it "
                    "(its time is set back at the next start).")
    if others:
        said.append(f"A rebuild of {', '.join(others)} keeps the jobs made from it only where Snakemake finds it "
                    "unchanged by its own checksum (a file of at most 1 MB whose record in .snakemake/metadata is "
                    "still there); otherwise they rerun: `snakemake -n` after the rebuild shows which.")
    return " ".join(said)


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
        others = [name for name in _OTHER_REASONS if bool(getattr(reason, name, False))]
        only_newer = others == ["updated_input"] and not reason.missing_output and not reason.updated_input_run
        records.append(Pending(
            key=keys[id(job)], rule=job.rule.name, label=f"{job.rule.name} {wildcards}".strip(), outputs=outputs,
            complete=bool(outputs) and all(os.path.exists(path) for path in outputs),
            missing=bool(reason.missing_output), propagated=bool(reason.updated_input_run), other=bool(others),
            upstream=tuple(keys[id(dep)] for dep in dag.dependencies[job] if id(dep) in keys),
            pointer=str(pointer) if pointer else None,
            newer=tuple(sorted(str(path) for path in reason.updated_input)) if only_newer else (),
        ))
    return records
