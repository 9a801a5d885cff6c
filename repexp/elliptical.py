"""RepExp's elliptical exploration bonus, batched over groups; torch and numpy only (maths: docs/bonus.md).

- `sparse_projection` (+ `projection_seed`): a seeded very sparse random projection, scikit-learn's
  `SparseRandomProjection` distribution, identical on every device.
- `group_ids`: group labels to contiguous ids in first-appearance order; `group_layout`: those ids plus
  the padded-layout indices, built once per batch (the sync-free fast path of `bonuses`).
- `bonuses`: per group, centre, A = λI + Σ x xᵀ, leverage h = xᵀA⁻¹x or leave-one-out h/(1−h), then
  normalize; all groups in one batched Cholesky of the n×n kernel or d×d covariance form (`choose_solver`).
- `PersistentCovariance`: upstream's `persist_covariance` (state keyed by prompt across steps).
- `combine_rewards`: α·verifier + β·bonus with upstream's turn-off rules.
- Beside it, `repexp/elliptical_order.py`: the test-time `greedy_order` of response pools.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Hashable
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from repexp import bonus_defaults as B

__all__ = [
    "NORMALIZATIONS",
    "REWARD_TYPES",
    "SOLVERS",
    "STD_ZERO_RTOL",
    "CombinedRewards",
    "GroupLayout",
    "GroupStatus",
    "PersistentCovariance",
    "bonuses",
    "choose_solver",
    "combine_rewards",
    "group_ids",
    "group_layout",
    "sparse_projection",
]

# Choices and defaults of the bonus settings: repexp.bonus_defaults (shared with the pipeline config).
REWARD_TYPES = B.REWARD_TYPES
NORMALIZATIONS = B.NORMALIZATIONS
SOLVERS = ("auto", "kernel", "covariance")

# A group's bonus std counts as zero ("no spread, do not rescale") when it is below this
# fraction of the group's largest |bonus|. Float64 rounding leaves ~1e-16 relative noise on
# bonuses that are equal in exact arithmetic (e.g. the saturated 1 − 1/n leverages), and
# dividing by that noise would blow it up to O(1) values.
STD_ZERO_RTOL = 1e-10

_WORK_DTYPE = torch.float64

# On CUDA, "auto" keeps the d×d form up to this d (fewer launches beat fewer flops there).
CUDA_COVARIANCE_MAX_DIM = 64


# --------------------------------------------------------------------------- validation


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_finite_real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def _check_lamb(lamb: Any) -> float:
    lamb = _check_finite_real(lamb, "lamb")
    if lamb <= 0:
        raise ValueError(f"lamb (the ridge λ) must be > 0, got {lamb!r}")
    return lamb


def _check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(choices)}")
    return value


def _as_feature_matrix(features: Any, name: str = "features") -> Tensor:
    if not isinstance(features, Tensor):
        try:
            features = torch.as_tensor(np.asarray(features))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be a 2-D float tensor or array ({err})") from None
    if features.ndim != 2:
        raise ValueError(f"{name} must be 2-D [batch, dim], got shape {tuple(features.shape)}")
    if not features.dtype.is_floating_point:
        raise ValueError(f"{name} must have a floating-point dtype, got {features.dtype}")
    return features


def _as_score_vector(values: Any, name: str) -> Tensor:
    if not isinstance(values, Tensor):
        try:
            values = torch.as_tensor(np.asarray(values, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be a 1-D numeric tensor or array ({err})") from None
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D [batch], got shape {tuple(values.shape)}")
    if values.dtype == torch.bool or values.is_complex():
        raise ValueError(f"{name} must be real-valued, got {values.dtype}")
    return values


def _raise_if_not_finite(values: Tensor, name: str) -> None:
    # One host sync; callers on a hot GPU path can skip it with check_finite=False.
    if values.numel() and not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


# --------------------------------------------------------------------------- projection

def projection_seed(seed: int, step: int, randomize: bool = True) -> int:
    """Seed of a training step's projection: from (seed, step) when randomized, from seed alone otherwise.

    Both trainer backends use this, so a run seed and step give the same projection on either."""
    parts = [int(seed), int(step)] if randomize else [int(seed)]
    return int(np.random.SeedSequence(parts).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def sparse_projection(
    in_dim: int,
    out_dim: int,
    *,
    seed: int,
    density: float | str = "auto",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """A very sparse random projection matrix [in_dim, out_dim] (Li, Hastie & Church 2006).

    Each entry is +v or −v with probability density/2 each and 0 otherwise, with
    v = sqrt(1/density)/sqrt(out_dim) and density = 1/sqrt(in_dim) for "auto": the
    distribution of scikit-learn's `SparseRandomProjection(density="auto")`, transposed
    so that `features @ P` projects. The draw uses a private CPU `torch.Generator` seeded
    with `seed` and is then moved, so the matrix depends on `seed` alone (same on CPU and
    CUDA, untouched by and not touching the global RNG). Stored dense: for in_dim 3584 and
    out_dim 32 that is 115k entries, and a dense matmul beats sparse kernels at this size.
    """
    in_dim = _check_positive_int(in_dim, "in_dim")
    out_dim = _check_positive_int(out_dim, "out_dim")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    if density == "auto":
        density = 1.0 / math.sqrt(in_dim)
    else:
        density = _check_finite_real(density, "density")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1] or 'auto', got {density!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype!r}")

    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    uniform = torch.rand(in_dim, out_dim, generator=generator, dtype=torch.float64)
    magnitude = math.sqrt(1.0 / density) / math.sqrt(out_dim)
    projection = torch.zeros(in_dim, out_dim, dtype=torch.float64)
    projection[uniform < density / 2] = magnitude
    projection[(uniform >= density / 2) & (uniform < density)] = -magnitude
    return projection.to(dtype=dtype, device=device)


# --------------------------------------------------------------------------- group labels


def _normalise_label(label: Hashable) -> Hashable:
    # numpy scalars become Python scalars so that 5, np.int64(5) and tensor(5) are one key.
    return label.item() if isinstance(label, np.generic) else label


def _factorize(groups: Any, *, want_labels: bool) -> tuple[Tensor, int, list | None]:
    """Contiguous ids (first-appearance order), the number of groups, and optionally the labels."""
    if isinstance(groups, Tensor):
        if groups.ndim != 1:
            raise ValueError(f"groups must be 1-D, got shape {tuple(groups.shape)}")
        if groups.dtype.is_floating_point or groups.is_complex():
            raise ValueError(f"a groups tensor must hold integer ids, got dtype {groups.dtype}")
        size = groups.numel()
        unique, inverse = torch.unique(groups, sorted=True, return_inverse=True)
        num_groups = unique.numel()
        rows = torch.arange(size, device=groups.device)
        first_row = torch.full((num_groups,), size, dtype=torch.long, device=groups.device)
        first_row.scatter_reduce_(0, inverse, rows, reduce="amin")
        by_first_row = torch.argsort(first_row)
        relabel = torch.empty_like(by_first_row)
        relabel[by_first_row] = torch.arange(num_groups, device=groups.device)
        labels = unique[by_first_row].tolist() if want_labels else None
        return relabel[inverse], num_groups, labels

    if isinstance(groups, (list, tuple)):
        return _factorize_hashables(groups, want_labels)

    array = np.asarray(groups)
    if array.ndim != 1:
        raise ValueError(f"groups must be 1-D, got shape {array.shape}")
    if array.dtype.kind == "O":
        return _factorize_hashables(array.tolist(), want_labels)
    if array.dtype.kind not in "biuUS":
        raise ValueError(f"groups must be integer ids or hashable labels, got a numpy array of dtype {array.dtype}")
    unique, first_row, inverse = np.unique(array, return_index=True, return_inverse=True)
    by_first_row = np.argsort(first_row, kind="stable")
    relabel = np.empty_like(by_first_row)
    relabel[by_first_row] = np.arange(unique.size)
    ids = torch.as_tensor(relabel[inverse.reshape(-1)], dtype=torch.long)
    labels = [_normalise_label(x) for x in unique[by_first_row]] if want_labels else None
    return ids, int(unique.size), labels


def _factorize_hashables(labels: list | tuple, want_labels: bool) -> tuple[Tensor, int, list | None]:
    # dict.fromkeys and map run in C: ~0.1 µs per label, first-appearance order kept.
    try:
        unique = list(dict.fromkeys(labels))
    except TypeError as err:
        raise ValueError(f"group labels must be hashable ({err})") from None
    index = {label: position for position, label in enumerate(unique)}
    ids = np.fromiter(map(index.__getitem__, labels), dtype=np.int64, count=len(labels))
    return torch.from_numpy(ids), len(unique), ([_normalise_label(x) for x in unique] if want_labels else None)


def group_ids(groups: Any) -> tuple[Tensor, int]:
    """Map group labels to contiguous ids 0..G−1 in order of first appearance.

    `groups` is a 1-D integer tensor (ids keep its device), a numpy array (integers,
    strings or objects) or a list/tuple of hashables (e.g. uuid strings). Returns
    (LongTensor[B], G). Rows of one group need not be contiguous.
    """
    return _factorize(groups, want_labels=False)[:2]


# --------------------------------------------------------------------------- padded layout


class GroupLayout(NamedTuple):
    """Where each row goes in the padded [G, m, d] layout; build once per batch with `group_layout`.

    Passing a layout as `groups` to `bonuses` / `combine_rewards` skips the label mapping,
    the sort and every host sync of the layout step (the CUDA fast path).
    """

    group: Tensor  # [B] int64 contiguous group id of each row (first-appearance order)
    slot: Tensor  # [B] int64 position of each row inside its group
    flat_index: Tensor  # [B] int64 group * max_group_size + slot
    counts: Tensor  # [G] int64 rows per group
    row_mask: Tensor  # [G, m, 1] float64: 1 for real rows, 0 for padding
    inv_counts: Tensor  # [G, 1, 1] float64: 1/count (0 for an empty group)
    num_groups: int
    max_group_size: int

    @property
    def device(self) -> torch.device:
        return self.group.device

    def to(self, device: torch.device | str) -> GroupLayout:
        """The same layout on `device`, in two host-to-device copies (ints, floats)."""
        device = torch.device(device)
        if device == self.device:
            return self
        batch, groups = self.group.shape[0], self.num_groups
        ints = torch.cat(self[:4]).to(device).split([batch, batch, batch, groups])
        row_mask, inv_counts = torch.cat([self.row_mask.reshape(-1), self.inv_counts.reshape(-1)]).to(device).split(
            [self.row_mask.numel(), groups]
        )
        return GroupLayout(*ints, row_mask.view_as(self.row_mask), inv_counts.view_as(self.inv_counts), *self[6:])


def _layout_from_ids(ids: Tensor, num_groups: int, max_group_size: int | None = None) -> GroupLayout:
    """Layout from contiguous ids where they are (the host, for labels); on CUDA no host sync when
    max_group_size is given."""
    device = ids.device
    batch = ids.shape[0]
    # index_add instead of bincount: CUDA bincount syncs to size its output.
    counts = torch.zeros(num_groups, dtype=torch.long, device=device).index_add_(0, ids, torch.ones_like(ids))
    if max_group_size is None:
        max_group_size = int(counts.max()) if batch else 0  # one host sync on CUDA
    else:  # checked on the host only: on CUDA the check would sync
        max_group_size = _check_positive_int(max_group_size, "max_group_size")
        largest = int(counts.max()) if batch and device.type == "cpu" else 0
        if largest > max_group_size:
            raise ValueError(f"a group has {largest} rows, more than max_group_size={max_group_size}")
    order = torch.argsort(ids, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(ids)
    slot[order] = torch.arange(batch, device=device) - starts[ids[order]]
    row_mask = (torch.arange(max_group_size, device=device) < counts[:, None]).to(_WORK_DTYPE)[..., None]
    inv_counts = (1.0 / counts.clamp_min(1).to(_WORK_DTYPE)) * (counts > 0)
    return GroupLayout(
        ids, slot, ids * max_group_size + slot, counts, row_mask, inv_counts[:, None, None], num_groups, max_group_size
    )


def group_layout(groups: Any, *, device: torch.device | str | None = None) -> GroupLayout:
    """Padded-layout indices for `groups` (labels or integer ids, as for `group_ids`) on `device`.

    Labels given as lists/numpy arrays are mapped on the host and the layout is built there
    (no GPU sync) before two copies to `device`; a CUDA id tensor costs one sync (group size).
    """
    ids, num_groups = group_ids(groups)
    layout = _layout_from_ids(ids, num_groups)
    return layout if device is None else layout.to(device)


def _resolve_layout(
    groups: Any, batch_size: int, device: torch.device, num_groups: int | None, max_group_size: int | None
) -> GroupLayout:
    if isinstance(groups, GroupLayout):
        layout = groups
    elif num_groups is not None:
        # The caller vouches for contiguous ids in [0, num_groups) (checked on CPU only: a check would sync).
        num_groups = _check_positive_int(num_groups, "num_groups") if batch_size else 0
        if not isinstance(groups, Tensor) or groups.dtype.is_floating_point or groups.dtype == torch.bool:
            raise ValueError("with num_groups given, groups must be an integer tensor of ids in [0, num_groups)")
        if groups.ndim != 1:
            raise ValueError(f"groups must be 1-D, got shape {tuple(groups.shape)}")
        on_host = groups.device.type == "cpu"  # never a device sync for the check
        if on_host and groups.numel() and (int(groups.min()) < 0 or int(groups.max()) >= num_groups):
            raise ValueError(f"group ids must lie in [0, {num_groups}) when num_groups is given")
        layout = _layout_from_ids(groups.to(torch.long), num_groups, max_group_size)
    else:
        layout = _layout_from_ids(*group_ids(groups), max_group_size)
    if layout.group.shape[0] != batch_size:
        raise ValueError(f"groups has {layout.group.shape[0]} entries but the batch has {batch_size} rows")
    # Built where the ids are (the host, for labels), then moved in two copies.
    return layout.to(device)


def _scatter_rows(rows: Tensor, layout: GroupLayout) -> Tensor:
    """Rows [B, d] into a zero-padded [G, m, d] tensor."""
    dim = rows.shape[1]
    padded = rows.new_zeros(layout.num_groups * layout.max_group_size, dim)
    padded.index_copy_(0, layout.flat_index, rows)
    return padded.view(layout.num_groups, layout.max_group_size, dim)


def _centre(values: Tensor, layout: GroupLayout) -> Tensor:
    """Subtract each group's mean from its real rows; padding rows stay zero."""
    mean = values.sum(-2, keepdim=True) * layout.inv_counts
    return torch.addcmul(values, mean, layout.row_mask, value=-1.0)


