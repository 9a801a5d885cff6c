"""RunConfig → TRL: the step plan and the `GRPOConfig` keyword arguments (pure; no TRL import).

One training *step* is what both backends count: `train.train_batch_size` prompts × `n_rollouts`
rollouts, scored once, then one PPO epoch over them in `train_batch_size / ppo_mini_batch_size`
optimizer steps. TRL counts optimizer steps (`state.global_step`), so a step is
`optimizer_steps_per_step` TRL steps; checkpoints, logging and validation happen only at step
boundaries. Every setting TRL cannot honour raises `ConfigError` naming the key; the table of
all mappings is in docs/trl_backend.md.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Sequence
from typing import Any, Optional

from repexp import config as C
from repexp.config import ConfigError, RunConfig


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one training step maps onto TRL's micro-batches and optimizer steps."""

    prompts_per_step: int
    n_rollouts: int
    micro_batch_size: int  # sequences per forward/backward (TRL per_device_train_batch_size)
    accumulation_steps: int  # micro-batches per optimizer step
    optimizer_steps_per_step: int  # PPO mini-batches per training step
    steps_per_epoch: int
    total_steps: int

    @property
    def micro_batches_per_step(self) -> int:
        return self.prompts_per_step * self.n_rollouts // self.micro_batch_size

    def step_of(self, optimizer_step: int) -> int:
        """Training step that TRL's `global_step` belongs to (completed steps at a boundary)."""
        return optimizer_step // self.optimizer_steps_per_step

    def at_boundary(self, optimizer_step: int) -> bool:
        return optimizer_step % self.optimizer_steps_per_step == 0


def check_run_config(cfg: RunConfig) -> None:
    """Reject jobs this backend cannot run as configured (messages start with the key).

    A job.yaml need not come from a checked pipeline config (``python -m repexp.trl.train --config``
    reads any), so the pipeline's own rules are applied again here: the same functions, not copies.
    `check_trains` checks the method's parameters (`check_method_params`: known fields, bounds, the
    method's rules against `train`); the bonus section only matters to RepExp."""
    C.check_trains(cfg, "trl")
    C.check_trl_loss(cfg.train)
    C.check_trl_rollout(cfg.trl)
    if cfg.method == "repexp":
        C.check_bonus(cfg.bonus)
    C.check_train_batches(cfg.train)


def plan_steps(cfg: RunConfig, num_train_prompts: int) -> StepPlan:
    """Batch shapes and the number of steps, from `train` and the size of the training set."""
    train = cfg.train
    if num_train_prompts < train.train_batch_size:
        raise ConfigError(
            f"train.train_batch_size: {train.train_batch_size} prompts per step, but the training set has only "
            f"{num_train_prompts} usable prompts (after dropping prompts longer than max_prompt_length)"
        )
    mini_batch_sequences = train.ppo_mini_batch_size * train.n_rollouts
    micro = C.trl_micro_batch(train)
    steps_per_epoch = num_train_prompts // train.train_batch_size  # the last partial batch is dropped
    total = train.total_steps if train.total_steps is not None else train.total_epochs * steps_per_epoch
    return StepPlan(
        prompts_per_step=train.train_batch_size,
        n_rollouts=train.n_rollouts,
        micro_batch_size=micro,
        accumulation_steps=mini_batch_sequences // micro,
        optimizer_steps_per_step=train.train_batch_size // train.ppo_mini_batch_size,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
    )


# --------------------------------------------------------------------------- the rollout engine


