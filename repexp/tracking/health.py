"""The SQLite tracking store's health, its backups, and the ledger that says it existed.

MLflow opens whatever `sqlite:///` path it is given and creates an empty store where none is: a
damaged or deleted store would silently be replaced and the experiment's history lost. So:

- the ledger `<results>/mlflow/stores.json` records every SQLite store this results directory has
  logged to (path, runs, identity, when last seen healthy);
- `problem(path, results)`: "damaged" (fails `quick_check`, no MLflow tables), "missing" (the
  ledger knows it, the file is gone) or "replaced" (a readable store in its place that is another
  one, or holds fewer runs than the ledger counted: an empty store MLflow created where the file
  was deleted, another results directory's store), else None: an unknown path that does not exist
  is just new;
- `backup(path, keep)`: SQLite's online backup into `<store dir>/backups/` at each workflow start
  and end; a backup with more runs than every newer one is kept beyond `keep`, with a warning;
- `restore(path)` / `start_fresh(path)`: nothing is deleted, a damaged file is moved aside.

Standard library only (sqlite3): the workflow's start and every node call it before MLflow loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repexp.io import write_json_atomic
from repexp.tracking.names import PARENTS_FILE, mlflow_dir

LEDGER_FILE = "stores.json"  # <results>/mlflow/stores.json
BACKUP_DIR = "backups"  # <store dir>/backups/<stem>-<UTC stamp>.db
SQLITE_MAGIC = b"SQLite format 3\x00"
SIDECARS = ("-wal", "-shm", "-journal")  # SQLite's companions of a database file
NEW_STORE_SETTING = 'tracking.new_store=true'


def ledger_path(results_dir: str | os.PathLike) -> Path:
    return mlflow_dir(results_dir) / LEDGER_FILE


def read_ledger(results_dir: str | os.PathLike) -> dict:
    try:
        return json.loads(ledger_path(results_dir).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _key(path: Path) -> str:
    return str(Path(path).resolve())


def _stamp(seconds: Optional[float] = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(seconds))


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def inspect(path: Path, thorough: bool = True) -> tuple[Optional[str], int]:
    """(what is wrong with the SQLite file at `path`, or None; how many MLflow runs it holds).

    `thorough` runs SQLite's `quick_check` (reads every page: the workflow's start, sync, restore);
    without it only the header and the tables are looked at (each node, in milliseconds)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(100)
        seen = _truncated(path)
    except OSError as err:
        return f"cannot read it ({err.strerror})", 0
    if header[: len(SQLITE_MAGIC)] != SQLITE_MAGIC:
        return "it is empty" if not header else "it is not an SQLite database (bad header)", 0
    if seen is not None:
        # A writer may be mid-commit (page 1, with the new size, can reach the disk before the pages
        # that grow the file): look again inside a read transaction, which waits for the commit.
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)) as con:
                con.execute("BEGIN")
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()
                short = _truncated(path)
                con.rollback()
        except sqlite3.Error as err:
            return f"{seen}, and SQLite cannot read it ({type(err).__name__}: {err})", 0
        if short is not None:
            return short, 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)) as con:
            if thorough:
                verdict = con.execute("PRAGMA quick_check").fetchone()[0]
                if verdict != "ok":
                    return f"SQLite's quick_check fails ({verdict})", 0
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "runs" not in tables:
                return "it holds no MLflow tables", 0
            return None, int(con.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error as err:
        return f"{type(err).__name__}: {err}", 0


def identity(path: Path) -> Optional[str]:
    """What tells one MLflow store from another: the creation time (ms) of its first experiment
    (MLflow's "Default", made when the store is created). A copy (a backup) has its original's; an
    empty store MLflow creates in place of a deleted one has a new one. None if it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)) as con:
            row = con.execute("SELECT creation_time FROM experiments ORDER BY experiment_id LIMIT 1").fetchone()
    except sqlite3.Error:
        return None
    return None if row is None or row[0] is None else str(row[0])


def mismatch(path: Path, runs: int, known: Optional[dict]) -> Optional[str]:
    """Why a readable store at `path` is not the one the ledger entry `known` describes, or None."""
    if not known:
        return None
    recorded, found = known.get("identity"), identity(path)
    if recorded and found and recorded != found:
        return (f"it is another store than the one this results directory logged to (created {_when_ms(found)}, "
                f"not {_when_ms(recorded)}; {runs} runs): an empty store that MLflow created where the file was "
                "deleted, or another results directory's")
    if known.get("runs") is not None and runs < known["runs"]:
        return (f"it holds {runs} runs, fewer than the {known['runs']} this results directory counted in it: an empty "
                "store that MLflow created where the file was deleted, or another one")
    return None


def _when_ms(milliseconds: str) -> str:
    return _when(int(milliseconds) / 1000) if str(milliseconds).isdigit() else str(milliseconds)


def _truncated(path: Path) -> Optional[str]:
    """Whether the file is shorter than SQLite's header says (page size × page count, when that count
    is valid: its version-valid-for number equals the change counter)."""
    with open(path, "rb") as handle:
        header = handle.read(100)
    size = os.path.getsize(path)
    page_size = int.from_bytes(header[16:18], "big")
    pages = int.from_bytes(header[28:32], "big") if len(header) == 100 and header[24:28] == header[92:96] else 0
    expected = (65536 if page_size == 1 else page_size) * pages
    return f"it is truncated ({size} bytes; its header says {expected})" if size < expected else None


@dataclass
class StoreProblem:
    path: Path
    kind: str  # "damaged" | "missing" | "replaced"
    detail: str
    known: dict  # the ledger's entry (runs, last_seen), or {} when only parents.json knew the store

    @property
    def state(self) -> str:
        """"damaged", "missing", or what a replaced store is, for "the store ... is <state>"."""
        return "not the store it was" if self.kind == "replaced" else self.kind

    def message(self, fresh_hint: str) -> str:
        """The way out, for a person: the store, what happened, the restore command, the fresh start."""
        runs = self.known.get("runs")
        seen = self.known.get("last_seen")
        history = "this results directory logged to it before"
        if runs is not None and seen is not None:
            history += f" ({runs} runs when last seen healthy, {_when(seen)})"
        lines = [f"the MLflow store {self.path} is {self.state}: {self.detail}; {history}."]
        kept = {"damaged": "the damaged file", "replaced": "the file now in its place"}.get(self.kind)
        newest = newest_backup(self.path, self.known.get("identity"))
        if newest is not None:
            backup_path, taken, backup_runs = newest
            lines.append(f"  Restore the newest backup ({backup_path.name}: {backup_runs} runs, {_when(taken)}"
                         + (f"; {kept} is kept beside it" if kept else "") + "):")
            lines.append(f"      repexp mlflow restore --store sqlite:///{self.path}")
            lines.append("    Runs logged after that backup are not in it (records still in the outbox are: "
                         "`repexp mlflow sync` uploads them).")
        else:
            lines.append(f"  No backup of it exists ({self.path.parent / BACKUP_DIR}).")
        lines.append(f"  Or start a new, empty store{f' ({kept} is kept)' if kept else ''}: {fresh_hint}")
        return "\n".join(lines)


def problem(path: str | os.PathLike, results_dir: Optional[str | os.PathLike], thorough: bool = True
            ) -> Optional[StoreProblem]:
    """What is wrong with the SQLite store at `path` for `results_dir`, or None if it is usable."""
    path = Path(path)
    known = _known(path, results_dir) if results_dir is not None else None
    if path.exists():
        detail, runs = inspect(path, thorough)
        if detail is None:
            replaced = mismatch(path, runs, known)
            return None if replaced is None else StoreProblem(path, "replaced", replaced, known)
        if known is None and path.stat().st_size == 0:
            return None  # an empty file nobody logged to: MLflow makes a store of it
        return StoreProblem(path, "damaged", detail, known or {})
    if known is not None:
        return StoreProblem(path, "missing", "the file is gone", known)
    return None


def _known(path: Path, results_dir: str | os.PathLike) -> Optional[dict]:
    """The ledger's entry for this store, or {} when only an older parents.json names it; None if
    nothing says this results directory used it (then a missing store is just a new one)."""
    entry = read_ledger(results_dir).get(_key(path))
    if entry is not None:
        return None if entry.get("replaced") and "runs" not in entry else entry
    try:
        parents = json.loads((mlflow_dir(results_dir) / PARENTS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return {} if parents.get("tracking_uri") == f"sqlite:///{_key(path)}" else None


def record_healthy(path: str | os.PathLike, results_dir: str | os.PathLike, accept: bool = False) -> Optional[int]:
    """Note in the ledger that the store exists and is healthy (cheap check); returns its run count.
    A store that is not the one the ledger knows (another identity, fewer runs) is not recorded
    (None), so the ledger never forgets the store it stands for; `accept` records it anyway (a restore
    the user asked for)."""
    path = Path(path)
    if not path.exists():
        return None
    detail, runs = inspect(path, thorough=False)
    if detail is not None:
        return None
    ledger = read_ledger(results_dir)
    entry = ledger.get(_key(path), {})
    if not accept and mismatch(path, runs, _known(path, results_dir)) is not None:
        return None
    entry.pop("replaced", None)
    entry.update(runs=runs, identity=identity(path), last_seen=time.time(),
                 first_seen=entry.get("first_seen", time.time()))
    ledger[_key(path)] = entry
    write_json_atomic(ledger_path(results_dir), ledger)
    return runs


# --------------------------------------------------------------------------- backups


def backups(path: Path) -> list[Path]:
    """The store's backups, newest first."""
    directory = Path(path).parent / BACKUP_DIR
    return sorted(directory.glob(f"{Path(path).stem}-*.db"), reverse=True) if directory.is_dir() else []


