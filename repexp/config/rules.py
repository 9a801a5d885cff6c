"""Every rule of the pipeline config, each written once, and `load` (read, parse, check).

`check` applies the per-field rules (the dataclass metadata the JSON schema also states) and every
cross-field rule of the pipeline and both trainer backends, plus the cost rule
(`repexp.plan.check_runtimes`); the `check_*` functions the trainers share are re-applied where a
trainer starts without a checked pipeline config; `check_paths` checks local paths. `load` lives
here so that `repexp.plan` imports this module, not the package: the one circle is rules <-> plan.
Pure: OmegaConf and PyYAML only (through `repexp.config.loading`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from repexp import gpus as G
from repexp.config.loading import parse, read_configs, to_dataclass
from repexp.config.model import (
    DEAD_VERL_KEY_PREFIXES,
    GENERATED_TASKS,
    MAX_SHARD_SAMPLES,
    MODEL_ALIASES,
    SECTIONS,
    TRACKING_SCHEMES,
    TRL_LOSS_TYPES,
    TRL_VLLM_MEMORY_PART,
    VLLM_MEMORY_UTILIZATION,
    BonusConfig,
    ConfigError,
    PipelineConfig,
    RuleResources,
    TrainConfig,
    TrlConfig,
)
from repexp.config.runs import RunConfig, canonical, grid_points, rule_resources, task_section, task_sweep
from repexp.methods import METHODS as METHODS_TABLE

# --------------------------------------------------------------------------- rules


def _check_constraints(key: str, value: Any, meta: Mapping) -> None:
    if "enum" in meta and value not in meta["enum"]:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, meta['enum']))}")
    if "minimum" in meta and value < meta["minimum"]:
        raise ConfigError(f"{key}: {value!r} is below the minimum {meta['minimum']}")
    if "exclusiveMinimum" in meta and value <= meta["exclusiveMinimum"]:
        raise ConfigError(f"{key}: {value!r} must be greater than {meta['exclusiveMinimum']}")
    if "maximum" in meta and value > meta["maximum"]:
        raise ConfigError(f"{key}: {value!r} is above the maximum {meta['maximum']}")
    if "pattern" in meta and not re.match(meta["pattern"], value):
        raise ConfigError(f"{key}: {value!r} does not match {meta['pattern']}")


def check_value(key: str, value: Any, cls: type, name: str) -> None:
    """The per-field rules of `cls.name` applied to a value read elsewhere under `key` (a trainer's own
    config node with the same setting), so the rule is not restated there."""
    _check_constraints(key, value, next(f.metadata for f in dataclasses.fields(cls) if f.name == name))


def _check_items(key: str, values: list, meta: Mapping) -> None:
    """A list field's `items_*` rules (what the schema's `items` says) on each of its values."""
    item_meta = {k[len("items_"):]: v for k, v in meta.items() if k.startswith("items_")}
    for i, item in enumerate(values):
        _check_constraints(f"{key}[{i}]", item, item_meta)


def check_fields(obj: Any, prefix: str = "") -> None:
    """The per-field rules of the dataclass metadata (what the JSON schema says), recursively."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
        elif isinstance(value, dict):
            unknown = sorted(set(value) - set(f.metadata.get("keys", value)))  # `keys`: the names it may have
            if unknown:
                raise ConfigError(f"{key}.{unknown[0]}: unknown name (known: {', '.join(f.metadata['keys'])})")
            for name, item in value.items():
                if dataclasses.is_dataclass(item):
                    check_fields(item, f"{key}.{name}.")
        elif isinstance(value, list):
            _check_items(key, value, f.metadata)
        elif value is not None:
            _check_constraints(key, value, f.metadata)


def setting_key(cfg: PipelineConfig, task: str, section: str, name: str) -> str:
    """Where a task's effective `<section>.<name>` comes from: its task override, else the section."""
    override = cfg.task_overrides.get(task)
    if override is not None and name in getattr(override, section):
        return f"task_overrides.{task}.{section}.{name}"
    return f"{section}.{name}"


