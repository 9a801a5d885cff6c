"""`RepExpReward`: the one TRL reward function of a run, for every training method of `repexp.methods`.

TRL calls it once per generation batch (one training step); completions i·n … i·n + n − 1 share a
prompt (TRL's RepeatSampler). Each decoded completion is scored by `repexp.verify.score` under the
run's grader. What the run's method adds goes where its `Method.hooks` say (`shape` and `advantages`
hold the only per-method branches; docs/trl_backend.md, "Methods on TRL"):

- `reward` hook, a term added to the verifier score before the group normalisation.
  RepExp: α·score + β·bonus. The frozen model's features (`repexp.features.completion_features`) go
  through the step verl runs too (`repexp.bonus_step.compute_step_bonus`, persistent covariance keyed
  by `extra_info.index`) in float32, the precision this reward has always had.
- No reward hook (GRPO, pass@k, outcome exploration, KL-Cov / Clip-Cov): α·score, GRPO's reward on
  this backend.
- `advantage` hook, the returned value is the method's advantage, and `RepExpGRPOTrainer` trains on it
  as returned (not on TRL's group-mean-subtracted copy). pass@k: `passk_advantages` of the verifier
  scores. Outcome exploration: the normalised reward plus `repexp.methods.outcome.outcome_bonus` of
  each completion's final answer (`final_answer` under the run's grader), after the normalisation as
  in the paper's objective; the historical answer counts are keyed by the row's
  `extra_info.problem_id` (else `extra_info.index`).
- `loss` hook: nothing here; `RepExpGRPOTrainer` computes the policy loss (repexp.trl.train).

Training state (the persistent covariance, the historical answer counts) is written into every
checkpoint by `save_state` and read back by `load_state`, so a resumed run equals an uninterrupted one.

Without an advantage hook the shaped reward is returned normalised within each group exactly as
verl's GRPO advantage, (r − mean) / (unbiased std + 1e-6); TRL runs with `scale_rewards="none"`, so
its own mean subtraction leaves these values unchanged. (TRL's group scaling would divide by
std + 1e-4, which damps the advantage of groups whose shaped rewards differ only by a small β·bonus
spread, e.g. all-correct groups: the two backends would no longer agree.) Metrics use the names
shared with the verl backend (repexp.metrics); `rollout/distinct_frac`, `rollout/all_correct_identical_frac`,
`rollout/distinct_answers` (`rollout_diversity`) and the timings are added here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from repexp import layout, methods, verify
from repexp import metrics as metric_names
from repexp.bonus_step import BonusState, compute_step_bonus, group_metrics
from repexp.config import ConfigError, RunConfig
from repexp.features import completion_features, load_backbone
from repexp.io import read_json, write_json_atomic
from repexp.methods.outcome import AnswerCounts, final_answer, outcome_bonus
from repexp.methods.passk import passk_advantages

GRPO_EPSILON = 1e-6  # verl's compute_grpo_outcome_advantage


def group_normalized(rewards: torch.Tensor, group_size: int, epsilon: float = GRPO_EPSILON) -> torch.Tensor:
    """verl's GRPO advantage of consecutive groups (`shape` checks them): (r − mean) / (unbiased std + ε)."""
    grouped = rewards.double().view(-1, group_size)
    normalized = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + epsilon)
    return normalized.view(-1).float()


def question_key(info: Optional[dict]) -> str:
    """The key of a row's question in outcome exploration's answer counts: `extra_info.problem_id`,
    else `extra_info.index` (stable across epochs and resumes, unlike the row's position in a batch)."""
    info = info or {}
    for name in ("problem_id", "index"):
        if info.get(name) is not None:
            return str(info[name])
    raise ValueError("extra_info.problem_id: every training row needs it (or extra_info.index), the question key "
                     "of outcome exploration's answer counts")


