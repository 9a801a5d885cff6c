"""The pass@k figure: one panel per task, pass@k over log2 k, one line per method/point (mean over seeds)."""

from __future__ import annotations

from collections.abc import Sequence

from repexp import layout
from repexp.config import RunSpec
from repexp.figures import style as S
from repexp.figures.series import (
    Series,
    _series_sort_key,
    coinciding_with_grpo,
    completeness_notes,
    seed_curve,
    select_points,
    series_of,
    table_specs,
    zorder,
)
from repexp.layout import heatmap_params


def _curve_panels(found: Sequence[RunSpec], tasks: Sequence[str], expected: Sequence[RunSpec] | None,
                  max_lines: int) -> tuple[list[dict], list[str], list[str]]:
    """Which series each task panel draws (every method; at most `max_lines` points of one method and
    backend), plus the notes and missing runs of the figure."""
    panels: list[dict] = []
    notes, missing = [], []
    for task in tasks:
        title = S.TASK_TITLES.get(task, task)
        task_missing, task_notes = completeness_notes(task, found, expected)
        missing += task_missing
        notes += [f"{title}: {n}" for n in task_notes]
        series_set = sorted({series_of(s) for s in found if s.task == task}, key=_series_sort_key)
        shown: list[Series] = []
        for method, backend in dict.fromkeys((s.method, s.backend) for s in series_set):
            group = [s for s in series_set if (s.method, s.backend) == (method, backend)]
            keep = select_points(task, group, max_lines)
            dropped = [s for s in group if s not in keep]
            if dropped:
                runs = [s for s in found if s.task == task and s.method == method and s.backend == backend]
                where = "heatmap" if heatmap_params(runs) else "aggregate tables"
                name = dropped[0].label(show_point=False, show_backend=False)
                notes.append(f"{title}: {len(dropped)} further {name} sweep points are in the {where} ("
                             + "; ".join(s.label(show_point=True, show_backend=False) for s in dropped) + ")")
            shown += keep
        panels.append({"task": task, "series": sorted(shown, key=_series_sort_key)})
    return panels, notes, missing


