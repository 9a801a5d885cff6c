"""`repexp aggregate`: every `eval.json` → one tidy pass@k table and the k-efficiency table.

Inputs are `results/eval/<task>/<run>/eval.json` files (the evaluation contract in
docs/architecture.md); `<run>` is a `RunSpec.name` and supplies the config columns.

Graders: every eval.json holds pass@k under both graders (`graders`, docs/evaluation.md). The
table's `pass_at_k` (and k-efficiency, the figures and the MLflow sweep-point metrics built on it)
uses one grader for every run: `--grader`, else the config's `grader` (with `--config`), else the
grader the files were evaluated with (which must then agree). `pass_at_k_repexp` and
`pass_at_k_paper` hold both curves, and the Markdown/HTML views show the seed means under both.

Outputs (each written atomically) in `--out-dir`:

* `pass_at_k.csv` — tidy: one row per (run, k) with the config columns;
* `k_efficiency.csv` — one row per RepExp point (task, backend, sparse_dim, β), see below;
* `k_efficiency_by_k.csv` — the same per RepExp point and reference k (every grid k);
* `pass_at_k.md`, `pass_at_k.html` — the same for people (seed means, per-run values, k-efficiency,
  definitions and the list of missing runs); the HTML is what the Snakemake report embeds.

With `--testtime` (the `testtime.json` files of `repexp testtime`), the tidy table's
`testtime_pass_at_k` column holds pass@k when the verifier takes the run's samples in RepExp order
(its `pass_at_k` is the random order of the same samples), and the per-run tables gain the test-time
verifier efficiency (samples-to-correct, random / RepExp, with its bootstrap interval).

k-efficiency (the paper's headline "RepExp reaches GRPO's pass@256 at pass@80"), per task, backend,
sparse_dim and β, on seed-mean curves:

1. the k grid is the set of k evaluated by every seed of the RepExp point and of GRPO (same task and
   backend); the reference k is the largest grid k ≤ 256 (256 when 256 samples were drawn);
2. target = GRPO's pass@reference_k, averaged over GRPO seeds; the RepExp curve is pass@k averaged over
   the point's seeds, for grid k ≤ reference_k;
3. k*_evaluated = the smallest grid k whose RepExp value is ≥ target; k* interpolates linearly in
   log2 k between that grid point and the one before it (k* = k*_evaluated when that is the first
   grid point, an upper bound: status "reached at the smallest k");
4. k_grpo = the same crossing for GRPO's own mean curve: reference_k, unless GRPO's curve is already
   flat (saturated) below it;
5. efficiency = k_grpo / k* (= reference_k / k*, the paper's ratio, whenever GRPO is not saturated);
   when RepExp's pass@reference_k < target the status is "not reached" and k*, efficiency are empty
   (also when GRPO's pass@reference_k is 0: status "undefined: GRPO solves nothing").

Uncertainty (`bootstrap_k_efficiency`, from eval.json's `per_problem` counts (n, c)): a paired percentile
bootstrap. Each of `BOOTSTRAP_REPLICATES` replicates (generator seeded with `BOOTSTRAP_SEED`) resamples the
test problems with replacement — the same problem indices for RepExp and GRPO — and, for a method with ≥ 2
seeds, its seeds with replacement (each method's own); the unbiased per-problem pass@k is computed once, so
a replicate's seed-mean curve is a weighted sum. Steps 1–5 on each replicate's curves give its efficiency
(0 when RepExp does not reach the target: k* beyond the grid) and its pass@k difference RepExp − GRPO;
`efficiency_lo`/`_hi` and `diff_pass_at_{1,ref}_lo`/`_hi` are their 2.5th and 97.5th percentiles.
`k_efficiency_by_k.csv` holds the same row for every grid k as the reference k (the figure's data).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from repexp import layout
from repexp import metrics as metric_names
from repexp.config import METHODS, TASKS, ConfigError, RunSpec, canonical, parse_run
from repexp.io import atomic_path, read_json
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

EVAL_JSON = layout.EVAL_JSON
HEADLINE_K = 256  # the largest reference k of k-efficiency; the figures' heatmap uses the same k
# ks logged on every sweep point's MLflow parent run (plus the largest evaluated k)
MLFLOW_KS = (1, 16, 256)

GRADER_COLUMNS = tuple(f"pass_at_k_{g}" for g in GRADERS)  # pass@k under each grader (NaN if not evaluated)
TIDY_COLUMNS = (
    "task", "run", "method", "backend", "sparse_dim", "beta", "seed", "k", "pass_at_k", "sem",
    "n_samples", "num_problems", "mean_at_n", "checkpoint_step", "split", "engine", "eval_seed",
    "data_hash", "model_path", "source", "grader", *GRADER_COLUMNS, "testtime_pass_at_k",
)
K_EFFICIENCY_COLUMNS = (
    "task", "backend", "sparse_dim", "beta", "n_repexp_seeds", "n_grpo_seeds", "reference_k",
    "grpo_pass_at_ref", "repexp_pass_at_ref", "k_grpo", "k_star", "k_star_evaluated", "efficiency", "status", "note",
    # the paired bootstrap (module docstring): percentile interval of the efficiency, the fraction of replicates
    # in which RepExp misses the target, and the pass@k difference RepExp − GRPO at k = 1 and at reference_k
    "efficiency_lo", "efficiency_hi", "bootstrap_not_reached",
    "diff_pass_at_1", "diff_pass_at_1_lo", "diff_pass_at_1_hi",
    "diff_pass_at_ref", "diff_pass_at_ref_lo", "diff_pass_at_ref_hi",
    "bootstrap_replicates", "bootstrap_resampled",
)
BOOTSTRAP_REPLICATES = 1000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95
NO_INTERVAL_NOTE = "no bootstrap interval"  # starts a k-efficiency row's note that says why it has none
METHOD_NAMES = {"repexp": "RepExp", "grpo": "GRPO", "base": "Base model"}  # tables, notes and figure legends
STATUS_REACHED = "reached"
STATUS_REACHED_FIRST = "reached at the smallest k"
STATUS_NOT_REACHED = "not reached"
STATUS_NO_GRPO = "no GRPO baseline"
STATUS_UNDEFINED = "undefined: GRPO solves nothing"
STATUS_NO_COMMON_K = "no common k"  # RepExp and GRPO seeds share no evaluated k ≤ 256

K_EFFICIENCY_NOTE = (
    "k-efficiency: per task, backend, sparse_dim and β, on pass@k curves averaged over seeds. "
    "The k grid holds the ks evaluated by every seed of the RepExp point and of GRPO; the reference k "
    f"is the largest grid k ≤ {HEADLINE_K}. Target = GRPO's mean pass@reference_k. "
    "k*_evaluated = the smallest grid k at which RepExp's mean pass@k ≥ target; k* interpolates linearly "
    "in log2 k between that grid point and the previous one (an upper bound when it is the first grid "
    "point). k_grpo = the same crossing on GRPO's own curve (the reference k unless GRPO saturates earlier). "
    "efficiency = k_grpo / k* (the paper's reference_k / k* when GRPO is not saturated). "
    "\"not reached\": RepExp's mean pass@reference_k < target; \"undefined\": the target is 0. "
    f"[lo, hi]: {BOOTSTRAP_LEVEL:.0%} percentile interval of a paired bootstrap ({BOOTSTRAP_REPLICATES} replicates, "
    f"seed {BOOTSTRAP_SEED}) that resamples the test problems (the same ones for both methods) and, per method "
    "with ≥ 2 seeds, the seeds; a replicate in which RepExp misses the target counts as efficiency 0 (its share is "
    "\"missed\"). Δpass@k = RepExp − GRPO (seed means) with the same bootstrap's interval."
)
SEM_NOTE = (
    "pass@k: the unbiased estimator over n samples per problem, averaged over problems. "
    "In seed summaries ± is the standard error of the mean over seeds (ddof 1), shown only with ≥ 2 seeds; "
    "the tidy CSV's `sem` column is the per-run standard error over problems."
)


@dataclasses.dataclass(frozen=True)
class EvalRun:
    """One loaded, validated eval.json."""

    spec: RunSpec
    path: Path
    pass_at_k: dict[int, float]
    pass_at_k_sem: dict[int, float]
    n_samples: int
    num_problems: int
    meta: dict[str, Any]
    grader: str = DEFAULT_GRADER  # the grader of pass_at_k / pass_at_k_sem above
    by_grader: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)  # pass@k per grader
    sem_by_grader: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)
    # eval.json's `per_problem` as (problem_id, n, c) under `grader` (None: not in the file, or another grader)
    per_problem: tuple[tuple[str, int, int], ...] | None = None

    def under(self, grader: str) -> EvalRun:
        """This run with `pass_at_k`/`pass_at_k_sem` under `grader`; ValueError if the file lacks that curve."""
        if grader == self.grader:
            return self
        if grader not in self.by_grader:
            raise ValueError(f"{self.path}: no pass@k under the {grader} grader (evaluated before eval.json "
                             "reported both graders); add it without generating: "
                             f"repexp eval --rescore --out {self.path.parent}")
        return dataclasses.replace(self, grader=grader, pass_at_k=self.by_grader[grader],
                                   pass_at_k_sem=self.sem_by_grader.get(grader, {}),
                                   per_problem=None)  # eval.json's counts are of its own grader only


@dataclasses.dataclass(frozen=True)
class TesttimeRun:
    """One loaded `testtime.json` (repexp testtime)."""

    spec: RunSpec
    path: Path
    pass_at_k_repexp: dict[int, float]
    efficiency: dict[int, float | None]  # reference k -> k / k_RepExp
    stc: dict[str, Any]  # samples_to_correct: repexp, random, ratio, ratio_ci95, num_solved
    data_hash: str | None


TESTTIME_NOTE = (
    "Test-time RepExp: each run's stored samples are handed to the verifier in RepExp order (greedy elliptical "
    "bonus w.r.t. the samples already taken, features of the frozen initial policy). samples-to-correct = mean "
    "position of the first correct sample over solved problems (random: (n+1)/(c+1)); ratio = random / RepExp "
    "(> 1: fewer verifier calls), 95% bootstrap interval over problems. eff@k = k / (the smallest k' at which "
    "RepExp-order pass@k' reaches random-order pass@k)."
)


# --------------------------------------------------------------------------- loading


def find_eval_files(eval_dir: str | Path) -> list[Path]:
    """Every `<task>/<run>/eval.json` under `eval_dir`, sorted."""
    eval_dir = Path(eval_dir)
    if not eval_dir.is_dir():
        raise FileNotFoundError(f"{eval_dir}: eval directory not found")
    return sorted(p for p in eval_dir.glob(f"*/*/{EVAL_JSON}") if p.is_file())


def _per_k(path: Path, data: dict, key: str, *, required: bool) -> dict[int, float]:
    raw = data.get(key)
    if raw is None and not required:
        return {}
    if not isinstance(raw, dict) or (required and not raw):
        raise ValueError(f"{path}: key {key!r} must be a non-empty mapping k -> value, got {raw!r}")
    out: dict[int, float] = {}
    for k_text, value in raw.items():
        try:
            k = int(k_text)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: {key} has a non-integer k {k_text!r}") from None
        if k < 1:
            raise ValueError(f"{path}: {key} has k = {k} < 1")
        if value is None:
            out[k] = math.nan  # e.g. the SEM of a one-problem evaluation
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: {key}[{k_text!r}] is not a number: {value!r}")
        out[k] = float(value)
    return dict(sorted(out.items()))


def load_eval(path: str | Path) -> EvalRun:
    """Read and validate one `<task>/<run>/eval.json`; errors name the file and the key."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for key in ("pass_at_k", "num_problems", "n_samples"):
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    dir_task = path.parent.parent.name
    task = data.get("task") or dir_task
    if task != dir_task:
        raise ValueError(f"{path}: task {task!r} in the file differs from the directory {dir_task!r}")
    try:
        spec = parse_run(task, path.parent.name)
    except ConfigError as err:
        raise ValueError(f"{path}: expected results/eval/<task>/<run>/eval.json with a valid run name "
                         f"({err})") from None
    pass_at_k = _per_k(path, data, "pass_at_k", required=True)
    bad = {k: v for k, v in pass_at_k.items() if not (0.0 <= v <= 1.0)}
    if bad:
        raise ValueError(f"{path}: pass_at_k values must lie in [0, 1], got {bad}")
    n_samples = data["n_samples"]
    if isinstance(n_samples, list):  # problems with different n: the ks are bounded by the smallest
        if not n_samples:
            raise ValueError(f"{path}: n_samples is an empty list")
        n_samples = min(n_samples)
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"{path}: n_samples must be a positive integer, got {data['n_samples']!r}")
    if max(pass_at_k) > n_samples:
        raise ValueError(f"{path}: pass_at_k has k = {max(pass_at_k)} > n_samples = {n_samples}")
    num_problems = data["num_problems"]
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 1:
        raise ValueError(f"{path}: num_problems must be a positive integer, got {num_problems!r}")
    meta = {key: data.get(key) for key in
            ("mean_at_n", "checkpoint_step", "split", "engine", "seed", "data_hash", "model_path")}
    grader = data.get("grader") or DEFAULT_GRADER  # files from before graders existed: repexp
    if grader not in GRADERS:
        raise ValueError(f"{path}: grader {grader!r} is not one of {', '.join(GRADERS)}")
    pass_at_k_sem = _per_k(path, data, "pass_at_k_sem", required=False)
    by_grader, sem_by_grader = {grader: pass_at_k}, {grader: pass_at_k_sem}
    graders = data.get("graders") or {}
    if not isinstance(graders, dict) or set(graders) - set(GRADERS):
        raise ValueError(f"{path}: key 'graders' must map {' and '.join(GRADERS)} to their pass@k, got {graders!r}")
    for name, entry in graders.items():
        if name == grader:
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: graders.{name} must be a mapping, got {entry!r}")
        curve = _per_k(path, entry, "pass_at_k", required=True)
        if set(curve) != set(pass_at_k) or not all(0.0 <= v <= 1.0 for v in curve.values()):
            raise ValueError(f"{path}: graders.{name}.pass_at_k must give a value in [0, 1] for each k of pass_at_k")
        by_grader[name], sem_by_grader[name] = curve, _per_k(path, entry, "pass_at_k_sem", required=False)
    return EvalRun(spec=spec, path=path, pass_at_k=pass_at_k, pass_at_k_sem=pass_at_k_sem,
                   n_samples=n_samples, num_problems=num_problems, meta=meta, grader=grader, by_grader=by_grader,
                   sem_by_grader=sem_by_grader, per_problem=_per_problem(path, data.get("per_problem")))


