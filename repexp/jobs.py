"""Typed jobs: what one per-task / per-run stage runs, composed once from the config snapshot.

    config snapshot ($REPEXP_CONFIG) + identity (rule, task, run)
      compose()    -> PreprocessJob | TrainJob | EvalJob | ... : the composed config section whole
                      (`config`: repexp.config.compose's RunConfig, its `eval`, the `testtime`, `data`
                      sections), paths from repexp.layout, the run from repexp.config.find_run
      repexp.stages.run_job() -> the stage -> StageResult (train: repexp.train.run_node, its own node)
      .outputs()   -> the rule's declared outputs, which the MLflow node logs as artifacts
      job_hash()   -> the rule's Snakemake params: a settings change reruns exactly its jobs

`repexp run RULE ...` (repexp.run_cli) runs the stage inside the node run (repexp.tracking.outputs.
run_stage). The hand CLIs build the same job: `repexp eval`, `testtime` and `data prepare` from the config
and its `--set` dotlist (`hand_job`; with `--run`, exactly `compose`'s job; `model` and `download`: the rule's),
`aggregate` and `figures` likewise with paths as flags (`logging_hand_job`), `select` from its paths
(`from_args`). A job field left None means "the stage's own default".

Cheap to import (every Snakemake invocation hashes jobs in common.smk): no numpy, torch or MLflow.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

from repexp import config as C
from repexp import layout as L

DAPO_TASK = "dapo-with-aime24"  # the one task that reads data.dapo_source


@dataclass(frozen=True, kw_only=True)
class _Identity:  # the workflow's wildcards; None in a hand CLI's job
    task: Optional[str] = None
    run: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class _OneOutput:
    out: str

    def outputs(self) -> list[str]:
        return [self.out]


@dataclass(frozen=True, kw_only=True)
class PreprocessJob:
    """One task's splits: the config's `data` section (`dapo_source` only for the task that reads it)."""

    task: str
    out: str
    config: C.DataConfig
    # the paper's split sizes and aime24's training table, which only a hand run changes (`repexp data prepare`)
    gsm8k_dev_size: Optional[int] = None
    dapo_train_size: Optional[int] = None
    aime_train: Optional[str] = None

    def outputs(self) -> list[str]:
        return [*(str(L.split_file(self.out, split)) for split in L.SPLITS), str(L.manifest_file(self.out))]


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """One training run: its resolved config (`job.yaml`), hashed as the training hash (job_hash)."""

    config: C.RunConfig

    def outputs(self) -> list[str]:
        return [str(Path(self.config.run_dir) / L.DONE)]


@dataclass(frozen=True, kw_only=True)
class SelectJob(_Identity, _OneOutput):
    run_dir: str
    backend: str


@dataclass(frozen=True, kw_only=True)
class MergeJob(_Identity, _OneOutput):
    pointer: str


@dataclass(frozen=True, kw_only=True)
class EvalJob(_Identity):
    """One evaluation: the run's composed `eval` section (`config`: task override applied, max_new_tokens and
    the GPU memory fraction resolved), the model (exactly one of `model` and `model_pointer`), the split
    (`data`), the output directory and the run's seed and grader."""

    config: C.EvalConfig
    data: Optional[str]
    out: str
    model: Optional[str] = None
    model_pointer: Optional[str] = None
    seed: int = 0
    grader: Optional[str] = None
    overwrite: bool = False
    no_progress: bool = False
    # what a hand run records or narrows (`repexp eval`); None: from the data file and the model
    split: Optional[str] = None
    checkpoint_step: Optional[int] = None
    limit: Optional[int] = None
    max_shards: Optional[int] = None

    def outputs(self) -> list[str]:
        return [str(Path(self.out) / L.EVAL_JSON)]


@dataclass(frozen=True, kw_only=True)
class TesttimeJob(_Identity):
    """The test-time order of one evaluation's samples: the config's `testtime` section and, of the training
    bonus, the two settings the order reads (λ, centring), so that other bonus settings rerun no test-time job."""

    config: C.TesttimeConfig
    eval_dir: str
    model: str  # the frozen feature model: bonus.representation_model, else the initial policy
    out: str
    lamb: float
    center: bool
    data: Optional[str] = None  # hand use: the evaluated split (None: the path the sample store records)

    def outputs(self) -> list[str]:
        return [str(Path(self.out) / L.TESTTIME_JSON)]


