"""The pipeline config: dataclasses, read as an OmegaConf structured config, one validation, one composition per job.

The dataclasses below are the single source of the config's keys, types, defaults and per-field
rules (`help`, `minimum`, `enum`, ... in each field's metadata):

- `parse` merges a YAML mapping (and `set=` dotlist overrides) into `OmegaConf.structured(PipelineConfig)`:
  unknown keys and wrong types fail naming the key, strings become numbers where the schema says so
  (`lr: 1e-5`, which YAML reads as a string, and Snakemake's `--config`, which passes strings),
  `task_overrides.<task>.<section>` are merged onto their section by `OmegaConf.merge`;
- `check` applies the per-field rules and every cross-field rule of the pipeline and its two
  trainer backends, so a config that a job would reject fails at parse time, before any job;
- `check_paths` checks local paths (data sources, a local `model:` directory);
- `compose` resolves one job's `RunConfig` (defaults <- file <- task overrides <- sweep point),
  the only thing both trainer backends and the eval node read;
- `configs/schema.yaml` (Snakemake's `validate`) is generated from the same dataclasses
  (`repexp config schema`), and a test keeps the committed copy in sync.

Pure: OmegaConf and PyYAML only (imported where used).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

from repexp import arith, layout
from repexp import bonus_defaults as B
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

GENERATED_TASKS = arith.TASKS  # built in (repexp.arith): read no data.source
TASKS = ("math", "gsm8k", "aime24", "dapo-with-aime24", *GENERATED_TASKS)
BACKENDS = ("trl", "verl")
METHODS = ("repexp", "grpo", "base")
REWARD_TYPES = B.REWARD_TYPES
NORMALIZATIONS = B.NORMALIZATIONS
ENGINES = ("auto", "hf", "vllm")
DTYPES = ("auto", "float32", "bfloat16", "float16")  # sampling and feature-model dtypes (auto: by device)
TRL_DTYPES = ("float32", "bfloat16")
ATTENTION = ("auto", "flash_attention_2", "sdpa", "eager")  # verl.attn_implementation (repexp.verl.attention)
VERL_STRATEGIES = ("fsdp", "fsdp2")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# train.loss_agg_mode → the TRL loss_type with the same normalisation (the TRL backend's one table):
#   token-mean: Σ token losses / number of tokens in the mini-batch  = TRL "dapo"
#   seq-mean-token-mean: mean over sequences of each sequence's token mean = TRL "grpo"
# seq-mean-token-sum has no TRL counterpart ("dr_grpo" divides by a constant instead).
TRL_LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}
# Every rule of the workflow (keys of `resources`).
RULES = ("download_model", "download_data", "model", "preprocess", "train", "select", "merge", "eval", "testtime",
         "aggregate", "figures")
# Sizes beyond any sensible experiment (issue 27: `n_samples: 1000000000000` validated, then the eval
# died with a MemoryError): pass@k curves need n ≥ k, the paper uses 256; one shard's samples are held
# in memory while it is generated.
MAX_SAMPLES_PER_PROBLEM = 2**16
MAX_SHARD_SAMPLES = 2**22
TRAIN_RETRIES = 2  # the train rule's `retries` for failures (a walltime chunk's end requeues, repexp.walltime)
# Keys that no longer exist, with what replaced them (their "unknown key" error says so).
REMOVED_KEYS = {
    "max_hours": "removed: the training budget is train.total_steps, the same for every arm; "
                 "resources.train.runtime is one allocation, which the trainer ends with a checkpoint "
                 "and a requeue (train.walltime_margin_minutes; docs/slurm.md, 'Walltime chunks')",
}
# MLflow tracking-URI schemes (database URIs may name a driver: postgresql+psycopg2://...).
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks")
# The `--config` key whose value is a dotlist of overrides: --config set="sweep.betas=[0.01,0.02] train.lr=2e-6"
OVERRIDES_KEY = "set"
# The legacy reward keys verl 0.9.1 still accepts but ignores (verl_0_9.md §4), and data keys the
# reward loop never reads: an override of one is a silent no-op, so `check_verl_overrides` refuses it.
DEAD_VERL_KEY_PREFIXES = ("custom_reward_function.", "reward_model.", "data.reward_fn_key")


class ConfigError(ValueError):
    """An invalid pipeline config; the message starts with the offending key (or file)."""


def _f(default: Any = dataclasses.MISSING, *, help: str = "", runtime: bool = False, **constraints: Any) -> Any:
    """A dataclass field with a help string and JSON-schema constraints (minimum, enum, ...).

    `runtime=True` marks a setting that changes how fast or where a job runs, never what a
    training run computes: it is left out of `training_hash`, so changing it reruns nothing."""
    meta = {"help": help, **constraints}
    if runtime:
        meta["runtime"] = True
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    source: str = _f("../shared/data", help="directory of JSONL files, or 'hf' for the Hugging Face ids "
                     "(downloaded once on the submit host by the download_data rule)")
    split_seed: int = _f(0, help="seed of the GSM8K dev/test split and of subsets", minimum=0)
    limit_train: Optional[int] = _f(None, help="seeded train subset size (null: all)", minimum=1)
    limit_dev: Optional[int] = _f(None, help="seeded dev subset size (null: all)", minimum=1)
    limit_test: Optional[int] = _f(None, help="seeded test subset size (null: all)", minimum=1)
    dapo_source: Optional[str] = _f(None, help="DAPO training set: JSONL path or 'hf' (dapo-with-aime24 only)")


@dataclass
class SweepConfig:
    tasks: list[str] = _f(["math"], help="tasks to run", items_enum=TASKS)
    backends: list[str] = _f(["trl"], help="trainer backends", items_enum=BACKENDS)
    sparse_dims: list[int] = _f([B.SPARSE_DIM], help="projection dimensions (RepExp runs)", items_minimum=1)
    betas: list[float] = _f([B.BETA], help="bonus weights β > 0 (RepExp runs; GRPO is the β = 0 baseline)",
                            items_exclusiveMinimum=0)
    seeds: list[int] = _f([42], help="training and sampling seeds", items_minimum=0)
    grpo_baseline: bool = _f(True, help="also train GRPO (β = 0) for every task × backend × seed")
    base_baseline: bool = _f(True, help="also evaluate the untrained base model per task")


@dataclass
class BonusConfig:
    # Defaults: repexp.bonus_defaults (shared with the verl node and the bonus maths).
    lamb: float = _f(B.LAMB, help="ridge λ of A = λI + Σ x xᵀ", exclusiveMinimum=0)
    reward_type: str = _f(B.REWARD_TYPE, help="bonus form", enum=REWARD_TYPES)
    normalization: str = _f(B.NORMALIZATION, help="per-group bonus normalization", enum=NORMALIZATIONS)
    center: bool = _f(B.CENTER, help="centre features by the group mean")
    randomize_projection: bool = _f(B.RANDOMIZE_PROJECTION,
                                    help="draw a new projection every step (seeded by seed and step)")
    persist_covariance: bool = _f(B.PERSIST_COVARIANCE, help="accumulate per-prompt covariance across steps "
                                  "(needs reward_type leverage and randomize_projection false)")
    alpha: float = _f(B.ALPHA, help="verifier reward weight α", minimum=0)
    turn_off_if_none_correct: bool = _f(B.TURN_OFF_IF_NONE_CORRECT,
                                        help="zero the bonus of groups with no correct rollout")
    turn_off_if_some_correct: bool = _f(B.TURN_OFF_IF_SOME_CORRECT, help="zero the bonus of partially correct groups")
    turn_off_if_all_correct: bool = _f(B.TURN_OFF_IF_ALL_CORRECT, help="zero the bonus of fully correct groups")
    turn_off_if_rollout_incorrect: bool = _f(B.TURN_OFF_IF_ROLLOUT_INCORRECT,
                                             help="zero the bonus of each incorrect rollout")
    representation_model: Optional[str] = _f(None, help="frozen feature model (null: the initial policy)")


@dataclass
class TrainConfig:
    n_rollouts: int = _f(8, help="rollouts per prompt (GRPO group size)", minimum=2)
    lr: float = _f(1e-6, help="actor learning rate", exclusiveMinimum=0)
    train_batch_size: int = _f(1024, help="prompts per step", minimum=1)
    ppo_mini_batch_size: int = _f(256, help="prompts per optimizer step", minimum=1)
    micro_batch_size_per_gpu: int = _f(16, help="sequences per forward/backward", minimum=1)
    max_prompt_length: int = _f(1024, help="tokens", minimum=1)
    max_response_length: int = _f(1024, help="tokens", minimum=1)
    total_steps: Optional[int] = _f(None, help="stop after this many steps (null: total_epochs)", minimum=1)
    total_epochs: int = _f(1000, help="epochs when total_steps is null", minimum=1)
    walltime_margin_minutes: float = _f(
        5.0, help="under SLURM: the trainer saves and stops this long before the job's walltime, when the next "
        "step and a save would not end before it; the job is requeued and resumes", minimum=0, runtime=True)
    test_freq: int = _f(20, help="validate on dev every N steps", minimum=1)
    save_freq: int = _f(20, help="checkpoint every N steps (validated steps must be saved)", minimum=1)
    val_n: int = _f(128, help="dev samples per prompt for validation pass@k", minimum=1,
                    maximum=MAX_SAMPLES_PER_PROBLEM)
    val_before_train: bool = _f(True, help="validate the initial model (step 0)")
    temperature: float = _f(1.0, help="rollout and validation temperature", exclusiveMinimum=0)
    top_p: float = _f(1.0, help="rollout and validation top-p", exclusiveMinimum=0, maximum=1)
    clip_ratio: float = _f(0.2, help="PPO clip ratio", exclusiveMinimum=0)
    entropy_coeff: float = _f(0.0, help="entropy bonus", minimum=0)
    loss_agg_mode: str = _f("token-mean", help="PPO loss aggregation", enum=LOSS_AGG_MODES)
    max_checkpoints_to_keep: Optional[int] = _f(
        None, help="keep the newest N checkpoints besides the best-dev one, whose optimizer state is dropped "
        "(null: all)", minimum=1, runtime=True)


@dataclass
class EvalConfig:
    engine: str = _f("auto", help="sampling engine (auto: vllm on GPU, else hf)", enum=ENGINES)
    n_samples: int = _f(256, help="samples per problem", minimum=1, maximum=MAX_SAMPLES_PER_PROBLEM)
    temperature: float = _f(1.0, help="sampling temperature", exclusiveMinimum=0)
    top_p: float = _f(1.0, help="sampling top-p", exclusiveMinimum=0, maximum=1)
    max_new_tokens: Optional[int] = _f(None, help="tokens per sample (null: train.max_response_length)", minimum=1)
    batch_size: int = _f(64, help="prompts per generate call (hf engine)", minimum=1)
    shard_size: int = _f(64, help="problems per resumable shard", minimum=1)
    tensor_parallel_size: int = _f(1, help="vLLM tensor parallel size", minimum=1)
    data_parallel_size: int = _f(1, help="vLLM data parallel size", minimum=1)
    gpu_memory_utilization: float = _f(0.85, help="vLLM memory fraction", exclusiveMinimum=0, maximum=1)
    kv_cache_gib: Optional[float] = _f(None, help="vLLM KV-cache size in GiB instead of profiling free memory "
                                       "(null: profile); jobs that start beside others on one GPU need it, since "
                                       "vLLM's profiling fails when a neighbour frees memory meanwhile",
                                       exclusiveMinimum=0, runtime=True)
    max_model_len: Optional[int] = _f(None, help="vLLM context length (null: prompt + response)", minimum=1)
    dtype: str = _f("auto", help="model dtype for sampling", enum=DTYPES)
    enforce_eager: bool = _f(False, help="vLLM without CUDA graphs: a faster engine start, slower sampling "
                             "(worth it for small evaluations)")


@dataclass
class TesttimeConfig:
    # The test-time RepExp stage (repexp testtime): λ and centring are the training bonus's (`bonus.lamb`,
    # `bonus.center`) and the feature model is `bonus.representation_model` or the initial policy.
    enabled: bool = _f(True, help="order every evaluated run's samples by the elliptical bonus (testtime rule)")
    sparse_dim: int = _f(B.SPARSE_DIM, help="projection dimension of the test-time features (the same for every run)",
                         minimum=1)
    projection_seed: int = _f(0, help="seed of the test-time sparse projection", minimum=0)
    batch_size: int = _f(64, help="sequences per feature-model forward", minimum=1)
    dtype: str = _f("auto", help="feature-model dtype (auto: bfloat16 on GPU, float32 on CPU)", enum=DTYPES)
    bootstrap: int = _f(1000, help="bootstrap replicates over problems for the efficiency intervals", minimum=0)


@dataclass
class VerlConfig:
    n_gpus_per_node: int = _f(8, help="GPUs per node", minimum=1)
    nnodes: int = _f(1, help="nodes per training job", minimum=1)
    rollout_tensor_parallel_size: int = _f(2, help="vLLM TP size during rollouts", minimum=1)
    gpu_memory_utilization: float = _f(0.6, help="vLLM memory fraction during training", exclusiveMinimum=0, maximum=1)
    max_num_batched_tokens: int = _f(8192, help="vLLM batched-token budget", minimum=1)
    log_prob_micro_batch_size_per_gpu: int = _f(16, help="old-log-prob micro batch", minimum=1, runtime=True)
    repexp_micro_batch_size_per_gpu: int = _f(32, help="hidden-state forward micro batch", minimum=1, runtime=True)
    enable_gradient_checkpointing: bool = _f(True, help="actor gradient checkpointing")
    attn_implementation: str = _f("auto", help="attention of the actor and the frozen representation model: auto "
                                  "(flash_attention_2 where flash_attn imports on the node, else sdpa), "
                                  "flash_attention_2, sdpa or eager; decided at the job's start and logged",
                                  enum=ATTENTION)
    use_remove_padding: Optional[bool] = _f(None, help="packed sequences; null follows the attention (on with "
                                            "flash_attention_2, off otherwise)")
    strategy: str = _f("fsdp", help="FSDP flavour of the actor and the frozen representation model",
                       enum=VERL_STRATEGIES)
    ray_num_cpus: Optional[int] = _f(None, help="CPUs Ray may use (null: all; set it under SLURM)", minimum=1,
                                     runtime=True)
    overrides: list[str] = _f([], help="extra raw Hydra overrides for verl (validated by verl)")


@dataclass
class TrlConfig:
    # Batch shapes come from `train` (micro_batch_size_per_gpu, ppo_mini_batch_size): one meaning, both backends.
    device: str = _f("auto", help="torch device (auto: cuda if available else cpu)", enum=("auto", "cpu", "cuda"))
    dtype: str = _f("float32", help="compute dtype: float32, or bfloat16 autocast over float32 weights "
                    "(the frozen feature model is loaded in this dtype)", enum=TRL_DTYPES)
    eval_batch_size: int = _f(16, help="dev prompts per validation generate call (each with train.val_n samples)",
                              minimum=1, runtime=True)
    logging_steps: int = _f(1, help="log every N training steps", minimum=1)
    gradient_checkpointing: bool = _f(False, help="policy gradient checkpointing (less memory, about a fifth more "
                                      "time)", runtime=True)
    bonus_micro_batch_size: int = _f(32, help="sequences per frozen-model forward of the bonus features", minimum=1,
                                     runtime=True)
    num_threads: Optional[int] = _f(None, help="torch CPU threads (null: torch's default)", minimum=1, runtime=True)
    gpu_memory_fraction: Optional[float] = _f(None, help="cap on the job's CUDA memory as a fraction of the GPU "
                                              "(torch's per-process fraction), so jobs can share one GPU; null: none",
                                              exclusiveMinimum=0, maximum=1, runtime=True)


@dataclass
class TrackingConfig:
    tracking_uri: Optional[str] = _f(None, help="MLflow URI (null: $MLFLOW_TRACKING_URI, else SQLite under "
                                     "results/); schemes: " + ", ".join(TRACKING_SCHEMES))
    experiment: Optional[str] = _f(None, help="MLflow experiment (null: the config's name)")
    server: str = _f("auto", help="the workflow's MLflow server on the submit host (repexp mlflow serve): on, off, "
                     "or auto = on for a cluster executor (SLURM) when no tracking URI is set",
                     enum=("auto", "on", "off"))
    # Bind only the interface jobs use (issue 27, item 5): the address this host's name resolves to,
    # which is also the address jobs are given (docs/tracking.md, "Access control").
    server_host: str = _f("auto", help="interface the workflow's server binds: auto = the address this host's name "
                          "resolves to (the one jobs are given); an address, or 0.0.0.0 for every interface")
    server_auth: bool = _f(True, help="the workflow's server requires a login (MLflow's basic-auth app; per results "
                           "directory, in <results>/mlflow/credentials.json, mode 0600); false: anyone who reaches "
                           "it can read, edit or delete the runs")
    server_port: int = _f(0, help="port of the workflow's server (0: a free port)", minimum=0, maximum=65535)
    server_store: Optional[str] = _f(None, help="backend store of the workflow's server, e.g. postgresql://... "
                                     "(null: SQLite on the submit host's local disk, /var/tmp/repexp-mlflow-<user>/)")
    # A damaged or vanished SQLite store stops the workflow before any job (docs/tracking.md, "When
    # the store is damaged or gone"); these two settings are the ways on.
    store_backups: int = _f(3, help="backups of the SQLite store kept in backups/ beside it, one per workflow "
                            "start when it changed (SQLite's online backup; 0: none)", minimum=0)
    new_store: bool = _f(False, help="where the SQLite store this results directory used is damaged or gone, "
                         "start a new, empty one instead of stopping (the damaged file is kept)")


@dataclass
class RuleResources:
    gpu: int = _f(0, help="GPUs per node", minimum=0)
    nodes: int = _f(1, help="nodes", minimum=1)
    cpus_per_task: int = _f(1, help="CPU cores (per node)", minimum=1)
    mem_mb: int = _f(4000, help="memory per node (MB)", minimum=1)
    runtime: int = _f(60, help="wall-clock limit (minutes)", minimum=1)
    gpu_share: int = _f(100, help="percent of one GPU a job with gpu > 0 takes when jobs share a GPU on one machine "
                        "(`--resources gpu_share=100` per GPU runs jobs side by side while their shares fit; "
                        "SLURM gives each job whole GPUs and ignores it)", minimum=1, maximum=100)
    # Which GPUs and nodes a SLURM job may land on (docs/slurm.md, "GPU types"): without them `--gpus=8`
    # can land on V100s or 40 GB cards that have no bfloat16 or too little memory for the job.
    gpu_model: Optional[str] = _f(None, help="SLURM GPU type the job asks for (`--gpus=<model>:<gpu>`, e.g. h100, "
                                  "a100); the names are the cluster's gres types (`sinfo -o %G`); needs gpu > 0",
                                  pattern=r"^[A-Za-z0-9_.]+$")
    constraint: Optional[str] = _f(None, help="SLURM node features the job needs (`--constraint`, e.g. "
                                   "'a100_80gb|h100'); the names are the cluster's (`sinfo -o %f`)",
                                   pattern=r"^[A-Za-z0-9_.|&,()\[\]*:-]+$")


def _default_resources() -> dict:
    return {name: RuleResources() for name in RULES}


@dataclass
class TaskSweepOverride:
    sparse_dims: Optional[list[int]] = _f(None, help="replaces sweep.sparse_dims for this task", items_minimum=1)
    betas: Optional[list[float]] = _f(None, help="replaces sweep.betas for this task", items_exclusiveMinimum=0)


@dataclass
class TaskOverride:
    # Partial sections: the keys given are merged onto the config's section (OmegaConf.merge) and
    # checked against that section's dataclass when the config is parsed.
    sweep: TaskSweepOverride = field(default_factory=TaskSweepOverride)
    train: dict[str, Any] = _f({}, help="partial train settings for this task", section=TrainConfig)
    eval: dict[str, Any] = _f({}, help="partial eval settings for this task", section=EvalConfig)
    verl: dict[str, Any] = _f({}, help="partial verl settings for this task", section=VerlConfig)
    trl: dict[str, Any] = _f({}, help="partial trl settings for this task", section=TrlConfig)


@dataclass
class PipelineConfig:
    name: str = _f("repexp", help="config name; MLflow experiment unless tracking.experiment is set",
                   pattern=r"^[A-Za-z0-9_.-]+$")
    results_dir: str = _f("results", help="where every output goes")
    model: str = _f("Qwen/Qwen2.5-7B-Instruct", help="initial policy: a Hugging Face id (downloaded once on the "
                    "submit host), a local directory, or 'tiny'/'smollm2' (built offline)")
    grader: str = _f(DEFAULT_GRADER, help="answer grader of training rewards, dev selection and test pass@k: repexp "
                     "(this project's verifier) or paper (the recipe's scorers, for numbers comparable to the paper's)",
                     enum=GRADERS)
    data: DataConfig = field(default_factory=DataConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    bonus: BonusConfig = field(default_factory=BonusConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    testtime: TesttimeConfig = field(default_factory=TesttimeConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)
    trl: TrlConfig = field(default_factory=TrlConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    resources: dict[str, RuleResources] = field(
        default_factory=_default_resources, metadata={"help": "per-rule scheduler requests", "keys": RULES})
    task_overrides: dict[str, TaskOverride] = field(
        default_factory=dict, metadata={"help": "per-task overrides", "keys": TASKS})


# Sections a task override may patch.
SECTIONS = ("train", "eval", "verl", "trl")
_MODEL_ALIASES = ("tiny", "smollm2")

# --------------------------------------------------------------------------- reading YAML


def read_yaml(path: str | Path) -> Any:
    """A YAML file, strictly: a repeated key is an error naming the file and line (PyYAML keeps the
    last one silently), and `1e-5` is a number (PyYAML, following YAML 1.1, reads it as a string)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        loader.flatten_mapping(node)
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise ConfigError(f"{path}: line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                                  f"(first at line {seen[key] + 1}); YAML would keep only the last one")
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path}: not found")
    try:
        return yaml.load(path.read_text(), Loader=StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: invalid YAML ({err})") from None


# --------------------------------------------------------------------------- parsing (OmegaConf)


def split_overrides(value: Any) -> list[str]:
    """`set=` overrides as a list of `key.path=value` items. A string is split on whitespace outside
    brackets and quotes, so `sweep.betas=[0.01, 0.02] train.lr=2e-6` gives two items."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [item for entry in value for item in split_overrides(entry)]
    items, current, depth, quote = [], "", 0, None
    for char in str(value):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char.isspace() and depth == 0:
            if current:
                items.append(current)
            current = ""
            continue
        current += char
    if current:
        items.append(current)
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"{OVERRIDES_KEY}: {item!r} is not a key.path=value override")
    return items


def _omegaconf_error(err: Exception, prefix: str = "") -> ConfigError:
    """An OmegaConf error as a ConfigError that starts with the full key."""
    key = prefix + (getattr(err, "full_key", "") or "")
    message = (getattr(err, "msg", "") or str(err)).splitlines()[0].strip()
    object_type = getattr(err, "object_type", None)
    if type(err).__name__ == "ConfigKeyError":
        message = "unknown key"
        removed = REMOVED_KEYS.get(key.rsplit(".", 1)[-1])
        if removed is not None:
            message = removed
        elif dataclasses.is_dataclass(object_type):
            message += f" (known: {', '.join(f.name for f in dataclasses.fields(object_type))})"
    return ConfigError(f"{key or '<root>'}: {message}")


def _check_sections(cls: type, raw: Any, prefix: str = "") -> None:
    """Sections must be mappings: OmegaConf's merge error for `eval: [1, 2]` names no key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or '<root>'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    for name, value in raw.items():
        tp = hints.get(name)
        if tp is None or value is None:
            continue
        if dataclasses.is_dataclass(tp):
            _check_sections(tp, value, f"{prefix}{name}.")
        elif typing.get_origin(tp) is dict:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{name}: expected a mapping, got {value!r}")
            item = typing.get_args(tp)[1]
            for key, sub in value.items():
                if dataclasses.is_dataclass(item) and sub is not None:
                    _check_sections(item, sub, f"{prefix}{name}.{key}.")


def _structured(obj: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.structured(obj)


def _to_dataclass(cls_or_obj: Any, *raws: Any, prefix: str = "") -> Any:
    """Merge mappings onto a dataclass (a class: its defaults; an instance: its values) with OmegaConf's
    type checks and conversions, and return the dataclass instance."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        node = OmegaConf.merge(_structured(cls_or_obj), *raws)
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, prefix) from None


def parse(raw: Mapping, *, overrides: Sequence[str] = ()) -> PipelineConfig:
    """A config mapping (+ dotlist overrides, also from its `set` key) as a typed `PipelineConfig`:
    structure, types and conversions only; `check` applies the rules."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(raw, Mapping):
        raise ConfigError("<root>: the config must be a mapping")
    raw = dict(raw)
    dotlist = [*split_overrides(raw.pop(OVERRIDES_KEY, None)), *overrides]
    _check_sections(PipelineConfig, raw)
    try:
        node = OmegaConf.merge(_structured(PipelineConfig), raw)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err) from None
    for item in dotlist:
        try:
            node = OmegaConf.merge(node, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as err:
            error = _omegaconf_error(err)
            raise ConfigError(f"{error} (override {item!r})") from None
        except Exception as err:  # noqa: BLE001 - OmegaConf's dotlist grammar raises plain errors
            raise ConfigError(f"{OVERRIDES_KEY}: cannot parse override {item!r} ({err})") from None
    try:
        cfg = OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err) from None
    _merge_task_overrides(cfg)
    return cfg


def _merge_task_overrides(cfg: PipelineConfig) -> None:
    """Check every task override against its section's dataclass; keep the converted values."""
    for task, override in cfg.task_overrides.items():
        if task not in TASKS:
            raise ConfigError(f"task_overrides.{task}: unknown task (known: {', '.join(TASKS)})")
        for section in SECTIONS:
            patch = getattr(override, section)
            if patch:
                merged = _to_dataclass(getattr(cfg, section), patch, prefix=f"task_overrides.{task}.{section}.")
                setattr(override, section, {key: getattr(merged, key) for key in patch})


def parse_files(raw: Mapping, files: Sequence[str | Path] = ()) -> PipelineConfig:
    """`parse` for a mapping that Snakemake loaded from `files`: each file is re-read strictly first
    (PyYAML, as Snakemake uses it, keeps the last of two equal keys without a word)."""
    for path in files:
        read_yaml(path)
    return parse(raw)


def load(path_or_dict: str | Path | Mapping, *, overrides: Sequence[str] = ()) -> PipelineConfig:
    """Read, parse and check a pipeline config (a YAML path or an already-loaded mapping)."""
    if isinstance(path_or_dict, Mapping):
        raw = path_or_dict
    else:
        raw = read_yaml(path_or_dict)
        if raw is None:
            raw = {}
    cfg = parse(raw, overrides=overrides)
    check(cfg)
    return cfg


def as_dict(cfg: PipelineConfig) -> dict:
    """Plain Python containers (what Snakemake's `validate` and the config snapshot see)."""
    return dataclasses.asdict(cfg)


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


def check_fields(obj: Any, prefix: str = "") -> None:
    """The per-field rules of the dataclass metadata (what the JSON schema says), recursively."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
        elif isinstance(value, dict):
            if "keys" in f.metadata:
                unknown = sorted(set(value) - set(f.metadata["keys"]))
                if unknown:
                    raise ConfigError(f"{key}.{unknown[0]}: unknown name (known: {', '.join(f.metadata['keys'])})")
            for name, item in value.items():
                if dataclasses.is_dataclass(item):
                    check_fields(item, f"{key}.{name}.")
        elif isinstance(value, list):
            item_meta = {k[len("items_"):]: v for k, v in f.metadata.items() if k.startswith("items_")}
            for i, item in enumerate(value):
                _check_constraints(f"{key}[{i}]", item, item_meta)
        elif value is not None:
            _check_constraints(key, value, f.metadata)


def _key(cfg: PipelineConfig, task: str, section: str, name: str) -> str:
    """Where a task's effective `<section>.<name>` comes from: its task override, else the section."""
    override = cfg.task_overrides.get(task)
    if override is not None and name in getattr(override, section):
        return f"task_overrides.{task}.{section}.{name}"
    return f"{section}.{name}"


def check(cfg: PipelineConfig) -> None:
    """Every rule a job would otherwise apply later: per-field rules, then cross-field rules of the
    sweep, the trainer backends, evaluation, tracking and the scheduler requests. Raises ConfigError."""
    check_fields(cfg)
    for task, override in cfg.task_overrides.items():
        check_fields(override.sweep, f"task_overrides.{task}.sweep.")
        for section in SECTIONS:
            if getattr(override, section):
                check_fields(task_section(cfg, task, section), f"task_overrides.{task}.{section}.")
    _check_sweep(cfg)
    if cfg.data.dapo_source is None and "dapo-with-aime24" in cfg.sweep.tasks:
        raise ConfigError("data.dapo_source: required when sweep.tasks contains dapo-with-aime24")
    if any(task_sweep(cfg, task)[1] for task in cfg.sweep.tasks):
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
    for name in ("tasks", "backends", "sparse_dims", "betas", "seeds"):
        values = getattr(cfg.sweep, name)
        if len(set(map(canonical, values))) != len(values):
            raise ConfigError(f"sweep.{name}: duplicate values {values}")
        if name in ("tasks", "seeds") and not values:
            raise ConfigError(f"sweep.{name}: must not be empty")
    if not cfg.sweep.backends and (cfg.sweep.betas or cfg.sweep.grpo_baseline):
        raise ConfigError("sweep.backends: must not be empty when training runs are requested")


def check_bonus(bonus: BonusConfig, where: str = "bonus") -> None:
    """Rules of the bonus settings (both backends apply the same ones)."""
    if bonus.persist_covariance and bonus.reward_type != "leverage":
        raise ConfigError(f"{where}.persist_covariance: a persistent covariance supports reward_type 'leverage' only")
    if bonus.persist_covariance and bonus.randomize_projection:
        raise ConfigError(f"{where}.persist_covariance: needs {where}.randomize_projection=false "
                          "(accumulating features of different projections is meaningless)")


def check_tracking_uri(uri: Optional[str], key: str = "tracking.tracking_uri") -> None:
    if uri is None:
        return
    if uri == "databricks":  # MLflow's shorthand for the default Databricks profile
        return
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()  # postgresql+psycopg2://... names a driver
    if scheme not in TRACKING_SCHEMES or ":" not in uri:
        raise ConfigError(f"{key}: {uri!r} has no known scheme (use one of {', '.join(TRACKING_SCHEMES)}, "
                          "e.g. http://HOST:PORT or sqlite:///PATH)")


def _check_training(cfg: PipelineConfig, task: str) -> None:
    train = task_section(cfg, task, "train")
    key = lambda name: _key(cfg, task, "train", name)  # noqa: E731
    check_train_batches(train, key)
    runtime = rule_resources(cfg, "train").runtime
    if train.walltime_margin_minutes >= runtime:
        raise ConfigError(f"{key('walltime_margin_minutes')}: {canonical(train.walltime_margin_minutes)} min leaves "
                          f"nothing of resources.train.runtime {runtime} min to train in; lower it")
    sparse_dims, betas = task_sweep(cfg, task)
    if "trl" in cfg.sweep.backends:
        check_trl_loss(train, key)
        trl_micro_batch(train, key)
        trl = task_section(cfg, task, "trl")
        if trl.device != "cpu":
            _check_share(trl.gpu_memory_fraction, rule_resources(cfg, "train"), "train",
                         _key(cfg, task, "trl", "gpu_memory_fraction"))
    if "verl" in cfg.sweep.backends:
        _check_verl(cfg, task, train, repexp_runs=bool(betas))
        _check_share(task_section(cfg, task, "verl").gpu_memory_utilization, rule_resources(cfg, "train"), "train",
                     _key(cfg, task, "verl", "gpu_memory_utilization"))


def _check_verl(cfg: PipelineConfig, task: str, train: TrainConfig, repexp_runs: bool) -> None:
    """verl must be told the allocation the scheduler grants the train rule, and its batch shapes must fit it."""
    res = rule_resources(cfg, "train")
    verl = task_section(cfg, task, "verl")
    key = lambda name: _key(cfg, task, "verl", name)  # noqa: E731
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
    if rc.method not in ("repexp", "grpo"):
        raise ConfigError(f"method: {rc.method!r} runs do not train ('base' runs evaluate the initial model)")
    if rc.method == "grpo" and rc.beta != 0:
        raise ConfigError(f"beta: a 'grpo' run must have beta 0, got {rc.beta}")
    if rc.method == "repexp" and not rc.beta > 0:
        raise ConfigError(f"beta: a 'repexp' run needs beta > 0, got {rc.beta}")
    if rc.method == "repexp" and (rc.sparse_dim is None or rc.sparse_dim < 1):
        raise ConfigError(f"sparse_dim: a positive projection dimension is required when beta > 0, "
                          f"got {rc.sparse_dim}")


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
        raise ConfigError(f"{_key(cfg, task, 'eval', 'shard_size')}: {ev.shard_size} problems × n_samples "
                          f"{ev.n_samples} = {ev.shard_size * ev.n_samples:,} samples in memory per shard, more than "
                          f"{MAX_SHARD_SAMPLES:,}; lower shard_size")
    if ev.engine == "vllm" or (ev.engine == "auto" and res.gpu > 0):
        needed = ev.tensor_parallel_size * ev.data_parallel_size
        available = max(res.gpu, 1) * res.nodes
        if needed > available:
            raise ConfigError(
                f"{_key(cfg, task, 'eval', 'tensor_parallel_size')}: {ev.tensor_parallel_size} × data_parallel_size "
                f"{ev.data_parallel_size} needs {needed} GPUs, but resources.eval.gpu grants {res.gpu} (task {task})")
        _check_share(ev.gpu_memory_utilization, res, "eval", _key(cfg, task, "eval", "gpu_memory_utilization"))


def _check_share(fraction: Optional[float], res: RuleResources, rule: str, key: str) -> None:
    """A job that shares its GPU (resources.<rule>.gpu_share < 100) must cap its memory within its share."""
    if res.gpu == 0 or res.gpu_share == 100:
        return
    if fraction is None or fraction * 100 > res.gpu_share + 1e-9:
        raise ConfigError(
            f"{key}: {fraction} of the GPU's memory, but resources.{rule}.gpu_share is {res.gpu_share}%: jobs side by "
            f"side on one GPU would not fit; set it to at most {res.gpu_share / 100:g}")


# --------------------------------------------------------------------------- local paths


def model_kind(value: str, root: str | Path = ".") -> str:
    """'alias' (built offline), 'hub' (a Hugging Face id, downloaded once) or 'local' (a directory).

    A value is a local path when it exists under `root`, is absolute, starts with `.` or `~`, has
    more than one `/`, or its first component is an existing directory under `root` (`models/x`);
    otherwise it must look like a hub id (`org/name` or `name`)."""
    if value in _MODEL_ALIASES:
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
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) or hasattr(value, "item"):  # numpy scalars too
        value = float(value)
        if value.is_integer():
            return str(int(value))
        text = format(Decimal(repr(value)).normalize(), "f")
        return text
    return str(value)


