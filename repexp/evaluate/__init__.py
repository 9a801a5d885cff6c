"""`repexp eval`: sample a model on a split, verify every sample, compute pass@k.

    repexp eval --model DIR --data results/data/gsm8k/test.parquet --out results/eval/gsm8k/base \
        --set eval.n_samples=32 eval.engine=hf       # the settings: the pipeline config's eval section
    repexp eval --config CFG --task gsm8k --run base     # one run of a config, as its eval rule runs it
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
from repexp.evaluate.core import grader_curve
from repexp.stage import StageResult
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

__all__ = ["configure_parser", "node_outputs", "run", "run_job"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import config_options

    src = parser.add_argument_group("inputs and outputs (with --task and --run: the workflow's, unless given)")
    model = src.add_mutually_exclusive_group()
    model.add_argument("--model", help="Hugging Face model directory (merged checkpoint or base model) or hub id")
    model.add_argument("--model-pointer", type=Path,
                       help="JSON with 'model_path' and optional 'checkpoint_step' (written by select/merge)")
    src.add_argument("--data", type=Path, help="the split to evaluate: a prepared test.parquet or dev.parquet")
    src.add_argument("--out", type=Path, help="output directory (samples/ and eval.json)")
    src.add_argument("--task", help="task name recorded in eval.json (default: the data file's directory name); "
                                    "its task override of the eval section applies")
    src.add_argument("--run", help="a run of --config: evaluate it as the workflow's eval rule does (needs --task)")
    src.add_argument("--split", help="split name recorded in eval.json (default: the data file's stem)")
    src.add_argument("--checkpoint-step", type=int, help="override the checkpoint step (default: pointer or path)")
    src.add_argument("--limit", type=int, help="evaluate only the first N problems of the file")
    src.add_argument("--seed", type=int, help="fixes the shard plan and every sample (default: the run's, else 0)")
    config_options(parser, "eval.n_samples=32 eval.engine=hf grader=paper")
    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--rescore", action="store_true",
                    help="re-verify the stored samples of --out and rewrite eval.json (no generation)")
    ev.add_argument("--grader", choices=GRADERS, default=None,
                    help=f"with --rescore: re-grade under this grader (default: the store's); sampling grades with "
                         f"the config's `grader` ({DEFAULT_GRADER} unless set); eval.json also reports pass@k under "
                         "the other grader")
    ev.add_argument("--overwrite", action="store_true", default=None,
                    help="discard stored samples made with other settings (matching ones are always resumed)")
    ev.add_argument("--max-shards", type=int, help="debug: stop once this many shards are complete")
    ev.add_argument("--no-progress", action="store_true", default=None, help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from repexp import jobs

    def build(cfg, **given):
        return jobs.EvalJob(config=jobs.eval_section(cfg, args.task), grader=cfg.grader,
                            **{"data": None, "out": None, **given})  # given: the flags, --task among them

    flags = {name: getattr(args, name) for name in ("model", "model_pointer", "data", "out", "task", "split",
                                                   "checkpoint_step", "limit", "seed", "overwrite", "no_progress",
                                                   "max_shards")}
    try:
        job = jobs.hand_job("eval", args, build, **flags)
    except ValueError as err:  # a ConfigError names the key
        print(f"eval: {err}", file=sys.stderr)
        return 2
    if args.model or args.model_pointer:  # in place of the run's model
        job = dataclasses.replace(job, model=args.model, model_pointer=args.model_pointer and str(args.model_pointer))
    if args.rescore or args.grader:  # rescore's default: the store's grader
        job = dataclasses.replace(job, grader=args.grader)
    return run_job(job, rescore=args.rescore).code


def run_job(job, rescore: bool = False):
    """Sample and grade one evaluation (`repexp.jobs.EvalJob`: the workflow's and `repexp eval`'s), or with
    `rescore` re-grade its stored samples."""
    from repexp.evaluate import runner

    ev = job.config
    try:
        if job.out is None:
            raise ValueError("--out is required (or --task and --run of a config)")
        result = runner.rescore(job.out, ks=ev.ks and tuple(ev.ks), maj_draws=ev.maj_draws,
                                verifier_workers=ev.verifier_workers, grader=job.grader) if rescore \
            else runner.evaluate(runner.EvalRun.of(job))
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
