"""What a figure plots: one `Series` per method and config point, seed means, and the notes on missing runs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from repexp.aggregate.load import run_sort_key
from repexp.aggregate.tables import METHOD_NAMES, runs_on_common_ks
from repexp.config import METHODS, RunSpec, canonical
from repexp.figures.style import PAPER_POINTS

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
        text = METHOD_NAMES[self.method]
        if self.method == "repexp" and show_point:
            text += f" (dim={self.sparse_dim}, β={canonical(self.beta)})"
        if show_backend and self.backend:
            text += f" [{self.backend}]"
        return text

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def coinciding_with_grpo(curves: dict[Series, list[float]], tolerance: float = 1e-12) -> set[Series]:
    """RepExp series whose curve equals the GRPO curve of the same task and backend at every point (to
    `tolerance`): drawn on top, dashed, with hollow markers and a note, so that neither line hides the
    other."""
    same = set()
    for series, values in curves.items():
        if series.method != "repexp":
            continue
        grpo = next((v for s, v in curves.items() if s.method == "grpo" and s.task == series.task
                     and s.backend == series.backend), None)
        if grpo is not None and len(grpo) == len(values) and all(abs(a - b) <= tolerance for a, b in zip(values, grpo)):
            same.add(series)
    return same


# Drawing order: the base model below, GRPO above it, RepExp on top.
ZORDER = {"base": 2, "grpo": 3, "repexp": 4}


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


def series_mask(table, series: Series):
    """The table's rows of one series (every seed)."""
    import numpy as np

    mask = (table["task"] == series.task) & (table["method"] == series.method)
    if series.method != "base":
        mask &= table["backend"] == series.backend
    if series.method == "repexp":
        mask &= (table["sparse_dim"] == series.sparse_dim) & np.isclose(table["beta"].astype(float), series.beta)
    return mask


def seed_curve(table, series: Series) -> dict[str, Any] | None:
    """pass@k of one series: mean over its seeds and SEM over seeds (ddof 1) on the ks all seeds have."""

    rows = table[series_mask(table, series)]
    if rows.empty:
        return None
    ks, per_run, values = runs_on_common_ks(rows, "pass_at_k")
    n = len(per_run)
    sem = (values.std(axis=0, ddof=1) / math.sqrt(n)).tolist() if n >= 2 else None
    seeds = sorted({int(s) for s in rows["seed"].dropna()})
    return {"k": ks, "mean": values.mean(axis=0).tolist(), "sem": sem, "n_seeds": n, "seeds": seeds,
            "runs": sorted(per_run)}


# --------------------------------------------------------------------------- expectations / notes


def table_specs(table) -> list[RunSpec]:
    """The runs of a pass@k table, from the columns the aggregate writes for each run (never its name)."""
    import pandas as pd

    rows = table[["task", "method", "backend", "sparse_dim", "beta", "seed"]].drop_duplicates().astype(object)
    return sorted({RunSpec(*(None if pd.isna(v) else v for v in row)) for row in rows.itertuples(index=False)},
                  key=run_sort_key)


def completeness_notes(task: str, found: Sequence[RunSpec],
                       expected: Sequence[RunSpec] | None) -> tuple[list[str], list[str]]:
    """(missing run paths, human notes) for one task.

    With a config, missing = expected runs without an evaluation. Without one, a series with fewer
    seeds than the task's other series and a missing GRPO or base-model run are reported.
    """
    if expected is not None:
        found_names = {s.name for s in found if s.task == task}
        missing = [s.path for s in expected if s.task == task and s.name not in found_names]
        return missing, [f"missing runs: {compact_runs([s.split('/', 1)[1] for s in missing])}"] if missing else []
    notes: list[str] = []
    missing = []
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
            missing += [f"{task}/{RunSpec(*dataclasses.astuple(series), x).name}" for x in lacking]
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
        parts.append(f"{key}_s{{{','.join(seeds)}}}" if len(seeds) > 1 else f"{key}_s{seeds[0]}" if seeds else key)
    return ", ".join(parts)
