"""Seconds per TRL training step, and the share of it spent on the RepExp bonus.

    .venv/bin/python benchmarks/trl_step.py [--models tiny smollm2] [--steps 4] [--threads 2]

For each model it trains the same GSM8K job twice through `repexp.trl.train.train` (the real
trainer, real data from `repexp data prepare`): RepExp (β = 0.01, k = 32) and the GRPO baseline
(β = 0) in the same process, and reads the per-step timings the trainer logs to metrics.jsonl:

- `timing_s/step`: one training step (generation, reward, PPO update; validation excluded),
- `timing_s/repexp_forward`: the frozen-model forward for the bonus features,
- `timing_s/repexp_bonus`: projection + per-group bonus + turn-off rules (`repexp.elliptical`).

Step 1 is a warm-up and is excluded; medians over the remaining steps are reported, with the
ratio RepExp / GRPO step time (the baseline is measured in the same run). Target: bonus math
< 1% of the step. The tiny model is built offline; SmolLM2 must exist as a Hugging Face
directory (`repexp model smollm2 --out .cache/smollm2`). Data: GSM8K from ../shared/data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"

# Per model: prompts/step, rollouts, response tokens (kept small: the machine is shared).
SHAPES = {
    "tiny": dict(train_batch_size=4, n_rollouts=8, max_response_length=64),
    "smollm2": dict(train_batch_size=4, n_rollouts=4, max_response_length=128),
}


def prepared_gsm8k(out: Path) -> Path:
    if not (out / "train.parquet").exists():
        subprocess.run(
            [sys.executable, "-m", "repexp", "data", "prepare", "gsm8k",
             "--source", str(REPO.parent / "shared" / "data"),
             "--out", str(out), "--limit-train", "256", "--limit-dev", "2"],
            check=True, cwd=REPO,
        )
    return out


def model_path(name: str, workdir: Path) -> Path:
    if name == "tiny":
        from repexp.models import build_tiny_qwen2

        return build_tiny_qwen2(workdir / "tiny", seed=0)
    path = CACHE / "smollm2"
    if not (path / "config.json").exists():
        raise SystemExit(f"{path}: missing; run `.venv/bin/repexp model smollm2 --out {path}` first")
    return path


def job(model: Path, data: Path, run_root: Path, *, beta: float, steps: int, threads: int, shape: dict):
    from repexp import config as C

    raw = {
        "results_dir": str(run_root),
        "model": str(model),
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [32], "betas": [0.01], "seeds": [0]},
        "train": {
            "lr": 1e-6, "ppo_mini_batch_size": shape["train_batch_size"], "micro_batch_size_per_gpu": 16,
            "max_prompt_length": 256, "total_steps": steps, "test_freq": steps, "save_freq": steps,
            "val_n": 1, "val_before_train": False, **shape,
        },
        "trl": {"device": "cpu", "num_threads": threads, "eval_batch_size": 2},
    }
    spec = (C.RunSpec.of("gsm8k", "repexp", "trl", 0, sparse_dim=32, beta=beta) if beta
            else C.RunSpec.of("gsm8k", "grpo", "trl", 0))
    cfg = C.compose(C.load(raw), spec)
    return dataclasses.replace(cfg, data_dir=str(data))


def measure(cfg) -> dict:
    from repexp.trl.runlog import MetricsLog
    from repexp.trl.train import train

    started = time.perf_counter()
    train(cfg, resume="never")
    wall = time.perf_counter() - started
    records = [r for r in MetricsLog(cfg.run_dir).records() if r["step"] >= 2]  # step 1 warms up
    if not records:
        raise SystemExit("need --steps >= 2 (step 1 is excluded as warm-up)")

    def median(key: str) -> float:
        values = [r[key] for r in records if r.get(key) is not None]
        return statistics.median(values) if values else 0.0

    step = median("timing_s/step")
    forward, bonus = median("timing_s/repexp_forward"), median("timing_s/repexp_bonus")
    return {
        "step_s": step,
        "repexp_forward_s": forward,
        "repexp_bonus_s": bonus,
        "forward_share": forward / step,
        "bonus_share": bonus / step,
        "steps_measured": len(records),
        "run_wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (>= 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = prepared_gsm8k(CACHE / "data" / "gsm8k-bench")
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        workdir = Path(tmp)
        for name in args.models:
            model = model_path(name, workdir)
            shape = SHAPES[name]
            per_beta = {}
            for beta in (0.01, 0.0):
                cfg = job(model, data, workdir / f"{name}-{beta}", beta=beta, steps=args.steps,
                          threads=args.threads, shape=shape)
                per_beta["repexp" if beta else "grpo"] = measure(cfg)
            results[name] = {
                "shape": shape,
                **per_beta,
                "repexp_over_grpo_step": per_beta["repexp"]["step_s"] / per_beta["grpo"]["step_s"],
            }
    load_after = os.getloadavg()
    report = {"threads": args.threads, "steps": args.steps, "loadavg_before": load_before,
              "loadavg_after": load_after, "cpus": os.cpu_count(), "results": results}
    print(json.dumps(report, indent=2))
    print("\n| model | prompts × rollouts, tokens | GRPO s/step | RepExp s/step | RepExp/GRPO | bonus forward "
          "| bonus math |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        s, rep = r["shape"], r["repexp"]
        print(f"| {name} | {s['train_batch_size']} × {s['n_rollouts']}, {s['max_response_length']} | "
              f"{r['grpo']['step_s']:.2f} | {rep['step_s']:.2f} | {r['repexp_over_grpo_step']:.2f} | "
              f"{rep['repexp_forward_s']:.3f} s ({100 * rep['forward_share']:.1f}%) | "
              f"{1000 * rep['repexp_bonus_s']:.2f} ms ({100 * rep['bonus_share']:.2f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
