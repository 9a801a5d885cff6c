"""pass@k, maj@k and samples-until-first-correct against exact enumeration."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations, permutations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repexp import passk


def enumerate_pass_at_k(correct: list[int], k: int) -> float:
    """Fraction of all k-subsets that hold at least one correct sample."""
    subsets = list(combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_enumeration_of_all_subsets():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 11))
        correct = (rng.random(n) < rng.random()).astype(int).tolist()
        ks = list(range(1, n + 1))
        got = passk.pass_at_k(n, sum(correct), ks)
        assert got.shape == (1, n)
        want = [enumerate_pass_at_k(correct, k) for k in ks]
        np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-12)


def test_vectorised_over_problems_with_different_n():
    n = [10, 4, 256, 7, 1]
    c = [3, 0, 17, 7, 1]
    ks = [1]
    got = passk.pass_at_k(n, c, ks)
    assert got.shape == (5, 1)
    np.testing.assert_allclose(got[:, 0], np.array(c) / np.array(n))  # pass@1 = c/n
    got = passk.pass_at_k(n[:4], c[:4], [1, 2, 4])
    for p in range(4):
        for j, k in enumerate([1, 2, 4]):
            exact = 1 - Fraction(math.comb(n[p] - c[p], k), math.comb(n[p], k))
            assert got[p, j] == pytest.approx(float(exact), abs=1e-12)


@pytest.mark.parametrize(
    "n, c, k, want",
    [(256, 1, 128, 0.5), (256, 10, 16, 0.4818), (8, 1, 8, 1.0), (1024, 3, 256, 0.5785)],
)
def test_reference_values(n, c, k, want):
    # values from the Chen et al. estimator table in the evaluation reference notes
    assert passk.pass_at_k(n, c, [k])[0, 0] == pytest.approx(want, abs=5e-5)


def test_large_n_matches_exact_rational_arithmetic():
    n, ks = 256, passk.power_of_two_ks(256)
    cs = np.arange(0, 257)
    got = passk.pass_at_k(np.full_like(cs, n), cs, ks)
    for c in (0, 1, 2, 5, 50, 128, 200, 255, 256):
        for j, k in enumerate(ks):
            exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
            assert got[c, j] == pytest.approx(float(exact), rel=1e-10, abs=1e-13)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_bounded_and_monotone(nc):
    n, c = nc
    ks = list(range(1, n + 1, max(1, n // 17)))
    row = passk.pass_at_k(n, c, ks)[0]
    assert np.all((row >= 0) & (row <= 1))
    assert np.all(np.diff(row) >= -1e-12)  # more samples never hurt
    if c == 0:
        assert np.all(row == 0)
    if c > 0 and n - c < ks[-1]:
        assert row[-1] == 1.0


def test_invalid_inputs_name_the_problem():
    with pytest.raises(ValueError, match=r"k=8 exceeds .* n=4 of problem 1"):
        passk.pass_at_k([8, 4], [1, 1], [1, 8])
    with pytest.raises(ValueError, match="problem 0 has c=5"):
        passk.pass_at_k([4], [5], [1])
    with pytest.raises(ValueError, match="whole numbers"):
        passk.pass_at_k([4.5], [1], [1])
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        passk.pass_at_k([4], [1], [0])
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        passk.pass_at_k([0], [0], [1])


def test_power_of_two_ks():
    assert passk.power_of_two_ks(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert passk.power_of_two_ks(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert passk.power_of_two_ks(1) == [1]


def test_summarize_mean_and_standard_error():
    values = np.array([[0.0, 1.0], [0.5, 1.0], [1.0, 1.0]])
    mean, sem = passk.summarize(values)
    np.testing.assert_allclose(mean, [0.5, 1.0])
    np.testing.assert_allclose(sem, [0.5 / math.sqrt(3), 0.0])
    mean, sem = passk.summarize(values[:1])
    assert np.isnan(sem).all()


def test_samples_to_first_correct_equals_enumeration_of_orders():
    for n in range(1, 7):
        for c in range(1, n + 1):
            samples = [1] * c + [0] * (n - c)
            orders = set(permutations(samples))
            mean_first = sum(order.index(1) + 1 for order in orders) / len(orders)
            assert passk.samples_to_first_correct(n, c)[0] == pytest.approx(mean_first)
    assert passk.samples_to_first_correct([5], [0])[0] == np.inf
    summary = passk.summarize_samples_to_correct([4, 4, 4], [0, 1, 4])
    assert summary == pytest.approx({"mean_solved": (2.5 + 1.0) / 2, "solved_fraction": 2 / 3,
                                     "mean_censored": (5 + 2.5 + 1.0) / 3})


def enumerate_maj_at_k(answers, scores, k) -> float:
    """Brute force: every k-subset, majority over non-None answers, ties split evenly."""
    total = 0.0
    subsets = list(combinations(range(len(answers)), k))
    for subset in subsets:
        votes: dict = {}
        for i in subset:
            if answers[i] is not None:
                votes[answers[i]] = votes.get(answers[i], 0) + 1
        if not votes:
            continue
        top = max(votes.values())
        winners = [a for a, v in votes.items() if v == top]
        correct = {a: np.mean([s for x, s in zip(answers, scores) if x == a]) for a in winners}
        total += sum(correct.values()) / len(winners)
    return total / len(subsets)


def random_problem(rng, n):
    pool = ["1", "2", "3", None]
    answers = [pool[i] for i in rng.integers(0, len(pool), n)]
    truth = "1"
    return answers, [float(a == truth) for a in answers]


def test_maj_at_k_exact_mode_equals_enumeration():
    rng = np.random.default_rng(1)
    answers, scores = zip(*[random_problem(rng, int(n)) for n in rng.integers(1, 9, 12)])
    for p in range(len(answers)):
        n = len(answers[p])
        ks = list(range(1, n + 1))
        got = passk.maj_at_k([answers[p]], [scores[p]], ks, num_draws=10**6)
        want = [enumerate_maj_at_k(answers[p], scores[p], k) for k in ks]
        np.testing.assert_allclose(got[0], want, atol=1e-12)


def test_maj_at_k_hand_checked():
    answers = [["a", "b", "a", None], ["x", "x", "y", "y"]]
    scores = [[1, 0, 1, 0], [0, 0, 1, 1]]
    got = passk.maj_at_k(answers, scores, [1, 2, 4])
    # problem 0, k=2: pairs {a,b}→½ ×2, {a,a}→1, {a,None}→1 ×2, {b,None}→0: 4/6
    np.testing.assert_allclose(got, [[0.5, 4 / 6, 1.0], [0.5, 0.5, 0.5]])


def test_maj_at_k_sampled_mode_is_seeded_and_close_to_exact():
    rng = np.random.default_rng(2)
    answers, scores = random_problem(rng, 16)
    exact = passk.maj_at_k([answers], [scores], [6, 8], num_draws=10**6)  # C(16,8)=12870 subsets
    sampled = passk.maj_at_k([answers], [scores], [6, 8], num_draws=5000, seed=3)  # < C(16,6): sampled
    again = passk.maj_at_k([answers], [scores], [6, 8], num_draws=5000, seed=3)
    np.testing.assert_array_equal(sampled, again)
    assert not np.array_equal(sampled, exact)
    np.testing.assert_allclose(sampled, exact, atol=0.03)  # > 4 standard errors at 5000 draws


def test_maj_at_k_rejects_mismatched_input():
    with pytest.raises(ValueError, match="3 answers but 2 scores"):
        passk.maj_at_k([["a", "b", "c"]], [[1, 0]], [1])
    with pytest.raises(ValueError, match="k=4 exceeds"):
        passk.maj_at_k([["a", "b"]], [[1, 0]], [4])
