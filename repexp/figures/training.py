"""Training curves from metrics.jsonl or the MLflow store: the training figure (dev pass@1, bonus, shaped vs
verifier reward) and the training-dynamics figure (policy entropy, rollout diversity)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from repexp import layout
from repexp import metrics as M
from repexp.config import RunSpec
from repexp.figures import style as S
from repexp.figures.curves import series_styles
from repexp.figures.series import Series, _series_sort_key, coinciding_with_grpo, compact_runs, series_of, zorder
from repexp.methods import METHODS


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


def _trained_curves(specs: Sequence[RunSpec], read) -> dict[str, dict[str, dict[int, float]]]:
    """{'<task>/<run>': {metric: {step: value}}} of CURVE_METRICS for every trained spec that `read(spec)` finds
    (None: no source for it)."""
    found = {spec.path: read(spec) for spec in specs if spec.trains}
    return {path: {k: v for k, v in curves.items() if k in S.CURVE_METRICS}
            for path, curves in found.items() if curves is not None}


def training_curves_from_jsonl(train_dir: str | Path,
                               specs: Sequence[RunSpec]) -> dict[str, dict[str, dict[int, float]]]:
    """The curves of every trained spec whose metrics.jsonl exists."""
    def read(spec):
        path = Path(train_dir) / spec.task / spec.name / layout.METRICS
        return read_metrics_jsonl(path) if path.is_file() else None

    return _trained_curves(specs, read)


def training_curves_from_mlflow(target, specs: Sequence[RunSpec]) -> dict[str, dict[str, dict[int, float]]]:
    """Same as `training_curves_from_jsonl`, read from the MLflow store (`target`: tracking.MlflowTarget).

    Every run of a sweep point (its parent and its node runs, see repexp.tracking) is searched. For a
    step logged by several runs (retried attempts), the latest run wins.
    """
    from repexp import tracking

    store, experiment_id = tracking.mlflow_store(target)
    results_id = getattr(target, "results_id", None)
    same_results = f" and tags.`{tracking.RESULTS_ID_TAG}` = '{results_id}'" if results_id else ""

    def read(spec):
        key = tracking.scope_for(spec.task, spec).key  # the sweep point's parent run and its node runs
        runs = {run.info.run_id: run for tag in (tracking.PARENT_KEY_TAG, tracking.SCOPE_KEY_TAG)
                for run in store.client.search_runs([experiment_id], max_results=1000,
                                                    filter_string=f"tags.`{tag}` = '{key}'{same_results}")}
        curves: dict[str, dict[int, float]] = {}
        for run in sorted(runs.values(), key=lambda r: r.info.start_time or 0):
            for metric in [m for m in S.CURVE_METRICS if m in run.data.metrics]:
                for point in store.client.get_metric_history(run.info.run_id, metric):
                    curves.setdefault(metric, {})[int(point.step)] = float(point.value)
        return curves or None

    return _trained_curves(specs, read)


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
DYNAMICS_PANELS = (
    ("policy entropy", (M.POLICY_ENTROPY,)),
    ("rollout diversity: distinct responses / group", (M.DISTINCT_FRACTION,)),
)
# the panel whose steps with a switched-off bonus get a mark (a dip there is the turn-off rule, not noise)
TURN_OFF_PANEL = "bonus (× β), mean"
# × marks for steps with a switched-off bonus only while they are this share of the steps or fewer
MARK_MAX_FRACTION = 0.5
# panels drawn on a log axis when their curves span this factor or more (all positive): entropy collapsing
# from 2 to 0.1 would leave the comparison after the collapse in the bottom fifth of a linear axis, and
# β = 0.1's scaled bonus (10× β = 0.01's) would flatten β = 0.01's to a line
LOG_PANELS = ("bonus (× β), mean", "policy entropy", "rollout diversity: distinct responses / group")
LOG_SPAN = 4.0
# the ±1 SEM bands: light fills with their edges drawn in the series' colour, so overlapping bands of two
# series stay apart (fills alone blend, green and orange into brown)
BAND_ALPHA = 0.10
BAND_EDGE = dict(linewidth=0.6, linestyle=":", alpha=0.9)
# the × marks sit at this height of the panel (axes fraction), in a strip below the data of this share of it
MARK_STRIP_Y = 0.06
MARK_STRIP_ROOM = 0.14
# the two line styles of the reward panel (shaped, verifier), as legend entries
METRIC_LEGEND = (("shaped reward (—)", "-"), ("verifier reward (- -)", "--"))
# a panel whose values vary by less than this fraction of their size is drawn on a span of that
# fraction: 1.5e-4 of noise on a bonus of 0.875 must not fill the axis
MIN_RELATIVE_SPAN = 0.05
# curves closer than this fraction of their values' size look like one line: drawn apart and said
COINCIDE_FRACTION = 0.002
# panels whose values are fractions in [0, 1]: limits kept near that range
BOUNDED_PANELS = ("dev pass@1", "rollout diversity: distinct responses / group")


def _curve_figure(curves, task: str, backend: str, *, specs: Sequence[RunSpec], source: str, panels, title: str,
                  size: tuple[float, float], grid: tuple[int, int], name_lacking: bool, kind: str, caption: str):
    """A figure of metric panels over training steps: one line per method/point, mean over seeds ± SEM.

    Returns (figure, its index.json record of `kind`). A panel without any logged value says what is
    missing; with `name_lacking`, runs without a panel's metric while others logged it are named in a note
    (not for the training figure, where GRPO has no bonus by design).
    """
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    trained = [s for s in specs if s.task == task and s.backend == backend and s.trains]
    missing = [s.path for s in trained if s.path not in curves]
    series_runs: dict[Series, list[RunSpec]] = {}  # the runs with curves of every series
    for s in trained:
        if s.path in curves:
            series_runs.setdefault(series_of(s), []).append(s)
    series = sorted(series_runs, key=_series_sort_key)
    styles = series_styles(series)[0]  # one backend: labels never name it
    notes = []
    if missing:
        notes.append(f"no training metrics ({source}) for: {compact_runs([m.split('/', 1)[1] for m in missing])}")
    runs_with_curves = [r for s in series for r in series_runs[s]]
    for panel_title, metrics in panels if name_lacking and runs_with_curves else ():
        lacking = [r.name for r in runs_with_curves if not any(m in curves[r.path] for m in metrics)]
        if len(lacking) == len(runs_with_curves):
            notes.append(f"{panel_title}: no run logged {', '.join(metrics)}")
        elif lacking:
            notes.append(f"{panel_title}: {', '.join(metrics)} not logged by {compact_runs(lacking)}")
    # per single-metric panel, the series of a compared method drawn over GRPO's curve at every step (within
    # COINCIDE_FRACTION of the values): dashed, hollow, on top, and said. A two-metric panel keeps
    # solid/dashed for its two metrics; only the drawing order helps there.
    same: dict[str, set] = {}
    for panel_title, metrics in panels:
        # one-metric panels compare that metric; the reward panel its verifier reward, GRPO's only line there
        compared = metrics[-1]
        means = {s: _seed_mean_over_steps(logged) for s in series
                 if (logged := [curves[r.path][compared] for r in series_runs[s] if compared in curves[r.path]])}
        scale = max((abs(v) for data in means.values() for v in data["mean"]), default=0.0)
        grpo_steps = next((d["step"] for s, d in means.items() if s.method == "grpo"), None)
        comparable = {s: d["mean"] for s, d in means.items() if d["step"] == grpo_steps}
        same[panel_title] = coinciding_with_grpo(comparable, tolerance=COINCIDE_FRACTION * scale)
        grpo_mean = next((d["mean"] for s, d in means.items() if s.method == "grpo"), None)
        for s, d in sorted(comparable.items(), key=lambda item: _series_sort_key(item[0])):
            if len(metrics) > 1 or s.method == "grpo" or s in same[panel_title]:
                continue
            # GRPO's line is drawn under the others: where it equals one over two adjacent steps, that stretch
            # of it is hidden, which the figure says
            equal = [abs(a - b) <= COINCIDE_FRACTION * scale for a, b in zip(d, grpo_mean)]
            if any(equal[i] and equal[i + 1] for i in range(len(equal) - 1)):
                steps = [str(step) for step, eq in zip(grpo_steps, equal) if eq]
                notes.append(f"{panel_title}: GRPO = {styles[s]['label']} at steps {', '.join(steps)} (to "
                             f"{COINCIDE_FRACTION:.1%} of the values): GRPO's line is under it there")
        if len(metrics) == 1:
            notes += [f"{panel_title}: {styles[s]['label']} = GRPO at every step (to {COINCIDE_FRACTION:.1%} of the "
                      f"values; {s.label(show_point=False, show_backend=False)} is drawn dashed on top)"
                      for s in sorted(same[panel_title], key=_series_sort_key)]
        else:
            notes += [f"{panel_title}: GRPO's verifier reward = {styles[s]['label']}'s at every step (to "
                      f"{COINCIDE_FRACTION:.1%}; GRPO's dashed line is drawn on top of it)"
                      for s in sorted(same[panel_title], key=_series_sort_key)]
    notes += [f"{title}: seed means without ±1 SEM bands (two lines per method would not be told apart)"
              for title, metrics in panels if len(metrics) > 1 and any(len(series_runs[s]) >= 2 for s in series)]
    turned_off, dense = {}, []
    for s in series:
        # steps at which any seed logged a switched-off bonus, of all steps that logged the metric
        values = [curves[r.path].get(M.BONUS_TURNED_OFF, {}) for r in series_runs[s]]
        off = sorted({step for v in values for step, value in v.items() if value > 0})
        logged = len(set().union(*values))
        # marks tell a few dips apart; where the bonus is off in some group at most steps (a hard task: many
        # groups with no correct rollout), a mark on every step would hide the curve, so it is said instead
        if len(off) > MARK_MAX_FRACTION * logged:
            dense.append(f"{styles[s]['label']} {len(off)} of {logged}")
            off = []
        turned_off[s] = off
    if any(title == TURN_OFF_PANEL for title, _ in panels):
        if any(turned_off.values()):
            notes.append(f"{TURN_OFF_PANEL}: × along the bottom marks steps where the bonus was switched off in "
                         f"some groups ({M.BONUS_TURNED_OFF} > 0, the bonus.turn_off_if_* rules): the mean dips there "
                         "by design")
        if dense:
            notes.append(f"{TURN_OFF_PANEL}: the bonus was switched off in some groups at most steps "
                         f"({'; '.join(dense)}; {M.BONUS_TURNED_OFF} > 0, the bonus.turn_off_if_* rules), so the "
                         "mean over all groups is lower than the bonus of the groups that keep it (not marked)")
    two_metric = [metrics for _, metrics in panels if len(metrics) == 2]
    labels = [styles[s]["label"] for s in series] + ([label for label, _ in METRIC_LEGEND]
                                                     if two_metric and series else [])
    ncol = min(max(1, len(labels)), 4)
    panels_record = []
    with S._style():
        fig, axes, footer = S._figure_with_footer(size[0], size[1], legend_rows=math.ceil(max(1, len(labels)) / ncol),
                                                notes=notes, ncols=grid[1], nrows=grid[0])
        fig.suptitle(f"{S.TASK_TITLES.get(task, task)} [{backend}]: {title}", fontsize=S.FONT["title"])
        handles = {}
        for ax, (panel_title, metrics) in zip([a for row in axes for a in row], panels):
            ax.set_title(panel_title, fontsize=S.FONT["label"])
            plotted, lows, highs, lacking, mark_strip, means = [], [], [], [], False, []
            for s in series:
                for metric, linestyle in zip(metrics, ("-", "--")):
                    if metric == M.REWARD_SHAPED_MEAN and "reward" not in METHODS[s.method].hooks:
                        continue  # no reward hook: the shaped reward is the verifier reward; its dashed line alone
                    runs = [r for r in series_runs[s] if metric in curves[r.path]]
                    lacking += [r.name for r in series_runs[s] if metric not in curves[r.path]]
                    if not runs:
                        continue
                    data = _seed_mean_over_steps([curves[r.path][metric] for r in runs])
                    style = styles[s]
                    sparse = len(data["step"]) <= 30  # dev metrics are logged every test_freq steps: show points
                    # the dashed metric on top: where both coincide (β·bonus ≈ 0) it stays visible; RepExp
                    # above GRPO, dashed with hollow markers where it equals GRPO's curve
                    hidden = s in same[panel_title] and len(metrics) == 1
                    # the reward panel: RepExp keeps its solid shaped line in view, so a GRPO verifier line
                    # equal to RepExp's is the one lifted on top
                    lifted = len(metrics) == 2 and s.method == "grpo" and any(
                        o.task == s.task and o.backend == s.backend for o in same[panel_title])
                    hollow = {"markerfacecolor": "none", "markeredgecolor": style["color"]} if hidden else {}
                    line, = ax.plot(data["step"], data["mean"], color=style["color"],
                                    linestyle="--" if hidden else linestyle, linewidth=1.0,
                                    marker=style["marker"] if sparse else None, markersize=3.5,
                                    zorder=zorder(s.method) + (3 if linestyle == "--" else 0) + (10 if lifted else 0),
                                    **hollow)
                    if linestyle == "-":
                        handles.setdefault(style["label"], line)
                    if panel_title == TURN_OFF_PANEL and turned_off[s]:
                        # in a strip along the bottom of the panel (below every data point, inside the axes):
                        # a × on the point itself would hide it, one on the axis line is cut in half
                        marked = [step for step in turned_off[s] if step in data["step"]]
                        ax.plot(marked, [MARK_STRIP_Y] * len(marked), linestyle="none", marker="x",
                                color="#222222", markersize=7, markeredgewidth=1.4, zorder=4,
                                transform=ax.get_xaxis_transform(), clip_on=False)
                        mark_strip = True
                    lo = [m - e if e is not None else m for m, e in zip(data["mean"], data["sem"])]
                    hi = [m + e if e is not None else m for m, e in zip(data["mean"], data["sem"])]
                    # a two-metric panel (the reward: two lines per series) draws no bands: six lines with
                    # bands could not be told apart; the note says so
                    banded = any(e is not None for e in data["sem"]) and len(metrics) == 1
                    if banded:
                        ax.fill_between(data["step"], lo, hi, color=style["color"], alpha=BAND_ALPHA, linewidth=0)
                        for edge in (lo, hi):
                            ax.plot(data["step"], edge, color=style["color"], zorder=zorder(s.method), **BAND_EDGE)
                    else:
                        lo, hi = data["mean"], data["mean"]
                    lows += lo
                    highs += hi
                    means += data["mean"]
                    plotted.append({**s.to_dict(), "label": style["label"], "metric": metric,
                                    "runs": [r.name for r in runs], **data})
            if not plotted:
                S._no_data(ax, f"no {', '.join(metrics)} logged" + (" by any run" if series else ""))
            else:
                ax.set_xlabel("step")
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.tick_params(axis="both", labelsize=S.FONT["tick"])
                logged = panel_title in LOG_PANELS and min(means) > 0 and max(means) >= LOG_SPAN * min(means)
                if logged:
                    low, high = _log_ylim([v for v in lows if v > 0] or means, highs, strip=mark_strip)
                    ax.set_yscale("log")
                    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.2, not 2 × 10^-1
                    ax.yaxis.set_major_formatter(plain)
                    ax.yaxis.set_minor_formatter(plain)
                else:
                    low, high = (S._adaptive_ylim if panel_title in BOUNDED_PANELS else _readable_ylim)(lows, highs)
                    if mark_strip:  # room below the data for the strip of × marks
                        low = min(low, min(lows) - MARK_STRIP_ROOM * (high - min(lows)) / (1 - MARK_STRIP_ROOM))
                ax.set_ylim(low, high)
            panels_record.append({"title": panel_title, "metrics": list(metrics), "series": plotted,
                                  "runs_without_metric": sorted(set(lacking))})
        if handles:
            if two_metric:  # what solid and dashed mean, as legend entries of their own
                from matplotlib.lines import Line2D

                for label, linestyle in METRIC_LEGEND:  # legend-only handles, drawn on no axis
                    handles[label] = Line2D([], [], color="#444444", linestyle=linestyle, linewidth=1.0)
            S._legend(footer, handles, list(handles), ncol)
    figure_id = (layout.training_figure if kind == "training" else layout.dynamics_figure)(task, backend)
    return fig, {"id": figure_id, "kind": kind, "task": task, "backend": backend, "source": source,
                 "caption": caption, "notes": notes, "missing_runs": missing, "size_px": S._size_px(fig),
                 "panels": panels_record}


def _log_ylim(lows: Sequence[float], highs: Sequence[float], *, strip: bool) -> tuple[float, float]:
    """Limits of a log-scale panel: the data with a margin (in log space), and room for the × strip."""
    lo, hi = math.log10(min(lows)), math.log10(max(highs))
    pad = 0.06 * max(hi - lo, 0.1)
    lo, hi = lo - pad, hi + pad
    if strip:
        lo -= MARK_STRIP_ROOM * (hi - lo) / (1 - MARK_STRIP_ROOM)
    return 10 ** lo, 10 ** hi


def _readable_ylim(lows: Sequence[float], highs: Sequence[float]) -> tuple[float, float]:
    """Limits of an unbounded panel: the data with a margin, but never narrower than MIN_RELATIVE_SPAN
    of the values' size, so that noise in a nearly constant quantity is drawn as nearly flat."""
    lo, hi = min(lows), max(highs)
    span = max(hi - lo, MIN_RELATIVE_SPAN * max(abs(lo), abs(hi)), 1e-3)
    centre = (lo + hi) / 2
    half = max(span / 2, (hi - lo) / 2 * 1.08)
    return centre - half, centre + half