def check(cfg: PipelineConfig) -> None:
    """Every rule a job would otherwise apply later: per-field rules, then cross-field rules of the
    sweep, the trainer backends, evaluation, tracking and the scheduler requests. Raises ConfigError."""
    check_fields(cfg)
    for task, override in cfg.task_overrides.items():  # check_fields(cfg) covered each override's sweep
        for section in SECTIONS:
            if getattr(override, section):
                check_fields(task_section(cfg, task, section), f"task_overrides.{task}.{section}.")
    _check_sweep(cfg)
    if cfg.data.dapo_source is None and "dapo-with-aime24" in cfg.sweep.tasks:
        raise ConfigError("data.dapo_source: required when sweep.tasks contains dapo-with-aime24")
    if any("repexp" in task_sweep(cfg, task) for task in cfg.sweep.tasks):
        check_bonus(cfg.bonus)
    check_tracking_uri(cfg.tracking.tracking_uri)
    for task in cfg.sweep.tasks:
        _check_training(cfg, task)
        _check_eval(cfg, task)
    for rule, res in cfg.resources.items():
        if res.gpu_model is not None and res.gpu == 0:
            raise ConfigError(f"resources.{rule}.gpu_model: {res.gpu_model!r} asks for a GPU type, but "
                              f"resources.{rule}.gpu is 0 (the job asks for no GPU)")
    from repexp.plan import check_runtimes  # the cost plan: a GPU job must fit its allocation

    check_runtimes(cfg)


def _check_sweep(cfg: PipelineConfig) -> None:
    for name in ("tasks", "backends", "seeds"):
        values = getattr(cfg.sweep, name)
        if len(set(map(canonical, values))) != len(values):
            raise ConfigError(f"sweep.{name}: duplicate values {values}")
        if name in ("tasks", "seeds") and not values:
            raise ConfigError(f"sweep.{name}: must not be empty")
    if cfg.sweep.parts > len(cfg.sweep.seeds):
        raise ConfigError(f"sweep.parts: {cfg.sweep.parts} parts of {len(cfg.sweep.seeds)} seeds (sweep.seeds) "
                          "would leave a part without a seed")
    if cfg.sweep.part is not None and cfg.sweep.part > cfg.sweep.parts:
        raise ConfigError(f"sweep.part: {cfg.sweep.part} is not one of the sweep's parts 1..{cfg.sweep.parts} "
                          "(sweep.parts)")
    for task in cfg.sweep.tasks:
        grids = task_sweep(cfg, task)
        train = task_section(cfg, task, "train")
        for method, grid in grids.items():
            _check_grid(cfg, task, method, grid, train)
        if not cfg.sweep.backends and any(grid_points(m, g) for m, g in grids.items()):
            raise ConfigError("sweep.backends: must not be empty when training runs are requested")


def _grid_key(cfg: PipelineConfig, task: str, method: str, name: str) -> str:
    """Where a task's grid of `method.name` comes from: its task override, else sweep.methods."""
    override = cfg.task_overrides.get(task)
    patch = override.sweep.methods.get(method) if override is not None else None
    if patch and name in patch:
        return f"task_overrides.{task}.sweep.methods.{method}.{name}"
    return f"sweep.methods.{method}.{name}"


def _check_grid(cfg: PipelineConfig, task: str, method: str, grid: Any, train: TrainConfig) -> None:
    """A method's grid: per-item bounds (task overrides too), no duplicates, several values only for the
    parameters in its run name, and the method's own rules against the task's `train` section."""
    entry = METHODS_TABLE[method]
    named = entry.named_fields()
    for f in dataclasses.fields(grid):
        values, key = getattr(grid, f.name), _grid_key(cfg, task, method, f.name)
        _check_items(key, values, f.metadata)  # a task override's lists too, which check_fields(cfg) does not see
        if len(set(map(canonical, values))) != len(values):
            raise ConfigError(f"{key}: duplicate values {values}")
        if f.name not in named and len(values) != 1:
            raise ConfigError(f"{key}: one value only ({f.name} is not part of the run name, so runs that differ "
                              f"in it would share one; it has {len(values)})")
    for point in grid_points(method, grid):
        message = entry.check(entry.make(dict(point)), train) if entry.check else None
        if message:
            name = message.split(":", 1)[0]
            raise ConfigError(f"{_grid_key(cfg, task, method, name)}:{message.split(':', 1)[1]} (task {task})")


