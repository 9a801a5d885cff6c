"""Sweep heatmaps: pass@1, pass@K and k-efficiency of one method over its two named parameters (rows: the first,
columns: the second; RepExp's sparse_dim × β) for one task and backend. Which methods get one is
`repexp.layout.heatmap_params`'s rule, read from the method table."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from repexp import layout
from repexp.config import RunSpec, canonical
from repexp.figures import style as S
from repexp.figures.efficiency import _number
from repexp.figures.series import BASELINE, Series, completeness_notes, seed_curve, series_of, table_specs
from repexp.methods import METHODS


class _Grid:
    """The heatmap's axes: the row and column parameters, their values, and the series of each cell."""

    def __init__(self, rows: str, columns: str, series: dict[tuple, Series]):
        self.rows, self.columns, self.series = rows, columns, series
        self.row_values = sorted({key[0] for key in series})
        self.column_values = sorted({key[1] for key in series})


def _tick(value) -> str:
    return canonical(value) if isinstance(value, (int, float)) else str(value)


def _cells(grid: _Grid, cell):
    """(values, annotations, cell records) of one panel; `cell(r, c)` gives a cell's (value, text, record)."""
    import numpy as np

    values = np.full((len(grid.row_values), len(grid.column_values)), np.nan)
    text = np.full(values.shape, "", dtype=object)
    cells = []
    for i, r in enumerate(grid.row_values):
        for j, c in enumerate(grid.column_values):
            values[i, j], text[i, j], record = cell(r, c)
            cells.append({grid.rows: r, grid.columns: c, **record})
    return values, text, cells


def _pass_cells(table, grid: _Grid, k: int | None, n_full_seeds: int):
    """One pass@k panel's cells: seed means per parameter pair."""
    def cell(r, c):
        series = grid.series.get((r, c))
        curve = None if series is None else seed_curve(table, series)
        if k is None or curve is None or k not in curve["k"]:
            return math.nan, "missing", {"value": None, "n_seeds": 0 if curve is None else curve["n_seeds"]}
        at = curve["k"].index(k)
        text = f"{curve['mean'][at]:.3f}"
        if n_full_seeds and curve["n_seeds"] < n_full_seeds:
            text += f"\n({curve['n_seeds']}/{n_full_seeds} seeds)"
        return curve["mean"][at], text, {"value": curve["mean"][at],
                                         "sem": None if curve["sem"] is None else curve["sem"][at],
                                         "n_seeds": curve["n_seeds"], "seeds": curve["seeds"]}

    return _cells(grid, cell)


def _efficiency_cells(keff, backend: str, grid: _Grid):
    """The k-efficiency panel's cells (log2 efficiency) from the k-efficiency table (its rows of the cell's point)."""
    def cell(r, c):
        series = grid.series.get((r, c))
        match = keff[(keff["backend"] == backend) & (keff["method"] == (series.method if series else None))
                     & (keff["point"] == (series.point if series else None))]
        if match.empty:
            return math.nan, "missing", {"value": None, "status": "missing"}
        row = match.iloc[0]
        efficiency, reference_k = _number(row["efficiency"]), _number(row["reference_k"])
        record = {"value": efficiency, "status": row["status"], "k_star": _number(row["k_star"]),
                  "reference_k": None if reference_k is None else int(reference_k)}
        if efficiency:
            return math.log2(efficiency), f"{efficiency:.2f}×", record
        return math.nan, str(row["status"]).replace(" ", "\n", 1), record

    return _cells(grid, cell)


def _pass_norm(values, grpo: float | None, name: str):
    """Colour scale of a pass@k panel: diverging around GRPO's value when it lies inside (0, 1)."""
    import matplotlib.colors as mcolors
    import numpy as np

    finite = values[np.isfinite(values)]
    if grpo is not None and 0.0 < grpo < 1.0:
        spread = max(float(np.abs(finite - grpo).max()) if finite.size else 0.0, 0.005)
        norm = mcolors.TwoSlopeNorm(vcenter=grpo, vmin=max(0.0, grpo - spread), vmax=min(1.0, grpo + spread))
        return norm, "vlag", f"{name} (centre: GRPO {grpo:.3f})", [norm.vmin, grpo, norm.vmax]
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    if hi - lo < 0.01:  # (nearly) constant: a readable 0.01 range inside [0, 1]
        lo = min(max(0.0, (lo + hi) / 2 - 0.005), 0.99)
        hi = lo + 0.01
    label = f"{name} (no GRPO run)" if grpo is None else f"{name} (GRPO {grpo:.3f})"
    return mcolors.Normalize(vmin=lo, vmax=hi), "crest", label, [lo, (lo + hi) / 2, hi]


def _draw_heatmap(ax, values, text, grid: _Grid, *, norm, cmap: str, label: str, ticks, tick_labels) -> None:
    import numpy as np
    import seaborn as sns

    ax.set_facecolor("#eeeeee")  # missing cells
    ax.grid(False)
    with warnings.catch_warnings():  # an all-missing panel makes seaborn warn about NaN min/max
        warnings.simplefilter("ignore", RuntimeWarning)
        sns.heatmap(values, ax=ax, cmap=cmap, norm=norm, annot=text, fmt="", mask=~np.isfinite(values),
                    annot_kws={"fontsize": S.FONT["note"]}, linewidths=0.5, linecolor="white",
                    xticklabels=[_tick(c) for c in grid.column_values],
                    yticklabels=[_tick(r) for r in grid.row_values],
                    cbar_kws={"label": label, "shrink": 0.9})
    # seaborn does not annotate masked cells: say "missing" / "not reached" there
    for i, j in zip(*np.nonzero(~np.isfinite(values))):
        if text[i, j]:
            ax.text(j + 0.5, i + 0.5, text[i, j], ha="center", va="center", fontsize=S.FONT["note"], color="#555555")
    colorbar = ax.collections[0].colorbar
    colorbar.ax.yaxis.label.set_size(S.FONT["note"])
    colorbar.ax.tick_params(labelsize=S.FONT["note"])
    colorbar.set_ticks(ticks, labels=tick_labels)
    ax.set_xlabel(grid.columns)
    ax.tick_params(axis="y", rotation=0)


