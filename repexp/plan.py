"""`repexp plan --configfile C [--gpus N]`: what a sweep will cost, before anything is submitted.

    measured rates (one H200, docs/performance.md)      the config
    ───────────────────────────────────────────────      ──────────────────────────────────────
    TRAIN_STEP  58.65 GPU-s: 1.54 B params, 256 seq,      params (model), sequences per step,
                prompt+response cap 512+512                prompt+response caps, steps, validations
    GENERATE    12,978 tokens/s at 1.54 B (vLLM rollout)   eval samples × max_new_tokens, dev samples
    FORWARD     38,051 tokens/s at 7.07 B (bf16 forward)   testtime samples × (prompt + response caps)
                              │                                         │
                              └──── cost ∝ parameters × tokens ─────────┘
                                            │
    per rule: jobs, GPUs per job, hours per job, GPU-hours; per run: allocations (train chunks);
    per method (repexp.methods, and the base model): runs and GPU-hours of their train, eval and test-time jobs;
    totals: GPU-hours, peak disk, wall time on N GPUs (a lower bound: no queue waits)

Every cost scales linearly with parameters × tokens from one measured point, at the configured
length caps, so the estimates lean high: whether a job fits its allocation and what a sweep costs to
within a small factor, not to the hour. Re-measure with benchmarks/verl_step.py.

`check_runtimes` (part of `repexp.config.check`, so of every workflow start) refuses a GPU rule
whose `resources.<rule>.runtime` is below its own smallest unit of work: one training step plus a
validation and start-up plus the walltime margin (a training run spans any number of allocations,
repexp.walltime); a whole eval or test-time job (neither is split across allocations on purpose).

Pure: the config dataclasses and the arithmetic; no framework imports.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repexp.config.model import ConfigError
from repexp.config.runs import rule_resources, sweep_runs, task_section

# --------------------------------------------------------------------------- measured rates (one H200)
# verl 0.9.1 RepExp step 2 on Qwen2.5-1.5B shapes (random weights), 32 prompts × 8 rollouts, prompt cap
# 512, responses of 512 tokens, gradient checkpointing, one GPU (docs/performance.md, "verl on one GPU").
TRAIN_STEP_GPU_S = 58.65
TRAIN_STEP_PARAMS = 1.54e9
TRAIN_STEP_SEQUENCES = 256
TRAIN_STEP_TOKENS = 512 + 512  # prompt cap + response cap per sequence
# The same step's vLLM rollout: 256 sequences × 512 tokens in 10.10 s.
GENERATE_TOKENS_PER_S = 256 * 512 / 10.10
GENERATE_PARAMS = 1.54e9
# The frozen bf16 forward with Qwen2.5-7B's shapes, weights resident, 16 × 2048 tokens in 0.861 s
# (docs/performance.md, "G0"): what test-time RepExp's feature pass does per token.
FORWARD_TOKENS_PER_S = 38_051
FORWARD_PARAMS = 7.07e9
# Start-up per allocation: Ray, FSDP and vLLM for a verl training (~4 min measured with SmolLM2,
# docs/gpu-validation.md), vLLM's engine for an eval (~50 s), the feature model for test-time.
TRAIN_STARTUP_S = 300.0
EVAL_STARTUP_S = 60.0
TESTTIME_STARTUP_S = 60.0
# Disk per parameter: verl keeps fp32 weights and AdamW's two fp32 moments in a full checkpoint,
# fp32 weights in the slimmed best-dev one, bf16 in the merged model (docs/configuration.md).
FULL_CHECKPOINT_BYTES = 12
SLIM_CHECKPOINT_BYTES = 4
MERGED_BYTES = 2
SAMPLE_BYTES_PER_TOKEN = 4  # an eval's stored samples: text in compressed parquet (an upper bound)

# Parameter counts of models the configs name (a hub id not listed here: the "<N>B" in its name).
MODEL_PARAMS = {
    "Qwen/Qwen2.5-7B-Instruct": 7.62e9, "Qwen/Qwen2.5-7B": 7.62e9, "Qwen/Qwen2.5-1.5B-Instruct": 1.54e9,
    "Qwen/Qwen2.5-0.5B-Instruct": 0.49e9, "smollm2": 134.5e6, "tiny": 1.0e6,
}


def model_params(model: str) -> Optional[float]:
    """The parameter count of a config's `model`, when known (table, local config.json, or name)."""
    if model in MODEL_PARAMS:
        return MODEL_PARAMS[model]
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        c = json.loads(config.read_text())
        if {"hidden_size", "num_hidden_layers", "vocab_size"} <= set(c):
            h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
            mlp = c.get("intermediate_size", 4 * h)
            return float(layers * (4 * h * h + 3 * h * mlp) + vocab * h)
    found = re.search(r"(\d+(?:\.\d+)?)([BM])\b", model.split("/")[-1], re.I)
    return float(found.group(1)) * (1e9 if found.group(2).upper() == "B" else 1e6) if found else None