def prompt_token_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """The prompt's token ids exactly as TRL renders them: a chat's template with the generation prompt."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(rendered["input_ids"])


class RepExpReward:
    """Callable TRL reward function (see the module docstring): returns the advantage of every
    completion; `last_shaped` keeps the shaped reward (verifier score plus the method's reward term)
    and `last_advantages` what was returned, of the last call. Stateful only through the persistent
    covariance and the answer counts, which `save_state` / `load_state` carry across resumes."""

    __name__ = "repexp"  # TRL names the reward column after the function (its statistics: TRL_DROPPED)

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
        self.method = methods.method(cfg.method)
        self.settings = cfg.settings  # the method's Params
        self.tokenizer = tokenizer
        self.n = cfg.train.n_rollouts
        self.beta = float(cfg.beta)
        self.optimizer_steps_per_step = optimizer_steps_per_step
        key = "bonus.representation_model" if cfg.bonus.representation_model else "model"
        self._backbone_loader = backbone_loader or functools.partial(
            load_backbone, cfg.bonus.representation_model or cfg.model, dtype=dtype, device=device, key=key)
        self._backbone: Optional[torch.nn.Module] = None
        # projection and persistent covariance across steps; β = 0 runs have no sparse_dim and no bonus
        self._state = BonusState(cfg.bonus, sparse_dim=cfg.sparse_dim, seed=cfg.seed) if self.enabled else None
        # outcome exploration's historical answer counts N(question, answer), training state
        historical = self.method.name == "outcome" and self.settings.outcome_mode == "historical"
        self.answer_counts: Optional[AnswerCounts] = AnswerCounts() if historical else None
        # Counters the tests and the benchmark read: β = 0 must leave both at 0.
        self.backbone_loads = 0
        self.forward_calls = 0
        self.last_metrics: dict[str, float] = {}
        self.last_shaped: Optional[torch.Tensor] = None
        self.last_advantages: Optional[torch.Tensor] = None

    # ----------------------------------------------------------------- frozen model

    @property
    def enabled(self) -> bool:
        return self.beta > 0

    @property
    def backbone(self) -> torch.nn.Module:
        if self._backbone is None:
            if not self.enabled:
                raise RuntimeError("the representation model is not used when beta is 0")
            self._backbone = self._backbone_loader()
            vocab = getattr(self._backbone.config, "vocab_size", None)
            if vocab is not None and vocab < len(self.tokenizer):
                raise ConfigError(
                    f"bonus.representation_model: its vocabulary ({vocab}) is smaller than the policy tokenizer's "
                    f"({len(self.tokenizer)}); the representation model must share the policy's tokenizer"
                )
            self.backbone_loads += 1
        return self._backbone

    # ----------------------------------------------------------------- training state

    @property
    def _persists(self) -> bool:
        return self.enabled and self.cfg.bonus.persist_covariance

    def save_state(self, directory: Path) -> None:
        """Write the training state (persistent covariance, answer counts; if any) into a checkpoint directory."""
        if self._persists:
            torch.save(self._state.covariance.state_dict(), Path(directory) / layout.TRL_COVARIANCE)
        if self.answer_counts is not None:
            write_json_atomic(Path(directory) / layout.TRL_OUTCOME_COUNTS, self.answer_counts.state_dict())

    def load_state(self, directory: Path) -> None:
        path = Path(directory) / layout.TRL_COVARIANCE
        if self._persists:
            if not path.exists():
                raise FileNotFoundError(f"{path}: missing; the checkpoint has no persistent covariance to resume")
            self._state.covariance.load_state_dict(torch.load(path, weights_only=True))
        path = Path(directory) / layout.TRL_OUTCOME_COUNTS
        if self.answer_counts is not None:
            if not path.exists():
                raise FileNotFoundError(f"{path}: missing; the checkpoint has no answer counts to resume")
            self.answer_counts.load_state_dict(read_json(path))

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
        if self._persists:
            if extra_info is None or any("index" not in (info or {}) for info in extra_info):
                raise ValueError("extra_info.index: every training row needs it (the key of bonus.persist_covariance)")
            prompt_keys = [int(info["index"]) for info in extra_info]
        question_keys = None
        # every rollout's final answer: outcome exploration's bonus, and the distinct answers of every method
        answers = [final_answer(source, response, self.cfg.grader) for source, response in zip(data_source, responses)]
        if self.method.name == "outcome":
            question_keys = [question_key(info) for info in (extra_info or [None] * len(responses))]
        shaped, metrics = self.shape(prompts, completion_ids, scores, step=step, prompt_keys=prompt_keys,
                                     answers=answers)
        advantages, advantage_metrics = self.advantages(shaped, scores, question_keys=question_keys, answers=answers)
        metrics.update(advantage_metrics)
        self.last_shaped, self.last_advantages, self.last_metrics = shaped, advantages, metrics
        if log_metric is not None:
            for name, value in metrics.items():
                log_metric(name, value)
        return advantages.tolist()

    def advantages(
        self,
        shaped: torch.Tensor,
        scores: Sequence[float],
        *,
        question_keys: Optional[Sequence[str]] = None,
        answers: Optional[Sequence[Optional[str]]] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """What TRL receives per completion (float32) and the advantage hook's metrics: the shaped reward
        normalised per group (verl's GRPO advantage), or the method's own advantage (`advantage` hook).
        `question_keys` and `answers` (final answers, None for none): outcome exploration."""
        normalized = group_normalized(shaped, self.n)
        if "advantage" not in self.method.hooks:
            return normalized, {}
        groups = [i // self.n for i in range(len(scores))]
        extrinsic = torch.tensor(scores, dtype=torch.float64)
        if self.method.name == "passk":  # replaces GRPO's advantage
            advantages = passk_advantages(extrinsic, groups, self.settings.passk_k)
            return advantages.float(), metric_names.passk_metrics(groups, scores, advantages.numpy(),
                                                                  self.settings.passk_k)
        if self.method.name == "outcome":  # c·bonus added to GRPO's advantage; historical mode counts the answers
            if question_keys is None or answers is None:
                raise ValueError("outcome exploration needs every completion's question key and final answer")
            bonus, metrics = outcome_bonus(self.settings, groups=groups, question_keys=question_keys,
                                           answers=answers, scores=extrinsic, state=self.answer_counts)
            return (normalized.double() + bonus).float(), metrics
        raise NotImplementedError(f"method {self.method.name!r}: its advantage hook has no TRL adapter")

    def shape(
        self,
        prompts: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        scores: Sequence[float],
        *,
        step: int,
        prompt_keys: Optional[Sequence[int]] = None,
        answers: Optional[Sequence[Optional[str]]] = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Shaped rewards [B] (float32, CPU) and the step's metrics, from verifier scores: α·score, or
        with a `reward` hook, its shaping. `prompt_keys`: RepExp's persistent covariance; `answers`: the
        rows' final answers (the distinct-answers metric)."""
        batch = len(completion_ids)
        if batch % self.n:
            raise ValueError(f"{batch} completions is not a whole number of groups of n_rollouts={self.n}")
        # TRL's RepeatSampler puts a prompt's n completions next to each other; the bonus relies on it.
        for start in range(0, len(prompts), self.n):
            if any(prompt != prompts[start] for prompt in prompts[start + 1 : start + self.n]):
                raise RuntimeError(
                    f"completions {start}..{start + self.n - 1} do not share one prompt; the bonus needs TRL's "
                    "grouping of num_generations consecutive completions per prompt (one process only)"
                )
        groups = [i // self.n for i in range(batch)]
        extrinsic = torch.tensor(scores, dtype=torch.float64)
        metrics: dict[str, float] = {}
        if "reward" not in self.method.hooks:
            # α·score even without the bonus, as combine_rewards always gave this reward (verl leaves β = 0
            # scores unscaled; the group-normalised advantage barely depends on α)
            shaped = (float(self.cfg.bonus.alpha) * extrinsic).float()
            metrics.update(group_metrics(groups, extrinsic, shaped=shaped))
        elif self.method.name == "repexp":
            backbone = self.backbone  # loaded on first use, outside the timed forward
            start = time.perf_counter()
            rendered = [prompt_token_ids(self.tokenizer, prompt) for prompt in prompts[:: self.n]]  # once a group
            features = completion_features(
                backbone,
                [ids for ids in rendered for _ in range(self.n)],
                completion_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                micro_batch_size=self.cfg.trl.bonus_micro_batch_size,
            )
            self.forward_calls += 1
            metrics[metric_names.timing(metric_names.TIMER_REPEXP_FORWARD)] = time.perf_counter() - start
            start = time.perf_counter()
            result = compute_step_bonus(features, groups, extrinsic, self.cfg.bonus, beta=self.beta, step=step,
                                        state=self._state, prompt_keys=prompt_keys, dtype=torch.float32)
            metrics[metric_names.timing(metric_names.TIMER_REPEXP_BONUS)] = time.perf_counter() - start
            metrics.update(result.metrics)
            shaped = result.shaped
        else:
            raise NotImplementedError(f"method {self.method.name!r}: its reward hook has no TRL adapter")
        metrics.update(metric_names.rollout_diversity(groups, completion_ids, scores=scores, answers=answers))
        return shaped, metrics
