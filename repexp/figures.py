"""`repexp figures`: pass@k curves, sweep heatmaps and training curves, plus `index.json`.

Input: the tidy table of `repexp aggregate` (`pass_at_k.csv`), optionally the pipeline config (the
expected runs: anything missing is named on the figure, in `index.json` and on stderr) and the
training metrics (`results/train/<task>/<run>/metrics.jsonl`, or the MLflow store).

Outputs in `--out-dir` (each written atomically; `index.json` last):

* `pass_at_k.{pdf,png}` — one panel per task (the paper's Figure 2 layout): pass@k over k on a log2
  axis, one line per method — RepExp (one line per (sparse_dim, β) point, see `select_repexp_points`),
  GRPO, base model — the mean over seeds with a ±SEM-over-seeds band (none with one seed);
* `heatmap_<task>_<backend>.{pdf,png}` — pass@1, pass@K (K = the largest k ≤ 256 every run has) and
  the k-efficiency over sparse_dim × β;
* `training_<task>_<backend>.{pdf,png}` — dev pass@1, raw and scaled bonus means, verifier vs shaped
  reward over training steps (mean over seeds ± SEM);
* `index.json` — every figure: files, caption, notes (missing runs), pixel size and the plotted data,
  so tests and readers can check numbers without looking at pixels.

Figures are never skipped silently: a figure without data is drawn as a panel that says what is
missing, so every declared output exists and shows why it is empty.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

from repexp.config import METHODS, TASKS, RunSpec, canonical, parse_run
from repexp.io import atomic_path, write_json_atomic

HEADLINE_K = 256
DPI = 200
TASK_TITLES = {"math": "MATH", "gsm8k": "GSM8K", "aime24": "AIME 2024", "dapo-with-aime24": "AIME 2024 (DAPO train)"}
# upstream plot_pass_at_k.py: GRPO = deep[-1], base = deep[7], RepExp = colorblind[2]; further RepExp
# points take other colourblind-safe colours (and markers) so they stay distinguishable
GRPO_COLOR = "#64b5cd"
BASE_COLOR = "#8c8c8c"
REPEXP_COLORS = ("#029e73", "#de8f05", "#cc78bc", "#d55e00", "#0173b2", "#ca9161")
REPEXP_MARKERS = ("o", "s", "^", "D", "v", "P")
BACKEND_LINESTYLES = ("-", "--", ":")
# the paper's main setting (upstream §14): β = 0.01, sparse_dim 32 (MATH, GSM8K) or 128 (AIME via DAPO)
PAPER_POINTS = {"math": (32, 0.01), "gsm8k": (32, 0.01), "aime24": (128, 0.01), "dapo-with-aime24": (128, 0.01)}
MAX_REPEXP_LINES = 4
TRAINING_METRICS = ("dev/pass@1", "repexp/bonus_raw/mean", "repexp/bonus_scaled/mean",
                    "reward/verifier/mean", "reward/shaped/mean")
LINE_STYLE = dict(marker="o", linewidth=1.275, markersize=6, markeredgewidth=0.9, markeredgecolor="#F7F7FF")
FONT = {"label": 10, "title": 11, "tick": 8, "legend": 8, "note": 7}


# --------------------------------------------------------------------------- series


@dataclasses.dataclass(frozen=True)
class Series:
    """One plotted line: a method at one config point, averaged over its seeds."""

    task: str
    method: str
    backend: str | None
    sparse_dim: int | None
    beta: float

    def label(self, *, show_point: bool, show_backend: bool) -> str:
        if self.method == "repexp":
            text = "RepExp"
            if show_point:
                text += f" (dim={self.sparse_dim}, β={canonical(self.beta)})"
        else:
            text = {"grpo": "GRPO", "base": "Base model"}[self.method]
        if show_backend and self.backend:
            text += f" [{self.backend}]"
        return text

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def series_of(spec: RunSpec) -> Series:
    if spec.method == "repexp":
        return Series(spec.task, "repexp", spec.backend, spec.sparse_dim, float(spec.beta))
    return Series(spec.task, spec.method, spec.backend, None, 0.0)


def _series_sort_key(s: Series) -> tuple:
    return (METHODS.index(s.method), s.backend or "", s.sparse_dim or 0, s.beta)


def select_repexp_points(task: str, points: Sequence[tuple[int, float]], max_lines: int) -> list[tuple[int, float]]:
    """RepExp (sparse_dim, β) points drawn in the pass@k figure.

    All points when there are at most `max_lines`; otherwise the paper's setting for the task if it
    was evaluated, else the first point in sweep order. The others are in the heatmaps (and the note).
    """
    points = sorted(set(points))
    if len(points) <= max_lines:
        return points
    paper = PAPER_POINTS.get(task)
    for point in points:
        if paper and point[0] == paper[0] and math.isclose(point[1], paper[1]):
            return [point]
    return points[:1]


def seed_curve(table, series: Series) -> dict[str, Any] | None:
    """pass@k of one series: mean over its seeds and SEM over seeds (ddof 1) on the ks all seeds have."""
    import numpy as np

    mask = (table["task"] == series.task) & (table["method"] == series.method)
    if series.method != "base":
        mask &= table["backend"] == series.backend
    if series.method == "repexp":
        mask &= (table["sparse_dim"] == series.sparse_dim) & np.isclose(table["beta"].astype(float), series.beta)
    rows = table[mask]
    if rows.empty:
        return None
    per_run = {run: dict(zip(g["k"].astype(int), g["pass_at_k"].astype(float))) for run, g in rows.groupby("run", sort=True)}
    ks = sorted(set.intersection(*(set(c) for c in per_run.values())))
    values = np.array([[curve[k] for k in ks] for curve in per_run.values()])
    n = len(per_run)
    sem = (values.std(axis=0, ddof=1) / math.sqrt(n)).tolist() if n >= 2 else None
    seeds = sorted({int(s) for s in rows["seed"].dropna()})
    return {"k": ks, "mean": values.mean(axis=0).tolist(), "sem": sem, "n_seeds": n, "seeds": seeds,
            "runs": sorted(per_run)}


# --------------------------------------------------------------------------- expectations / notes


def expected_from_config(config_path: str | Path) -> list[RunSpec]:
    from repexp.config import load, sweep_runs

    return sweep_runs(load(config_path))


def table_specs(table) -> list[RunSpec]:
    return sorted({parse_run(t, r) for t, r in table[["task", "run"]].drop_duplicates().itertuples(index=False)},
                  key=lambda s: (TASKS.index(s.task), METHODS.index(s.method), s.backend or "", s.sparse_dim or 0,
                                 s.beta, s.seed or 0))


def completeness_notes(task: str, found: Sequence[RunSpec], expected: Sequence[RunSpec] | None) -> tuple[list[str], list[str]]:
    """(missing run paths, human notes) for one task.

    With a config, missing = expected runs without an evaluation. Without one, a series with fewer
    seeds than the task's other series and a missing GRPO or base-model run are reported.
    """
    found_names = {s.name for s in found if s.task == task}
    notes: list[str] = []
    missing: list[str] = []
    if expected is not None:
        missing = [s.path for s in expected if s.task == task and s.name not in found_names]
        if missing:
            notes.append(f"missing runs: {compact_runs([s.split('/', 1)[1] for s in missing])}")
        return missing, notes
    task_runs = [s for s in found if s.task == task]
    all_seeds = sorted({s.seed for s in task_runs if s.seed is not None})
    by_series: dict[Series, set[int]] = {}
    for s in task_runs:
        if s.method != "base":
            by_series.setdefault(series_of(s), set()).add(s.seed)
    several_backends = len({s.backend for s in by_series}) > 1
    for series, seeds in sorted(by_series.items(), key=lambda kv: _series_sort_key(kv[0])):
        lacking = [x for x in all_seeds if x not in seeds]
        if lacking:
            label = series.label(show_point=series.method == "repexp", show_backend=several_backends)
            notes.append(f"{label}: no seed {', '.join(map(str, lacking))}")
            missing += [f"{task}/{_run_name(series, x)}" for x in lacking]
    methods = {s.method for s in task_runs}
    for method, text in (("grpo", "no GRPO run"), ("base", "no base-model run"), ("repexp", "no RepExp run")):
        if method not in methods:
            notes.append(text)
    return missing, notes


def compact_runs(names: Sequence[str]) -> str:
    """'verl_grpo_s41', 'verl_grpo_s42', 'base' → 'verl_grpo_s{41,42}, base' (order of first appearance)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        stem, sep, seed = name.rpartition("_s")
        key = stem if sep and seed.isdigit() else name
        groups.setdefault(key, []).append(seed if key == stem else "")
    parts = []
    for key, seeds in groups.items():
        seeds = [s for s in seeds if s]
        if not seeds:
            parts.append(key)
        elif len(seeds) == 1:
            parts.append(f"{key}_s{seeds[0]}")
        else:
            parts.append(f"{key}_s{{{','.join(seeds)}}}")
    return ", ".join(parts)


