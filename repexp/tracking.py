"""MLflow on every pipeline node, and `repexp mlflow` (sync | node | uri).

Layout in MLflow (docs/tracking.md):

- one experiment per config (`tracking.experiment`, else the config's `name`);
- parent runs, found or created by the tag ``repexp.parent_key``: one per sweep point
  (``point:<task>/<run>``), one per task (``task:<task>``, for `preprocess`) and one per
  experiment (``experiment``, for `model`, `aggregate`, `figures`);
- one child run per node execution (`train`, `eval`, ...), nested under its parent and tagged
  with the rule, wildcards, attempt, git commit, config hash and SLURM job id.

Every command can track itself with `node_run(...)`; rules that call commands which do not
(`data`, `select`, `merge`, `eval`, ...) go through ``repexp mlflow node ... -- repexp <command>``,
which runs the command in-process inside a node run and then logs its declared outputs
(params from its flags, eval.json → pass@k with step = k, outputs as artifacts).

Tracking never costs results: if the store cannot be reached (checked up front with a short
HTTP timeout) or fails midway, the node keeps running and everything it would have logged is
written to ``<results>/mlflow/outbox/<record>/`` for ``repexp mlflow sync``, which replays
records idempotently (identical metric points are deduplicated by MLflow; a record's run is
found again by its ``repexp.record_id`` tag) and marks each one synced.

`mlflow` is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from repexp.io import read_json, write_json_atomic, write_text_atomic

log = logging.getLogger("repexp.tracking")

ENV_CONFIG = "REPEXP_CONFIG"  # the pipeline config snapshot (set by workflow/rules/common.smk)
ENV_TRACKING = "REPEXP_TRACKING"  # "off" disables tracking (nothing logged, no outbox)
# "remote" inside a SLURM jobstep's own Snakemake, whose job ids are not the scheduler's (workflow/rules/common.smk)
ENV_SNAKEMAKE_EXEC = "REPEXP_SNAKEMAKE_EXEC"
# Rules pass `{{{jobid}}}` (the id in literal braces): a bare `{jobid}` fails `snakemake --lint`, and
# as a param it would make every job outdated whenever the numbering changes.
SNAKEMAKE_JOBID_HELP = "the scheduling Snakemake's job id, tagged snakemake.jobid (braces are stripped)"
PARENT_KEY_TAG = "repexp.parent_key"  # on parent runs: what they group
SCOPE_KEY_TAG = "repexp.scope_key"  # on node runs: the parent key they belong to
SWEEP_POINT_TAG = "repexp.sweep_point"  # "<task>/<run>" on a point's parent and node runs (repexp.aggregate reads it)
SCOPE_TAG = "repexp.scope"
RECORD_TAG = "repexp.record_id"
RECORD_FILE = "record.json"
SYNCED_FILE = "SYNCED"
HEALTH_TIMEOUT_S = 3.0
# Client-side HTTP behaviour once the server answered the health check (user values win).
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
ARTIFACT_MAX_BYTES = 50 * 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".parquet")  # never copied into MLflow
PARAM_MAX_CHARS = 6000
REPO_ROOT = Path(__file__).resolve().parents[1]

# Which parent a rule's node run hangs under.
EXPERIMENT_RULES = ("model", "aggregate", "figures")
TASK_RULES = ("preprocess",)


# --------------------------------------------------------------------------- where records go


def default_tracking_uri(results_dir: str | os.PathLike) -> str:
    """Embedded SQLite store under the results directory (no server)."""
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow' / 'mlflow.db'}"


def resolve_tracking_uri(results_dir: str | os.PathLike, configured: Optional[str] = None) -> str:
    """`tracking.tracking_uri`, else $MLFLOW_TRACKING_URI, else SQLite under results/."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(results_dir)


