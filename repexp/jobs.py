"""Typed jobs: what one per-task / per-run stage runs, composed once from the config snapshot.

    config snapshot ($REPEXP_CONFIG) + identity (rule, task, run)
      compose()    -> PreprocessJob | TrainJob | SelectJob | MergeJob | EvalJob | TesttimeJob
                      settings: the composed per-run config (repexp.config.compose; `data`/`testtime`
                      from the pipeline config), paths: repexp.layout, identity: the config's run of
                      that name (repexp.config.find_run; a name is never parsed back)
      run_job()    -> the stage core: repexp.data | checkpoints | evaluate | testtime (merge: run_cli.run_merge;
                      train: repexp.train.run_node, its own node, as its trainer is a subprocess)
      .outputs()   -> the rule's declared outputs, which the MLflow node logs (repexp.run_cli)
      job_hash()   -> Snakemake's params of the rule: a settings change reruns exactly its jobs (train's:
                      repexp.config.training_hash)

`repexp run RULE --task T [--run R]` (repexp.run_cli) is the workflow's one command for these rules;
the hand CLIs (`repexp eval`, `repexp testtime`, `repexp select`, `repexp data prepare`) build the
same job from their flags (`from_args`) and call the same `run_job`. Fields named as the hand CLIs'
options; a field left None by the pipeline means "the stage's own default".

Cheap to import (every Snakemake invocation hashes jobs in common.smk): no numpy, torch or MLflow.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from repexp import config as C
from repexp import layout as L

DAPO_TASK = "dapo-with-aime24"  # the one task that reads data.dapo_source


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
class SelectJob:
    run_dir: str
    backend: str
    out: str
    task: Optional[str] = None
    run: Optional[str] = None

    def outputs(self) -> list[str]:
        return [self.out]


@dataclass(frozen=True, kw_only=True)
class MergeJob:
    pointer: str
    out: str
    task: Optional[str] = None
    run: Optional[str] = None

    def outputs(self) -> list[str]:
        return [self.out]


@dataclass(frozen=True, kw_only=True)
class EvalJob:
    data: Optional[str]
    out: str
    model: Optional[str] = None  # exactly one of model and model_pointer
    model_pointer: Optional[str] = None
    task: Optional[str] = None
    run: Optional[str] = None
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
class TesttimeJob:
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
    task: Optional[str] = None
    run: Optional[str] = None
    # hand use only (`repexp testtime`)
    data: Optional[str] = None
    device: str = "auto"
    reference_ks: Optional[tuple[int, ...]] = None
    bootstrap_seed: int = 0

    def outputs(self) -> list[str]:
        return [str(Path(self.out) / L.TESTTIME_JSON)]


Job = Union[PreprocessJob, TrainJob, SelectJob, MergeJob, EvalJob, TesttimeJob]


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


# rule -> (composer, "module:function" of the stage core that takes the job)
RULES = {
    "preprocess": (_preprocess, "repexp.data:run_job"),
    "train": (lambda cfg, spec, rc: TrainJob(config=rc), "repexp.train:run_node"),  # its own node (run_cli)
    "select": (_select, "repexp.checkpoints:run_job"),
    "merge": (_merge, "repexp.run_cli:run_merge"),  # repexp.verl.merge (the verl side's) keeps its CLI
    "eval": (_eval, "repexp.evaluate:run_job"),
    "testtime": (_testtime, "repexp.testtime:run_job"),
}


def compose(cfg: C.PipelineConfig, rule: str, task: str, run: Optional[str] = None, *,
            run_config: Optional[C.RunConfig] = None, cfg_hash: Optional[str] = None) -> Job:
    """The job of one rule for one task (preprocess) or run; raises ConfigError naming a bad rule,
    task or run. `run_config`: `C.compose`'s result when the caller has it (the workflow caches it)."""
    if rule not in RULES:
        raise C.ConfigError(f"rule: {rule!r} is not a rule `repexp run` knows; choose from {', '.join(RULES)}")
    composer, _ = RULES[rule]
    if rule == "preprocess":
        if run is not None:
            raise C.ConfigError(f"run: preprocess prepares a task's data; it takes no run (got {run!r})")
        if task not in cfg.sweep.tasks:
            raise C.ConfigError(f"task: {task!r} is not one of this config's sweep.tasks "
                                f"({', '.join(cfg.sweep.tasks)})")
        return composer(cfg, task)
    if run is None:
        raise C.ConfigError(f"run: the {rule} rule needs --run")
    spec = C.find_run(cfg, task, run)
    if rule in ("train", "select", "merge") and not spec.trains:
        raise C.ConfigError(f"run: {task}/{run} trains nothing, so it has no {rule} job")
    if rule == "merge" and spec.backend != "verl":
        raise C.ConfigError(f"run: {task}/{run} is not a verl run; only verl checkpoints are merged")
    rc = run_config or C.compose(cfg, spec, cfg_hash=cfg_hash)
    return composer(cfg, spec, rc)


def run_job(rule: str, job: Job) -> int:
    """Run the stage in this process (`repexp run --stage-only`, the node's child)."""
    module, function = RULES[rule][1].split(":")
    return int(getattr(importlib.import_module(module), function)(job) or 0)


def params(job: Job) -> dict[str, Any]:
    """The job's fields for MLflow, nested under `job` (repexp.tracking.node.flatten makes them `job.<field>`
    params and leaves unset ones out)."""
    return {"job": dataclasses.asdict(job)}


def job_hash(job: Job) -> str:
    if isinstance(job, TrainJob):
        return C.training_hash(job.config)
    blob = json.dumps(dataclasses.asdict(job), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def from_args(cls: type, args: argparse.Namespace, **values: Any) -> Job:
    """A hand CLI's job: its options of the same names (paths as text), then `values`."""
    fields = {f.name for f in dataclasses.fields(cls)}
    given = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    given.update(values)
    return cls(**{name: str(value) if isinstance(value, Path) else value for name, value in given.items()})
