"""Property tests (hypothesis) for repexp.elliptical: invariants of the bonus and the projection."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repexp.elliptical import (
    NORMALIZATIONS,
    REWARD_TYPES,
    bonuses,
    combine_rewards,
    sparse_projection,
)

FAST = settings(max_examples=25, deadline=None)

group_sizes = st.lists(st.integers(min_value=1, max_value=10), min_size=1, max_size=6)


def random_batch(sizes: list[int], dim: int, seed: int, scale: float = 1.0):
    """Rows in shuffled order with integer labels; returns (float64 features, labels)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)) * 7 + 3, sizes)
    rng.shuffle(labels)
    features = torch.as_tensor(rng.normal(scale=scale, size=(labels.size, dim)))
    return features, labels.tolist()


@FAST
@given(
    sizes=group_sizes,
    dim=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    reward_type=st.sampled_from(REWARD_TYPES),
    normalization=st.sampled_from(NORMALIZATIONS),
)
def test_permuting_rows_permutes_bonuses(sizes, dim, seed, reward_type, normalization):
    features, labels = random_batch(sizes, dim, seed)
    permutation = np.random.default_rng(seed + 1).permutation(len(labels))
    kwargs = {"lamb": 0.1, "reward_type": reward_type, "normalization": normalization, "out_dtype": torch.float64}
    original = bonuses(features, labels, **kwargs)
    permuted = bonuses(features[torch.as_tensor(permutation)], [labels[i] for i in permutation], **kwargs)
    torch.testing.assert_close(permuted, original[torch.as_tensor(permutation)], rtol=1e-9, atol=1e-9)


@FAST
@given(
    sizes=group_sizes,
    dim=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    lamb=st.floats(1e-3, 10.0),
    scale=st.floats(1e-3, 30.0),
    center=st.booleans(),
    solver=st.sampled_from(["auto", "kernel", "covariance"]),
)
def test_leverage_lies_in_unit_interval(sizes, dim, seed, lamb, scale, center, solver):
    features, labels = random_batch(sizes, dim, seed, scale)
    leverage = bonuses(features, labels, lamb=lamb, center=center, solver=solver, out_dtype=torch.float64)
    assert torch.all(leverage >= 0) and torch.all(leverage < 1)
    if center:  # a centred row of a group of n has leverage ≤ 1 − 1/n
        group_size = torch.as_tensor([labels.count(label) for label in labels], dtype=torch.float64)
        assert torch.all(leverage <= 1 - 1 / group_size + 1e-12)
    loo = bonuses(features, labels, lamb=lamb, center=center, solver=solver, reward_type="leave_one_out",
                  out_dtype=torch.float64)
    torch.testing.assert_close(loo, leverage / (1 - leverage), rtol=1e-7, atol=1e-12)


@FAST
@given(sizes=group_sizes, dim=st.integers(1, 20), seed=st.integers(0, 2**32 - 1),
       reward_type=st.sampled_from(REWARD_TYPES))
def test_kernel_and_covariance_forms_agree(sizes, dim, seed, reward_type):
    features, labels = random_batch(sizes, dim, seed)
    kwargs = {"lamb": 0.05, "reward_type": reward_type, "out_dtype": torch.float64}
    kernel = bonuses(features, labels, solver="kernel", **kwargs)
    covariance = bonuses(features, labels, solver="covariance", **kwargs)
    torch.testing.assert_close(kernel, covariance, rtol=1e-9, atol=1e-12)


