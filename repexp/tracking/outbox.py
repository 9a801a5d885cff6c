"""The outbox: what MLflow lacks for an unreachable server, and `repexp mlflow sync`.

A node that could not log everything writes its record to `<results>/mlflow/outbox/<id>/`.
Sync replays records idempotently: a record's run is found again by its run id or its
`repexp.record_id` tag; MLflow drops metric points identical in key, value, step and timestamp;
curves replayed from a trainer's metrics.jsonl are checked point by point against the run's
history (a point the trainer logged live before an outage has another timestamp, so MLflow would
keep both); params are re-logged with the same values; tables and datasets are logged once;
artifacts overwrite themselves; an uploaded record gets a `SYNCED` marker.

Every node writes its record when it starts (status RUNNING) and replaces it atomically when it
ends offline, or removes it when its run ended in the store. A record still
RUNNING whose process is gone (a full disk kept its end from being written, or SIGKILL) is
uploaded as KILLED, without touching its parent's status; one whose process may still run is
left for later (`--finished` once the workflow has ended: the workflow's own end sync).
A directory in the outbox without a readable record is reported, never skipped in silence.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from repexp.io import write_text_atomic
from repexp.tracking.auth import client_credentials
from repexp.tracking.names import ERROR_TAG, RECORD_FILE, SYNC_LOCK_FILE, SYNC_LOG, SYNCED_FILE, outbox_dir
from repexp.tracking.node import open_child, open_parent, process_alive
from repexp.tracking.record import Record
from repexp.tracking.scopes import Scope
from repexp.tracking.store import Store, artifact_location, reachable

UNRECORDED_END = ("the node's end was never recorded: its process was killed, or the disk was full when it "
                  "ended (this is the record it wrote when it started)")


WRITE_GRACE_S = 60.0  # a record directory younger than this may be mid-write


class StillRunning(Exception):
    """A record whose node may still be running: left for a later sync."""


def pending_records(results_dir: str | os.PathLike) -> list[Path]:
    root = outbox_dir(results_dir)
    if not root.exists():
        return []
    return sorted(d for d in root.iterdir() if (d / RECORD_FILE).exists() and not (d / SYNCED_FILE).exists())


def unreadable_records(results_dir: str | os.PathLike) -> list[str]:
    """Outbox directories that hold no readable record (each with why), for `sync` to report."""
    found = []
    for directory in sorted(d for d in outbox_dir(results_dir).iterdir() if d.is_dir() and not d.name.startswith(".")):
        if (directory / SYNCED_FILE).exists() or time.time() - directory.stat().st_mtime < WRITE_GRACE_S:
            continue  # uploaded, or a node may be writing its record into it right now
        if not (directory / RECORD_FILE).exists():
            found.append(f"{directory}: no {RECORD_FILE} (a record cut off by a full disk?); what it holds: "
                         f"{sorted(p.name for p in directory.iterdir()) or 'nothing'}; remove the directory once "
                         "you have looked")
            continue
        try:
            Record.load(directory)
        except (OSError, ValueError, TypeError) as err:
            found.append(f"{directory / RECORD_FILE}: unreadable ({type(err).__name__}: {err})")
    return found


def sync_record(directory: Path, tracking_uri: Optional[str], unreachable: dict[str, Optional[str]],
                finished: bool = False) -> str:
    """Replay one outbox record into MLflow; idempotent. Returns the run id.

    `unreachable` caches the store check per URI within one sync (a dead server costs one timeout).
    `finished`: no node of this results directory runs any more (a RUNNING record is a dead one).
    """
    record = Record.load(directory)
    started_only = record.status == "RUNNING"
    if started_only:
        # its node may still run: its process is alive here, or nothing says (another host, no pid)
        if not finished and process_alive(record.tags) is not False:
            raise StillRunning(directory.name)
        record.status = "KILLED"
        record.end_ms = int((directory / RECORD_FILE).stat().st_mtime * 1000)
        record.error = record.error or UNRECORDED_END
        record.tags[ERROR_TAG] = record.error
    scope = Scope(**record.scope)
    record.tracking_uri = uri = tracking_uri or record.tracking_uri
    record.artifact_location = artifact_location(uri)  # where the target store keeps artifacts (a SQLite store)
    # a sync by hand (no MLflow variables): the results directory's own server takes its credentials file
    with client_credentials(uri, record.results_dir):
        if uri not in unreachable:
            unreachable[uri] = reachable(uri, results_dir=record.results_dir)
        if unreachable[uri]:
            raise ConnectionError(unreachable[uri])
        store = Store(uri)
        experiment_id, parent_id, created = open_parent(store, record, scope)
        if record.run_id is None or not store.run_exists(record.run_id):
            record.parent_run_id = parent_id
            record.run_id = store.find_record_run(experiment_id, record.record_id) or open_child(
                store, experiment_id, record, end_stale=False)  # an old record never ends a newer execution
        else:
            record.parent_run_id = record.parent_run_id or parent_id
        store.set_tags(record.run_id, record.tags)
        store.log_params(record.run_id, record.params)
        store.log_metrics(record.run_id, record.metrics)
        store.log_metrics(record.run_id, store.missing_rows(record.run_id, record.fill_metrics), exact=True)
        store.log_inputs(record.run_id, record.inputs)
        for artifact_file, data in record.tables:
            store.log_table(record.run_id, artifact_file, data)
        for path, artifact_path in record.artifacts:
            if Path(path).exists():
                store.log_artifact(record.run_id, path, artifact_path)
        for entry in record.parent_metrics:
            store.log_metrics(open_parent(store, record, Scope(**entry["scope"]))[1], entry["metrics"])
        store.set_tags(record.run_id, {"repexp.synced_from_outbox": "true"})
        store.finish(record, created, experiment_id, scope, parent_status=not started_only)
    write_text_atomic(directory / SYNCED_FILE, record.run_id + "\n")
    return record.run_id


def sync(results_dir: str | os.PathLike, tracking_uri: Optional[str] = None, finished: bool = False,
         running: Optional[list[str]] = None) -> tuple[int, list[str]]:
    """Upload every pending outbox record. Returns (synced count, errors); records of nodes that may
    still run are skipped and named in `running` (when given)."""
    root = outbox_dir(results_dir)
    if not root.exists():
        return 0, []
    synced, errors = _sync_locked(root, lambda: pending_records(results_dir), tracking_uri, finished, running)
    return synced, errors + unreadable_records(results_dir)


def sync_one(record_dir: str | os.PathLike, tracking_uri: Optional[str] = None) -> tuple[int, list[str]]:
    """Upload one outbox record unless it was uploaded already. Returns (synced count, errors)."""
    record_dir = Path(record_dir)
    if not (record_dir / RECORD_FILE).exists():
        raise FileNotFoundError(f"{record_dir}: no {RECORD_FILE} (not an outbox record)")
    return _sync_locked(record_dir.parent, lambda: [] if (record_dir / SYNCED_FILE).exists() else [record_dir],
                        tracking_uri)


def _sync_locked(root: Path, pending, tracking_uri: Optional[str], finished: bool = False,
                 running: Optional[list[str]] = None) -> tuple[int, list[str]]:
    """One sync at a time per outbox; what is pending is decided under the lock, so no record is
    uploaded twice by concurrent syncs."""
    errors: list[str] = []
    synced = 0
    unreachable: dict[str, Optional[str]] = {}
    with open(root / SYNC_LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        for directory in pending():
            try:
                sync_record(directory, tracking_uri, unreachable, finished)
                synced += 1
            except StillRunning:
                if running is not None:
                    running.append(directory.name)
            except Exception as err:  # noqa: BLE001 - report and keep the record for next time
                errors.append(f"{directory.name}: {type(err).__name__}: {err}")
    return synced, errors


def upload_in_background(record_dir: Path) -> None:
    """Start `repexp mlflow sync --record DIR` in its own session (it outlives this job's process group)."""
    with open(record_dir / SYNC_LOG, "ab") as log_file:
        subprocess.Popen([sys.executable, "-m", "repexp", "mlflow", "sync", "--record", str(record_dir)],
                         stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True)