def artifact_location(tracking_uri: str) -> Optional[str]:
    """A SQLite store keeps artifacts in `artifacts/` next to its database (results/mlflow/artifacts
    for the default store), never in MLflow's cwd-relative ./mlruns; other stores decide themselves."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri[len("sqlite:///"):]).resolve().parent / "artifacts").as_uri()


def outbox_dir(results_dir: str | os.PathLike) -> Path:
    return Path(results_dir) / "mlflow" / "outbox"


def tracking_enabled() -> bool:
    return os.environ.get(ENV_TRACKING, "on").strip().lower() not in {"0", "off", "false", "no"}


@dataclasses.dataclass(frozen=True)
class Scope:
    """The parent run a node hangs under."""

    kind: str  # point | task | experiment
    key: str
    name: str
    params: Mapping[str, str]
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)  # on the parent and its node runs


def scope_for(task: Optional[str] = None, run: Optional[str] = None) -> Scope:
    if run is not None:
        if task is None:
            raise ValueError("a run needs its task")
        from repexp.config import canonical, parse_run

        spec = parse_run(task, run)
        params = {k: canonical(v) for k, v in dataclasses.asdict(spec).items() if v is not None}
        tags = {SWEEP_POINT_TAG: spec.path, "repexp.task": task, "repexp.run": run, "repexp.method": spec.method}
        return Scope("point", f"point:{task}/{run}", spec.path, params, tags)
    if task is not None:
        return Scope("task", f"task:{task}", task, {"task": task}, {"repexp.task": task})
    return Scope("experiment", "experiment", "experiment", {})


def scope_for_rule(rule: str, task: Optional[str], run: Optional[str]) -> Scope:
    if rule in EXPERIMENT_RULES:
        return scope_for()
    if rule in TASK_RULES:
        return scope_for(task)
    return scope_for(task, run)


def git_commit() -> Optional[str]:
    if not (REPO_ROOT / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def flatten(obj: Any, prefix: str = "", sep: str = ".") -> dict[str, str]:
    """Nested dicts -> {"a.b": "value"} (lists and scalars as text), for MLflow params."""
    out: dict[str, str] = {}
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}{sep}", sep))
        return out
    out[prefix[: -len(sep)] if prefix else "value"] = str(obj)
    return out


_INVALID_METRIC_CHARS = re.compile(r"[^/\w.\- :]")


def metric_name(key: str) -> str:
    """An MLflow-valid metric name, mapped as verl and repexp.trl do (`@` -> `_at_`)."""
    return _INVALID_METRIC_CHARS.sub("_", re.sub(r"/+", "/", str(key).replace("@", "_at_")))


def _now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------- the record


@dataclasses.dataclass
class Record:
    """Everything one node logs; written to the outbox when MLflow could not take it all."""

    record_id: str
    tracking_uri: str
    experiment: str
    artifact_location: Optional[str]
    scope: dict
    run_name: str
    tags: dict
    params: dict = dataclasses.field(default_factory=dict)
    metrics: list = dataclasses.field(default_factory=list)  # [key, value, step, timestamp_ms]
    artifacts: list = dataclasses.field(default_factory=list)  # [local path, artifact_path]
    status: str = "RUNNING"
    start_ms: int = dataclasses.field(default_factory=_now_ms)
    end_ms: Optional[int] = None
    run_id: Optional[str] = None  # set once the run exists in the store
    parent_run_id: Optional[str] = None
    error: Optional[str] = None


class _Store:
    """The MLflow calls a node makes (MlflowClient only: no fluent global state)."""

    def __init__(self, tracking_uri: str):
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow import MlflowClient  # ~2 s: only when tracking is on

        self.uri = tracking_uri
        with self.lock():  # a new SQLite store runs its schema migrations here: one process at a time
            self.client = MlflowClient(tracking_uri=tracking_uri)
            self.client.search_experiments(max_results=1)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialises experiment/parent creation (and SQLite schema set-up) on a local store.

        A server store gets no lock (jobs run on many hosts); duplicates there are resolved
        after the fact, see `converge`.
        """
        if not self.uri.startswith("sqlite:///"):
            yield
            return
        db = Path(self.uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.parent / ".repexp-tracking.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def experiment_id(self, name: str, artifact_location: Optional[str]) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(name, artifact_location=artifact_location)
            except MlflowException:  # created concurrently
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        return exp.experiment_id

    def find_parents(self, experiment_id: str, key: str) -> list:
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{PARENT_KEY_TAG}` = '{key}'", max_results=50
        )
        return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def parent(self, experiment_id: str, scope: Scope) -> tuple[str, bool]:
        """(run id, created by us) of the scope's parent run: the earliest one with its key."""
        from mlflow.entities import Param

        found = self.find_parents(experiment_id, scope.key)
        if found:
            return found[0].info.run_id, False
        run = self.client.create_run(
            experiment_id, run_name=scope.name,
            tags={PARENT_KEY_TAG: scope.key, SCOPE_TAG: scope.kind, "mlflow.source.name": "repexp", **scope.tags},
        )
        run_id = run.info.run_id
        if scope.params:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in scope.params.items()])
        self.client.set_terminated(run_id, "FINISHED")
        return run_id, True

    def find_record_run(self, experiment_id: str, record_id: str) -> Optional[str]:
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RECORD_TAG}` = '{record_id}'", max_results=1
        )
        return runs[0].info.run_id if runs else None

    def create_child(self, experiment_id: str, record: Record) -> str:
        tags = {**record.tags, "mlflow.parentRunId": record.parent_run_id, RECORD_TAG: record.record_id}
        run = self.client.create_run(experiment_id, start_time=record.start_ms, tags=tags, run_name=record.run_name)
        return run.info.run_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's per-batch limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: Sequence[Sequence]) -> None:
        from mlflow.entities import Metric

        items = [Metric(key, float(value), int(ts), int(step)) for key, value, step, ts in metrics]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_artifact(self, run_id: str, path: str, artifact_path: Optional[str]) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(run_id, path, artifact_path)
        else:
            self.client.log_artifact(run_id, path, artifact_path)

    def finish(self, record: Record, parent_created: bool, experiment_id: str, scope: Scope) -> None:
        self.client.set_terminated(record.run_id, record.status, end_time=record.end_ms)
        if not self.uri.startswith("sqlite:///"):
            self.converge(experiment_id, scope, record, parent_created)
        # A parent shows the outcome of its latest node.
        self.client.set_terminated(record.parent_run_id, "FAILED" if record.status == "FAILED" else "FINISHED")

    def converge(self, experiment_id: str, scope: Scope, record: Record, parent_created: bool) -> None:
        """Without a lock two nodes may both create a parent; all agree on the earliest one."""
        found = self.find_parents(experiment_id, scope.key)
        if not found or found[0].info.run_id == record.parent_run_id:
            return
        duplicate = record.parent_run_id
        record.parent_run_id = found[0].info.run_id
        self.client.set_tag(record.run_id, "mlflow.parentRunId", record.parent_run_id)
        if parent_created:
            self.client.delete_run(duplicate)


