"""The pure part of `repexp testtime`: pass@k of an order, verifier efficiency, bootstrap (numpy only).

Per problem p with n_p samples, c_p of them correct, and a RepExp order of its samples:

* first_p = the 1-based position of the first correct sample in the order (∞ when c_p = 0);
* pass@k (RepExp) = mean_p 1[first_p ≤ k]: the verifier is called on the first k samples taken;
* pass@k (random) = mean_p of the unbiased 1 − C(n−c, k)/C(n, k) (`repexp.passk`): a uniformly random
  order of the same samples. At k = n both are mean_p 1[c_p > 0], by construction.
* verifier efficiency at a reference k: k_RepExp = the smallest k' with pass@k'(RepExp) ≥ pass@k(random),
  efficiency = k / k_RepExp (> 1: RepExp needs fewer verifier calls for random's pass@k). Exact on
  the integer grid k' = 1 … n, no interpolation. Undefined when pass@k(random) = 0.
* samples-to-correct (the paper's verifier-efficiency metric): the mean over solved problems (c_p > 0)
  of first_p (RepExp) and of (n_p+1)/(c_p+1) (random: the expected position of the first correct
  sample in a uniformly random order); ratio = random / RepExp.

Uncertainty: a percentile bootstrap over problems (resampling problems with replacement) of every
efficiency and of the samples-to-correct ratio, with a seeded generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from repexp import passk
from repexp.evaluate.core import add_metadata, json_float

EQUAL_TOLERANCE = 1e-12  # pass@k means that agree to this count as equal (float noise in the means)
DEFAULT_BOOTSTRAP = 1000


def first_correct_positions(orders: Sequence[Sequence[int]], scores: Sequence[Sequence[float]]) -> np.ndarray:
    """Per problem, the 1-based position of its first correct sample in `orders[p]` (inf if none).

    `orders[p]` is a permutation of range(len(scores[p])); scores are 0/1 verifier scores.
    """
    out = np.full(len(orders), np.inf)
    for p, (order, score) in enumerate(zip(orders, scores)):
        order = np.asarray(order, dtype=np.int64)
        score = np.asarray(score, dtype=np.float64)
        if order.shape != score.shape or sorted(order.tolist()) != list(range(len(score))):
            raise ValueError(f"problem {p}: the order is not a permutation of its {len(score)} samples")
        hits = np.flatnonzero(score[order] > 0)
        if hits.size:
            out[p] = hits[0] + 1
    return out


def efficiency(repexp_curve: np.ndarray, random_curve: np.ndarray, ks: np.ndarray,
               reference_ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k_RepExp, k / k_RepExp) at each reference k from mean curves on the full grid `ks` (= 1 … K).

    Works on stacks of curves ([..., K]), e.g. bootstrap replicates. NaN where random's pass@k is 0.
    """
    index = np.searchsorted(ks, reference_ks)
    target = random_curve[..., index]  # [..., R]
    reached = repexp_curve[..., None, :] >= target[..., None] - EQUAL_TOLERANCE  # [..., R, K]
    # pass@k of an order is non-decreasing in k, and at k = K it equals random's pass@K ≥ the target
    first = reached.argmax(-1)
    k_needed = ks[first].astype(np.float64)
    k_needed = np.where(reached.any(-1) & (target > 0), k_needed, np.nan)
    return k_needed, reference_ks / k_needed


def samples_to_correct(first: np.ndarray, n: np.ndarray, c: np.ndarray, weights: np.ndarray | None = None):
    """(mean RepExp position, mean random expectation, ratio) over solved problems; weights = bootstrap counts."""
    solved = c > 0
    random = np.where(solved, (n + 1) / (c + 1), 0.0)
    repexp = np.where(solved, first, 0.0)
    if weights is None:
        weights = np.ones((1, len(n)))
    count = weights @ solved.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_repexp = (weights @ repexp) / count
        mean_random = (weights @ random) / count
        return mean_repexp, mean_random, mean_random / mean_repexp


