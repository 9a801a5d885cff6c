"""Parent runs, created once when the workflow starts (`repexp mlflow parents --config CFG`).

The Snakefile's `onstart` calls it before the first job: the experiment and every parent run of
the config (sweep points with their params, tasks, the experiment) are found or created in one
process, and their ids are written to `<results>/mlflow/parents.json`. Nodes read the file and
never search or race for their parent. Without the file (a standalone command, or MLflow down at
the workflow's start) a node finds or creates its parent itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

from repexp.io import write_json_atomic
from repexp.tracking.health import record_healthy
from repexp.tracking.names import PARENTS_FILE, RESULTS_DIR_TAG, mlflow_dir, results_id
from repexp.tracking.scopes import all_scopes
from repexp.tracking.store import Store, artifact_location, is_sqlite, reachable, resolve_tracking_uri, sqlite_path


def create_parents(cfg) -> dict:
    """Find or create every parent run of `cfg`; returns what parents.json holds."""
    uri = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    experiment = cfg.tracking.experiment or cfg.name
    rid = results_id(cfg.results_dir)
    results_abs = str(Path(cfg.results_dir).resolve())
    store = Store(uri)
    parents = {}
    with store.lock():
        experiment_id = store.experiment_id(experiment, artifact_location(uri))
        for scope in all_scopes(cfg, rid):
            parents[scope.key], _ = store.parent(experiment_id, scope, {RESULTS_DIR_TAG: results_abs})
    known = {"tracking_uri": uri, "experiment": experiment, "experiment_id": experiment_id, "results_id": rid,
             "parents": parents}
    write_json_atomic(mlflow_dir(cfg.results_dir) / PARENTS_FILE, known)
    if is_sqlite(uri):
        record_healthy(sqlite_path(uri), cfg.results_dir)  # the ledger: this results directory uses it now
    return known


def run_parents(cfg) -> int:
    """The CLI action: never fails the workflow (nodes create their parents themselves if needed)."""
    uri = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    reason = reachable(uri, results_dir=cfg.results_dir)
    if reason:
        print(f"mlflow parents: MLflow unreachable ({reason}); nodes will find or create their parents, "
              "or keep their records for `repexp mlflow sync`", file=sys.stderr)
        return 0
    try:
        known = create_parents(cfg)
    except Exception as err:  # noqa: BLE001 - tracking never stops the workflow
        print(f"mlflow parents: {type(err).__name__}: {err}", file=sys.stderr)
        return 0
    print(f"mlflow parents: {len(known['parents'])} parent runs in experiment {known['experiment']!r} "
          f"({uri})", file=sys.stderr)
    return 0
