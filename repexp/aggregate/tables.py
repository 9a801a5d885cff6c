"""The tables of `repexp aggregate`: the tidy pass@k table and the k-efficiency with its bootstrap
(pandas/numpy; their Markdown/HTML views are `repexp.aggregate.render`'s).

The method axis (`repexp.methods.METHODS`) is read from the table only: every run carries its `method`, its
`point` (`RunSpec.point`, shared by the seeds of one parameter point), its `label` (`Method.point_label`) and
one column per parameter of the methods present (NA where a parameter is not the run's method's), so a new
method needs no change here.

k-efficiency (the paper's "RepExp reaches GRPO's pass@256 at pass@80"; docs/figures.md defines it in full), for
each method point other than GRPO's (and the base model's) against GRPO of the same task and backend, on
seed-mean curves over the ks every seed of the point and of GRPO evaluated: target = GRPO's pass@reference_k
(the largest grid k ≤ 256); k* = where the method's curve first reaches it (interpolated in log2 k), k_grpo =
the same on GRPO's own curve; efficiency = k_grpo / k*.

`bootstrap_k_efficiency`: a paired percentile bootstrap over the problems (the same draw for both methods)
and, for a method with ≥ 2 seeds, its seeds; a replicate in which the method misses the target counts as
efficiency 0. `k_efficiency_by_k.csv` holds a point's row for every grid k as the reference k.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from repexp.aggregate.load import EvalRun, TesttimeRun
from repexp.methods import BASE, METHODS, label
from repexp.verify.routing import GRADERS

HEADLINE_K = 256  # the largest reference k of k-efficiency; the figures' heatmap uses the same k
GRADER_COLUMNS = tuple(f"pass_at_k_{g}" for g in GRADERS)  # pass@k under each grader (NaN if not evaluated)
BASELINE = "grpo"  # the method every other one is compared with (k-efficiency, Δpass@k, heatmap colour centres)
# the type of every parameter of every method (table order; a name shared by two methods is one column)
PARAM_TYPES: dict[str, type] = {}
for _method in METHODS.values():
    for _name, _type in typing.get_type_hints(_method.params).items():
        PARAM_TYPES.setdefault(_name, _type)
PARAM_COLUMNS = tuple(PARAM_TYPES)
# a run's identity: its method point, then (between `backend` and `seed`) the parameter columns of the methods
# present (`param_columns`), then its seed
RUN_COLUMNS = ("task", "run", "method", "point", "label", "backend")
TIDY_COLUMNS = (  # the fixed columns of pass_at_k.csv; `tidy_columns` places the parameter columns
    *RUN_COLUMNS, "seed", "k", "pass_at_k", "sem",
    "n_samples", "num_problems", "mean_at_n", "checkpoint_step", "split", "engine", "eval_seed",
    "data_hash", "model_path", "source", "grader", *GRADER_COLUMNS, "testtime_pass_at_k",
)
POINT_KEYS = ("task", "backend", "method", "point")  # one k-efficiency point (its seeds pooled)
K_EFFICIENCY_COLUMNS = (  # the fixed columns of k_efficiency.csv; `k_efficiency_columns` adds the parameters
    *POINT_KEYS, "label", "n_method_seeds", "n_grpo_seeds", "reference_k",
    "grpo_pass_at_ref", "method_pass_at_ref", "k_grpo", "k_star", "k_star_evaluated", "efficiency", "status", "note",
    # the paired bootstrap (module docstring): percentile interval of the efficiency, the fraction of replicates
    # in which the method misses the target, and the pass@k difference method − GRPO at k = 1 and at reference_k
    "efficiency_lo", "efficiency_hi", "bootstrap_not_reached",
    "diff_pass_at_1", "diff_pass_at_1_lo", "diff_pass_at_1_hi",
    "diff_pass_at_ref", "diff_pass_at_ref_lo", "diff_pass_at_ref_hi",
    "bootstrap_replicates", "bootstrap_resampled",
)
BOOTSTRAP_REPLICATES = 1000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95
NO_INTERVAL_NOTE = "no bootstrap interval"  # starts a k-efficiency row's note that says why it has none
METHOD_NAMES = {name: label(name) for name in (*METHODS, BASE)}  # repexp.methods' labels, base included
STATUS_REACHED = "reached"
STATUS_REACHED_FIRST = "reached at the smallest k"
STATUS_NOT_REACHED = "not reached"
STATUS_NO_GRPO = "no GRPO baseline"
STATUS_UNDEFINED = "undefined: GRPO solves nothing"
STATUS_NO_COMMON_K = "no common k"  # the point's and GRPO's seeds share no evaluated k ≤ 256


# --------------------------------------------------------------------------- tables


def param_columns(methods: Iterable[str]) -> list[str]:
    """The parameter columns of these methods: every field of each, in the method table's order (the base
    model has none)."""
    present = set(methods)
    names = [f.name for name, m in METHODS.items() if name in present for f in m.fields()]
    return list(dict.fromkeys(names))


def _methods_in(table) -> list[str]:
    return [m for m in METHODS if m in set(table["method"].dropna())] if len(table) else []


def tidy_columns(methods: Iterable[str]) -> list[str]:
    """pass_at_k.csv's columns for runs of these methods: `TIDY_COLUMNS` with their parameters before `seed`."""
    at = TIDY_COLUMNS.index("seed")
    return [*TIDY_COLUMNS[:at], *param_columns(methods), *TIDY_COLUMNS[at:]]