def _per_problem(path: Path, raw: Any) -> tuple[tuple[str, int, int], ...] | None:
    """eval.json's `per_problem` [{problem_id, n, c}] as (problem_id, n, c) tuples; None when absent or empty."""
    if not raw:
        return None
    if not isinstance(raw, list):
        raise ValueError(f"{path}: per_problem must be a list of {{problem_id, n, c}}, got {type(raw).__name__}")
    out = []
    for i, entry in enumerate(raw):
        n, c = (entry.get("n"), entry.get("c")) if isinstance(entry, dict) else (None, None)
        if (not isinstance(entry, dict) or "problem_id" not in entry or any(
                isinstance(v, bool) or not isinstance(v, int) for v in (n, c)) or not 0 <= c <= n or n < 1):
            raise ValueError(f"{path}: per_problem[{i}] must be {{problem_id, n ≥ 1, 0 ≤ c ≤ n}}, got {entry!r}")
        out.append((str(entry["problem_id"]), n, c))
    if len({pid for pid, _, _ in out}) != len(out):
        raise ValueError(f"{path}: per_problem repeats a problem_id")
    return tuple(out)


def load_testtime(path: str | Path) -> TesttimeRun:
    """Read one `<task>/<run>/testtime.json`; errors name the file and the key."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for key in ("k", "pass_at_k_repexp", "efficiency", "samples_to_correct"):
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    try:
        spec = parse_run(path.parent.parent.name, path.parent.name)
    except ConfigError as err:
        raise ValueError(f"{path}: expected results/testtime/<task>/<run>/testtime.json ({err})") from None
    if len(data["k"]) != len(data["pass_at_k_repexp"]):
        raise ValueError(f"{path}: k and pass_at_k_repexp differ in length")
    eff = data["efficiency"]
    return TesttimeRun(spec=spec, path=path,
                       pass_at_k_repexp={int(k): float(v) for k, v in zip(data["k"], data["pass_at_k_repexp"])},
                       efficiency=dict(zip((int(k) for k in eff["reference_k"]), eff["ratio"])),
                       stc=data["samples_to_correct"], data_hash=data.get("data_hash"))


def attach_testtime(runs: Sequence[EvalRun], paths: Iterable[str | Path]) -> dict[tuple[str, str], TesttimeRun]:
    """{(task, run): TesttimeRun} for `paths`, each checked against its evaluation (same run, same problems)."""
    by_run = {(r.spec.task, r.spec.name): r for r in runs}
    out: dict[tuple[str, str], TesttimeRun] = {}
    for path in paths:
        tt = load_testtime(path)
        key = (tt.spec.task, tt.spec.name)
        run = by_run.get(key)
        if run is None:
            raise ValueError(f"{tt.path}: no evaluation of {tt.spec.path} among the inputs")
        if key in out:
            raise ValueError(f"{tt.path}: duplicate test-time result for {tt.spec.path} (also {out[key].path})")
        if tt.data_hash and run.meta["data_hash"] and tt.data_hash != run.meta["data_hash"]:
            raise ValueError(f"{tt.path}: data_hash differs from {run.path}; it orders another evaluation's samples")
        out[key] = tt
    return out


def load_evals(paths: Iterable[str | Path], grader: str | None = None) -> list[EvalRun]:
    """Load every file; refuse duplicates and runs of one task evaluated on different problem sets.

    `grader`: the grader of every run's `pass_at_k` (None: the files' own, which must then agree).
    """
    runs = [load_eval(p) for p in paths]
    if grader is None and len({r.grader for r in runs}) > 1:
        mixed = {r.grader: r.path for r in runs}
        raise ValueError(f"runs were graded differently ({', '.join(f'{g} in {p}' for g, p in mixed.items())}); "
                         "choose one grader for the table: --grader or --config")
    if grader is not None:
        runs = [r.under(grader) for r in runs]
    seen: dict[tuple[str, str], Path] = {}
    for run in runs:
        key = (run.spec.task, run.spec.name)
        if key in seen:
            raise ValueError(f"{run.path}: duplicate evaluation of {run.spec.path} (also {seen[key]})")
        seen[key] = run.path
    for task in {r.spec.task for r in runs}:
        for field in ("data_hash", "split"):
            values = {r.meta[field]: r.path for r in runs if r.spec.task == task and r.meta[field] is not None}
            if len(values) > 1:
                (a, pa), (b, pb) = list(values.items())[:2]
                raise ValueError(
                    f"{pb}: {field} {b!r} differs from {a!r} in {pa} (task {task}); "
                    "pass@k on different problem sets is not comparable"
                )
    return sorted(runs, key=lambda r: run_sort_key(r.spec))


def run_sort_key(spec: RunSpec) -> tuple:
    """Tasks in TASKS order, then RepExp points, GRPO, base; then backend, sparse_dim, β, seed."""
    return (TASKS.index(spec.task), METHODS.index(spec.method), spec.backend or "",
            spec.sparse_dim or 0, spec.beta, -1 if spec.seed is None else spec.seed)


# --------------------------------------------------------------------------- tables


def tidy_table(runs: Sequence[EvalRun], testtime: dict[tuple[str, str], TesttimeRun] | None = None):
    """One row per (run, k), columns `TIDY_COLUMNS` (`testtime_pass_at_k` empty without a test-time result)."""
    import pandas as pd

    rows = []
    for run in runs:
        s = run.spec
        tt = (testtime or {}).get((s.task, s.name))
        for k, value in run.pass_at_k.items():
            rows.append({
                "task": s.task, "run": s.name, "method": s.method, "backend": s.backend,
                "sparse_dim": s.sparse_dim, "beta": s.beta, "seed": s.seed, "k": k,
                "pass_at_k": value, "sem": run.pass_at_k_sem.get(k, math.nan),
                "n_samples": run.n_samples, "num_problems": run.num_problems,
                "mean_at_n": run.meta["mean_at_n"], "checkpoint_step": run.meta["checkpoint_step"],
                "split": run.meta["split"], "engine": run.meta["engine"], "eval_seed": run.meta["seed"],
                "data_hash": run.meta["data_hash"], "model_path": run.meta["model_path"],
                "source": str(run.path), "grader": run.grader,
                **{f"pass_at_k_{g}": run.by_grader.get(g, {}).get(k, math.nan) for g in GRADERS},
                "testtime_pass_at_k": tt.pass_at_k_repexp.get(k, math.nan) if tt else math.nan,
            })
    table = pd.DataFrame(rows, columns=list(TIDY_COLUMNS))
    for column in ("sparse_dim", "seed", "checkpoint_step", "eval_seed"):
        table[column] = table[column].astype("Int64")  # nullable: base has no seed, GRPO no sparse_dim
    return table


def read_table(path: str | Path):
    """Read `pass_at_k.csv` back with the dtypes `tidy_table` gives."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: pass@k table not found (run `repexp aggregate` first)")
    table = pd.read_csv(path, dtype={"backend": "string", "run": "string", "task": "string",
                                     "method": "string", "split": "string", "engine": "string",
                                     "data_hash": "string", "model_path": "string", "source": "string",
                                     "grader": "string"})
    missing = [c for c in TIDY_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    for column in ("sparse_dim", "seed", "checkpoint_step", "eval_seed"):
        table[column] = table[column].astype("Int64")
    for column in ("backend", "task", "run", "method"):
        table[column] = table[column].astype(object).where(table[column].notna(), None)
    return table


POINT_COLUMNS = ("task", "method", "backend", "sparse_dim", "beta")


def seed_summary(table, value: str = "pass_at_k"):
    """Mean over seeds per (task, method, backend, sparse_dim, β, k): mean, sem_seeds, n_seeds, seeds.

    `sem_seeds` is the standard error over seeds (ddof 1), NaN with one seed. `value`: the column
    averaged (`pass_at_k`, or one grader's `pass_at_k_<grader>`).
    """
    import pandas as pd

    rows = []
    for key, group in table.groupby(list(POINT_COLUMNS) + ["k"], dropna=False, sort=False):
        values = group[value].to_numpy(dtype=float)
        n = len(values)
        sem = float(values.std(ddof=1) / math.sqrt(n)) if n >= 2 else math.nan
        seeds = sorted(int(s) for s in group["seed"].dropna())
        rows.append({**dict(zip(list(POINT_COLUMNS) + ["k"], key)), "mean": float(values.mean()),
                     "sem_seeds": sem, "n_seeds": n, "seeds": seeds})
    summary = pd.DataFrame(rows, columns=list(POINT_COLUMNS) + ["k", "mean", "sem_seeds", "n_seeds", "seeds"])
    return summary


def _mean_curve(table, mask) -> dict[int, float] | None:
    """Seed-mean pass@k over the ks every seed evaluated (None when there are no rows)."""
    rows = table[mask]
    if rows.empty:
        return None
    per_run = {run: dict(zip(g["k"].astype(int), g["pass_at_k"].astype(float))) for run, g in rows.groupby("run")}
    common = set.intersection(*(set(c) for c in per_run.values()))
    return {k: sum(c[k] for c in per_run.values()) / len(per_run) for k in sorted(common)}


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


def bootstrap_k_efficiency(repexp_n, repexp_c, grpo_n, grpo_c, ks: Sequence[int], *,
                           reference_ks: Sequence[int] | None = None, diff_ks: Sequence[int] = (),
                           replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED,
                           level: float = BOOTSTRAP_LEVEL) -> dict[str, Any]:
    """RepExp-vs-GRPO k-efficiency and pass@k differences with paired percentile-bootstrap intervals.

    `repexp_n`, `repexp_c`: [seeds, problems] sample and correct counts of RepExp's seeds (a 1-D array is
    one seed); `grpo_n`, `grpo_c`: GRPO's, over the same problems in the same order (the columns are
    paired). `ks`: the increasing k grid (no k above a problem's n); the efficiency is computed at every
    k of `reference_ks` (default: the largest) on the grid up to it, as in the module docstring; the
    difference RepExp − GRPO of the seed-mean pass@k at every k of `diff_ks`.

    Every replicate draws the problems with replacement (one draw for both methods), then, for a method
    with ≥ 2 seeds, its seeds with replacement (RepExp's, then GRPO's), from `numpy.random.default_rng(seed)`.
    Per-problem pass@k is computed once; a replicate's curve is a weighted mean of it. A replicate in which
    RepExp misses the target has efficiency 0 (k* beyond the grid); one whose target is 0 has none.

    Returns {"efficiency": {ref: {"estimate", "k_star", "lo", "hi", "not_reached", "undefined"}},
    "difference": {k: {"estimate", "lo", "hi"}}, "replicates", "level", "seed", "num_problems",
    "seeds": (RepExp, GRPO), "resampled"}. `estimate` is the full-data value (NaN when not reached or
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
    values = {"repexp": _per_seed_pass(repexp_n, repexp_c, ks), "grpo": _per_seed_pass(grpo_n, grpo_c, ks)}
    num_problems = values["repexp"].shape[1]
    if values["grpo"].shape[1] != num_problems:
        raise ValueError(f"paired bootstrap: RepExp has {num_problems} problems, GRPO {values['grpo'].shape[1]}")

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
            resampled.append(f"{METHOD_NAMES[name]} seeds")
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
                              "seeds": (values["repexp"].shape[0], values["grpo"].shape[0]),
                              "resampled": ", ".join(resampled)}
    for ref in reference_ks:
        j = ks.index(ref)
        draws, _ = efficiency(boot["repexp"], boot["grpo"], j)
        point, k_star = efficiency(full["repexp"], full["grpo"], j)
        lo, hi = _interval(draws, level)
        defined = np.isfinite(draws)
        result["efficiency"][ref] = {
            "estimate": float(point[0]) if point[0] > 0 else math.nan, "k_star": float(k_star[0]), "lo": lo,
            "hi": hi, "not_reached": float(np.mean(draws[defined] == 0)) if defined.any() else math.nan,
            "undefined": float(np.mean(~defined)),
        }
    for k in diff_ks:
        j = ks.index(k)
        lo, hi = _interval(boot["repexp"][:, j] - boot["grpo"][:, j], level)
        result["difference"][k] = {"estimate": float(full["repexp"][0, j] - full["grpo"][0, j]), "lo": lo, "hi": hi}
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


def _efficiency_at(repexp_curve: dict[int, float], grpo_curve: dict[int, float], grid: list[int]) -> dict[str, Any]:
    """Steps 2–5 of the module docstring with the last grid k as the reference k."""
    ref = grid[-1]
    target = grpo_curve[ref]
    row: dict[str, Any] = {"reference_k": ref, "grpo_pass_at_ref": target, "repexp_pass_at_ref": repexp_curve[ref]}
    if target <= 0.0:  # every curve "reaches" 0 at k = 1: no ratio to report
        return {**row, "status": STATUS_UNDEFINED}
    k_grpo, k_grpo_evaluated = crossing_k({k: grpo_curve[k] for k in grid}, target)  # reaches by construction
    row["k_grpo"] = k_grpo
    if k_grpo_evaluated < ref:
        row["note"] = f"GRPO saturates: its pass@k is flat from k={k_grpo_evaluated}"
    found = crossing_k({k: repexp_curve[k] for k in grid}, target)
    if found is None:
        return {**row, "status": STATUS_NOT_REACHED}
    k_star, k_eval = found
    return {**row, "k_star": k_star, "k_star_evaluated": k_eval, "efficiency": k_grpo / k_star,
            "status": STATUS_REACHED_FIRST if k_eval == grid[0] else STATUS_REACHED}


def _note(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _k_efficiency_rows(table, runs: Sequence[EvalRun] | None) -> list[dict[str, Any]]:
    """Every row of `k_efficiency_by_k.csv`, each with `headline` True where reference_k is the point's largest
    grid k (the row of `k_efficiency.csv`; also every row without a grid)."""
    by_name = {(r.spec.task, r.spec.name): r for r in runs or ()}
    rows = []
    repexp = table[table["method"] == "repexp"]
    points = repexp[["task", "backend", "sparse_dim", "beta"]].drop_duplicates()
    for point in points.itertuples(index=False):
        point_mask = ((table["method"] == "repexp") & (table["task"] == point.task)
                      & (table["backend"] == point.backend) & (table["sparse_dim"] == point.sparse_dim)
                      & (table["beta"] == point.beta))
        grpo_mask = (table["method"] == "grpo") & (table["task"] == point.task) & (table["backend"] == point.backend)
        base: dict[str, Any] = {
            "task": point.task, "backend": point.backend, "sparse_dim": int(point.sparse_dim),
            "beta": float(point.beta),
            "n_repexp_seeds": int(table.loc[point_mask, "run"].nunique()),
            "n_grpo_seeds": int(table.loc[grpo_mask, "run"].nunique()),
            "reference_k": None, "grpo_pass_at_ref": math.nan, "repexp_pass_at_ref": math.nan, "k_grpo": math.nan,
            "k_star": math.nan, "k_star_evaluated": None, "efficiency": math.nan, "note": "",
            "efficiency_lo": math.nan, "efficiency_hi": math.nan, "bootstrap_not_reached": math.nan,
            **{f"diff_pass_at_{at}{end}": math.nan for at in ("1", "ref") for end in ("", "_lo", "_hi")},
            "bootstrap_replicates": 0, "bootstrap_resampled": "", "headline": True,
        }
        repexp_curve = _mean_curve(table, point_mask)
        grpo_curve = _mean_curve(table, grpo_mask)
        grid = sorted(set(repexp_curve) & set(grpo_curve)) if grpo_curve else []
        grid = [k for k in grid if k <= HEADLINE_K]
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
                                              diff_ks=grid)
            except ValueError as err:
                why_not = f"{NO_INTERVAL_NOTE}: {err}"
        for ref in grid:
            row = {**base, **_efficiency_at(repexp_curve, grpo_curve, [k for k in grid if k <= ref]),
                   "headline": ref == grid[-1]}
            row["diff_pass_at_ref"] = repexp_curve[ref] - grpo_curve[ref]
            if 1 in grid:
                row["diff_pass_at_1"] = repexp_curve[1] - grpo_curve[1]
            row["note"] = _note(row["note"], why_not)
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
    """The k-efficiency table (one row per RepExp point; definition in the module docstring).

    With `runs` (the loaded evaluations of the table), the interval columns hold the paired bootstrap of
    their per-problem counts (`bootstrap_k_efficiency`); without, they are empty. `by_reference_k`: one row
    per RepExp point and grid k taken as the reference k (`k_efficiency_by_k.csv`) instead.
    """
    import pandas as pd

    rows = [r for r in _k_efficiency_rows(table, runs) if by_reference_k or r["headline"]]
    return _k_efficiency_frame(pd.DataFrame(rows, columns=list(K_EFFICIENCY_COLUMNS)))


def k_efficiency_headline(by_k):
    """The rows of `k_efficiency.csv` from those of `k_efficiency_by_k.csv`: per RepExp point, its largest
    reference k (or its one row without a grid). Equal to `k_efficiency(table, runs)`: a point's bootstrap
    draws do not depend on the reference k."""
    keys = ["task", "backend", "sparse_dim", "beta"]
    order = by_k.assign(_ref=by_k["reference_k"].astype("Float64").fillna(-1.0))
    last = order.groupby(keys, dropna=False, sort=False)["_ref"].transform("max")
    return by_k[(order["_ref"] == last).to_numpy()].reset_index(drop=True)


def _k_efficiency_frame(out):
    for column in ("reference_k", "k_star_evaluated", "sparse_dim", "bootstrap_replicates"):
        out[column] = out[column].astype("Int64")
    for column in ("note", "bootstrap_resampled"):
        out[column] = out[column].fillna("").astype(str)
    return out


def read_k_efficiency(path: str | Path):
    """Read `k_efficiency.csv` or `k_efficiency_by_k.csv` back with the dtypes `k_efficiency` gives."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: k-efficiency table not found (run `repexp aggregate` first)")
    out = pd.read_csv(path, dtype={"task": "string", "backend": "string", "status": "string", "note": "string",
                                   "bootstrap_resampled": "string"})
    missing = [c for c in K_EFFICIENCY_COLUMNS if c not in out.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (written by an older `repexp aggregate`? rerun it)")
    for column in ("task", "backend", "status"):
        out[column] = out[column].astype(object).where(out[column].notna(), None)
    return _k_efficiency_frame(out)


# --------------------------------------------------------------------------- expected runs


def expected_runs(config_path: str | Path) -> list[RunSpec]:
    """The sweep's runs from a pipeline config."""
    from repexp.config import load, sweep_runs

    return sweep_runs(load(config_path))


def missing_runs(expected: Sequence[RunSpec], runs: Sequence[EvalRun]) -> list[str]:
    """`<task>/<run>` of every expected run without an evaluation."""
    found = {(r.spec.task, r.spec.name) for r in runs}
    return [s.path for s in expected if (s.task, s.name) not in found]


# --------------------------------------------------------------------------- rendering


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        import pandas as pd

        if pd.isna(value):
            return "–"
    except (TypeError, ValueError):
        pass
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def summary_wide(table, value: str = "pass_at_k"):
    """Seed summary, one row per point, columns pass@k as 'mean ± sem' strings (for Markdown/HTML)."""
    import pandas as pd

    summary = seed_summary(table, value)
    ks = sorted(summary["k"].unique())
    rows = []
    for key, group in summary.groupby(list(POINT_COLUMNS), dropna=False, sort=False):
        point = dict(zip(POINT_COLUMNS, key))
        seeds = sorted({s for ss in group["seeds"] for s in ss})
        is_repexp = point["method"] == "repexp"
        row = {"task": point["task"], "method": METHOD_NAMES[point["method"]], "backend": point["backend"] or "–",
               "sparse_dim": int(point["sparse_dim"]) if is_repexp else "–",
               "β": canonical(float(point["beta"])) if is_repexp else "–",
               "seeds": ", ".join(map(str, seeds)) or "–", "#seeds": int(group["n_seeds"].max())}
        by_k = {int(r.k): r for r in group.itertuples(index=False)}
        for k in ks:
            r = by_k.get(int(k))
            if r is None or math.isnan(r.mean):
                row[f"pass@{k}"] = "–"
            elif r.n_seeds >= 2:
                row[f"pass@{k}"] = f"{r.mean:.3f} ± {r.sem_seeds:.3f}"
            else:
                row[f"pass@{k}"] = f"{r.mean:.3f}"
        rows.append(row)
    return pd.DataFrame(rows)


def _stc_text(tt: TesttimeRun | None) -> str:
    if tt is None:
        return "–"
    ratio, ci = tt.stc.get("ratio"), tt.stc.get("ratio_ci95")
    if ratio is None:
        return "undefined"
    return f"{ratio:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def per_run_wide(table, testtime: dict[tuple[str, str], TesttimeRun] | None = None):
    import pandas as pd

    ks = sorted(table["k"].unique())
    rows = []
    for run_key, group in table.groupby(["task", "run"], sort=False):
        first = group.iloc[0]
        row = {"task": run_key[0], "run": run_key[1], "checkpoint": _fmt(first["checkpoint_step"]),
               "n": int(first["n_samples"]), "problems": int(first["num_problems"])}
        if testtime:
            row["test-time efficiency"] = _stc_text(testtime.get(tuple(run_key)))
        by_k = dict(zip(group["k"].astype(int), group["pass_at_k"]))
        for k in ks:
            row[f"pass@{k}"] = _fmt(by_k.get(int(k)))
        rows.append(row)
    return pd.DataFrame(rows)


def k_efficiency_display(keff):
    import pandas as pd

    rows = []
    for r in keff.itertuples(index=False):
        rows.append({
            "task": r.task, "backend": r.backend, "sparse_dim": r.sparse_dim, "β": canonical(float(r.beta)),
            "seeds (RepExp/GRPO)": f"{r.n_repexp_seeds}/{r.n_grpo_seeds}",
            "reference k": _fmt(r.reference_k), "GRPO pass@ref": _fmt(r.grpo_pass_at_ref),
            "RepExp pass@ref": _fmt(r.repexp_pass_at_ref), "k GRPO": _fmt(r.k_grpo, 1), "k*": _fmt(r.k_star, 1),
            "k* (evaluated)": _fmt(r.k_star_evaluated),
            f"efficiency [{BOOTSTRAP_LEVEL:.0%} CI]": _efficiency_text(r),
            f"Δpass@1 [{BOOTSTRAP_LEVEL:.0%} CI]": _interval_text(r.diff_pass_at_1, r.diff_pass_at_1_lo,
                                                                  r.diff_pass_at_1_hi),
            f"Δpass@ref [{BOOTSTRAP_LEVEL:.0%} CI]": _interval_text(r.diff_pass_at_ref, r.diff_pass_at_ref_lo,
                                                                    r.diff_pass_at_ref_hi),
            "status": r.status + (f" ({r.note})" if r.note else ""),
        })
    return pd.DataFrame(rows)


def _interval_text(value, lo, hi, digits: int = 3, signed: bool = True) -> str:
    """'+0.050 [+0.010, +0.090]'; the interval is left out when there is none."""
    def number(x) -> str:
        return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"

    finite = [x is not None and not _isna(x) for x in (value, lo, hi)]
    if not finite[0]:
        return "–"
    return number(value) + (f" [{number(lo)}, {number(hi)}]" if all(finite[1:]) else "")


def _efficiency_text(r) -> str:
    """'2.26 [1.80, 2.90]', with the share of bootstrap replicates in which RepExp misses the target."""
    has_interval = not (_isna(r.efficiency_lo) or _isna(r.efficiency_hi))
    text = "–" if _isna(r.efficiency) else f"{r.efficiency:.2f}"
    if has_interval:
        text += f" [{r.efficiency_lo:.2f}, {r.efficiency_hi:.2f}]"
        if r.bootstrap_not_reached and r.bootstrap_not_reached > 0:
            text += f" (missed {r.bootstrap_not_reached:.1%})"
    return text


def _isna(value) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


def testtime_display(testtime: dict[tuple[str, str], TesttimeRun]):
    """Per run: samples-to-correct of both orders, their ratio with its interval, eff@k at the reference ks."""
    import pandas as pd

    rows = []
    for (task, run), tt in sorted(testtime.items(), key=lambda kv: run_sort_key(kv[1].spec)):
        row = {"task": task, "run": run, "solved": tt.stc.get("num_solved"),
               "samples-to-correct random": _fmt(tt.stc.get("random"), 2),
               "samples-to-correct RepExp": _fmt(tt.stc.get("repexp"), 2), "ratio [95% CI]": _stc_text(tt)}
        for k, ratio in tt.efficiency.items():
            row[f"eff@{k}"] = "–" if ratio is None else f"{ratio:.2f}×"
        rows.append(row)
    return pd.DataFrame(rows)


def markdown_table(df) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""
    if df.empty:
        return "_(none)_\n"
    header = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines) + "\n"


