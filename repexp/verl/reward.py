"""verl's custom reward function (``reward.custom_reward_function.path=pkg://repexp.verl.reward``).

verl's reward loop calls ``compute_score*(data_source=, solution_str=, ground_truth=, extra_info=, ...)``
for every training and dev rollout; we route it to `repexp.verify` under the run's grader, so
training, dev selection and evaluation score answers identically. One function per grader
(`FUNCTION_NAMES`, chosen by `reward.custom_reward_function.name`), because verl's config has no
key for extra keyword arguments without adding one (``+reward...``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

FUNCTION_NAMES = {"repexp": "compute_score", "paper": "compute_score_paper"}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  grader: str = "repexp", **kwargs: Any) -> float:
    from repexp.verify import score

    return float(score(data_source, solution_str, ground_truth, grader=grader))


# the recipe's strict GSM8K, Hendrycks MATH and Math-Verify AIME scorers
compute_score_paper = partial(compute_score, grader="paper")