# --------------------------------------------------------------------------- linear algebra


@functools.lru_cache(maxsize=32)
def _identity(size: int, device: torch.device) -> Tensor:
    # Cached so that the hot path launches no kernel to build it (and CUDA graphs can capture it).
    return torch.eye(size, dtype=_WORK_DTYPE, device=device)


def _cholesky(matrices: Tensor, check: bool) -> Tensor:
    # cholesky_ex does not sync; the info check (a sync) runs only when asked.
    factor, info = torch.linalg.cholesky_ex(matrices)
    if check and matrices.numel() and bool((info != 0).any()):
        raise ValueError(
            "λI + XᵀX is not numerically positive definite: lamb is too small for the scale of the features"
        )
    return factor


def _leverage_kernel_form(
    centred: Tensor, layout: GroupLayout, lamb: float, center: bool, want_one_minus: bool, check: bool
) -> tuple[Tensor, Tensor | None]:
    """h = diag(K (K + λI)⁻¹) with K = X Xᵀ per group (n×n).

    Centring makes the all-ones vector 1 of each group an exact null vector of K, so
    K + λI has an eigenvalue λ along it and a tiny λ would turn rounding noise in K·1 into
    O(1) errors. Along 1, K is zero, so adding c·11ᵀ/n (c = tr K / n) changes neither K's
    other eigenpairs nor K(K + λI)⁻¹, but lifts that eigenvalue to c + λ.
    Also returns 1 − h = λ·diag((K + λI)⁻¹) without cancellation, for leave-one-out.
    """
    eye = _identity(centred.shape[-2], centred.device)
    kernel = centred @ centred.transpose(-1, -2)
    system = torch.add(kernel, eye, alpha=lamb)
    if center:
        lift = torch.diagonal(kernel, dim1=-2, dim2=-1).sum(-1)[:, None, None] * layout.inv_counts  # c = tr K / n
        # + (c/n)·11ᵀ on the group's real rows
        system = torch.baddbmm(system, layout.row_mask * (lift * layout.inv_counts), layout.row_mask.transpose(-1, -2))
    factor = _cholesky(system, check)
    factor_inv = torch.linalg.solve_triangular(factor, eye, upper=False)
    inverse = factor_inv.transpose(-1, -2) @ factor_inv
    leverage = (kernel * inverse).sum(-1).clamp_min(0.0)
    one_minus = None
    if want_one_minus:
        one_minus = lamb * factor_inv.square().sum(-2)
        if center:
            # the lifted direction's share of λ·diag((K + λI)⁻¹): (1/n)·c/(c + λ) on real rows
            one_minus = one_minus + (layout.row_mask * layout.inv_counts * lift / (lift + lamb))[..., 0]
    return leverage, one_minus