def _run_name(series: Series, seed: int) -> str:
    return RunSpec(series.task, series.method, series.backend, series.sparse_dim, series.beta, seed).name


# --------------------------------------------------------------------------- figure scaffolding


def _style():
    """seaborn whitegrid + upstream font sizes, scoped to a `with` block."""
    import contextlib

    import matplotlib.pyplot as plt
    import seaborn as sns

    stack = contextlib.ExitStack()
    stack.enter_context(sns.axes_style("whitegrid"))
    stack.enter_context(plt.rc_context({
        "axes.labelsize": FONT["label"], "axes.titlesize": FONT["title"], "xtick.labelsize": FONT["tick"],
        "ytick.labelsize": FONT["tick"], "legend.fontsize": FONT["legend"], "pdf.fonttype": 42,
        "font.family": "DejaVu Sans",
    }))
    return stack


def _wrap(text: str, width_in: float, fontsize: float) -> list[str]:
    chars = max(30, int(width_in * 72 / (fontsize * 0.56)))
    return textwrap.wrap(text, chars) or [""]


def _figure_with_footer(width: float, plot_height: float, *, legend_rows: int, notes: Sequence[str], ncols: int = 1,
                        nrows: int = 1, sharey: bool = False):
    """A figure of fixed size: a plot area on top, legend and wrapped notes below (never over the data)."""
    import matplotlib.pyplot as plt

    note_lines = [line for note in notes for line in _wrap(note, width - 0.3, FONT["note"])]
    footer = 0.12 + 0.2 * legend_rows + 0.13 * len(note_lines)
    fig = plt.figure(figsize=(width, plot_height + footer), dpi=DPI, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[plot_height, footer], hspace=0.0)
    axes = top.subplots(nrows, ncols, sharey=sharey, squeeze=False)
    if note_lines:
        bottom.text(0.5, 0.02, "\n".join(note_lines), ha="center", va="bottom", fontsize=FONT["note"],
                    color="#444444", linespacing=1.25)
    return fig, axes, bottom


