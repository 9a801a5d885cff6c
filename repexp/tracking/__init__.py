"""MLflow on every pipeline node, and `repexp mlflow` (sync | restore | parents | serve | ui | uri).

Layout in MLflow (docs/tracking.md): one experiment per config; parent runs per results directory
(one per sweep point, task and experiment: `scopes`); one child run per node execution under its parent.

Modules, in the order a node uses them:

| module | what it holds |
|---|---|
| `names` | environment variables, tags, files under `<results>/mlflow/` (metric names: `repexp.metrics`) |
| `scopes` | which parent a node hangs under |
| `gitinfo`, `context` | git tags; the `mlflow.run_context_provider` entry point |
| `store` | tracking URI resolution, the reachability check, the `MlflowClient` calls (`Store`) |
| `record` | what a node logged, as written to the outbox |
| `node` | `NodeRun`, `prepare_node` / `node_run` / `node_scope`, the trainer's run-id file |
| `outputs` | `run_stage`: a stage inside its node run; its result and outputs → MLflow; datasets |
| `outbox` | what MLflow lacks for an unreachable server: records and `repexp mlflow sync` |
| `parents` | parent runs created at workflow start |
| `targets` | where `repexp aggregate` and `repexp figures` log (`MlflowTarget`), and their metrics on parent runs |
| `server` | `repexp mlflow serve`, the cluster's tracking server on the submit host |
| `workflow` | the Snakefile's onstart/onsuccess/onerror hooks |
| `cli` | the `repexp mlflow` command |

Tracking never costs results: if the store cannot be reached (checked up front with a short
HTTP timeout) or fails midway, the node keeps running and everything it would have logged is
written to ``<results>/mlflow/outbox/<record>/`` for ``repexp mlflow sync``.

`mlflow` is imported lazily: importing this package costs nothing.
"""

from __future__ import annotations

from repexp.metrics import metric_name
from repexp.tracking.cli import configure_parser, run
from repexp.tracking.gitinfo import REPO_ROOT
from repexp.tracking.names import (
    ENV_RUN_FILE,
    ENV_SNAKEMAKE_EXEC,
    ENV_TRACKING,
    EXECUTION_TAG,
    PARENT_KEY_TAG,
    RECORD_FILE,
    RESULTS_ID_TAG,
    SCOPE_KEY_TAG,
    SUPERSEDED_TAG,
    SWEEP_POINT_TAG,
    SYNCED_FILE,
    default_tracking_uri,
    results_id,
)
from repexp.tracking.node import (
    NodeFailed,
    NodeInterrupted,
    await_node_run,
    current_node,
    flatten,
    node_run,
    node_scope,
    open_in_background,
    prepare_node,
)
from repexp.tracking.outbox import pending_records, sync, sync_one
from repexp.tracking.outputs import log_artifacts, log_result, run_stage
from repexp.tracking.record import Record
from repexp.tracking.scopes import scope_for
from repexp.tracking.store import resolve_tracking_uri
from repexp.tracking.targets import MlflowTarget, log_point_metrics, mlflow_store, mlflow_target, node_for_target

__all__ = [
    "ENV_RUN_FILE", "ENV_SNAKEMAKE_EXEC", "ENV_TRACKING", "EXECUTION_TAG", "PARENT_KEY_TAG", "RECORD_FILE",
    "REPO_ROOT", "RESULTS_ID_TAG", "SCOPE_KEY_TAG", "SUPERSEDED_TAG", "SWEEP_POINT_TAG", "SYNCED_FILE", "NodeFailed",
    "NodeInterrupted", "Record", "MlflowTarget", "await_node_run", "configure_parser", "current_node",
    "default_tracking_uri", "flatten", "log_artifacts", "log_point_metrics", "log_result", "metric_name",
    "mlflow_store", "mlflow_target", "node_for_target", "node_run", "node_scope", "open_in_background",
    "pending_records", "prepare_node", "resolve_tracking_uri", "results_id", "run", "run_stage", "scope_for", "sync",
    "sync_one",
]
