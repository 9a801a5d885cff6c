"""pass@k, maj@k and samples-until-first-correct from per-problem sample counts (pure numpy).

Conventions (all estimators are per problem; average over problems afterwards):

* **pass@k** — Chen et al. (2021): draw n samples, c of them correct; the probability that a
  uniformly random k-subset (without replacement) holds at least one correct sample is
  ``1 − C(n−c, k) / C(n, k)``, computed as ``1 − ∏_{i=n−c+1}^{n} (1 − k/i)`` (1 when n − c < k).
  Unbiased; pass@1 = c/n = mean@n. k > n is an error.
* **maj@k** — the expected correctness of a majority vote over a uniformly random k-subset
  (without replacement) of the n samples. Votes are extracted answers; samples with no answer
  (``None``) do not vote, and a subset without any vote scores 0. Ties are broken uniformly at
  random, so a tie contributes the mean correctness of the tied answers. An answer's correctness
  is the mean verifier score of the samples that gave it (0/1 when the verifier is consistent).
  Exact (all k-subsets enumerated) when C(n, k) ≤ ``num_draws``; otherwise the mean over
  ``num_draws`` random k-subsets without replacement from a generator seeded by ``seed`` —
  unbiased, never the with-replacement bootstrap, which is biased.
* **samples until first correct** — the expected number of samples drawn without replacement
  until the first correct one: ``(n+1)/(c+1)`` for c > 0. For c = 0 it is undefined; the
  per-problem function returns ``inf`` and :func:`summarize_samples_to_correct` reports the mean
  over solved problems, the solved fraction, and a censored mean that counts an unsolved problem
  as ``n+1`` (a lower bound on its true cost).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from itertools import combinations

import numpy as np


def power_of_two_ks(n: int) -> list[int]:
    """k = 1, 2, 4, … below n, plus n itself (n = 256 gives 1 … 256; n = 100 gives … 64, 100)."""
    if n < 1:
        raise ValueError(f"number of samples must be >= 1, got {n}")
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) < n]
    return ks + [n]


def _as_counts(num_samples, num_correct) -> tuple[np.ndarray, np.ndarray]:
    n, c = np.asarray(num_samples), np.asarray(num_correct)
    if n.ndim > 1 or c.ndim > 1:
        raise ValueError("num_samples and num_correct must be scalars or 1-D arrays (one entry per problem)")
    n, c = np.broadcast_arrays(np.atleast_1d(n), np.atleast_1d(c))
    for name, arr in (("num_samples", n), ("num_correct", c)):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{name} must hold whole numbers")
    n, c = n.astype(np.int64), c.astype(np.int64)
    if np.any(n < 1):
        raise ValueError(f"num_samples must be >= 1 (problem {int(np.argmax(n < 1))} has {int(n[n < 1][0])})")
    bad = (c < 0) | (c > n)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(f"num_correct must lie in [0, num_samples]; problem {i} has c={int(c[i])}, n={int(n[i])}")
    return n, c


def _as_ks(ks) -> np.ndarray:
    ks = np.atleast_1d(np.asarray(ks))
    if ks.ndim != 1 or ks.size == 0:
        raise ValueError("ks must be a non-empty 1-D list of integers")
    if not np.all(np.equal(np.mod(ks, 1), 0)) or np.any(ks < 1):
        raise ValueError(f"every k must be an integer >= 1, got {ks.tolist()}")
    return ks.astype(np.int64)


def pass_at_k(num_samples, num_correct, ks) -> np.ndarray:
    """Unbiased pass@k for every problem and every k: an array of shape [problems, len(ks)].

    ``num_samples`` and ``num_correct`` are per-problem (problems may have different n; a scalar
    broadcasts). Raises ValueError if any k exceeds a problem's n.
    """
    n, c = _as_counts(num_samples, num_correct)
    ks = _as_ks(ks)
    too_big = ks[None, :] > n[:, None]
    if np.any(too_big):
        p, j = np.argwhere(too_big)[0]
        raise ValueError(f"k={int(ks[j])} exceeds the number of samples n={int(n[p])} of problem {int(p)}")
    # log ∏_{i=n−c+1}^{n} (1 − k/i) = L_k(n) − L_k(n−c), with L_k(m) = Σ_{i=k+1}^{m} log(1 − k/i):
    # one cumulative table per k, then two lookups per problem. Only used where n − c ≥ k, so every
    # factor has i > k and the log is finite.
    n_max = int(n.max()) if n.size else 0
    i = np.arange(1, n_max + 1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(i[None, :] > ks[:, None], np.log1p(-ks[:, None] / i[None, :]), 0.0)
    table = np.concatenate([np.zeros((len(ks), 1)), np.cumsum(terms, axis=1)], axis=1)  # [K, n_max+1]
    failures = n - c
    log_all_fail = table[:, n].T - table[:, failures].T  # [P, K]
    has_room = failures[:, None] >= ks[None, :]
    return np.where(has_room, -np.expm1(np.where(has_room, log_all_fail, 0.0)), 1.0)


def summarize(per_problem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over problems (axis 0) and its standard error (sample std / √P; NaN for one problem)."""
    values = np.asarray(per_problem, dtype=np.float64)
    if values.shape[0] == 0:
        raise ValueError("cannot summarise zero problems")
    mean = values.mean(axis=0)
    if values.shape[0] < 2:
        return mean, np.full_like(mean, np.nan)
    return mean, values.std(axis=0, ddof=1) / math.sqrt(values.shape[0])


