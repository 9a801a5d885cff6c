"""The pipeline config: one schema, one validation, one composition per job.

`configs/*.yaml` (the Snakemake config) is checked against the dataclasses below.
Every training/eval job gets a fully resolved `RunConfig` composed from
defaults ← config file ← task overrides ← sweep point; both trainer backends and
the eval node read only that. `configs/schema.yaml` (used by Snakemake's
`validate`) is generated from these dataclasses (`repexp config schema`), and a
test keeps the committed copy in sync.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import typing
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

from repexp.verify.routing import DEFAULT_GRADER, GRADERS

TASKS = ("math", "gsm8k", "aime24", "dapo-with-aime24", "arith")
BACKENDS = ("trl", "verl")
METHODS = ("repexp", "grpo", "base")
REWARD_TYPES = ("leverage", "leave_one_out")
NORMALIZATIONS = ("none", "rnd", "z_score")
ENGINES = ("auto", "hf", "vllm")


class ConfigError(ValueError):
    """An invalid pipeline config; the message starts with the offending key."""


def _f(default: Any = dataclasses.MISSING, *, help: str = "", **constraints: Any) -> Any:
    """A dataclass field with a help string and JSON-schema constraints (minimum, enum, ...)."""
    meta = {"help": help, **constraints}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    source: str = _f("../shared/data", help="directory of JSONL files, or 'hf' for the Hugging Face ids")
    split_seed: int = _f(0, help="seed of the GSM8K dev/test split and of subsets", minimum=0)
    limit_train: Optional[int] = _f(None, help="seeded train subset size (null: all)", minimum=1)
    limit_dev: Optional[int] = _f(None, help="seeded dev subset size (null: all)", minimum=1)
    limit_test: Optional[int] = _f(None, help="seeded test subset size (null: all)", minimum=1)
    dapo_source: Optional[str] = _f(None, help="DAPO training set: JSONL path or 'hf' (dapo-with-aime24 only)")


@dataclass
class SweepConfig:
    tasks: list[str] = _f(["math"], help="tasks to run", items_enum=TASKS)
    backends: list[str] = _f(["trl"], help="trainer backends", items_enum=BACKENDS)
    sparse_dims: list[int] = _f([32], help="projection dimensions (RepExp runs)", items_minimum=1)
    betas: list[float] = _f([0.01], help="bonus weights β > 0 (RepExp runs; GRPO is the β = 0 baseline)", items_exclusiveMinimum=0)
    seeds: list[int] = _f([42], help="training and sampling seeds", items_minimum=0)
    grpo_baseline: bool = _f(True, help="also train GRPO (β = 0) for every task × backend × seed")
    base_baseline: bool = _f(True, help="also evaluate the untrained base model per task")


@dataclass
class BonusConfig:
    lamb: float = _f(0.01, help="ridge λ of A = λI + Σ x xᵀ", exclusiveMinimum=0)
    reward_type: str = _f("leverage", help="bonus form", enum=REWARD_TYPES)
    normalization: str = _f("none", help="per-group bonus normalization", enum=NORMALIZATIONS)
    center: bool = _f(True, help="centre features by the group mean")
    randomize_projection: bool = _f(True, help="draw a new projection every step (seeded by seed and step)")
    persist_covariance: bool = _f(False, help="accumulate per-prompt covariance across steps")
    alpha: float = _f(1.0, help="verifier reward weight α", minimum=0)
    turn_off_if_none_correct: bool = _f(True, help="zero the bonus of groups with no correct rollout")
    turn_off_if_some_correct: bool = _f(False, help="zero the bonus of partially correct groups")
    turn_off_if_all_correct: bool = _f(False, help="zero the bonus of fully correct groups")
    turn_off_if_rollout_incorrect: bool = _f(False, help="zero the bonus of each incorrect rollout")
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
    test_freq: int = _f(20, help="validate on dev every N steps", minimum=1)
    save_freq: int = _f(20, help="checkpoint every N steps (validated steps must be saved)", minimum=1)
    val_n: int = _f(128, help="dev samples per prompt for validation pass@k", minimum=1)
    val_before_train: bool = _f(True, help="validate the initial model (step 0)")
    temperature: float = _f(1.0, help="rollout and validation temperature", exclusiveMinimum=0)
    top_p: float = _f(1.0, help="rollout and validation top-p", exclusiveMinimum=0, maximum=1)
    clip_ratio: float = _f(0.2, help="PPO clip ratio", exclusiveMinimum=0)
    entropy_coeff: float = _f(0.0, help="entropy bonus", minimum=0)
    loss_agg_mode: str = _f("token-mean", help="PPO loss aggregation", enum=("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"))
    max_checkpoints_to_keep: Optional[int] = _f(None, help="keep the newest N checkpoints besides the best (null: all)", minimum=1)


@dataclass
class EvalConfig:
    engine: str = _f("auto", help="sampling engine (auto: vllm on GPU, else hf)", enum=ENGINES)
    n_samples: int = _f(256, help="samples per problem", minimum=1)
    temperature: float = _f(1.0, help="sampling temperature", exclusiveMinimum=0)
    top_p: float = _f(1.0, help="sampling top-p", exclusiveMinimum=0, maximum=1)
    max_new_tokens: Optional[int] = _f(None, help="tokens per sample (null: train.max_response_length)", minimum=1)
    batch_size: int = _f(64, help="prompts per generate call (hf engine)", minimum=1)
    shard_size: int = _f(64, help="problems per resumable shard", minimum=1)
    tensor_parallel_size: int = _f(1, help="vLLM tensor parallel size", minimum=1)
    data_parallel_size: int = _f(1, help="vLLM data parallel size", minimum=1)
    gpu_memory_utilization: float = _f(0.85, help="vLLM memory fraction", exclusiveMinimum=0, maximum=1)
    max_model_len: Optional[int] = _f(None, help="vLLM context length (null: prompt + response)", minimum=1)
    dtype: str = _f("auto", help="model dtype for sampling", enum=("auto", "float32", "bfloat16", "float16"))


@dataclass
class TesttimeConfig:
    # The test-time RepExp stage (repexp testtime): λ and centring are the training bonus's (`bonus.lamb`,
    # `bonus.center`) and the feature model is `bonus.representation_model` or the initial policy.
    enabled: bool = _f(True, help="order every evaluated run's samples by the elliptical bonus (testtime rule)")
    sparse_dim: int = _f(32, help="projection dimension of the test-time features (the same for every run)", minimum=1)
    projection_seed: int = _f(0, help="seed of the test-time sparse projection", minimum=0)
    batch_size: int = _f(64, help="sequences per feature-model forward", minimum=1)
    dtype: str = _f("auto", help="feature-model dtype (auto: bfloat16 on GPU, float32 on CPU)",
                    enum=("auto", "float32", "bfloat16", "float16"))
    bootstrap: int = _f(1000, help="bootstrap replicates over problems for the efficiency intervals", minimum=0)


@dataclass
class VerlConfig:
    n_gpus_per_node: int = _f(8, help="GPUs per node", minimum=1)
    nnodes: int = _f(1, help="nodes per training job", minimum=1)
    rollout_tensor_parallel_size: int = _f(2, help="vLLM TP size during rollouts", minimum=1)
    gpu_memory_utilization: float = _f(0.6, help="vLLM memory fraction during training", exclusiveMinimum=0, maximum=1)
    max_num_batched_tokens: int = _f(8192, help="vLLM batched-token budget", minimum=1)
    log_prob_micro_batch_size_per_gpu: int = _f(16, help="old-log-prob micro batch", minimum=1)
    repexp_micro_batch_size_per_gpu: int = _f(32, help="hidden-state forward micro batch", minimum=1)
    enable_gradient_checkpointing: bool = _f(True, help="actor gradient checkpointing")
    use_remove_padding: bool = _f(True, help="packed sequences (flash-attn)")
    strategy: str = _f("fsdp", help="FSDP flavour of the actor and the frozen representation model", enum=("fsdp", "fsdp2"))
    ray_num_cpus: Optional[int] = _f(None, help="CPUs Ray may use (null: all; set it under SLURM)", minimum=1)
    overrides: list[str] = _f([], help="extra raw Hydra overrides for verl (validated by verl)")


@dataclass
class TrlConfig:
    # Batch shapes come from `train` (micro_batch_size_per_gpu, ppo_mini_batch_size): one meaning, both backends.
    device: str = _f("auto", help="torch device (auto: cuda if available else cpu)", enum=("auto", "cpu", "cuda"))
    dtype: str = _f("float32", help="compute dtype: float32, or bfloat16 autocast over float32 weights "
                    "(the frozen feature model is loaded in this dtype)", enum=("float32", "bfloat16"))
    eval_batch_size: int = _f(16, help="dev prompts per validation generate call (each with train.val_n samples)", minimum=1)
    logging_steps: int = _f(1, help="log every N training steps", minimum=1)
    gradient_checkpointing: bool = _f(False, help="policy gradient checkpointing (less memory, about a fifth more time)")
    bonus_micro_batch_size: int = _f(32, help="sequences per frozen-model forward of the bonus features", minimum=1)
    num_threads: Optional[int] = _f(None, help="torch CPU threads (null: torch's default)", minimum=1)


@dataclass
class TrackingConfig:
    tracking_uri: Optional[str] = _f(None, help="MLflow URI (null: $MLFLOW_TRACKING_URI, else SQLite under results/)")
    experiment: Optional[str] = _f(None, help="MLflow experiment (null: the config's name)")
    server: str = _f("auto", help="the workflow's MLflow server on the submit host (repexp mlflow serve): on, off, "
                     "or auto = on for a cluster executor (SLURM) when no tracking URI is set",
                     enum=("auto", "on", "off"))
    server_host: str = _f("0.0.0.0", help="interface the workflow's server binds; jobs reach it at this host's address")
    server_port: int = _f(0, help="port of the workflow's server (0: a free port)", minimum=0, maximum=65535)
    server_store: Optional[str] = _f(None, help="backend store of the workflow's server, e.g. postgresql://... "
                                     "(null: SQLite on the submit host's local disk, /var/tmp/repexp-mlflow-<user>/)")


@dataclass
class RuleResources:
    gpu: int = _f(0, help="GPUs per node", minimum=0)
    nodes: int = _f(1, help="nodes", minimum=1)
    cpus_per_task: int = _f(1, help="CPU cores", minimum=1)
    mem_mb: int = _f(4000, help="memory per node (MB)", minimum=1)
    runtime: int = _f(60, help="wall-clock limit (minutes)", minimum=1)


def _default_resources() -> dict:
    return {
        name: dataclasses.asdict(RuleResources())
        for name in ("model", "preprocess", "train", "select", "merge", "eval", "testtime", "aggregate", "figures")
    }


@dataclass
class TaskSweepOverride:
    sparse_dims: Optional[list[int]] = _f(None, help="replaces sweep.sparse_dims for this task", items_minimum=1)
    betas: Optional[list[float]] = _f(None, help="replaces sweep.betas for this task", items_exclusiveMinimum=0)


@dataclass
class TaskOverride:
    sweep: TaskSweepOverride = field(default_factory=TaskSweepOverride)
    train: dict = _f({}, help="partial train settings for this task")
    eval: dict = _f({}, help="partial eval settings for this task")
    verl: dict = _f({}, help="partial verl settings for this task")
    trl: dict = _f({}, help="partial trl settings for this task")


@dataclass
class PipelineConfig:
    name: str = _f("repexp", help="config name; MLflow experiment unless tracking.experiment is set", pattern=r"^[A-Za-z0-9_.-]+$")
    results_dir: str = _f("results", help="where every output goes")
    model: str = _f("Qwen/Qwen2.5-7B-Instruct", help="initial policy: HF id, local dir, or 'tiny'/'smollm2' (built offline)")
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
    resources: dict = _f(_default_resources(), help="per-rule resources (keys: rule names)")
    task_overrides: dict = _f({}, help="per-task overrides (keys: task names)")


# Sections a task override may patch, with their dataclass.
_OVERRIDABLE = {"train": TrainConfig, "eval": EvalConfig, "verl": VerlConfig, "trl": TrlConfig}
_MODEL_ALIASES = ("tiny", "smollm2")

# --------------------------------------------------------------------------- loading / validation


def load(path_or_dict: str | Path | dict) -> PipelineConfig:
    """Read and validate a pipeline config (a YAML path or an already-loaded dict)."""
    if isinstance(path_or_dict, dict):
        raw = path_or_dict
    else:
        import yaml

        path = Path(path_or_dict)
        if not path.exists():
            raise ConfigError(f"config file {path}: not found")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path}: invalid YAML ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError("<root>: the config must be a mapping")
    cfg = _build(PipelineConfig, raw, "")
    check(cfg)
    return cfg


def _build(cls: type, raw: Any, prefix: str) -> Any:
    """Strictly convert a dict into dataclass `cls`: unknown keys, wrong types and ranges fail by key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or '<root>'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise ConfigError(f"{key}: unknown key (known under {prefix.rstrip('.') or '<root>'}: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        if name in raw:
            values[name] = _coerce(hints[name], raw[name], f"{prefix}{name}", f.metadata)
    return cls(**values)


def _coerce(tp: Any, value: Any, key: str, meta: typing.Mapping) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        return _coerce(tp, value, key, meta)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        item_meta = {k[len("items_"):]: v for k, v in meta.items() if k.startswith("items_")}
        return [_coerce(args[0], v, f"{key}[{i}]", item_meta) for i, v in enumerate(value)]
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return value
    if value is None:
        raise ConfigError(f"{key}: must not be null")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
    _check_constraints(key, value, meta)
    return value


def _check_constraints(key: str, value: Any, meta: typing.Mapping) -> None:
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


def check(cfg: PipelineConfig) -> None:
    """Cross-field rules that a per-field schema cannot express."""
    for name in ("tasks", "backends", "sparse_dims", "betas", "seeds"):
        values = getattr(cfg.sweep, name)
        if len(set(map(canonical, values))) != len(values):
            raise ConfigError(f"sweep.{name}: duplicate values {values}")
        if name in ("tasks", "seeds") and not values:
            raise ConfigError(f"sweep.{name}: must not be empty")
    if not cfg.sweep.backends and (cfg.sweep.betas or cfg.sweep.grpo_baseline):
        raise ConfigError("sweep.backends: must not be empty when training runs are requested")
    # resources: known rules, strict fields
    for rule, res in cfg.resources.items():
        if rule not in _default_resources():
            raise ConfigError(f"resources.{rule}: unknown rule (known: {', '.join(_default_resources())})")
        _build(RuleResources, res, f"resources.{rule}.")
    for task, override in cfg.task_overrides.items():
        if task not in TASKS:
            raise ConfigError(f"task_overrides.{task}: unknown task (known: {', '.join(TASKS)})")
        ov = _build(TaskOverride, override, f"task_overrides.{task}.")
        for section, cls in _OVERRIDABLE.items():
            merged = {**dataclasses.asdict(getattr(cfg, section)), **getattr(ov, section)}
            _build(cls, merged, f"task_overrides.{task}.{section}.")
    if "verl" in cfg.sweep.backends:
        _check_verl_resources(cfg)
    if cfg.data.dapo_source is None and "dapo-with-aime24" in cfg.sweep.tasks:
        raise ConfigError("data.dapo_source: required when sweep.tasks contains dapo-with-aime24")
    for task in cfg.sweep.tasks:
        train = task_section(cfg, task, "train")
        _check_batches(train, f"task_overrides.{task}.train" if task in cfg.task_overrides else "train")


def _check_verl_resources(cfg: PipelineConfig) -> None:
    """verl must be told the allocation the scheduler grants the train rule (nodes, GPUs per node)."""
    res = rule_resources(cfg, "train")
    for task in cfg.sweep.tasks:
        verl = task_section(cfg, task, "verl")
        where = f"task_overrides.{task}.verl" if "verl" in cfg.task_overrides.get(task, {}) else "verl"
        if verl.nnodes != res.nodes:
            raise ConfigError(
                f"resources.train.nodes: {res.nodes} differs from {where}.nnodes {verl.nnodes} (task {task})"
            )
        if res.gpu and verl.n_gpus_per_node != res.gpu:
            raise ConfigError(
                f"resources.train.gpu: {res.gpu} differs from {where}.n_gpus_per_node "
                f"{verl.n_gpus_per_node} (task {task})"
            )


def _check_batches(train: TrainConfig, where: str) -> None:
    if train.train_batch_size % train.ppo_mini_batch_size:
        raise ConfigError(
            f"{where}.ppo_mini_batch_size: {train.ppo_mini_batch_size} does not divide "
            f"train_batch_size {train.train_batch_size}"
        )
    if train.test_freq % train.save_freq:
        raise ConfigError(
            f"{where}.save_freq: {train.save_freq} must divide test_freq {train.test_freq} "
            "so that every validated step has a checkpoint to select"
        )


def task_section(cfg: PipelineConfig, task: str, section: str) -> Any:
    """`cfg.<section>` with `task_overrides.<task>.<section>` applied."""
    base = dataclasses.asdict(getattr(cfg, section))
    patch = cfg.task_overrides.get(task, {}).get(section, {})
    return _build(_OVERRIDABLE[section], {**base, **patch}, f"task_overrides.{task}.{section}.")


def task_sweep(cfg: PipelineConfig, task: str) -> tuple[list[int], list[float]]:
    ov = cfg.task_overrides.get(task, {}).get("sweep", {}) or {}
    sparse_dims = ov.get("sparse_dims") or cfg.sweep.sparse_dims
    betas = ov.get("betas") or cfg.sweep.betas
    return list(sparse_dims), [float(b) for b in betas]


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
        if self.method == "base":
            return "base"
        if self.method == "grpo":
            return f"{self.backend}_grpo_s{self.seed}"
        return f"{self.backend}_repexp_k{self.sparse_dim}_b{canonical(self.beta)}_s{self.seed}"

    @property
    def path(self) -> str:
        return f"{self.task}/{self.name}"

    @property
    def trains(self) -> bool:
        return self.method != "base"

    def wildcards(self) -> dict:
        return {"task": self.task, "run": self.name}


_RUN_RE = re.compile(
    r"^(?:(?P<base>base)"
    r"|(?P<gb>trl|verl)_grpo_s(?P<gs>\d+)"
    r"|(?P<rb>trl|verl)_repexp_k(?P<k>\d+)_b(?P<beta>[0-9.]+)_s(?P<rs>\d+))$"
)


def parse_run(task: str, name: str) -> RunSpec:
    """Inverse of `RunSpec.name`; rejects non-canonical spellings such as b0.010."""
    m = _RUN_RE.match(name)
    if not m or task not in TASKS:
        raise ConfigError(f"run: {task}/{name} is not a valid run name")
    if m["base"]:
        spec = RunSpec(task=task, method="base")
    elif m["gb"]:
        spec = RunSpec(task=task, method="grpo", backend=m["gb"], seed=int(m["gs"]))
    else:
        spec = RunSpec(task=task, method="repexp", backend=m["rb"], sparse_dim=int(m["k"]),
                       beta=float(m["beta"]), seed=int(m["rs"]))
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
# Numbers only in their canonical spelling (no leading/trailing zeros), so a path such as
# .../trl_repexp_k8_b0.010_s42/... matches no rule instead of naming a duplicate run.
TASK_PATTERN = "|".join(re.escape(t) for t in TASKS)
_INT = r"(?:0|[1-9]\d*)"
_DECIMAL = _INT + r"(?:\.\d*[1-9])?"
_TRAINED_SUFFIX = rf"_(?:grpo_s{_INT}|repexp_k[1-9]\d*_b{_DECIMAL}_s{_INT})"
TRAINED_RUN_PATTERN = r"(?:trl|verl)" + _TRAINED_SUFFIX
VERL_RUN_PATTERN = r"verl" + _TRAINED_SUFFIX
RUN_PATTERN = r"base|" + TRAINED_RUN_PATTERN
MODEL_ALIASES = _MODEL_ALIASES  # `model:` values built offline by `repexp model`
MODEL_ALIAS_PATTERN = "|".join(_MODEL_ALIASES)


def rule_resources(cfg: PipelineConfig, rule: str) -> RuleResources:
    """`resources.<rule>` with defaults for missing rules and fields."""
    if rule not in _default_resources():
        raise ConfigError(f"resources.{rule}: unknown rule (known: {', '.join(_default_resources())})")
    return _build(RuleResources, cfg.resources.get(rule) or {}, f"resources.{rule}.")


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
    def from_dict(cls, raw: dict) -> "RunConfig":
        return _build(cls, raw, "")


def config_hash(cfg: PipelineConfig) -> str:
    blob = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# RunConfig fields that do not change what a training job computes.
_NOT_TRAINING = ("eval", "tracking", "config_name", "config_hash")


def training_hash(run_config: RunConfig) -> str:
    """Hash of everything that determines a training run (not eval settings, tracking or names).

    Snakemake passes it as a rule param, so a config change reruns exactly the training jobs
    it affects (and a change to another task, to eval settings or to resources reruns none).
    """
    data = {k: v for k, v in run_config.to_dict().items() if k not in _NOT_TRAINING}
    blob = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def resolve_model(cfg: PipelineConfig) -> str:
    """The policy path jobs load: offline aliases live under results/models/."""
    if cfg.model in _MODEL_ALIASES:
        return str(Path(cfg.results_dir) / "models" / cfg.model)
    return cfg.model


def compose(cfg: PipelineConfig, spec: RunSpec) -> RunConfig:
    """The resolved config of one sweep point (defaults ← file ← task overrides ← wildcards)."""
    if spec.task not in cfg.sweep.tasks:
        raise ConfigError(f"sweep.tasks: {spec.task} is not part of this config")
    seed = spec.seed if spec.seed is not None else cfg.sweep.seeds[0]
    eval_cfg = task_section(cfg, spec.task, "eval")
    train = task_section(cfg, spec.task, "train")
    if eval_cfg.max_new_tokens is None:
        eval_cfg.max_new_tokens = train.max_response_length
    results = Path(cfg.results_dir)
    return RunConfig(
        run=spec.name,
        task=spec.task,
        method=spec.method,
        backend=spec.backend,
        seed=int(seed),
        sparse_dim=spec.sparse_dim,
        beta=float(spec.beta),
        model=resolve_model(cfg),
        data_dir=str(results / "data" / spec.task),
        run_dir=str(results / "train" / spec.task / spec.name),
        bonus=copy.deepcopy(cfg.bonus),
        train=train,
        eval=eval_cfg,
        verl=task_section(cfg, spec.task, "verl"),
        trl=task_section(cfg, spec.task, "trl"),
        tracking=copy.deepcopy(cfg.tracking),
        config_name=cfg.name,
        config_hash=config_hash(cfg),
        grader=cfg.grader,
    )


def load_run_config(path: str | Path) -> RunConfig:
    import yaml

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"run config {path}: not found")
    return RunConfig.from_dict(yaml.safe_load(path.read_text()))


def dump_yaml(obj: Any) -> str:
    import yaml

    data = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------- JSON schema


def json_schema(cls: type = PipelineConfig) -> dict:
    """A JSON schema (draft 2020-12, the draft Snakemake's `validate` uses) equivalent to the per-field rules of `cls`."""
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


def _schema_for(tp: Any, meta: typing.Mapping) -> dict:
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
    if tp is dict:
        return {**out, "type": "object"}
    out["type"] = {bool: "boolean", int: "integer", float: "number", str: "string"}[tp]
    for key in ("enum", "minimum", "exclusiveMinimum", "maximum", "pattern"):
        if key in meta:
            out[key] = list(meta[key]) if key == "enum" else meta[key]
    return out