def _no_data(ax, message: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(message, 28)), ha="center", va="center", fontsize=FONT["legend"],
            color="#666666", transform=ax.transAxes)


def _adaptive_ylim(lows: Iterable[float], highs: Iterable[float], *, floor: float = 0.0, ceil: float = 1.0,
                   min_span: float = 0.05) -> tuple[float, float]:
    """Limits that contain every plotted value (band included) with a margin, never cropping data.

    Nearly flat data get at least `min_span` (so ticks stay readable); the limits stay within a
    small margin of [floor, ceil], the range of a probability.
    """
    lows = [v for v in lows if v is not None and math.isfinite(v)]
    highs = [v for v in highs if v is not None and math.isfinite(v)]
    if not lows:
        return floor, ceil
    lo, hi = min(lows), max(highs)
    pad = 0.08 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    if hi - lo < min_span:
        centre = (lo + hi) / 2
        lo, hi = centre - min_span / 2, centre + min_span / 2
    margin = 0.03 * (hi - lo)  # markers at exactly 0 or 1 must not be cut
    if lo < floor - margin:
        lo, hi = floor - margin, hi + (floor - margin - lo)
    if hi > ceil + margin:
        lo, hi = max(floor - margin, lo - (hi - ceil - margin)), ceil + margin
    return lo, hi


def _save(fig, out_dir: Path, stem: str) -> list[str]:
    import matplotlib.pyplot as plt

    files = []
    for ext in ("png", "pdf"):
        target = out_dir / f"{stem}.{ext}"
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=ext, dpi=DPI)
        files.append(target.name)
    plt.close(fig)
    return files


def _size_px(fig) -> list[int]:
    w, h = fig.get_size_inches()
    return [int(round(w * DPI)), int(round(h * DPI))]


# --------------------------------------------------------------------------- pass@k curves


def _log2_axis(ax, k_max: int) -> None:
    ax.set_xscale("log", base=2)
    top = max(0, math.floor(math.log2(max(1, k_max))))
    ticks = [2 ** i for i in range(top + 1)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"$2^{{{i}}}$" for i in range(top + 1)])
    ax.minorticks_off()
    ax.set_xlim(2 ** -0.2, 2 ** (math.log2(max(1, k_max)) + 0.2))


def _curve_panels(found: Sequence[RunSpec], tasks: Sequence[str], expected: Sequence[RunSpec] | None,
                  max_repexp_lines: int) -> tuple[list[dict], list[str], list[str]]:
    """Which series each task panel draws, plus the notes and missing runs of the figure."""
    panels: list[dict] = []
    notes: list[str] = []
    missing: list[str] = []
    for task in tasks:
        title = TASK_TITLES.get(task, task)
        task_missing, task_notes = completeness_notes(task, found, expected)
        missing += task_missing
        notes += [f"{title}: {n}" for n in task_notes]
        series_set = sorted({series_of(s) for s in found if s.task == task}, key=_series_sort_key)
        shown: list[Series] = [s for s in series_set if s.method != "repexp"]
        for backend in sorted({s.backend for s in series_set if s.method == "repexp"}):
            points = [(s.sparse_dim, s.beta) for s in series_set if s.method == "repexp" and s.backend == backend]
            keep = set(select_repexp_points(task, points, max_repexp_lines))
            dropped = [p for p in sorted(set(points)) if p not in keep]
            if dropped:
                notes.append(f"{title}: {len(dropped)} further RepExp sweep points are in the heatmap "
                             f"({', '.join(f'dim={k} β={canonical(b)}' for k, b in dropped)})")
            shown += [s for s in series_set if s.method == "repexp" and s.backend == backend
                      and (s.sparse_dim, s.beta) in keep]
        panels.append({"task": task, "series": sorted(shown, key=_series_sort_key)})
    return panels, notes, missing


