"""Where runs go, and the MLflow calls the pipeline makes (`MlflowClient` only: no fluent state).

- `resolve_tracking_uri`: `tracking.tracking_uri`, else `$MLFLOW_TRACKING_URI`, else the embedded
  SQLite store under the results directory;
- `reachable`: a cheap check before MLflow is imported (HTTP `/health`, or a writable SQLite dir);
- `Store`: experiments, parent runs (one per scope and results directory), node runs, and the
  batched logging calls (`log_batch`, `log_inputs`, `log_table`). MLflow lacks two things the
  pipeline needs, and only those are added here: a lock that makes parent creation unique on a
  SQLite store shared by many processes, and a rule that lets racing nodes on a server agree on
  one parent (`Store.finish`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from repexp.tracking import artifacts
from repexp.tracking.auth import refused
from repexp.tracking.health import problem
from repexp.tracking.names import (
    ENV_MLFLOW_URI,
    ERROR_TAG,
    EXECUTION_TAG,
    PARENT_RUN_TAG,
    RECORD_TAG,
    RULE_TAG,
    SCOPE_TAG,
    STORE_LOCK_FILE,
    SUPERSEDED_TAG,
    WILDCARDS_TAG,
    default_tracking_uri,
)
from repexp.tracking.scopes import Scope

HEALTH_TIMEOUT_S = 3.0
# Client-side HTTP behaviour once the server answered the health check (user values win): MLflow's
# defaults (120 s, 7 retries with exponential backoff) cost minutes per call on a dead server.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
# Metric values as MLflow shows them: rounded to this many decimals (docs/tracking.md, "Values to 3
# decimals"). MLflow 3.17.2's runs table prints a float as JavaScript does (0.6666666666666666) and
# has no setting for its digits; the files the pipeline reads keep every digit.
DISPLAY_DECIMALS = 3
BATCH_PARAMS = 100  # MLflow's per-call limits of log_batch
BATCH_METRICS = 1000
SEARCH_LIMIT = 1000
DATASET_CONTEXT_TAG = "mlflow.data.context"  # MLflow's input tag for a dataset's role
# The experiment's kind for MLflow UIs that read it (3.x before the workflow switch): its runs table,
# not the GenAI overview. MLflow 3.17.2's UI takes the kind from the link's `workflowType` instead,
# which `repexp mlflow ui` sets (repexp/tracking/ui.py).
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def display_value(value: float) -> float:
    """A metric value as repexp logs it for reading in MLflow: rounded to `DISPLAY_DECIMALS` (0.667, not
    0.6666666666666666); NaN and infinities stay what they are."""
    return round(float(value), DISPLAY_DECIMALS)


def resolve_tracking_uri(results_dir: str | os.PathLike, configured: Optional[str] = None) -> str:
    """`tracking.tracking_uri`, else $MLFLOW_TRACKING_URI, else SQLite under results/."""
    return configured or os.environ.get(ENV_MLFLOW_URI) or default_tracking_uri(results_dir)


def is_sqlite(tracking_uri: str) -> bool:
    return tracking_uri.startswith("sqlite:///")


def sqlite_path(tracking_uri: str) -> Path:
    return Path(tracking_uri[len("sqlite:///"):])


def artifact_location(tracking_uri: str) -> Optional[str]:
    """A SQLite store keeps artifacts in `artifacts/` next to its database (results/mlflow/artifacts
    for the default store), never in MLflow's cwd-relative ./mlruns, and records them as
    `mlflow-artifacts:` URIs, relative to that directory wherever it moves (repexp.tracking.artifacts);
    a server decides itself."""
    return artifacts.ROOT if is_sqlite(tracking_uri) else None


def reachable(tracking_uri: str, timeout_s: float = HEALTH_TIMEOUT_S,
              results_dir: Optional[str | os.PathLike] = None, login: bool = True) -> Optional[str]:
    """None if the store looks usable, else why not (seconds at most, no MLflow import).

    Not usable either: a server that refuses this client's login (`login`; repexp.tracking.auth), and,
    with `results_dir`, a SQLite store that is damaged, or gone although that results directory logged
    to it (repexp.tracking.health): MLflow would replace it with an empty one, losing the history."""
    if tracking_uri.startswith(("http://", "https://")):
        url = tracking_uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                if response.status != 200:
                    return f"{url} answered HTTP {response.status}"
        except (urllib.error.URLError, OSError, ValueError) as err:
            return f"{url}: {getattr(err, 'reason', err)}"
        if login:
            return refused(tracking_uri, results_dir, timeout_s=timeout_s)
    elif is_sqlite(tracking_uri):
        db_dir = sqlite_path(tracking_uri).parent
        try:
            db_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return f"cannot create {db_dir}: {err}"
        if not os.access(db_dir, os.W_OK):
            return f"{db_dir} is not writable"
        if results_dir is not None:
            found = problem(sqlite_path(tracking_uri), results_dir, thorough=False)
            if found is not None:
                return (f"the store {found.path} is {found.state} ({found.detail}) and this results directory "
                        "logged to it before: not creating a new one (`repexp mlflow sync` says how to restore it)")
    return None


def _quoted(value: str) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"


class Store:
    """One tracking store. Public: repexp.aggregate and repexp.figures open it too."""

    def __init__(self, tracking_uri: str):
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow import MlflowClient  # ~2 s: only when tracking is on

        self.uri = tracking_uri
        artifacts.register()  # mlflow-artifacts: URIs of a SQLite store resolve beside its database
        with self.lock():  # a new SQLite store runs its schema migrations here: one process at a time
            self.client = MlflowClient(tracking_uri=tracking_uri)
            self.client.search_experiments(max_results=1)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialises experiment/parent creation (and SQLite schema set-up) on a local store.

        A server store gets no lock (jobs run on many hosts): the workflow creates the parents
        once before any job (`repexp.tracking.parents`), and racing standalone nodes converge.
        """
        if not is_sqlite(self.uri):
            yield
            return
        db = sqlite_path(self.uri)
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.parent / STORE_LOCK_FILE, "a") as handle:  # closing it releases the lock
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    # ------------------------------------------------------------------ experiments and parents
    def experiment_id(self, name: str, artifact_location: Optional[str]) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(name, artifact_location=artifact_location, tags=EXPERIMENT_TAGS)
            except MlflowException:  # created concurrently
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        return exp.experiment_id

    def search(self, experiment_id: str, tags: Mapping[str, str]) -> list:
        clauses = [f"tags.`{key}` = {_quoted(value)}" for key, value in tags.items()]
        return self.client.search_runs([experiment_id], filter_string=" and ".join(clauses), max_results=SEARCH_LIMIT)

    def find_parents(self, experiment_id: str, scope: Scope) -> list:
        """The scope's parent runs, earliest first (more than one only after a race on a server)."""
        runs = self.search(experiment_id, scope.lookup_tags)
        return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def parent(self, experiment_id: str, scope: Scope, extra_tags: Optional[Mapping[str, str]] = None
               ) -> tuple[str, bool]:
        """(run id, created by us) of the scope's parent run: the earliest one with its key."""
        from mlflow.entities import Param

        from repexp.tracking.context import resolve_run_tags

        found = self.find_parents(experiment_id, scope)
        if found:
            return found[0].info.run_id, False
        tags = resolve_run_tags({SCOPE_TAG: scope.kind, "mlflow.source.name": "repexp", "mlflow.source.type": "JOB",
                                 **scope.tags, **(extra_tags or {}), **scope.lookup_tags})
        run_id = self.client.create_run(experiment_id, run_name=scope.name, tags=tags).info.run_id
        if scope.params:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in scope.params.items()])
        self.client.set_terminated(run_id, "FINISHED")
        return run_id, True

    def run_exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except MlflowException:
            return False

    # ------------------------------------------------------------------ node runs
    def find_record_run(self, experiment_id: str, record_id: str) -> Optional[str]:
        runs = self.search(experiment_id, {RECORD_TAG: record_id})
        return runs[0].info.run_id if runs else None

    def earlier_executions(self, experiment_id: str, parent_id: str, rule: str, wildcards: str,
                           before_ms: int) -> list:
        """Node runs of the same rule and wildcards under the same parent that started before
        `before_ms`: earlier attempts, reruns, and runs whose process was killed (still RUNNING)."""
        runs = self.search(experiment_id, {PARENT_RUN_TAG: parent_id, RULE_TAG: rule})
        return [r for r in runs if r.data.tags.get(WILDCARDS_TAG) == wildcards and (r.info.start_time or 0) < before_ms]

    def create_child(self, experiment_id: str, record) -> str:
        from repexp.tracking.context import resolve_run_tags

        tags = resolve_run_tags({**record.tags, PARENT_RUN_TAG: record.parent_run_id, RECORD_TAG: record.record_id})
        return self.client.create_run(experiment_id, start_time=record.start_ms, tags=tags,
                                      run_name=record.run_name).info.run_id

    def supersede(self, stale: Sequence, run_id: str, execution: str) -> None:
        """End runs left RUNNING by a killed process (SIGKILL, OOM, node failure): KILLED, with the
        run of the execution that found them (node.open_child decides which are dead, by node.process_alive)."""
        for run in stale:
            self.set_tags(run.info.run_id, {
                SUPERSEDED_TAG: run_id,
                ERROR_TAG: f"no end was recorded (process killed?); ended by execution {execution} ({run_id})",
            })
            self.client.set_terminated(run.info.run_id, "KILLED")

    # ------------------------------------------------------------------ logging
    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), BATCH_PARAMS):
            self.client.log_batch(run_id, params=items[i : i + BATCH_PARAMS])

    def log_metrics(self, run_id: str, metrics: Sequence[Sequence], *, exact: bool = False) -> None:
        """[[key, value, step, timestamp_ms], ...], every value rounded to `DISPLAY_DECIMALS` (this is where
        every metric repexp logs reaches MLflow: node runs, their outbox records, parent runs) unless
        `exact`: a trainer's curve replayed from metrics.jsonl keeps the digits its trainer logged live with."""
        from mlflow.entities import Metric

        items = [Metric(key, float(value) if exact else display_value(value), int(ts), int(step))
                 for key, value, step, ts in metrics]
        for i in range(0, len(items), BATCH_METRICS):
            self.client.log_batch(run_id, metrics=items[i : i + BATCH_METRICS])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_artifact(self, run_id: str, path: str, artifact_path: Optional[str]) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(run_id, path, artifact_path)
        else:
            self.client.log_artifact(run_id, path, artifact_path)

    def log_inputs(self, run_id: str, inputs: Sequence[Mapping[str, Any]]) -> None:
        """Datasets (`repexp.tracking.outputs.dataset`) with their role as `mlflow.data.context`."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        items = [
            DatasetInput(Dataset(name=d["name"], digest=d["digest"], source_type=d["source_type"], source=d["source"],
                                 schema=d.get("schema"), profile=d.get("profile")),
                         tags=[InputTag(DATASET_CONTEXT_TAG, d["context"])] if d.get("context") else [])
            for d in inputs
        ]
        if items:
            self.client.log_inputs(run_id, datasets=items)

    def log_table(self, run_id: str, artifact_file: str, data: Mapping[str, list]) -> None:
        """MLflow's `log_table`, once: it appends to an existing table, so a replay must not call it twice."""
        directory = os.path.dirname(artifact_file) or None
        if any(a.path == artifact_file for a in self.client.list_artifacts(run_id, directory)):
            return
        self.client.log_table(run_id, data=dict(data), artifact_file=artifact_file)

    def missing_rows(self, run_id: str, rows: Sequence[Sequence]) -> list:
        """The rows whose (key, step) the run does not hold yet: a curve replayed from metrics.jsonl
        never duplicates a point the trainer logged live (MLflow would keep both: their timestamps differ)."""
        stored = {key: {m.step for m in self.client.get_metric_history(run_id, key)}
                  for key in dict.fromkeys(row[0] for row in rows)}
        return [row for row in rows if int(row[2]) not in stored.get(row[0], ())]

    # ------------------------------------------------------------------ ending
    def finish(self, record, parent_created: bool, experiment_id: str, scope: Scope,
               parent_status: bool = True) -> None:
        self.client.set_terminated(record.run_id, record.status, end_time=record.end_ms)
        # Without a lock (a server) two nodes may both create a parent; all agree on the earliest one.
        found = [] if is_sqlite(self.uri) else self.find_parents(experiment_id, scope)
        if found and found[0].info.run_id != record.parent_run_id:
            duplicate, record.parent_run_id = record.parent_run_id, found[0].info.run_id
            self.client.set_tag(record.run_id, PARENT_RUN_TAG, record.parent_run_id)
            if parent_created:
                self.client.delete_run(duplicate)
        # A parent shows the outcome of its latest node (not of an old attempt uploaded late).
        if parent_status:
            self.client.set_terminated(record.parent_run_id, "FAILED" if record.status == "FAILED" else "FINISHED")


def execution_number(earlier: Sequence) -> str:
    """This node's execution count for its sweep point: 1 + the highest earlier one."""
    numbers = [int(r.data.tags.get(EXECUTION_TAG) or 1) for r in earlier]
    return str(max([len(earlier), *numbers]) + 1)
