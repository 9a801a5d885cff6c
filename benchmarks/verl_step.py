"""RepExp against GRPO on verl, side by side on one GPU: seconds per step, the bonus's share, peak memory.

    python benchmarks/verl_step.py --out /tmp/verl-step            # GPU node with the verl + vLLM stack

Both runs go through the pipeline's own path (`repexp.config.compose` → `build_overrides` →
``python -m repexp.verl.train``) with the same data, seed and shapes; only β differs (0 = GRPO,
which builds no representation model). The policy is a random-weight model with Qwen2.5-1.5B's
layer shapes and a 4,096-token vocabulary (`repexp model tiny --shape qwen2.5-1.5b`): random
weights rarely emit the end-of-sequence token, so every rollout runs to the response length and
both runs do the same work per step. The first step (CUDA and vLLM warm-up) is reported but left
out of the medians. Prints one JSON object (also written to ``<out>/verl_step.json``) with the
per-step timings of both runs, their ratio and the targets of docs/performance.md.
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
sys.path.insert(0, str(REPO))

from repexp import config as C  # noqa: E402
from repexp.verl.overrides import build_overrides  # noqa: E402

TIMINGS = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor",
           "timing_s/repexp_forward", "timing_s/repexp_bonus", "timing_s/adv")
MEMORY = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")


def pipeline(args: argparse.Namespace, model: Path, results: Path) -> dict:
    """A one-GPU pipeline config with the benchmark's shapes (the sweep holds one RepExp point + GRPO)."""
    return {
        "name": "verl-step-benchmark",
        "results_dir": str(results),
        "model": str(model),
        "sweep": {"tasks": ["gsm8k"], "backends": ["verl"], "sparse_dims": [args.sparse_dim], "betas": [0.01],
                  "seeds": [42], "grpo_baseline": True, "base_baseline": False},
        "train": {"n_rollouts": args.rollouts, "train_batch_size": args.prompts, "ppo_mini_batch_size": args.prompts,
                  "micro_batch_size_per_gpu": 16, "max_prompt_length": 512, "max_response_length": args.response_length,
                  "total_steps": args.steps, "test_freq": args.steps, "save_freq": args.steps,
                  "val_before_train": False, "val_n": 1},
        "verl": {"n_gpus_per_node": 1, "rollout_tensor_parallel_size": 1, "gpu_memory_utilization": 0.5,
                 "log_prob_micro_batch_size_per_gpu": 32, "repexp_micro_batch_size_per_gpu": 32,
                 "enable_gradient_checkpointing": True, "use_remove_padding": False,
                 "overrides": ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                               "actor_rollout_ref.repexp.attn_implementation=sdpa"]},
        "resources": {"train": {"gpu": 1}},
    }


def run_one(rc: C.RunConfig, log: Path) -> float:
    overrides = build_overrides(rc, loggers=["console"])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.call([sys.executable, "-m", "repexp.verl.train", *overrides], stdout=handle,
                               stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if code:
        raise SystemExit(f"{rc.run}: verl exited with {code}; see {log}")
    return time.perf_counter() - started


def step_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return sorted((r for r in rows if "timing_s/step" in r), key=lambda r: r["step"])


def summarise(rows: list[dict]) -> dict:
    steady = rows[1:] or rows  # step 1 carries the warm-up
    out = {"steps": [r["step"] for r in rows], "first_step_s": rows[0]["timing_s/step"]}
    for key in TIMINGS:
        values = [r[key] for r in steady if key in r]
        if values:
            out[key] = statistics.median(values)
    for key in MEMORY:
        values = [r[key] for r in rows if key in r]
        if values:
            out[key] = max(values)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--sparse-dim", type=int, default=32)
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="offline data source")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    if not model.exists():
        subprocess.check_call([sys.executable, "-m", "repexp", "model", "tiny", "--shape", args.shape,
                               "--out", str(model)])
    results = out / "results"
    data_dir = results / "data" / "gsm8k"
    if not (data_dir / "train.parquet").exists():
        subprocess.check_call([sys.executable, "-m", "repexp", "data", "prepare", "gsm8k", "--out", str(data_dir),
                               "--set", f"data.source={args.data}", f"data.limit_train={args.prompts * args.steps}",
                               "data.limit_dev=8", "data.limit_test=8"])
    cfg = C.load(pipeline(args, model, results))
    report: dict = {"shape": args.shape, "prompts": args.prompts, "rollouts": args.rollouts,
                    "response_length": args.response_length, "steps": args.steps, "runs": {}}
    for spec in C.sweep_runs(cfg):
        rc = C.compose(cfg, spec)
        wall = run_one(rc, out / f"{spec.method}.log")
        report["runs"][spec.method] = {"wall_s": wall, **summarise(step_rows(Path(rc.run_dir)))}
    rep, grpo = report["runs"]["repexp"], report["runs"]["grpo"]
    bonus = rep.get("timing_s/repexp_forward", 0.0) + rep.get("timing_s/repexp_bonus", 0.0)
    report["ratios"] = {
        "repexp_step_over_grpo_step": rep["timing_s/step"] / grpo["timing_s/step"],
        "bonus_share_of_repexp_step": bonus / rep["timing_s/step"],
        "repexp_forward_over_old_log_prob": rep.get("timing_s/repexp_forward", 0.0) / rep["timing_s/old_log_prob"],
    }
    report["targets"] = {"repexp_step_over_grpo_step": "<= 1.05", "repexp_forward_over_old_log_prob": "< 0.20"}
    text = json.dumps(report, indent=2)
    (out / "verl_step.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