def plot_pass_at_k(table, *, tasks: Sequence[str] | None = None, expected: Sequence[RunSpec] | None = None,
                   max_repexp_lines: int = MAX_REPEXP_LINES):
    """The pass@k figure. Returns (figure, record) where record holds caption, notes and plotted data."""
    found = table_specs(table)
    tasks = list(tasks) if tasks else list(dict.fromkeys(s.task for s in found))
    if not tasks:
        raise ValueError("no tasks to plot")
    panels, notes, missing = _curve_panels(found, tasks, expected, max_repexp_lines)
    all_series = [s for panel in panels for s in panel["series"]]
    repexp_points = {(s.sparse_dim, s.beta) for s in all_series if s.method == "repexp"}
    show_point = len(repexp_points) > 1
    show_backend = len({s.backend for s in all_series if s.backend}) > 1
    styles = _series_styles(all_series, show_point=show_point, show_backend=show_backend)
    single_seed = any((seed_curve(table, s) or {}).get("n_seeds") == 1 for s in all_series if s.method != "base")
    if single_seed:
        notes.append("Lines with one seed have no band.")

    labels = list(dict.fromkeys(styles[s]["label"] for s in sorted(all_series, key=_series_sort_key)))
    ncol = min(max(1, len(labels)), 4)
    width = max(5.0, 3.2 * len(tasks))
    with _style():
        fig, axes, footer = _figure_with_footer(width, 2.9, legend_rows=math.ceil(len(labels) / ncol), notes=notes,
                                                ncols=len(tasks))
        record_panels = []
        handles: dict[str, Any] = {}
        for j, panel in enumerate(panels):
            ax = axes[0][j]
            task = panel["task"]
            ax.set_title(TASK_TITLES.get(task, task))
            data_series = []
            lows, highs, k_max = [], [], 1
            for series in panel["series"]:
                curve = seed_curve(table, series)
                if curve is None:
                    continue
                style = styles[series]
                line, = ax.plot(curve["k"], curve["mean"], label=style["label"], color=style["color"],
                                linestyle=style["linestyle"], alpha=0.8 if series.method == "base" else 1.0,
                                **{**LINE_STYLE, "marker": style["marker"]})
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
                data_series.append({**series.to_dict(), "label": style["label"], **curve, "band": band})
            if not data_series:
                _no_data(ax, f"no evaluated runs for {task}")
                ylim = None
            else:
                _log2_axis(ax, k_max)
                ylim = _adaptive_ylim(lows, highs)
                ax.set_ylim(*ylim)
                ax.set_xlabel("k")
                ax.tick_params(axis="both", labelsize=FONT["tick"])
            if j == 0:
                ax.set_ylabel("pass@k")
            record_panels.append({"task": task, "title": TASK_TITLES.get(task, task), "ylim": list(ylim) if ylim else None,
                                  "series": data_series})
        if handles:
            footer.legend([handles[l] for l in labels if l in handles], [l for l in labels if l in handles],
                          loc="upper center", ncol=ncol, frameon=False, fontsize=FONT["legend"],
                          bbox_to_anchor=(0.5, 1.0))
    caption = (
        "pass@k on the test split over k (log2 axis) per task: mean over seeds "
        + ("with a ±1 SEM band across seeds (ddof 1)" if not single_seed else "(±1 SEM band across seeds where ≥ 2 seeds; one seed: no band)")
        + ". pass@k is the unbiased estimator from n samples per problem, averaged over problems. "
        + ("RepExp lines are labelled by their sweep point (dim = sparse_dim, β). " if show_point else "")
        + "The base model is evaluated once (no band)."
    )
    record = {"id": "pass_at_k", "kind": "pass_at_k", "caption": caption, "notes": notes, "missing_runs": missing,
              "size_px": _size_px(fig), "panels": record_panels}
    return fig, record


def _series_styles(series: Sequence[Series], *, show_point: bool, show_backend: bool) -> dict[Series, dict]:
    points = sorted({(s.sparse_dim, s.beta) for s in series if s.method == "repexp"})
    backends = sorted({s.backend for s in series if s.backend})
    styles = {}
    for s in series:
        linestyle = BACKEND_LINESTYLES[backends.index(s.backend) % len(BACKEND_LINESTYLES)] if s.backend and show_backend else "-"
        if s.method == "repexp":
            i = points.index((s.sparse_dim, s.beta))
            color, marker = REPEXP_COLORS[i % len(REPEXP_COLORS)], REPEXP_MARKERS[i % len(REPEXP_MARKERS)]
        else:
            color, marker = (GRPO_COLOR, "o") if s.method == "grpo" else (BASE_COLOR, "o")
        styles[s] = {"label": s.label(show_point=show_point, show_backend=show_backend), "color": color,
                     "marker": marker, "linestyle": linestyle}
    return styles


# --------------------------------------------------------------------------- heatmaps