Store = _Store  # public name (repexp.aggregate and repexp.figures open the store through it)


def _reachable(tracking_uri: str) -> Optional[str]:
    """None if the store looks usable, else why not (seconds at most, no MLflow import)."""
    if tracking_uri.startswith(("http://", "https://")):
        url = tracking_uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as response:
                if response.status != 200:
                    return f"{url} answered HTTP {response.status}"
        except (urllib.error.URLError, OSError, ValueError) as err:
            return f"{url}: {getattr(err, 'reason', err)}"
        return None
    if tracking_uri.startswith("sqlite:///"):
        db_dir = Path(tracking_uri[len("sqlite:///"):]).parent
        try:
            db_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return f"cannot create {db_dir}: {err}"
        return None if os.access(db_dir, os.W_OK) else f"{db_dir} is not writable"
    return None


# --------------------------------------------------------------------------- node runs


class NodeRun:
    """One node's run. Methods never raise because of MLflow: failures divert to the outbox."""

    def __init__(self, record: Record, scope: Scope, outbox: Path, enabled: bool = True):
        self.record = record
        self.scope = scope
        self.outbox = outbox
        self.enabled = enabled
        self._store: Optional[_Store] = None
        self._experiment_id: Optional[str] = None
        self._parent_created = False
        self.offline_reason: Optional[str] = None
        self._staging = outbox / ".staging" / record.record_id  # log_dict files until the run ends
        self._gate = threading.Lock()  # `start` (maybe on another thread) vs `defer`
        self._deferred = False
        self._checked = False

    # ---- state
    @property
    def run_id(self) -> Optional[str]:
        """The MLflow run id, or None when tracking is off or the store was unreachable at start."""
        return self.record.run_id

    @property
    def online(self) -> bool:
        return self.enabled and self._store is not None and self.offline_reason is None

    @property
    def tracking_uri(self) -> str:
        return self.record.tracking_uri

    def _go_offline(self, reason: str) -> None:
        if self.offline_reason is None:
            self.offline_reason = reason
            print(f"[repexp.tracking] MLflow unavailable ({reason}); records go to {self.outbox} "
                  "for `repexp mlflow sync`", file=sys.stderr)

    def _try(self, what: str, fn, *args) -> None:
        if not self.online:
            return
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - tracking must never fail the node
            self._go_offline(f"{what}: {type(err).__name__}: {err}")

    # ---- lifecycle
    def start(self) -> "NodeRun":
        """Open the run in the store: its parent (created if needed), then the node run with the
        record's params. The MLflow import comes first and takes seconds; nothing is written to the
        store if `defer` was called meanwhile."""
        if not self.check_store():
            return self
        try:
            store = _Store(self.record.tracking_uri)
            with self._gate:
                if self._deferred:
                    return self
                self._store = store
                with store.lock():
                    self._experiment_id = store.experiment_id(self.record.experiment, self.record.artifact_location)
                    self.record.parent_run_id, self._parent_created = store.parent(self._experiment_id, self.scope)
                self.record.run_id = store.create_child(self._experiment_id, self.record)
                if self.record.params:
                    store.log_params(self.record.run_id, self.record.params)
        except Exception as err:  # noqa: BLE001
            self._go_offline(f"start: {type(err).__name__}: {err}")
        return self

    def check_store(self) -> bool:
        """Whether the store looks usable (once; no MLflow import, a dead server costs at most
        HEALTH_TIMEOUT_S). If not, the node is offline from here on."""
        if not self.enabled or self.offline_reason is not None:
            return False
        if not self._checked:
            self._checked = True
            reason = _reachable(self.record.tracking_uri)
            if reason:
                self._go_offline(reason)
        return self.offline_reason is None

    def defer(self) -> bool:
        """Called while `start` still runs on another thread: if the run has not been opened yet,
        keep it from being opened here; everything goes to the outbox at `end`, for an upload
        after this process (`upload_in_background`). True if deferred."""
        with self._gate:
            if not self.enabled or self._store is not None or self.offline_reason is not None:
                return False
            self._deferred = True
            self.offline_reason = "deferred to a background upload"
            return True

    @property
    def deferred(self) -> bool:
        return self._deferred

    @property
    def outbox_record(self) -> Path:
        return self.outbox / self.record.record_id

    def end(self, status: str = "FINISHED", error: Optional[str] = None) -> None:
        if not self.enabled:
            return
        self.record.status = status
        self.record.end_ms = _now_ms()
        self.record.error = error
        if error:
            self.set_tags({"repexp.error": error[-4000:]})
        if self.online:
            self._try("finish", self._store.finish, self.record, self._parent_created, self._experiment_id, self.scope)
        if not self.online:  # offline from the start, or since any call failed (finish included)
            self._write_outbox()
        shutil.rmtree(self._staging, ignore_errors=True)

    def _write_outbox(self) -> None:
        """Copy artifacts next to the record so later changes to the outputs cannot alter it."""
        directory = self.outbox_record
        files = directory / "artifacts"
        kept = []
        for i, (path, artifact_path) in enumerate(self.record.artifacts):
            src = Path(path)
            if not src.exists():
                continue
            dst = files / str(i) / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
            kept.append([str(dst.resolve()), artifact_path])
        payload = dataclasses.asdict(self.record)
        payload["artifacts"] = kept
        write_json_atomic(directory / RECORD_FILE, payload)

    # ---- logging
    def log_params(self, params: Mapping[str, Any]) -> None:
        if not self.enabled or not params:
            return
        clean = _param_values(params)
        self.record.params.update(clean)
        self._try("log_params", lambda: self._store.log_params(self.run_id, clean))

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        if not self.enabled or not metrics:
            return
        ts = _now_ms()
        rows = [[metric_name(k), float(v), int(step), ts] for k, v in metrics.items()]
        self.record.metrics.extend(rows)
        self._try("log_metrics", lambda: self._store.log_metrics(self.run_id, rows))

    def log_metric_rows(self, rows: Sequence[Sequence]) -> None:
        """[[key, value, step, timestamp_ms], ...]: whole curves in a few batched calls."""
        if not self.enabled or not rows:
            return
        rows = [[metric_name(k), float(v), int(s), int(t)] for k, v, s, t in rows]
        self.record.metrics.extend(rows)
        self._try("log_metrics", lambda: self._store.log_metrics(self.run_id, rows))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if not self.enabled or not tags:
            return
        clean = {str(k): str(v) for k, v in tags.items()}
        self.record.tags.update(clean)
        self._try("set_tags", lambda: self._store.set_tags(self.run_id, clean))

    def log_artifact(self, path: str | os.PathLike, artifact_path: Optional[str] = None) -> None:
        if not self.enabled:
            return
        path = str(Path(path).resolve())
        self.record.artifacts.append([path, artifact_path])
        self._try("log_artifact", lambda: self._store.log_artifact(self.run_id, path, artifact_path))

    def log_dict(self, obj: Any, name: str) -> None:
        """A small JSON/YAML artifact from memory (kept as a file in the outbox if offline)."""
        if not self.enabled:
            return
        text = json.dumps(obj, indent=2, sort_keys=True, default=str) if name.endswith(".json") else _yaml(obj)
        path = write_text_atomic(self._staging / name, text)
        self.log_artifact(path, str(Path(name).parent) if Path(name).parent != Path(".") else None)

    def metric_history(self) -> Optional[dict[str, set[int]]]:
        """Steps stored per metric key in MLflow (None when offline)."""
        if not self.online:
            return None
        try:
            run = self._store.client.get_run(self.run_id)
            return {key: {m.step for m in self._store.client.get_metric_history(self.run_id, key)}
                    for key in run.data.metrics}
        except Exception as err:  # noqa: BLE001
            self._go_offline(f"metric history: {type(err).__name__}: {err}")
            return None