def vllm_importable() -> bool:
    """Whether this Python can import vllm (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def check_rollout_host(cfg: RunConfig, *, cuda: bool, where: str = "this machine") -> None:
    """`trl.rollout_engine: vllm` needs a CUDA GPU and the vllm package here (ConfigError naming the key)."""
    C.check_trl_rollout_host(cfg.trl, cuda=cuda, vllm=vllm_importable(), where=where)


VLLM_BLOCK_TOKENS = 16  # vLLM's KV-cache block (CUDA default): a sequence takes whole blocks


def kv_bytes_per_token(model_config: Any, dtype_bytes: int) -> int:
    """KV-cache bytes of one token: keys and values of every layer (a Hugging Face model config)."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def vllm_kv_cache_bytes(cfg: RunConfig, model_config: Any) -> int:
    """The rollout engine's fixed KV cache: `trl.vllm_kv_cache_gib`, else what one step's rollouts need at
    most: train_batch_size × n_rollouts sequences of max_prompt_length + max_response_length tokens, each in
    whole blocks plus one (vLLM also keeps a null block), in the engine's dtype."""
    if cfg.trl.vllm_kv_cache_gib is not None:
        return int(cfg.trl.vllm_kv_cache_gib * 2**30)
    train = cfg.train
    blocks = math.ceil((train.max_prompt_length + train.max_response_length) / VLLM_BLOCK_TOKENS) + 1
    sequences = train.train_batch_size * train.n_rollouts
    dtype_bytes = 2 if cfg.trl.dtype == "bfloat16" else 4
    return sequences * blocks * VLLM_BLOCK_TOKENS * kv_bytes_per_token(model_config, dtype_bytes)


def vllm_engine_kwargs(cfg: RunConfig, kv_cache_bytes: int) -> dict[str, Any]:
    """What `repexp.trl.train` adds to the `vllm.LLM(...)` TRL's colocate mode builds (TRL 1.16 exposes none of
    it): the engine's dtype is the run's compute dtype; a fixed KV cache instead of memory profiling (which
    would count the neighbours' memory as its own); `enforce_eager`; and the run's seed, which vLLM's
    in-process worker gives torch's generators (TRL passes 0 for every run)."""
    return dict(dtype=cfg.trl.dtype, kv_cache_memory_bytes=int(kv_cache_bytes),
                enforce_eager=cfg.trl.vllm_enforce_eager, seed=cfg.seed)


def check_vllm_memory(cfg: RunConfig, *, weights_bytes: int, kv_cache_bytes: int, gpu_total_bytes: int) -> None:
    """The engine's weights and KV cache must fit the part of the GPU it may hold
    (`trl.vllm_gpu_memory_utilization`, null: derived from the training's cap); vLLM does not check this
    itself when the KV cache is given in bytes."""
    utilization = C.trl_vllm_memory_utilization(cfg.trl)
    allowed, need = utilization * gpu_total_bytes, weights_bytes + kv_cache_bytes
    if need > allowed:
        gib = 2**30
        key = "trl.vllm_kv_cache_gib" if cfg.trl.vllm_kv_cache_gib is not None else "trl.vllm_gpu_memory_utilization"
        raise ConfigError(
            f"{key}: the rollout engine needs {need / gib:.2f} GiB (weights {weights_bytes / gib:.2f}, KV cache "
            f"{kv_cache_bytes / gib:.2f}), but may hold {utilization:g} of the GPU's {gpu_total_bytes / gib:.1f} GiB "
            f"= {allowed / gib:.2f} GiB; raise trl.vllm_gpu_memory_utilization (within trl.gpu_memory_fraction) or "
            "lower trl.vllm_kv_cache_gib")


