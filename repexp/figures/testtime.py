"""The test-time RepExp figure: per task, pass@k of each run's samples in RepExp order and in random order.

Both curves come from the tidy table: `pass_at_k` (the unbiased estimator: a random order of the n
samples) and `testtime_pass_at_k` (the verifier takes the samples in the greedy elliptical order,
`repexp testtime`). One colour per method/point (mean over seeds), solid = RepExp order, dashed =
random order; they meet at k = n by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from repexp import layout
from repexp.aggregate.tables import runs_on_common_ks
from repexp.config import RunSpec
from repexp.figures import style as S
from repexp.figures.curves import series_styles
from repexp.figures.series import (
    Series,
    _series_sort_key,
    coinciding_with_grpo,
    series_mask,
    series_of,
    table_specs,
    zorder,
)

STEM = layout.TESTTIME_FIGURE
ORDERS = (("testtime_pass_at_k", "RepExp order", "-"), ("pass_at_k", "random order", "--"))


def testtime_curve(table, series: Series, column: str) -> dict[str, Any] | None:
    """Seed-mean `column` over the ks every seed of the series has a value for (None without any)."""
    # both curves on the runs that have the ordering
    rows = table[series_mask(table, series) & table["testtime_pass_at_k"].notna()]
    if rows.empty:
        return None
    ks, per_run, values = runs_on_common_ks(rows, column)
    return {"k": ks, "mean": values.mean(axis=0).tolist(), "n_seeds": len(per_run), "runs": sorted(per_run)}


def plot_testtime(table, *, tasks: Sequence[str] | None = None, expected: Sequence[RunSpec] | None = None):
    """The test-time figure. Returns (figure, record) like the other figures."""
    found = table_specs(table)
    tasks = list(tasks) if tasks else list(dict.fromkeys(s.task for s in found))
    panels = [{"task": task, "series": sorted({series_of(s) for s in found if s.task == task}, key=_series_sort_key)}
              for task in tasks]
    styles, labels, _ = series_styles([s for p in panels for s in p["series"]])
    notes: list[str] = []
    if expected is not None:
        have = set(table.loc[table["testtime_pass_at_k"].notna(), ["task", "run"]].itertuples(index=False, name=None))
        lacking = [s.path for s in expected if s.task in tasks and (s.task, s.name) not in have]
        if lacking:
            notes.append(f"no test-time result for: {', '.join(lacking)}")
    # a method's run whose curves equal GRPO's in both orders: drawn on top with hollow markers, and said
    same: set = set()
    for panel in panels:
        both = [coinciding_with_grpo({s: c["mean"] for s in panel["series"]
                                      if (c := testtime_curve(table, s, column)) is not None})
                for column, _, _ in ORDERS]
        coincide = both[0] & both[1]
        same |= coincide
        title = S.TASK_TITLES.get(panel["task"], panel["task"])
        notes += [f"{title}: {styles[s]['label']} = GRPO at every k in both orders (the curves coincide; "
                  f"{s.label(show_point=False, show_backend=False)} is drawn on top with hollow markers)"
                  for s in sorted(coincide, key=_series_sort_key)]
    def draw(ax, j: int, handles: dict) -> dict:
        task = panels[j]["task"]
        plotted, lows, highs, k_max = [], [], [], 1
        for series in panels[j]["series"]:
            style = styles[series]
            for column, order_name, linestyle in ORDERS:
                curve = testtime_curve(table, series, column)
                if curve is None:
                    continue
                hollow = {"markerfacecolor": "none", "markeredgecolor": style["color"]} if series in same else {}
                line, = ax.plot(curve["k"], curve["mean"], color=style["color"], linestyle=linestyle,
                                zorder=zorder(series.method),
                                **{**S.LINE_STYLE, "marker": style["marker"] if linestyle == "-" else None, **hollow})
                if linestyle == "-":
                    handles.setdefault(style["label"], line)
                lows += curve["mean"]
                highs += curve["mean"]
                k_max = max(k_max, max(curve["k"]))
                plotted.append({**series.to_dict(), "label": style["label"], "color": style["color"],
                                "marker": style["marker"], "order": order_name, **curve})
        ylim = S._finish_curve_panel(ax, plotted=bool(plotted), empty_message=f"no test-time results for {task}",
                                     k_max=k_max, lows=lows, highs=highs, xlabel="k (verifier calls)", first=j == 0)
        return {"ylim": list(ylim) if ylim else None, "series": plotted}

    def order_legend(ax, handles: dict) -> None:  # what solid and dashed mean
        for _, name, ls in ORDERS:
            handles[name] = ax.plot([], [], color="#444444", linestyle=ls, linewidth=1.275)[0]

    fig, record_panels = S._task_panels(tasks, labels + [name for _, name, _ in ORDERS], notes, draw, order_legend)
    caption = (
        "Test-time RepExp (the paper's inference-time exploration) on each run's test samples: pass@k when the "
        "verifier is called on the samples in RepExp order (solid: each time the sample with the largest "
        "elliptical bonus w.r.t. those already taken, features of the frozen initial policy) and in a uniformly "
        "random order (dashed: the unbiased pass@k of the same samples), over k on a log2 axis; means over "
        "seeds. Both meet at k = n by construction; a solid line above its dashed twin means fewer verifier "
        "calls for the same pass@k."
    )
    record = {"id": STEM, "kind": "testtime", "caption": caption, "notes": notes, "missing_runs": [],
              "size_px": S._size_px(fig), "panels": record_panels}
    return fig, record
