"""Typed jobs: what one per-task / per-run stage runs, composed once from the config snapshot.

    config snapshot ($REPEXP_CONFIG) + identity (rule, task, run)
      compose()    -> PreprocessJob | TrainJob | SelectJob | ... : settings from the composed per-run
                      config (repexp.config.compose), paths from repexp.layout, the run from
                      repexp.config.find_run (a name is never parsed back)
      repexp.stages.run_job() -> the stage -> StageResult (train: repexp.train.run_node, its own node)
      .outputs()   -> the rule's declared outputs, which the MLflow node logs as artifacts
      job_hash()   -> the rule's Snakemake params: a settings change reruns exactly its jobs

`repexp run RULE ...` (repexp.run_cli) runs the stage inside the node run (repexp.tracking.outputs.
run_stage). The hand CLIs (`repexp eval`, ...) build the same job from their same-named flags
(`from_args`); a field the pipeline leaves None means "the stage's own default".

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
    task: str
    out: str
    source: str
    seed: int
    limit_train: Optional[int] = None
    limit_dev: Optional[int] = None
    limit_test: Optional[int] = None
    dapo_source: Optional[str] = None
    gsm8k_dev_size: Optional[int] = None  # hand use only
    dapo_train_size: Optional[int] = None  # hand use only
    aime_train: Optional[str] = None  # hand use only

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
    data: Optional[str]
    out: str
    model: Optional[str] = None  # exactly one of model and model_pointer
    model_pointer: Optional[str] = None
    engine: str
    n_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    batch_size: int
    shard_size: int
    dtype: str
    tensor_parallel_size: int
    data_parallel_size: int
    gpu_memory_utilization: float
    kv_cache_gib: Optional[float] = None
    max_model_len: Optional[int] = None
    enforce_eager: bool = False
    grader: Optional[str] = None
    overwrite: bool = False
    no_progress: bool = False
    # hand use only (`repexp eval`); None: the stage's default
    split: Optional[str] = None
    checkpoint_step: Optional[int] = None
    limit: Optional[int] = None
    top_k: Optional[int] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    no_prefix_caching: bool = False
    chunked_prefill: str = "auto"
    ks: Optional[tuple[int, ...]] = None
    maj_draws: Optional[int] = None
    verifier_workers: Optional[int] = None
    max_shards: Optional[int] = None

    def outputs(self) -> list[str]:
        return [str(Path(self.out) / L.EVAL_JSON)]


@dataclass(frozen=True, kw_only=True)
class TesttimeJob(_Identity):
    eval_dir: str
    model: str
    out: str
    sparse_dim: int
    projection_seed: int
    lamb: float
    center: bool
    batch_size: int
    dtype: str
    bootstrap: int
    # hand use only (`repexp testtime`)
    data: Optional[str] = None
    device: str = "auto"
    reference_ks: Optional[tuple[int, ...]] = None
    bootstrap_seed: int = 0

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
    data = cfg.data
    return PreprocessJob(
        task=task, out=str(L.data_dir(cfg.results_dir, task)), source=data.source, seed=data.split_seed,
        limit_train=data.limit_train, limit_dev=data.limit_dev, limit_test=data.limit_test,
        dapo_source=data.dapo_source if task == DAPO_TASK else None,
    )


def _select(cfg, spec: C.RunSpec, rc: C.RunConfig) -> SelectJob:
    return SelectJob(task=spec.task, run=spec.name, run_dir=rc.run_dir, backend=spec.backend,
                     out=str(Path(rc.run_dir) / L.SELECT))


def _merge(cfg, spec: C.RunSpec, rc: C.RunConfig) -> MergeJob:
    return MergeJob(task=spec.task, run=spec.name, pointer=str(Path(rc.run_dir) / L.SELECT),
                    out=str(Path(rc.run_dir) / L.MERGED))


def _eval(cfg, spec: C.RunSpec, rc: C.RunConfig) -> EvalJob:
    """A trained run samples the model its pointer names (merged for verl); `base`, the initial policy."""
    ev = rc.eval
    pointer = str(Path(rc.run_dir) / (L.MERGED if spec.backend == "verl" else L.SELECT)) if spec.trains else None
    return EvalJob(
        task=rc.task, run=spec.name, data=str(L.data_file(cfg.results_dir, spec.task, "test")),
        out=str(L.eval_json(cfg.results_dir, spec.task, spec.name).parent),
        model=None if pointer else rc.model, model_pointer=pointer,
        engine=ev.engine, n_samples=ev.n_samples, temperature=ev.temperature, top_p=ev.top_p,
        max_new_tokens=ev.max_new_tokens, seed=rc.seed, batch_size=ev.batch_size, shard_size=ev.shard_size,
        dtype=ev.dtype, tensor_parallel_size=ev.tensor_parallel_size, data_parallel_size=ev.data_parallel_size,
        gpu_memory_utilization=ev.gpu_memory_utilization, kv_cache_gib=ev.kv_cache_gib,
        max_model_len=ev.max_model_len, enforce_eager=ev.enforce_eager, grader=rc.grader,
        # the workflow reruns eval only when its settings changed: stale samples are discarded, not merged
        overwrite=True, no_progress=True,
    )


def _testtime(cfg, spec: C.RunSpec, rc: C.RunConfig) -> TesttimeJob:
    """λ and centring are the training bonus's; the feature model is `bonus.representation_model`,
    else the initial policy (as in training)."""
    tt, bonus = cfg.testtime, rc.bonus
    return TesttimeJob(
        task=spec.task, run=spec.name, eval_dir=str(L.eval_json(cfg.results_dir, spec.task, spec.name).parent),
        model=bonus.representation_model or rc.model,
        out=str(L.testtime_json(cfg.results_dir, spec.task, spec.name).parent),
        sparse_dim=tt.sparse_dim, projection_seed=tt.projection_seed, lamb=bonus.lamb, center=bonus.center,
        batch_size=tt.batch_size, dtype=tt.dtype, bootstrap=tt.bootstrap,
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
    runs = C.sweep_runs(cfg)
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


def from_args(cls: type, args: argparse.Namespace, **values: Any) -> Job:
    """A hand CLI's job: its options of the same names (paths as text, lists as tuples), then `values`."""
    def plain(value: Any) -> Any:
        return str(value) if isinstance(value, Path) else tuple(map(plain, value)) if isinstance(value, list) else value

    given = {f.name: plain(getattr(args, f.name)) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **values})