def plot_heatmap(table, task: str, backend: str, method: str = "repexp", *, expected: Sequence[RunSpec] | None = None):
    """pass@1, pass@K and k-efficiency of `method` over its two named parameters for one task and backend."""
    import matplotlib.colors as mcolors
    import numpy as np

    from repexp.aggregate import tables

    named = METHODS[method].named_fields()
    if len(named) != 2:
        raise ValueError(f"{method}: a heatmap needs a method of two named parameters, it has {list(named)}")
    rows_param, columns_param = named
    entry = METHODS[method]
    title = entry.label
    found = table_specs(table)
    # rows and columns: the config's sweep if given, else what was evaluated
    points = {}
    for s in (expected if expected is not None else found):
        if s.task == task and s.method == method and s.backend == backend:
            values = s.param_dict
            points.setdefault((values[rows_param], values[columns_param]), series_of(s))
    grid = _Grid(rows_param, columns_param, points)
    # the notes speak of this method's and GRPO's runs (the other methods are not in this figure)
    trained_here = lambda specs: [s for s in specs if s.trains and s.backend == backend  # noqa: E731
                                  and s.method in (method, BASELINE)]
    missing, notes = completeness_notes(task, trained_here(found), None if expected is None else trained_here(expected))
    notes = [n for n in notes if "base-model" not in n]
    rows = table[(table["task"] == task) & (table["backend"] == backend) & table["method"].isin([method, BASELINE])]
    ks_per_run = [set(g["k"].astype(int)) for _, g in rows.groupby("run")]
    common = set.intersection(*ks_per_run) if ks_per_run else set()
    k_ref = max((k for k in common if k <= tables.HEADLINE_K), default=None)
    keff = tables.k_efficiency(table[table["task"] == task])
    n_full_seeds = len({s.seed for s in trained_here(expected if expected is not None else found) if s.task == task})
    grpo_curve = seed_curve(table, Series(task, BASELINE, backend, BASELINE))

    width = max(7.5, 7.8 + 1.35 * max(0, len(grid.column_values) - 2))
    height = 1.7 + 0.45 * max(2, len(grid.row_values))
    panels = []
    with S._style():
        fig, axes, _ = S._figure_with_footer(width, height, legend_rows=0, notes=notes, ncols=3)
        fig.suptitle(f"{S.TASK_TITLES.get(task, task)} [{backend}]: {title} sweep", fontsize=S.FONT["title"])
        for ax, (name, k) in zip(axes[0], [("pass@1", 1), (f"pass@{k_ref}" if k_ref else "pass@K", k_ref),
                                          ("k-efficiency", None)]):
            ax.set_title(name, fontsize=S.FONT["label"])
            if not points:
                S._no_data(ax, f"no {title} runs for {task} [{backend}]")
                panels.append({"metric": name, "k": k, "grpo": None, "cells": []})
                continue
            grpo = None
            if name == "k-efficiency":
                values, text, cells = _efficiency_cells(keff, backend, grid)
                finite = values[np.isfinite(values)]  # log2 efficiency: the scale is symmetric around 1×
                bound = max(1, math.ceil(float(np.abs(finite).max()))) if finite.size else 1
                ticks = list(range(-bound, bound + 1))
                _draw_heatmap(ax, values, text, grid, cmap="vlag", label="efficiency (1×: as GRPO)",
                              norm=mcolors.TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound),
                              ticks=ticks, tick_labels=[f"{2.0 ** t:g}×" for t in ticks])
            else:
                values, text, cells = _pass_cells(table, grid, k, n_full_seeds)
                if grpo_curve and k in grpo_curve["k"]:
                    grpo = grpo_curve["mean"][grpo_curve["k"].index(k)]
                norm, cmap, label, ticks = _pass_norm(values, grpo, name)
                _draw_heatmap(ax, values, text, grid, norm=norm, cmap=cmap, label=label,
                              ticks=ticks, tick_labels=[f"{t:.3f}" for t in ticks])
            ax.set_ylabel(rows_param if name == "pass@1" else "")
            panels.append({"metric": name, "k": k, "grpo": grpo, "cells": cells})
    caption = (
        f"{title} sweep on {S.TASK_TITLES.get(task, task)} ({backend}): rows {rows_param}, columns {columns_param}; "
        "cells are means over seeds. pass@1 and pass@K (K: the largest k ≤ 256 every run evaluated) are coloured "
        "around GRPO's value (blue: below, red: above). k-efficiency = k_GRPO / k*: k* is the (log2-interpolated) "
        f"smallest k at which the point's pass@k reaches GRPO's pass@K, k_GRPO the same for GRPO's own curve (K "
        "unless GRPO saturates); \"not reached\" when the point never does."
    )
    record = {"id": layout.heatmap_figure(task, backend, method), "kind": "heatmap", "task": task,
              "backend": backend, "method": method, "rows": rows_param, "columns": columns_param,
              "caption": caption, "notes": notes, "missing_runs": missing, "size_px": S._size_px(fig),
              "row_values": grid.row_values, "column_values": grid.column_values, "panels": panels}
    return fig, record