def _interval(samples: np.ndarray) -> list[float | None]:
    """2.5 and 97.5 percentiles over axis 0 ignoring NaN (None where every replicate is NaN)."""
    columns = [column[np.isfinite(column)] for column in np.atleast_2d(samples.T)]
    return [[float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if v.size else None for v in columns]


def testtime_result(
    *,
    problem_ids: Sequence[str],
    scores: Sequence[Sequence[float]],
    orders: Sequence[Sequence[int]],
    reference_ks: Sequence[int] | None = None,
    bootstrap: int = DEFAULT_BOOTSTRAP,
    bootstrap_seed: int = 0,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `testtime.json` object (keys in docs/evaluation.md, "Test-time RepExp")."""
    n = np.array([len(s) for s in scores], dtype=np.int64)  # ≥ 1 each: an evaluation's complete samples
    if n.size == 0:
        raise ValueError("no problems")
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores])
    if not np.all((flat == 0) | (flat == 1)):
        raise ValueError("verifier scores must be 0 or 1")
    c = np.array([int(np.sum(s)) for s in scores], dtype=np.int64)
    first = first_correct_positions(orders, scores)
    k_max = int(n.min())
    ks = np.arange(1, k_max + 1)
    if reference_ks is None:
        reference_ks = passk.power_of_two_ks(k_max)
    reference_ks = np.asarray(sorted({int(k) for k in reference_ks}), dtype=np.int64)
    if reference_ks.size == 0 or reference_ks.min() < 1 or reference_ks.max() > k_max:
        raise ValueError(f"reference ks must lie in [1, {k_max}], got {reference_ks.tolist()}")
    # per-problem pass@k [P, K] of the RepExp order and of a random order
    per_repexp, per_random = (first[:, None] <= ks[None, :]).astype(np.float64), passk.pass_at_k(n, c, ks)
    mean_repexp, mean_random = per_repexp.mean(0), per_random.mean(0)
    k_needed, ratio = efficiency(mean_repexp, mean_random, ks, reference_ks)
    stc_repexp, stc_random, stc_ratio = (float(v[0]) for v in samples_to_correct(first, n, c))

    result: dict[str, Any] = {
        "k": ks.tolist(),
        "pass_at_k_repexp": mean_repexp.tolist(),
        "pass_at_k_random": mean_random.tolist(),
        "pass_at_k_repexp_sem": (per_repexp.std(0, ddof=1) / math.sqrt(len(n))).tolist() if len(n) > 1 else None,
        "efficiency": {
            "reference_k": reference_ks.tolist(),
            "pass_at_k_random": mean_random[reference_ks - 1].tolist(),
            "k_repexp": [json_float(v) for v in k_needed],
            "ratio": [json_float(v) for v in ratio],
        },
        "samples_to_correct": {
            "repexp": json_float(stc_repexp), "random": json_float(stc_random), "ratio": json_float(stc_ratio),
            "num_solved": int((c > 0).sum()),
        },
        "num_problems": len(n),
        "n_samples": int(n.max()) if n.min() == n.max() else n.tolist(),
        "bootstrap": {"replicates": int(bootstrap), "seed": int(bootstrap_seed), "interval": "percentile 95%"},
        "per_problem": [
            {"problem_id": pid, "n": int(ni), "c": int(ci), "first_correct_repexp": None if math.isinf(f) else int(f)}
            for pid, ni, ci, f in zip(problem_ids, n, c, first)
        ],
    }
    if bootstrap:
        rng = np.random.default_rng(np.random.SeedSequence([int(bootstrap_seed), 0x7E57]))
        weights = rng.multinomial(len(n), np.full(len(n), 1.0 / len(n)), size=bootstrap).astype(np.float64)
        boot_repexp = weights @ per_repexp / len(n)
        boot_random = weights @ per_random / len(n)
        _, boot_ratio = efficiency(boot_repexp, boot_random, ks, reference_ks)
        result["efficiency"]["ratio_ci95"] = _interval(boot_ratio)
        finite = np.isfinite(boot_ratio).any()
        std = np.nanstd(np.log2(boot_ratio), axis=0, ddof=1) if finite else [None] * len(reference_ks)
        result["efficiency"]["log2_ratio_std"] = [json_float(v) for v in std]
        stc = samples_to_correct(first, n, c, weights)[2]
        result["samples_to_correct"]["ratio_ci95"] = _interval(stc[:, None])[0]
    return add_metadata(result, metadata)