# --------------------------------------------------------------------------- split sizes


def split_sizes(cfg, task: str) -> dict[str, int]:
    """Problems per split after the config's limits (docs/data.md, "Splits")."""
    from repexp import arith, splits

    if task in arith.TASKS:
        made = arith.task_split(task, cfg.data.split_seed)
        sizes = {name: len(made[name]) for name in made}
    else:
        sizes = {
            "math": {"train": 7497, "dev": 500, "test": 4500},
            "gsm8k": {"train": 7473, "dev": 512, "test": 807},
            "aime24": {"train": 7498, "dev": 30, "test": 30},
            "dapo-with-aime24": {"train": splits.DAPO_TRAIN_SIZE, "dev": 30, "test": 30},
        }[task]
    limits = {"train": cfg.data.limit_train, "dev": cfg.data.limit_dev, "test": cfg.data.limit_test}
    return {name: min(size, limits[name]) if limits[name] else size for name, size in sizes.items()}


# --------------------------------------------------------------------------- per-job estimates


@dataclass
class JobCost:
    rule: str
    task: str
    run: str
    gpus: int  # GPUs of one allocation
    hours: float  # wall time of the whole job (all allocations)
    unit_hours: float  # the smallest unit that must fit one allocation (see the module docstring)
    allocations: int = 1
    disk_bytes: float = 0.0
    method: str = ""  # the run's method (a key of repexp.methods.METHODS, or "base")


def _gpus(res) -> int:
    return max(res.gpu, 1) * res.nodes


