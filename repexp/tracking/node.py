"""One node's MLflow run: prepared without MLflow, opened beside the command, never failing it.

`prepare_node` builds the record (tags, params) from the pipeline config; `NodeRun.start` opens
the run (usually on a thread while the command already runs); logging methods write to MLflow
while it answers and keep everything in the record; `end` finishes the run, or writes the record
to the outbox when any MLflow call failed (or the store was unreachable from the start).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from repexp import joblog
from repexp.io import read_json, write_json_atomic
from repexp.metrics import metric_name
from repexp.processes import pid_alive
from repexp.tracking.auth import use_results_login
from repexp.tracking.gitinfo import git_tags
from repexp.tracking.names import (
    ATTEMPT_TAG,
    ENV_CONFIG,
    ENV_RUN_FILE,
    ENV_SNAKEMAKE_EXEC,
    ENV_SYSTEM_METRICS,
    ENV_TRACKING,
    ERROR_TAG,
    EXECUTION_TAG,
    LOG_TAG,
    PARENTS_FILE,
    PID_TAG,
    RECORD_FILE,
    RESULTS_DIR_TAG,
    RESULTS_ID_TAG,
    RULE_TAG,
    SCOPE_KEY_TAG,
    STOPPED_TAG,
    SYSTEM_METRICS_RULES,
    WILDCARDS_TAG,
    mlflow_dir,
    outbox_dir,
    results_id,
)
from repexp.tracking.record import Record, now_ms
from repexp.tracking.scopes import Scope, scope_for_rule
from repexp.tracking.store import Store, artifact_location, execution_number, reachable, resolve_tracking_uri

PARAM_MAX_CHARS = 6000
ERROR_MAX_CHARS = 4000
RUN_FILE_WAIT_S = 600.0


def tracking_enabled() -> bool:
    return os.environ.get(ENV_TRACKING, "on").strip().lower() not in {"0", "off", "false", "no"}


def system_metrics_enabled(rule: str) -> bool:
    """MLflow's system metrics on the long nodes, unless MLflow's own switch says false."""
    setting = os.environ.get(ENV_SYSTEM_METRICS, "").strip().lower()
    return rule in SYSTEM_METRICS_RULES and setting not in {"0", "false", "off", "no"}


def flatten(obj: Any, prefix: str = "", sep: str = ".") -> dict[str, str]:
    """Nested dicts -> {"a.b": "value"} (lists and scalars as text), for MLflow params. An unset
    value (None: a GRPO run's sparse_dim) is left out, not logged as the string 'None'."""
    if not isinstance(obj, Mapping):
        return {} if obj is None else {prefix[: -len(sep)] if prefix else "value": str(obj)}
    return {k: v for key, value in obj.items() for k, v in flatten(value, f"{prefix}{key}{sep}", sep).items()}


def param_values(params: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v)[:PARAM_MAX_CHARS] for k, v in params.items() if v is not None}


def _metric_rows(rows: Sequence[Sequence]) -> list[list]:
    return [[metric_name(k), float(v), int(s), int(t)] for k, v, s, t in rows]