@dataclass(frozen=True, kw_only=True)
class ModelJob(_OneOutput):
    kind: str  # the alias: tiny | smollm2
    seed: int = 0
    shape: str = "tiny"


@dataclass(frozen=True, kw_only=True)
class DownloadModelJob(_OneOutput):
    repo_id: str
    revision: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class DownloadDataJob(_OneOutput):
    tasks: tuple[str, ...]
    tables: bool
    dapo: bool


@dataclass(frozen=True, kw_only=True)
class AggregateJob:
    inputs: Optional[tuple[str, ...]]
    out_dir: str
    testtime: tuple[str, ...] = ()
    experiment: Optional[str] = None
    config: Optional[str] = None  # the config file: its runs are expected (set by `repexp run`, not hashed)
    eval_dir: Optional[str] = None  # hand use only
    grader: Optional[str] = None
    tracking_uri: Optional[str] = None

    def outputs(self) -> list[str]:
        return [str(Path(self.out_dir) / name) for name in L.AGGREGATE_FILES]


@dataclass(frozen=True, kw_only=True)
class FiguresJob:
    table: str
    out_dir: str
    k_efficiency: Optional[str] = None
    curves_from: str = "auto"
    train_dir: Optional[str] = None
    config: Optional[str] = None  # as AggregateJob's
    experiment: Optional[str] = None
    tracking_uri: Optional[str] = None
    max_repexp_lines: Optional[int] = None

    def outputs(self) -> list[str]:
        return []  # `repexp figures` logs the figures and tables itself (repexp.figures.publish)


Job = Union[PreprocessJob, TrainJob, SelectJob, MergeJob, EvalJob, TesttimeJob, ModelJob, DownloadModelJob,
            DownloadDataJob, AggregateJob, FiguresJob]


# --------------------------------------------------------------------------- composition


def _preprocess(cfg: C.PipelineConfig, task: str) -> PreprocessJob:
    data = cfg.data if task == DAPO_TASK else dataclasses.replace(cfg.data, dapo_source=None)
    return PreprocessJob(task=task, out=str(L.data_dir(cfg.results_dir, task)), config=data)


def _select(cfg, spec: C.RunSpec, rc: C.RunConfig) -> SelectJob:
    return SelectJob(task=spec.task, run=spec.name, run_dir=rc.run_dir, backend=spec.backend,
                     out=str(Path(rc.run_dir) / L.SELECT))


def _merge(cfg, spec: C.RunSpec, rc: C.RunConfig) -> MergeJob:
    return MergeJob(task=spec.task, run=spec.name, pointer=str(Path(rc.run_dir) / L.SELECT),
                    out=str(Path(rc.run_dir) / L.MERGED))


def eval_section(cfg: C.PipelineConfig, task: Optional[str]) -> C.EvalConfig:
    """The `eval` section a job of this task runs with: the task's override applied, max_new_tokens resolved."""
    section = C.task_section(cfg, task, "eval") if task else dataclasses.replace(cfg.eval)
    section.max_new_tokens = C.max_new_tokens(section, C.task_section(cfg, task, "train") if task else cfg.train)
    return section


def _eval(cfg, spec: C.RunSpec, rc: C.RunConfig) -> EvalJob:
    """A trained run samples the model its pointer names (merged for verl); `base`, the initial policy."""
    pointer = str(Path(rc.run_dir) / (L.MERGED if spec.backend == "verl" else L.SELECT)) if spec.trains else None
    return EvalJob(
        task=rc.task, run=spec.name, config=rc.eval, data=str(L.data_file(cfg.results_dir, spec.task, "test")),
        out=str(L.eval_json(cfg.results_dir, spec.task, spec.name).parent),
        model=None if pointer else rc.model, model_pointer=pointer, seed=rc.seed, grader=rc.grader,
        # the workflow reruns eval only when its settings changed: stale samples are discarded, not merged
        overwrite=True, no_progress=True,
    )


