"""Seconds per TRL training step: the RepExp bonus's share of it, or the rollout engines compared.

    .venv/bin/python benchmarks/trl_step.py [--models tiny smollm2] [--steps 4] [--threads 2]
    .venv/bin/python benchmarks/trl_step.py --engines hf vllm [--parallel 1 auto] [--steps 6] [--out DIR]

**Rollout engines** (`--engines`, issue 43; the GPU session's `trl_engines` stage): the pilot's training
(configs/pilot.yaml: its task, SmolLM2-135M-Instruct, 32 prompts × 8 rollouts of ≤ 16 tokens, bfloat16, RepExp
β = 0.01, k = 32) with `trl.rollout_engine` hf and vllm on the same GPU in the same run, for (a) one training
alone and (b) N side by side (`--parallel 1 auto`: auto = as many as the pilot runs at once on this GPU, 100 // its
share, at most 9: 8 on an H100, 9 on an H200): N real trainer processes (`python -m repexp.trl.train`) started
together on the one GPU, each capped at the share `gpu_share: auto` gives a pilot training on this GPU
(`trl.gpu_memory_fraction`, 12 % on an H100), as the pilot runs them. Per training, the median
`timing_s/step` over steps 2… (step 1 warms up; validation excluded), then the median over the N trainings;
the ratio hf / vllm per N, and the steps per second the GPU delivers to the whole group (what sizes the pilot's
parts). `--mps on|both` runs the groups under CUDA MPS too (one daemon for the group: kernels of the N processes
share the GPU instead of time-slicing). Also each training's wall time (start-up included), the most GPU memory
one training held (nvidia-smi, every 2 s), and the GPU; `--share P` caps each training at P % instead of the
pilot's auto share (to see whether more fit side by side). Writes OUT/trl_engines.json and prints a table; a
failed training's log tail is printed and kept in OUT/logs/.

The rest of this docstring is the default mode (no `--engines`):

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
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
             "--out", str(out), "--set", f"data.source={REPO.parent / 'shared' / 'data'}",
             "data.limit_train=256", "data.limit_dev=2"],
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


# --------------------------------------------------------------------------- rollout engines (--engines)

PILOT = REPO / "configs" / "pilot.yaml"


def engine_jobs(model: Path, data: Path, root: Path, *, engine: str, count: int, steps: int, device: str,
                fraction: float | None) -> list:
    """`count` pilot trainings (seeds 1…count) with `trl.rollout_engine = engine`, `steps` steps each, no
    validation before training and one at the end on a few dev prompts, one checkpoint."""
    import yaml

    from repexp import config as C

    raw = yaml.safe_load(PILOT.read_text())
    task = raw["sweep"]["tasks"][0]
    raw.update(results_dir=str(root), model=str(model))
    raw["sweep"] = {**raw["sweep"], "methods": {"repexp": {"sparse_dim": [32], "beta": [0.01]}},
                    "seeds": list(range(1, count + 1))}
    raw["train"] = {**raw["train"], "total_steps": steps, "test_freq": steps, "save_freq": steps,
                    "val_before_train": False, "max_checkpoints_to_keep": 1}
    raw["trl"] = {**raw["trl"], "rollout_engine": engine, "device": device, "gpu_memory_fraction": fraction}
    if device == "cpu":
        raw["trl"]["dtype"] = "float32"
        raw["resources"] = {**raw["resources"], "train": {**raw["resources"]["train"], "gpu": 0}}
    cfg = C.load(raw)
    jobs = []
    for spec in C.sweep_runs(cfg):
        if spec.trains:
            rc = C.compose(cfg, spec)
            jobs.append(dataclasses.replace(rc, data_dir=str(data), run_dir=str(root / task / spec.name)))
    return jobs


def run_side_by_side(jobs: list, logs: Path, timeout_s: float) -> list[dict]:
    """Start every job's trainer process at once; wait for all; per job: exit code, wall time, step medians."""
    from repexp import config as C
    from repexp.trl.runlog import MetricsLog

    procs = []
    for rc in jobs:
        Path(rc.run_dir).mkdir(parents=True, exist_ok=True)
        job_file = Path(rc.run_dir) / "job.yaml"
        job_file.write_text(C.dump_yaml(rc))
        log = logs / f"{Path(rc.run_dir).parent.parent.name}-{Path(rc.run_dir).name}.log"
        handle = log.open("w")
        procs.append((rc, log, handle, time.perf_counter(), subprocess.Popen(
            [sys.executable, "-m", "repexp.trl.train", "--config", str(job_file), "--resume", "never"],
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)))
    results = []
    deadline = time.perf_counter() + timeout_s
    for rc, log, handle, started, proc in procs:
        try:
            code = proc.wait(timeout=max(deadline - time.perf_counter(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        wall = time.perf_counter() - started
        handle.close()
        records = [r for r in MetricsLog(rc.run_dir).records() if r["step"] >= 2 and "timing_s/step" in r]
        steps = [r["timing_s/step"] for r in records]
        results.append({"run": Path(rc.run_dir).name, "pid": proc.pid, "exit": code, "wall_s": round(wall, 1),
                        "steps_measured": len(steps), "median_step_s": statistics.median(steps) if steps else None,
                        "log": str(log)})
        if code != 0:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print(f"--- {log} (exit {code}), last lines:\n" + "\n".join(tail), file=sys.stderr)
    return results


@contextmanager
def gpu_memory_peaks():
    """Yields a dict {pid: peak MiB} that a background thread fills from `nvidia-smi --query-compute-apps` every
    2 s while the group runs (what each training process holds on the GPU at most; empty without nvidia-smi,
    and under MPS the processes may be listed as the MPS server's)."""
    import threading

    peaks: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(2.0):
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.stdout.splitlines():
                pid, _, mib = line.partition(",")
                if pid.strip().isdigit() and mib.strip().isdigit():
                    peaks[int(pid)] = max(peaks.get(int(pid), 0), int(mib))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join(timeout=30)


@contextmanager
def mps_daemon(workdir: Path, on: bool):
    """CUDA MPS for the group's trainings when `on`: without it the GPU time-slices between processes, so
    the small, launch-bound kernels of N trainings side by side run one context at a time; under MPS they
    share the GPU's queues. The daemon's pipe/log directories are private to this run (the children inherit
    them through the environment) and the daemon is told to quit afterwards."""
    if not on:
        yield
        return
    pipes, logs = workdir / "mps-pipe", workdir / "mps-log"
    pipes.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    os.environ.update(env)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], check=True)
    try:
        yield
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", check=False)
        for key in env:
            os.environ.pop(key, None)


def gpu_description() -> str:
    from repexp import gpus as G

    return G.describe(G.read_gpus())


def engines_main(args: argparse.Namespace) -> int:
    from repexp import gpus as G

    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workdir = Path(tempfile.mkdtemp(prefix="trl-engines-"))
    if args.model == "tiny":
        from repexp.models import build_tiny_qwen2

        model = build_tiny_qwen2(workdir / "tiny", seed=0)
    else:
        model = Path(args.model) if args.model != "smollm2" else CACHE / "smollm2"
        if not (model / "config.json").exists():
            subprocess.run([sys.executable, "-m", "repexp", "model", "smollm2", "--out", str(model)], check=True,
                           cwd=REPO)
    import yaml

    task = yaml.safe_load(PILOT.read_text())["sweep"]["tasks"][0]
    data = CACHE / "data" / f"{task}-engines"
    if not (data / "train.parquet").exists():
        subprocess.run([sys.executable, "-m", "repexp", "data", "prepare", task, "--out", str(data),
                        "--config", str(PILOT), "--set", "data.limit_dev=8"], check=True, cwd=REPO)
    gpus = G.read_gpus() if args.device == "cuda" else []
    need = yaml.safe_load(PILOT.read_text())["resources"]["train"].get("gpu_memory_gib")
    share = args.share or (G.auto_share(need, gpus) if gpus else 100)
    fraction = G.memory_cap(share)  # what `gpu_share: auto` gives a pilot training on this GPU
    args.parallel = [min(9 if not args.share else 100, 100 // share) if value == "auto" else int(value)
                     for value in args.parallel]
    report = {"gpu": gpu_description() if gpus else "none (CPU)", "share_percent": share,
              "gpu_memory_fraction": fraction, "steps": args.steps, "model": str(model), "task": task, "runs": {}}
    for mps in [False, True] if args.mps == "both" else [args.mps == "on"]:
        for count in args.parallel:
            for engine in args.engines:
                key = f"{engine}-x{count}" + ("-mps" if mps else "")
                root = workdir / key
                jobs = engine_jobs(model, data, root, engine=engine, count=count, steps=args.steps,
                                   device=args.device, fraction=fraction)
                started = time.perf_counter()
                with mps_daemon(workdir, mps), gpu_memory_peaks() as peaks:
                    runs = run_side_by_side(jobs, out / "logs", args.timeout)
                for run in runs:
                    run["peak_gpu_mib"] = peaks.get(run["pid"])
                medians = [r["median_step_s"] for r in runs if r["median_step_s"] is not None]
                median = statistics.median(medians) if medians else None
                report["runs"][key] = {
                    "engine": engine, "parallel": count, "mps": mps, "wall_s": round(time.perf_counter() - started, 1),
                    "all_exit_0": all(r["exit"] == 0 for r in runs), "median_step_s": median,
                    # what the GPU delivers to the whole group: the pilot's parts are sized from it
                    "steps_per_s_all": round(sum(1 / m for m in medians), 2) if medians else None,
                    # the most one training held on the GPU (sizes resources.train.gpu_memory_gib for this engine)
                    "peak_gpu_mib_max": max((r["peak_gpu_mib"] or 0 for r in runs), default=0) or None,
                    "trainings": runs}
                print(f"{key}: median step {median} s, wall {report['runs'][key]['wall_s']} s, "
                      f"{report['runs'][key]['steps_per_s_all']} steps/s over the group", file=sys.stderr, flush=True)
                shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for count in args.parallel:
        groups = [report["runs"].get(f"{e}-x{count}", {}) for e in ("hf", "vllm")]
        hf, vllm = (g.get("median_step_s") for g in groups)
        # a group with a failed training ran fewer side by side than the other: no ratio
        complete = all(g.get("all_exit_0") for g in groups)
        ratios[str(count)] = round(hf / vllm, 2) if hf and vllm and complete else None
    report["hf_over_vllm"] = ratios
    for count in args.parallel:  # the same group with and without MPS, per engine
        for engine in args.engines:
            off, on = (report["runs"].get(f"{engine}-x{count}{tail}", {}) for tail in ("", "-mps"))
            if off.get("all_exit_0") and on.get("all_exit_0"):
                report.setdefault("mps_off_over_on", {})[f"{engine}-x{count}"] = round(
                    off["median_step_s"] / on["median_step_s"], 2)
    (out / "trl_engines.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"\nGPU: {report['gpu']}; each training capped at {fraction} of it (gpu_share {share})")
    print("| every run | s/step (median) | steps/s over the group | peak GPU MiB of one training | wall s "
          "| all exit 0 |")
    print("|---|---|---|---|---|---|")
    fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    for key, run in report["runs"].items():
        print(f"| {key} | {fmt(run['median_step_s'])} | {fmt(run['steps_per_s_all'])} | "
              f"{run['peak_gpu_mib_max'] or '–'} | {run['wall_s']} | {run['all_exit_0']} |")
    print(f"hf / vllm per group size: {ratios}; without / with MPS: {report.get('mps_off_over_on', {})}")
    failed = [key for key, run in report["runs"].items() if not run["all_exit_0"]]
    if failed:
        print(f"FAILED: {', '.join(failed)} (logs in {out / 'logs'})", file=sys.stderr)
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (>= 2; default 4, "
                        "with --engines 6)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    engines = parser.add_argument_group("rollout engines (issue 43)")
    engines.add_argument("--engines", nargs="+", choices=["hf", "vllm"], help="compare these trl.rollout_engine "
                         "values on the pilot's training instead")
    engines.add_argument("--parallel", nargs="+", default=["1", "auto"],
                         help="trainings side by side on the one GPU, one measurement per value; auto: as many as "
                         "the pilot runs at once on this GPU (100 // its share: 8 on an H100), at most 9")
    engines.add_argument("--model", default="smollm2", help="smollm2 (converted into .cache/smollm2 if missing), "
                         "tiny, or a Hugging Face directory")
    engines.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a check of this harness")
    engines.add_argument("--out", default="results/trl_engines", help="where trl_engines.json and logs go")
    engines.add_argument("--mps", default="off", choices=["off", "on", "both"],
                         help="run each group under CUDA MPS (nvidia-cuda-mps-control), without it, or both")
    engines.add_argument("--timeout", type=float, default=240, help="seconds one group of trainings may take")
    engines.add_argument("--share", type=int, help="GPU share in percent of each training (its memory cap; "
                         "--parallel auto: 100 // share): default the pilot's `gpu_share: auto` on this GPU")
    args = parser.parse_args()
    if args.engines:
        args.steps = args.steps or 6
        if args.steps < 2:
            raise SystemExit("--steps must be >= 2 (step 1 is excluded as warm-up)")
        return engines_main(args)
    args.steps = args.steps or 4
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
