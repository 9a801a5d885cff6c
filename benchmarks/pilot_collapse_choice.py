"""Apply the pilot's third-design rule to its probe (benchmarks/pilot_collapse_probe.sh) and, with
--apply, write the chosen task, learning rate and step count into the pilot config.

    python3 benchmarks/pilot_collapse_choice.py results/probe3 --steps 100 [--apply configs/pilot.yaml]

The rule, fixed in docs/pilot.md ("The third design") before the probe ran:

  * steps: STEPS (100) if the probe's wall time (4 GRPO trainings and 2 base evaluations side by
    side) scaled to the pilot's 9 trainings (x 9/4, x 1.13 for RepExp's extra forward) is at most
    780 s (20 minutes minus the 356 s the second run spent outside training, minus a minute);
    else 80, and every number below is read at step 80;
  * a task is in the window if the base model's DEV pass@1 is in [0.02, 0.25] and its DEV pass@256
    is at most 0.95;
  * a candidate collapses if GRPO's policy entropy, averaged over the last 5 steps, is below 0.1;
  * a candidate is sound if its verifier reward over those steps is at least 0.9 x the best of its
    task's candidates, and for arith-hard at least 0.9 x 0.441 (the 5e-5 run of the 2026-12-03 probe);
  * choice: arith-hard if its candidate collapses, is sound and in the window (the task of the first
    two runs); else the smallest learning rate of arith-mid that collapses, is sound and in the
    window; else (no collapse) the sound candidate in the window with the lowest entropy, and the
    run is reported as not having reached the collapse; no candidate sound and in the window:
    exit 3, nothing written, the pilot is not run.

Only the standard library: it runs wherever the probe ran.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ENTROPY = "actor/entropy"
REWARD = "reward/verifier/mean"
DISTINCT = "rollout/distinct_frac"
COLLAPSED_BELOW = 0.1
LAST = 5
SHORT_STEPS = 80
TRAIN_BUDGET_S = 780.0
SCALE = 9 / 4 * 1.13
WINDOW_PASS1 = (0.02, 0.25)
WINDOW_PASS256_MAX = 0.95
SOUND_FRACTION = 0.9
ARITH_HARD_REWARD_REF = 0.441  # last-5 verifier reward of lr 5e-5 in the 2026-12-03 probe (docs/pilot.md)
PREFERRED = "arith-hard"
MARKS = (1, 10, 20, 30, 40, 50, 60, 80, 100)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def training_steps(metrics: Path, upto: int) -> list[dict]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return sorted((r for r in rows if 1 <= r.get("step", 0) <= upto and ENTROPY in r), key=lambda r: r["step"])


def base_window(root: Path) -> dict[str, dict]:
    out = {}
    for eval_json in sorted(root.glob("base-dev/*/eval.json")):
        passes = json.loads(eval_json.read_text())["pass_at_k"]
        p1, p256 = float(passes["1"]), float(passes.get("256", "nan"))
        in_window = WINDOW_PASS1[0] <= p1 <= WINDOW_PASS1[1] and p256 <= WINDOW_PASS256_MAX
        out[eval_json.parent.name] = {"pass@1": p1, "pass@256": p256, "in_window": in_window}
    return out


def choose(root: Path, steps: int) -> dict:
    wall = json.loads((root / "wall.json").read_text())
    estimate = wall["wall_s"] * SCALE
    run_steps = steps if estimate <= TRAIN_BUDGET_S else SHORT_STEPS
    window = base_window(root)
    runs = {}
    for metrics in sorted((root / "metrics").glob("*-lr*.jsonl")):
        task, lr = metrics.stem.rsplit("-lr", 1)
        rows = training_steps(metrics, run_steps)
        if len(rows) < run_steps:  # a training that stopped early is no candidate
            runs[metrics.stem] = {"task": task, "lr": lr, "steps": len(rows), "incomplete": True}
            continue
        tail = rows[-LAST:]
        by_step = {r["step"]: r for r in rows}
        runs[metrics.stem] = {
            "task": task, "lr": lr, "steps": len(rows),
            "entropy_at": {s: round(by_step[s][ENTROPY], 3) for s in MARKS if s in by_step},
            "entropy": mean([r[ENTROPY] for r in tail]),
            "reward": mean([r[REWARD] for r in tail]),
            "distinct": mean([r[DISTINCT] for r in tail if DISTINCT in r]),
        }
    complete = [r for r in runs.values() if not r.get("incomplete")]
    for run in complete:
        best = max(r["reward"] for r in complete if r["task"] == run["task"])
        floor = SOUND_FRACTION * best
        if run["task"] == "arith-hard":
            floor = max(floor, SOUND_FRACTION * ARITH_HARD_REWARD_REF)
        run["sound"] = run["reward"] >= floor
        run["collapsed"] = run["entropy"] < COLLAPSED_BELOW
        run["in_window"] = window.get(run["task"], {}).get("in_window", False)
        run["eligible"] = run["sound"] and run["in_window"]
    eligible = [r for r in complete if r["eligible"]]
    collapsed = [r for r in eligible if r["collapsed"]]
    preferred = [r for r in collapsed if r["task"] == PREFERRED]
    if preferred:
        chosen, why = min(preferred, key=lambda r: float(r["lr"])), "arith-hard collapses"
    elif collapsed:
        chosen, why = min(collapsed, key=lambda r: float(r["lr"])), "smallest collapsing lr of arith-mid"
    elif eligible:
        chosen, why = min(eligible, key=lambda r: r["entropy"]), "no candidate collapsed: lowest entropy"
    else:
        chosen, why = None, "no candidate is sound and in the window"
    return {"probe_wall_s": wall["wall_s"], "estimated_longest_training_s": round(estimate),
            "run_steps": run_steps, "base_dev": window, "runs": runs, "why": why,
            "chosen": None if chosen is None else {"task": chosen["task"], "lr": chosen["lr"],
                                                   "total_steps": run_steps, "collapsed": chosen["collapsed"]}}


def _yaml_float(value: float) -> str:
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"  # 5.0e-5, as the config writes it (YAML reads it as a float)


def apply(config: Path, chosen: dict) -> None:
    """Write the three values into the pilot config, keeping every comment and every other line."""
    text = config.read_text()
    for key, value in (("tasks", f"[{chosen['task']}]"), ("lr", _yaml_float(float(chosen["lr"]))),
                       ("total_steps", str(chosen["total_steps"]))):
        def swap(match: re.Match) -> str:  # the comment stays in its column where the value fits
            width = len(match.group(2)) + len(match.group(3))
            return match.group(1) + value + " " * max(width - len(value), 1 if match.group(3) else 0)
        text, count = re.subn(rf"^(  {key}: )(\[[^\]]*\]|\S+)( *)", swap, text, count=1, flags=re.MULTILINE)
        if count != 1:
            raise SystemExit(f"{config}: no line sets {key}")
    config.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--apply", type=Path, default=None, help="write the choice into this pilot config")
    args = parser.parse_args()
    result = choose(args.root, args.steps)
    print(f"probe wall {result['probe_wall_s']} s -> longest pilot training ~{result['estimated_longest_training_s']} s"
          f" -> {result['run_steps']} steps")
    for task, base in result["base_dev"].items():
        print(f"base on {task} dev: pass@1 {base['pass@1']:.3f}, pass@256 {base['pass@256']:.3f},"
              f" {'in' if base['in_window'] else 'OUT OF'} the window")
    print(f"{'candidate':>18}  entropy at {'/'.join(map(str, MARKS))}   last-{LAST}: entropy reward distinct")
    for name, run in result["runs"].items():
        if run.get("incomplete"):
            print(f"{name:>18}  stopped after {run['steps']} steps: no candidate")
            continue
        marks = " ".join(f"{run['entropy_at'].get(s, float('nan')):.2f}" for s in MARKS)
        flags = ",".join(f for f in ("collapsed", "sound", "in_window") if run[f])
        print(f"{name:>18}  {marks}   {run['entropy']:.3f} {run['reward']:.3f} {run['distinct']:.3f}  [{flags}]")
    print(json.dumps({"why": result["why"], "chosen": result["chosen"]}))
    (args.root / "choice.json").write_text(json.dumps(result, indent=1))
    if result["chosen"] is None:
        raise SystemExit(3)
    if args.apply is not None:
        apply(args.apply, result["chosen"])


if __name__ == "__main__":
    main()