def _graders(table) -> tuple[str, str]:
    """(the grader of the table's pass_at_k, the other one)."""
    grader = str(table["grader"].iloc[0]) if len(table) else DEFAULT_GRADER
    return grader, next(g for g in GRADERS if g != grader)


GRADER_NOTE = (
    "Graders: repexp = this project's verifier; paper = the recipe's scorers (verl's strict GSM8K `####`, "
    "Hendrycks string equivalence for MATH, Math-Verify for AIME), comparable to the paper's numbers. "
    "Both are computed from the same stored samples (docs/data.md)."
)


def render_markdown(table, keff, *, missing: Sequence[str], ignored: Sequence[str],
                    testtime: dict[tuple[str, str], TesttimeRun] | None = None) -> str:
    grader, other = _graders(table)
    parts = ["# pass@k", "", f"{table['run'].nunique()} evaluated runs over tasks "
             f"{', '.join(dict.fromkeys(table['task']))}, graded by **{grader}**. {SEM_NOTE}", "", GRADER_NOTE, ""]
    parts += _missing_lines(missing, ignored, bullet="- ")
    parts += [f"## Mean over seeds ({grader} grader)", "", markdown_table(summary_wide(table)),
              f"## Mean over seeds ({other} grader, same samples)", "",
              markdown_table(summary_wide(table, f"pass_at_k_{other}")),
              "## k-efficiency (RepExp vs GRPO)", "", markdown_table(k_efficiency_display(keff)),
              f"_{K_EFFICIENCY_NOTE}_", ""]
    if testtime:
        parts += ["## Test-time RepExp (verifier efficiency)", "", markdown_table(testtime_display(testtime)),
                  f"_{TESTTIME_NOTE}_", ""]
    parts += ["## Per run", "", markdown_table(per_run_wide(table, testtime))]
    return "\n".join(parts)


