"""`repexp plan`: the cost plan of a config file (repexp/plan.py) on the command line.

Apart from the plan itself because it loads the config with every check (`repexp.config.rules.load`),
and those checks run the plan's runtime rule: the plan stays below the config rules, this command above.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repexp.plan import report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configfile", "--config", dest="config", type=Path, nargs="+", required=True,
                        help="pipeline config, e.g. configs/paper.yaml; several are merged in order, as "
                             "`snakemake --configfile A B` merges them")
    parser.add_argument("--gpus", type=int, default=64, help="GPUs the sweep may use at once (default %(default)s)")
    parser.add_argument("--params", type=float, help="the model's parameter count, when the plan cannot tell")
    parser.add_argument("--set", dest="overrides", default="", help="the workflow's set= overrides (key=value ...)")


def run(args: argparse.Namespace) -> int:
    from repexp.config.loading import split_overrides
    from repexp.config.model import ConfigError
    from repexp.config.rules import load

    try:
        cfg = load(args.config, overrides=split_overrides(args.overrides) if args.overrides else ())
        print(report(cfg, gpus=args.gpus, params=args.params))
    except ConfigError as err:
        print(f"plan: {err}", file=sys.stderr)
        return 2
    return 0