# The run-name grammar, written once: each method's template. `RunSpec.name` fills it, `parse_run`
# reads it back and the Snakemake wildcards below match it; a field's syntax is a regex of its values.
RUN_NAMES = {
    "repexp": "{backend}_repexp_k{sparse_dim}_b{beta}_s{seed}",
    "grpo": "{backend}_grpo_s{seed}",
    "base": "base",
}
_INT = r"(?:0|[1-9]\d*)"
# Numbers only in their canonical spelling (no leading/trailing zeros), so a path such as
# .../trl_repexp_k8_b0.010_s42/... matches no rule instead of naming a duplicate run.
_CANONICAL_FIELDS = {"backend": "|".join(BACKENDS), "sparse_dim": r"[1-9]\d*",
                     "beta": _INT + r"(?:\.\d*[1-9])?", "seed": _INT}
# Any spelling: `parse_run` reads these, then refuses a non-canonical one naming the canonical name.
_LOOSE_FIELDS = {**_CANONICAL_FIELDS, "sparse_dim": r"\d+", "beta": r"[0-9.]+", "seed": r"\d+"}


def _run_pattern(method: str, fields: Mapping[str, str], *, named: bool = False) -> str:
    """The regex of `method`'s run names, each template field replaced by its syntax in `fields`."""
    parts = re.split(r"\{(\w+)\}", RUN_NAMES[method])  # literal, field, literal, ...
    group = "(?P<{}>{})" if named else "(?:{1})"
    return "".join(re.escape(part) if i % 2 == 0 else group.format(part, fields[part]) for i, part in enumerate(parts))


