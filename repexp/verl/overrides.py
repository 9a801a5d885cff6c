"""One `RunConfig` -> the Hydra overrides of ``python -m repexp.verl.train`` (pure but for `attention=None`).

Every setting comes from the single `RunConfig`, never the environment. Keys are plain overrides of keys
of the composed config (never ``+key``, but for vLLM's engine arguments, a free-form mapping), so a
misspelled key fails Hydra's struct check. The bonus goes as
one override of one typed node, ``actor_rollout_ref.repexp.bonus={...}`` (schema: `BonusConfig`,
repexp/verl/config/__init__.py). Settings verl reads from two places are set in both (PPO clip:
``clip_ratio`` *and* ``clip_ratio_low``/``clip_ratio_high``, which win when set). `verl.overrides` come last.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from repexp import layout
from repexp.config import RunConfig, check_trains, check_verl_overrides
from repexp.verl import reward
from repexp.verl.attention import Attention, flash_attn_error, resolve

REWARD_FUNCTION = "pkg://repexp.verl.reward"
# the analytic pass@k advantage (repexp.methods.passk), registered in verl's estimator registry by
# repexp.verl.methods; verl's own `grpo_passk` is a different estimator (arXiv 2503.19595)
PASSK_ESTIMATOR = "repexp_passk"
ADV_ESTIMATOR_KEY = "algorithm.adv_estimator"
POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
# what verl runs for every method unless `method_settings` says otherwise: GRPO's advantage, PPO's loss
BASE_METHOD_SETTINGS = {ADV_ESTIMATOR_KEY: "grpo", f"{POLICY_LOSS}.loss_mode": "vanilla"}

_BARE = re.compile(r"^[A-Za-z0-9_./:-]+$")


def hydra_value(value: Any) -> str:
    """A Hydra override value: strings quoted unless plainly safe, lists bracketed, mappings braced (their
    strings always quoted: a bare ``:`` would split a key from its value), None -> null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_quoted(v) if isinstance(v, str) else hydra_value(v)}"
                              for k, v in value.items()) + "}"
    text = str(value)
    try:
        float(text)  # a string that reads as a number stays a string
    except ValueError:
        if _BARE.match(text) and text.lower() not in {"null", "true", "false"}:
            return text
    return _quoted(text)


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _model_path(model: str) -> str:
    """Local directories become absolute (Ray workers have their own cwd); Hub ids stay as they are."""
    path = Path(model)
    return str(path.resolve()) if path.exists() else model


def method_settings(method: str, params: Any) -> dict[str, Any]:
    """The verl keys a training method sets (its `Params` -> verl 0.9.1's own settings), on top of
    `BASE_METHOD_SETTINGS`. pass@k: the `repexp_passk` estimator (k travels in ``actor_rollout_ref.repexp.params``:
    verl's AlgoConfig takes no extra keys). KL-Cov / Clip-Cov: verl's ``policy_loss.loss_mode`` and its
    ratio, coefficient and window. RepExp, GRPO and outcome exploration change the reward only (the trainer)."""
    if method == "passk":
        return {ADV_ESTIMATOR_KEY: PASSK_ESTIMATOR}
    if method == "cov":
        mode = params.loss_mode
        if mode == "kl_cov":
            own = {"kl_cov_ratio": params.cov_ratio, "ppo_kl_coef": params.cov_kl_coef}
        else:
            own = {"clip_cov_ratio": params.cov_ratio, "clip_cov_lb": params.cov_clip_lb,
                   "clip_cov_ub": params.cov_clip_ub}
        return {f"{POLICY_LOSS}.loss_mode": mode, **{f"{POLICY_LOSS}.{key}": value for key, value in own.items()}}
    return {}


