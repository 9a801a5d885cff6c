"""Training curves (dev pass@1, bonus, shaped vs verifier reward) from metrics.jsonl or the MLflow store."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from repexp import layout
from repexp import metrics as M
from repexp.config import RunSpec
from repexp.figures.curves import _series_styles
from repexp.figures.series import Series, _series_sort_key, compact_runs, series_of
from repexp.figures.style import (
    FONT,
    TASK_TITLES,
    TRAINING_METRICS,
    _adaptive_ylim,
    _figure_with_footer,
    _no_data,
    _size_px,
    _style,
)


def read_metrics_jsonl(path: str | Path) -> dict[str, dict[int, float]]:
    """{metric: {step: value}} from a metrics.jsonl (later lines win for a repeated step: resumed runs)."""
    path = Path(path)
    curves: dict[str, dict[int, float]] = {}
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err})") from None
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError(f"{path}:{number}: expected an object with a 'step' key")
            step = int(record["step"])
            for key, value in record.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                # by the names logged today (a file from before dev/pass@k became dev/pass_at_k reads the same)
                curves.setdefault(M.metric_name(key), {})[step] = float(value)
    return curves


def training_curves_from_jsonl(train_dir: str | Path,
                               specs: Sequence[RunSpec]) -> dict[str, dict[str, dict[int, float]]]:
    """{'<task>/<run>': {metric: {step: value}}} for every trained spec whose metrics.jsonl exists."""
    out = {}
    for spec in specs:
        path = Path(train_dir) / spec.task / spec.name / layout.METRICS
        if spec.trains and path.is_file():
            out[spec.path] = {k: v for k, v in read_metrics_jsonl(path).items() if k in TRAINING_METRICS}
    return out


def training_curves_from_mlflow(target, specs: Sequence[RunSpec]) -> dict[str, dict[str, dict[int, float]]]:
    """Same as `training_curves_from_jsonl`, read from the MLflow store (`target`: aggregate.MlflowTarget).

    Every run of a sweep point (its parent and its node runs, see repexp.tracking) is searched. For a
    step logged by several runs (retried attempts), the latest run wins.
    """
    from repexp import aggregate

    store, experiment_id = aggregate.mlflow_store(target)
    out = {}
    for spec in specs:
        if not spec.trains:
            continue
        curves: dict[str, dict[int, float]] = {}
        runs = sweep_point_runs(store.client, experiment_id, spec, getattr(target, "results_id", None))
        for run in sorted(runs, key=lambda r: r.info.start_time or 0):
            for metric in TRAINING_METRICS:
                if metric in run.data.metrics:
                    for point in store.client.get_metric_history(run.info.run_id, metric):
                        curves.setdefault(metric, {})[int(point.step)] = float(point.value)
        if curves:
            out[spec.path] = curves
    return out


def sweep_point_runs(client, experiment_id: str, spec: RunSpec, results_id: str | None = None) -> list:
    """The parent run of a sweep point and its node runs (tags of repexp.tracking), of one results
    directory when `results_id` is given."""
    from repexp import tracking

    key = tracking.scope_for(spec.task, spec.name).key
    same_results = f" and tags.`{tracking.RESULTS_ID_TAG}` = '{results_id}'" if results_id else ""
    runs = {}
    for tag in (tracking.PARENT_KEY_TAG, tracking.SCOPE_KEY_TAG):
        for run in client.search_runs([experiment_id], filter_string=f"tags.`{tag}` = '{key}'{same_results}",
                                      max_results=1000):
            runs[run.info.run_id] = run
    return list(runs.values())


def _seed_mean_over_steps(per_seed: Sequence[dict[int, float]]) -> dict[str, list]:
    """Mean and SEM (ddof 1, where ≥ 2 seeds logged the step) at every step any seed logged."""
    import numpy as np

    steps = sorted(set().union(*per_seed))
    mean, sem, count = [], [], []
    for step in steps:
        values = np.array([c[step] for c in per_seed if step in c])
        mean.append(float(values.mean()))
        sem.append(float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) >= 2 else None)
        count.append(int(len(values)))
    return {"step": steps, "mean": mean, "sem": sem, "n_seeds": count}


TRAINING_PANELS = (
    ("dev pass@1", (M.DEV_SELECTION,)),
    ("bonus (raw), mean", (M.statistic(M.BONUS_RAW, "mean"),)),
    ("bonus (× β), mean", (M.statistic(M.BONUS_SCALED, "mean"),)),
    ("reward: shaped (—) vs verifier (- -)", (M.REWARD_SHAPED_MEAN, M.REWARD_VERIFIER_MEAN)),
)


def plot_training(curves: dict[str, dict[str, dict[int, float]]], task: str, backend: str, *,
                  specs: Sequence[RunSpec], source: str):
    """Training curves of one task and backend: one line per method/point, mean over seeds ± SEM."""
    from matplotlib.ticker import MaxNLocator

    trained = [s for s in specs if s.task == task and s.backend == backend and s.trains]
    missing = [s.path for s in trained if s.path not in curves]
    series_runs: dict[Series, list[RunSpec]] = {}
    for s in trained:
        if s.path in curves:
            series_runs.setdefault(series_of(s), []).append(s)
    series = sorted(series_runs, key=_series_sort_key)
    show_point = len({(s.sparse_dim, s.beta) for s in series if s.method == "repexp"}) > 1
    styles = _series_styles(series, show_point=show_point, show_backend=False)
    notes = []
    if missing:
        notes.append(f"no training metrics ({source}) for: {compact_runs([m.split('/', 1)[1] for m in missing])}")
    labels = [styles[s]["label"] for s in series]
    ncol = min(max(1, len(labels)), 4)
    panels_record = []
    with _style():
        fig, axes, footer = _figure_with_footer(9.0, 4.6, legend_rows=math.ceil(max(1, len(labels)) / ncol),
                                                notes=notes, ncols=2, nrows=2)
        fig.suptitle(f"{TASK_TITLES.get(task, task)} [{backend}]: training", fontsize=FONT["title"])
        handles = {}
        for ax, (title, metrics) in zip([a for row in axes for a in row], TRAINING_PANELS):
            ax.set_title(title, fontsize=FONT["label"])
            plotted = []
            lows, highs = [], []
            for s in series:
                for metric, linestyle in zip(metrics, ("-", "--")):
                    per_seed = [curves[r.path][metric] for r in series_runs[s] if metric in curves[r.path]]
                    if not per_seed:
                        continue
                    data = _seed_mean_over_steps(per_seed)
                    style = styles[s]
                    sparse = len(data["step"]) <= 30  # dev metrics are logged every test_freq steps: show points
                    line, = ax.plot(data["step"], data["mean"], color=style["color"], linestyle=linestyle,
                                    linewidth=1.0, marker=style["marker"] if sparse else None, markersize=3.5)
                    if linestyle == "-":
                        handles.setdefault(style["label"], line)
                    lo = [m - e if e is not None else m for m, e in zip(data["mean"], data["sem"])]
                    hi = [m + e if e is not None else m for m, e in zip(data["mean"], data["sem"])]
                    if any(e is not None for e in data["sem"]):
                        ax.fill_between(data["step"], lo, hi, color=style["color"], alpha=0.15, linewidth=0)
                    lows += lo
                    highs += hi
                    plotted.append({**s.to_dict(), "label": style["label"], "metric": metric,
                                    "runs": [r.name for r in series_runs[s] if metric in curves[r.path]], **data})
            if not plotted:
                _no_data(ax, f"no {', '.join(metrics)} logged")
            else:
                ax.set_xlabel("step")
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.tick_params(axis="both", labelsize=FONT["tick"])
                if title == "dev pass@1":
                    ax.set_ylim(*_adaptive_ylim(lows, highs))
                else:
                    span = max(highs) - min(lows)
                    pad = 0.08 * span if span > 0 else max(1e-3, 0.05 * abs(max(highs)))
                    ax.set_ylim(min(lows) - pad, max(highs) + pad)
            panels_record.append({"title": title, "metrics": list(metrics), "series": plotted})
        if handles:
            footer.legend(list(handles.values()), list(handles), loc="upper center", ncol=ncol, frameon=False,
                          fontsize=FONT["legend"], bbox_to_anchor=(0.5, 1.0))
    caption = (
        f"Training on {TASK_TITLES.get(task, task)} ({backend}), from {source}: dev pass@1 at each validation, "
        "the mean "
        "raw and β-scaled RepExp bonus per step, and the mean shaped reward (α·verifier + β·bonus, solid) against "
        "the verifier reward (dashed). Lines are means over seeds with a ±1 SEM band where ≥ 2 seeds logged the step."
    )
    record = {"id": layout.training_figure(task, backend), "kind": "training", "task": task, "backend": backend,
              "source": source, "caption": caption, "notes": notes, "missing_runs": missing, "size_px": _size_px(fig),
              "panels": panels_record}
    return fig, record