def train_cost(cfg, spec, params: float, sizes: dict[str, int]) -> JobCost:
    train = task_section(cfg, spec.task, "train")
    res = rule_resources(cfg, "train")
    gpus = _gpus(res)
    steps = train.total_steps or train.total_epochs * max(1, sizes["train"] // train.train_batch_size)
    tokens = train.max_prompt_length + train.max_response_length
    step_gpu_s = (TRAIN_STEP_GPU_S * (params / TRAIN_STEP_PARAMS)
                  * (train.train_batch_size * train.n_rollouts / TRAIN_STEP_SEQUENCES) * (tokens / TRAIN_STEP_TOKENS))
    validations = steps // train.test_freq + (1 if train.val_before_train else 0)
    val_gpu_s = sizes["dev"] * train.val_n * train.max_response_length * params / (GENERATE_TOKENS_PER_S
                                                                                   * GENERATE_PARAMS)
    work_s = (steps * step_gpu_s + validations * val_gpu_s) / gpus
    usable_s = max(60.0 * (res.runtime - train.walltime_margin_minutes) - TRAIN_STARTUP_S, 1.0)
    allocations = max(1, math.ceil(work_s / usable_s))
    hours = (work_s + allocations * TRAIN_STARTUP_S) / 3600
    unit = (TRAIN_STARTUP_S + (step_gpu_s + val_gpu_s) / gpus) / 3600 + train.walltime_margin_minutes / 60
    kept = train.max_checkpoints_to_keep
    full = params * FULL_CHECKPOINT_BYTES * (kept if kept else steps // train.save_freq)
    disk = full + params * (SLIM_CHECKPOINT_BYTES if kept else 0) + params * MERGED_BYTES
    if kept and train.prune_when_done:  # after DONE only the best-dev weights stay (verl's merged beside them)
        disk = params * (SLIM_CHECKPOINT_BYTES + (MERGED_BYTES if spec.backend == "verl" else 0))
    return JobCost("train", spec.task, spec.name, gpus, hours, unit, allocations, disk, spec.method)


def eval_cost(cfg, spec, params: float, sizes: dict[str, int]) -> JobCost:
    ev = task_section(cfg, spec.task, "eval")
    new_tokens = ev.max_new_tokens or task_section(cfg, spec.task, "train").max_response_length
    gpus = _gpus(rule_resources(cfg, "eval"))
    engines = min(ev.tensor_parallel_size * ev.data_parallel_size, gpus)  # the GPUs that sample (vLLM TP × DP)
    samples = sizes["test"] * ev.n_samples
    sampling_s = samples * new_tokens * params / (GENERATE_TOKENS_PER_S * GENERATE_PARAMS) / engines
    hours = (EVAL_STARTUP_S + sampling_s) / 3600
    return JobCost("eval", spec.task, spec.name, gpus, hours, hours,
                   disk_bytes=samples * new_tokens * SAMPLE_BYTES_PER_TOKEN, method=spec.method)


def testtime_cost(cfg, spec, params: float, sizes: dict[str, int]) -> JobCost:
    ev, train = task_section(cfg, spec.task, "eval"), task_section(cfg, spec.task, "train")
    tokens = train.max_prompt_length + (ev.max_new_tokens or train.max_response_length)
    gpus = _gpus(rule_resources(cfg, "testtime"))
    samples = sizes["test"] * ev.n_samples  # one feature model on one GPU, whatever the job holds
    hours = (TESTTIME_STARTUP_S + samples * tokens * params / (FORWARD_TOKENS_PER_S * FORWARD_PARAMS)) / 3600
    return JobCost("testtime", spec.task, spec.name, gpus, hours, hours, method=spec.method)


def job_costs(cfg, params: float) -> list[JobCost]:
    """Every GPU job of the sweep with its estimate (CPU rules cost minutes and no GPUs)."""
    sizes = {task: split_sizes(cfg, task) for task in cfg.sweep.tasks}
    jobs = []
    for spec in sweep_runs(cfg):
        if spec.trains:
            jobs.append(train_cost(cfg, spec, params, sizes[spec.task]))
        jobs.append(eval_cost(cfg, spec, params, sizes[spec.task]))
        if cfg.testtime.enabled:
            jobs.append(testtime_cost(cfg, spec, params, sizes[spec.task]))
    return jobs


def job_counts(cfg) -> dict[str, int]:
    """Jobs per rule of `all` (the same counts as Snakemake's dry run; tests/test_workflow.py)."""
    runs = sweep_runs(cfg)
    trained = [s for s in runs if s.trains]
    return {"preprocess": len(cfg.sweep.tasks), "train": len(trained), "select": len(trained),
            "merge": sum(s.backend == "verl" for s in trained), "eval": len(runs),
            "testtime": len(runs) if cfg.testtime.enabled else 0, "aggregate": 1, "figures": 1}


HOW_ELSE = {"eval": " or sample on more GPUs (eval.data_parallel_size with resources.eval.gpu)",
            "train": " or give the job more GPUs"}


def check_runtimes(cfg) -> None:
    """Refuse a GPU rule whose runtime is below its smallest unit of work (the module docstring);
    nothing is checked for CPU-only rules or a model of unknown size."""
    params = model_params(cfg.model)
    if params is None:
        return
    for job in job_costs(cfg, params):
        res = rule_resources(cfg, job.rule)
        if res.gpu > 0 and job.unit_hours * 60 > res.runtime:
            what = ("one step, a validation and start-up, plus train.walltime_margin_minutes" if job.rule == "train"
                    else f"the whole {job.rule} job")
            raise ConfigError(
                f"resources.{job.rule}.runtime: {res.runtime} min is below the estimate for {what} of "
                f"{job.task}/{job.run}: {job.unit_hours * 60:.0f} min (`repexp plan`; docs/performance.md, "
                f"'Cost plan'); raise it{HOW_ELSE.get(job.rule, '')}")


# --------------------------------------------------------------------------- the report


def method_gpu_hours(jobs: list[JobCost]) -> dict[str, dict[str, float]]:
    """{method: {rule: GPU-hours}} of the GPU jobs, the methods in the method table's order (the base model
    last); only methods with jobs."""
    from repexp.methods import ARMS

    out: dict[str, dict[str, float]] = {}
    for method in ARMS:
        mine = [j for j in jobs if j.method == method]
        if mine:
            out[method] = {rule: sum(j.hours * j.gpus for j in mine if j.rule == rule)
                           for rule in dict.fromkeys(j.rule for j in mine)}
    return out


def method_table(jobs: list[JobCost], runs) -> list[str]:
    """The report's per-method lines: runs and GPU-hours per GPU rule and in all, from the same job costs."""
    from repexp.methods import label

    per_method = method_gpu_hours(jobs)
    rules = list(dict.fromkeys(j.rule for j in jobs))
    lines = ["| method | runs | " + " | ".join(f"{rule} GPU-hours" for rule in rules) + " | GPU-hours |",
             "|---|---|" + "---|" * len(rules) + "---|"]
    for method, by_rule in per_method.items():
        count = sum(1 for s in runs if s.method == method)
        lines.append(f"| {label(method)} | {count} | " + " | ".join(f"{by_rule.get(rule, 0.0):,.0f}" for rule in rules)
                     + f" | {sum(by_rule.values()):,.0f} |")
    return lines


def report(cfg, *, gpus: int, params: Optional[float] = None) -> str:
    params = params or model_params(cfg.model)
    if params is None:
        raise ConfigError(f"model: {cfg.model!r} has an unknown parameter count; pass --params")
    jobs, runs = job_costs(cfg, params), sweep_runs(cfg)
    lines = [f"plan for {cfg.name}: model {cfg.model} ({params / 1e9:.2f} B parameters), "
             f"{len(runs)} runs over {', '.join(cfg.sweep.tasks)}",
             "", "| rule | jobs | GPUs per job | hours per job | allocations per job | runtime (min) | GPU-hours |",
             "|---|---|---|---|---|---|---|"]
    total = sum(j.hours * j.gpus for j in jobs)
    for rule, count in job_counts(cfg).items():
        mine = [j for j in jobs if j.rule == rule]
        res = rule_resources(cfg, rule)
        if not mine:
            lines.append(f"| {rule} | {count} | 0 | – | 1 | {res.runtime} | 0 (CPU) |")
            continue
        gpu_h = sum(j.hours * j.gpus for j in mine)
        span = lambda xs, f: f(min(xs)) if min(xs) == max(xs) else f"{f(min(xs))}–{f(max(xs))}"  # noqa: E731
        lines.append(f"| {rule} | {count} | {mine[0].gpus} | {span([j.hours for j in mine], lambda h: f'{h:.1f}')} | "
                     f"{span([j.allocations for j in mine], str)} | {res.runtime} | {gpu_h:,.0f} |")
    lines += ["", *method_table(jobs, runs)]
    disk = sum(j.disk_bytes for j in jobs)
    # a run's chain: train, then eval, then test-time
    chain = max((sum(j.hours for j in jobs if (j.task, j.run) == (s.task, s.name)) for s in runs), default=0.0)
    wide = max((j.gpus for j in jobs), default=1)
    wall = max(total / gpus, chain) if gpus >= wide else 0.0
    lines += ["", f"total: {total:,.0f} GPU-hours; peak disk ≈ {disk / 1e12:.2f} TB (checkpoints kept by "
              f"train.max_checkpoints_to_keep, merged models, eval samples); wall time on {gpus} GPU"
              + ("s" if gpus > 1 else "") + " ≥ "
              + (f"{wall:,.0f} h ({wall / 24:.1f} days)" if gpus >= wide else f"∞ (a job needs {wide} GPUs)")
              + f" (longest train → eval → testtime chain {chain:,.0f} h; no queue waits)",
              "Estimates: measured H200 rates scaled by parameters × token caps (repexp/plan.py); they lean high."]
    return "\n".join(lines)