def check_bonus(bonus: BonusConfig, where: str = "bonus") -> None:
    """Rules of the bonus settings (both backends apply the same ones)."""
    if bonus.persist_covariance and bonus.reward_type != "leverage":
        raise ConfigError(f"{where}.persist_covariance: a persistent covariance supports reward_type 'leverage' only")
    if bonus.persist_covariance and bonus.randomize_projection:
        raise ConfigError(f"{where}.persist_covariance: needs {where}.randomize_projection=false "
                          "(accumulating features of different projections is meaningless)")


def check_tracking_uri(uri: Optional[str], key: str = "tracking.tracking_uri") -> None:
    if uri is None or uri == "databricks":  # MLflow's shorthand for the default Databricks profile
        return
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()  # postgresql+psycopg2://... names a driver
    if scheme not in TRACKING_SCHEMES or ":" not in uri:
        raise ConfigError(f"{key}: {uri!r} has no known scheme (use one of {', '.join(TRACKING_SCHEMES)}, "
                          "e.g. http://HOST:PORT or sqlite:///PATH)")


def _check_training(cfg: PipelineConfig, task: str) -> None:
    train = task_section(cfg, task, "train")
    key = lambda name: setting_key(cfg, task, "train", name)  # noqa: E731
    check_train_batches(train, key)
    runtime = rule_resources(cfg, "train").runtime
    if train.walltime_margin_minutes >= runtime:
        raise ConfigError(f"{key('walltime_margin_minutes')}: {canonical(train.walltime_margin_minutes)} min leaves "
                          f"nothing of resources.train.runtime {runtime} min to train in; lower it")
    repexp_runs = "repexp" in task_sweep(cfg, task)
    if "trl" in cfg.sweep.backends:
        check_trl_loss(train, key)
        trl_micro_batch(train, key)
        if task_section(cfg, task, "trl").device != "cpu":
            _check_share(cfg, task, "train", "trl", "gpu_memory_fraction")
        trl_key = lambda name: setting_key(cfg, task, "trl", name)  # noqa: E731
        check_trl_rollout(task_section(cfg, task, "trl"), trl_key)
        if task_section(cfg, task, "trl").rollout_engine == "vllm" and not rule_resources(cfg, "train").gpu:
            raise ConfigError(f"{trl_key('rollout_engine')}: 'vllm' generates on a GPU, but resources.train.gpu is 0 "
                              "(the train job asks for none); use 'hf'")
    if "verl" in cfg.sweep.backends:
        _check_verl(cfg, task, train, repexp_runs=repexp_runs)
        _check_share(cfg, task, "train", "verl", "gpu_memory_utilization")


def _check_verl(cfg: PipelineConfig, task: str, train: TrainConfig, repexp_runs: bool) -> None:
    """verl must be told the allocation the scheduler grants the train rule, and its batch shapes must fit it."""
    res = rule_resources(cfg, "train")
    verl = task_section(cfg, task, "verl")
    key = lambda name: setting_key(cfg, task, "verl", name)  # noqa: E731
    if verl.nnodes != res.nodes:
        raise ConfigError(f"resources.train.nodes: {res.nodes} differs from {key('nnodes')} {verl.nnodes} "
                          f"(task {task})")
    if res.gpu and verl.n_gpus_per_node != res.gpu:
        raise ConfigError(f"resources.train.gpu: {res.gpu} differs from {key('n_gpus_per_node')} "
                          f"{verl.n_gpus_per_node} (task {task})")
    if verl.ray_num_cpus is not None and res.nodes > 1:
        raise ConfigError(f"{key('ray_num_cpus')}: must be null for multi-node training: ray_slurm.sh starts Ray "
                          "with resources.train.cpus_per_task per node and verl joins that cluster")
    if verl.ray_num_cpus is not None and verl.ray_num_cpus > res.cpus_per_task:
        raise ConfigError(f"{key('ray_num_cpus')}: {verl.ray_num_cpus} exceeds the {res.cpus_per_task} CPUs of "
                          "resources.train.cpus_per_task")
    gpus = verl.n_gpus_per_node * verl.nnodes
    if gpus % verl.rollout_tensor_parallel_size:
        raise ConfigError(f"{key('rollout_tensor_parallel_size')}: {verl.rollout_tensor_parallel_size} does not "
                          f"divide the {gpus} GPUs of a training job (n_gpus_per_node × nnodes)")
    longest = train.max_prompt_length + train.max_response_length
    if verl.dynamic_batch_tokens is not None and verl.dynamic_batch_tokens < longest:
        raise ConfigError(f"{key('dynamic_batch_tokens')}: {verl.dynamic_batch_tokens} tokens cannot hold one "
                          f"sequence of train.max_prompt_length + train.max_response_length = {longest} tokens")
    if repexp_runs:
        check_repexp_micro_batch(verl.repexp_micro_batch_size_per_gpu, gpus,
                                 train.ppo_mini_batch_size * train.n_rollouts, key("repexp_micro_batch_size_per_gpu"))
    check_verl_overrides(verl.overrides, key("overrides"))


