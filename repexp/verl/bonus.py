"""One training step's RepExp bonus on the driver: glue around `repexp.elliptical` (pure torch, no verl).

Inputs are what the trainer reads from TransferQueue after the representation forward: the
response-mean hidden states (B, H), the prompt uid of each row, its verifier score and which rows
take no part (verl's padding rows, empty responses). The maths is `repexp.elliptical`; everything
stays on the device of ``hidden`` (the trainer passes CPU tensors):

1. project with `sparse_projection(H, sparse_dim, seed=projection_seed(seed, step))`: a fresh
   projection every step when ``randomize_projection`` (upstream drew it from an unseeded RNG),
   else one projection from ``seed`` alone; features are float32 @ float32, then float64 (as upstream);
2. per uid group: `bonuses` (centring, leverage or leave-one-out, normalization) or, with
   ``persist_covariance``, `PersistentCovariance.update_and_score` keyed by prompt;
3. `combine_rewards`: the turn-off rules and ``alpha * score + beta * bonus``.

Excluded rows get bonus 0 and are left out of every group and statistic.

Metrics: `repexp.metrics.bonus_metrics` and `group_metrics` over the rows that take part, the same
functions and names as the TRL backend (``repexp/bonus_raw/*``, ``repexp/bonus_scaled/*``,
``repexp/groups/*``, ``reward/verifier/mean``, ...); none when no row takes part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from repexp import metrics as metric_names
from repexp.elliptical import PersistentCovariance, bonuses, combine_rewards, projection_seed, sparse_projection
from repexp.verl.settings import RepExpSettings


class BonusState:
    """What the bonus carries across steps: a fixed projection and the persistent covariance."""

    def __init__(self, settings: RepExpSettings):
        self.settings = settings
        self._fixed_projection: Optional[Tensor] = None
        self._covariance: Optional[PersistentCovariance] = None

    def projection(self, hidden_dim: int, step: int) -> Tensor:
        s = self.settings
        if s.randomize_projection:
            return sparse_projection(hidden_dim, s.sparse_dim, seed=projection_seed(s.seed, step))
        if self._fixed_projection is None or self._fixed_projection.shape[0] != hidden_dim:
            self._fixed_projection = sparse_projection(
                hidden_dim, s.sparse_dim, seed=projection_seed(s.seed, step, randomize=False)
            )
        return self._fixed_projection

    @property
    def covariance(self) -> PersistentCovariance:
        if self._covariance is None:
            s = self.settings
            self._covariance = PersistentCovariance(
                s.sparse_dim, lamb=s.lamb, reward_type=s.reward_type, normalization=s.normalization
            )
        return self._covariance

    def has_state(self) -> bool:
        return self.settings.enabled and self.settings.persist_covariance

    def state_dict(self) -> dict[str, Any]:
        return {"covariance": self.covariance.state_dict() if self.has_state() else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.has_state():
            if state.get("covariance") is None:
                raise ValueError("saved RepExp state has no persistent covariance")
            self.covariance.load_state_dict(state["covariance"])


@dataclass
class StepBonus:
    bonus_raw: Tensor  # (B,) float64, elliptical bonus, 0 for excluded rows
    bonus_scaled: Tensor  # (B,) float64, beta * bonus after the turn-off rules: added to the reward
    shaped: Tensor  # (B,) float64, alpha * score + bonus_scaled
    metrics: dict[str, float]


def _validate_inputs(uids: Sequence[Any], scores: Tensor, excluded: Tensor, rows: int) -> None:
    if len(uids) != rows or scores.shape != (rows,) or excluded.shape != (rows,):
        raise ValueError(
            f"hidden states have {rows} rows but got {len(uids)} uids, scores {tuple(scores.shape)}, "
            f"exclusion mask {tuple(excluded.shape)}"
        )


def group_metrics(
    uids: Sequence[Any], scores: Tensor, excluded: Tensor, shaped: Optional[Tensor] = None
) -> dict[str, float]:
    """Verifier/shaped means and none/some/all-correct group fractions over the rows that take part."""
    _validate_inputs(uids, scores, excluded, len(uids))
    keep = (~excluded.to(scores.device).bool()).nonzero().squeeze(1)
    if keep.numel() == 0:
        return {}
    kept_scores = scores[keep].double()
    combined = combine_rewards(
        kept_scores, torch.zeros_like(kept_scores), [uids[i] for i in keep.tolist()], beta=0.0
    )
    shaped = kept_scores if shaped is None else shaped[keep].double()
    return metric_names.group_metrics(combined.status_fractions(), kept_scores.cpu(), shaped.cpu())


def compute_step_bonus(
    hidden: Tensor,
    uids: Sequence[Any],
    scores: Tensor,
    excluded: Tensor,
    settings: RepExpSettings,
    step: int,
    state: BonusState,
    prompt_keys: Optional[Sequence[Any]] = None,
) -> StepBonus:
    """The bonus of every row of one training batch (see the module docstring)."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden states must be (rows, hidden), got shape {tuple(hidden.shape)}")
    rows, device = hidden.shape[0], hidden.device
    scores = scores.to(device=device, dtype=torch.float64)
    excluded = excluded.to(device).bool()
    _validate_inputs(uids, scores, excluded, rows)
    if settings.persist_covariance and (prompt_keys is None or len(prompt_keys) != rows):
        raise ValueError("persist_covariance needs one prompt key per row")
    keep = (~excluded).nonzero().squeeze(1)
    kept_rows = keep.tolist()
    bonus_raw = torch.zeros(rows, dtype=torch.float64, device=device)
    kept_bonus = torch.zeros(rows, dtype=torch.float64, device=device)
    metrics: dict[str, float] = {}
    if kept_rows:
        kept_uids = [uids[i] for i in kept_rows]
        projection = state.projection(hidden.shape[1], step).to(device=device, dtype=torch.float32)
        features = (hidden[keep].float() @ projection).double()
        if settings.persist_covariance:
            raw = state.covariance.update_and_score(features, [prompt_keys[i] for i in kept_rows])
        else:
            raw = bonuses(
                features, kept_uids, lamb=settings.lamb, reward_type=settings.reward_type,
                normalization=settings.normalization, center=settings.center, out_dtype=torch.float64,
            )
        combined = combine_rewards(
            scores[keep], raw, kept_uids, alpha=settings.alpha, beta=settings.beta,
            turn_off_if_none_correct=settings.turn_off_if_none_correct,
            turn_off_if_some_correct=settings.turn_off_if_some_correct,
            turn_off_if_all_correct=settings.turn_off_if_all_correct,
            turn_off_if_rollout_incorrect=settings.turn_off_if_rollout_incorrect,
        )
        bonus_raw[keep] = raw.double()
        kept_bonus[keep] = combined.intrinsic.double()
        metrics.update(metric_names.bonus_metrics(raw.double().cpu(), combined.intrinsic.double().cpu(), settings.beta,
                                                  hidden[keep].double().norm(dim=1).cpu()))
    bonus_scaled = settings.beta * kept_bonus
    shaped = settings.alpha * scores + bonus_scaled
    metrics.update(group_metrics(uids, scores, excluded, shaped))
    return StepBonus(bonus_raw=bonus_raw, bonus_scaled=bonus_scaled, shaped=shaped, metrics=metrics)