class NodeRun:
    """One node's run. Methods never raise because of MLflow: failures divert to the outbox."""

    def __init__(self, record: Record, scope: Scope, outbox: Path, enabled: bool = True,
                 system_metrics: bool = False):
        self.record = record
        self.scope = scope
        self.outbox = outbox
        self.enabled = enabled
        self.system_metrics = system_metrics
        self._store: Optional[Store] = None
        self._experiment_id: Optional[str] = None
        self._parent_created = False
        self._monitor = None
        self.offline_reason: Optional[str] = None
        self._gate = threading.Lock()  # `start` (maybe on another thread) vs `defer`
        self.deferred = False
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
    def start(self) -> NodeRun:
        """Open the run in the store: its parent (from parents.json, else found or created), then the
        node run, marking earlier executions of this node that a killed process left RUNNING. The
        MLflow import comes first and takes seconds; nothing is written if `defer` was called meanwhile."""
        if not self.check_store():
            return self
        try:
            store = Store(self.record.tracking_uri)
            with self._gate:
                if self.deferred:
                    return self
                self._store = store
                self._experiment_id, self.record.parent_run_id, self._parent_created = open_parent(store, self.record,
                                                                                                     self.scope)
                self.record.run_id = open_child(store, self._experiment_id, self.record, end_stale=True)
                if self.record.params:
                    store.log_params(self.record.run_id, self.record.params)
                if self.record.inputs:
                    store.log_inputs(self.record.run_id, self.record.inputs)
            if self.system_metrics:
                self._start_monitor()
        except Exception as err:  # noqa: BLE001
            self._go_offline(f"start: {type(err).__name__}: {err}")
        return self

    def _start_monitor(self) -> None:
        """MLflow's own system-metrics sampler (CPU, memory, disk, network; GPU with nvidia-ml-py)."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop INFO lines
            self._monitor = SystemMetricsMonitor(self.run_id, tracking_uri=self.tracking_uri)
            self._monitor.start()
        except Exception as err:  # noqa: BLE001 - diagnostics only
            print(f"[repexp.tracking] system metrics off: {type(err).__name__}: {err}", file=sys.stderr)
            self._monitor = None

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            with contextlib.suppress(Exception):
                monitor.finish()

    def check_store(self) -> bool:
        """Whether the store looks usable (once; no MLflow import, a dead server costs at most a few
        seconds). If not, the node is offline from here on."""
        if not self.enabled or self.offline_reason is not None:
            return False
        if not self._checked:
            self._checked = True
            # a node run by hand against its results directory's server: the login from its credentials file
            use_results_login(self.record.tracking_uri, self.record.results_dir)
            reason = reachable(self.record.tracking_uri, results_dir=self.record.results_dir)
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
            self.deferred = True
            self.offline_reason = "deferred to a background upload"
            return True

    @property
    def outbox_record(self) -> Path:
        return self.outbox / self.record.record_id

    def end(self, status: str = "FINISHED", error: Optional[str] = None) -> None:
        if not self.enabled:
            return
        self._stop_monitor()
        self.record.status = status
        self.record.end_ms = now_ms()
        self.record.error = error
        if error:
            self.set_tags({ERROR_TAG: error[-ERROR_MAX_CHARS:]})
        if self.online:
            self._try("finish", self._store.finish, self.record, self._parent_created, self._experiment_id, self.scope)
        if not self.online:  # offline from the start, or since any call failed (finish included)
            try:
                self.record.write(self.outbox_record)
            except OSError as err:  # a full disk: the record written at the start stays for sync
                print(f"[repexp.tracking] could not write {self.outbox_record / RECORD_FILE} ({err}); the record "
                      "written when the node started stays there, and sync uploads it as KILLED", file=sys.stderr)
        else:
            shutil.rmtree(self.outbox_record, ignore_errors=True)  # all in the store: the started record goes

    # ---- logging
    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.enabled and params:
            clean = param_values(params)
            self.record.params.update(clean)
            self._try("log_params", lambda: self._store.log_params(self.run_id, clean))

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        ts = now_ms()
        self.log_metric_rows([[k, v, step, ts] for k, v in metrics.items()])

    def log_metric_rows(self, rows: Sequence[Sequence]) -> None:
        """[[key, value, step, timestamp_ms], ...]: whole curves in a few batched calls."""
        if self.enabled and rows:
            rows = _metric_rows(rows)
            self.record.metrics.extend(rows)
            self._try("log_metrics", lambda: self._store.log_metrics(self.run_id, rows))

    def fill_metric_rows(self, rows: Sequence[Sequence]) -> int:
        """Log the rows whose (key, step) the run lacks; offline, keep them for sync to check the
        same way. Returns how many were logged now (or all of them, when kept for sync)."""
        if not self.enabled or not rows:
            return 0
        rows = _metric_rows(rows)
        if self.online:
            try:
                missing = self._store.missing_rows(self.run_id, rows)
                self._store.log_metrics(self.run_id, missing, exact=True)  # a trainer's curve: its own digits
                self.record.fill_metrics.extend(missing)  # a replay compares them by (key, step) again
                return len(missing)
            except Exception as err:  # noqa: BLE001
                self._go_offline(f"log_metrics: {type(err).__name__}: {err}")
        self.record.fill_metrics.extend(rows)
        return len(rows)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled and tags:
            clean = {str(k): str(v) for k, v in tags.items()}
            self.record.tags.update(clean)
            self._try("set_tags", lambda: self._store.set_tags(self.run_id, clean))

    def log_artifact(self, path: str | os.PathLike, artifact_path: Optional[str] = None) -> None:
        if self.enabled:
            path = str(Path(path).resolve())
            self.record.artifacts.append([path, artifact_path])
            self._try("log_artifact", lambda: self._store.log_artifact(self.run_id, path, artifact_path))

    def log_inputs(self, datasets: Sequence[Mapping[str, Any]]) -> None:
        """Datasets as MLflow inputs (`repexp.tracking.outputs.dataset`); before `start` they are
        logged when the run opens."""
        if self.enabled and datasets:
            datasets = [dict(d) for d in datasets]
            self.record.inputs.extend(datasets)
            self._try("log_inputs", lambda: self._store.log_inputs(self.run_id, datasets))

    def log_table(self, artifact_file: str, data: Mapping[str, list]) -> None:
        """A table artifact (MLflow's `log_table`, shown by the UI's artifact viewer)."""
        if self.enabled:
            data = {k: list(v) for k, v in data.items()}
            self.record.tables.append([artifact_file, data])
            self._try("log_table", lambda: self._store.log_table(self.run_id, artifact_file, data))

    def log_parent_metrics(self, scope: Scope, rows: Sequence[Sequence]) -> None:
        """Metrics on another scope's parent run (of this node's results directory), e.g. test
        pass@k on every sweep point's parent; kept for sync like everything else when offline."""
        if self.enabled and rows:
            scope = dataclasses.replace(scope, results_id=self.scope.results_id)
            rows = _metric_rows(rows)
            self.record.parent_metrics.append({"scope": dataclasses.asdict(scope), "metrics": rows})
            self._try("log_parent_metrics",
                      lambda: self._store.log_metrics(open_parent(self._store, self.record, scope)[1], rows))