# --------------------------------------------------------------------------- rules the trainers share
# Each rule below is written once. `check` applies it to every task of a pipeline config, naming the
# key a value came from (a task override's own key where it set one). A trainer re-applies the same
# function only where it can be started without a checked pipeline config: the TRL trainer on a
# job.yaml (`repexp.trl.settings.check_run_config`), `repexp.verl.overrides.build_overrides` on a
# RunConfig, and ``python -m repexp.verl.train`` on verl's Hydra config (under verl's key names).


def _in_section(section: str) -> typing.Callable[[str], str]:
    """The key names of a RunConfig's section (`train.save_freq`), the trainers' default."""
    return lambda name: f"{section}.{name}"


def check_trains(rc: RunConfig, backend: str) -> None:
    """A job the `backend` trainer can train: its own backend, and a sweep point that trains."""
    if rc.backend != backend:
        raise ConfigError(f"backend: run {rc.run} is a {rc.backend!r} run, not a {backend} run")
    if rc.method not in METHODS_TABLE:
        raise ConfigError(f"method: {rc.method!r} runs do not train (training methods: {', '.join(METHODS_TABLE)}; "
                          "'base' runs evaluate the initial model)")
    check_method_params(rc.method, rc.params, rc.train, "params")


def check_method_params(method: str, params: Mapping[str, Any], train: TrainConfig, where: str) -> Any:
    """A method's parameters read outside a checked config (a job.yaml, a trainer's node): known fields of
    its `Params`, each within its bounds, and the method's rules against `train`. Returns the `Params`."""
    entry = METHODS_TABLE[method]
    known = {f.name: f for f in entry.fields()}
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown parameter of {method} (known: {', '.join(known) or 'none'})")
    settings = to_dataclass(entry.params, dict(params), prefix=f"{where}.")
    for name, f in known.items():
        _check_constraints(f"{where}.{name}", getattr(settings, name), f.metadata)
    message = entry.check(settings, train) if entry.check else None
    if message:
        raise ConfigError(f"{where}.{message}")
    return settings


def check_train_batches(train: TrainConfig, key: typing.Callable[[str], str] = _in_section("train")) -> None:
    """The step shape both backends rely on: whole PPO mini-batches per step, a checkpoint at every validation."""
    if train.train_batch_size % train.ppo_mini_batch_size:
        raise ConfigError(f"{key('ppo_mini_batch_size')}: {train.ppo_mini_batch_size} does not divide "
                          f"train_batch_size {train.train_batch_size}")
    check_save_freq(train.save_freq, train.test_freq, key("save_freq"), key("test_freq"))


def check_save_freq(save_freq: int, test_freq: int, key: str, test_key: str) -> None:
    """Every validated step must have a checkpoint: `repexp select` picks the best dev step's. A test_freq
    ≤ 0 (verl's "no validation"; the pipeline config's minimum is 1) needs none."""
    if test_freq > 0 and (save_freq <= 0 or test_freq % save_freq):
        raise ConfigError(f"{key}: {save_freq} must divide {test_key} {test_freq} so that every validated step "
                          "has a checkpoint to select")