def grpo_config_kwargs(cfg: RunConfig, plan: StepPlan, *, output_dir: str, use_cpu: bool,
                       stop_token_ids: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """Keyword arguments of `trl.GRPOConfig` for this job (see the mapping table in docs/trl_backend.md).
    `stop_token_ids`: TRL's `eos_token_ids` of the policy (required with `trl.rollout_engine: vllm`, whose
    sampling then stops on exactly the tokens transformers' generate stops on)."""
    train, trl = cfg.train, cfg.trl
    k = plan.optimizer_steps_per_step
    return dict(
        output_dir=output_dir,
        seed=cfg.seed,
        data_seed=cfg.seed,
        # optimisation: verl's AdamW defaults (the recipe does not override them), constant learning rate,
        # no warm-up
        learning_rate=train.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        max_steps=plan.total_steps * k,
        # batch shapes: one generation batch per training step, k PPO mini-batches over it
        per_device_train_batch_size=plan.micro_batch_size,
        gradient_accumulation_steps=plan.accumulation_steps,
        steps_per_generation=plan.micro_batches_per_step,
        num_generations=train.n_rollouts,
        num_iterations=1,
        shuffle_dataset=True,
        remove_unused_columns=False,  # the reward needs data_source, reward_model, extra_info
        # sampling
        max_completion_length=train.max_response_length,
        temperature=train.temperature,
        top_p=train.top_p,
        top_k=0,
        repetition_penalty=1.0,
        **rollout_engine_kwargs(cfg, stop_token_ids),
        # loss: GRPO without a KL term (the recipe's kl coefficient is 0). The reward function already
        # returns verl's group-normalised advantage, so TRL must not rescale it (see repexp.trl.reward).
        beta=0.0,
        epsilon=train.clip_ratio,
        loss_type=C.TRL_LOSS_TYPES[train.loss_agg_mode],
        scale_rewards="none",
        mask_truncated_completions=False,
        importance_sampling_level="token",
        entropy_coef=train.entropy_coeff,
        # precision and device
        use_cpu=use_cpu,
        bf16=trl.dtype == "bfloat16",
        fp16=False,
        gradient_checkpointing=trl.gradient_checkpointing,
        # logging and saving happen at step boundaries; evaluation is ours (dev pass@k), not TRL's
        logging_strategy="steps",
        logging_steps=k * trl.logging_steps,
        save_strategy="steps",
        save_steps=k * train.save_freq,
        save_only_model=False,
        eval_strategy="no",
        report_to="none",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def rollout_engine_kwargs(cfg: RunConfig, stop_token_ids: Optional[Sequence[int]]) -> dict[str, Any]:
    """The `GRPOConfig` keys of `trl.rollout_engine`. `hf`: TRL's generate path (`use_vllm=False`), unchanged.
    `vllm`: TRL's colocate mode, one engine in this process (tensor parallel 1, TRL's external launcher), its
    context the longest prompt kept plus the response; the sampling settings above (temperature, top_p,
    top_k off, repetition penalty 1, max_completion_length, num_generations) are the ones TRL passes to both
    paths; stop tokens made TRL's `eos_token_ids` explicitly; no importance-sampling correction, so the
    loss is the `hf` path's (and verl's): the PPO ratio against the trainer's own log-probs."""
    if cfg.trl.rollout_engine != "vllm":
        return dict(use_vllm=False)
    if not stop_token_ids:
        raise ValueError("trl.rollout_engine vllm: the policy's stop token ids are needed (TRL's eos_token_ids)")
    train, trl = cfg.train, cfg.trl
    return dict(
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=C.trl_vllm_memory_utilization(trl),
        vllm_max_model_length=train.max_prompt_length + train.max_response_length,
        vllm_tensor_parallel_size=1,
        vllm_enable_sleep_mode=trl.vllm_sleep_mode,
        vllm_importance_sampling_correction=False,
        generation_kwargs={"stop_token_ids": [int(t) for t in stop_token_ids]},
    )


def check_completions(completion_ids: Sequence[Sequence[int]], stop_token_ids: Sequence[int], max_tokens: int) -> None:
    """Completions as TRL's generate path leaves them: at most `max_tokens` tokens, a stop token only as the
    last one, and a completion shorter than `max_tokens` ends with one (kept, as the generate path keeps the
    first EOS). RuntimeError otherwise: the engines would hand the reward and the loss different sequences."""
    stops = set(int(t) for t in stop_token_ids)
    for i, ids in enumerate(completion_ids):
        ids = list(ids)
        if len(ids) > max_tokens:
            raise RuntimeError(f"completion {i}: {len(ids)} tokens, more than max_completion_length {max_tokens}")
        inner = [t for t in ids[:-1] if int(t) in stops]
        if inner:
            raise RuntimeError(f"completion {i}: stop token {inner[0]} before its end (the engine did not stop at it)")
        if len(ids) < max_tokens and (not ids or int(ids[-1]) not in stops):
            raise RuntimeError(f"completion {i}: {len(ids)} tokens without a final stop token (the engine dropped "
                               f"it; the generate path keeps the first of {sorted(stops)})")
