"""The k-efficiency figure: per task, each method point's k-efficiency over GRPO (every method but GRPO and
the base model, from the method table) at several reference k, with the paired bootstrap interval of
`repexp.aggregate.tables.bootstrap_k_efficiency` as error bars."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from repexp import layout
from repexp.config import RunSpec
from repexp.figures import style as S
from repexp.figures.curves import series_styles
from repexp.figures.series import Series, _series_sort_key, completeness_notes, series_from_row, table_specs

# a point's markers are spread this far apart (in log2 k) so that the markers (and error bars) of several points
# at one reference k stay apart, the ▽ of points on the bottom edge included (6-pt markers, ~0.2 log2 k apart)
DODGE_LOG2 = 0.24
EDGE_MARKER = "v"  # the method does not reach GRPO's pass@ref within k ≤ ref: drawn on the bottom edge
LOWER_BOUND_MARKER = "^"  # reached at the smallest k: the efficiency is a lower bound


def _shown(rows) -> list:
    """The rows of one point drawn: at the powers of two ≥ 2 among its reference ks, and its largest."""
    largest = max(int(r.reference_k) for r in rows)
    return [r for r in rows if (k := int(r.reference_k)) >= 2 and (k & (k - 1) == 0 or k == largest)]


def _number(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _series_rows(keff, task: str) -> dict[Series, list]:
    """{Series: its rows (one per reference k, sorted)} of one task's method points that have a grid."""
    rows = keff[(keff["task"] == task) & keff["reference_k"].notna()]
    out: dict[Series, list] = {}
    for r in rows.itertuples(index=False):
        out.setdefault(series_from_row(r._asdict()), []).append(r)
    return {s: sorted(rs, key=lambda r: int(r.reference_k)) for s, rs in out.items()}