def open_parent(store: Store, record: Record, scope: Scope) -> tuple[str, str, bool]:
    """(experiment id, parent run id, created here) of `scope`'s parent: the ids the workflow recorded at
    its start (`repexp mlflow parents`), else found or created under the store's lock."""
    known = known_parents(record)
    if known and scope.key in known["parents"] and store.run_exists(known["parents"][scope.key]):
        return known["experiment_id"], known["parents"][scope.key], False
    with store.lock():
        experiment_id = store.experiment_id(record.experiment, record.artifact_location)
        parent_id, created = store.parent(experiment_id, scope,
                                          {k: v for k, v in record.tags.items() if k == RESULTS_DIR_TAG})
    return experiment_id, parent_id, created


def known_parents(record: Record) -> Optional[dict]:
    """parents.json of the record's results directory, if it was written for the same store,
    experiment and results id."""
    try:
        known = read_json(mlflow_dir(record.results_dir) / PARENTS_FILE) if record.results_dir else {}
    except (OSError, ValueError):
        return None
    same = (known.get("tracking_uri"), known.get("experiment"), known.get("results_id")) == (
        record.tracking_uri, record.experiment, record.tags.get(RESULTS_ID_TAG))
    return known if same else None


def open_child(store: Store, experiment_id: str, record: Record, *, end_stale: bool) -> str:
    """Create the node's run with its execution number; with `end_stale` (a live start, never a
    replay of an old record) earlier executions that a killed process left RUNNING become KILLED."""
    earlier = store.earlier_executions(experiment_id, record.parent_run_id, record.tags[RULE_TAG],
                                       record.tags[WILDCARDS_TAG], record.start_ms)
    # the number the node was given (its execution log's, repexp.joblog) unless the store knows more executions
    # (runs from before the execution logs); a record uploaded late keeps its own number
    execution = str(max(int(execution_number(earlier)), int(record.tags.get(EXECUTION_TAG) or 0)))
    record.tags[EXECUTION_TAG] = execution
    if execution != "1" and "#" not in record.run_name:
        record.run_name = f"{record.run_name} #{execution}"
    run_id = store.create_child(experiment_id, record)
    if end_stale:
        # Snakemake never runs two executions of one job at once, so a RUNNING one on another host (or
        # without a pid) is taken for dead; on this host a live pid means a concurrent caller of the same
        # node (not the pipeline's case), whose run must not be ended under it.
        store.supersede([r for r in earlier if r.info.status == "RUNNING" and not process_alive(r.data.tags)],
                        run_id, execution)
    return run_id


