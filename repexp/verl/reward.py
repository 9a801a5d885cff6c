"""verl's custom reward function (``reward.custom_reward_function.path=pkg://repexp.verl.reward``).

verl's reward loop calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, ...)``
for every training and dev rollout; we route it to the project's one 0/1 verifier, so training,
dev selection and evaluation score answers identically.
"""

from __future__ import annotations

from typing import Any, Optional


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None, **kwargs: Any
) -> float:
    from repexp.verify import score

    return float(score(data_source, solution_str, ground_truth))
