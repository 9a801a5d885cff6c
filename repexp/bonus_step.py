"""One training step's RepExp bonus, for both trainer backends: features → bonus → shaped reward → metrics.

The TRL reward (`repexp.trl.reward`) and the verl trainer (`repexp.verl.trainer`) pool their features
(`repexp.features`) and score their rollouts each their own way, then both call `compute_step_bonus`:

1. project with `sparse_projection(H, sparse_dim, seed=projection_seed(seed, step))`: a fresh
   projection every step when ``randomize_projection`` (upstream drew it from an unseeded RNG),
   else one projection from ``seed`` alone (`BonusState`); float32 features @ float32 projection;
2. per group: `bonuses` (centring, leverage or leave-one-out, normalization, in float64) or, with
   ``persist_covariance``, `PersistentCovariance.update_and_score` keyed by prompt;
3. `combine_rewards`: the turn-off rules; shaped reward ``alpha * score + beta * bonus``;
4. metrics: `repexp.metrics.bonus_metrics` and `group_metrics` over the rows that take part, so both
   backends log the same names (``repexp/bonus_raw/*``, ``repexp/bonus_scaled/*``, ``repexp/groups/*``,
   ``reward/verifier/mean``, ...); none when no row takes part.

Excluded rows (verl's padding rows, empty responses) get bonus 0 and are left out of every group and
statistic. The bonus runs on the features' device, the rewards and metrics on the scores' device.

The settings are a `BonusConfig`: TRL passes `RunConfig.bonus`, verl its node's `RepExpSettings` (a
subclass, from ``actor_rollout_ref.repexp.bonus``); β, `sparse_dim` and the seed are passed beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from repexp import metrics as metric_names
from repexp.elliptical import PersistentCovariance, bonuses, combine_rewards, projection_seed, sparse_projection

if TYPE_CHECKING:
    from repexp.config import BonusConfig


class BonusState:
    """What the bonus carries across steps: a fixed projection and the persistent covariance."""

    def __init__(self, bonus: BonusConfig, *, sparse_dim: int, seed: int):
        self.bonus = bonus
        self.sparse_dim = int(sparse_dim)
        self.seed = int(seed)
        self._fixed_projection: Optional[Tensor] = None
        self._covariance: Optional[PersistentCovariance] = None

    def projection(self, hidden_dim: int, step: int) -> Tensor:
        if self.bonus.randomize_projection:
            return sparse_projection(hidden_dim, self.sparse_dim, seed=projection_seed(self.seed, step))
        if self._fixed_projection is None or self._fixed_projection.shape[0] != hidden_dim:
            self._fixed_projection = sparse_projection(
                hidden_dim, self.sparse_dim, seed=projection_seed(self.seed, step, randomize=False)
            )
        return self._fixed_projection

    @property
    def covariance(self) -> PersistentCovariance:
        if self._covariance is None:
            b = self.bonus
            self._covariance = PersistentCovariance(self.sparse_dim, b.lamb, b.reward_type, b.normalization)
        return self._covariance

    def state_dict(self) -> dict[str, Any]:
        return {"covariance": self.covariance.state_dict() if self.bonus.persist_covariance else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.bonus.persist_covariance:
            if state.get("covariance") is None:
                raise ValueError("saved RepExp state has no persistent covariance")
            self.covariance.load_state_dict(state["covariance"])


@dataclass
class StepBonus:
    bonus_raw: Tensor  # (B,) float64, elliptical bonus before the turn-off rules, 0 for excluded rows
    bonus_scaled: Tensor  # (B,) float64, beta * bonus after the turn-off rules: added to the reward
    shaped: Tensor  # (B,) `dtype`, alpha * score + bonus_scaled
    metrics: dict[str, float]


def _validate_inputs(groups: Sequence[Any], scores: Tensor, excluded: Tensor, rows: int) -> None:
    if len(groups) != rows or scores.shape != (rows,) or excluded.shape != (rows,):
        raise ValueError(
            f"hidden states have {rows} rows but got {len(groups)} group keys, scores {tuple(scores.shape)}, "
            f"exclusion mask {tuple(excluded.shape)}"
        )


def group_metrics(
    groups: Sequence[Any], scores: Tensor, excluded: Optional[Tensor] = None, shaped: Optional[Tensor] = None
) -> dict[str, float]:
    """Verifier/shaped means and none/some/all-correct group fractions over the rows that take part: the
    metrics of a step without the bonus (β = 0); `shaped` defaults to the scores."""
    excluded = torch.zeros(len(groups), dtype=torch.bool) if excluded is None else excluded
    _validate_inputs(groups, scores, excluded, len(groups))
    keep = (~excluded.to(scores.device).bool()).nonzero().squeeze(1)
    if keep.numel() == 0:
        return {}
    kept_scores = scores[keep].double()
    combined = combine_rewards(kept_scores, torch.zeros_like(kept_scores), [groups[i] for i in keep.tolist()], beta=0)
    shaped = kept_scores if shaped is None else shaped[keep].double()
    return metric_names.group_metrics(combined.status_fractions(), kept_scores.cpu(), shaped.cpu())


def compute_step_bonus(
    features: Tensor,
    groups: Sequence[Any],
    scores: Tensor,
    bonus: BonusConfig,
    *,
    beta: float,
    step: int,
    state: BonusState,
    excluded: Optional[Tensor] = None,
    prompt_keys: Optional[Sequence[Any]] = None,
    dtype: torch.dtype = torch.float64,
) -> StepBonus:
    """The bonus and shaped reward of every row of one training batch (see the module docstring).

    features: (B, H) pooled hidden states; groups: the prompt group key of each row; scores: (B,)
    verifier rewards; excluded: (B,) rows that take no part (default none); prompt_keys: the
    persistent covariance's key of each row (needed with ``persist_covariance``).

    ``dtype`` is the precision of the bonus before the turn-off rules and of the shaped reward: TRL's
    reward function has always computed them in float32 (its reward column), verl's trainer in float64;
    each backend passes its own so that neither one's numbers moved when the two copies of this step
    became one (tests/test_bonus_step.py pins both).
    """
    if features.dim() != 2:
        raise ValueError(f"hidden states must be (rows, hidden), got shape {tuple(features.shape)}")
    rows = features.shape[0]
    scores = scores.to(dtype=torch.float64)
    device = scores.device
    excluded = torch.zeros(rows, dtype=torch.bool, device=device) if excluded is None else excluded.to(device).bool()
    _validate_inputs(groups, scores, excluded, rows)
    if bonus.persist_covariance and (prompt_keys is None or len(prompt_keys) != rows):
        raise ValueError("persist_covariance needs one prompt key per row")
    keep = (~excluded).nonzero().squeeze(1)
    kept_rows = keep.tolist()
    bonus_raw = torch.zeros(rows, dtype=torch.float64, device=device)
    kept_bonus = torch.zeros(rows, dtype=torch.float64, device=device)
    metrics: dict[str, float] = {}
    fractions = None
    if kept_rows:
        kept_groups = [groups[i] for i in kept_rows]
        kept_features = features[keep.to(features.device)]
        projection = state.projection(features.shape[1], step).to(device=features.device, dtype=torch.float32)
        projected = kept_features.float() @ projection
        if bonus.persist_covariance:
            raw = state.covariance.update_and_score(projected, [prompt_keys[i] for i in kept_rows])
        else:
            raw = bonuses(
                projected, kept_groups, lamb=bonus.lamb, reward_type=bonus.reward_type,
                normalization=bonus.normalization, center=bonus.center, out_dtype=dtype,
            )
        raw = raw.to(device)
        combined = combine_rewards(
            scores[keep], raw, kept_groups, alpha=bonus.alpha, beta=beta,
            turn_off_if_none_correct=bonus.turn_off_if_none_correct,
            turn_off_if_some_correct=bonus.turn_off_if_some_correct,
            turn_off_if_all_correct=bonus.turn_off_if_all_correct,
            turn_off_if_rollout_incorrect=bonus.turn_off_if_rollout_incorrect,
        )
        bonus_raw[keep] = raw.double()
        kept_bonus[keep] = combined.intrinsic.double()
        fractions = combined.status_fractions()
        metrics.update(metric_names.bonus_metrics(raw.double().cpu(), combined.intrinsic.double().cpu(), beta,
                                                  kept_features.double().norm(dim=1).cpu()))
    bonus_scaled = beta * kept_bonus
    shaped = (bonus.alpha * scores + bonus_scaled).to(dtype)
    if fractions is not None:
        metrics.update(metric_names.group_metrics(fractions, scores[keep].cpu(), shaped[keep].double().cpu()))
    return StepBonus(bonus_raw=bonus_raw, bonus_scaled=bonus_scaled, shaped=shaped, metrics=metrics)
