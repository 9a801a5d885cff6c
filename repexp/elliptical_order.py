"""Test-time RepExp: the greedy elliptical ordering of response pools, batched over problems (pure torch).

The paper's inference-time exploration (arXiv 2510.11686, Section 3) takes a pool of sampled responses
per prompt and hands them to the verifier one at a time, each time the response with the largest
elliptical bonus with respect to the responses already taken:

    i_t = argmax_{i not taken} x_iᵀ Σ_t⁻¹ x_i,    Σ_t = λI + Σ_{s<t} x_{i_s} x_{i_s}ᵀ,

with x_i the (projected, pool-centred) feature of response i. The first pick is the response farthest
from the pool mean; a response close to one already taken has a small bonus and waits.

- `greedy_order`: all problems at once on padded [G, m, d] features with per-problem pool sizes.
  The state is Z = X Mᵀ with MᵀM = Σ_t⁻¹ (initially M = I/√λ), so each bonus is a squared row norm
  ‖z_i‖². Taking row s updates Z ← Z (I − c z_s z_sᵀ), c = 1/(√(1+q)(1+√(1+q))), q = ‖z_s‖²: a
  symmetric contraction ((I − c z zᵀ)² = (I + z zᵀ)⁻¹), O(m·d) per problem and step, no solve and no
  subtraction of large terms (a bonus is recomputed as a norm, never downdated).
- `pad_pools`: a list of [n_g, d] pools (unequal sizes) to the padded layout.

Ties (duplicates, or all remaining bonuses 0): responses whose bonus is within `TIE_RTOL` (relative)
of the step's largest count as tied, and the one with the lowest pool index is taken. The tolerance
absorbs rounding differences, so `greedy_order` gives the order of the definition (a fresh solve with
λI + Σ x xᵀ per step: `tests/greedy_reference.py`, which the tests and the benchmark check it against).

Work is in float64 on the device of the features. No framework imports (torch and numpy only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from repexp import bonus_defaults as B
from repexp.elliptical import _WORK_DTYPE, _check_lamb, _raise_if_not_finite

__all__ = ["TIE_RTOL", "PoolOrder", "greedy_order", "pad_pools"]

TIE_RTOL = 1e-9


class PoolOrder(NamedTuple):
    """Result of `greedy_order`.

    order: [G, m] int64, pool indices in the order taken; -1 past a pool's size.
    bonus: [G, m] float64, each response's bonus x_iᵀΣ_t⁻¹x_i when it was taken (NaN past the size).
    sizes: [G] int64, the pool sizes.
    """

    order: Tensor
    bonus: Tensor
    sizes: Tensor


def pad_pools(pools: Sequence[Any], *, dtype: torch.dtype = _WORK_DTYPE,
              device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Pools [n_g, d] (tensors or arrays, sizes may differ) → (zero-padded [G, m, d], sizes [G])."""
    mats = [torch.as_tensor(np.asarray(p) if not isinstance(p, Tensor) else p) for p in pools]
    if not mats:
        raise ValueError("no pools given")
    dims = {m.shape[1] if m.ndim == 2 else None for m in mats}
    if None in dims or len(dims) != 1:
        raise ValueError(f"every pool must be 2-D [n, d] with one d, got shapes {[tuple(m.shape) for m in mats][:5]}")
    sizes = torch.tensor([m.shape[0] for m in mats], dtype=torch.long)
    padded = torch.zeros(len(mats), int(sizes.max()), dims.pop(), dtype=dtype)
    for g, m in enumerate(mats):
        padded[g, : m.shape[0]] = m.to(dtype)
    return (padded, sizes) if device is None else (padded.to(device), sizes.to(device))