def check_trl_loss(train: TrainConfig, key: typing.Callable[[str], str] = _in_section("train")) -> None:
    if train.loss_agg_mode not in TRL_LOSS_TYPES:
        raise ConfigError(f"{key('loss_agg_mode')}: {train.loss_agg_mode!r} has no TRL equivalent "
                          f"(the TRL backend supports {', '.join(TRL_LOSS_TYPES)})")


def trl_vllm_memory_utilization(trl: TrlConfig) -> float:
    """vLLM's gpu_memory_utilization (a fraction of the WHOLE GPU) for a `trl.rollout_engine: vllm` training:
    `trl.vllm_gpu_memory_utilization`, else TRL_VLLM_MEMORY_PART of the training's own cap
    (`trl.gpu_memory_fraction`, which `resolve_gpus` sets from resources.train.gpu_share), or of the whole GPU."""
    if trl.vllm_gpu_memory_utilization is not None:
        return trl.vllm_gpu_memory_utilization
    return round(TRL_VLLM_MEMORY_PART * (trl.gpu_memory_fraction or 1.0), 6)


def check_trl_rollout(trl: TrlConfig, key: typing.Callable[[str], str] = _in_section("trl")) -> None:
    """A `vllm` rollout engine generates on the training's GPU, within the training's memory cap."""
    if trl.rollout_engine != "vllm":
        return
    if trl.device == "cpu":
        raise ConfigError(f"{key('rollout_engine')}: 'vllm' generates on a GPU, but {key('device')} is 'cpu'; "
                          "use 'hf' on a CPU")
    fraction, utilization = trl.gpu_memory_fraction, trl_vllm_memory_utilization(trl)
    if fraction is not None and utilization > fraction + 1e-9:
        raise ConfigError(f"{key('vllm_gpu_memory_utilization')}: {utilization:g} of the GPU for the rollout engine, "
                          f"but the training's whole cap {key('gpu_memory_fraction')} is {fraction:g} (the engine "
                          f"lives in the training's process, inside that cap); set it to at most {fraction:g}")


def check_trl_rollout_host(trl: TrlConfig, *, cuda: bool, vllm: bool, where: str,
                           key: typing.Callable[[str], str] = _in_section("trl")) -> None:
    """The machine that runs a `vllm` rollout engine has a CUDA GPU and the vllm package (`where` says which
    machine, for the message). The pipeline applies it before the first job on the host that runs them; the
    trainer at its start."""
    if trl.rollout_engine != "vllm" or trl.device == "cpu":
        return
    if not cuda:
        raise ConfigError(f"{key('rollout_engine')}: 'vllm' generates on a CUDA GPU, but {where} has none; "
                          "use 'hf' (transformers' generate) here")
    if not vllm:
        raise ConfigError(f"{key('rollout_engine')}: 'vllm' needs the vllm package, which {where} cannot import; "
                          "install it (the offline GPU stack has it) or use 'hf'")


def trl_micro_batch(train: TrainConfig, key: typing.Callable[[str], str] = _in_section("train")) -> int:
    """Sequences per TRL forward/backward: `micro_batch_size_per_gpu`, at most one PPO mini-batch, which it
    must split into whole micro-batches (TRL accumulates gradients over them)."""
    sequences = train.ppo_mini_batch_size * train.n_rollouts
    micro = min(train.micro_batch_size_per_gpu, sequences)
    if sequences % micro:
        raise ConfigError(f"{key('micro_batch_size_per_gpu')}: {micro} does not divide the {sequences} sequences of "
                          f"a PPO mini-batch (ppo_mini_batch_size {train.ppo_mini_batch_size} × n_rollouts "
                          f"{train.n_rollouts})")
    return micro


def check_repexp_micro_batch(micro: int, gpus: int, mini_batch_sequences: int, key: str, remedy: str = "") -> None:
    """verl pads each step to a multiple of lcm(dp, mini-batch); every rank's share must split into the
    bonus forward's micro-batches (`remedy`: what else fixes it where the caller has another way)."""
    per_rank = math.lcm(gpus, mini_batch_sequences) // gpus
    if per_rank % micro:
        raise ConfigError(f"{key}: {micro} must divide the {per_rank} rows per GPU and mini-batch{remedy}")


