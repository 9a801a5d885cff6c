"""A config's runs: the run-name grammar, the sweep, and one job's resolved config.

- `task_section` / `task_sweep` / `rule_resources`: a task's effective sections and sweep points
  (task overrides applied) and a rule's scheduler requests;
- `RUN_NAMES`, each method's run name: `RunSpec.name` prints it; the pipeline never parses it back
  (`parse_run` reads results directories named by hand); `sweep_runs` lists every run of a sweep,
  `find_run` looks one up by name, `run_pattern` is Snakemake's wildcard regex of a set of runs;
- `compose` resolves one job's `RunConfig` (defaults <- file <- task overrides <- sweep point),
  the only thing both trainer backends and the eval node read; `training_hash` is what reruns training.

Pure: OmegaConf and PyYAML only (through `repexp.config.loading`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

from repexp import layout
from repexp.config.loading import read_yaml, to_dataclass
from repexp.config.model import (
    BACKENDS,
    METHOD_GRIDS,
    MODEL_ALIASES,
    RULES,
    TASKS,
    BonusConfig,
    ConfigError,
    EvalConfig,
    PipelineConfig,
    RuleResources,
    TrackingConfig,
    TrainConfig,
    TrlConfig,
    VerlConfig,
    _f,
)
from repexp.methods import BASE, params_dict
from repexp.methods import METHODS as METHODS_TABLE
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

# --------------------------------------------------------------------------- a task's sections, a rule's requests


def rule_resources(cfg: PipelineConfig, rule: str) -> RuleResources:
    """`resources.<rule>` (defaults for rules the config does not mention)."""
    if rule not in RULES:
        raise ConfigError(f"resources.{rule}: unknown rule (known: {', '.join(RULES)})")
    return cfg.resources.get(rule) or RuleResources()

def task_section(cfg: PipelineConfig, task: str, section: str) -> Any:
    """`cfg.<section>` with `task_overrides.<task>.<section>` applied (values converted by `parse`)."""
    base = getattr(cfg, section)
    override = cfg.task_overrides.get(task)
    patch = getattr(override, section) if override is not None else {}
    return dataclasses.replace(base, **patch)


def task_sweep(cfg: PipelineConfig, task: str) -> dict[str, Any]:
    """The task's method grids, `{method: grid dataclass}` in table order (methods not run left out):
    `sweep.methods` with `task_overrides.<task>.sweep.methods` applied (its lists replace the sweep's)."""
    override = cfg.task_overrides.get(task)
    patches = override.sweep.methods if override is not None else {}
    grids = {}
    for name in METHOD_GRIDS:
        grid = getattr(cfg.sweep.methods, name)
        if name in patches:
            patch = patches[name]
            grid = None if patch is None else dataclasses.replace(grid or METHOD_GRIDS[name](), **patch)
        if grid is not None:
            grids[name] = grid
    return grids


def grid_points(method: str, grid: Any) -> list[tuple[tuple[str, Any], ...]]:
    """Every combination of a method's grid values, in the grid's field order (the last field varies fastest)."""
    names = [f.name for f in dataclasses.fields(grid)]
    return [tuple(zip(names, values)) for values in itertools.product(*(getattr(grid, n) for n in names))]


# --------------------------------------------------------------------------- run naming


def canonical(value: Any) -> str:
    """Shortest decimal text that round-trips: 0.01 -> '0.01', 1e-05 -> '0.00001', 32 -> '32'."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) or hasattr(value, "item"):  # numpy scalars too
        value = float(value)
        return str(int(value)) if value.is_integer() else format(Decimal(repr(value)).normalize(), "f")
    return str(value)


# Each method's run name, written once in its `repexp.methods` entry: `RunSpec.name` prints it. The pipeline never
# reads a name back (it looks the run up among the config's runs, `find_run`); only `parse_run` does, for results
# directories named by hand without a config (repexp aggregate, the tracking scopes).
RUN_NAMES = {**{name: m.run_name for name, m in METHODS_TABLE.items()}, BASE: "base"}


def _field_regex(tp: Any, meta: Mapping) -> tuple[str, Callable[[str], Any]]:
    if "enum" in meta:
        return "|".join(re.escape(str(v)) for v in meta["enum"]), str
    return {int: (r"\d+", int), float: (r"[0-9.]+", float)}.get(tp, (r"[A-Za-z0-9.]+", str))


def _name_regex(method: str) -> tuple[re.Pattern, dict[str, Callable[[str], Any]]]:
    """One regex per method (group names repeat across methods, which one alternation cannot hold)."""
    fields = {"backend": ("|".join(BACKENDS), str), "seed": (r"\d+", int)}
    if method != BASE:
        params = METHODS_TABLE[method].params
        hints = typing.get_type_hints(params)
        fields |= {f.name: _field_regex(hints[f.name], f.metadata) for f in dataclasses.fields(params)}
    parts = re.split(r"\{(\w+)\}", RUN_NAMES[method])
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>{fields[part][0]})" for i, part in enumerate(parts))
    return re.compile(regex), {name: conv for name, (_, conv) in fields.items()}


_RUN_RES = {method: _name_regex(method) for method in RUN_NAMES}


class _MethodPoint:
    """What a run's method and parameters give, shared by `RunSpec` and `RunConfig` (each has `method`
    and `param_dict`): the method's `Params` and RepExp's β and sparse_dim."""

    method: str

    @property
    def param_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def settings(self) -> Any:
        """The method's `Params` of this run (None for the base model)."""
        return None if self.method == BASE else METHODS_TABLE[self.method].make(self.param_dict)

    @property
    def sparse_dim(self) -> Optional[int]:
        return self.param_dict.get("sparse_dim")

    @property
    def beta(self) -> float:
        """RepExp's β; 0 for every other method (no elliptical bonus)."""
        return float(self.param_dict.get("beta", 0.0))


