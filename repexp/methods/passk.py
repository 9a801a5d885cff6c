"""pass@k training (Chen et al., arXiv 2508.10751): GRPO with the analytic pass@k advantage in place of
the group-normalised verifier reward (docs/methods.md).

Per prompt group of n rollouts with c correct and target k (k ≤ n):

    ρ  = 1 − C(n−c, k) / C(n, k)                        the group's pass@k
    σ  = sqrt(ρ (1 − ρ))
    A⁺ = (1 − ρ) / (σ + ε)                               a correct rollout
    A⁻ = (1 − ρ − C(n−c−1, k−1) / C(n−1, k−1)) / (σ + ε)  a wrong rollout

ε = 1e-6 sits in the denominator, as in the authors' `calc_adv` (RUCAIBox/Passk_Training,
`code/passk_adv.py`). A group with c = 0 or c = n gets 0 for every row (both formulas give 0 there;
here it is written out), and so does a group where every k-subset holds a correct rollout (n − c < k:
ρ = 1, σ = 0). The group mean of the advantage is 0 and k = 1 is GRPO with the population std.

Differences from the authors' code, none of which changes a value beyond rounding: the binomial ratios
are exact integer ratios (`math.comb`), not scipy's floating `comb`; 1 − ρ is the ratio itself, not
1 − (1 − ratio); a rollout is correct when its score is > 0.5 (theirs: == 1, and a score that is
neither 0 nor 1 kept its raw value).

Pure: standard library and numpy at import; torch inside the functions.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from repexp.methods.base import Method, param

CORRECT_THRESHOLD = 0.5  # a rollout is correct when its verifier score is > 0.5
PASSK_EPSILON = 1e-6  # the authors' σ + 1e-6


@dataclass(frozen=True)
class Params:
    passk_k: int = param(4, help="k of the pass@k objective (k ≤ train.n_rollouts; k = 1 is GRPO)", minimum=1)


def _check(p: Params, train: Any) -> Optional[str]:
    if p.passk_k > train.n_rollouts:
        return f"passk_k: {p.passk_k} exceeds train.n_rollouts {train.n_rollouts} (pass@k needs k ≤ n rollouts)"
    return None


def _ratio(numerator: int, denominator: int) -> float:
    """An exact integer ratio as the nearest float (0 for a zero numerator)."""
    return numerator / denominator if numerator else 0.0


def group_advantages(n: int, c: int, k: int, epsilon: float = PASSK_EPSILON) -> tuple[float, float]:
    """(A⁺, A⁻) of a group of n rollouts with c correct, for pass@k (module docstring)."""
    if not 1 <= k <= n:
        raise ValueError(f"passk_k: {k} must be between 1 and the group size {n}")
    if not 0 <= c <= n:
        raise ValueError(f"{c} correct rollouts in a group of {n}")
    if c == 0 or c == n:
        return 0.0, 0.0
    miss = _ratio(math.comb(n - c, k), math.comb(n, k))  # 1 − ρ: no correct rollout among k drawn
    rho = 1.0 - miss
    sigma = math.sqrt(rho * (1.0 - rho))
    positive = miss / (sigma + epsilon)
    negative = (miss - _ratio(math.comb(n - c - 1, k - 1), math.comb(n - 1, k - 1))) / (sigma + epsilon)
    return positive, negative


def passk_advantages(scores: Any, groups: Sequence[Hashable], k: int, *, excluded: Any = None,
                     epsilon: float = PASSK_EPSILON) -> Any:
    """The analytic pass@k advantage of every row (float64 tensor of shape (B,)).

    `scores`: the B verifier scores (a rollout is correct when its score is > 0.5); `groups`: B hashable
    group ids, one per row (the rows of one prompt share an id; they need not be consecutive);
    `excluded`: optional B booleans, rows that take no part (advantage 0, not counted in n).
    ValueError, naming `passk_k`, when a group has fewer than k taking part.
    """
    import torch

    scores = torch.as_tensor(scores).detach().to("cpu", torch.float64).reshape(-1)
    size = scores.numel()
    if len(groups) != size:
        raise ValueError(f"{len(groups)} group ids for {size} scores: expected one per row")
    if excluded is None:
        taking_part = [True] * size
    else:
        excluded = torch.as_tensor(excluded, dtype=torch.bool).reshape(-1)
        if excluded.numel() != size:
            raise ValueError(f"{excluded.numel()} excluded flags for {size} scores: expected one per row")
        taking_part = [not flag for flag in excluded.tolist()]
    correct = (scores > CORRECT_THRESHOLD).tolist()
    members: dict[Hashable, list[int]] = {}
    for i, group in enumerate(groups):
        if taking_part[i]:
            members.setdefault(group, []).append(i)
    advantages = torch.zeros(size, dtype=torch.float64)
    for group, rows in members.items():
        n = len(rows)
        if n < k:
            raise ValueError(f"passk_k: {k} exceeds the {n} rollouts of group {group!r} taking part "
                             "(pass@k needs k ≤ n)")
        c = sum(correct[i] for i in rows)
        positive, negative = group_advantages(n, c, k, epsilon)
        for i in rows:
            advantages[i] = positive if correct[i] else negative
    return advantages


METHOD = Method(name="passk", params=Params, run_name="{backend}_passk_k{passk_k}_s{seed}", label="pass@k training",
                color="#55a868", marker="s", check=_check, hooks=("advantage",),
                point_text=lambda p: f"k={p.passk_k}")