def k_efficiency_columns(methods: Iterable[str]) -> list[str]:
    """k_efficiency.csv's columns for points of these methods: `K_EFFICIENCY_COLUMNS` with their parameters
    after `label`."""
    at = K_EFFICIENCY_COLUMNS.index("label") + 1
    return [*K_EFFICIENCY_COLUMNS[:at], *param_columns(methods), *K_EFFICIENCY_COLUMNS[at:]]


def point_label(method: str, params: Mapping[str, Any] | None = None, *, with_point: bool = True) -> str:
    """A method point's label in tables and legends (`Method.point_label`), e.g. ``RepExp (dim=32, β=0.01)``;
    `params` may hold only some fields (the others: the method's defaults)."""
    if method == BASE:
        return label(BASE)
    entry = METHODS[method]
    known = {f.name for f in entry.fields()}
    settings = entry.make({k: _plain(v) for k, v in (params or {}).items() if k in known and not isna(v)})
    return entry.point_label(settings, with_point=with_point)


def row_params(row: Mapping[str, Any], method: str) -> dict[str, Any]:
    """The method's parameters read from a table row (its parameter columns; NA ones left out)."""
    if method == BASE:
        return {}
    return {f.name: _plain(row[f.name]) for f in METHODS[method].fields()
            if f.name in row and not isna(row[f.name])}


def _plain(value: Any) -> Any:
    """numpy/pandas scalars as Python values (labels, names and record JSON must not depend on the dtype)."""
    return value.item() if hasattr(value, "item") else value


def isna(value: Any) -> bool:
    import pandas as pd

    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # not a scalar
        return False


def _param_dtypes(table) -> None:
    """Parameter columns typed by their fields: int → nullable Int64, float → float (NaN where NA),
    text → object with None where NA."""
    for column in (c for c in PARAM_COLUMNS if c in table.columns):
        kind = PARAM_TYPES[column]
        if kind is int:
            table[column] = table[column].astype("Int64")
        elif kind is float:
            table[column] = table[column].astype(float)
        else:
            table[column] = table[column].astype(object).where(table[column].notna(), None)


