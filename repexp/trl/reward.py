"""`RepExpReward`: the one TRL reward function of a run, returning α·score + β·bonus per completion.

TRL calls it once per generation batch (one training step) with every completion of the step;
completions i·n … i·n + n − 1 share a prompt (TRL's RepeatSampler). Per call:

1. decode each completion (special tokens skipped, as in evaluation) and score it with
   `repexp.verify.score` under the run's grader (0/1);
2. β > 0 only: mean-pool the frozen representation model's last hidden state over each
   completion (`repexp.features.completion_features`), project with `repexp.elliptical.sparse_projection`
   (seeded by (seed, step) when `bonus.randomize_projection`, else by seed), and compute the
   per-group bonus with `repexp.elliptical.bonuses` (or `PersistentCovariance`, keyed by
   `extra_info.index`);
3. `repexp.elliptical.combine_rewards` applies α, β and the turn-off rules.

4. the shaped reward is normalised within each group exactly as verl's GRPO advantage,
   (r − mean) / (unbiased std + 1e-6), and returned; TRL runs with `scale_rewards="none"`, so
   its own mean subtraction leaves these values unchanged. (TRL's group scaling would divide by
   std + 1e-4, which damps the advantage of groups whose shaped rewards differ only by a small
   β·bonus spread, e.g. all-correct groups: the two backends would no longer agree.)

β = 0 never loads the representation model. Metrics use the names shared with the verl
backend (docs/architecture.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from repexp import elliptical, layout, verify
from repexp import metrics as metric_names
from repexp.config import ConfigError, RunConfig
from repexp.features import completion_features, load_backbone

COVARIANCE_STATE_FILE = layout.TRL_COVARIANCE
GRPO_EPSILON = 1e-6  # verl's compute_grpo_outcome_advantage


def group_normalized(rewards: torch.Tensor, group_size: int, epsilon: float = GRPO_EPSILON) -> torch.Tensor:
    """verl's GRPO advantage of consecutive groups: (r − group mean) / (group unbiased std + ε)."""
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not form groups of {group_size} (>= 2) rollouts")
    grouped = rewards.double().view(-1, group_size)
    normalized = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + epsilon)
    return normalized.view(-1).float()


