"""repexp.elliptical_order: the batched greedy order against the one-pool-at-a-time definition.

Random pools of unequal sizes, with exact duplicates, near-duplicates, a constant pool, a pool of
one and an empty pool; CUDA cases run when a GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from greedy_reference import greedy_order_reference  # tests/ is on sys.path: tests/conftest.py

from repexp.elliptical_order import TIE_RTOL, greedy_order, pad_pools

CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU machine)")
)
DEVICES = ["cpu", CUDA]


def random_pools(seed: int, count: int = 12, dim: int = 6, max_size: int = 20) -> list[np.ndarray]:
    """Unequal sizes (1 … max_size), a few duplicated rows per pool, some near-duplicates."""
    rng = np.random.default_rng(seed)
    pools = []
    for _ in range(count):
        size = int(rng.integers(1, max_size + 1))
        pool = rng.normal(size=(size, dim)) * rng.uniform(0.1, 3.0)
        if size >= 4:
            for _ in range(int(rng.integers(1, 4))):  # exact duplicates at random positions
                src, dst = rng.choice(size, 2, replace=False)
                pool[dst] = pool[src]
            src, dst = rng.choice(size, 2, replace=False)
            pool[dst] = pool[src] + 1e-4 * rng.normal(size=dim)  # a near-duplicate (a real, small bonus gap)
        pools.append(pool)
    return pools


def check_against_reference(pools, *, lamb, center, device="cpu", rtol=1e-8):
    padded, sizes = pad_pools(pools, device=device)
    result = greedy_order(padded, sizes, lamb=lamb, center=center)
    assert result.order.device.type == torch.device(device).type
    for g, pool in enumerate(pools):
        expected, expected_bonus = greedy_order_reference(pool, lamb=lamb, center=center)
        n = len(pool)
        got = result.order[g].cpu().tolist()
        assert got[:n] == expected, f"pool {g} (size {n})"
        assert got[n:] == [-1] * (padded.shape[1] - n)
        assert sorted(got[:n]) == list(range(n))  # a permutation of the pool
        np.testing.assert_allclose(result.bonus[g, :n].cpu().numpy(), expected_bonus, rtol=rtol, atol=1e-12)
        assert torch.isnan(result.bonus[g, n:]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lamb,center", [(0.01, True), (1.0, False), (0.01, False)])
def test_matches_sequential_reference_on_random_pools(seed, lamb, center, device):
    check_against_reference(random_pools(seed), lamb=lamb, center=center, device=device)


def test_more_responses_than_dimensions_and_degenerate_pools():
    rng = np.random.default_rng(7)
    pools = [
        rng.normal(size=(40, 3)),                    # n ≫ d: bonuses keep falling after d picks
        np.ones((5, 3)),                             # constant pool: centred to zero, every bonus 0
        rng.normal(size=(1, 3)),                     # one response
        np.repeat(rng.normal(size=(1, 3)), 6, 0),    # six copies of one response
        rng.normal(size=(9, 3)) * 1e3,               # large scale
    ]
    # the 1e3-scale pool makes λI + Σ x xᵀ condition ~1e10: the reference's solve keeps ~8 digits
    check_against_reference(pools, lamb=0.01, center=True, rtol=1e-6)
    order = greedy_order(*pad_pools(pools), lamb=0.01).order
    assert order[1, :5].tolist() == [0, 1, 2, 3, 4]  # all tied at 0: lowest index first, every step
    assert order[3, :6].tolist() == list(range(6))


def test_duplicates_wait_behind_distinct_responses():
    # Two copies of each of three orthogonal directions (+ tiny noise to break nothing): after one copy
    # of a direction is taken its twin's bonus drops, so the three directions come first.
    base = np.eye(3) * 2.0
    pool = np.concatenate([base, base])  # rows 3..5 duplicate rows 0..2
    order = greedy_order(pool, lamb=0.01, center=False).order[0].tolist()
    assert sorted(order[:3]) == [0, 1, 2]  # never a twin before all three directions
    assert order == greedy_order_reference(pool, lamb=0.01, center=False)[0]


def test_first_pick_is_farthest_from_the_pool_mean_and_bonuses_decrease_for_a_fixed_response():
    rng = np.random.default_rng(3)
    pool = rng.normal(size=(30, 4))
    result = greedy_order(pool, lamb=0.01)
    centred = pool - pool.mean(0)
    assert result.order[0, 0] == int(np.argmax((centred ** 2).sum(1)))
    # the bonus of the response taken first is its norm² / λ
    assert result.bonus[0, 0].item() == pytest.approx((centred ** 2).sum(1).max() / 0.01, rel=1e-12)


def test_empty_pool_and_padding_rows_are_ignored():
    padded, sizes = pad_pools([np.ones((3, 2)), np.zeros((0, 2)), np.arange(4.0).reshape(2, 2)])
    padded[1] = 1e6  # garbage in the padding of the empty pool must not matter
    padded[2, 2] = -1e6
    result = greedy_order(padded, sizes, lamb=0.1)
    assert result.order[1].tolist() == [-1, -1, -1]
    assert sorted(result.order[2, :2].tolist()) == [0, 1] and result.order[2, 2] == -1


def test_invalid_inputs_fail_clearly():
    with pytest.raises(ValueError, match="lamb"):
        greedy_order(np.ones((3, 2)), lamb=0.0)
    with pytest.raises(ValueError, match="pool sizes"):
        greedy_order(np.ones((1, 3, 2)), [4], lamb=0.1)
    with pytest.raises(ValueError, match="NaN"):
        greedy_order(np.array([[0.0, np.nan]]), lamb=0.1)
    with pytest.raises(ValueError, match="2-D"):
        pad_pools([np.ones(3)])
    assert TIE_RTOL < 1e-6


def test_a_forced_first_pick_then_greedy_by_hand():
    # one dimension, λ = 1, no centring: bonuses x² are 9, 1, 0, so greedy takes 3 first. Forced to take the 1
    # first (bonus 1), Σ = 1 + 1² = 2 leaves 3 a bonus 9/2, then 0 (bonus 0).
    pool = torch.tensor([[[3.0], [1.0], [0.0]], [[0.0], [0.0], [0.0]]])
    out = greedy_order(pool, torch.tensor([3, 0]), lamb=1.0, center=False, first=torch.tensor([1, 0]))
    assert out.order[0].tolist() == [1, 0, 2] and out.order[1].tolist() == [-1, -1, -1]  # an empty pool: ignored
    assert out.bonus[0].tolist() == pytest.approx([1.0, 4.5, 0.0])
    plain = greedy_order(pool[:1], lamb=1.0, center=False)
    assert plain.order[0].tolist() == [0, 1, 2]
    # forcing the pick greedy would make changes nothing
    assert greedy_order(pool[:1], lamb=1.0, center=False, first=[0]).order.tolist() == plain.order.tolist()
    with pytest.raises(ValueError, match="outside its pool of 3"):
        greedy_order(pool[:1], lamb=1.0, first=[3])
    with pytest.raises(ValueError, match="integer indices"):
        greedy_order(pool[:1], lamb=1.0, first=[0.5])