def plot_training(curves: dict[str, dict[str, dict[int, float]]], task: str, backend: str, *,
                  specs: Sequence[RunSpec], source: str):
    """Training curves of one task and backend: one line per method/point, mean over seeds ± SEM."""
    caption = (
        f"Training on {S.TASK_TITLES.get(task, task)} ({backend}), from {source}: dev pass@1 at each validation, "
        "the mean raw and β-scaled RepExp bonus per step (× where the bonus was switched off in some groups), "
        "and the mean shaped reward (α·verifier + β·bonus, solid) against the verifier reward (dashed, drawn on "
        "top; GRPO has β = 0, so only its dashed line). Lines are means over seeds with a ±1 SEM band where ≥ 2 "
        "seeds logged the step."
    )
    return _curve_figure(curves, task, backend, specs=specs, source=source, panels=TRAINING_PANELS,
                         title="training", size=(9.0, 4.6), grid=(2, 2), name_lacking=False, kind="training",
                         caption=caption)


def plot_dynamics(curves: dict[str, dict[str, dict[int, float]]], task: str, backend: str, *,
                  specs: Sequence[RunSpec], source: str):
    """Training dynamics of one task and backend: policy entropy and rollout diversity over training steps,
    one line per method/point (every method of the sweep), mean over seeds ± SEM."""
    caption = (
        f"Training dynamics on {S.TASK_TITLES.get(task, task)} ({backend}), from {source}: the policy's mean token "
        f"entropy on its rollouts ({M.POLICY_ENTROPY}) and the rollout diversity ({M.DISTINCT_FRACTION}: per "
        "prompt group the number of distinct responses over the group size, averaged over the step's groups; "
        "1 = all rollouts differ) per training step. Exploration that RepExp's bonus sustains shows as higher "
        "entropy and diversity than GRPO's. Lines are means over seeds with a ±1 SEM band where ≥ 2 seeds "
        "logged the step."
    )
    return _curve_figure(curves, task, backend, specs=specs, source=source, panels=DYNAMICS_PANELS,
                         title="training dynamics", size=(9.0, 2.8), grid=(1, 2), name_lacking=True, kind="dynamics",
                         caption=caption)

