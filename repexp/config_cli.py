"""`repexp config`: validate a pipeline config, list its runs, write one job's resolved config, show the GPU shares."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repexp import config as C
from repexp.io import write_text_atomic

CONFIGS_HELP = "config file(s); several are merged in order, as `snakemake --configfile A B` merges them"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    v = sub.add_parser("validate", help="check a config file (all rules, local paths); exit 1 with the offending key")
    r = sub.add_parser("runs", help="list run paths (<task>/<run>) of the sweep (with sweep.part set: that part's)")
    j = sub.add_parser("job", help="write the resolved config of one run (job.yaml)")
    for p in (v, r, j):
        p.add_argument("config", type=Path, nargs="+", help=CONFIGS_HELP)
        p.add_argument("--set", nargs="+", default=[], metavar="KEY.PATH=VALUE",
                       help="dotlist overrides, as `--config set=...` in Snakemake (e.g. sweep.betas=[0.01,0.02])")
    v.add_argument("--root", type=Path, default=Path("."),
                   help="what relative paths in the config resolve against (the workflow: the repository root)")
    j.add_argument("--task", required=True)
    j.add_argument("--run", required=True, help="run name, e.g. trl_repexp_k32_b0.01_s42")
    j.add_argument("--out", type=Path, help="output file (default: stdout)")
    g = sub.add_parser("gpus", help="what `gpu_share: auto` chooses on this host's GPUs: shares, memory caps, "
                                    "placement (the workflow prints the same lines at its start)")
    g.add_argument("config", type=Path, nargs="+", help=CONFIGS_HELP)
    g.add_argument("--set", nargs="+", default=[], metavar="KEY.PATH=VALUE", help="dotlist overrides")
    s = sub.add_parser("schema", help="print the JSON schema generated from the dataclasses")
    s.add_argument("--out", type=Path)


def _write(text: str, out: Path | None) -> None:
    if out:
        write_text_atomic(out, text)
    else:
        sys.stdout.write(text)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "schema":
            import yaml

            _write(yaml.safe_dump(C.json_schema(), sort_keys=False, allow_unicode=True), args.out)
            return 0
        if args.action == "gpus":
            from repexp import gpus as G
            from repexp.pipeline import setup

            gpus = G.read_gpus()
            raw = C.parse(C.read_configs(args.config) or {}, overrides=C.split_overrides(args.set))
            for line in setup(raw, Path.cwd(), Path.cwd(), gpus=gpus).gpu_lines():
                print(line)
            return 0
        cfg = C.load(args.config, overrides=C.split_overrides(args.set))
        if args.action == "validate":
            C.check_paths(cfg, args.root)
            print(f"{' + '.join(map(str, args.config))}: OK ({len(C.sweep_runs(cfg))} runs)")
        elif args.action == "runs":
            for spec in C.part_runs(cfg):
                print(spec.path)
        elif args.action == "job":
            _write(C.dump_yaml(C.compose(cfg, C.find_run(cfg, args.task, args.run))), args.out)
    except C.ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 1
    return 0
