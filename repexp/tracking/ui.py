"""`repexp mlflow ui`: one link that opens the MLflow UI on the eval runs, compared.

MLflow 3.17's runs page keeps its columns in the browser's local storage, so no link of
searchFilter/orderByKey alone shows the params a comparison needs. Its saved view ("Save view") does:
the page's state stored as the experiment tag `mlflow.sharedViewState.<id>` and opened by
`#/experiments/<experiment>/runs?viewStateShareKey=<id>` (read by the bundle's runs-page chunk,
3878.*.js). `publish_view` writes what that button writes; the view is also in the page's views menu.

`workflowType=machine_learning` in the link opens the "Model training" side of the UI: in 3.17.2
the experiment kind comes from that URL parameter or the browser's last choice (default GenAI); the
`mlflow.experimentKind` tag is not read for it (the bundle's feature flag for that is on: main.*.js,
`const{workflowType:t}=(0,a.B)(),n=(0,s.Z0)();...n?m(t):<the tag>`, with `Z0:()=>R`, `R=()=>!0`).

`compareRunsMode=CHART` in the link opens the runs page's chart view (a URL parameter, not one of the
search facets that would override the saved view: 3793.*.js `sO=["searchFilter","orderByKey",...]`).
The view's state carries that view's charts (`compareRunCharts`, `compareRunSections`: the keys the
runs-page chunk copies from a saved view, main.*.js module 1395 `HC=[...]`): first pass@k against k
(the eval runs' `test/pass_at_k`, logged at step = k: a line chart, k on a log axis), then the
headline metrics as bar charts. `isAccordionReordered` keeps that order: MLflow appends charts of the
runs' other metrics in sections of their own after these, instead of sorting every section by name
(main.*.js `updateChartAndSectionConfigs`). Each eval run gets its method's colour (the figures' colour,
`repexp.methods.color`; several runs of one method: shades of it) through the run tag MLflow's UI
reads its colour from (`mlflow.runColor`, what "change colour" in the UI writes).
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
CHART_MODE_PARAM = ("compareRunsMode", "CHART")  # the runs page's chart view (TABLE: the runs table)
RUN_COLOR_TAG = "mlflow.runColor"  # the colour MLflow's UI draws a run in (its "change colour" writes it)
CURVES_SECTION = "pass@k against k"
HEADLINE_SECTION = "headline"
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


def curve_metrics(cfg) -> tuple[str, ...]:
    """The eval runs' pass@k-against-k metrics: the eval's grader's (`test/pass_at_k`), then the other's."""
    from repexp import metrics as metric_names
    from repexp.verify.routing import GRADERS

    return (metric_names.pass_at_k_curve(metric_names.TEST),
            *(metric_names.pass_at_k_curve(metric_names.TEST, g) for g in GRADERS if g != cfg.grader))


def headline_metrics(cfg) -> tuple[str, ...]:
    """The bar charts after the curves: pass@n, pass@1, then the other evaluated ks (powers of two), largest first."""
    from repexp import config as C
    from repexp import metrics as metric_names
    from repexp.passk import power_of_two_ks

    ks = sorted({k for task in cfg.sweep.tasks for k in power_of_two_ks(C.task_section(cfg, task, "eval").n_samples)},
                reverse=True)
    first = headline_metric(cfg)
    return tuple(dict.fromkeys([first, metric_names.pass_at_k(metric_names.TEST, 1),
                                *(metric_names.pass_at_k(metric_names.TEST, k) for k in ks)]))


def chart_state(curves: tuple[str, ...], headline: tuple[str, ...]) -> dict[str, Any]:
    """The chart view: pass@k against k (line charts of the step-=-k metrics, log k), then the
    headline bars; the order stays (isAccordionReordered), MLflow adds the runs' other metrics after."""
    sections = [{"uuid": f"repexp-{i}", "name": name, "display": True, "isReordered": True, "deleted": False,
                 "isGenerated": False} for i, name in enumerate((CURVES_SECTION, HEADLINE_SECTION))]
    common = {"runsCountToCompare": 100, "deleted": False, "isGenerated": False}
    charts = [{**common, "uuid": f"repexp-curve-{i}", "type": "LINE", "metricSectionId": sections[0]["uuid"],
               "metricKey": name, "selectedMetricKeys": [name], "displayName": f"{name} (x: k, log scale)",
               "lineSmoothness": 0, "xAxisScaleType": "log", "scaleType": "linear", "xAxisKey": "step",
               "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
               "range": {"xMin": None, "xMax": None, "yMin": None, "yMax": None}, "ignoreOutliers": False,
               "useGlobalXaxisKey": False, "useGlobalLineSmoothing": False}
              for i, name in enumerate(curves)]
    charts += [{**common, "uuid": f"repexp-headline-{i}", "type": "BAR", "metricSectionId": sections[1]["uuid"],
                "metricKey": name, "displayName": name} for i, name in enumerate(headline)]
    return {"compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": True,
            "hideEmptyCharts": True, "runsHiddenMode": "SHOW_ALL", "groupBy": None,
            "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""}}


def view_state(metric: str, results: Optional[str] = None, params: tuple[str, ...] = COLUMNS,
               curves: tuple[str, ...] = (), headline: tuple[str, ...] = ()) -> dict[str, Any]:
    """The runs page's state: this results directory's eval runs, best headline pass@k first, with
    the sweep point's params (`params`: `columns(cfg)`) beside it, and the chart view's charts
    (`chart_state`). Keys the UI does not find here keep its defaults."""
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
        **chart_state(curves, headline or (metric,)),
    }