def _missing_lines(missing: Sequence[str], ignored: Sequence[str], bullet: str) -> list[str]:
    lines = []
    if missing:
        lines += [f"**Missing runs** (expected by the config, no eval.json): {len(missing)}", ""]
        lines += [f"{bullet}{m}" for m in missing] + [""]
    if ignored:
        lines += [f"Ignored (not part of the config): {', '.join(ignored)}", ""]
    return lines


_HTML_STYLE = """
body { font-family: sans-serif; font-size: 13px; margin: 1em; }
table { border-collapse: collapse; margin-bottom: 1.2em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; }
td:first-child, td:nth-child(2) { text-align: left; }
p.note { max-width: 60em; color: #444; }
.missing { color: #a00; }
"""


def render_html(table, keff, *, missing: Sequence[str], ignored: Sequence[str],
                testtime: dict[tuple[str, str], TesttimeRun] | None = None) -> str:
    import html

    def frame(df) -> str:
        return df.to_html(index=False, border=0, na_rep="–", escape=True) if not df.empty else "<p>(none)</p>"

    grader, other = _graders(table)
    missing_html = ""
    if missing:
        items = "".join(f"<li>{html.escape(m)}</li>" for m in missing)
        missing_html = ('<p class="missing"><b>Missing runs</b> (expected by the config, no eval.json):</p>'
                        f'<ul class="missing">{items}</ul>')
    if ignored:
        missing_html += f"<p>Ignored (not part of the config): {html.escape(', '.join(ignored))}</p>"
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>pass@k</title>"
        f"<style>{_HTML_STYLE}</style></head><body>"
        f"<h2>pass@k: mean over seeds ({grader} grader)</h2><p class='note'>{html.escape(SEM_NOTE)}</p>"
        f"<p class='note'>{html.escape(GRADER_NOTE)}</p>{missing_html}"
        f"{frame(summary_wide(table))}"
        f"<h2>pass@k: mean over seeds ({other} grader, same samples)</h2>"
        f"{frame(summary_wide(table, f'pass_at_k_{other}'))}"
        f"<h2>k-efficiency (RepExp vs GRPO)</h2>{frame(k_efficiency_display(keff))}"
        f"<p class='note'>{html.escape(K_EFFICIENCY_NOTE)}</p>"
        + (f"<h2>Test-time RepExp (verifier efficiency)</h2>{frame(testtime_display(testtime))}"
           f"<p class='note'>{html.escape(TESTTIME_NOTE)}</p>" if testtime else "")
        + f"<h2>Per run</h2>{frame(per_run_wide(table, testtime))}</body></html>\n"
    )


