"""The pipeline config: dataclasses, read as an OmegaConf structured config, one validation, one composition per job.

A package by job; this module re-exports their public API, so `from repexp import config as C` and
`C.load(...)`, `C.compose`, `C.TASKS`, `C.ConfigError`, ... read the same everywhere:

- `model`: the constants and dataclasses, the single source of the config's keys, types, defaults and
  per-field rules (`help`, `minimum`, `enum`, ... in each field's metadata), and `ConfigError`;
- `loading`: strict YAML and `parse`, which merges a YAML mapping (and `set=` dotlist overrides) into
  `OmegaConf.structured(PipelineConfig)`: unknown keys and wrong types fail naming the key, strings
  become numbers where the schema says so (`lr: 1e-5`, which YAML reads as a string, and Snakemake's
  `--config`, which passes strings), `task_overrides.<task>.<section>` are merged onto their section;
- `rules`: `check` applies the per-field rules and every cross-field rule of the pipeline and its two
  trainer backends, so a config that a job would reject fails at parse time, before any job;
  `check_paths` checks local paths (data sources, a local `model:` directory); `load` = read, parse, check;
- `runs`: the run names (`RUN_NAMES`, printed by `RunSpec.name`), the sweep's runs (`sweep_runs`,
  `find_run`, the Snakemake wildcard `run_pattern`), and `compose`, which resolves one job's
  `RunConfig` (defaults <- file <- task overrides <- sweep point), the only thing both trainer
  backends and the eval node read, with the training hash;
- `schema`: `configs/schema.yaml` (Snakemake's `validate`) is generated from the same dataclasses
  (`repexp config schema`), and a test keeps the committed copy in sync.

The modules import one another in that order (model <- loading <- runs <- rules; schema <- model),
never back; `rules` and `repexp.plan` import each other (the cost rule), the package's one circle.

Pure: OmegaConf and PyYAML only (imported where used).
"""

from repexp.config.loading import (
    as_dict,
    dump_yaml,
    parse,
    parse_files,
    read_yaml,
    split_overrides,
    to_dataclass,
)
from repexp.config.model import (
    ATTENTION,
    BACKENDS,
    DEAD_VERL_KEY_PREFIXES,
    DTYPES,
    ENGINES,
    GENERATED_TASKS,
    LOSS_AGG_MODES,
    MAX_SAMPLES_PER_PROBLEM,
    MAX_SHARD_SAMPLES,
    METHODS,
    MODEL_ALIASES,
    NORMALIZATIONS,
    OVERRIDES_KEY,
    REMOVED_KEYS,
    REWARD_TYPES,
    RULES,
    SECTIONS,
    TASKS,
    TRACKING_SCHEMES,
    TRAIN_RETRIES,
    TRL_DTYPES,
    TRL_LOSS_TYPES,
    VERL_STRATEGIES,
    BonusConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    PipelineConfig,
    RuleResources,
    SweepConfig,
    TaskOverride,
    TaskSweepOverride,
    TesttimeConfig,
    TrackingConfig,
    TrainConfig,
    TrlConfig,
    VerlConfig,
)
from repexp.config.rules import (
    check,
    check_bonus,
    check_fields,
    check_paths,
    check_repexp_micro_batch,
    check_save_freq,
    check_tracking_uri,
    check_train_batches,
    check_trains,
    check_trl_loss,
    check_value,
    check_verl_overrides,
    load,
    model_kind,
    trl_micro_batch,
)
from repexp.config.runs import (
    MODEL_ALIAS_PATTERN,
    RUN_NAMES,
    TASK_PATTERN,
    RunConfig,
    RunSpec,
    canonical,
    compose,
    config_hash,
    find_run,
    load_run_config,
    max_new_tokens,
    parse_run,
    resolve_model,
    rule_resources,
    run_pattern,
    sweep_runs,
    task_section,
    task_sweep,
    training_hash,
)
from repexp.config.schema import json_schema

# The public API, module by module: everything `from repexp import config as C` offered before the split.
__all__ = [
    "ATTENTION", "BACKENDS", "DEAD_VERL_KEY_PREFIXES", "DTYPES", "ENGINES", "GENERATED_TASKS", "LOSS_AGG_MODES",
    "MAX_SAMPLES_PER_PROBLEM", "MAX_SHARD_SAMPLES", "METHODS", "MODEL_ALIASES", "NORMALIZATIONS", "OVERRIDES_KEY",
    "REMOVED_KEYS", "REWARD_TYPES", "RULES", "SECTIONS", "TASKS", "TRACKING_SCHEMES", "TRAIN_RETRIES", "TRL_DTYPES",
    "TRL_LOSS_TYPES", "VERL_STRATEGIES", "BonusConfig", "ConfigError", "DataConfig", "EvalConfig", "PipelineConfig",
    "RuleResources", "SweepConfig", "TaskOverride", "TaskSweepOverride", "TesttimeConfig", "TrackingConfig",
    "TrainConfig", "TrlConfig", "VerlConfig", "as_dict", "dump_yaml", "parse", "parse_files", "read_yaml",
    "split_overrides", "to_dataclass",
    "check", "check_bonus", "check_fields", "check_paths", "check_repexp_micro_batch",
    "check_save_freq", "check_tracking_uri", "check_train_batches", "check_trains", "check_trl_loss", "check_value",
    "check_verl_overrides", "load", "model_kind", "trl_micro_batch", "MODEL_ALIAS_PATTERN", "RUN_NAMES",
    "TASK_PATTERN", "RunConfig", "RunSpec", "canonical", "compose",
    "config_hash", "find_run", "load_run_config", "max_new_tokens", "parse_run", "resolve_model", "rule_resources",
    "run_pattern", "sweep_runs",
    "task_section", "task_sweep", "training_hash", "json_schema",
]