@dataclass(frozen=True)
class RunSpec(_MethodPoint):
    """One sweep point. `name` is its stable path component under results/<stage>/<task>/.

    `params`: the method's settings as (field, value) pairs in its `Params` order, every field (defaults
    included); empty for GRPO and the base model. `RunSpec.of` builds one from keyword parameters."""

    task: str
    method: str  # a key of repexp.methods.METHODS, or "base"
    backend: Optional[str] = None
    params: tuple[tuple[str, Any], ...] = ()
    seed: Optional[int] = None

    @classmethod
    def of(cls, task: str, method: str, backend: Optional[str] = None, seed: Optional[int] = None,
           **params: Any) -> RunSpec:
        """A run with its method's defaults for the parameters not given (values converted to the fields' types)."""
        if method == BASE:
            return cls(task, method, backend, (), None if seed is None else int(seed))
        settings = METHODS_TABLE[method].make({k: _plain(v) for k, v in params.items()})
        return cls(task, method, backend, tuple(params_dict(settings).items()), None if seed is None else int(seed))

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def name(self) -> str:
        values = {name: canonical(value) for name, value in self.params}
        return RUN_NAMES[self.method].format(backend=self.backend, seed=self.seed, **values)

    @property
    def point(self) -> str:
        """The run's parameter point without backend and seed, e.g. ``repexp_k32_b0.01`` (its seeds share it)."""
        return _point_name(self.method, {name: canonical(v) for name, v in self.params})

    @property
    def path(self) -> str:
        return f"{self.task}/{self.name}"

    @property
    def trains(self) -> bool:
        return self.method != BASE


def _point_name(method: str, values: Mapping[str, str]) -> str:
    template = RUN_NAMES[method]
    for prefix in ("{backend}_",):
        template = template.removeprefix(prefix)
    return template.removesuffix("_s{seed}").format(**values)


def _plain(value: Any) -> Any:
    """numpy scalars as Python values (names and hashes must not depend on where a value came from)."""
    return value.item() if hasattr(value, "item") else value