# --------------------------------------------------------------------------- MLflow


def sweep_point_metrics(run: EvalRun) -> dict[str, float]:
    """`test/pass_at_<k>` for k in MLFLOW_KS ∩ evaluated, plus the largest evaluated k (the eval node runs
    carry every k; '@' is not allowed in MLflow names)."""
    ks = [k for k in MLFLOW_KS if k in run.pass_at_k] + [max(run.pass_at_k)]
    return {metric_names.pass_at_k(metric_names.TEST, k): run.pass_at_k[k] for k in dict.fromkeys(ks)}


@dataclasses.dataclass(frozen=True)
class MlflowTarget:
    tracking_uri: str | None
    experiment: str
    artifact_location: str | None = None
    results_id: str | None = None  # parents of this results directory only (repexp.tracking.names.results_id)


def mlflow_target(tracking_uri: str | None, experiment: str | None,
                  config: str | Path | None = None) -> MlflowTarget | None:
    """Where to log, or None. Inside `repexp mlflow node ... -- repexp aggregate|figures ...` the node run's store
    and experiment are the defaults; `--experiment`/`--tracking-uri` override them. The tracking URI falls
    back to the config's (repexp.tracking's resolution: `tracking.tracking_uri`, $MLFLOW_TRACKING_URI, SQLite
    under results/), then $MLFLOW_TRACKING_URI. REPEXP_TRACKING=off disables logging."""
    from repexp import tracking

    if not tracking.tracking_enabled():
        return None
    node = tracking.current_node()
    node = node if node is not None and node.enabled else None
    if experiment is None and node is None:
        return None
    results_id = node.scope.results_id if node is not None else None
    if tracking_uri is None and node is not None:
        tracking_uri = node.tracking_uri
    if config is not None and (tracking_uri is None or results_id is None):
        from repexp.config import load

        cfg = load(config)
        tracking_uri = tracking_uri or tracking.resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
        results_id = results_id or tracking.results_id(cfg.results_dir)
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if experiment is None:
        return MlflowTarget(tracking_uri, node.record.experiment, node.record.artifact_location, results_id)
    same = node is not None and node.record.experiment == experiment and node.tracking_uri == tracking_uri
    return MlflowTarget(tracking_uri, experiment, node.record.artifact_location if same else None, results_id)


