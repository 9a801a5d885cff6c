"""The `repexp` command: one subcommand per pipeline stage.

Subcommands live in their own modules, imported only when used (`repexp --help` and light commands
pay for no torch, verl or MLflow import); each exposes `configure_parser(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("repexp.config_cli", "validate a pipeline config, print run names or a job's trainer config"),
    "model": ("repexp.models", "build the offline tiny test model or convert SmolLM2-135M-Instruct"),
    "download": ("repexp.download", "fetch a hub model or the hub datasets once (the submit host's localrules)"),
    "data": ("repexp.data", "prepare a task's train/dev/test parquet splits"),
    "select": ("repexp.checkpoints", "pick the best-dev checkpoint of a training run"),
    "merge": ("repexp.verl.merge", "merge a verl FSDP checkpoint into a Hugging Face directory"),
    "eval": ("repexp.evaluate", "sample a model on a split and compute pass@k"),
    "testtime": ("repexp.testtime", "order an evaluation's samples by the elliptical bonus (test-time RepExp)"),
    "run": ("repexp.run_cli", "run one workflow job (preprocess, train, select, merge, eval, testtime) from the "
                              "config snapshot and its task/run, beside its MLflow node run"),
    "plan": ("repexp.plan_cli", "what a sweep costs before anything is submitted: jobs, GPU-hours, disk, wall time"),
    "aggregate": ("repexp.aggregate", "collect eval.json files into one tidy pass@k table"),
    "figures": ("repexp.figures", "plot pass@k curves, sweep heatmaps and training curves"),
    "mlflow": ("repexp.tracking", "MLflow helpers: sync records kept locally, create sweep runs"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS)) + 2  # one line per command, never wrapped
        listing = "\n".join(f"  {name:<{width}}{help_text}" for name, (_, help_text) in COMMANDS.items())
        parser = argparse.ArgumentParser(
            prog="repexp", usage="repexp COMMAND [options]   (repexp COMMAND --help: the command's options)",
            description=__doc__.splitlines()[0], epilog="commands:\n" + listing,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if argv and argv[0] not in {"-h", "--help"}:
            parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    args = command_parser(argv[0]).parse_args(argv[1:])
    try:
        return int(importlib.import_module(COMMANDS[argv[0]][0]).run(args) or 0)
    except BrokenPipeError:  # stdout's reader went away (`repexp config runs C | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush would fail again
        return 128 + signal.SIGPIPE  # what a shell reports for a writer stopped by SIGPIPE: never a success


def command_parser(name: str) -> argparse.ArgumentParser:
    """`repexp NAME`'s parser; its subcommands (`repexp mlflow sync`, ...) describe themselves with their help."""
    parser = argparse.ArgumentParser(prog=f"repexp {name}", description=COMMANDS[name][1])
    importlib.import_module(COMMANDS[name][0]).configure_parser(parser)
    _describe_subcommands(parser)
    return parser


def _describe_subcommands(parser: argparse.ArgumentParser) -> None:
    # argparse shows a subcommand's `help` in its parent's listing only; `repexp mlflow sync --help` would
    # otherwise start with bare usage. The one line is written once, as `help=`, by each module.
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {choice.dest: choice.help for choice in action._choices_actions}  # noqa: SLF001
            for sub_name, sub in action.choices.items():
                if sub.description is None:
                    sub.description = helps.get(sub_name)
                _describe_subcommands(sub)


if __name__ == "__main__":
    sys.exit(main())