def samples_to_first_correct(num_samples, num_correct) -> np.ndarray:
    """Expected draws without replacement until the first correct sample: (n+1)/(c+1); inf when c = 0."""
    n, c = _as_counts(num_samples, num_correct)
    with np.errstate(divide="ignore"):
        return np.where(c > 0, (n + 1) / (c + 1), np.inf)


def summarize_samples_to_correct(num_samples, num_correct) -> dict[str, float | None]:
    """Mean samples-until-first-correct over solved problems, solved fraction, censored mean (c=0 → n+1)."""
    n, c = _as_counts(num_samples, num_correct)
    if n.size == 0:
        raise ValueError("cannot summarise zero problems")
    expected = samples_to_first_correct(n, c)
    solved = c > 0
    censored = np.where(solved, expected, n + 1.0)
    return {
        "mean_solved": float(expected[solved].mean()) if solved.any() else None,
        "solved_fraction": float(solved.mean()),
        "mean_censored": float(censored.mean()),
    }


def _encode_answers(answers: Sequence[Hashable | None], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Answer class id per sample (−1 = no answer) and the mean score of each class."""
    if len(answers) != len(scores):
        raise ValueError(f"got {len(answers)} answers but {len(scores)} scores for one problem")
    ids: dict[Hashable, int] = {}
    codes = np.empty(len(answers), dtype=np.int64)
    for j, answer in enumerate(answers):
        codes[j] = -1 if answer is None else ids.setdefault(answer, len(ids))
    scores = np.asarray(scores, dtype=np.float64)
    voted = codes >= 0
    totals = np.bincount(codes[voted], weights=scores[voted], minlength=len(ids))
    counts = np.bincount(codes[voted], minlength=len(ids))
    return codes, totals / np.maximum(counts, 1)


def _vote(subsets: np.ndarray, class_correct: np.ndarray) -> np.ndarray:
    """Majority-vote correctness of each row of ``subsets`` (class ids, −1 = abstain), ties averaged."""
    num_classes = len(class_correct)
    if num_classes == 0:
        return np.zeros(len(subsets))
    rows = np.repeat(np.arange(len(subsets)), subsets.shape[1])
    flat = subsets.ravel()
    keep = flat >= 0
    votes = np.bincount(rows[keep] * num_classes + flat[keep], minlength=len(subsets) * num_classes)
    votes = votes.reshape(len(subsets), num_classes)
    top = votes.max(axis=1, keepdims=True)
    winners = (votes == top) & (top > 0)
    num_winners = winners.sum(axis=1)
    return np.where(num_winners > 0, (winners @ class_correct) / np.maximum(num_winners, 1), 0.0)


def maj_at_k(
    answers: Sequence[Sequence[Hashable | None]],
    scores: Sequence[Sequence[float]],
    ks,
    *,
    num_draws: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """Majority-vote accuracy over random k-subsets, per problem and k: shape [problems, len(ks)].

    ``answers[p]`` holds problem p's extracted answers (``None`` = no answer) and ``scores[p]``
    their 0/1 verifier scores. See the module docstring for the exact definition.
    """
    if len(answers) != len(scores):
        raise ValueError(f"got answers for {len(answers)} problems but scores for {len(scores)}")
    ks = _as_ks(ks)
    if num_draws < 1:
        raise ValueError(f"num_draws must be >= 1, got {num_draws}")
    rng = np.random.default_rng(seed)
    out = np.empty((len(answers), len(ks)))
    for p, (problem_answers, problem_scores) in enumerate(zip(answers, scores)):
        codes, class_correct = _encode_answers(problem_answers, problem_scores)
        n = len(codes)
        if n == 0:
            raise ValueError(f"problem {p} has no samples")
        if ks.max() > n:
            raise ValueError(f"k={int(ks.max())} exceeds the number of samples n={n} of problem {p}")
        # one set of random permutations per problem: every prefix of length k is a uniform k-subset
        permutations = None
        for j, k in enumerate(ks):
            if math.comb(n, int(k)) <= num_draws:
                subsets = codes[np.array(list(combinations(range(n), int(k))), dtype=np.int64)]
            else:
                if permutations is None:
                    permutations = np.argsort(rng.random((num_draws, n)), axis=1)
                subsets = codes[permutations[:, : int(k)]]
            out[p, j] = _vote(subsets, class_correct).mean()
    return out