@FAST
@given(sizes=group_sizes, dim=st.integers(2, 16), seed=st.integers(0, 2**32 - 1))
def test_centred_bonus_ignores_group_shifts_and_rotations(sizes, dim, seed):
    features, labels = random_batch(sizes, dim, seed)
    rng = np.random.default_rng(seed + 2)
    shifts = {label: torch.as_tensor(rng.normal(scale=5.0, size=dim)) for label in set(labels)}
    shifted = features + torch.stack([shifts[label] for label in labels])
    rotation, _ = torch.linalg.qr(torch.as_tensor(rng.normal(size=(dim, dim))))
    baseline = bonuses(features, labels, lamb=0.1, out_dtype=torch.float64)
    shifted_bonus = bonuses(shifted, labels, lamb=0.1, out_dtype=torch.float64)
    rotated_bonus = bonuses(features @ rotation, labels, lamb=0.1, out_dtype=torch.float64)
    torch.testing.assert_close(shifted_bonus, baseline, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(rotated_bonus, baseline, rtol=1e-8, atol=1e-10)


@FAST
@given(
    extrinsic=st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0]), min_size=1, max_size=24),
    seed=st.integers(0, 2**32 - 1),
    alpha=st.floats(-2.0, 2.0),
    beta=st.floats(0.0, 1.0),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
)
def test_combine_rewards_keeps_or_zeroes_each_bonus(extrinsic, seed, alpha, beta, flags):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=len(extrinsic)).tolist()
    scores = torch.tensor(extrinsic, dtype=torch.float64)
    intrinsic = torch.as_tensor(rng.uniform(0.1, 1.0, size=len(extrinsic)))
    none, some, all_, incorrect = flags
    result = combine_rewards(
        scores, intrinsic, labels, alpha=alpha, beta=beta, turn_off_if_none_correct=none,
        turn_off_if_some_correct=some, turn_off_if_all_correct=all_, turn_off_if_rollout_incorrect=incorrect,
    )
    kept = result.intrinsic.double()
    assert torch.all((kept == 0) | torch.isclose(kept, intrinsic, rtol=1e-6))
    torch.testing.assert_close(result.total.double(), alpha * scores + beta * kept, rtol=1e-6, atol=1e-6)
    for row, label in enumerate(labels):
        members = [s > 0 for s, other in zip(extrinsic, labels) if other == label]
        status_off = ((none and not any(members)) or (some and any(members) and not all(members))
                      or (all_ and all(members)))
        should_be_off = status_off or (incorrect and extrinsic[row] <= 0)
        assert (kept[row] == 0) == should_be_off


# --------------------------------------------------------------------------- projection


@FAST
@given(in_dim=st.integers(1, 300), out_dim=st.integers(1, 40), seed=st.integers(0, 2**64 - 1))
def test_projection_is_determined_by_the_seed(in_dim, out_dim, seed):
    first = sparse_projection(in_dim, out_dim, seed=seed)
    assert torch.equal(first, sparse_projection(in_dim, out_dim, seed=seed))
    if in_dim * out_dim >= 200:  # large enough that two seeds colliding is negligible
        other = sparse_projection(in_dim, out_dim, seed=(seed + 1) % 2**64)
        assert not torch.equal(first, other)


@FAST
@given(
    in_dim=st.integers(500, 4000),
    out_dim=st.sampled_from([16, 32, 128]),
    seed=st.integers(0, 2**32 - 1),
    density=st.one_of(st.just("auto"), st.floats(0.01, 1.0)),
)
def test_projection_entry_distribution(in_dim, out_dim, seed, density):
    matrix = sparse_projection(in_dim, out_dim, seed=seed, density=density, dtype=torch.float64)
    expected_density = 1 / math.sqrt(in_dim) if density == "auto" else density
    magnitude = math.sqrt(1 / expected_density) / math.sqrt(out_dim)
    nonzero = matrix != 0
    assert torch.allclose(matrix[nonzero].abs(), torch.full_like(matrix[nonzero], magnitude), rtol=1e-12)
    total = matrix.numel()
    count = int(nonzero.sum())
    sigma = math.sqrt(total * expected_density * (1 - expected_density)) + 1
    assert abs(count - total * expected_density) < 6 * sigma
    positives = int((matrix > 0).sum())
    assert abs(positives - count / 2) < 6 * math.sqrt(count / 4) + 1


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_projection_preserves_pairwise_distances(seed):
    # Johnson–Lindenstrauss at out_dim 256: distance ratios concentrate around 1 (std ≈ 0.045).
    in_dim, out_dim, points = 2048, 256, 30
    data = torch.as_tensor(np.random.default_rng(seed).normal(size=(points, in_dim)))
    projected = data @ sparse_projection(in_dim, out_dim, seed=seed, dtype=torch.float64)
    upper = torch.triu_indices(points, points, offset=1)
    original = torch.cdist(data, data)[upper[0], upper[1]]
    ratios = torch.cdist(projected, projected)[upper[0], upper[1]] / original
    assert 0.7 < ratios.min() and ratios.max() < 1.3
    assert ratios.mean() == pytest.approx(1.0, abs=0.05)