def tidy_table(runs: Sequence[EvalRun], testtime: dict[tuple[str, str], TesttimeRun] | None = None):
    """One row per (run, k), columns `tidy_columns` of the runs' methods (`testtime_pass_at_k` empty without a
    test-time result; a parameter column NA where the run's method does not have it)."""
    import pandas as pd

    rows = []
    for run in runs:
        s = run.spec
        tt = (testtime or {}).get((s.task, s.name))
        for k, value in run.pass_at_k.items():
            rows.append({
                "task": s.task, "run": s.name, "method": s.method, "point": s.point,
                "label": point_label(s.method, s.param_dict), "backend": s.backend, **s.param_dict,
                "seed": s.seed, "k": k, "pass_at_k": value, "sem": run.pass_at_k_sem.get(k, math.nan),
                "n_samples": run.n_samples, "num_problems": run.num_problems,
                "mean_at_n": run.meta["mean_at_n"], "checkpoint_step": run.meta["checkpoint_step"],
                "split": run.meta["split"], "engine": run.meta["engine"], "eval_seed": run.meta["seed"],
                "data_hash": run.meta["data_hash"], "model_path": run.meta["model_path"],
                "source": str(run.path), "grader": run.grader,
                **{f"pass_at_k_{g}": run.by_grader.get(g, {}).get(k, math.nan) for g in GRADERS},
                "testtime_pass_at_k": tt.pass_at_k_repexp.get(k, math.nan) if tt else math.nan,
            })
    methods = [m for m in METHODS if any(r.spec.method == m for r in runs)]
    table = pd.DataFrame(rows, columns=tidy_columns(methods))
    for column in ("seed", "checkpoint_step", "eval_seed"):
        table[column] = table[column].astype("Int64")  # nullable: the base model has no seed
    _param_dtypes(table)
    return table