def _testtime(cfg, spec: C.RunSpec, rc: C.RunConfig) -> TesttimeJob:
    """λ and centring are the training bonus's; the feature model is `bonus.representation_model`,
    else the initial policy (as in training)."""
    return TesttimeJob(
        task=spec.task, run=spec.name, config=cfg.testtime,
        eval_dir=str(L.eval_json(cfg.results_dir, spec.task, spec.name).parent),
        model=rc.bonus.representation_model or rc.model,
        out=str(L.testtime_json(cfg.results_dir, spec.task, spec.name).parent),
        lamb=rc.bonus.lamb, center=rc.bonus.center,
    )


def _model(cfg, alias: str) -> ModelJob:
    if alias not in C.MODEL_ALIASES:
        raise C.ConfigError(f"alias: {alias!r} is not an offline model ({', '.join(C.MODEL_ALIASES)})")
    return ModelJob(kind=alias, out=str(L.model_alias_dir(cfg.results_dir, alias)))


def _download_model(cfg, hub_model: str) -> DownloadModelJob:
    repo_id = hub_model.replace("--", "/", 1)  # the local copy's name, `<org>--<name>` (no `--` in Hub names)
    return DownloadModelJob(repo_id=repo_id, out=str(L.hub_model_dir(cfg.results_dir, repo_id)))


def _download_data(cfg) -> DownloadDataJob:
    """The hub tables of the sweep's tasks; the snapshot names their local copy where the config said `hf`."""
    results, data = cfg.results_dir, cfg.data
    return DownloadDataJob(tasks=tuple(cfg.sweep.tasks), out=str(L.hub_data_dir(results)),
                           tables=data.source in ("hf", str(L.hub_data_dir(results))),
                           dapo=data.dapo_source in ("hf", str(L.hub_dapo_dir(results))))


def _aggregate(cfg) -> AggregateJob:
    runs = C.part_runs(cfg)  # with sweep.part, the other parts' runs found on disk are pooled (repexp.aggregate)
    return AggregateJob(
        inputs=tuple(str(L.eval_json(cfg.results_dir, s.task, s.name)) for s in runs),
        testtime=tuple(str(L.testtime_json(cfg.results_dir, s.task, s.name)) for s in runs) if cfg.testtime.enabled
        else (), out_dir=str(L.aggregate_dir(cfg.results_dir)), experiment=cfg.tracking.experiment or cfg.name)


def _figures(cfg) -> FiguresJob:
    trains = any(spec.trains for spec in C.sweep_runs(cfg))
    return FiguresJob(table=str(L.aggregate_file(cfg.results_dir, L.PASS_AT_K_CSV)),
                      k_efficiency=str(L.aggregate_file(cfg.results_dir, L.K_EFFICIENCY_BY_K_CSV)),
                      out_dir=str(L.figures_dir(cfg.results_dir)), curves_from="jsonl" if trains else "none",
                      train_dir=str(Path(cfg.results_dir, L.TRAIN_DIR)) if trains else None)


class Rule(NamedTuple):
    compose: Callable[..., Any]  # (cfg, spec, run config) for a per-run rule, else (cfg, **wildcards)
    wildcards: tuple[str, ...]  # the rule's identity: its Snakemake wildcards, `repexp run`'s flags


# Each rule's job; its stage (the function that runs the job) is in repexp.stages.
RULES = {
    "preprocess": Rule(_preprocess, ("task",)),
    "train": Rule(lambda cfg, spec, rc: TrainJob(config=rc), ("task", "run")),
    "select": Rule(_select, ("task", "run")),
    "merge": Rule(_merge, ("task", "run")),
    "eval": Rule(_eval, ("task", "run")),
    "testtime": Rule(_testtime, ("task", "run")),
    "model": Rule(_model, ("alias",)),
    "download_model": Rule(_download_model, ("hub_model",)),
    "download_data": Rule(_download_data, ()),
    "aggregate": Rule(_aggregate, ()),
    "figures": Rule(_figures, ()),
}


