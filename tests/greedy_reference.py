"""The greedy elliptical order of one pool by its definition: the oracle of `repexp.elliptical_order.greedy_order`
(tests/test_elliptical_order.py, tests/test_testtime.py and benchmarks/testtime_order.py's baseline)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from repexp import bonus_defaults as B
from repexp.elliptical import _check_lamb
from repexp.elliptical_order import TIE_RTOL

_WORK_DTYPE = torch.float64


def greedy_order_reference(pool: Any, *, lamb: float, center: bool = B.CENTER) -> tuple[list[int], list[float]]:
    """The greedy elliptical order of one pool [n, d] by definition: per step, solve with λI + Σ x xᵀ.

    Returns (pool indices in the order taken, each one's bonus when taken). Same tie rule as
    `greedy_order`. O(n·(d³ + n d²)): for tests and the benchmark's baseline only.
    """
    lamb = _check_lamb(lamb)
    x = torch.as_tensor(np.asarray(pool) if not isinstance(pool, Tensor) else pool).to(_WORK_DTYPE).cpu()
    if x.ndim != 2:
        raise ValueError(f"a pool must be 2-D [n, d], got {tuple(x.shape)}")
    if center and x.shape[0]:
        x = x - x.mean(0, keepdim=True)
    dim = x.shape[1]
    system = lamb * torch.eye(dim, dtype=_WORK_DTYPE)
    remaining = list(range(x.shape[0]))
    order: list[int] = []
    bonuses: list[float] = []
    while remaining:
        candidates = x[remaining]  # [r, d]
        solved = torch.linalg.solve(system, candidates.T)  # [d, r]
        values = (candidates.T * solved).sum(0)
        best = float(values.max())
        first = next(j for j, v in enumerate(values.tolist()) if v >= best - TIE_RTOL * abs(best))
        chosen = remaining.pop(first)
        order.append(chosen)
        bonuses.append(best)
        system = system + torch.outer(x[chosen], x[chosen])
    return order, bonuses
