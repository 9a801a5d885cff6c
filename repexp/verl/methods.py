"""verl adapters of the training methods beside RepExp (`repexp.methods`), each on one of verl 0.9.1's
extension points; the pure cores are the methods' own (shared with TRL), never restated here.

- ``advantage`` hook (pass@k): `compute_passk_advantage`, registered in verl's advantage-estimator registry
  as ``repexp_passk`` when this module is imported. `repexp.verl.trainer` imports it, so the registration
  happens in the TaskRunner process, where the trainer computes advantages; verl's `_compute_advantage`
  then calls it for ``algorithm.adv_estimator=repexp_passk`` with the rows' rewards, masks and uids. k comes
  from ``actor_rollout_ref.repexp.params.passk_k``: verl's `AlgoConfig` takes no extra key, so the trainer
  hands k to verl's call through its own (driver-side) algorithm node, under `PASSK_K_KEY`.
- ``advantage`` hook (outcome exploration): `OutcomeReward`, the per-rollout term the trainer adds to every
  response token's advantage after verl's GRPO normalisation; its answer counts are training state saved
  beside each checkpoint (`layout.VERL_OUTCOME_STATE`).
- ``loss`` hook (KL-Cov / Clip-Cov): verl's own ``policy_loss.loss_mode``, set by
  `repexp.verl.overrides.method_settings`; nothing runs on the driver.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from repexp.io import write_text_atomic
from repexp.methods.outcome import AnswerCounts, final_answer, outcome_bonus
from repexp.methods.passk import passk_advantages
from repexp.verl.overrides import PASSK_ESTIMATOR

from verl.trainer.ppo.core_algos import register_adv_est

# the key under which the trainer puts k on its own copy of the algorithm node (never in the composed config,
# whose `algorithm` section verl's AlgoConfig must accept)
PASSK_K_KEY = "repexp_passk_k"


@register_adv_est(PASSK_ESTIMATOR)
def compute_passk_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Sequence,
                            config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: the analytic pass@k advantage (`repexp.methods.passk.passk_advantages`) of
    each row's 0/1 score (its reward summed over tokens), grouped by uid (`index`), broadcast over the row's
    response tokens. Rows without a response token (verl's padding rows) take no part and get 0."""
    if config is None or config.get(PASSK_K_KEY) is None:
        raise ValueError(f"{PASSK_ESTIMATOR}: algorithm.{PASSK_K_KEY} missing; pass@k runs through "
                         "repexp.verl.trainer.RepExpTrainer, which sets it from actor_rollout_ref.repexp.params")
    scores = token_level_rewards.sum(dim=-1)
    excluded = response_mask.sum(dim=-1) == 0
    advantages = passk_advantages(scores, list(index), int(config.get(PASSK_K_KEY)), excluded=excluded)
    advantages = advantages.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


class OutcomeReward:
    """Outcome-based exploration's reward term on verl: final answers of the decoded responses under the run's
    grader, per question key, through `repexp.methods.outcome.outcome_bonus` (which reads and then updates the
    historical `AnswerCounts`). Excluded rows (verl's padding rows, empty responses) are neither counted nor
    given a term."""

    def __init__(self, params: Any, grader: str):
        self.params = params
        self.grader = grader
        self.counts = AnswerCounts() if params.outcome_mode == "historical" else None

    def answers(self, tokenizer: Any, data_sources: Sequence[str], responses: Sequence[Sequence[int]]
                ) -> list[Optional[str]]:
        texts = tokenizer.batch_decode([list(tokens) for tokens in responses], skip_special_tokens=True)
        return [final_answer(source, text, self.grader) for source, text in zip(data_sources, texts)]

    def __call__(self, *, tokenizer: Any, groups: Sequence, question_keys: Sequence[str],
                 data_sources: Sequence[str], responses: Sequence[Sequence[int]], scores: torch.Tensor,
                 excluded: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The term of every row (float64 [B], 0 on excluded rows) and the step's metrics."""
        kept = [i for i, flag in enumerate(excluded.tolist()) if not flag]
        answers = self.answers(tokenizer, [data_sources[i] for i in kept], [responses[i] for i in kept])
        bonus, metrics = outcome_bonus(self.params, groups=[groups[i] for i in kept],
                                       question_keys=[question_keys[i] for i in kept], answers=answers,
                                       scores=scores[kept], state=self.counts)
        term = torch.zeros(len(groups), dtype=torch.float64)
        term[kept] = bonus
        return term, metrics

    # ---------------------------------------------------------------- checkpoint state (JSON)

    def save(self, path: Path) -> None:
        if self.counts is not None:
            write_text_atomic(path, json.dumps(self.counts.state_dict(), sort_keys=True))

    def load(self, path: Path) -> None:
        if self.counts is None:
            return
        if not path.exists():
            raise FileNotFoundError(f"{path}: missing; cannot resume outcome exploration's answer counts")
        self.counts.load_state_dict(json.loads(path.read_text()))
