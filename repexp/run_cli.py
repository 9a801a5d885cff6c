"""`repexp run RULE --task T [--run R]`: the workflow's one command for preprocess, train, select, merge,
eval and testtime (repexp.jobs composes the job from the config snapshot; nothing else is passed).
Train opens its own node (repexp.train.run_node): its trainer is a subprocess that logs into it.

The stage runs in a child process (`repexp run ... --stage-only`) beside the rule's MLflow node run,
exactly as `repexp mlflow node` runs any command (repexp.tracking.cli); the node's params are the
job's fields (`job.*`) and it logs the job's declared outputs.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from repexp.tracking.names import SNAKEMAKE_JOBID_HELP


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import RULES

    parser.add_argument("rule", choices=list(RULES), help="the rule whose job to run")
    parser.add_argument("--task", required=True)
    parser.add_argument("--run", help="the run's name (every rule but preprocess)")
    parser.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt (tagged on the node run)")
    parser.add_argument("--snakemake-jobid", help=SNAKEMAKE_JOBID_HELP)
    parser.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG, the job's snapshot)")
    parser.add_argument("--stage-only", action="store_true",
                        help="run the stage in this process without a node run (what the node's child runs)")


def run(args: argparse.Namespace) -> int:
    from repexp import config as C
    from repexp import jobs
    from repexp.tracking.node import load_config

    try:
        cfg = load_config(args.config)
        job = jobs.compose(cfg, args.rule, args.task, args.run)
    except (C.ConfigError, ValueError, FileNotFoundError) as err:
        print(f"repexp run {args.rule}: {err}", file=sys.stderr)
        return 2
    if args.rule == "train":  # its own node, with or without --stage-only: the trainer is a subprocess
        from repexp.train import run_node

        return run_node(job, config=cfg, attempt=args.attempt, snakemake_jobid=args.snakemake_jobid)
    if args.stage_only:
        return jobs.run_job(args.rule, job)
    from repexp.tracking import cli as node_cli
    from repexp.tracking.node import flatten

    identity = [args.rule, "--task", args.task, *(["--run", args.run] if args.run else [])]
    child = ["run", *identity, "--stage-only", *(["--config", str(args.config)] if args.config else [])]
    node_args = dict(config=args.config, params=flatten(jobs.params(job)), attempt=args.attempt,
                     tags={"repexp.command": shlex.join(["repexp", "run", *identity])},
                     snakemake_jobid=args.snakemake_jobid)
    where = argparse.Namespace(rule=args.rule, task=args.task, run=args.run, output=job.outputs())
    try:
        return node_cli.run_beside_node(child, where, node_args)
    except (C.ConfigError, ValueError, FileNotFoundError) as err:  # as `repexp mlflow node` reports them
        print(f"repexp run {args.rule}: {err}", file=sys.stderr)
        return 2


def run_merge(job) -> int:
    """The merge stage (repexp.jobs.MergeJob). repexp/verl/ keeps its own `repexp merge` CLI, which takes
    these two paths; here, above repexp.jobs, so that verl.merge -> checkpoints -> jobs is no circle."""
    from repexp.verl import merge

    return merge.run(argparse.Namespace(checkpoint_dir=None, pointer=Path(job.pointer), out=Path(job.out)))