def _leverage_covariance_form(
    centred: Tensor, scatter: Tensor | None, lamb: float, want_one_minus: bool, check: bool
) -> tuple[Tensor, Tensor | None]:
    """h_i = ‖L⁻¹x_i‖² with L Lᵀ = λI + scatter (d×d); scatter defaults to XᵀX."""
    eye = _identity(centred.shape[-1], centred.device)
    rows_t = centred.transpose(-1, -2)
    if scatter is None:
        system = torch.baddbmm(eye, rows_t, centred, beta=lamb)
    else:
        system = torch.add(scatter, eye, alpha=lamb)
    factor = _cholesky(system, check)
    whitened = torch.linalg.solve_triangular(factor, rows_t, upper=False)
    leverage = whitened.square().sum(-2)
    one_minus = (1.0 - leverage).clamp_min(torch.finfo(leverage.dtype).tiny) if want_one_minus else None
    return leverage, one_minus


def _normalize_groups(values: Tensor, layout: GroupLayout, normalization: str) -> Tensor:
    """Per-group `rnd` / `z_score` over the real rows of [G, m] values (unbiased std)."""
    if normalization == "none":
        return values
    weight = layout.row_mask[..., 0]
    count = layout.counts.to(values.dtype)
    mean = (values * weight).sum(-1) / count.clamp_min(1.0)
    deviation = (values - mean[:, None]) * weight
    # Unbiased variance; a group of one has no spread, so its std is defined as 0.
    std = (deviation.square().sum(-1) / (count - 1.0).clamp_min(1.0)).sqrt()
    largest = (values.abs() * weight).amax(-1) if values.shape[-1] else torch.zeros_like(std)
    has_spread = std > STD_ZERO_RTOL * largest
    safe_std = torch.where(has_spread, std, torch.ones_like(std))[:, None]
    if normalization == "rnd":
        return torch.where(has_spread[:, None], values / safe_std, values)
    return torch.where(has_spread[:, None], deviation / safe_std, deviation)