def plot_pass_at_k(table, *, tasks: Sequence[str] | None = None, expected: Sequence[RunSpec] | None = None,
                   max_repexp_lines: int = S.MAX_REPEXP_LINES):
    """The pass@k figure. Returns (figure, record) where record holds caption, notes and plotted data."""
    found = table_specs(table)
    tasks = list(tasks) if tasks else list(dict.fromkeys(s.task for s in found))
    if not tasks:
        raise ValueError("no tasks to plot")
    panels, notes, missing = _curve_panels(found, tasks, expected, max_repexp_lines)
    all_series = [s for panel in panels for s in panel["series"]]
    styles, labels, show_point = series_styles(all_series)
    single_seed = any((seed_curve(table, s) or {}).get("n_seeds") == 1 for s in all_series if s.method != "base")
    banded = any((seed_curve(table, s) or {}).get("sem") is not None for s in all_series)
    if banded:  # what the shaded bands are, on the figure itself (the caption is not always beside it)
        notes.append("Shaded bands: ±1 SEM across seeds (ddof 1)" + (
            "; lines with one seed have no band." if single_seed else "."))
    elif single_seed:
        notes.append("Lines with one seed have no band.")

    panel_curves = [{series: seed_curve(table, series) for series in panel["series"]} for panel in panels]
    same: set = set()
    for panel, curves in zip(panels, panel_curves):
        coincide = coinciding_with_grpo({s: c["mean"] for s, c in curves.items() if c is not None})
        same |= coincide
        title = S.TASK_TITLES.get(panel["task"], panel["task"])
        notes += [f"{title}: {styles[s]['label']} = GRPO at every k (the curves coincide; "
                  f"{s.label(show_point=False, show_backend=False)} is drawn dashed on top)"
                  for s in sorted(coincide, key=_series_sort_key)]
    def draw(ax, j: int, handles: dict) -> dict:
        task = panels[j]["task"]
        data_series = []
        lows, highs, k_max = [], [], 1
        for series in panels[j]["series"]:
            curve = panel_curves[j][series]
            if curve is None:
                continue
            style = styles[series]
            hollow = {"markerfacecolor": "none", "markeredgecolor": style["color"]} if series in same else {}
            line, = ax.plot(curve["k"], curve["mean"], label=style["label"], color=style["color"],
                            linestyle="--" if series in same else style["linestyle"],
                            alpha=0.8 if series.method == "base" else 1.0, zorder=zorder(series.method),
                            **{**S.LINE_STYLE, "marker": style["marker"], **hollow})
            handles.setdefault(style["label"], line)
            band = None
            if curve["sem"] is not None:
                lo = [m - s for m, s in zip(curve["mean"], curve["sem"])]
                hi = [m + s for m, s in zip(curve["mean"], curve["sem"])]
                ax.fill_between(curve["k"], lo, hi, color=style["color"], alpha=0.2, linewidth=0)
                band = {"lower": lo, "upper": hi}
                lows += lo
                highs += hi
            lows += curve["mean"]
            highs += curve["mean"]
            k_max = max(k_max, max(curve["k"]))
            data_series.append({**series.to_dict(), "label": style["label"], "color": style["color"],
                                "marker": style["marker"], **curve, "band": band})
        ylim = S._finish_curve_panel(ax, plotted=bool(data_series), empty_message=f"no evaluated runs for {task}",
                                     k_max=k_max, lows=lows, highs=highs, xlabel="k", first=j == 0)
        return {"ylim": list(ylim) if ylim else None, "series": data_series}

    fig, record_panels = S._task_panels(tasks, labels, notes, draw)
    caption = (
        "pass@k on the test split over k (log2 axis) per task: mean over seeds "
        + ("with a ±1 SEM band across seeds (ddof 1)" if not single_seed
           else "(±1 SEM band across seeds where ≥ 2 seeds; one seed: no band)")
        + ". pass@k is the unbiased estimator from n samples per problem, averaged over problems. "
        + ("The lines of a method with several sweep points are labelled by their point (shades of the method's "
           "colour, one marker each). " if show_point else "")
        + "The base model is evaluated once (no band)."
    )
    record = {"id": layout.PASS_AT_K_FIGURE, "kind": "pass_at_k", "caption": caption, "notes": notes,
              "missing_runs": missing, "size_px": S._size_px(fig), "panels": record_panels}
    return fig, record


def series_styles(series: Sequence[Series]) -> tuple[dict[Series, dict], list[str], bool]:
    """(style per series, the legend labels in plotting order, whether any label names its point).

    Colour and marker come from the method table (`repexp.methods`): a method with one point in the figure
    draws in its colour and marker with its bare label; a method with several points gives each a shade of its
    colour (dark to light, in sweep order), a marker of its own and the point in its label. Backends differ by
    line style."""
    show_backend = len({s.backend for s in series if s.backend}) > 1
    backends = sorted({s.backend for s in series if s.backend})
    points: dict[str, list[str]] = {}  # per method, its points in sweep order (backends share a point's style)
    for s in sorted(series, key=_series_sort_key):
        points.setdefault(s.method, [])
        if s.point not in points[s.method]:
            points[s.method].append(s.point)
    styles = {}
    for s in series:
        linestyle = "-"
        if s.backend and show_backend:
            linestyle = S.BACKEND_LINESTYLES[backends.index(s.backend) % len(S.BACKEND_LINESTYLES)]
        mine = points[s.method]
        i = mine.index(s.point)
        styles[s] = {"label": s.label(show_point=len(mine) > 1, show_backend=show_backend),
                     "color": S.shade(S.method_color(s.method), i, len(mine)), "marker": S.point_marker(s.method, i),
                     "linestyle": linestyle}
    show_point = any(len(mine) > 1 for mine in points.values())
    return styles, list(dict.fromkeys(styles[s]["label"] for s in sorted(series, key=_series_sort_key))), show_point
