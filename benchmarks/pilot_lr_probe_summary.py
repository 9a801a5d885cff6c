"""Summarise the pilot's learning-rate probe (benchmarks/pilot_lr_probe.sh) and apply the decision
rule that docs/pilot.md ("Second design") fixed before the probe ran:

  * collapse: GRPO's policy entropy, averaged over the last 5 training steps, below 0.1 nats/token;
  * the second run's learning rate is the smallest probed rate that collapses and whose verifier
    reward over those steps is not below the 1e-5 run's (a rate that wrecks the policy is out).

    python3 benchmarks/pilot_lr_probe_summary.py results/probe [--steps 40]

Only the standard library: it runs wherever the probe ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ENTROPY = "actor/entropy"
REWARD = "reward/verifier/mean"
DISTINCT = "rollout/distinct_frac"
STEP_TIME = "timing_s/step"
COLLAPSED_BELOW = 0.1
LAST = 5
MARKS = (1, 10, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200)  # the steps whose entropy the table shows


def training_steps(metrics: Path) -> list[dict]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return sorted((r for r in rows if r.get("step", 0) >= 1 and ENTROPY in r), key=lambda r: r["step"])


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--steps", type=int, default=None, help="judge collapse at this step (default: the last)")
    args = parser.parse_args()
    runs = {}
    for metrics in sorted(args.root.glob("lr*/train/*/trl_grpo_s1/metrics.jsonl")):
        lr = metrics.parts[len(args.root.parts)][2:]
        steps = training_steps(metrics)
        if args.steps is not None:
            steps = [r for r in steps if r["step"] <= args.steps]
        if steps:
            runs[lr] = steps
    if not runs:
        raise SystemExit(f"no probe metrics under {args.root}")
    longest = max(steps[-1]["step"] for steps in runs.values())
    marks_shown = [s for s in MARKS if s <= longest]
    print(f"{'lr':>6} {'steps':>5} {'s/step':>6}  entropy at step {'/'.join(map(str, marks_shown))}   "
          f"last-{LAST}: entropy reward distinct")
    summary = {}
    for lr, steps in sorted(runs.items(), key=lambda kv: float(kv[0])):
        by_step = {r["step"]: r for r in steps}
        marks = " ".join(f"{by_step[s][ENTROPY]:.2f}" if s in by_step else "  - " for s in marks_shown)
        tail = steps[-LAST:]
        row = {
            "steps": steps[-1]["step"],
            "step_s": mean([r[STEP_TIME] for r in steps if STEP_TIME in r]),
            "entropy": mean([r[ENTROPY] for r in tail]),
            "reward": mean([r[REWARD] for r in tail]),
            "distinct": mean([r[DISTINCT] for r in tail if DISTINCT in r]),
        }
        summary[lr] = row
        print(f"{lr:>6} {row['steps']:>5} {row['step_s']:>6.2f}  {marks}   "
              f"{row['entropy']:.3f} {row['reward']:.3f} {row['distinct']:.3f}")
    reference = summary.get("1e-5", {}).get("reward", float("-inf"))
    chosen = [lr for lr, row in sorted(summary.items(), key=lambda kv: float(kv[0]))
              if row["entropy"] < COLLAPSED_BELOW and row["reward"] >= reference]
    print(json.dumps({"rule": f"smallest lr with last-{LAST} entropy < {COLLAPSED_BELOW} and reward >= lr 1e-5's",
                      "chosen_lr": chosen[0] if chosen else None, "runs": summary}, indent=1))


if __name__ == "__main__":
    main()