# One regex per method: group names repeat across methods, which one alternation cannot hold.
_RUN_RES = {method: re.compile(_run_pattern(method, _LOOSE_FIELDS, named=True)) for method in RUN_NAMES}


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

    def wildcards(self) -> dict:
        return {"task": self.task, "run": self.name}


def parse_run(task: str, name: str) -> RunSpec:
    """Inverse of `RunSpec.name`; rejects non-canonical spellings such as b0.010."""
    match = next(((method, m) for method, regex in _RUN_RES.items() if (m := regex.fullmatch(name))), None)
    if match is None or task not in TASKS:
        raise ConfigError(f"run: {task}/{name} is not a valid run name")
    method, m = match
    fields = m.groupdict()
    spec = RunSpec(task=task, method=method, backend=fields.get("backend"),
                   sparse_dim=int(fields["sparse_dim"]) if "sparse_dim" in fields else None,
                   beta=float(fields["beta"]) if "beta" in fields else 0.0,
                   seed=int(fields["seed"]) if "seed" in fields else None)
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
                for k in sparse_dims:
                    for beta in betas:
                        runs.append(RunSpec(task, "repexp", backend, int(k), float(beta), int(seed)))
                if cfg.sweep.grpo_baseline:
                    runs.append(RunSpec(task, "grpo", backend, None, 0.0, int(seed)))
        if cfg.sweep.base_baseline:
            runs.append(RunSpec(task, "base", seed=int(cfg.sweep.seeds[0])))
    return runs