def check_verl_overrides(overrides: Sequence[str], key: str) -> None:
    """A raw override of a key verl 0.9.1 accepts but ignores would be a silent no-op."""
    for raw in overrides:
        name = raw.lstrip("+~").split("=", 1)[0]
        if name.startswith(DEAD_VERL_KEY_PREFIXES):
            raise ConfigError(f"{key}: {name} is a legacy key verl 0.9.1 ignores")


def _check_eval(cfg: PipelineConfig, task: str) -> None:
    ev = task_section(cfg, task, "eval")
    res = rule_resources(cfg, "eval")
    if ev.shard_size * ev.n_samples > MAX_SHARD_SAMPLES:
        raise ConfigError(f"{setting_key(cfg, task, 'eval', 'shard_size')}: {ev.shard_size} problems × n_samples "
                          f"{ev.n_samples} = {ev.shard_size * ev.n_samples:,} samples in memory per shard, more than "
                          f"{MAX_SHARD_SAMPLES:,}; lower shard_size")
    if ev.ks and max(ev.ks) > ev.n_samples:
        raise ConfigError(f"{setting_key(cfg, task, 'eval', 'ks')}: k = {max(ev.ks)} needs n_samples ≥ k, "
                          f"not {ev.n_samples}")
    if ev.engine == "vllm" or (ev.engine == "auto" and res.gpu > 0):
        needed = ev.tensor_parallel_size * ev.data_parallel_size
        if needed > max(res.gpu, 1) * res.nodes:
            raise ConfigError(
                f"{setting_key(cfg, task, 'eval', 'tensor_parallel_size')}: {ev.tensor_parallel_size} × "
                f"data_parallel_size {ev.data_parallel_size} needs {needed} GPUs, but resources.eval.gpu grants "
                f"{res.gpu} (task {task})")
        _check_share(cfg, task, "eval", "eval", "gpu_memory_utilization")


def _check_share(cfg: PipelineConfig, task: str, rule: str, section: str, name: str) -> None:
    """A job that shares its GPU (resources.<rule>.gpu_share < 100) must cap its memory within its share."""
    share, fraction = gpu_share(cfg, rule), getattr(task_section(cfg, task, section), name)
    if share in (0, 100):
        return
    if fraction is None or fraction * 100 > share + 1e-9:
        raise ConfigError(
            f"{setting_key(cfg, task, section, name)}: {fraction} of the GPU's memory, but resources.{rule}.gpu_share "
            f"is {share}%: jobs side by side on one GPU would not fit; set it to at most {share / 100:g}")


# --------------------------------------------------------------------------- sharing GPUs


def gpu_share(cfg: PipelineConfig, rule: str) -> int:
    """resources.<rule>.gpu_share of a config `resolve_gpus` returned, as a number (0: the job has no GPU)."""
    res = rule_resources(cfg, rule)
    return int(res.gpu_share) if res.gpu else 0


def resolve_gpus(cfg: PipelineConfig, gpus: Sequence[G.Gpu] = ()) -> PipelineConfig:
    """The config with `gpu_share: auto` and the null memory caps made numbers for these GPUs (the host's
    that runs the jobs; none: a CPU machine or a cluster executor, where a job has whole GPUs). The rule is
    `repexp.gpus.auto_share`; a sharing job's cap left null is its share (trl.gpu_memory_fraction,
    eval.gpu_memory_utilization); numbers given in the config stay. A resolved config is returned as it is."""
    resources = {}
    for rule, res in cfg.resources.items():
        check_value(f"resources.{rule}.gpu_share", res.gpu_share, RuleResources, "gpu_share")
        if res.gpu_share == "auto" and res.gpu:  # a job without a GPU keeps `auto`: it shares nothing
            try:
                share = G.auto_share(res.gpu_memory_gib, gpus)
            except ValueError as err:
                raise ConfigError(f"resources.{rule}.gpu_memory_gib: {err} ({G.describe(gpus)}); lower it or "
                                  f"set resources.{rule}.gpu_share") from None
            res = dataclasses.replace(res, gpu_share=str(share))
        resources[rule] = res
    cfg = dataclasses.replace(cfg, resources=resources)
    caps = {("trl", "gpu_memory_fraction"): G.memory_cap(gpu_share(cfg, "train") or 100),
            ("eval", "gpu_memory_utilization"): G.memory_cap(gpu_share(cfg, "eval") or 100) or VLLM_MEMORY_UTILIZATION}
    sections = {}
    for (section, name), cap in caps.items():
        values = getattr(cfg, section)
        sections[section] = values if getattr(values, name) is not None else dataclasses.replace(values, **{name: cap})
    overrides = {}
    for task, override in cfg.task_overrides.items():  # a task's explicit null follows the share too
        patches = {section: {**getattr(override, section), name: getattr(sections[section], name)}
                   for section, name in caps if getattr(override, section).get(name, 0) is None}
        overrides[task] = dataclasses.replace(override, **patches) if patches else override
    return dataclasses.replace(cfg, **sections, task_overrides=overrides)