def process_alive(tags: Mapping[str, str]) -> Optional[bool]:
    """Whether the process that opened a run (its `host` and pid tags) still runs; None where this
    host cannot tell (another host, or no pid)."""
    pid = tags.get(PID_TAG, "")
    if tags.get("host") != socket.gethostname() or not pid.isdigit() or int(pid) <= 0:
        return None
    return pid_alive(int(pid))


def load_config(config: Any):
    from repexp import config as C

    config = os.environ.get(ENV_CONFIG) if config is None else config
    if not config:
        raise ValueError(f"no pipeline config: pass config= or set ${ENV_CONFIG}")
    return config if isinstance(config, C.PipelineConfig) else C.load(config)


def prepare_node(
    rule: str,
    task: Optional[str] = None,
    run: Any = None,
    *,
    config: Any = None,
    params: Optional[Mapping[str, Any]] = None,
    tags: Optional[Mapping[str, Any]] = None,
    attempt: Optional[int] = None,
    wildcards: Optional[Mapping[str, str]] = None,
    snakemake_jobid: Optional[str] = None,
) -> NodeRun:
    """A node run's record, not yet in the store (no MLflow import): `.start()` opens it.

    `run`: a RunSpec, or the name of one of the config's runs. Params: the sweep point's (task, method,
    backend, sparse_dim, beta, seed; the task for preprocess) and `params`. `snakemake_jobid` is the
    rule's ``{{{jobid}}}`` (the id in braces, which are stripped); it is tagged only when the scheduling
    Snakemake formatted it, not a SLURM jobstep's own Snakemake.
    """
    from repexp import config as C

    cfg = load_config(config)
    enabled = tracking_enabled()
    uri = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    results_abs = str(Path(cfg.results_dir).resolve())
    rid = None
    try:
        rid = results_id(cfg.results_dir) if enabled else None
    except OSError as err:  # parents are then found by key alone
        print(f"[repexp.tracking] no results id for {cfg.results_dir} ({err})", file=sys.stderr)
    # a sweep point is one of the config's runs, looked up by its name (never parsed)
    point = run if run is None or isinstance(run, C.RunSpec) else C.find_run(cfg, task, run)
    run = point.name if point is not None else None
    scope = scope_for_rule(rule, task, point, results_id=rid)
    wildcards = {**{k: v for k, v in (("task", task), ("run", run)) if v is not None}, **(wildcards or {})}
    base_tags = {
        RULE_TAG: rule,
        WILDCARDS_TAG: json.dumps(wildcards, sort_keys=True),
        ATTEMPT_TAG: str(attempt or 1),
        "repexp.rule": rule,
        SCOPE_KEY_TAG: scope.key,
        **scope.tags,
        **({RESULTS_ID_TAG: rid} if rid else {}),
        RESULTS_DIR_TAG: results_abs,
        "repexp.config_hash": C.config_hash(cfg),
        "repexp.config_name": cfg.name,
        "mlflow.source.name": f"repexp {rule}",
        "mlflow.source.type": "JOB",
        "host": socket.gethostname(),
        PID_TAG: str(os.getpid()),  # with the host: whether a RUNNING execution's process is still alive
        **git_tags(),
        **({"slurm.job_id": os.environ["SLURM_JOB_ID"]} if os.environ.get("SLURM_JOB_ID") else {}),
        **({"snakemake.jobid": snakemake_jobid.strip("{}")}
           if snakemake_jobid and os.environ.get(ENV_SNAKEMAKE_EXEC) != "remote" else {}),
        **{k: str(v) for k, v in (tags or {}).items()},
    }
    record = Record(
        record_id=uuid.uuid4().hex,
        tracking_uri=uri,
        experiment=cfg.tracking.experiment or cfg.name,
        artifact_location=artifact_location(uri),
        scope=dataclasses.asdict(scope),
        run_name=rule if scope.kind == "experiment" else f"{rule} {scope.name}",
        tags=base_tags,
        results_dir=results_abs,
    )
    record.params.update(param_values({**(params or {}), **scope.params}))
    log = joblog.current()
    if log is not None:  # `repexp run --log`: the execution's number and its own log file
        record.tags.update({EXECUTION_TAG: str(log.execution), LOG_TAG: str(log.path.resolve())})
    node = NodeRun(record, scope, outbox_dir(cfg.results_dir), enabled=enabled,
                   system_metrics=system_metrics_enabled(rule))
    # Before the node's work: its record in the outbox, so an attempt whose end cannot be written (a full
    # disk, SIGKILL) is not lost. Removed when the run ends in the store.
    try:
        if enabled:
            write_json_atomic(node.outbox_record / RECORD_FILE, dataclasses.asdict(record))
    except OSError as err:
        print(f"[repexp.tracking] could not write {node.outbox_record / RECORD_FILE} ({err})", file=sys.stderr)
    return node