def _param_values(params: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v)[:PARAM_MAX_CHARS] for k, v in params.items()}


def _yaml(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def _load_config(config: Any):
    from repexp import config as C

    if config is None:
        path = os.environ.get(ENV_CONFIG)
        if not path:
            raise ValueError(f"no pipeline config: pass config= or set ${ENV_CONFIG}")
        config = path
    return config if isinstance(config, C.PipelineConfig) else C.load(config)


def start_node(rule: str, task: Optional[str] = None, run: Optional[str] = None, **kwargs: Any) -> NodeRun:
    """Start a node run (`prepare_node`'s arguments; see `node_run`); the caller must call `.end(status)`."""
    return prepare_node(rule, task, run, **kwargs).start()


def prepare_node(
    rule: str,
    task: Optional[str] = None,
    run: Optional[str] = None,
    *,
    config: Any = None,
    params: Optional[Mapping[str, Any]] = None,
    tags: Optional[Mapping[str, Any]] = None,
    attempt: Optional[int] = None,
    wildcards: Optional[Mapping[str, str]] = None,
    snakemake_jobid: Optional[str] = None,
) -> NodeRun:
    """A node run's record, not yet in the store (no MLflow import): `.start()` opens it.

    `snakemake_jobid` is the rule's ``{{{jobid}}}`` (the id in braces, which are stripped); it is
    tagged only when the scheduling Snakemake formatted it, not a SLURM jobstep's own Snakemake.
    """
    from repexp import config as C

    cfg = _load_config(config)
    uri = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    scope = scope_for_rule(rule, task, run)
    wildcards = {**{k: v for k, v in (("task", task), ("run", run)) if v is not None}, **(wildcards or {})}
    commit = git_commit()
    base_tags = {
        "snakemake.rule": rule,
        "snakemake.wildcards": json.dumps(wildcards, sort_keys=True),
        "snakemake.attempt": str(attempt or 1),
        "repexp.rule": rule,
        SCOPE_KEY_TAG: scope.key,
        **scope.tags,
        "repexp.config_hash": C.config_hash(cfg),
        "repexp.config_name": cfg.name,
        "mlflow.source.name": f"repexp {rule}",
        "mlflow.source.type": "JOB",
        "host": socket.gethostname(),
        **({"git.commit": commit, "mlflow.source.git.commit": commit} if commit else {}),
        **({"slurm.job_id": os.environ["SLURM_JOB_ID"]} if os.environ.get("SLURM_JOB_ID") else {}),
        **({"snakemake.jobid": snakemake_jobid.strip("{}")}
           if snakemake_jobid and os.environ.get(ENV_SNAKEMAKE_EXEC) != "remote" else {}),
        **{k: str(v) for k, v in (tags or {}).items()},
    }
    name = rule if scope.kind == "experiment" else f"{rule} {scope.name}"
    record = Record(
        record_id=uuid.uuid4().hex,
        tracking_uri=uri,
        experiment=cfg.tracking.experiment or cfg.name,
        artifact_location=artifact_location(uri),
        scope=dataclasses.asdict(scope),
        run_name=name,
        tags=base_tags,
    )
    record.params.update(_param_values(params or {}))
    return NodeRun(record, scope, outbox_dir(cfg.results_dir), enabled=tracking_enabled())


@contextlib.contextmanager
def node_run(rule: str, task: Optional[str] = None, run: Optional[str] = None, **kwargs: Any) -> Iterator[NodeRun]:
    """Track one node: ``with node_run("eval", "gsm8k", "base", config=cfg) as t: t.log_metrics(...)``.

    `config` is a PipelineConfig or a config path (default: $REPEXP_CONFIG). The run ends
    FINISHED, or FAILED (and the exception propagates) if the body raises, or exits non-zero.
    """
    with node_scope(start_node(rule, task, run, **kwargs)) as node:
        yield node


@contextlib.contextmanager
def node_scope(node: NodeRun) -> Iterator[NodeRun]:
    """The current node while inside; ends it FINISHED, or FAILED if the body raises or exits non-zero."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, node
    try:
        yield node
    except BaseException as exc:
        code = exc.code if isinstance(exc, SystemExit) else 1
        if code in (0, None):
            node.end("FINISHED")
        else:
            node.end("FAILED", error="".join(traceback.format_exception_only(type(exc), exc)).strip())
        raise
    else:
        node.end("FINISHED")
    finally:
        _CURRENT = previous


_CURRENT: Optional[NodeRun] = None


# --------------------------------------------------------------------------- a trainer's run id

ENV_RUN_FILE = "REPEXP_MLFLOW_RUN_FILE"  # set for a trainer whose node run opens while it starts up
RUN_FILE_WAIT_S = 600.0


def open_in_background(node: NodeRun, run_file: Path) -> threading.Thread:
    """Open `node` on a thread and then write `run_file` (the run id, or null when MLflow could
    not take it), so a trainer started meanwhile finds its run when it first needs it."""
    Path(run_file).unlink(missing_ok=True)  # never a previous attempt's run

    def open_and_publish():
        try:
            node.start()
        finally:
            write_json_atomic(run_file, {"run_id": node.run_id if node.online else None,
                                         "tracking_uri": node.tracking_uri,
                                         "experiment": node.record.experiment,
                                         "offline_reason": node.offline_reason})

    opener = threading.Thread(target=open_and_publish, name="mlflow-node-start", daemon=True)
    opener.start()
    return opener


def await_node_run(timeout_s: float = RUN_FILE_WAIT_S) -> Optional[dict]:
    """In a trainer: the node run published by `open_in_background` ({"run_id", "tracking_uri",
    "experiment", "offline_reason"}), waiting for it; None when no node run was announced
    (no $REPEXP_MLFLOW_RUN_FILE). After `timeout_s` without it, a run id of None."""
    path = os.environ.get(ENV_RUN_FILE)
    if not path:
        return None
    deadline = time.monotonic() + timeout_s
    while not Path(path).exists():
        if time.monotonic() > deadline:
            return {"run_id": None, "tracking_uri": None, "experiment": None,
                    "offline_reason": f"{path} did not appear within {timeout_s:.0f} s"}
        time.sleep(0.1)
    return read_json(path)


def current_node() -> Optional[NodeRun]:
    """The node run of this process (inside `repexp mlflow node` or `node_run`), for extra logging."""
    return _CURRENT


# --------------------------------------------------------------------------- outputs -> MLflow


def flag_params(argv: Sequence[str]) -> dict[str, str]:
    """A command line -> params: positionals as cmd.argN, `--flag value` as cmd.flag."""
    params: dict[str, str] = {}
    if argv:
        params["cmd"] = argv[0]
    i, position = 1, 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            key, _, value = token[2:].partition("=")
            if not value:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    value, i = argv[i + 1], i + 1
                else:
                    value = "true"
            params[f"cmd.{key}"] = value
        else:
            params[f"cmd.arg{position}"] = token
            position += 1
        i += 1
    return params


def log_outputs(node: NodeRun, outputs: Sequence[str]) -> None:
    """Log a finished node's declared outputs: artifacts, plus metrics/params read from known files."""
    for output in outputs:
        path = Path(output)
        if not path.exists():
            continue
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                if _loggable(file) and not file.name.startswith("."):
                    node.log_artifact(file, str(Path(path.name) / file.relative_to(path).parent))
            continue
        if _loggable(path):
            node.log_artifact(path)
        _log_known_output(node, path)


def _loggable(path: Path) -> bool:
    return path.suffix not in WEIGHT_SUFFIXES and path.stat().st_size <= ARTIFACT_MAX_BYTES


def _log_known_output(node: NodeRun, path: Path) -> None:
    try:
        if path.name == "eval.json":
            from repexp.evaluate import mlflow_metrics

            metrics = mlflow_metrics(read_json(path))
            ts = _now_ms()
            rows = [[name, value, k, ts] for name in ("pass_at_k", "pass_at_k_sem", "maj_at_k")
                    for k, value in metrics.get(name, {}).items()]
            rows += [[name, value, 0, ts] for name, value in metrics.get("scalars", {}).items()]
            node.log_metric_rows(rows)
        elif path.name == "select.json":
            pointer = read_json(path)
            node.log_params({f"select.{k}": v for k, v in pointer.items() if k != "value"})
            if pointer.get("value") is not None:
                node.log_metric_rows([["best_dev_value", pointer["value"], int(pointer.get("checkpoint_step") or 0),
                                       _now_ms()]])
        elif path.name == "manifest.json":
            flat = flatten(read_json(path), "manifest.")
            node.log_params(dict(list(flat.items())[:100]))
    except Exception as err:  # noqa: BLE001 - a malformed output is the command's problem, not ours
        print(f"[repexp.tracking] could not read metrics from {path}: {err}", file=sys.stderr)


# --------------------------------------------------------------------------- sync


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
    record = Record(**read_json(directory / RECORD_FILE))
    scope = Scope(**record.scope)
    uri = tracking_uri or record.tracking_uri
    checked = unreachable if unreachable is not None else {}
    if uri not in checked:
        checked[uri] = _reachable(uri)
    if checked[uri]:
        raise ConnectionError(checked[uri])
    store = _Store(uri)
    with store.lock():
        experiment_id = store.experiment_id(record.experiment, artifact_location(uri))
        parent_id, created = store.parent(experiment_id, scope)
    record.parent_run_id = parent_id if record.run_id is None else (record.parent_run_id or parent_id)
    if record.run_id is None:
        record.run_id = store.find_record_run(experiment_id, record.record_id) or store.create_child(experiment_id, record)
    store.set_tags(record.run_id, record.tags)
    store.log_params(record.run_id, record.params)
    store.log_metrics(record.run_id, record.metrics)
    for path, artifact_path in record.artifacts:
        if Path(path).exists():
            store.log_artifact(record.run_id, path, artifact_path)
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
    with open(root / ".sync.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        for directory in pending():
            try:
                sync_record(directory, tracking_uri, unreachable)
                synced += 1
            except Exception as err:  # noqa: BLE001 - report and keep the record for next time
                errors.append(f"{directory.name}: {type(err).__name__}: {err}")
    return synced, errors


# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("sync", help="upload records kept in <results>/mlflow/outbox while MLflow was unreachable")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG)")
    src.add_argument("--results-dir", type=Path, help="results directory holding mlflow/outbox")
    src.add_argument("--record", type=Path, help="only this record directory (<results>/mlflow/outbox/<id>)")
    s.add_argument("--tracking-uri", help="upload here instead of each record's own URI")

    n = sub.add_parser("node", help="run `repexp <command>` in-process inside a node run, then log its outputs",
                       usage="repexp mlflow node --rule RULE [--task T] [--run R] [--output PATH ...] -- repexp COMMAND ...")
    n.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG)")
    n.add_argument("--rule", required=True)
    n.add_argument("--task")
    n.add_argument("--run")
    n.add_argument("--wildcard", action="append", default=[], metavar="KEY=VALUE", help="other wildcards (tags)")
    n.add_argument("--attempt", type=int, default=1)
    n.add_argument("--snakemake-jobid", help=SNAKEMAKE_JOBID_HELP)
    n.add_argument("--output", nargs="*", default=[], help="the rule's declared outputs")
    n.add_argument("command", nargs=argparse.REMAINDER, help="-- repexp COMMAND [ARGS]")

    u = sub.add_parser("uri", help="print the tracking URI of a config (for `mlflow ui --backend-store-uri`)")
    u.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG)")