def heatmap_grid(table, task: str, backend: str, expected: Sequence[RunSpec] | None) -> tuple[list[int], list[float]]:
    """sparse_dims (rows) and βs (columns): the config's sweep if given, else what was evaluated."""
    specs = list(expected) if expected is not None else table_specs(table)
    points = {(s.sparse_dim, float(s.beta)) for s in specs
              if s.task == task and s.method == "repexp" and s.backend == backend}
    return sorted({p[0] for p in points}), sorted({p[1] for p in points})


def _pass_cells(table, task: str, backend: str, sparse_dims, betas, k: int | None, n_full_seeds: int):
    """(values, annotations, cell records) of one pass@k panel: seed means per (sparse_dim, β)."""
    import numpy as np

    values = np.full((len(sparse_dims), len(betas)), np.nan)
    text = np.full(values.shape, "", dtype=object)
    cells = []
    for i, d in enumerate(sparse_dims):
        for j, b in enumerate(betas):
            curve = seed_curve(table, Series(task, "repexp", backend, d, b))
            if k is None or curve is None or k not in curve["k"]:
                text[i, j] = "missing"
                cells.append({"sparse_dim": d, "beta": b, "value": None, "n_seeds": 0 if curve is None else curve["n_seeds"]})
                continue
            at = curve["k"].index(k)
            values[i, j] = curve["mean"][at]
            text[i, j] = f"{values[i, j]:.3f}"
            if n_full_seeds and curve["n_seeds"] < n_full_seeds:
                text[i, j] += f"\n({curve['n_seeds']}/{n_full_seeds} seeds)"
            cells.append({"sparse_dim": d, "beta": b, "value": curve["mean"][at],
                          "sem": None if curve["sem"] is None else curve["sem"][at],
                          "n_seeds": curve["n_seeds"], "seeds": curve["seeds"]})
    return values, text, cells


def _efficiency_cells(keff, backend: str, sparse_dims, betas):
    """(log2 efficiency, annotations, cell records) from the k-efficiency table."""
    import numpy as np

    values = np.full((len(sparse_dims), len(betas)), np.nan)
    text = np.full(values.shape, "", dtype=object)
    cells = []
    for i, d in enumerate(sparse_dims):
        for j, b in enumerate(betas):
            match = keff[(keff["backend"] == backend) & (keff["sparse_dim"] == d) & np.isclose(keff["beta"], b)]
            if match.empty:
                text[i, j] = "missing"
                cells.append({"sparse_dim": d, "beta": b, "value": None, "status": "missing"})
                continue
            row = match.iloc[0]
            efficiency = None if pd_isna(row["efficiency"]) else float(row["efficiency"])
            if efficiency:
                values[i, j] = math.log2(efficiency)
                text[i, j] = f"{efficiency:.2f}×"
            else:
                text[i, j] = str(row["status"]).replace(" ", "\n", 1)
            cells.append({"sparse_dim": d, "beta": b, "value": efficiency, "status": row["status"],
                          "k_star": None if pd_isna(row["k_star"]) else float(row["k_star"]),
                          "reference_k": None if pd_isna(row["reference_k"]) else int(row["reference_k"])})
    return values, text, cells


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


def _draw_heatmap(ax, values, text, sparse_dims, betas, *, norm, cmap: str, label: str, ticks, tick_labels) -> None:
    import numpy as np
    import seaborn as sns

    ax.set_facecolor("#eeeeee")  # missing cells
    ax.grid(False)
    with warnings.catch_warnings():  # an all-missing panel makes seaborn warn about NaN min/max
        warnings.simplefilter("ignore", RuntimeWarning)
        sns.heatmap(values, ax=ax, cmap=cmap, norm=norm, annot=text, fmt="", mask=~np.isfinite(values),
                    annot_kws={"fontsize": FONT["note"]}, linewidths=0.5, linecolor="white",
                    xticklabels=[canonical(b) for b in betas], yticklabels=[str(d) for d in sparse_dims],
                    cbar_kws={"label": label, "shrink": 0.9})
    # seaborn does not annotate masked cells: say "missing" / "not reached" there
    for i, j in zip(*np.nonzero(~np.isfinite(values))):
        if text[i, j]:
            ax.text(j + 0.5, i + 0.5, text[i, j], ha="center", va="center", fontsize=FONT["note"], color="#555555")
    colorbar = ax.collections[0].colorbar
    colorbar.ax.yaxis.label.set_size(FONT["note"])
    colorbar.ax.tick_params(labelsize=FONT["note"])
    colorbar.set_ticks(ticks, labels=tick_labels)
    ax.set_xlabel("β")
    ax.tick_params(axis="y", rotation=0)