def node_run(rule: str, task: Optional[str] = None, run: Any = None, **kwargs: Any
             ) -> contextlib.AbstractContextManager[NodeRun]:
    """Track one node: ``with node_run("eval", "gsm8k", "base", config=cfg) as t: ...``; `config` is
    a PipelineConfig or a config path (default: $REPEXP_CONFIG); ends as `node_scope` says."""
    return node_scope(prepare_node(rule, task, run, **kwargs).start())


class _NodeExit(SystemExit):
    def __init__(self, code: int, message: str):
        super().__init__(code)
        self.message = message


class NodeFailed(_NodeExit):
    """Ends a node with an exit status and the message that goes into `repexp.error`."""


class NodeInterrupted(_NodeExit):
    """Ends a node KILLED on purpose (a walltime chunk's end): `message` goes into `repexp.stopped`."""


@contextlib.contextmanager
def as_current(node: NodeRun) -> Iterator[NodeRun]:
    """`node` is `current_node()` while inside (for a stage's extra logging); nothing ends it."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, node
    try:
        yield node
    finally:
        _CURRENT = previous


@contextlib.contextmanager
def node_scope(node: NodeRun) -> Iterator[NodeRun]:
    """The current node while inside; ends it FINISHED, or FAILED if the body raises or exits non-zero."""
    with as_current(node):
        try:
            yield node
        except BaseException as exc:
            code = exc.code if isinstance(exc, SystemExit) else 1
            if code in (0, None):
                node.end("FINISHED")
            elif isinstance(exc, NodeInterrupted):
                node.set_tags({STOPPED_TAG: exc.message})
                node.end("KILLED")
            elif isinstance(exc, NodeFailed):
                node.end("FAILED", error=exc.message)
            else:
                node.end("FAILED", error="".join(traceback.format_exception_only(type(exc), exc)).strip())
            raise
        node.end("FINISHED")


_CURRENT: Optional[NodeRun] = None


def current_node() -> Optional[NodeRun]:
    """The node run of this process (inside `repexp run` or `node_run`), for extra logging."""
    return _CURRENT


# --------------------------------------------------------------------------- a trainer's run id


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
    """In a trainer: the run `open_in_background` published, waited for (a run id of None after
    `timeout_s`); None when no node run was announced (no $REPEXP_MLFLOW_RUN_FILE)."""
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
