"""`repexp mlflow ui`: one link that opens the MLflow UI on the eval runs, compared (issue 25, item 1).

MLflow 3.17's runs page keeps its columns in the browser's local storage, so no link of
searchFilter/orderByKey alone shows the params a comparison needs. Its saved view ("Save view") does:
the page's state stored as the experiment tag `mlflow.sharedViewState.<id>` and opened by
`#/experiments/<experiment>/runs?viewStateShareKey=<id>` (read by the bundle's runs-page chunk,
3878.*.js). `publish_view` writes what that button writes; the view is also in the page's views menu.

`workflowType=machine_learning` in the link opens the "Model training" side of the UI: in 3.17.2
the experiment kind comes from that URL parameter or the browser's last choice (default GenAI); the
`mlflow.experimentKind` tag is not read for it (the bundle's feature flag for that is on: main.*.js,
`const{workflowType:t}=(0,a.B)(),n=(0,s.Z0)();...n?m(t):<the tag>`, with `Z0:()=>R`, `R=()=>!0`).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any, Optional

from repexp.tracking.names import RESULTS_ID_TAG, RULE_TAG

SAVED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow UI's saved views of the runs page
VIEW_KEY_PARAM = "viewStateShareKey"
VIEW_PREFIX = "repexp-eval-"  # + the results id: one view per results directory sharing a store
WORKFLOW_PARAM = ("workflowType", "machine_learning")
# Params of every eval node run (its sweep point's, repexp.tracking.scopes.scope_for) shown first; then each
# parameter of the sweep's methods (`columns`): a run shows "-" for those of other methods
COLUMNS = ("task", "method", "seed")
RUN_NAME_COLUMN = "attributes.`Run Name`"
WIDTHS = {RUN_NAME_COLUMN: 300}  # room for "eval <task>/<run>"; the metric's header is sized below


def headline_metric(cfg) -> str:
    """`test/pass_at_<n>`, n the eval's samples per problem (the largest k evaluated); with tasks of
    different n, the largest (the eval runs of the others show no value in that column)."""
    from repexp import config as C
    from repexp import metrics as metric_names

    n = max(C.task_section(cfg, task, "eval").n_samples for task in cfg.sweep.tasks)
    return metric_names.pass_at_k(metric_names.TEST, n)


def columns(cfg) -> tuple[str, ...]:
    """The view's param columns: `COLUMNS`, then the swept parameters (those in the run name) of the methods the
    sweep runs (any task), in the method table's order and each method's `Params` order."""
    from repexp import config as C
    from repexp.methods import METHODS

    methods = dict.fromkeys(name for task in cfg.sweep.tasks for name in C.task_sweep(cfg, task))
    ordered = [name for name in METHODS if name in methods]
    return tuple(dict.fromkeys([*COLUMNS, *(field for name in ordered for field in METHODS[name].named_fields())]))


def column(kind: str, name: str) -> str:
    """The UI's column id (its canonical sort key), e.g. params.`beta`."""
    return f"{kind}.`{name}`"


def view_state(metric: str, results: Optional[str] = None, params: tuple[str, ...] = COLUMNS) -> dict[str, Any]:
    """The runs page's state: this results directory's eval runs, best headline pass@k first, with
    the sweep point's params (`params`: `columns(cfg)`) beside it. Keys the UI does not find here keep its
    defaults."""
    search = f"tags.`{RULE_TAG}` = 'eval'"
    if results:  # a store (and experiment) can hold several results directories (docs/tracking.md)
        search += f" AND tags.`{RESULTS_ID_TAG}` = '{results}'"
    shown = [column("metrics", metric), *(column("params", name) for name in params)]
    return {
        "searchFilter": search,
        "orderByKey": column("metrics", metric),
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "selectedColumns": shown,
        "columnOrder": [RUN_NAME_COLUMN, *shown],
        "columnWidths": {**WIDTHS, column("metrics", metric): 40 + 8 * len(metric)},
    }


def publish_view(server_uri: str, experiment: str, metric: str, results: Optional[str],
                 params: tuple[str, ...] = COLUMNS) -> str:
    """Save the eval-runs view on `experiment` of the server and return the link that opens it."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=server_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no experiment {experiment!r} at {server_uri}: no run of this config was logged there "
                         "(run the workflow first, or pass --store)")
    view_id = f"{VIEW_PREFIX}{results or 'all'}"
    now_ms = int(time.time() * 1000)
    # the tag value the UI's "Save view" writes (uncompressed state: the UI reads either)
    view = {"name": f"repexp: eval runs by {metric}", "createdAt": now_ms, "updatedAt": now_ms,
            "state": json.dumps(view_state(metric, results, params), separators=(",", ":"))}
    client.set_experiment_tag(found.experiment_id, SAVED_VIEW_TAG_PREFIX + view_id,
                              json.dumps(view, separators=(",", ":")))
    # No search facets in the link: the UI applies a saved view only to a link without any
    # (searchFilter, orderByKey, ... in the URL would win over it).
    query = urllib.parse.urlencode({VIEW_KEY_PARAM: view_id, WORKFLOW_PARAM[0]: WORKFLOW_PARAM[1]})
    return f"{server_uri.rstrip('/')}/#/experiments/{found.experiment_id}/runs?{query}"