def plot_heatmap(table, task: str, backend: str, *, expected: Sequence[RunSpec] | None = None):
    """pass@1, pass@K and k-efficiency over sparse_dim × β for one task and backend."""
    import matplotlib.colors as mcolors
    import numpy as np

    from repexp import aggregate

    sparse_dims, betas = heatmap_grid(table, task, backend, expected)
    found = table_specs(table)
    trained_here = lambda specs: [s for s in specs if s.trains and s.backend == backend]  # noqa: E731
    missing, notes = completeness_notes(task, trained_here(found), None if expected is None else trained_here(expected))
    notes = [n for n in notes if "base-model" not in n]
    rows = table[(table["task"] == task) & (table["backend"] == backend) & table["method"].isin(["repexp", "grpo"])]
    ks_per_run = [set(g["k"].astype(int)) for _, g in rows.groupby("run")]
    common = set.intersection(*ks_per_run) if ks_per_run else set()
    k_ref = max((k for k in common if k <= HEADLINE_K), default=None)
    keff = aggregate.k_efficiency(table[table["task"] == task])
    n_full_seeds = len({s.seed for s in trained_here(expected if expected is not None else found) if s.task == task})
    grpo_curve = seed_curve(table, Series(task, "grpo", backend, None, 0.0))

    width = max(7.5, 7.8 + 1.35 * max(0, len(betas) - 2))
    height = 1.7 + 0.45 * max(2, len(sparse_dims))
    panels = []
    with _style():
        fig, axes, _ = _figure_with_footer(width, height, legend_rows=0, notes=notes, ncols=3)
        fig.suptitle(f"{TASK_TITLES.get(task, task)} [{backend}]: RepExp sweep", fontsize=FONT["title"])
        for ax, (name, k) in zip(axes[0], [("pass@1", 1), (f"pass@{k_ref}" if k_ref else "pass@K", k_ref),
                                          ("k-efficiency", None)]):
            ax.set_title(name, fontsize=FONT["label"])
            if not sparse_dims:
                _no_data(ax, f"no RepExp runs for {task} [{backend}]")
                panels.append({"metric": name, "k": k, "grpo": None, "cells": []})
                continue
            grpo = None
            if name == "k-efficiency":
                values, text, cells = _efficiency_cells(keff, backend, sparse_dims, betas)
                finite = values[np.isfinite(values)]  # log2 efficiency: the scale is symmetric around 1×
                bound = max(1, math.ceil(float(np.abs(finite).max()))) if finite.size else 1
                ticks = list(range(-bound, bound + 1))
                _draw_heatmap(ax, values, text, sparse_dims, betas, cmap="vlag", label="efficiency (1×: as GRPO)",
                              norm=mcolors.TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound),
                              ticks=ticks, tick_labels=[f"{2.0 ** t:g}×" for t in ticks])
            else:
                values, text, cells = _pass_cells(table, task, backend, sparse_dims, betas, k, n_full_seeds)
                if grpo_curve and k in grpo_curve["k"]:
                    grpo = grpo_curve["mean"][grpo_curve["k"].index(k)]
                norm, cmap, label, ticks = _pass_norm(values, grpo, name)
                _draw_heatmap(ax, values, text, sparse_dims, betas, norm=norm, cmap=cmap, label=label,
                              ticks=ticks, tick_labels=[f"{t:.3f}" for t in ticks])
            ax.set_ylabel("sparse_dim" if name == "pass@1" else "")
            panels.append({"metric": name, "k": k, "grpo": grpo, "cells": cells})
    caption = (
        f"RepExp sweep on {TASK_TITLES.get(task, task)} ({backend}): rows sparse_dim, columns β; cells are means over "
        "seeds. pass@1 and pass@K (K: the largest k ≤ 256 every run evaluated) are coloured around GRPO's value "
        "(blue: below, red: above). k-efficiency = k_GRPO / k*: k* is the (log2-interpolated) smallest k at which "
        "RepExp's pass@k reaches GRPO's pass@K, k_GRPO the same for GRPO's own curve (K unless GRPO saturates); "
        "\"not reached\" when RepExp never does."
    )
    record = {"id": f"heatmap_{task}_{backend}", "kind": "heatmap", "task": task, "backend": backend,
              "caption": caption, "notes": notes, "missing_runs": missing, "size_px": _size_px(fig),
              "sparse_dims": sparse_dims, "betas": betas, "panels": panels}
    return fig, record


def pd_isna(value) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


# --------------------------------------------------------------------------- training curves


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
                curves.setdefault(key, {})[step] = float(value)
    return curves


def training_curves_from_jsonl(train_dir: str | Path, specs: Sequence[RunSpec]) -> dict[str, dict[str, dict[int, float]]]:
    """{'<task>/<run>': {metric: {step: value}}} for every trained spec whose metrics.jsonl exists."""
    out = {}
    for spec in specs:
        path = Path(train_dir) / spec.task / spec.name / "metrics.jsonl"
        if spec.trains and path.is_file():
            out[spec.path] = {k: v for k, v in read_metrics_jsonl(path).items() if k in TRAINING_METRICS}
    return out


