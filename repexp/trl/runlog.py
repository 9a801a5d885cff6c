"""Where training metrics go: `<run_dir>/metrics.jsonl` always, MLflow when the wrapper asks for it.

`metrics.jsonl` holds one JSON object per logged step, `{"step": N, "<metric>": value, ...}`.
On resume from step M the lines of steps > M (written after the checkpoint the run resumes
from) are dropped, so the file of a resumed run equals that of an uninterrupted one.

MLflow: only into the node's run: `MLFLOW_RUN_ID`, or the id that the `repexp run train` wrapper
publishes in `$REPEXP_MLFLOW_RUN_FILE` (set for this process only) while the trainer starts up,
read at the first log. Metric names are sanitised as verl's MLflow logger does
(`repexp.metrics.metric_name`: `@` → `_at_`, other invalid characters → `_`). Batches go through MLflow's async logging
when `MLFLOW_ENABLE_ASYNC_LOGGING` is true (`repexp run train` sets it): a step never waits for the
store; a failed batch is seen at the next log. Any tracking failure is reported once as a
warning and tracking is switched off; it never fails training (the wrapper replays what is
missing from metrics.jsonl).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Optional

from repexp import layout, tracking
from repexp.io import json_safe, write_text_atomic
from repexp.metrics import metric_name


class MetricsLog:
    """Append-only JSON-lines metrics file with resume truncation."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / layout.METRICS

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
        return records

    def truncate(self, last_step: Optional[int]) -> None:
        """Keep only records of steps <= last_step (None: remove everything)."""
        if last_step is None:
            self.path.unlink(missing_ok=True)
            return
        kept = [r for r in self.records() if r["step"] <= last_step]
        write_text_atomic(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    def append(self, record: dict) -> None:
        clean = {key: json_safe(value) for key, value in record.items()}
        with self.path.open("a") as handle:
            handle.write(json.dumps(clean, sort_keys=True) + "\n")


class MlflowSink:
    """Logs metric dicts to an existing MLflow run; a no-op without MLFLOW_RUN_ID."""

    def __init__(self, run_id: Optional[str] = None, tracking_uri: Optional[str] = None):
        self.run_id = run_id if run_id is not None else os.environ.get("MLFLOW_RUN_ID") or None
        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking_uri
        self._client = None
        self._pending = None  # the previous async batch (MLflow's RunOperations)
        # `repexp run train` opens the node run while the trainer starts: its id is read at the first log
        self._awaiting_run = self.run_id is None and bool(os.environ.get(tracking.ENV_RUN_FILE))
        self.enabled = self.run_id is not None or self._awaiting_run
        if self.run_id is not None and not self.tracking_uri:
            self._disable("MLFLOW_RUN_ID is set but no tracking URI (MLFLOW_TRACKING_URI or tracking.tracking_uri)")

    def _resolve_run(self) -> None:
        self._awaiting_run = False
        node_run = tracking.await_node_run()
        if not node_run or not node_run.get("run_id"):
            reason = (node_run or {}).get("offline_reason") or "no node run"
            self._disable(f"the node's MLflow run is not available ({reason}); metrics.jsonl keeps the curves")
            return
        self.run_id = node_run["run_id"]
        self.tracking_uri = node_run["tracking_uri"] or self.tracking_uri

    def _disable(self, reason: str) -> None:
        self.enabled = False
        warnings.warn(f"MLflow tracking switched off for this training run: {reason}", RuntimeWarning, stacklevel=3)

    def log(self, metrics: dict, step: int) -> None:
        if self._awaiting_run:
            self._resolve_run()
        if not self.enabled:
            return
        try:
            if self._pending is not None:  # raises what the previous async batch met
                pending, self._pending = self._pending, None
                pending.wait()
            if self._client is None:
                # A dead server must not stall training for minutes of HTTP retries.
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
                from mlflow.tracking import MlflowClient

                self._client = MlflowClient(tracking_uri=self.tracking_uri)
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            values = {key: json_safe(value) for key, value in metrics.items() if key != "step"}
            entries = [Metric(metric_name(key), float(value), now, int(step)) for key, value in values.items()
                       if isinstance(value, (int, float)) and not isinstance(value, bool)]  # None: not finite
            for start in range(0, len(entries), 1000):  # MLflow's batch limit
                # synchronous=None: MLflow decides from MLFLOW_ENABLE_ASYNC_LOGGING; async returns operations
                self._pending = self._client.log_batch(self.run_id, metrics=entries[start : start + 1000]) or None
        except Exception as err:  # noqa: BLE001 - tracking must never fail training
            self._disable(f"{type(err).__name__}: {err}")
