"""`repexp run RULE [--task T] [--run R] [--alias A] [--hub-model H]`: the workflow's one command. The
job is composed from the config snapshot and the rule's wildcards (repexp.jobs); the stage runs in this
process inside the rule's MLflow node run, whose params are the job's fields (`job.*`) (run_stage).
Train opens its own node (repexp.train.run_node): its trainer is a subprocess that logs into it."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from pathlib import Path

from repexp.tracking.names import ENV_CONFIG, SNAKEMAKE_JOBID_HELP

IN_RUN = ("aggregate", "figures")  # they log into the node's own run while they work
WILDCARDS = ("task", "run", "alias", "hub_model")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import RULES

    parser.add_argument("rule", choices=list(RULES), help="the rule whose job to run")
    parser.add_argument("--task", help="the task (preprocess and the per-run rules)")
    parser.add_argument("--run", help="the run's name (select, merge, eval, testtime)")
    parser.add_argument("--alias", help="the model rule's offline policy (tiny, smollm2)")
    parser.add_argument("--hub-model", help="download_model's local name of a hub model (<org>--<name>)")
    parser.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt (tagged on the node run)")
    parser.add_argument("--snakemake-jobid", help=SNAKEMAKE_JOBID_HELP)
    parser.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG, the job's snapshot)")
    parser.add_argument("--log", type=Path, help="the job's log (Snakemake's `log:`): this execution's output is also "
                                                 "kept in <log name>.execution-<N>.log beside it (repexp.joblog)")


def run(args: argparse.Namespace) -> int:
    from repexp import joblog

    if args.log is None:
        return _run(args)
    joblog.start(args.log)
    try:
        return _run(args)
    finally:
        joblog.stop()


def _run(args: argparse.Namespace) -> int:
    from repexp import config as C
    from repexp import jobs, stages
    from repexp.tracking.node import flatten, load_config, prepare_node
    from repexp.tracking.outputs import run_stage

    given = {name: getattr(args, name) for name in WILDCARDS if getattr(args, name) is not None}
    try:
        cfg = load_config(args.config)
        job = jobs.compose(cfg, args.rule, **given)
        if args.rule in IN_RUN:  # aggregate, figures: the config's runs are the expected ones (not hashed)
            job = dataclasses.replace(job, config=str(args.config or os.environ[ENV_CONFIG]))
        if args.rule != "train":
            command = ["repexp", "run", args.rule,
                       *(s for k, v in given.items() for s in (f"--{k.replace('_', '-')}", v))]
            node = prepare_node(args.rule, args.task, args.run, config=cfg,
                                params=flatten({"job": dataclasses.asdict(job)}), attempt=args.attempt,
                                tags={"repexp.command": shlex.join(command)},
                                wildcards={k: v for k, v in given.items() if k not in ("task", "run")},
                                snakemake_jobid=args.snakemake_jobid)
    except (C.ConfigError, ValueError, FileNotFoundError) as err:
        print(f"repexp run {args.rule}: {err}", file=sys.stderr)
        return 2
    if args.rule == "train":  # its own node (repexp.train.run_node): the trainer is a subprocess that logs into it
        from repexp.train import run_node

        return run_node(job, config=cfg, attempt=args.attempt, snakemake_jobid=args.snakemake_jobid)
    return run_stage(node, lambda: stages.run_job(args.rule, job), job.outputs(), f"repexp {args.rule}",
                     in_run=args.rule in IN_RUN)