def _read_csv(path: str | Path, what: str, columns: Sequence[str], strings: Sequence[str], hint: str = ""):
    """A table written by `repexp aggregate`, its string columns read as text; errors say what is wrong."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} table not found (run `repexp aggregate` first)")
    text_params = [c for c in PARAM_COLUMNS if PARAM_TYPES[c] is str]
    table = pd.read_csv(path, dtype=dict.fromkeys([*strings, *text_params], "string"))
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}{hint}")
    _param_dtypes(table)
    return table


def _none_for_na(table, columns: Sequence[str]) -> None:
    for column in columns:
        table[column] = table[column].astype(object).where(table[column].notna(), None)


def read_table(path: str | Path):
    """Read `pass_at_k.csv` back with the dtypes `tidy_table` gives."""
    table = _read_csv(path, "pass@k", TIDY_COLUMNS, ("backend", "run", "task", "method", "point", "label", "split",
                                                     "engine", "data_hash", "model_path", "source", "grader"),
                      " (written by an older `repexp aggregate`? rerun it)")
    for column in ("seed", "checkpoint_step", "eval_seed"):
        table[column] = table[column].astype("Int64")
    _none_for_na(table, ("backend", "task", "run", "method", "point", "label"))
    return table


def _mean_curve(table, mask) -> dict[int, float] | None:
    """Seed-mean pass@k over the ks every seed evaluated (None when there are no rows)."""
    rows = table[mask]
    if rows.empty:
        return None
    ks, _, values = runs_on_common_ks(rows, "pass_at_k")
    return dict(zip(ks, values.mean(axis=0).tolist()))


def runs_on_common_ks(rows, column: str):
    """(ks every run has, {run: {k: value}}, values [runs, ks]) of `column`, runs sorted by name."""
    import numpy as np

    per_run = {run: dict(zip(g["k"].astype(int), g[column].astype(float))) for run, g in rows.groupby("run", sort=True)}
    ks = sorted(set.intersection(*(set(c) for c in per_run.values())))
    return ks, per_run, np.array([[curve[k] for k in ks] for curve in per_run.values()])


_REACH_TOLERANCE = 1e-12  # equal means reach; guards against float noise in the seed mean


def crossing_k(curve: dict[int, float], target: float) -> tuple[float, int] | None:
    """(k*, k*_evaluated) where the increasing curve first reaches `target` (log2-linear interpolation).

    None when it never does. k* = k*_evaluated when the first grid point already reaches it.
    """
    ks = sorted(curve)
    k_star, k_evaluated = crossing_k_batch(ks, [[curve[k] for k in ks]], [target])
    return None if math.isnan(k_star[0]) else (float(k_star[0]), int(k_evaluated[0]))


def crossing_k_batch(ks: Sequence[int], curves, targets):
    """`crossing_k` of many curves on one grid at once: (k*, k*_evaluated), arrays of shape [B].

    `ks`: the increasing grid [K]; `curves`: [B, K]; `targets`: [B]. Where a curve never reaches its
    target, k* is NaN and k*_evaluated 0.
    """
    import numpy as np

    ks = np.asarray(ks, dtype=np.int64)
    curves = np.atleast_2d(np.asarray(curves, dtype=np.float64))
    targets = np.broadcast_to(np.asarray(targets, dtype=np.float64), (len(curves),))
    reached = curves >= targets[:, None] - _REACH_TOLERANCE
    hit = reached.any(axis=1)
    i = reached.argmax(axis=1)
    prev = np.maximum(i - 1, 0)
    rows = np.arange(len(curves))
    y_lo, y_hi = curves[rows, prev], curves[rows, i]
    rise = y_hi - y_lo
    frac = np.where(rise > 0, np.clip((targets - y_lo) / np.where(rise > 0, rise, 1.0), 0.0, 1.0), 1.0)
    log_k = np.log2(ks.astype(np.float64))
    # reached at the first grid point: k* is that k exactly (no round trip through log2)
    k_star = np.where(i == 0, ks[0].astype(np.float64), 2.0 ** (log_k[prev] + frac * (log_k[i] - log_k[prev])))
    return np.where(hit, k_star, np.nan), np.where(hit, ks[i], 0)


def _per_seed_pass(num_samples, num_correct, ks: Sequence[int]):
    """Unbiased pass@k per seed, problem and k, [seeds, problems, K], from [seeds, problems] counts."""
    import numpy as np

    from repexp import passk

    n = np.atleast_2d(np.asarray(num_samples))
    c = np.atleast_2d(np.asarray(num_correct))
    if n.shape != c.shape or n.ndim != 2 or n.shape[0] < 1 or n.shape[1] < 1:
        raise ValueError(f"counts must be [seeds, problems] arrays of one shape, got {n.shape} and {c.shape}")
    return np.stack([passk.pass_at_k(n[s], c[s], ks) for s in range(n.shape[0])])


def _counts_to_weights(draws, size: int):
    """How often each of `size` indices was drawn, per row of `draws` [B, m], divided by m: [B, size]."""
    import numpy as np

    rows, m = draws.shape
    offsets = draws + size * np.arange(rows)[:, None]
    return np.bincount(offsets.ravel(), minlength=rows * size).reshape(rows, size) / m


def _interval(values, level: float) -> tuple[float, float]:
    """Percentile interval of the finite values (NaN, NaN when there are none)."""
    import numpy as np

    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_k_efficiency(method_n, method_c, grpo_n, grpo_c, ks: Sequence[int], *,
                           reference_ks: Sequence[int] | None = None, diff_ks: Sequence[int] = (),
                           replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED,
                           level: float = BOOTSTRAP_LEVEL, method: str = "repexp") -> dict[str, Any]:
    """A method's k-efficiency over GRPO and its pass@k differences, with paired percentile-bootstrap intervals.

    `method_n`, `method_c`: [seeds, problems] sample and correct counts of the method point's seeds (a 1-D
    array is one seed); `grpo_n`, `grpo_c`: GRPO's, over the same problems in the same order. `ks`: the
    increasing k grid; the efficiency is computed at every k of `reference_ks` (default: the largest) on the
    grid up to it, the difference method − GRPO of the seed-mean pass@k at every k of `diff_ks`. `method`:
    its name in `repexp.methods` (it only names the resampled seeds).

    Every replicate draws the problems with replacement (one draw for both methods), then, for a method
    with ≥ 2 seeds, its seeds (the method's, then GRPO's), from `numpy.random.default_rng(seed)`.

    Returns {"efficiency": {ref: {"estimate", "k_star", "lo", "hi", "not_reached", "undefined"}},
    "difference": {k: {"estimate", "lo", "hi"}}, "replicates", "level", "seed", "num_problems",
    "seeds": (method, GRPO), "resampled"}. `estimate` is the full-data value (NaN when not reached or
    undefined); `not_reached`/`undefined` are fractions of the replicates; lo/hi the percentile interval.
    """
    import numpy as np

    ks = [int(k) for k in ks]
    if not ks or ks != sorted(set(ks)):
        raise ValueError(f"ks must be a non-empty increasing list, got {ks}")
    reference_ks = [ks[-1]] if reference_ks is None else [int(k) for k in reference_ks]
    unknown = [k for k in (*reference_ks, *diff_ks) if k not in ks]
    if unknown:
        raise ValueError(f"reference and difference ks {unknown} are not on the grid {ks}")
    if replicates < 1 or not 0 < level < 1:
        raise ValueError(f"need replicates ≥ 1 and 0 < level < 1, got {replicates}, {level}")
    # keyed "method" and "grpo" (not by name: GRPO could be compared with itself)
    values = {"method": _per_seed_pass(method_n, method_c, ks), "grpo": _per_seed_pass(grpo_n, grpo_c, ks)}
    names = {"method": label(method), "grpo": label(BASELINE)}
    num_problems = values["method"].shape[1]
    if values["grpo"].shape[1] != num_problems:
        raise ValueError(f"paired bootstrap: {names['method']} has {num_problems} problems, GRPO "
                         f"{values['grpo'].shape[1]}")

    rng = np.random.default_rng(seed)
    problem_weights = _counts_to_weights(rng.integers(0, num_problems, size=(replicates, num_problems)),
                                         num_problems)  # [B, P]
    boot, full, resampled = {}, {}, ["problems"]
    for name, per_seed in values.items():
        seeds = per_seed.shape[0]
        # [B, P] @ [P, S·K] → each seed's problem-resampled curve, [B, S, K]
        curves = (problem_weights @ per_seed.transpose(1, 0, 2).reshape(num_problems, -1)).reshape(
            replicates, seeds, len(ks))
        if seeds >= 2:
            seed_weights = _counts_to_weights(rng.integers(0, seeds, size=(replicates, seeds)), seeds)
            resampled.append(f"{names[name]} seeds")
        else:
            seed_weights = np.ones((replicates, 1))
        boot[name] = np.einsum("bs,bsk->bk", seed_weights, curves)
        full[name] = per_seed.mean(axis=(0, 1))[None, :]

    def efficiency(rep, grpo, j):
        target = grpo[:, j]
        k_grpo, _ = crossing_k_batch(ks[: j + 1], grpo[:, : j + 1], target)
        k_star, _ = crossing_k_batch(ks[: j + 1], rep[:, : j + 1], target)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(np.isnan(k_star), 0.0, k_grpo / k_star)
        return np.where(target > 0, ratio, np.nan), k_star

    result: dict[str, Any] = {"efficiency": {}, "difference": {}, "replicates": replicates, "level": level,
                              "seed": seed, "num_problems": num_problems,
                              "seeds": (values["method"].shape[0], values["grpo"].shape[0]),
                              "resampled": ", ".join(resampled)}
    for ref in reference_ks:
        j = ks.index(ref)
        draws, _ = efficiency(boot["method"], boot["grpo"], j)
        point, k_star = efficiency(full["method"], full["grpo"], j)
        lo, hi = _interval(draws, level)
        defined = np.isfinite(draws)
        result["efficiency"][ref] = {
            "estimate": float(point[0]) if point[0] > 0 else math.nan, "k_star": float(k_star[0]), "lo": lo,
            "hi": hi, "not_reached": float(np.mean(draws[defined] == 0)) if defined.any() else math.nan,
            "undefined": float(np.mean(~defined)),
        }
    for k in diff_ks:
        j = ks.index(k)
        lo, hi = _interval(boot["method"][:, j] - boot["grpo"][:, j], level)
        result["difference"][k] = {"estimate": float(full["method"][0, j] - full["grpo"][0, j]), "lo": lo, "hi": hi}
    return result


def _counts_matrix(runs: Sequence[EvalRun]) -> tuple[list[str], Any, Any]:
    """(problem ids, n, c) with n, c of shape [runs, problems], aligned by problem id; ValueError says why not."""
    import numpy as np

    lacking = [r.spec.name for r in runs if not r.per_problem]
    if lacking:
        raise ValueError(f"no per-problem counts for {', '.join(lacking)} (eval.json without `per_problem`, "
                         f"or the table's grader {runs[0].grader} is not the one the file was evaluated with)")
    ids = [pid for pid, _, _ in runs[0].per_problem]
    n = np.empty((len(runs), len(ids)), dtype=np.int64)
    c = np.empty_like(n)
    for i, run in enumerate(runs):
        counts = {pid: (ni, ci) for pid, ni, ci in run.per_problem}
        if set(counts) != set(ids):
            raise ValueError(f"the problems of {run.spec.name} differ from those of {runs[0].spec.name}")
        n[i], c[i] = zip(*(counts[pid] for pid in ids))
    return ids, n, c


def _efficiency_at(method_curve: dict[int, float], grpo_curve: dict[int, float], grid: list[int]) -> dict[str, Any]:
    """A k-efficiency row (module docstring) with the last grid k as the reference k."""
    ref = grid[-1]
    target = grpo_curve[ref]
    row: dict[str, Any] = {"reference_k": ref, "grpo_pass_at_ref": target, "method_pass_at_ref": method_curve[ref]}
    if target <= 0.0:  # every curve "reaches" 0 at k = 1: no ratio to report
        return {**row, "status": STATUS_UNDEFINED}
    k_grpo, k_grpo_evaluated = crossing_k({k: grpo_curve[k] for k in grid}, target)  # reaches by construction
    row["k_grpo"] = k_grpo
    if k_grpo_evaluated < ref:
        row["note"] = f"GRPO saturates: its pass@k is flat from k={k_grpo_evaluated}"
    found = crossing_k({k: method_curve[k] for k in grid}, target)
    if found is None:
        return {**row, "status": STATUS_NOT_REACHED}
    k_star, k_eval = found
    return {**row, "k_star": k_star, "k_star_evaluated": k_eval, "efficiency": k_grpo / k_star,
            "status": STATUS_REACHED_FIRST if k_eval == grid[0] else STATUS_REACHED}


def _k_efficiency_rows(table, runs: Sequence[EvalRun] | None) -> list[dict[str, Any]]:
    """Every row of `k_efficiency_by_k.csv`: each point of every method but GRPO (and the base model), against
    GRPO of its task and backend, in the table's order."""
    by_name = {(r.spec.task, r.spec.name): r for r in runs or ()}
    rows = []
    compared = table[table["method"].isin([m for m in METHODS if m != BASELINE])]
    for point in compared[list(POINT_KEYS)].drop_duplicates().itertuples(index=False):
        point_mask = ((table["task"] == point.task) & (table["backend"] == point.backend)
                      & (table["method"] == point.method) & (table["point"] == point.point))
        grpo_mask = ((table["method"] == BASELINE) & (table["task"] == point.task)
                     & (table["backend"] == point.backend))
        params = row_params(table.loc[point_mask].iloc[0], point.method)
        base: dict[str, Any] = {
            **dict.fromkeys(K_EFFICIENCY_COLUMNS, math.nan), **point._asdict(), **params,
            "label": point_label(point.method, params),
            "n_method_seeds": int(table.loc[point_mask, "run"].nunique()),
            "n_grpo_seeds": int(table.loc[grpo_mask, "run"].nunique()),
            "note": "", "bootstrap_replicates": 0, "bootstrap_resampled": "",
        }
        method_curve, grpo_curve = _mean_curve(table, point_mask), _mean_curve(table, grpo_mask)
        grid = sorted(k for k in set(method_curve) & set(grpo_curve) if k <= HEADLINE_K) if grpo_curve else []
        if not grid:
            rows.append({**base, "status": STATUS_NO_GRPO if not grpo_curve else STATUS_NO_COMMON_K})
            continue
        boot, why_not = None, ""
        if runs is not None:
            names = [sorted(set(table.loc[mask, "run"])) for mask in (point_mask, grpo_mask)]
            lacking = [name for group in names for name in group if (point.task, name) not in by_name]
            try:
                if lacking:
                    raise ValueError(f"no loaded evaluation of {', '.join(lacking)}")
                point_runs, grpo_runs = ([by_name[(point.task, name)] for name in group] for group in names)
                _, n, c = _counts_matrix(point_runs + grpo_runs)
                split = len(point_runs)
                boot = bootstrap_k_efficiency(n[:split], c[:split], n[split:], c[split:], grid, reference_ks=grid,
                                              diff_ks=grid, method=point.method)
            except ValueError as err:
                why_not = f"{NO_INTERVAL_NOTE}: {err}"
        for ref in grid:
            row = {**base, **_efficiency_at(method_curve, grpo_curve, [k for k in grid if k <= ref])}
            row["diff_pass_at_ref"] = method_curve[ref] - grpo_curve[ref]
            if 1 in grid:
                row["diff_pass_at_1"] = method_curve[1] - grpo_curve[1]
            row["note"] = "; ".join(p for p in (row["note"], why_not) if p)
            if boot is not None:
                eff = boot["efficiency"][ref]
                row.update(efficiency_lo=eff["lo"], efficiency_hi=eff["hi"], bootstrap_not_reached=eff["not_reached"],
                           bootstrap_replicates=boot["replicates"], bootstrap_resampled=boot["resampled"])
                for at, k in (("1", 1), ("ref", ref)):
                    if k in boot["difference"]:
                        diff = boot["difference"][k]
                        row.update({f"diff_pass_at_{at}_lo": diff["lo"], f"diff_pass_at_{at}_hi": diff["hi"]})
            rows.append(row)
    return rows