def greedy_order(features: Any, sizes: Any = None, *, lamb: float, center: bool = B.CENTER,
                 check_finite: bool = True, first: Any = None) -> PoolOrder:
    """The greedy elliptical order of every pool (see the module docstring), all pools at once.

    `features`: [G, m, d] padded pools (rows at or past a pool's size are ignored) or one pool [n, d];
    `sizes`: [G] pool sizes (default: all m). `center` subtracts each pool's mean feature first, as
    the training bonus centres each group. `first`: [G] indices, each pool's first pick instead of the
    largest bonus (a random first pick: docs/pilot.md, "Fourth design: pre-registration"); the rest is
    greedy as always (ignored for an empty pool). Runs on the features' device in float64.
    """
    lamb = _check_lamb(lamb)
    if not isinstance(features, Tensor):
        features = torch.as_tensor(np.asarray(features))
    if features.ndim == 2:
        features = features[None]
    if features.ndim != 3 or not features.dtype.is_floating_point:
        raise ValueError(f"features must be a float tensor [G, m, d] (or one pool [n, d]), got "
                         f"{tuple(features.shape)} {features.dtype}")
    groups, width, _ = features.shape
    if sizes is None:
        sizes = torch.full((groups,), width, dtype=torch.long)
    sizes = torch.as_tensor(sizes).to(device=features.device)
    if sizes.dtype.is_floating_point or sizes.dtype == torch.bool or tuple(sizes.shape) != (groups,):
        raise ValueError(f"sizes must be {groups} integer pool sizes, got {tuple(sizes.shape)} {sizes.dtype}")
    sizes = sizes.long()
    if groups and (int(sizes.min()) < 0 or int(sizes.max()) > width):
        raise ValueError(f"pool sizes must lie in [0, {width}] (the padded width)")
    if first is not None:
        first = torch.as_tensor(first).to(device=features.device)
        if first.dtype.is_floating_point or first.dtype == torch.bool or tuple(first.shape) != (groups,):
            raise ValueError(f"first must be {groups} integer indices, got {tuple(first.shape)} {first.dtype}")
        first = first.long()
        bad = (sizes > 0) & ((first < 0) | (first >= sizes))
        if bool(bad.any()):
            raise ValueError(f"first: index {int(first[bad][0])} outside its pool of {int(sizes[bad][0])}")
        first = first.clamp(0, max(width - 1, 0))
    device = features.device
    real = torch.arange(width, device=device)[None, :] < sizes[:, None]  # [G, m]
    values = features.to(_WORK_DTYPE) * real[..., None]
    if check_finite:
        _raise_if_not_finite(values, "features")
    if center:
        mean = values.sum(1, keepdim=True) / sizes.clamp_min(1)[:, None, None].to(_WORK_DTYPE)
        values = (values - mean) * real[..., None]
    state = values / math.sqrt(lamb)  # rows z_i = M x_i with MᵀM = Σ⁻¹ = I/λ
    taken = ~real
    order = torch.full((groups, width), -1, dtype=torch.long, device=device)
    bonus = torch.full((groups, width), math.nan, dtype=_WORK_DTYPE, device=device)
    rows = torch.arange(groups, device=device)
    neg_inf = torch.tensor(-math.inf, dtype=_WORK_DTYPE, device=device)
    for step in range(width):
        current = torch.where(taken, neg_inf, state.square().sum(-1))  # [G, m]
        best = current.max(-1).values
        tied = current >= best[:, None] - TIE_RTOL * best.abs()[:, None]
        pick = tied.to(torch.int8).argmax(-1)  # the lowest pool index among the tied
        if step == 0 and first is not None:
            pick, best = first, current[rows, first]
        active = step < sizes
        order[:, step] = torch.where(active, pick, order[:, step])
        bonus[:, step] = torch.where(active, best, bonus[:, step])
        taken[rows, pick] |= active
        chosen = state[rows, pick] * active[:, None]  # [G, d]; 0 for finished pools (no update)
        q = chosen.square().sum(-1)
        root = torch.sqrt(1.0 + q)
        scale = 1.0 / (root * (1.0 + root))
        along = torch.einsum("gmd,gd->gm", state, chosen)
        state = state - (scale[:, None] * along)[..., None] * chosen[:, None, :]
    return PoolOrder(order, bonus, sizes)