def parse_run(task: str, name: str) -> RunSpec:
    """A results directory's run (`RunSpec.name` read back); rejects non-canonical spellings such as b0.010."""
    for method, (regex, convert) in _RUN_RES.items():
        m = regex.fullmatch(name)
        if m is None or task not in TASKS:
            continue
        values = {key: convert[key](value) for key, value in m.groupdict().items()}
        try:
            spec = RunSpec.of(task, method, values.pop("backend", None), values.pop("seed", None), **values)
        except (TypeError, ValueError):
            continue
        if spec.name != name:
            raise ConfigError(f"run: {name} is not canonical (expected {spec.name})")
        return spec
    raise ConfigError(f"run: {task}/{name} is not a valid run name")


def sweep_runs(cfg: PipelineConfig) -> list[RunSpec]:
    """Every run of the sweep (every part of its seeds: `part_runs` are one part's), in a stable order: per
    task, backend and seed the methods in table order (each method's grid points in its field order), then
    the base model per task."""
    runs: list[RunSpec] = []
    for task in cfg.sweep.tasks:
        grids = task_sweep(cfg, task)
        for backend in cfg.sweep.backends:
            for seed in cfg.sweep.seeds:
                for method, grid in grids.items():
                    runs += [RunSpec.of(task, method, backend, int(seed), **dict(point))
                             for point in grid_points(method, grid)]
        if cfg.sweep.base_baseline:
            runs.append(RunSpec(task, BASE, seed=int(cfg.sweep.seeds[0])))
    return runs