# Wildcard regexes for Snakemake (no named groups: Snakemake wraps each in its own group).
TASK_PATTERN = "|".join(re.escape(t) for t in TASKS)
TRAINED_RUN_PATTERN = "|".join(_run_pattern(m, _CANONICAL_FIELDS) for m in ("grpo", "repexp"))
VERL_RUN_PATTERN = "|".join(_run_pattern(m, {**_CANONICAL_FIELDS, "backend": "verl"}) for m in ("grpo", "repexp"))
RUN_PATTERN = "|".join(_run_pattern(m, _CANONICAL_FIELDS) for m in RUN_NAMES)
MODEL_ALIASES = _MODEL_ALIASES  # `model:` values built offline by `repexp model`
MODEL_ALIAS_PATTERN = "|".join(_MODEL_ALIASES)


def rule_resources(cfg: PipelineConfig, rule: str) -> RuleResources:
    """`resources.<rule>` (defaults for rules the config does not mention)."""
    if rule not in RULES:
        raise ConfigError(f"resources.{rule}: unknown rule (known: {', '.join(RULES)})")
    return cfg.resources.get(rule) or RuleResources()


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
        return _to_dataclass(cls, raw)


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
    jobs it affects; `repexp train --expect-hash` refuses a snapshot that hashes differently.
    """
    rc = run_config
    identity = {
        "task": rc.task, "method": rc.method, "backend": rc.backend, "seed": rc.seed,
        "sparse_dim": rc.sparse_dim, "beta": rc.beta, "model": rc.model,
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
    if cfg.model in _MODEL_ALIASES:
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
        run=spec.name,
        task=spec.task,
        method=spec.method,
        backend=spec.backend,
        seed=int(seed),
        sparse_dim=spec.sparse_dim,
        beta=float(spec.beta),
        model=resolve_model(cfg),
        data_dir=str(layout.data_dir(cfg.results_dir, spec.task)),
        run_dir=str(layout.train_run_dir(cfg.results_dir, spec.task, spec.name)),
        bonus=copy.deepcopy(cfg.bonus),
        train=train,
        eval=eval_cfg,
        verl=task_section(cfg, spec.task, "verl"),
        trl=task_section(cfg, spec.task, "trl"),
        tracking=copy.deepcopy(cfg.tracking),
        config_name=cfg.name,
        config_hash=cfg_hash or config_hash(cfg),
        grader=cfg.grader,
    )


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"run config {path}: not found")
    return RunConfig.from_dict(read_yaml(path))


def dump_yaml(obj: Any) -> str:
    import yaml

    data = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------- JSON schema


def json_schema(cls: type = PipelineConfig) -> dict:
    """A JSON schema (draft 2020-12, the draft Snakemake's `validate` uses) of the per-field rules of `cls`.

    It lists no required keys, so it also describes a partial section (a task override)."""
    hints = typing.get_type_hints(cls)
    props = {}
    for f in dataclasses.fields(cls):
        props[f.name] = _schema_for(hints[f.name], f.metadata)
    schema = {"type": "object", "additionalProperties": False, "properties": props}
    if cls is PipelineConfig:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                  "description": "repexp pipeline config (generated by `repexp config schema`; do not edit)",
                  **schema}
    return schema


def _schema_for(tp: Any, meta: Mapping) -> dict:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    out: dict = {}
    if meta.get("help"):
        out["description"] = meta["help"]
    if origin is typing.Union:
        (inner,) = [a for a in args if a is not type(None)]
        sub = _schema_for(inner, meta)
        sub_type = sub.get("type")
        if sub_type:
            sub["type"] = [sub_type, "null"] if isinstance(sub_type, str) else [*sub_type, "null"]
        if "enum" in sub:
            sub["enum"] = [*sub["enum"], None]
        return sub
    if dataclasses.is_dataclass(tp):
        return {**out, **json_schema(tp)}
    if origin is list:
        item_meta = {k[len("items_"):]: v for k, v in meta.items() if k.startswith("items_")}
        return {**out, "type": "array", "items": _schema_for(args[0], item_meta)}
    if origin is dict or tp is dict:
        if "section" in meta:  # a partial section of a task override
            return {**out, **json_schema(meta["section"])}
        value = args[1] if args else Any
        sub = {**out, "type": "object"}
        if dataclasses.is_dataclass(value):
            sub["additionalProperties"] = json_schema(value)
        return sub  # the names (`keys` metadata: rules, tasks) are checked by `check`, naming the key
    out["type"] = {bool: "boolean", int: "integer", float: "number", str: "string"}[tp]
    for key in ("enum", "minimum", "exclusiveMinimum", "maximum", "pattern"):
        if key in meta:
            out[key] = list(meta[key]) if key == "enum" else meta[key]
    return out