def run(args: argparse.Namespace) -> int:
    from repexp import config as C

    try:
        if args.action == "uri":
            cfg = _load_config(args.config)
            print(resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri))
            return 0
        if args.action == "sync":
            if args.record:
                synced, errors = sync_one(args.record, args.tracking_uri)
            else:
                synced, errors = sync(args.results_dir or _load_config(args.config).results_dir, args.tracking_uri)
            for line in errors:
                print(f"mlflow sync: kept {line}", file=sys.stderr)
            print(f"mlflow sync: {synced} record(s) uploaded, {len(errors)} still pending", file=sys.stderr)
            return 1 if errors else 0
        return _run_node(args)
    except (C.ConfigError, ValueError, FileNotFoundError) as err:
        print(f"mlflow {args.action}: {err}", file=sys.stderr)
        return 2


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# Commands that log into the node's own run while they work, so they run in-process after it exists.
IN_RUN_COMMANDS = ("aggregate", "figures")


def _run_node(args: argparse.Namespace) -> int:
    from repexp import cli

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if command[:1] == ["repexp"]:
        command = command[1:]
    if not command or command[0] not in cli.COMMANDS or command[0] == "mlflow":
        raise ValueError(f"expected `-- repexp COMMAND ...` after the node options, got {command}")
    wildcards = dict(item.split("=", 1) for item in args.wildcard if "=" in item)
    tags = {"repexp.command": " ".join(["repexp", *command])[:5000]}
    node_args = dict(config=args.config, params=flag_params(command), tags=tags, attempt=args.attempt,
                     wildcards=wildcards, snakemake_jobid=args.snakemake_jobid)
    # SLURM (walltime, preemption, scancel) and Snakemake stop a job with SIGTERM: end the node run
    # as FAILED instead of leaving it RUNNING forever (a running child gets the signal forwarded).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if command[0] in IN_RUN_COMMANDS:
        return _run_in_node(cli, command, args, node_args)
    return _run_beside_node(command, args, node_args)


