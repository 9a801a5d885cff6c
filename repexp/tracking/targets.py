"""Where `repexp aggregate` and `repexp figures` log outside a node's own run: the sweep points' parent runs
(test pass@k) and the figures' run. `MlflowTarget` names the store and experiment; `mlflow_target` finds
them (flags, the enclosing node run, the config); `log_point_metrics` puts metrics on parent runs, through
the node run when there is one (its outbox keeps them while MLflow is unreachable)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from repexp.tracking.names import results_id as results_id_of
from repexp.tracking.node import current_node, tracking_enabled
from repexp.tracking.scopes import scope_for
from repexp.tracking.store import Store, resolve_tracking_uri

if TYPE_CHECKING:
    from repexp.config import RunSpec


@dataclasses.dataclass(frozen=True)
class MlflowTarget:
    tracking_uri: str | None
    experiment: str
    artifact_location: str | None = None
    results_id: str | None = None  # parents of this results directory only (repexp.tracking.names.results_id)


def mlflow_target(tracking_uri: str | None, experiment: str | None,
                  config: str | Path | None = None) -> MlflowTarget | None:
    """Where to log, or None. Inside `repexp run aggregate|figures` the node run's store
    and experiment are the defaults; `--experiment`/`--tracking-uri` override them. The tracking URI falls
    back to the config's (repexp.tracking's resolution: `tracking.tracking_uri`, $MLFLOW_TRACKING_URI, SQLite
    under results/), then $MLFLOW_TRACKING_URI. REPEXP_TRACKING=off disables logging."""
    if not tracking_enabled():
        return None
    node = current_node()
    node = node if node is not None and node.enabled else None
    if experiment is None and node is None:
        return None
    results_id = node.scope.results_id if node is not None else None
    if tracking_uri is None and node is not None:
        tracking_uri = node.tracking_uri
    if config is not None and (tracking_uri is None or results_id is None):
        from repexp.config import load

        cfg = load(config)
        tracking_uri = tracking_uri or resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
        results_id = results_id or results_id_of(cfg.results_dir)
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if experiment is None:
        return MlflowTarget(tracking_uri, node.record.experiment, node.record.artifact_location, results_id)
    same = node is not None and node.record.experiment == experiment and node.tracking_uri == tracking_uri
    return MlflowTarget(tracking_uri, experiment, node.record.artifact_location if same else None, results_id)


def node_for_target(target: MlflowTarget):
    """The enclosing node run when `target` is its own store and experiment (it logs, or keeps for sync)."""
    node = current_node()
    same = node is not None and node.enabled and (node.tracking_uri, node.record.experiment) == (
        target.tracking_uri, target.experiment)
    return node if same else None


def mlflow_store(target: MlflowTarget):
    """(store, experiment id) through repexp.tracking's MLflow adapter (its parent-run rules and SQLite lock)."""
    import mlflow

    store = Store(target.tracking_uri or mlflow.get_tracking_uri())
    with store.lock():
        experiment_id = store.experiment_id(target.experiment, target.artifact_location)
    return store, experiment_id


def log_point_metrics(target: MlflowTarget,
                      points: Mapping[RunSpec, Mapping[str, float]]) -> dict[str, str | None]:
    """Log `{run: {metric: value}}` (step 0) on each sweep point's parent run (of this results directory).

    Parents are those of repexp.tracking (tag `repexp.parent_key` = 'point:<task>/<run>'). Inside a node run
    on the same store this goes through the node run: with MLflow unreachable the metrics are kept in its
    outbox record and reach the parents at `repexp mlflow sync`. Returns {'<task>/<run>': parent run id or
    None (through the node run)}.
    """
    now = int(time.time() * 1000)
    node = node_for_target(target)
    if node is not None:
        for spec, metrics in points.items():
            node.log_parent_metrics(scope_for(spec.task, spec), [[k, v, 0, now] for k, v in metrics.items()])
        return {spec.path: None for spec in points}
    store, experiment_id = mlflow_store(target)
    logged = {}
    for spec, metrics in points.items():
        scope = scope_for(spec.task, spec, results_id=target.results_id)
        with store.lock():
            parent_id, _ = store.parent(experiment_id, scope)
        store.log_metrics(parent_id, [[k, v, 0, now] for k, v in metrics.items()])
        logged[spec.path] = parent_id
    return logged