class RepExpReward:
    """Callable TRL reward function (see the module docstring): returns the group-normalised
    shaped reward; `last_shaped` keeps α·score + β·bonus of the last call. Stateful only through
    the optional persistent covariance, which `save_state` / `load_state` carry across resumes."""

    __name__ = "repexp"  # TRL names the reward column after the function

    def __init__(
        self,
        cfg: RunConfig,
        tokenizer: Any,
        *,
        optimizer_steps_per_step: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        backbone_loader: Optional[Callable[[], torch.nn.Module]] = None,
    ):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.n = cfg.train.n_rollouts
        self.beta = float(cfg.beta)
        self.alpha = float(cfg.bonus.alpha)
        self.optimizer_steps_per_step = optimizer_steps_per_step
        self.device = device
        self.dtype = dtype
        self.representation_path = cfg.bonus.representation_model or cfg.model
        self._backbone_loader = backbone_loader
        self._backbone: Optional[torch.nn.Module] = None
        self._covariance: Optional[elliptical.PersistentCovariance] = None
        self._pending_covariance_state: Optional[dict] = None
        # Counters the tests and the benchmark read: β = 0 must leave both at 0.
        self.backbone_loads = 0
        self.forward_calls = 0
        self.last_metrics: dict[str, float] = {}
        self.last_shaped: Optional[torch.Tensor] = None

    # ----------------------------------------------------------------- frozen model

    @property
    def enabled(self) -> bool:
        return self.beta > 0

    @property
    def backbone(self) -> torch.nn.Module:
        if self._backbone is None:
            if not self.enabled:
                raise RuntimeError("the representation model is not used when beta is 0")
            if self._backbone_loader is not None:
                self._backbone = self._backbone_loader()
            else:
                key = "bonus.representation_model" if self.cfg.bonus.representation_model else "model"
                self._backbone = load_backbone(self.representation_path, dtype=self.dtype, device=self.device, key=key)
            vocab = getattr(self._backbone.config, "vocab_size", None)
            if vocab is not None and vocab < len(self.tokenizer):
                raise ConfigError(
                    f"bonus.representation_model: its vocabulary ({vocab}) is smaller than the policy tokenizer's "
                    f"({len(self.tokenizer)}); the representation model must share the policy's tokenizer"
                )
            self.backbone_loads += 1
        return self._backbone

    # ----------------------------------------------------------------- persistent covariance

    def _persistent(self, dim: int) -> elliptical.PersistentCovariance:
        if self._covariance is None:
            bonus = self.cfg.bonus
            self._covariance = elliptical.PersistentCovariance(
                dim, lamb=bonus.lamb, reward_type=bonus.reward_type, normalization=bonus.normalization
            )
            if self._pending_covariance_state is not None:
                self._covariance.load_state_dict(self._pending_covariance_state)
                self._pending_covariance_state = None
        return self._covariance

    def save_state(self, directory: Path) -> None:
        """Write the persistent covariance (if any) into a checkpoint directory."""
        if self._covariance is not None:
            torch.save(self._covariance.state_dict(), Path(directory) / COVARIANCE_STATE_FILE)
        elif self._pending_covariance_state is not None:  # resumed but not stepped since
            torch.save(self._pending_covariance_state, Path(directory) / COVARIANCE_STATE_FILE)

    def load_state(self, directory: Path) -> None:
        path = Path(directory) / COVARIANCE_STATE_FILE
        if self.cfg.bonus.persist_covariance and self.enabled:
            if not path.exists():
                raise FileNotFoundError(f"{path}: missing; the checkpoint has no persistent covariance to resume")
            self._pending_covariance_state = torch.load(path, weights_only=True)
            self._covariance = None

    # ----------------------------------------------------------------- the reward

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        *,
        data_source: Sequence[str],
        reward_model: Sequence[dict],
        extra_info: Optional[Sequence[dict]] = None,
        trainer_state: Any = None,
        log_metric: Optional[Callable[[str, float], None]] = None,
        **_: Any,
    ) -> list[float]:
        step = 1 if trainer_state is None else trainer_state.global_step // self.optimizer_steps_per_step + 1
        responses = self.tokenizer.batch_decode([list(ids) for ids in completion_ids], skip_special_tokens=True)
        scores = [
            verify.score(source, response, str(rm["ground_truth"]), grader=self.cfg.grader)
            for source, response, rm in zip(data_source, responses, reward_model)
        ]
        prompt_keys = None
        if self.enabled and self.cfg.bonus.persist_covariance:
            if extra_info is None or any("index" not in (info or {}) for info in extra_info):
                raise ValueError("extra_info.index: every training row needs it (the key of bonus.persist_covariance)")
            prompt_keys = [int(info["index"]) for info in extra_info]
        shaped, metrics = self.shape(prompts, completion_ids, scores, step=step, prompt_keys=prompt_keys)
        self.last_shaped, self.last_metrics = shaped, metrics
        if log_metric is not None:
            for name, value in metrics.items():
                log_metric(name, value)
        return group_normalized(shaped, self.n).tolist()

    def shape(
        self,
        prompts: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        scores: Sequence[float],
        *,
        step: int,
        prompt_keys: Optional[Sequence[int]] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Shaped rewards [B] (float32, CPU) and the step's metrics, from verifier scores."""
        batch = len(completion_ids)
        if batch % self.n:
            raise ValueError(f"{batch} completions is not a whole number of groups of n_rollouts={self.n}")
        self._check_groups(prompts)
        num_groups = batch // self.n
        groups = torch.arange(batch) // self.n
        extrinsic = torch.tensor(scores, dtype=torch.float64)
        metrics: dict[str, float] = {}
        hidden_norms = None
        if self.enabled:
            backbone = self.backbone  # loaded on first use, outside the timed forward
            start = time.perf_counter()
            features = completion_features(
                backbone,
                self._prompt_token_ids(prompts),
                completion_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                micro_batch_size=self.cfg.trl.bonus_micro_batch_size,
            )
            self.forward_calls += 1
            metrics[metric_names.timing(metric_names.TIMER_REPEXP_FORWARD)] = time.perf_counter() - start
            start = time.perf_counter()
            hidden_norms = features.double().norm(dim=1).cpu()
            raw = self._bonus(features, groups.to(features.device), num_groups, step, prompt_keys)
        else:
            raw = torch.zeros(batch, dtype=torch.float32)
            start = time.perf_counter()
        bonus = self.cfg.bonus
        combined = elliptical.combine_rewards(
            extrinsic,
            raw.cpu(),
            groups,
            alpha=self.alpha,
            beta=self.beta,
            turn_off_if_none_correct=bonus.turn_off_if_none_correct,
            turn_off_if_some_correct=bonus.turn_off_if_some_correct,
            turn_off_if_all_correct=bonus.turn_off_if_all_correct,
            turn_off_if_rollout_incorrect=bonus.turn_off_if_rollout_incorrect,
            num_groups=num_groups,
        )
        if self.enabled:
            metrics[metric_names.timing(metric_names.TIMER_REPEXP_BONUS)] = time.perf_counter() - start
            metrics.update(metric_names.bonus_metrics(raw.double().cpu(), combined.intrinsic.double().cpu(),
                                                      self.beta, hidden_norms))
        metrics.update(metric_names.group_metrics(combined.status_fractions(), extrinsic, combined.total.double()))
        metrics.update(metric_names.distinct_fraction(groups.tolist(), completion_ids))
        return combined.total, metrics

    def _bonus(
        self, features: torch.Tensor, groups: torch.Tensor, num_groups: int, step: int,
        prompt_keys: Optional[Sequence[int]],
    ) -> torch.Tensor:
        bonus = self.cfg.bonus
        seed = elliptical.projection_seed(self.cfg.seed, step, bonus.randomize_projection)
        projection = elliptical.sparse_projection(
            features.shape[1], int(self.cfg.sparse_dim), seed=seed, dtype=features.dtype, device=features.device
        )
        projected = features @ projection
        if bonus.persist_covariance:
            return self._persistent(projected.shape[1]).update_and_score(projected, list(prompt_keys))
        return elliptical.bonuses(
            projected,
            groups,
            lamb=bonus.lamb,
            reward_type=bonus.reward_type,
            normalization=bonus.normalization,
            center=bonus.center,
            num_groups=num_groups,
            max_group_size=self.n,
        )

    def _check_groups(self, prompts: Sequence[Any]) -> None:
        # TRL's RepeatSampler puts a prompt's n completions next to each other; the bonus relies on it.
        for start in range(0, len(prompts), self.n):
            first = prompts[start]
            if any(prompts[i] != first for i in range(start + 1, start + self.n)):
                raise RuntimeError(
                    f"completions {start}..{start + self.n - 1} do not share one prompt; the bonus needs TRL's "
                    "grouping of num_generations consecutive completions per prompt (one process only)"
                )

    def _prompt_token_ids(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt token ids exactly as TRL renders them (chat template with the generation prompt)."""
        cache: dict[str, list[int]] = {}
        ids = []
        for prompt in prompts:
            key = json.dumps(prompt, sort_keys=True, default=str)
            if key not in cache:
                if isinstance(prompt, str):
                    cache[key] = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
                else:
                    rendered = self.tokenizer.apply_chat_template(
                        prompt, add_generation_prompt=True, tokenize=True, return_dict=True
                    )
                    cache[key] = list(rendered["input_ids"])
            ids.append(cache[key])
        return ids