def build_overrides(run_config: RunConfig, attention: Optional[Attention] = None, *,
                    loggers: Optional[Sequence[str]] = None, chunk_deadline: Optional[float] = None) -> list[str]:
    """The verl Hydra overrides of one training run of any method (repexp.methods; GRPO: beta 0, no sparse_dim).

    ``attention``: what `repexp.verl.attention.resolve` decided on the job's node (`repexp run train` resolves
    and logs it once); None resolves `verl.attn_implementation` here (the one non-pure step: it imports flash_attn).
    ``loggers`` defaults to console (+ mlflow when ``tracking.tracking_uri`` is set); verl's MLflow logger reads
    ``MLFLOW_TRACKING_URI`` and ``MLFLOW_RUN_ID`` from the environment, which the entry point and node wrapper set.
    ``chunk_deadline``: when this allocation's walltime chunk must have saved and stopped (epoch seconds).
    """
    rc = run_config
    # A RunConfig need not come from a checked pipeline config: the pipeline's own rules, not copies.
    check_trains(rc, "verl")
    check_verl_overrides(rc.verl.overrides, "verl.overrides")
    train, verl, bonus = rc.train, rc.verl, rc.bonus
    if attention is None:
        attention = resolve(verl.attn_implementation, verl.use_remove_padding, flash_attn_error())
    run_dir = Path(rc.run_dir).resolve()
    data_dir = Path(rc.data_dir).resolve()
    model = _model_path(rc.model)
    settings: list[tuple[str, Any]] = [
        # data: seeded order, the task's splits, the recipe's filters
        ("data.train_files", str(layout.split_file(data_dir, "train"))),
        ("data.val_files", str(layout.split_file(data_dir, "dev"))),
        ("data.prompt_key", "prompt"),
        ("data.train_batch_size", train.train_batch_size),
        ("data.max_prompt_length", train.max_prompt_length),
        ("data.max_response_length", train.max_response_length),
        ("data.filter_overlong_prompts", True),
        ("data.truncation", "error"),
        ("data.shuffle", True),
        ("data.seed", rc.seed),
        # GRPO without KL (adv_estimator, use_kl_in_reward, use_kl_loss, kl_loss_coef: repexp_trainer.yaml)
        ("algorithm.norm_adv_by_std_in_grpo", True),
        ("actor_rollout_ref.model.path", model),
        ("actor_rollout_ref.model.use_remove_padding", attention.packing),
        ("actor_rollout_ref.model.override_config.attn_implementation", attention.implementation),
        ("actor_rollout_ref.repexp.attn_implementation", attention.implementation),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", verl.enable_gradient_checkpointing),
        ("actor_rollout_ref.actor.strategy", verl.strategy),
        ("actor_rollout_ref.actor.optim.lr", train.lr),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", train.ppo_mini_batch_size),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", train.micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.ppo_epochs", 1),
        ("actor_rollout_ref.actor.entropy_coeff", train.entropy_coeff),
        ("actor_rollout_ref.actor.loss_agg_mode", train.loss_agg_mode),
        ("actor_rollout_ref.actor.clip_ratio", train.clip_ratio),
        ("actor_rollout_ref.actor.clip_ratio_low", train.clip_ratio),
        ("actor_rollout_ref.actor.clip_ratio_high", train.clip_ratio),
        ("actor_rollout_ref.actor.data_loader_seed", rc.seed),
        ("actor_rollout_ref.actor.fsdp_config.seed", rc.seed),
        ("actor_rollout_ref.rollout.name", "vllm"),
        ("actor_rollout_ref.rollout.n", train.n_rollouts),
        ("actor_rollout_ref.rollout.temperature", train.temperature),
        ("actor_rollout_ref.rollout.top_p", train.top_p),
        ("actor_rollout_ref.rollout.seed", rc.seed),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", verl.rollout_tensor_parallel_size),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", verl.gpu_memory_utilization),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", verl.max_num_batched_tokens),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", verl.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.rollout.val_kwargs.n", train.val_n),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample", True),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", train.temperature),
        ("actor_rollout_ref.rollout.val_kwargs.top_p", train.top_p),
        # the one 0/1 verifier for training and dev (repexp.verify), under the run's grader
        ("reward.custom_reward_function.path", REWARD_FUNCTION),
        ("reward.custom_reward_function.name", reward.FUNCTION_NAMES[rc.grader]),
        # RepExp: the sweep point (beta = 0 is the GRPO baseline: no representation model is built, and
        # no sparse_dim) and the bonus section as one node; a local representation model made absolute
        ("actor_rollout_ref.repexp.beta", float(rc.beta)),
        ("actor_rollout_ref.repexp.sparse_dim", rc.sparse_dim),
        ("actor_rollout_ref.repexp.seed", rc.seed),
        # the run's method and its parameters (checked again by RepExpSettings.from_mapping), then the verl
        # settings it maps to (advantage estimator, policy loss)
        ("actor_rollout_ref.repexp.method", rc.method),
        ("actor_rollout_ref.repexp.params", dict(rc.params)),
        *{**BASE_METHOD_SETTINGS, **method_settings(rc.method, rc.settings)}.items(),
        ("actor_rollout_ref.repexp.bonus", dataclasses.asdict(dataclasses.replace(
            bonus, representation_model=bonus.representation_model and _model_path(bonus.representation_model)))),
        ("actor_rollout_ref.repexp.micro_batch_size_per_gpu", verl.repexp_micro_batch_size_per_gpu),
        # trainer: layout under the run directory, resumable, our own checkpoint pruning
        ("trainer.project_name", rc.tracking.experiment or rc.config_name),
        ("trainer.experiment_name", f"{rc.task}/{rc.run}"),
        ("trainer.logger", list(loggers) if loggers is not None else
         ["console", "mlflow"] if rc.tracking.tracking_uri else ["console"]),
        ("trainer.n_gpus_per_node", verl.n_gpus_per_node),
        ("trainer.nnodes", verl.nnodes),
        ("trainer.total_epochs", train.total_epochs),
        ("trainer.total_training_steps", train.total_steps),
        ("trainer.test_freq", train.test_freq),
        ("trainer.save_freq", train.save_freq),
        ("trainer.val_before_train", train.val_before_train),
        ("trainer.critic_warmup", 0),
        ("trainer.default_local_dir", str(layout.checkpoints_dir(run_dir))),
        ("trainer.resume_mode", "auto"),
        ("trainer.max_actor_ckpt_to_keep", None),
        ("repexp_run.run_dir", str(run_dir)),
        ("repexp_run.max_checkpoints_to_keep", train.max_checkpoints_to_keep),
        ("repexp_run.prune_when_done", train.prune_when_done),
        ("repexp_run.chunk_deadline", chunk_deadline),
        ("repexp_run.mlflow_tracking_uri", rc.tracking.tracking_uri),
        ("repexp_run.replay_poll_seconds", verl.replay_poll_seconds),
        ("ray_kwargs.ray_init.num_cpus", verl.ray_num_cpus),
        ("reward.num_workers", verl.reward_workers),
        ("actor_rollout_ref.rollout.agent.num_workers", verl.agent_workers),
        ("hydra.run.dir", str(run_dir / layout.VERL_HYDRA_DIR)),
    ]
    if verl.dynamic_batch_tokens is not None:  # token-budget micro-batches for every forward that has them
        tokens = verl.dynamic_batch_tokens
        settings += [
            ("actor_rollout_ref.actor.use_dynamic_bsz", True),
            ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", tokens),
            ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", True),
            ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", tokens),
            ("actor_rollout_ref.repexp.use_dynamic_bsz", True),
            ("actor_rollout_ref.repexp.max_token_len_per_gpu", tokens),
        ]
    overrides = [f"{key}={hydra_value(value)}" for key, value in settings]
    if verl.kv_cache_gib is not None:  # verl passes rollout.engine_kwargs.vllm to vLLM's engine as they are
        overrides.append(f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes="
                         f"{int(verl.kv_cache_gib * 2**30)}")
    overrides.extend(verl.overrides)
    return overrides
