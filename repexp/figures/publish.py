"""The figures and tables as MLflow artifacts of the `figures` node run (or a standalone 'figures' run)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def log_figures_run(target, figure_paths: Sequence[Path], table_files: Sequence[Path]) -> str | None:
    """Make the figures and the tables artifacts of the 'figures' run; returns its id (None if offline).

    Inside `repexp run figures` that is the node run: the figures at its root, the tables under
    `table/` (offline they go to the outbox with the rest of the record). Standalone (`--experiment`),
    a run named 'figures' is created under the experiment's parent run with everything under `figures/`
    and `table/`.
    """
    from repexp import tracking

    artifacts = [(path, None) for path in figure_paths] + [(path, "table") for path in table_files]
    node = tracking.current_node()
    if node is not None and node.enabled and target.experiment == node.record.experiment:
        for path, where in artifacts:
            node.log_artifact(path, where)
        return node.run_id
    store, experiment_id = tracking.mlflow_store(target)
    with store.lock():
        parent_id, _ = store.parent(experiment_id, tracking.scope_for(results_id=getattr(target, "results_id", None)))
    run = store.client.create_run(experiment_id, run_name="figures",
                                  tags={"mlflow.parentRunId": parent_id, "repexp.rule": "figures",
                                        tracking.SCOPE_KEY_TAG: tracking.scope_for().key})
    status = "FAILED"
    try:
        for path, where in artifacts:
            store.client.log_artifact(run.info.run_id, str(path), where or "figures")
        status = "FINISHED"
    finally:
        store.client.set_terminated(run.info.run_id, status)
    return run.info.run_id