def _run_in_node(cli, command: list[str], args: argparse.Namespace, node_args: dict) -> int:
    with node_run(args.rule, args.task, args.run, **node_args) as node:
        env = {"MLFLOW_TRACKING_URI": node.tracking_uri}
        if node.online and node.run_id:
            env.update(MLFLOW_RUN_ID=node.run_id, MLFLOW_EXPERIMENT_NAME=node.record.experiment)
        with _environ(env):
            code = cli.main(command)
        if code:
            raise SystemExit(code)
        log_outputs(node, args.output)
    return 0


def _run_beside_node(command: list[str], args: argparse.Namespace, node_args: dict) -> int:
    """Run the command in a child process from the start and open the node run beside it.

    The MLflow import and run creation (seconds) overlap the command instead of delaying it. A
    command that ends before its run is open does not wait either: the node's record goes to the
    outbox and a detached `repexp mlflow sync --record` uploads it (the workflow's end syncs
    whatever is left, see the Snakefile's onsuccess/onerror).
    """
    from repexp.processes import exit_status, forwarding_signals

    node = prepare_node(args.rule, args.task, args.run, **node_args)
    node.check_store()  # an unreachable store is known (and warned about) before the command starts
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with forwarding_signals(subprocess.Popen([sys.executable, "-m", "repexp", *command], env=env)) as proc:
        opener = threading.Thread(target=node.start, name="mlflow-node-start", daemon=True)
        opener.start()
        code = exit_status(proc.wait())
    if not node.defer():
        opener.join()
    error = f"`repexp {command[0]}` exited with status {code}" if code else None
    if not code:
        try:
            log_outputs(node, args.output)
        except SystemExit as stop:  # SIGTERM while logging
            code, error = stop.code, f"stopped while logging the outputs (status {stop.code})"
    node.end("FAILED" if code else "FINISHED", error=error)
    if node.deferred:  # the opener thread (a daemon) stops at its gate, writing nothing
        upload_in_background(node.outbox_record)
    return code


def upload_in_background(record_dir: Path) -> None:
    """Start `repexp mlflow sync --record DIR` in its own session (it outlives this job's process group)."""
    with open(record_dir / "sync.log", "ab") as log_file:
        subprocess.Popen([sys.executable, "-m", "repexp", "mlflow", "sync", "--record", str(record_dir)],
                         stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True)