def _node_for(target: MlflowTarget):
    """The enclosing node run when `target` is its own store and experiment (it logs, or keeps for sync)."""
    from repexp import tracking

    node = tracking.current_node()
    if node is None or not node.enabled:
        return None
    same = node.tracking_uri == target.tracking_uri and node.record.experiment == target.experiment
    return node if same else None


def mlflow_store(target: MlflowTarget):
    """(store, experiment id) through repexp.tracking's MLflow adapter (its parent-run rules and SQLite lock)."""
    import mlflow

    from repexp import tracking

    store = tracking.Store(target.tracking_uri or mlflow.get_tracking_uri())
    with store.lock():
        experiment_id = store.experiment_id(target.experiment, target.artifact_location)
    return store, experiment_id


def log_sweep_point_metrics(runs: Sequence[EvalRun], target: MlflowTarget,
                            testtime: dict[tuple[str, str], TesttimeRun] | None = None) -> dict[str, str | None]:
    """Log `sweep_point_metrics` (plus test-time metrics) on every sweep point's MLflow parent run (of this
    results directory).

    Parents are those of repexp.tracking (tag `repexp.parent_key` = 'point:<task>/<run>'), so the MLflow
    compare view of the parent runs shows pass@1/16/256 next to their sparse_dim/β/seed params. Inside the
    aggregate node this goes through the node run: with MLflow unreachable the metrics are kept in its
    outbox record and reach the parents at `repexp mlflow sync`. Returns {'<task>/<run>': parent run id or None}.
    """
    from repexp import tracking

    now = int(time.time() * 1000)
    node = _node_for(target)
    if node is not None:
        for run in runs:
            rows = [[key, value, 0, now] for key, value in _point_metrics(run, testtime).items()]
            node.log_parent_metrics(tracking.scope_for(run.spec.task, run.spec.name), rows)
        return {run.spec.path: None for run in runs}
    store, experiment_id = mlflow_store(target)
    logged = {}
    for run in runs:
        scope = tracking.scope_for(run.spec.task, run.spec.name, results_id=target.results_id)
        with store.lock():
            parent_id, _ = store.parent(experiment_id, scope)
        store.log_metrics(parent_id, [[key, value, 0, now] for key, value in _point_metrics(run, testtime).items()])
        logged[run.spec.path] = parent_id
    return logged