def seed_parts(cfg: PipelineConfig) -> list[list[int]]:
    """`sweep.seeds` in `sweep.parts` consecutive parts, in order; where they do not divide evenly the first
    parts hold one seed more (15 seeds in 2 parts: 8 and 7)."""
    seeds, parts = [int(s) for s in cfg.sweep.seeds], max(1, int(cfg.sweep.parts))
    size, extra = divmod(len(seeds), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(seeds[start:end])
        start = end
    return out


def part_runs(cfg: PipelineConfig) -> list[RunSpec]:
    """The runs this command trains and evaluates: `sweep_runs` of the seeds of part `sweep.part` (the base
    model, whose seed is the first seed, in part 1), or every run when `sweep.part` is null."""
    runs = sweep_runs(cfg)
    if cfg.sweep.part is None:
        return runs
    seeds = set(seed_parts(cfg)[int(cfg.sweep.part) - 1])
    return [spec for spec in runs if spec.seed in seeds]


def find_run(cfg: PipelineConfig, task: str, name: str) -> RunSpec:
    """The run of this config's sweep named `name`; ConfigError naming `run` and the task's runs otherwise
    (a non-canonical spelling such as b0.010 names no run)."""
    runs = {spec.name: spec for spec in sweep_runs(cfg) if spec.task == task}
    if name not in runs:
        raise ConfigError(f"run: {task}/{name} is not a run of this config (its runs of {task}: "
                          f"{', '.join(runs) or f'none, {task} is not in sweep.tasks'})")
    return runs[name]


def run_pattern(runs: Iterable[RunSpec]) -> str:
    """Snakemake's wildcard regex for `run`: exactly these runs' names (no match when there are none)."""
    return "|".join(sorted({re.escape(spec.name) for spec in runs})) or "(?!)"


# Wildcard regexes for Snakemake (no named groups: Snakemake wraps each in its own group).
TASK_PATTERN = "|".join(re.escape(t) for t in TASKS)
MODEL_ALIAS_PATTERN = "|".join(MODEL_ALIASES)


# --------------------------------------------------------------------------- per-job composition


@dataclass
class RunConfig(_MethodPoint):
    """Everything one training or eval job needs, fully resolved (written as the job's `job.yaml`)."""

    run: str
    task: str
    method: str
    backend: Optional[str]
    seed: int
    params: dict[str, Any]  # the method's `Params` as a mapping (RunSpec.params); {} for GRPO and the base model
    model: str
    data_dir: str
    run_dir: str
    bonus: BonusConfig
    train: TrainConfig
    eval: EvalConfig
    verl: VerlConfig
    trl: TrlConfig
    tracking: TrackingConfig
    config_name: str
    config_hash: str
    grader: str = _f(DEFAULT_GRADER, help="answer grader (repexp | paper)", enum=GRADERS)

    @property
    def param_dict(self) -> dict[str, Any]:
        return self.params

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> RunConfig:
        return to_dataclass(cls, raw)


def config_hash(cfg: PipelineConfig) -> str:
    blob = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _training_fields(section: Any) -> dict:
    """A section's settings that change what training computes (not the `runtime=True` ones)."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if not f.metadata.get("runtime")}


def training_hash(run_config: RunConfig) -> str:
    """Hash of what determines one training run: its sweep point, the initial model, the grader, `train`, its own
    backend's section and, for RepExp runs (β > 0), `bonus`. Not: eval, tracking, names, the other
    backend's section, `bonus` for GRPO (β = 0: the advantage is the group-normalised verifier
    reward, which α > 0 does not change and verl does not read), or `runtime=True` settings
    (batching for speed, CPUs, retention).

    Snakemake passes it as the train rule's param, so a config change reruns exactly the training
    jobs it affects (it is the train job's hash, `repexp.jobs.TrainJob`).
    """
    rc = run_config
    identity = {
        **{name: getattr(rc, name) for name in ("task", "method", "backend", "seed", "sparse_dim", "beta", "model")},
        # RepExp's and GRPO's identities predate the method table: theirs is the (sparse_dim, beta) above
        **({"params": rc.params} if rc.method not in ("repexp", "grpo") else {}),
        "grader": rc.grader,  # the verifier reward and dev selection
        "train": _training_fields(rc.train),
        rc.backend or "backend": _training_fields(getattr(rc, rc.backend)) if rc.backend else None,
    }
    if rc.beta > 0:
        identity["bonus"] = _training_fields(rc.bonus)
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def resolve_model(cfg: PipelineConfig) -> str:
    """The policy path jobs load: offline aliases live under results/models/."""
    if cfg.model in MODEL_ALIASES:
        return str(layout.model_alias_dir(cfg.results_dir, cfg.model))
    return cfg.model


def max_new_tokens(eval_cfg: EvalConfig, train: TrainConfig) -> int:
    """Tokens per evaluation sample: `eval.max_new_tokens`, else `train.max_response_length`."""
    return eval_cfg.max_new_tokens if eval_cfg.max_new_tokens is not None else train.max_response_length


def compose(cfg: PipelineConfig, spec: RunSpec, *, cfg_hash: Optional[str] = None) -> RunConfig:
    """The resolved config of one sweep point (defaults ← file ← task overrides ← wildcards).
    `cfg_hash`: `config_hash(cfg)` when the caller has it (the workflow composes hundreds of jobs)."""
    if spec.task not in cfg.sweep.tasks:
        raise ConfigError(f"sweep.tasks: {spec.task} is not part of this config")
    seed = spec.seed if spec.seed is not None else cfg.sweep.seeds[0]
    eval_cfg = task_section(cfg, spec.task, "eval")
    train = task_section(cfg, spec.task, "train")
    eval_cfg.max_new_tokens = max_new_tokens(eval_cfg, train)
    return RunConfig(
        run=spec.name, task=spec.task, method=spec.method, backend=spec.backend, seed=int(seed),
        params=dict(spec.params), model=resolve_model(cfg),
        data_dir=str(layout.data_dir(cfg.results_dir, spec.task)),
        run_dir=str(layout.train_run_dir(cfg.results_dir, spec.task, spec.name)),
        bonus=copy.deepcopy(cfg.bonus), train=train, eval=eval_cfg, verl=task_section(cfg, spec.task, "verl"),
        trl=task_section(cfg, spec.task, "trl"), tracking=copy.deepcopy(cfg.tracking), config_name=cfg.name,
        config_hash=cfg_hash or config_hash(cfg), grader=cfg.grader)


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"run config {path}: not found")
    return RunConfig.from_dict(read_yaml(path))