def newest_backup(path: Path, store_identity: Optional[str] = None) -> Optional[tuple[Path, float, int]]:
    """(file, time taken, runs) of the newest backup that passes quick_check (and, given the store's
    `store_identity`, is a copy of that store), or None."""
    for candidate in backups(path):
        detail, runs = inspect(candidate)
        if detail is None and (store_identity is None or identity(candidate) in (None, store_identity)):
            return candidate, candidate.stat().st_mtime, runs
    return None


def _copy(source: Path, target: Path) -> None:
    """SQLite's online backup (consistent while others write), to a temporary name, then renamed:
    a copy cut short never has the target's name."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    with (contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=60)) as src,
          contextlib.closing(sqlite3.connect(tmp)) as dst):
        src.backup(dst)
    os.replace(tmp, target)


def backup(path: str | os.PathLike, keep: int) -> Optional[Path]:
    """Back the store up unless it is unchanged since its newest backup; keep the newest `keep`, and
    beyond them any backup with more runs than every one kept (with a warning on stderr: a store
    that shrank never pushes out the copy of a larger one). Returns the new backup (None: nothing to
    do). The store must be healthy (checked before)."""
    path = Path(path)
    if keep <= 0 or not path.exists():
        return None
    existing = backups(path)
    changed = max((path.stat().st_mtime, *[Path(f"{path}{s}").stat().st_mtime
                                            for s in SIDECARS if Path(f"{path}{s}").exists()]))
    if existing and existing[0].stat().st_mtime >= changed:
        return None
    directory = path.parent / BACKUP_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    target = directory / f"{path.stem}-{_stamp()}.{int(time.time() * 1000) % 1000:03d}.db"
    _copy(path, target)
    current = backups(path)
    most = max(inspect(kept, thorough=False)[1] for kept in current[:keep])
    for old in current[keep:]:
        runs = inspect(old, thorough=False)[1]
        if runs > most:
            print(f"repexp: WARNING: kept the backup {old} ({runs} runs) beyond tracking.store_backups={keep}: the "
                  f"store {path} and its newer backups hold at most {most} runs; remove it by hand once it is not "
                  "needed", file=sys.stderr)
            continue
        old.unlink(missing_ok=True)
    return target


def _move_aside(path: Path, why: str) -> Optional[Path]:
    """Rename the store (and its SQLite sidecars) to `<name>.<why>-<stamp>`; never deletes."""
    if not path.exists():
        return None
    target = path.with_name(f"{path.name}.{why}-{_stamp()}")
    os.replace(path, target)
    for suffix in SIDECARS:
        sidecar = Path(f"{path}{suffix}")
        if sidecar.exists():
            os.replace(sidecar, Path(f"{target}{suffix}"))
    return target


def restore(path: str | os.PathLike, results_dir: Optional[str | os.PathLike] = None,
            source: Optional[Path] = None) -> tuple[Path, int, Optional[Path]]:
    """Put a backup (the newest healthy one unless `source`) in the store's place; the current file,
    if any, is moved aside. Returns (the backup used, its runs, where the old file went)."""
    path = Path(path)
    if source is None:
        known = _known(path, results_dir) if results_dir is not None else None
        newest = newest_backup(path, (known or {}).get("identity"))  # a copy of the store the ledger knows
        if newest is None:
            raise FileNotFoundError(f"no healthy backup of {path} in {path.parent / BACKUP_DIR}")
        source, _, runs = newest
    else:
        detail, runs = inspect(Path(source))
        if detail is not None:
            raise ValueError(f"{source} cannot be restored: {detail}")
    moved = _move_aside(path, "damaged")
    _copy(Path(source), path)
    if results_dir is not None:
        record_healthy(path, results_dir, accept=True)
    return Path(source), runs, moved


def start_fresh(path: str | os.PathLike, results_dir: str | os.PathLike) -> Optional[Path]:
    """Clear the way for a new, empty store: the damaged file (if any) moved aside, parents.json
    (ids in the old store) moved aside too, the ledger told. Returns where the old file went."""
    path = Path(path)
    moved = _move_aside(path, "damaged")
    parents = mlflow_dir(results_dir) / PARENTS_FILE
    if parents.exists():
        os.replace(parents, parents.with_name(f"{PARENTS_FILE}.old-{_stamp()}"))
    ledger = read_ledger(results_dir)
    old = ledger.get(_key(path), {})
    ledger[_key(path)] = {"replaced": time.time(), "previous_runs": old.get("runs"), "moved_to": str(moved or "")}
    write_json_atomic(ledger_path(results_dir), ledger)
    return moved
