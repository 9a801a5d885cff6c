"""What one node logs, kept in memory while it runs and written to the outbox when MLflow could
not take it all (`<results>/mlflow/outbox/<record id>/record.json`, artifacts copied beside it).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Optional

from repexp.io import read_json, write_json_atomic
from repexp.tracking.names import ARTIFACTS_DIR, ERROR_TAG, RECORD_FILE


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass
class Record:
    record_id: str
    tracking_uri: str
    experiment: str
    artifact_location: Optional[str]
    scope: dict
    run_name: str
    tags: dict
    params: dict = dataclasses.field(default_factory=dict)
    metrics: list = dataclasses.field(default_factory=list)  # [key, value, step, timestamp_ms]
    # Points replayed from a trainer's metrics.jsonl: logged only where the run lacks (key, step),
    # checked when they are uploaded (the trainer may have logged some of them live before an outage).
    fill_metrics: list = dataclasses.field(default_factory=list)
    artifacts: list = dataclasses.field(default_factory=list)  # [local path, artifact_path]
    inputs: list = dataclasses.field(default_factory=list)  # datasets (repexp.tracking.outputs.dataset)
    tables: list = dataclasses.field(default_factory=list)  # [artifact_file, {column: values}]
    # Metrics for other scopes' parent runs (aggregate: test pass@k on every sweep point's parent)
    parent_metrics: list = dataclasses.field(default_factory=list)  # [{"scope": {...}, "metrics": rows}]
    status: str = "RUNNING"
    start_ms: int = dataclasses.field(default_factory=now_ms)
    end_ms: Optional[int] = None
    run_id: Optional[str] = None  # set once the run exists in the store
    parent_run_id: Optional[str] = None
    error: Optional[str] = None
    results_dir: Optional[str] = None  # absolute; where parents.json and the outbox live

    @classmethod
    def load(cls, directory: Path) -> Record:
        raw = read_json(Path(directory) / RECORD_FILE)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def write(self, directory: Path) -> None:
        """The record, then copies of the artifacts next to it (so later changes to the outputs cannot
        alter it), then the record again pointing at the copies. Every write replaces record.json
        atomically, and the record comes first: a disk that fills while artifacts are copied leaves
        the record (pointing at the outputs themselves), never a directory without one."""
        directory = Path(directory)
        payload = dataclasses.asdict(self)
        write_json_atomic(directory / RECORD_FILE, payload)
        files = directory / ARTIFACTS_DIR
        kept = []
        try:
            for i, (path, artifact_path) in enumerate(self.artifacts):
                src = Path(path)
                if not src.exists():
                    continue
                dst = files / str(i) / src.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst, **({"dirs_exist_ok": True}
                                                                                 if src.is_dir() else {}))
                kept.append([str(dst.resolve()), artifact_path])
        except OSError as err:
            shutil.rmtree(files, ignore_errors=True)
            note = f"artifacts not copied into the outbox ({type(err).__name__}: {err}); sync uploads the outputs"
            payload["error"] = f"{payload['error']}; {note}" if payload.get("error") else note
            payload["tags"][ERROR_TAG] = payload["error"]
            write_json_atomic(directory / RECORD_FILE, payload)
            return
        payload["artifacts"] = kept
        write_json_atomic(directory / RECORD_FILE, payload)