def k_efficiency(table, runs: Sequence[EvalRun] | None = None, *, by_reference_k: bool = False):
    """The k-efficiency table: one row per method point vs GRPO (definition in the module docstring).

    With `runs` (the loaded evaluations of the table), the interval columns hold the paired bootstrap of
    their per-problem counts (`bootstrap_k_efficiency`); without, they are empty. `by_reference_k`: one row
    per point and grid k taken as the reference k (`k_efficiency_by_k.csv`) instead.
    """
    import pandas as pd

    columns = k_efficiency_columns(m for m in _methods_in(table) if m != BASELINE)
    by_k = _k_efficiency_frame(pd.DataFrame(_k_efficiency_rows(table, runs), columns=columns))
    return by_k if by_reference_k else k_efficiency_headline(by_k)


def k_efficiency_headline(by_k):
    """The rows of `k_efficiency.csv` from those of `k_efficiency_by_k.csv`: per method point, its largest
    reference k (or its one row without a grid): a point's bootstrap draws do not depend on the reference k."""
    keys = list(POINT_KEYS)
    order = by_k.assign(_ref=by_k["reference_k"].astype("Float64").fillna(-1.0))
    last = order.groupby(keys, dropna=False, sort=False)["_ref"].transform("max")
    return by_k[(order["_ref"] == last).to_numpy()].reset_index(drop=True)


def _k_efficiency_frame(out):
    for column in ("reference_k", "k_star_evaluated", "n_method_seeds", "n_grpo_seeds", "bootstrap_replicates"):
        out[column] = out[column].astype("Int64")
    for column in ("note", "bootstrap_resampled"):
        out[column] = out[column].fillna("").astype(str)
    _param_dtypes(out)
    return out


def read_k_efficiency(path: str | Path):
    """Read `k_efficiency.csv` or `k_efficiency_by_k.csv` back with the dtypes `k_efficiency` gives."""
    out = _read_csv(path, "k-efficiency", K_EFFICIENCY_COLUMNS,
                    ("task", "backend", "method", "point", "label", "status", "note", "bootstrap_resampled"),
                    " (written by an older `repexp aggregate`? rerun it)")
    _none_for_na(out, ("task", "backend", "method", "point", "label", "status"))
    return _k_efficiency_frame(out)
