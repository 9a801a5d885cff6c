"""What a figure plots: one `Series` per method and config point, seed means, and the notes on missing runs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from repexp.aggregate.load import run_sort_key
from repexp.aggregate.tables import BASELINE, PARAM_COLUMNS, point_label, row_params, runs_on_common_ks
from repexp.config import METHODS, RunSpec
from repexp.figures.style import PAPER_POINTS
from repexp.methods import BASE
from repexp.methods import METHODS as METHOD_TABLE

# --------------------------------------------------------------------------- series


@dataclasses.dataclass(frozen=True)
class Series:
    """One plotted line: a method at one parameter point (`RunSpec.point`), averaged over its seeds.

    `params`: the method's parameters as (field, value) pairs (`RunSpec.params`); empty for GRPO and the base
    model. Everything about a method (label, colour, marker) is read from `repexp.methods`."""

    task: str
    method: str
    backend: str | None
    point: str
    params: tuple[tuple[str, Any], ...] = ()

    def label(self, *, show_point: bool, show_backend: bool) -> str:
        text = point_label(self.method, dict(self.params), with_point=show_point)
        if show_backend and self.backend:
            text += f" [{self.backend}]"
        return text

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def spec(self, seed: int | None = None) -> RunSpec:
        """The run of this series with `seed`."""
        return RunSpec(self.task, self.method, self.backend, self.params, seed)

    def to_dict(self) -> dict:
        """Its fields with the parameters flattened (index.json: `sparse_dim`, `beta`, `passk_k`, ...)."""
        return {"task": self.task, "method": self.method, "backend": self.backend, "point": self.point,
                **self.param_dict}


def compared(method: str) -> bool:
    """Whether a method is compared with GRPO (every method but GRPO and the base model)."""
    return method not in (BASELINE, BASE)


def coinciding_with_grpo(curves: dict[Series, list[float]], tolerance: float = 1e-12) -> set[Series]:
    """Series of a compared method whose curve equals the GRPO curve of the same task and backend at every
    point (to `tolerance`): drawn on top, dashed, with hollow markers and a note, so that neither line hides
    the other."""
    same = set()
    for series, values in curves.items():
        if not compared(series.method):
            continue
        grpo = next((v for s, v in curves.items() if s.method == BASELINE and s.task == series.task
                     and s.backend == series.backend), None)
        if grpo is not None and len(grpo) == len(values) and all(abs(a - b) <= tolerance for a, b in zip(values, grpo)):
            same.add(series)
    return same


def zorder(method: str) -> int:
    """Drawing order: the base model below, GRPO above it, every other method on top (in table order)."""
    if method == BASE:
        return 2
    if method == BASELINE:
        return 3
    return 4 + [m for m in METHOD_TABLE if compared(m)].index(method)


def series_of(spec: RunSpec) -> Series:
    return Series(spec.task, spec.method, spec.backend, spec.point, tuple(spec.params))


def series_from_row(row, task: str | None = None) -> Series:
    """The series of a table row (pass@k or k-efficiency): its method, backend and parameter columns."""
    method = row["method"]
    spec = RunSpec.of(task or row["task"], method, None if method == BASE else row["backend"],
                      **row_params(row, method))
    return series_of(spec)


def _series_sort_key(s: Series) -> tuple:
    return (METHODS.index(s.method), s.backend or "", tuple(value for _, value in s.params))


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


def select_points(task: str, series: Sequence[Series], max_lines: int) -> list[Series]:
    """The points of one method (and backend) drawn in the pass@k figure: all of them up to `max_lines`,
    else one: RepExp's paper setting for the task where evaluated, else the first in sweep order."""
    series = sorted(series, key=_series_sort_key)
    if len(series) <= max_lines:
        return series
    if all(s.method == "repexp" for s in series):
        keys = {(s.param_dict["sparse_dim"], float(s.param_dict["beta"])): s for s in series}
        return [keys[p] for p in select_repexp_points(task, list(keys), max_lines)]
    return series[:1]


def series_mask(table, series: Series):
    """The table's rows of one series (every seed), by the method's parameter columns (never the run name)."""
    import numpy as np

    mask = (table["task"] == series.task) & (table["method"] == series.method)
    if series.method != BASE:
        mask &= table["backend"] == series.backend
    for name, value in series.params:
        if isinstance(value, float):
            mask &= np.isclose(table[name].astype(float), value)
        else:
            mask &= (table[name] == value).fillna(False).astype(bool)
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

    specs = set()
    keys = ["task", "method", "backend", "seed", *(c for c in PARAM_COLUMNS if c in table.columns)]
    for row in table.drop_duplicates(keys).to_dict("records"):
        method = row["method"]
        seed = None if pd.isna(row["seed"]) else int(row["seed"])
        backend = None if method == BASE or pd.isna(row["backend"]) else row["backend"]
        specs.add(RunSpec.of(row["task"], method, backend, seed, **row_params(row, method)))
    return sorted(specs, key=run_sort_key)


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
            label = series.label(show_point=True, show_backend=several_backends)
            notes.append(f"{label}: no seed {', '.join(map(str, lacking))}")
            missing += [f"{task}/{series.spec(x).name}" for x in lacking]
    methods = {s.method for s in task_runs}
    for method, text in ((BASELINE, "no GRPO run"), (BASE, "no base-model run")):
        if method not in methods:
            notes.append(text)
    if not any(compared(m) for m in methods):
        notes.append("no run of a method compared with GRPO")
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