# --------------------------------------------------------------------------- per-step bonuses


def bonuses(
    features: Tensor,
    groups: Any,
    *,
    lamb: float = B.LAMB,
    reward_type: str = B.REWARD_TYPE,
    normalization: str = B.NORMALIZATION,
    center: bool = B.CENTER,
    num_groups: int | None = None,
    max_group_size: int | None = None,
    solver: str = "auto",
    check_finite: bool = True,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Elliptical bonus [B] of every row of `features` [B, d] within its group (the module docstring),
    computed in float64 and returned as `out_dtype` on the features' device; rows of a group need not
    be contiguous. "rnd" divides by the unbiased std.

    `groups`: labels (as for `group_ids`), a `GroupLayout`, or contiguous integer ids in [0, num_groups)
    with `num_groups` (and optionally `max_group_size`, an upper bound on the group size). Fast path
    (no host sync on CUDA): a GroupLayout on the features' device (or ids with num_groups and
    max_group_size) and `check_finite=False`.
    """
    features = _as_feature_matrix(features)
    lamb = _check_lamb(lamb)
    reward_type = _check_choice(reward_type, "reward_type", REWARD_TYPES)
    normalization = _check_choice(normalization, "normalization", NORMALIZATIONS)
    solver = _check_choice(solver, "solver", SOLVERS)
    if not isinstance(center, bool):
        raise ValueError(f"center must be a bool, got {center!r}")
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise ValueError(f"out_dtype must be a floating-point torch dtype, got {out_dtype!r}")
    batch, dim = features.shape
    layout = _resolve_layout(groups, batch, features.device, num_groups, max_group_size)
    if check_finite:
        _raise_if_not_finite(features, "features")
    if batch == 0:
        return torch.zeros(0, dtype=out_dtype, device=features.device)

    values = _scatter_rows(features.to(_WORK_DTYPE), layout)
    if center:
        values = _centre(values, layout)
    loo = reward_type == "leave_one_out"
    if solver == "auto":
        solver = choose_solver(layout.max_group_size, dim, features.device)
    if solver == "kernel":
        leverage, one_minus = _leverage_kernel_form(values, layout, lamb, center, loo, check_finite)
    else:
        leverage, one_minus = _leverage_covariance_form(values, None, lamb, loo, check_finite)
    per_group = _normalize_groups(leverage if one_minus is None else leverage / one_minus, layout, normalization)
    return per_group.reshape(-1).index_select(0, layout.flat_index).to(out_dtype)  # back to [B] rows


def choose_solver(max_group_size: int, dim: int, device: torch.device | str) -> str:
    """The form "auto" uses: the n×n kernel form or the d×d covariance form.

    On CPU, arithmetic decides: the smaller system (n×n when n ≤ d). On CUDA at RepExp's
    sizes the call is bound by kernel launches, and the d×d form launches fewer kernels (no
    lift, no explicit inverse); it is faster up to d = 64 and slower at d = 128, where batched
    128×128 Cholesky time dominates (measured: docs/bonus.md).
    """
    if dim == 0:
        return "kernel"
    if torch.device(device).type == "cuda":
        return "covariance" if dim <= CUDA_COVARIANCE_MAX_DIM or max_group_size > dim else "kernel"
    return "kernel" if max_group_size <= dim else "covariance"


# --------------------------------------------------------------------------- persistent mode


class PersistentCovariance:
    """Upstream's `persist_covariance=True` bonus, with state that survives a resume.

    Per prompt id it keeps the count N, the running mean μ and the centred scatter
    S = Σ (z − μ)(z − μ)ᵀ of every projected feature z seen for that prompt so far. λI + S equals
    upstream's λI + Σ z zᵀ − N μμᵀ in exact arithmetic; keeping S avoids the cancellation of that
    subtraction, and keeping the matrix rather than its inverse the drift of Sherman–Morrison updates.

    `update_and_score`, per prompt of the call (its rows form one group), in upstream's order: update
    N and μ, add the rows to the matrix, centre them by the new μ and score them against the new matrix
    (h, or h/(1−h) for "leave_one_out", which upstream did not implement), normalize per prompt.
    The state does not depend on λ, so λ can change between runs.
    """

    STATE_VERSION = 1

    def __init__(
        self,
        dim: int,
        lamb: float = B.LAMB,
        reward_type: str = B.REWARD_TYPE,
        normalization: str = B.NORMALIZATION,
        device: torch.device | str | None = None,
    ) -> None:
        self.dim = _check_positive_int(dim, "dim")
        self.lamb = _check_lamb(lamb)
        self.reward_type = _check_choice(reward_type, "reward_type", REWARD_TYPES)
        self.normalization = _check_choice(normalization, "normalization", NORMALIZATIONS)
        self.device = torch.device(device) if device is not None else None
        self._slot_of: dict[Hashable, int] = {}
        self._labels: list[Hashable] = []
        self._allocate(0, torch.device("cpu") if self.device is None else self.device)

    def _allocate(self, capacity: int, device: torch.device) -> None:
        self._count = torch.zeros(capacity, dtype=torch.long, device=device)
        self._mean = torch.zeros(capacity, self.dim, dtype=_WORK_DTYPE, device=device)
        self._scatter = torch.zeros(capacity, self.dim, self.dim, dtype=_WORK_DTYPE, device=device)

    @property
    def num_prompts(self) -> int:
        return len(self._labels)

    @property
    def prompt_ids(self) -> list[Hashable]:
        return list(self._labels)

    def _slots_for(self, labels: list[Hashable]) -> Tensor:
        # One dict lookup per distinct prompt of the call (not per row); new prompts get new slots.
        for label in labels:
            if label not in self._slot_of:
                self._slot_of[label] = len(self._labels)
                self._labels.append(label)
        needed = len(self._labels)
        if needed > self._count.shape[0]:
            old = (self._count, self._mean, self._scatter)
            self._allocate(max(needed, 2 * self._count.shape[0], 16), old[0].device)
            for new, existing in zip((self._count, self._mean, self._scatter), old):
                new[: existing.shape[0]] = existing
        return torch.tensor([self._slot_of[label] for label in labels], dtype=torch.long, device=self._count.device)

    def update_and_score(self, features: Tensor, prompt_ids: Any, *, check_finite: bool = True) -> Tensor:
        """Update the per-prompt state with `features` [B, dim] and return their bonuses [B] (float32)."""
        features = _as_feature_matrix(features)
        if features.shape[1] != self.dim:
            raise ValueError(f"features have dim {features.shape[1]}, but this state was built for dim {self.dim}")
        batch = features.shape[0]
        ids, num_groups, labels = _factorize(prompt_ids, want_labels=True)
        if ids.shape[0] != batch:
            raise ValueError(f"prompt_ids has {ids.shape[0]} entries but the batch has {batch} rows")
        if check_finite:
            _raise_if_not_finite(features, "features")
        device = self.device = features.device if self.device is None else self.device
        if self._count.device != device:
            self._count, self._mean, self._scatter = (t.to(device) for t in (self._count, self._mean, self._scatter))
        if batch == 0:
            return torch.zeros(0, dtype=torch.float32, device=features.device)

        layout = _layout_from_ids(ids, num_groups).to(device)
        slots = self._slots_for(labels)
        values = _scatter_rows(features.to(device=device, dtype=_WORK_DTYPE), layout)
        batch_count = layout.counts.to(_WORK_DTYPE)
        batch_mean = values.sum(-2) * layout.inv_counts[:, :, 0]
        batch_centred = _centre(values, layout)

        # Steps 1–2: merge this call's rows into (N, μ, S) (Chan et al.'s pairwise update).
        old_count = self._count[slots].to(_WORK_DTYPE)
        new_count = old_count + batch_count
        delta = batch_mean - self._mean[slots]
        new_mean = self._mean[slots] + delta * (batch_count / new_count)[:, None]
        cross = (old_count * batch_count / new_count)[:, None, None] * (delta[:, :, None] * delta[:, None, :])
        new_scatter = self._scatter[slots] + batch_centred.transpose(-1, -2) @ batch_centred + cross
        self._count[slots] = self._count[slots] + layout.counts
        self._mean[slots] = new_mean
        self._scatter[slots] = new_scatter

        # Step 3: score this call's rows, centred by the updated running mean.
        centred = torch.addcmul(values, new_mean[:, None, :], layout.row_mask, value=-1.0)
        loo = self.reward_type == "leave_one_out"
        leverage, one_minus = _leverage_covariance_form(centred, new_scatter, self.lamb, loo, check_finite)
        bonus = leverage if one_minus is None else leverage / one_minus
        per_group = _normalize_groups(bonus, layout, self.normalization)
        return per_group.reshape(-1).index_select(0, layout.flat_index).to(device=features.device, dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors and lists on CPU (loadable with torch.load(weights_only=True))."""
        tensors = {"count": self._count, "mean": self._mean, "scatter": self._scatter}
        return {"version": self.STATE_VERSION, "dim": self.dim, "prompt_ids": list(self._labels),
                **{key: t[: self.num_prompts].cpu().clone() for key, t in tensors.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state with one from `state_dict()`; λ and reward settings stay this object's."""
        missing = {"version", "dim", "prompt_ids", "count", "mean", "scatter"} - set(state)
        if missing:
            raise ValueError(f"persistent covariance state lacks keys: {', '.join(sorted(missing))}")
        if state["version"] != self.STATE_VERSION:
            raise ValueError(f"persistent covariance state version {state['version']!r} is not {self.STATE_VERSION}")
        if state["dim"] != self.dim:
            raise ValueError(f"persistent covariance state has dim {state['dim']}, this object has dim {self.dim}")
        labels = list(state["prompt_ids"])
        size = len(labels)
        count, mean, scatter = state["count"], state["mean"], state["scatter"]
        if [tuple(t.shape) for t in (count, mean, scatter)] != [(size,), (size, self.dim), (size, self.dim, self.dim)]:
            raise ValueError("persistent covariance state tensors do not match its prompt_ids and dim")
        if len(set(labels)) != size:
            raise ValueError("persistent covariance state has duplicate prompt_ids")
        device = self.device if self.device is not None else torch.device("cpu")
        self._labels = labels
        self._slot_of = {label: index for index, label in enumerate(labels)}
        self._count = count.to(device=device, dtype=torch.long).clone()
        self._mean = mean.to(device=device, dtype=_WORK_DTYPE).clone()
        self._scatter = scatter.to(device=device, dtype=_WORK_DTYPE).clone()


# --------------------------------------------------------------------------- reward combination


class GroupStatus(IntEnum):
    """How many rollouts of a group are correct (score > 0)."""

    NONE_CORRECT = 0
    SOME_CORRECT = 1
    ALL_CORRECT = 2


def is_correct(scores: Tensor) -> Tensor:
    """Whether each rollout is correct: its verifier score is > 0 (the one definition, both backends)."""
    return scores > 0


def group_statuses(correct: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """[num_groups] int64 `GroupStatus` of each group from its rollouts' `is_correct` ([B] bool) and group
    indices ([B] int64 in [0, num_groups)): a group is none/some/all-correct by counting its correct
    rollouts (upstream compared score sums with the group size, only right for 0/1 scores)."""
    sizes = torch.bincount(group, minlength=num_groups)
    group_correct = torch.zeros(num_groups, dtype=torch.long, device=group.device).index_add_(0, group, correct.long())
    status = torch.full_like(group_correct, int(GroupStatus.SOME_CORRECT))
    status[group_correct == 0] = int(GroupStatus.NONE_CORRECT)
    status[(group_correct == sizes) & (sizes > 0)] = int(GroupStatus.ALL_CORRECT)
    return status


class CombinedRewards(NamedTuple):
    """Result of `combine_rewards`.

    total: [B] float32, α·extrinsic + β·intrinsic.
    intrinsic: [B] float32, the bonus after the turn-off rules (before β).
    group_status: [G] int64 `GroupStatus` of each group (groups in first-appearance order).
    group_index: [B] int64, the group of each rollout (indexes group_status).
    """

    total: Tensor
    intrinsic: Tensor
    group_status: Tensor
    group_index: Tensor

    def status_fractions(self) -> dict[str, float]:
        """Fractions of groups with none / some / all rollouts correct (0.0 each for an empty batch)."""
        counts = torch.bincount(self.group_status, minlength=len(GroupStatus)).double()
        fractions = (counts / max(self.group_status.numel(), 1)).tolist()
        return {"none_correct": fractions[0], "some_correct": fractions[1], "all_correct": fractions[2]}


def combine_rewards(
    extrinsic: Tensor,
    intrinsic: Tensor,
    groups: Any,
    *,
    alpha: float = B.ALPHA,
    beta: float,
    turn_off_if_none_correct: bool = B.TURN_OFF_IF_NONE_CORRECT,
    turn_off_if_some_correct: bool = B.TURN_OFF_IF_SOME_CORRECT,
    turn_off_if_all_correct: bool = B.TURN_OFF_IF_ALL_CORRECT,
    turn_off_if_rollout_incorrect: bool = B.TURN_OFF_IF_ROLLOUT_INCORRECT,
    num_groups: int | None = None,
) -> CombinedRewards:
    """α·verifier + β·bonus per rollout, with the bonus switched off by upstream's rules.

    Correct rollouts and group statuses as `is_correct` and `group_statuses` define them. Rules:
    `turn_off_if_{none,some,all}_correct` zero the bonus of every rollout in groups of that status;
    `turn_off_if_rollout_incorrect` zeroes it for each incorrect rollout. `groups` as in `bonuses`
    (labels, or ids + num_groups).
    """
    extrinsic = _as_score_vector(extrinsic, "extrinsic")
    intrinsic = _as_score_vector(intrinsic, "intrinsic")
    if extrinsic.shape != intrinsic.shape:
        raise ValueError(f"extrinsic {tuple(extrinsic.shape)} and intrinsic {tuple(intrinsic.shape)} differ in shape")
    alpha = _check_finite_real(alpha, "alpha")
    beta = _check_finite_real(beta, "beta")
    # one per GroupStatus, in its order, then the per-rollout rule
    flags = (turn_off_if_none_correct, turn_off_if_some_correct, turn_off_if_all_correct, turn_off_if_rollout_incorrect)
    for name, flag in zip(("none_correct", "some_correct", "all_correct", "rollout_incorrect"), flags):
        if not isinstance(flag, bool):
            raise ValueError(f"turn_off_if_{name} must be a bool, got {flag!r}")
    device = intrinsic.device
    extrinsic = extrinsic.to(device=device, dtype=_WORK_DTYPE)
    intrinsic = intrinsic.to(_WORK_DTYPE)
    _raise_if_not_finite(extrinsic, "extrinsic")
    _raise_if_not_finite(intrinsic, "intrinsic")
    layout = _resolve_layout(groups, extrinsic.shape[0], device, num_groups, None)
    group, num_groups = layout.group, layout.num_groups

    correct = is_correct(extrinsic)
    group_status = group_statuses(correct, group, num_groups)

    rollout_status = group_status[group]
    turned_off = torch.zeros_like(correct)
    for status, enabled in zip(GroupStatus, flags):
        if enabled:
            turned_off |= rollout_status == int(status)
    if turn_off_if_rollout_incorrect:
        turned_off |= ~correct
    kept_intrinsic = torch.where(turned_off, torch.zeros_like(intrinsic), intrinsic)
    total = alpha * extrinsic + beta * kept_intrinsic
    return CombinedRewards(total.float(), kept_intrinsic.float(), group_status, group)
