"""Loading of `repexp aggregate`'s inputs: `eval.json` and `testtime.json` files, checked, as `EvalRun` and
`TesttimeRun`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from repexp import layout
from repexp.config import METHODS, TASKS, ConfigError, RunSpec, parse_run
from repexp.io import read_json
from repexp.verify.routing import DEFAULT_GRADER, GRADERS


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
    variants: dict[str, Any] = dataclasses.field(default_factory=dict)  # testtime.variants' orders, by name


# --------------------------------------------------------------------------- loading


def find_eval_files(eval_dir: str | Path) -> list[Path]:
    """Every `<task>/<run>/eval.json` under `eval_dir`, sorted."""
    eval_dir = Path(eval_dir)
    if not eval_dir.is_dir():
        raise FileNotFoundError(f"{eval_dir}: eval directory not found")
    return sorted(p for p in eval_dir.glob(f"*/*/{layout.EVAL_JSON}") if p.is_file())


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


def _read_object(path: Path, keys: Sequence[str]) -> dict:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for key in keys:
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    return data


def load_eval(path: str | Path) -> EvalRun:
    """Read and validate one `<task>/<run>/eval.json`; errors name the file and the key."""
    path = Path(path)
    data = _read_object(path, ("pass_at_k", "num_problems", "n_samples"))
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
    data = _read_object(path, ("k", "pass_at_k_repexp", "efficiency", "samples_to_correct"))
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
                       stc=data["samples_to_correct"], data_hash=data.get("data_hash"),
                       variants=data.get("variants") or {})


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
    """Tasks in TASKS order, then the methods in `repexp.methods.METHODS` order (the base model last); then
    backend, the method's parameters (in its `Params` order) and seed."""
    return (TASKS.index(spec.task), METHODS.index(spec.method), spec.backend or "",
            tuple(value for _, value in spec.params), -1 if spec.seed is None else spec.seed)