def training_curves_from_mlflow(target, specs: Sequence[RunSpec]) -> dict[str, dict[str, dict[int, float]]]:
    """Same as `training_curves_from_jsonl`, read from the MLflow store (`target`: aggregate.MlflowTarget).

    Every run of a sweep point (its parent and its node runs, see repexp.tracking) is searched; a
    metric logged under its MLflow-safe name (`@` → `_at_`) is the same metric. For a step logged by
    several runs (retried attempts), the latest run wins.
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
                for key in dict.fromkeys((metric, metric.replace("@", "_at_"))):
                    if key in run.data.metrics:
                        for point in store.client.get_metric_history(run.info.run_id, key):
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
    ("dev pass@1", ("dev/pass@1",)),
    ("bonus (raw), mean", ("repexp/bonus_raw/mean",)),
    ("bonus (× β), mean", ("repexp/bonus_scaled/mean",)),
    ("reward: shaped (—) vs verifier (- -)", ("reward/shaped/mean", "reward/verifier/mean")),
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
        fig, axes, footer = _figure_with_footer(9.0, 4.6, legend_rows=math.ceil(max(1, len(labels)) / ncol), notes=notes,
                                                ncols=2, nrows=2)
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
                    line, = ax.plot(data["step"], data["mean"], color=style["color"], linestyle=linestyle, linewidth=1.0,
                                    marker=style["marker"] if sparse else None, markersize=3.5)
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
        f"Training on {TASK_TITLES.get(task, task)} ({backend}), from {source}: dev pass@1 at each validation, the mean "
        "raw and β-scaled RepExp bonus per step, and the mean shaped reward (α·verifier + β·bonus, solid) against "
        "the verifier reward (dashed). Lines are means over seeds with a ±1 SEM band where ≥ 2 seeds logged the step."
    )
    record = {"id": f"training_{task}_{backend}", "kind": "training", "task": task, "backend": backend,
              "source": source, "caption": caption, "notes": notes, "missing_runs": missing, "size_px": _size_px(fig),
              "panels": panels_record}
    return fig, record


# --------------------------------------------------------------------------- MLflow


def log_figures_run(target, figure_paths: Sequence[Path], table_files: Sequence[Path]) -> str | None:
    """Make the figures and the tables artifacts of the 'figures' run; returns its id (None if offline).

    Inside `repexp mlflow node --rule figures` that is the node run (its wrapper logs the declared
    outputs, so only the tables, which are inputs, are added here, under `table/`; offline they go
    to the outbox with the rest of the record). Standalone (`--experiment`), a run named 'figures'
    is created under the experiment's parent run with everything under `figures/` and `table/`.
    """
    from repexp import aggregate, tracking

    node = tracking.current_node()
    if node is not None and node.enabled and target.experiment == node.record.experiment:
        for path in table_files:
            node.log_artifact(path, "table")
        return node.run_id
    store, experiment_id = aggregate.mlflow_store(target)
    with store.lock():
        parent_id, _ = store.parent(experiment_id, tracking.scope_for(results_id=getattr(target, "results_id", None)))
    run = store.client.create_run(experiment_id, run_name="figures",
                                  tags={"mlflow.parentRunId": parent_id, "repexp.rule": "figures",
                                        tracking.SCOPE_KEY_TAG: tracking.scope_for().key})
    status = "FAILED"
    try:
        for path in figure_paths:
            store.client.log_artifact(run.info.run_id, str(path), "figures")
        for path in table_files:
            store.client.log_artifact(run.info.run_id, str(path), "table")
        status = "FINISHED"
    finally:
        store.client.set_terminated(run.info.run_id, status)
    return run.info.run_id


# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", type=Path, required=True, help="pass_at_k.csv written by `repexp aggregate`")
    parser.add_argument("--out-dir", type=Path, required=True, help="where figures and index.json go")
    parser.add_argument("--config", type=Path, help="pipeline config: its runs are expected (missing ones are named)")
    parser.add_argument("--train-dir", type=Path, help="results/train: training curves from <task>/<run>/metrics.jsonl")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--experiment",
                        help="MLflow experiment: log the figures and tables as a 'figures' run (default: the enclosing "
                             "`repexp mlflow node` run, if any) and, with --curves-from auto, read training curves from it")
    parser.add_argument("--curves-from", choices=("auto", "mlflow", "jsonl", "none"), default="auto",
                        help="training-curve source (auto: MLflow with --experiment, else metrics.jsonl with --train-dir, "
                             "else none)")
    parser.add_argument("--max-repexp-lines", type=int, default=MAX_REPEXP_LINES,
                        help="RepExp sweep points drawn in the pass@k figure before only the main one is kept")


def figure_pairs(specs: Sequence[RunSpec]) -> list[tuple[str, str]]:
    """(task, backend) pairs that get a heatmap and a training figure: those with trained runs, in sweep order."""
    return list(dict.fromkeys((s.task, s.backend) for s in specs if s.trains))


def figure_files(specs: Sequence[RunSpec], *, training: bool = True) -> dict[str, list[str]]:
    """File names `repexp figures` writes for these runs (for the Snakemake rule's outputs).

    {"pass_at_k": [...], "heatmaps": [...], "training": [...], "index": ["index.json"]}, PNG before PDF.
    Cheap: the workflow imports it at parse time.
    """
    pairs = figure_pairs(specs)
    both = lambda stem: [f"{stem}.png", f"{stem}.pdf"]  # noqa: E731
    return {
        "pass_at_k": both("pass_at_k"),
        "heatmaps": [name for t, b in pairs for name in both(f"heatmap_{t}_{b}")],
        "training": [name for t, b in pairs for name in both(f"training_{t}_{b}")] if training else [],
        "index": ["index.json"],
    }


def make_figures(table, out_dir: Path, *, expected: Sequence[RunSpec] | None = None,
                 curves: dict | None = None, curves_source: str = "",
                 max_repexp_lines: int = MAX_REPEXP_LINES, table_path: str | None = None) -> dict:
    """Draw and save every figure; write `index.json` last. Returns the index."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    found = table_specs(table)
    specs = list(expected) if expected is not None else found
    tasks = list(dict.fromkeys(s.task for s in specs))
    figures = []

    fig, record = plot_pass_at_k(table, tasks=tasks, expected=expected, max_repexp_lines=max_repexp_lines)
    record["files"] = _save(fig, out_dir, "pass_at_k")
    figures.append(record)
    pairs = figure_pairs(specs)
    for task, backend in pairs:
        fig, record = plot_heatmap(table, task, backend, expected=expected)
        record["files"] = _save(fig, out_dir, record["id"])
        figures.append(record)
    if curves is not None:
        for task, backend in pairs:
            fig, record = plot_training(curves, task, backend, specs=specs, source=curves_source)
            record["files"] = _save(fig, out_dir, record["id"])
            figures.append(record)
    index = {"generated_by": "repexp figures", "table": table_path, "dpi": DPI,
             "expected_from_config": expected is not None,
             "missing_evaluations": sorted({m for f in figures if f["kind"] != "training" for m in f["missing_runs"]}),
             "missing_training_metrics": sorted({m for f in figures if f["kind"] == "training" for m in f["missing_runs"]}),
             "training_curves": curves_source or None, "figures": figures}
    write_json_atomic(out_dir / "index.json", _json_safe(index))
    return index


def _json_safe(obj: Any) -> Any:
    """NaN/inf → None and numpy scalars → Python, so index.json is strict JSON."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def run(args: argparse.Namespace) -> int:
    from repexp import aggregate

    try:
        table = aggregate.read_table(args.table)
        if table.empty:
            raise ValueError(f"{args.table}: the table has no rows")
        expected = expected_from_config(args.config) if args.config else None
        source = args.curves_from
        if source == "auto":
            source = "mlflow" if args.experiment else ("jsonl" if args.train_dir else "none")
        specs = list(expected) if expected is not None else table_specs(table)
        curves, curves_source = None, ""
        if source == "jsonl":
            if args.train_dir is None:
                raise ValueError("--curves-from jsonl needs --train-dir")
            if not args.train_dir.is_dir():
                raise FileNotFoundError(f"{args.train_dir}: training directory not found")
            curves, curves_source = training_curves_from_jsonl(args.train_dir, specs), "metrics.jsonl"
        elif source == "mlflow":
            target = aggregate.mlflow_target(args.tracking_uri, args.experiment, args.config)
            if target is None:
                raise ValueError("--curves-from mlflow needs --experiment (or a `repexp mlflow node` run)")
            curves, curves_source = training_curves_from_mlflow(target, specs), "MLflow"
        index = make_figures(table, args.out_dir, expected=expected, curves=curves, curves_source=curves_source,
                             max_repexp_lines=args.max_repexp_lines, table_path=str(args.table))
    except (ValueError, FileNotFoundError) as err:
        print(f"figures: error: {err}", file=sys.stderr)
        return 1
    for name in index["missing_evaluations"]:
        print(f"figures: missing evaluation: {name}", file=sys.stderr)
    for name in index["missing_training_metrics"]:
        print(f"figures: missing training metrics: {name}", file=sys.stderr)
    for figure in index["figures"]:
        for note in figure["notes"]:
            print(f"figures: {figure['id']}: {note}", file=sys.stderr)
    print(f"figures: {len(index['figures'])} figures → {args.out_dir}")
    target = aggregate.mlflow_target(args.tracking_uri, args.experiment, args.config)
    if target is not None:
        figure_paths = [args.out_dir / name for f in index["figures"] for name in f["files"]] + [args.out_dir / "index.json"]
        table_files = [p for p in sorted(args.table.parent.iterdir())
                       if p.is_file() and p.suffix in (".csv", ".md", ".html") and not p.name.startswith(".")]
        try:
            run_id = log_figures_run(target, figure_paths, table_files)
            print(f"figures: figures and tables logged to MLflow run {run_id} ({target.experiment})")
        except Exception as err:  # the figures are written and valid; tracking failures are reported, not fatal
            print(f"figures: warning: MLflow logging failed ({type(err).__name__}: {err}); "
                  "the figures are complete, rerun with the same flags to log", file=sys.stderr)
    return 0
