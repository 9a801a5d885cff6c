"""The fourth design's step count (docs/pilot.md, "Fourth design: steps"), from the training split only.

    python benchmarks/pilot4_steps.py [--train-dir docs/pilot/train]

Evidence: GRPO's policy entropy on its own training rollouts (`actor/entropy`, the training split) in the
third run's three GRPO trainings (`docs/pilot/train/trl_grpo_s{1,2,3}.jsonl`, arith-mid, lr 2e-5, 80 steps).
No dev or test number, and no other method's run, enters.

The rule (fixed with this script, before the fourth design ran):
1. The collapse statistic, as in the earlier designs: the mean entropy of 5 consecutive steps (a window
   ending at step t, t ≥ 5).
2. Over the windows ending at steps 41-80 (the slow phase after the fast fall), pooled over the seeds, fit
   log(window mean) = a + b·t by least squares.
3. Spike allowance: the largest residual of that fit (a seed's window above its trend by that factor is the
   worst seen in the 3 × 40 windows; 15 seeds per arm need an allowance near a per-seed 1 − 1/15 quantile
   or beyond, and the largest of 120 residuals is about the 99th percentile).
4. Steps T: the smallest multiple of 10 with a + b·T + (largest residual) < log 0.1.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
THRESHOLD = 0.1  # the earlier designs' collapse threshold (nats per token, mean of the last 5 steps)
WINDOW = 5
FIT_FROM, FIT_TO = 41, 80
SEEDS = (1, 2, 3)


def windows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(end steps, 5-step mean entropies) of one training's metrics.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    entropy = {int(r["step"]): float(r["actor/entropy"]) for r in rows if "actor/entropy" in r}
    steps = sorted(entropy)
    values = np.array([entropy[t] for t in steps])
    means = np.convolve(values, np.ones(WINDOW) / WINDOW, "valid")
    return np.array(steps[WINDOW - 1:]), means


def steps_rule(series: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """The rule of the module docstring applied to [(end steps, window means)] of GRPO's seeds."""
    xs, ys = [], []
    for ends, means in series:
        keep = (ends >= FIT_FROM) & (ends <= FIT_TO)
        xs.append(ends[keep])
        ys.append(np.log(means[keep]))
    x, y = np.concatenate(xs).astype(float), np.concatenate(ys)
    slope, intercept = np.polyfit(x, y, 1)
    residuals = y - (intercept + slope * x)
    allowance = float(residuals.max())
    if slope >= 0:
        raise ValueError("GRPO's entropy does not fall over the fitted steps: the rule gives no step count")
    crossing = (math.log(THRESHOLD) - intercept - allowance) / slope
    return {"slope_per_step": float(slope), "intercept": float(intercept), "allowance": allowance,
            "windows": int(x.size), "crossing_step": float(crossing),
            "steps": int(math.ceil(crossing / 10.0) * 10)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-dir", type=Path, default=REPO / "docs" / "pilot" / "train")
    args = parser.parse_args(argv)
    series = [windows(args.train_dir / f"trl_grpo_s{seed}.jsonl") for seed in SEEDS]
    for seed, (ends, means) in zip(SEEDS, series):
        at80 = float(means[ends == 80][0])
        print(f"GRPO seed {seed}: 5-step mean entropy at step 80 {at80:.3f}; windows below {THRESHOLD} "
              f"from step {FIT_FROM}: {int(((means < THRESHOLD) & (ends >= FIT_FROM)).sum())} of "
              f"{int((ends >= FIT_FROM).sum())}")
    out = steps_rule(series)
    print(f"fit over steps {FIT_FROM}-{FIT_TO} ({out['windows']} windows): log entropy = {out['intercept']:.4f} "
          f"{out['slope_per_step']:+.6f}·t; largest residual {out['allowance']:.3f} "
          f"(×{math.exp(out['allowance']):.2f})")
    print(f"trend × spike allowance below {THRESHOLD} from step {out['crossing_step']:.1f}: "
          f"train.total_steps = {out['steps']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
