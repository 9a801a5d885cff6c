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
from typing import Any

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


def grpo_config_kwargs(cfg: RunConfig, plan: StepPlan, *, output_dir: str, use_cpu: bool) -> dict[str, Any]:
    """Keyword arguments of `trl.GRPOConfig` for this job (see the mapping table in docs/trl_backend.md)."""
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
        use_vllm=False,
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