def _point_metrics(run: EvalRun, testtime: dict[tuple[str, str], TesttimeRun] | None) -> dict[str, float]:
    """A sweep point's test pass@k and, when its test-time stage ran, its test-time metrics."""
    metrics = sweep_point_metrics(run)
    tt = (testtime or {}).get((run.spec.task, run.spec.name))
    if tt is not None:
        metrics.update(metric_names.testtime_metrics(read_json(tt.path)))
    return metrics


# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--eval-dir", type=Path, help="collect every <task>/<run>/eval.json below this directory")
    source.add_argument("--inputs", type=Path, nargs="+", metavar="EVAL_JSON",
                        help="explicit eval.json files (each at <task>/<run>/eval.json)")
    parser.add_argument("--testtime", type=Path, nargs="*", default=[], metavar="TESTTIME_JSON",
                        help="testtime.json files of `repexp testtime` (at <task>/<run>/testtime.json): the test-time "
                             "column and table")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the tables go")
    parser.add_argument("--config", type=Path,
                        help="pipeline config: list its runs without an eval.json as missing (and, with --eval-dir, "
                             "ignore runs that are not part of it)")
    parser.add_argument("--grader", choices=GRADERS,
                        help="grader of the table's pass_at_k (default: the config's `grader` with --config, else "
                             "the one the eval.json files were graded with)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--experiment",
                        help="MLflow experiment: log test pass@1/16/256 on every sweep point's parent run "
                             "(default: the enclosing `repexp mlflow node` run's experiment, if any)")