def run_colors(runs: list[tuple[str, str]]) -> dict[str, str]:
    """{run id: colour} for (run id, method) pairs in the order shown: the method's colour (the figures'),
    shades of it from dark to light when a method has several runs."""
    from repexp.figures.style import shade
    from repexp.methods import color

    by_method: dict[str, list[str]] = {}
    for run_id, method in runs:
        by_method.setdefault(method, []).append(run_id)
    return {run_id: shade(color(method), i, len(ids)) for method, ids in by_method.items()
            for i, run_id in enumerate(ids)}


def publish_view(server_uri: str, experiment: str, metric: str, results: Optional[str],
                 params: tuple[str, ...] = COLUMNS, curves: tuple[str, ...] = (),
                 headline: tuple[str, ...] = ()) -> tuple[str, str]:
    """Save the eval-runs view on `experiment` of the server, colour its runs by method, and return the
    links that open it: (the chart view, the runs table)."""
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
            "state": json.dumps(view_state(metric, results, params, curves, headline), separators=(",", ":"))}
    client.set_experiment_tag(found.experiment_id, SAVED_VIEW_TAG_PREFIX + view_id,
                              json.dumps(view, separators=(",", ":")))
    search = f"tags.`{RULE_TAG}` = 'eval'" + (f" AND tags.`{RESULTS_ID_TAG}` = '{results}'" if results else "")
    runs = client.search_runs([found.experiment_id], search, max_results=1000, order_by=["attributes.run_name"])
    for run_id, colour in run_colors([(r.info.run_id, r.data.params.get("method", "")) for r in runs]).items():
        client.set_tag(run_id, RUN_COLOR_TAG, colour)
    # No search facets in the link: the UI applies a saved view only to a link without any
    # (searchFilter, orderByKey, ... in the URL would win over it).
    links = []
    for mode in (CHART_MODE_PARAM[1], "TABLE"):
        query = urllib.parse.urlencode({VIEW_KEY_PARAM: view_id, WORKFLOW_PARAM[0]: WORKFLOW_PARAM[1],
                                        CHART_MODE_PARAM[0]: mode})
        links.append(f"{server_uri.rstrip('/')}/#/experiments/{found.experiment_id}/runs?{query}")
    return links[0], links[1]