def compose(cfg: C.PipelineConfig, rule: str, task: Optional[str] = None, run: Optional[str] = None, *,
            run_config: Optional[C.RunConfig] = None, cfg_hash: Optional[str] = None, **wildcards: str) -> Job:
    """The job of one rule for its wildcards (task and run; alias; hub_model; none); raises ConfigError
    naming a bad rule, task or run. `run_config`: `C.compose`'s result when the caller has it (the
    workflow caches it)."""
    if rule not in RULES:
        raise C.ConfigError(f"rule: {rule!r} is not a rule `repexp run` knows; choose from {', '.join(RULES)}")
    composer, identity = RULES[rule]
    given = {**dict.fromkeys(identity), "task": task, "run": run, **wildcards}
    for name, value in given.items():
        if (value is None) == (name in identity):
            raise C.ConfigError(f"{name}: the {rule} rule needs --{name.replace('_', '-')}" if value is None else
                                f"{name}: the {rule} rule takes no {name} (got {value!r})")
    if rule == "preprocess" and task not in cfg.sweep.tasks:
        raise C.ConfigError(f"task: {task!r} is not one of this config's sweep.tasks ({', '.join(cfg.sweep.tasks)})")
    if "run" not in identity:
        return composer(cfg, **{name: given[name] for name in identity})
    spec = C.find_run(cfg, task, run)
    if rule in ("train", "select", "merge") and not spec.trains:
        raise C.ConfigError(f"run: {task}/{run} trains nothing, so it has no {rule} job")
    if rule == "merge" and spec.backend != "verl":
        raise C.ConfigError(f"run: {task}/{run} is not a verl run; only verl checkpoints are merged")
    rc = run_config or C.compose(cfg, spec, cfg_hash=cfg_hash)
    return composer(cfg, spec, rc)


def job_hash(job: Job) -> str:
    if isinstance(job, TrainJob):
        return C.training_hash(job.config)
    blob = json.dumps(dataclasses.asdict(job), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _plain(value: Any) -> Any:  # a flag's value as a job holds it: paths as text, lists as tuples
    return str(value) if isinstance(value, Path) else tuple(map(_plain, value)) if isinstance(value, list) else value


def from_args(cls: type, args: argparse.Namespace) -> Job:
    """The job of a hand CLI whose flags are all paths and identities, of the job's field names (`repexp select`)."""
    return cls(**{f.name: _plain(getattr(args, f.name)) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


def config_options(parser: argparse.ArgumentParser, example: str) -> None:
    """A hand CLI's settings: the pipeline config's sections (`--config`, default: every default) with the
    `set=` dotlist (`--set`), each setting declared and checked once (repexp.config)."""
    group = parser.add_argument_group("settings (the pipeline config's keys; docs/configuration.md)")
    group.add_argument("--config", type=Path, help="pipeline config (default: the defaults)")
    group.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY.PATH=VALUE",
                       help=f"dotlist overrides of the config, as `--config set=...` in Snakemake (e.g. {example})")


def logging_hand_job(cls: type, args: argparse.Namespace, **paths: Any) -> tuple[Job, C.PipelineConfig]:
    """`repexp aggregate`'s and `repexp figures`' job: the paths their flags give, where to log from the config
    (`tracking.experiment`, `tracking.tracking_uri`); the config comes back for the stage's other settings."""
    cfg = C.load(args.config or {}, overrides=args.set)
    return cls(config=args.config and str(args.config), experiment=cfg.tracking.experiment,
               tracking_uri=cfg.tracking.tracking_uri, **{k: _plain(v) for k, v in paths.items()}), cfg


def hand_job(rule: str, args: argparse.Namespace, build: Optional[Callable[..., Job]] = None,
             wildcards: Optional[dict[str, str]] = None, **flags: Any) -> Job:
    """A hand CLI's job from the checked config (`--config` and `--set`): with `--run` (and `--task`) the job
    `repexp run RULE` composes for that run, else `build(cfg, **flags)`, else the rule's job for `wildcards`;
    its fields replaced by the flags given. A flag of None was not given."""
    cfg = C.load(args.config or {}, overrides=args.set)
    given = {name: _plain(value) for name, value in flags.items() if value is not None}
    if getattr(args, "run", None):
        return dataclasses.replace(compose(cfg, rule, args.task, args.run), **given)
    if build is not None:
        return build(cfg, **given)
    return dataclasses.replace(compose(cfg, rule, **(wildcards or {})), **given)