def _ratio_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Ticks of a log2 ratio axis: powers of two (half powers when the range is narrow), labelled '2×'."""
    import numpy as np

    for step in (1.0, 0.5, 0.25):
        exps = np.arange(math.ceil(math.log2(lo) / step) * step, math.log2(hi) + 1e-9, step)
        if len(exps) >= 3 or step == 0.25:
            break
    ticks = [float(2.0 ** e) for e in exps]
    return ticks, [f"{t:g}×" if float(e).is_integer() else f"{t:.2f}×" for t, e in zip(ticks, exps)]


def plot_k_efficiency(keff, table, *, tasks: Sequence[str] | None = None, expected: Sequence[RunSpec] | None = None,
                      source: str = ""):
    """The k-efficiency figure. `keff`: the per-reference-k table (`tables.k_efficiency(..., by_reference_k=True)`
    or `k_efficiency_by_k.csv`); `table`: the pass@k table (for the missing-run notes). Returns (figure, record)."""
    from repexp.aggregate import tables as A

    found = table_specs(table)
    tasks = list(tasks) if tasks else list(dict.fromkeys(s.task for s in found))
    if not tasks:
        raise ValueError("no tasks to plot")
    notes, missing, per_task = [], [], {}
    for task in tasks:
        title = S.TASK_TITLES.get(task, task)
        task_missing, task_notes = completeness_notes(task, found, expected)
        missing += task_missing
        notes += [f"{title}: {n}" for n in task_notes if n != "no base-model run"]  # no base in this figure
        per_task[task] = _series_rows(keff, task)
    all_series = [s for rows in per_task.values() for s in rows]
    styles, labels, _ = series_styles(all_series)
    labels = ["GRPO (= 1)", *labels]
    show_backend = len({s.backend for s in all_series}) > 1
    has_intervals = keff["efficiency_lo"].notna().any()

    # what the figure must say (drawn under the axes, so gathered before drawing)
    bootstrap_units = sorted({str(u) for u in keff["bootstrap_resampled"] if str(u)})
    replicates = sorted({int(b) for b in keff["bootstrap_replicates"].dropna() if int(b) > 0})
    reasons = any(part.startswith(A.NO_INTERVAL_NOTE) for note in keff["note"] for part in str(note).split("; "))
    if not has_intervals and not reasons and all_series:
        notes.append(f"No bootstrap intervals ({source or 'no per-problem counts'}).")
    for task in tasks:
        title = S.TASK_TITLES.get(task, task)
        no_grid = keff[(keff["task"] == task) & keff["reference_k"].isna()]
        for r in no_grid.itertuples(index=False):
            label = series_from_row(r._asdict()).label(show_point=True, show_backend=show_backend)
            notes.append(f"{title}: {label}: {r.status}")
        for series, rows in per_task[task].items():
            label = styles[series]["label"]
            shown = _shown(rows)
            for status, text in ((A.STATUS_NOT_REACHED, "does not reach GRPO's pass@k within k ≤ the reference k "
                                                        "(▽ on the bottom edge)"),
                                 (A.STATUS_UNDEFINED, "GRPO solves nothing: undefined (not drawn)"),
                                 (A.STATUS_REACHED_FIRST, "reached at the smallest k (△: a lower bound)")):
                if at := [str(int(r.reference_k)) for r in shown if str(r.status) == status]:
                    notes.append(f"{title}: {label} at k = {', '.join(at)}: {text}")
            why = sorted({part for r in shown for part in str(r.note).split("; ")
                          if part.startswith(A.NO_INTERVAL_NOTE)})
            if why:
                notes.append(f"{title}: {label}: {'; '.join(why)}")
            censored = [int(r.reference_k) for r in shown
                        if _number(r.efficiency_lo) == 0.0 and str(r.status) != A.STATUS_NOT_REACHED]
            if censored:
                notes.append(f"{title}: {label} at k = {', '.join(map(str, censored))}: misses the target in "
                             "≥ 2.5% of bootstrap replicates (bar to the bottom edge)")
            # an interval of one value has no bar to draw: said, so the caption's error bars are not looked for
            single = [int(r.reference_k) for r in shown if _number(r.efficiency) is not None
                      and _number(r.efficiency_lo) == _number(r.efficiency_hi) == _number(r.efficiency)]
            if single:
                notes.append(f"{title}: {label} at k = {', '.join(map(str, single))}: the 95% bootstrap interval is "
                             "a single value (every replicate gives the same k-efficiency, e.g. identical samples): "
                             "no bar to draw")

    def draw(ax, j: int, handles: dict) -> dict:
        task = tasks[j]
        panel = _draw_panel(ax, per_task[task], styles, handles, first=j == 0)
        if panel is None:
            S._no_data(ax, f"no k-efficiency for {task}: " + ("no method point has a GRPO baseline with a common k"
                                                            if (keff["task"] == task).any()
                                                            else "no evaluation of a method other than GRPO"))
        return panel or {"ylim": None, "series": []}

    fig, record_panels = S._task_panels(tasks, labels, notes, draw)
    if has_intervals:
        interval = (f"error bars: 95% percentile interval of a paired bootstrap ({', '.join(map(str, replicates))} "
                    f"replicates resampling {' / '.join(bootstrap_units) or 'problems'}; the same problems for both "
                    "methods; a replicate in which the method misses the target counts as efficiency 0)")
    else:
        interval = "no error bars: the table has no bootstrap intervals"
    caption = (
        "k-efficiency of each method over GRPO per task (one colour per method, shades and markers per point): for "
        "each reference k (x, log2), the target is GRPO's seed-mean pass@k; k* is the smallest k (log2-interpolated) "
        "at which the method's seed-mean pass@k reaches it, and the efficiency (y, log2) = k_GRPO / k* (k_GRPO = the "
        "reference k unless GRPO saturates earlier): 2× means the method needs half the samples. The dashed line at "
        f"1 is GRPO; {interval}. ▽ on the bottom edge: the method does not reach the target within k ≤ the reference "
        "k (k* beyond the evaluated range)."
    )
    record = {"id": layout.K_EFFICIENCY_FIGURE, "kind": "k_efficiency", "caption": caption, "notes": notes,
              "missing_runs": missing, "size_px": S._size_px(fig), "source": source,
              "bootstrap": {"replicates": replicates, "resampled": bootstrap_units} if has_intervals else None,
              "panels": record_panels}
    return fig, record


def _draw_panel(ax, rows_by_series: dict[Series, list], styles: dict, handles: dict, *, first: bool) -> dict | None:
    """One task's panel; None when there is nothing to draw. Returns its record (ylim and series)."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, NullLocator

    from repexp.aggregate import tables as A

    series_list = sorted(rows_by_series, key=_series_sort_key)
    shown = {s: rows for s in series_list if (rows := _shown(rows_by_series[s]))}
    if not shown:
        return None
    values = [1.0] + [v for rows in shown.values() for r in rows
                      for v in map(_number, (r.efficiency, r.efficiency_lo, r.efficiency_hi)) if v and v > 0]
    y_lo, y_hi = min(values) / 2 ** 0.5, max(values) * 2 ** 0.4
    edge = y_lo  # where values below the axis (not reached, a lower bound of 0) are drawn
    k_max = max(int(r.reference_k) for rows in shown.values() for r in rows)
    ax.axhline(1.0, color=S.method_color(A.BASELINE), linestyle="--", linewidth=1.2, zorder=1)
    handles.setdefault("GRPO (= 1)", ax.lines[-1])
    m = len(shown)
    series_records = []
    for i, (series, rows) in enumerate(shown.items()):
        style = styles[series]
        shift = 2 ** ((i - (m - 1) / 2) * DODGE_LOG2)
        columns: list[dict[str, Any]] = []  # one per reference k, transposed into the record below
        line_x, line_y = [], []
        for r in rows:
            k = int(r.reference_k)
            eff, lo, hi = _number(r.efficiency), _number(r.efficiency_lo), _number(r.efficiency_hi)
            status = str(r.status)
            x = k * shift
            drawn, on_edge, marker, filled = None, False, style["marker"], True
            if eff is not None:
                drawn = eff
                if status == A.STATUS_REACHED_FIRST:
                    marker, filled = LOWER_BOUND_MARKER, False
            elif status == A.STATUS_NOT_REACHED:
                drawn, on_edge, marker, filled = edge, True, EDGE_MARKER, False
            if drawn is not None:
                if lo is not None and hi is not None:
                    bottom = max(lo, edge) if lo > 0 else edge
                    ax.errorbar([x], [drawn], yerr=[[max(0.0, drawn - bottom)], [max(0.0, hi - drawn)]], fmt="none",
                                ecolor=style["color"], elinewidth=1.0, capsize=2.5, zorder=2, clip_on=False)
                point, = ax.plot([x], [drawn], linestyle="none", marker=marker, markersize=6,
                                 color=style["color"], markerfacecolor=style["color"] if filled else "white",
                                 markeredgecolor=style["color"] if not filled else "#F7F7FF",
                                 markeredgewidth=1.0 if not filled else 0.9, zorder=3, clip_on=False)
                if filled and not on_edge:
                    handles.setdefault(style["label"], point)
                if not on_edge:
                    line_x.append(x)
                    line_y.append(drawn)
            columns.append({"reference_k": k, "efficiency": eff, "lo": lo, "hi": hi,
                            "not_reached_fraction": _number(r.bootstrap_not_reached), "k_star": _number(r.k_star),
                            "k_grpo": _number(r.k_grpo), "status": status, "drawn_at": drawn, "on_edge": on_edge})
        if len(line_x) >= 2:
            ax.plot(line_x, line_y, color=style["color"], linewidth=0.8, alpha=0.5, zorder=2)
        if style["label"] not in handles:  # no filled point drawn: the legend shows the marker the plot has
            drawn_as = EDGE_MARKER if any(c["on_edge"] for c in columns) else LOWER_BOUND_MARKER
            handles[style["label"]] = ax.plot([], [], linestyle="none", marker=drawn_as, markersize=6,
                                              color=style["color"], markerfacecolor="white",
                                              markeredgecolor=style["color"], markeredgewidth=1.0)[0]
        series_records.append({**series.to_dict(), "label": style["label"], "color": style["color"],
                               "marker": style["marker"],
                               "n_method_seeds": int(rows[0].n_method_seeds), "n_grpo_seeds": int(rows[0].n_grpo_seeds),
                               **{key: [c[key] for c in columns] for key in columns[0]}})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    top = max(1, math.floor(math.log2(k_max)))
    ax.xaxis.set_major_locator(FixedLocator([2 ** e for e in range(1, top + 1)]))
    ax.set_xticklabels([f"$2^{{{e}}}$" for e in range(1, top + 1)])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(2 ** 0.6, 2 ** (math.log2(k_max) + 0.4))
    ticks, tick_labels = _ratio_ticks(y_lo, y_hi)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.set_yticklabels(tick_labels)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("reference k (GRPO's pass@k)")
    ax.tick_params(axis="both", labelsize=S.FONT["tick"])
    if first:
        ax.set_ylabel("k-efficiency (k_GRPO / k*)")
    return {"ylim": [float(y_lo), float(y_hi)], "edge": float(np.float64(edge)), "series": series_records}