def aggregate(paths: Sequence[Path], out_dir: Path, *, expected: Sequence[RunSpec] | None = None,
              drop_unexpected: bool = False, grader: str | None = None,
              testtime_paths: Sequence[Path] = ()) -> dict[str, Any]:
    """Load, tabulate and write every output. Returns {runs, table, k_efficiency, k_efficiency_by_k, missing,
    ignored, testtime}."""
    runs = load_evals(paths, grader)
    ignored: list[str] = []
    missing: list[str] = []
    if expected is not None:
        wanted = {(s.task, s.name) for s in expected}
        if drop_unexpected:
            ignored = [r.spec.path for r in runs if (r.spec.task, r.spec.name) not in wanted]
            runs = [r for r in runs if (r.spec.task, r.spec.name) in wanted]
        missing = missing_runs(expected, runs)
    if not runs:
        raise ValueError("no eval.json to aggregate" + (f" (missing: {', '.join(missing)})" if missing else ""))
    testtime = attach_testtime(runs, testtime_paths)
    table = tidy_table(runs, testtime)
    keff_by_k = k_efficiency(table, runs, by_reference_k=True)
    keff = k_efficiency_headline(keff_by_k)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / layout.K_EFFICIENCY_CSV) as tmp:
        keff.to_csv(tmp, index=False)
    with atomic_path(out_dir / layout.K_EFFICIENCY_BY_K_CSV) as tmp:
        keff_by_k.to_csv(tmp, index=False)
    with atomic_path(out_dir / layout.PASS_AT_K_MD) as tmp:
        tmp.write_text(render_markdown(table, keff, missing=missing, ignored=ignored, testtime=testtime))
    with atomic_path(out_dir / layout.PASS_AT_K_HTML) as tmp:
        tmp.write_text(render_html(table, keff, missing=missing, ignored=ignored, testtime=testtime))
    with atomic_path(out_dir / layout.PASS_AT_K_CSV) as tmp:  # last: the rule's first output
        table.to_csv(tmp, index=False)
    return {"runs": runs, "table": table, "k_efficiency": keff, "k_efficiency_by_k": keff_by_k, "missing": missing,
            "ignored": ignored, "testtime": testtime}


def run(args: argparse.Namespace) -> int:
    try:
        paths = find_eval_files(args.eval_dir) if args.eval_dir else list(args.inputs)
        for path in paths:
            if not Path(path).is_file():
                raise FileNotFoundError(f"{path}: eval.json not found")
        expected = expected_runs(args.config) if args.config else None
        for path in args.testtime:
            if not Path(path).is_file():
                raise FileNotFoundError(f"{path}: testtime.json not found")
        grader = args.grader
        if grader is None and args.config:
            from repexp.config import load

            grader = load(args.config).grader
        result = aggregate(paths, args.out_dir, expected=expected, drop_unexpected=bool(args.eval_dir), grader=grader,
                           testtime_paths=args.testtime)
    except (ValueError, FileNotFoundError) as err:  # ConfigError is a ValueError
        print(f"aggregate: error: {err}", file=sys.stderr)
        return 1
    for name in result["missing"]:
        print(f"aggregate: missing run (no eval.json): {name}", file=sys.stderr)
    if result["ignored"]:
        print(f"aggregate: ignored runs not in the config: {', '.join(result['ignored'])}", file=sys.stderr)
    print(f"aggregate: {len(result['runs'])} runs → {args.out_dir}/{', '.join(layout.AGGREGATE_FILES)}")
    target = mlflow_target(args.tracking_uri, args.experiment, args.config)
    if target is not None:
        try:
            logged = log_sweep_point_metrics(result["runs"], target, result["testtime"])
            node = _node_for(target)
            where = "kept for `repexp mlflow sync`" if node is not None and not node.online else "logged"
            print(f"aggregate: test pass@k {where} on {len(logged)} MLflow sweep-point runs ({target.experiment})")
        except Exception as err:  # the tables are written and valid; tracking failures are reported, not fatal
            print(f"aggregate: warning: MLflow logging failed ({type(err).__name__}: {err}); "
                  "the tables are complete, rerun with the same flags to log", file=sys.stderr)
    return 0
