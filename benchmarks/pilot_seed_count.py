"""Seeds per arm for the pilot's fourth design (issue 43, item 1): an equivalence margin of ±0.03 at pass@256.

    python benchmarks/pilot_seed_count.py [docs/pilot/pass_at_k.csv]

The test (docs/pilot.md, "Fourth design: seed count"): each seed is one unit; per arm, a seed's test
pass@256; the difference of the arms' seed means, method − GRPO, is declared equivalent to 0 when both
one-sided t-tests (TOST) reject at α = 0.05, i.e. when its 90 % interval (mean difference ± t(0.95, df)
× SE, SE² = s_method²/n + s_GRPO²/n, df = 2n − 2) lies inside ±0.03. With n seeds per arm, power 1 − β
at a true difference ε (|ε| < margin) needs

    n ≥ (t(1 − α, 2n − 2) + t(1 − β', 2n − 2))² × (σ_method² + σ_GRPO²) / (margin − |ε|)²,
    β' = β/2 for ε = 0, else β

(Chow, Shao & Wang, *Sample Size Calculations in Clinical Research*, 2nd ed., §3.2: the two-sample
equivalence test, with unequal variances summed); `seeds_per_arm` returns the smallest such n and
`tost_power` checks it by simulation. The variances are the committed third run's per-seed pass@256
(GRPO SD 0.020, RepExp β = 0.01 SD 0.033); the replication of issue 43 (three other seeds) gives
only its difference and 95 % interval, +0.009 [−0.025, +0.039], from which `replication_variance_sum`
backs out σ_method² + σ_GRPO² (the interval is a percentile bootstrap over seeds, whose spread is the
plug-in (n − 1)/n of the sample variance; resampling questions adds little, as the third run's own
interval shows).

Standard library, numpy and scipy only.
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

CSV = Path(__file__).resolve().parents[1] / "docs" / "pilot" / "pass_at_k.csv"
MARGIN = 0.03
ALPHA = 0.05
POWER = 0.8
K = 256
# The replication (issue 43): RepExp β = 0.01 − GRPO at pass@256, three seeds per arm, 95 % interval
REPLICATION = {"diff": 0.009, "low": -0.025, "high": 0.039, "n": 3}


def per_seed(path: Path = CSV, k: int = K) -> dict[str, list[float]]:
    """Test pass@k per seed of each trained arm (`grpo`, `repexp b0.01`, ...) of an aggregate table."""
    values: dict[str, dict[int, float]] = defaultdict(dict)
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if int(row["k"]) == k and row["method"] != "base":
                arm = row["method"] + (f" b{row['beta']}" if row["method"] == "repexp" else "")
                values[arm][int(row["seed"])] = float(row["pass_at_k"])
    return {arm: [seeds[s] for s in sorted(seeds)] for arm, seeds in values.items()}


def seeds_per_arm(variance_sum: float, margin: float = MARGIN, alpha: float = ALPHA, power: float = POWER,
                  true_diff: float = 0.0, max_n: int = 10_000) -> int:
    """The smallest n per arm with n ≥ (t(1−α, 2n−2) + t(1−β', 2n−2))² × variance_sum / (margin − |ε|)²."""
    room = margin - abs(true_diff)
    if room <= 0:
        raise ValueError(f"a true difference of {true_diff} is not inside the margin ±{margin}")
    beta = (1 - power) / (2 if true_diff == 0 else 1)
    for n in range(2, max_n + 1):
        df = 2 * n - 2
        if n >= (stats.t.ppf(1 - alpha, df) + stats.t.ppf(1 - beta, df)) ** 2 * variance_sum / room**2:
            return n
    raise ValueError(f"more than {max_n} seeds per arm")


def tost_power(n: int, sd_a: float, sd_b: float, margin: float = MARGIN, alpha: float = ALPHA,
               true_diff: float = 0.0, sims: int = 20_000, seed: int = 0) -> float:
    """The share of simulated experiments (n normal seeds per arm) in which the TOST above declares
    equivalence: the check of `seeds_per_arm` without its approximation."""
    rng = np.random.default_rng(seed)
    a = rng.normal(true_diff, sd_a, (sims, n))
    b = rng.normal(0.0, sd_b, (sims, n))
    diff = a.mean(1) - b.mean(1)
    se = np.sqrt(a.var(1, ddof=1) / n + b.var(1, ddof=1) / n)
    half = stats.t.ppf(1 - alpha, 2 * n - 2) * se
    return float(np.mean((diff - half > -margin) & (diff + half < margin)))


def replication_variance_sum(low: float, high: float, n: int, z: float = 1.959964) -> float:
    """σ_a² + σ_b² behind a percentile-bootstrap 95 % interval of a difference of two n-seed means:
    half-width ≈ z × sqrt((n − 1)/n × (σ_a² + σ_b²)/n)."""
    half = (high - low) / 2
    return (half / z) ** 2 * n * n / (n - 1)


def sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def main(argv: list[str]) -> int:
    seeds = per_seed(Path(argv[0]) if argv else CSV)
    grpo, repexp = seeds["grpo"], seeds["repexp b0.01"]
    s_g, s_r = sd(grpo), sd(repexp)
    third = s_g**2 + s_r**2
    replication = replication_variance_sum(REPLICATION["low"], REPLICATION["high"], REPLICATION["n"])
    pooled = (third + replication) / 2  # both runs' estimates, each from 3 + 3 seeds
    print(f"third run, pass@{K} per seed: GRPO {grpo} (SD {s_g:.4f}); RepExp b0.01 {repexp} (SD {s_r:.4f})")
    print(f"sigma_R^2 + sigma_G^2: third run {third:.6f}; replication (from its interval) {replication:.6f}; "
          f"both {pooled:.6f}")
    print(f"TOST, alpha {ALPHA} per side, margin ±{MARGIN}; seeds per arm (simulated power at that n):")
    for label, variance in (("third run", third), ("both runs", pooled)):
        for power in (0.8, 0.9):
            for true_diff in (0.0, 0.01):
                n = seeds_per_arm(variance, power=power, true_diff=true_diff)
                half = math.sqrt(variance / 2)  # equal SDs with the same sum: the simulation's arms
                print(f"  {label:9s} power {power} true diff {true_diff:+.2f}: n = {n:3d} "
                      f"(simulated {tost_power(n, half, half, true_diff=true_diff):.3f})")
    n = seeds_per_arm(third)
    print(f"pre-registered: n = {n} per arm (third run's SDs, power {POWER}, true difference 0); "
          f"simulated power with SDs {s_r:.3f}/{s_g:.3f}: {tost_power(n, s_r, s_g):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
