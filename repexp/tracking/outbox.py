"""The outbox: what MLflow lacks for an unreachable server, and `repexp mlflow sync`.

A node that could not log everything writes its record to `<results>/mlflow/outbox/<id>/`.
Sync replays records idempotently: a record's run is found again by its run id or its
`repexp.record_id` tag; MLflow drops metric points identical in key, value, step and timestamp;
curves replayed from a trainer's metrics.jsonl are checked point by point against the run's
history (a point the trainer logged live before an outage has another timestamp, so MLflow would
keep both); params are re-logged with the same values; tables and datasets are logged once;
artifacts overwrite themselves; an uploaded record gets a `SYNCED` marker.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from repexp.io import write_text_atomic
from repexp.tracking.names import RECORD_FILE, SYNC_LOCK_FILE, SYNC_LOG, SYNCED_FILE, outbox_dir
from repexp.tracking.record import Record
from repexp.tracking.scopes import Scope
from repexp.tracking.store import Store, artifact_location, reachable


def pending_records(results_dir: str | os.PathLike) -> list[Path]:
    root = outbox_dir(results_dir)
    if not root.exists():
        return []
    return sorted(d for d in root.iterdir() if (d / RECORD_FILE).exists() and not (d / SYNCED_FILE).exists())


def sync_record(directory: Path, tracking_uri: Optional[str] = None,
                unreachable: Optional[dict[str, Optional[str]]] = None) -> str:
    """Replay one outbox record into MLflow; idempotent. Returns the run id.

    `unreachable` caches the store check per URI within one sync (a dead server costs one timeout).
    """
    from repexp.tracking.node import log_on_parent, open_child, open_parent

    record = Record.load(directory)
    scope = Scope(**record.scope)
    record.tracking_uri = uri = tracking_uri or record.tracking_uri
    record.artifact_location = artifact_location(uri)  # where the target store keeps artifacts (a SQLite store)
    checked = unreachable if unreachable is not None else {}
    if uri not in checked:
        checked[uri] = reachable(uri, results_dir=record.results_dir)
    if checked[uri]:
        raise ConnectionError(checked[uri])
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
    store.log_metrics(record.run_id, store.missing_rows(record.run_id, record.fill_metrics))
    store.log_inputs(record.run_id, record.inputs)
    for artifact_file, data in record.tables:
        store.log_table(record.run_id, artifact_file, data)
    for path, artifact_path in record.artifacts:
        if Path(path).exists():
            store.log_artifact(record.run_id, path, artifact_path)
    for entry in record.parent_metrics:
        log_on_parent(store, experiment_id, record, Scope(**entry["scope"]), entry["metrics"])
    store.set_tags(record.run_id, {"repexp.synced_from_outbox": "true"})
    store.finish(record, created, experiment_id, scope)
    write_text_atomic(directory / SYNCED_FILE, record.run_id + "\n")
    return record.run_id


def sync(results_dir: str | os.PathLike, tracking_uri: Optional[str] = None) -> tuple[int, list[str]]:
    """Upload every pending outbox record. Returns (synced count, errors)."""
    root = outbox_dir(results_dir)
    if not root.exists():
        return 0, []
    return _sync_locked(root, lambda: pending_records(results_dir), tracking_uri)


def sync_one(record_dir: str | os.PathLike, tracking_uri: Optional[str] = None) -> tuple[int, list[str]]:
    """Upload one outbox record unless it was uploaded already. Returns (synced count, errors)."""
    record_dir = Path(record_dir)
    if not (record_dir / RECORD_FILE).exists():
        raise FileNotFoundError(f"{record_dir}: no {RECORD_FILE} (not an outbox record)")
    return _sync_locked(record_dir.parent, lambda: [] if (record_dir / SYNCED_FILE).exists() else [record_dir],
                        tracking_uri)


def _sync_locked(root: Path, pending, tracking_uri: Optional[str]) -> tuple[int, list[str]]:
    """One sync at a time per outbox; what is pending is decided under the lock, so no record is
    uploaded twice by concurrent syncs."""
    errors: list[str] = []
    synced = 0
    unreachable: dict[str, Optional[str]] = {}
    with open(root / SYNC_LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        for directory in pending():
            try:
                sync_record(directory, tracking_uri, unreachable)
                synced += 1
            except Exception as err:  # noqa: BLE001 - report and keep the record for next time
                errors.append(f"{directory.name}: {type(err).__name__}: {err}")
    return synced, errors


def upload_in_background(record_dir: Path) -> None:
    """Start `repexp mlflow sync --record DIR` in its own session (it outlives this job's process group)."""
    with open(record_dir / SYNC_LOG, "ab") as log_file:
        subprocess.Popen([sys.executable, "-m", "repexp", "mlflow", "sync", "--record", str(record_dir)],
                         stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True)
