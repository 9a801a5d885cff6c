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
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

from repexp import layout
from repexp.config.loading import read_yaml, to_dataclass
from repexp.config.model import (
    BACKENDS,
    MODEL_ALIASES,
    RULES,
    TASKS,
    BonusConfig,
    ConfigError,
    EvalConfig,
    PipelineConfig,
    RuleResources,
    TaskSweepOverride,
    TrackingConfig,
    TrainConfig,
    TrlConfig,
    VerlConfig,
    _f,
)
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


def task_sweep(cfg: PipelineConfig, task: str) -> tuple[list[int], list[float]]:
    override = cfg.task_overrides.get(task)
    sweep = override.sweep if override is not None else TaskSweepOverride()
    sparse_dims = sweep.sparse_dims if sweep.sparse_dims is not None else cfg.sweep.sparse_dims
    betas = sweep.betas if sweep.betas is not None else cfg.sweep.betas
    return [int(k) for k in sparse_dims], [float(b) for b in betas]

# --------------------------------------------------------------------------- run naming


def canonical(value: Any) -> str:
    """Shortest decimal text that round-trips: 0.01 -> '0.01', 1e-05 -> '0.00001', 32 -> '32'."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) or hasattr(value, "item"):  # numpy scalars too
        value = float(value)
        return str(int(value)) if value.is_integer() else format(Decimal(repr(value)).normalize(), "f")
    return str(value)


# Each method's run name, written once: `RunSpec.name` prints it. The pipeline never reads a name back
# (it looks the run up among the config's runs, `find_run`); only `parse_run` does, for results
# directories named by hand without a config (repexp aggregate, the tracking scopes).
RUN_NAMES = {
    "repexp": "{backend}_repexp_k{sparse_dim}_b{beta}_s{seed}",
    "grpo": "{backend}_grpo_s{seed}",
    "base": "base",
}
_FIELDS = {"backend": ("|".join(BACKENDS), str), "sparse_dim": (r"\d+", int), "beta": (r"[0-9.]+", float),
           "seed": (r"\d+", int)}  # each field's regex and type
# One regex per method: group names repeat across methods, which one alternation cannot hold.
_RUN_RES = {method: re.compile("".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>{_FIELDS[part][0]})"
                                       for i, part in enumerate(re.split(r"\{(\w+)\}", template))))
            for method, template in RUN_NAMES.items()}


@dataclass(frozen=True)
class RunSpec:
    """One sweep point. `name` is its stable path component under results/<stage>/<task>/."""

    task: str
    method: str  # repexp | grpo | base
    backend: Optional[str] = None
    sparse_dim: Optional[int] = None
    beta: float = 0.0
    seed: Optional[int] = None

    @property
    def name(self) -> str:
        return RUN_NAMES[self.method].format(backend=self.backend, sparse_dim=self.sparse_dim,
                                             beta=canonical(self.beta), seed=self.seed)

    @property
    def path(self) -> str:
        return f"{self.task}/{self.name}"

    @property
    def trains(self) -> bool:
        return self.method != "base"


def parse_run(task: str, name: str) -> RunSpec:
    """A results directory's run (`RunSpec.name` read back); rejects non-canonical spellings such as b0.010."""
    match = next(((method, m) for method, regex in _RUN_RES.items() if (m := regex.fullmatch(name))), None)
    if match is None or task not in TASKS:
        raise ConfigError(f"run: {task}/{name} is not a valid run name")
    method, m = match
    spec = RunSpec(task, method, **{name: _FIELDS[name][1](value) for name, value in m.groupdict().items()})
    if spec.name != name:
        raise ConfigError(f"run: {name} is not canonical (expected {spec.name})")
    return spec


def sweep_runs(cfg: PipelineConfig) -> list[RunSpec]:
    """Every run of the sweep, in a stable order: RepExp points, then GRPO, then base."""
    runs: list[RunSpec] = []
    for task in cfg.sweep.tasks:
        sparse_dims, betas = task_sweep(cfg, task)
        for backend in cfg.sweep.backends:
            for seed in cfg.sweep.seeds:
                runs += [RunSpec(task, "repexp", backend, k, beta, int(seed)) for k in sparse_dims for beta in betas]
                if cfg.sweep.grpo_baseline:
                    runs.append(RunSpec(task, "grpo", backend, None, 0.0, int(seed)))
        if cfg.sweep.base_baseline:
            runs.append(RunSpec(task, "base", seed=int(cfg.sweep.seeds[0])))
    return runs


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
class RunConfig:
    """Everything one training or eval job needs, fully resolved (written as the job's `job.yaml`)."""

    run: str
    task: str
    method: str
    backend: Optional[str]
    seed: int
    sparse_dim: Optional[int]
    beta: float
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
        sparse_dim=spec.sparse_dim, beta=float(spec.beta), model=resolve_model(cfg),
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