# --------------------------------------------------------------------------- local paths


def model_kind(value: str, root: str | Path = ".") -> str:
    """'alias' (built offline), 'hub' (a Hugging Face id, downloaded once) or 'local' (a directory).

    A value is a local path when it exists under `root`, is absolute, starts with `.` or `~`, has
    more than one `/`, or its first component is an existing directory under `root` (`models/x`);
    otherwise it must look like a hub id (`org/name` or `name`)."""
    if value in MODEL_ALIASES:
        return "alias"
    path = Path(value).expanduser()
    first = value.split("/", 1)[0]
    if (path.is_absolute() or value.startswith((".", "~")) or value.count("/") > 1 or value.endswith("/")
            or (Path(root) / path).exists() or ("/" in value and (Path(root) / first).is_dir())):
        return "local"
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", value) and ".." not in value:
        return "hub"
    raise ConfigError(f"{value!r} is neither a local directory nor a Hugging Face id (org/name)")


def check_paths(cfg: PipelineConfig, root: str | Path = ".") -> None:
    """Local inputs must exist before any job is scheduled (relative paths resolve against `root`)."""
    root = Path(root)

    def resolved(value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else root / path

    reads_files = any(task not in GENERATED_TASKS for task in cfg.sweep.tasks)
    for key, value in (("data.source", cfg.data.source), ("data.dapo_source", cfg.data.dapo_source)):
        if key == "data.source" and not reads_files:
            continue  # only generated tasks: nothing is read from it
        if value not in (None, "hf") and not resolved(value).exists():
            raise ConfigError(
                f"{key}: {os.path.normpath(resolved(value))} does not exist. Put the offline benchmark copies there "
                f"(README, 'Data'), or point {key} at a directory of JSONL files laid out like them, or set it to "
                f"'hf' to download them once from the Hugging Face Hub; on the command line: "
                f"--config set=\"{key}=/path/to/data\""
            )
    for key, value in (("model", cfg.model), ("bonus.representation_model", cfg.bonus.representation_model)):
        if value is None:
            continue
        try:
            kind = model_kind(value, root)
        except ConfigError as err:
            raise ConfigError(f"{key}: {err}") from None
        if kind == "local":
            path = resolved(value)
            if not path.is_dir():
                raise ConfigError(f"{key}: {path} does not exist (a local model directory; Hugging Face ids "
                                  "look like org/name)")
            if not (path / "config.json").is_file():
                raise ConfigError(f"{key}: {path} has no config.json (not a Hugging Face model directory)")


# --------------------------------------------------------------------------- read, parse, check


def load(path_or_dict: str | Path | Sequence[str | Path] | Mapping, *, overrides: Sequence[str] = (),
         gpus: Sequence[G.Gpu] = ()) -> PipelineConfig:
    """Read, parse and check a pipeline config (a YAML path, several merged in order as Snakemake's
    `--configfile A B` merges them, or an already-loaded mapping), its GPU shares resolved for `gpus`
    (`resolve_gpus`; none: whole GPUs)."""
    raw = path_or_dict if isinstance(path_or_dict, Mapping) else \
        read_configs([path_or_dict] if isinstance(path_or_dict, (str, Path)) else path_or_dict)
    cfg = resolve_gpus(parse({} if raw is None else raw, overrides=overrides), gpus)  # an empty file: all defaults
    check(cfg)
    return cfg
