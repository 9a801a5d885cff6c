"""`repexp aggregate`: every `eval.json` → one tidy pass@k table and the k-efficiency table.

Inputs: `results/eval/<task>/<run>/eval.json` (docs/architecture.md); `<run>` is a `RunSpec.name` and supplies
the config columns. The table's `pass_at_k` uses one grader for every run: `--grader`, else the config's
`grader`, else the files' own (which must then agree); `pass_at_k_repexp`/`_paper` hold both (docs/evaluation.md).

Outputs in `--out-dir`, each written atomically: `pass_at_k.csv` (tidy, one row per (run, k)),
`k_efficiency.csv` (one row per point of every method
but GRPO, each vs GRPO, defined in `tables`), `k_efficiency_by_k.csv` (the same per
reference k), and `pass_at_k.md` / `.html` for people (the HTML is what the Snakemake report embeds);
`preregistered.md` / `.json`: the registered seed-level analysis of docs/pilot.md's fourth design
(`prereg`), with the training measures read from `<results>/train/<task>/<run>/metrics.jsonl` when a config
is given. With `sweep.part` set, the evaluations of the sweep's other parts found in the results directory
are pooled with the part's own (`pooled_parts`).
With `--testtime`, `testtime_pass_at_k` holds pass@k in test-time RepExp order and the per-run tables gain the
test-time verifier efficiency.

| module | what it holds |
|---|---|
| `load` | `EvalRun`, `TesttimeRun`: the input files, checked |
| `tables` | the tidy table (method, point, label, parameters), k-efficiency (each method vs GRPO), bootstrap |
| `render` | the Markdown and HTML views (seed summaries) |
| this module | the command: what it writes, the sweep points' MLflow metrics (logged by `repexp.tracking.targets`) |

It re-exports the loading and table API that tests and docs use (`repexp.aggregate.load_evals`, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repexp import layout
from repexp import metrics as metric_names
from repexp.aggregate import prereg
from repexp.aggregate.load import (
    EvalRun,
    TesttimeRun,
    attach_testtime,
    find_eval_files,
    load_eval,
    load_evals,
)
from repexp.aggregate.render import render_html, render_markdown
from repexp.aggregate.tables import (
    BOOTSTRAP_LEVEL,
    BOOTSTRAP_REPLICATES,
    BOOTSTRAP_SEED,
    K_EFFICIENCY_COLUMNS,
    bootstrap_k_efficiency,
    crossing_k,
    crossing_k_batch,
    k_efficiency,
    k_efficiency_headline,
    read_k_efficiency,
    read_table,
    tidy_table,
)
from repexp.config import RunSpec, sweep_runs
from repexp.config import load as load_config
from repexp.io import read_json, write_text_atomic
from repexp.trl.runlog import MetricsLog

__all__ = [  # the names docs use (each defined in its submodule only; tests import the rest from there)
    "BOOTSTRAP_LEVEL", "BOOTSTRAP_REPLICATES", "BOOTSTRAP_SEED", "K_EFFICIENCY_COLUMNS", "EvalRun", "aggregate",
    "bootstrap_k_efficiency", "configure_parser", "crossing_k", "crossing_k_batch", "find_eval_files", "k_efficiency",
    "load_eval", "load_evals", "log_sweep_point_metrics", "read_k_efficiency", "read_table", "run", "run_job",
    "sweep_point_metrics",
]

# ks logged on every sweep point's MLflow parent run (plus the largest evaluated k)
MLFLOW_KS = (1, 16, 256)


# --------------------------------------------------------------------------- MLflow sweep-point metrics


def sweep_point_metrics(run: EvalRun) -> dict[str, float]:
    """`test/pass_at_<k>` for k in MLFLOW_KS ∩ evaluated, plus the largest evaluated k (the eval node runs
    carry every k; '@' is not allowed in MLflow names)."""
    ks = [k for k in MLFLOW_KS if k in run.pass_at_k] + [max(run.pass_at_k)]
    return {metric_names.pass_at_k(metric_names.TEST, k): run.pass_at_k[k] for k in dict.fromkeys(ks)}


def log_sweep_point_metrics(runs: Sequence[EvalRun], target, testtime: dict[tuple[str, str], TesttimeRun] | None = None
                            ) -> dict[str, str | None]:
    """Log `sweep_point_metrics` (plus test-time metrics) on every sweep point's MLflow parent run (of this
    results directory), so the MLflow compare view of the parent runs shows pass@1/16/256 next to their
    method/parameter/seed params (`repexp.tracking.log_point_metrics`). Returns {'<task>/<run>': parent run id or None}.
    """
    from repexp import tracking

    metrics = {}
    for run in runs:
        metrics[run.spec] = sweep_point_metrics(run)
        tt = (testtime or {}).get((run.spec.task, run.spec.name))
        if tt is not None:  # its test-time stage ran
            metrics[run.spec].update(metric_names.testtime_metrics(read_json(tt.path)))
    return tracking.log_point_metrics(target, metrics)


# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Paths are flags; `grader` and `tracking.*` come from the config (docs/figures.md)."""
    from repexp.jobs import config_options

    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--eval-dir", type=Path, help="collect every <task>/<run>/eval.json below this directory")
    source.add_argument("--inputs", type=Path, nargs="+", metavar="EVAL_JSON",
                        help="explicit eval.json files (each at <task>/<run>/eval.json)")
    parser.add_argument("--testtime", type=Path, nargs="*", default=[], metavar="TESTTIME_JSON",
                        help="testtime.json files of `repexp testtime` (at <task>/<run>/testtime.json): the test-time "
                             "column and table")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the tables go")
    config_options(parser, "grader=paper tracking.experiment=sweep")


def pooled_parts(cfg, paths: Sequence[Path]) -> list[RunSpec]:
    """With `sweep.part` set: the runs of the sweep's other parts (not among `paths`) whose eval.json is in the
    config's results directory, in the sweep's order; the aggregate pools them with the part's own."""
    if cfg.sweep.part is None:
        return []
    given = {Path(p).resolve() for p in paths}
    return [spec for spec in sweep_runs(cfg)
            if (path := layout.eval_json(cfg.results_dir, spec.task, spec.name)).resolve() not in given
            and path.is_file()]


def aggregate(paths: Sequence[Path], out_dir: Path, *, expected: Sequence[RunSpec] | None = None,
              drop_unexpected: bool = False, grader: str | None = None,
              testtime_paths: Sequence[Path] = (), train_dir: Path | None = None) -> dict[str, Any]:
    """Load, tabulate and write every output. `train_dir`: `<results>/train`, whose runs' metrics.jsonl give
    the registered analysis its training measures. Returns {runs, table, k_efficiency, k_efficiency_by_k,
    missing, ignored, testtime, preregistered}."""
    runs = load_evals(paths, grader)
    ignored, missing = [], []
    if expected is not None:
        wanted = {(s.task, s.name) for s in expected}
        if drop_unexpected:
            ignored = [r.spec.path for r in runs if (r.spec.task, r.spec.name) not in wanted]
            runs = [r for r in runs if (r.spec.task, r.spec.name) in wanted]
        found = {(r.spec.task, r.spec.name) for r in runs}
        missing = [s.path for s in expected if (s.task, s.name) not in found]
    if not runs:
        raise ValueError("no eval.json to aggregate" + (f" (missing: {', '.join(missing)})" if missing else ""))
    testtime = attach_testtime(runs, testtime_paths)
    table = tidy_table(runs, testtime)
    keff_by_k = k_efficiency(table, runs, by_reference_k=True)
    keff = k_efficiency_headline(keff_by_k)
    training = {(r.spec.task, r.spec.name): MetricsLog(train_dir / r.spec.task / r.spec.name).records()
                for r in runs if train_dir is not None and r.spec.trains}  # [] without the file: NaN measures
    registered = prereg.analyse(prereg.units(table, testtime, training))
    for name, content in ((layout.PREREGISTERED_MD, prereg.render_markdown(registered, missing=missing)),
                          (layout.PREREGISTERED_JSON, prereg.render_json(registered, missing=missing)),
                          (layout.K_EFFICIENCY_CSV, keff), (layout.K_EFFICIENCY_BY_K_CSV, keff_by_k),
                          (layout.PASS_AT_K_MD, render_markdown(table, keff, missing=missing, ignored=ignored,
                                                                testtime=testtime)),
                          (layout.PASS_AT_K_HTML, render_html(table, keff, missing=missing, ignored=ignored,
                                                              testtime=testtime)),
                          (layout.PASS_AT_K_CSV, table)):  # pass_at_k.csv last: the rule's first output
        write_text_atomic(out_dir / name, content if isinstance(content, str) else content.to_csv(index=False))
    return {"runs": runs, "table": table, "k_efficiency": keff, "k_efficiency_by_k": keff_by_k, "missing": missing,
            "ignored": ignored, "testtime": testtime, "preregistered": registered}


def run(args: argparse.Namespace) -> int:
    from repexp import jobs

    try:
        job, cfg = jobs.logging_hand_job(jobs.AggregateJob, args, inputs=args.inputs, eval_dir=args.eval_dir,
                                         testtime=args.testtime, out_dir=args.out_dir)
    except ValueError as err:  # a ConfigError names the key
        print(f"aggregate: error: {err}", file=sys.stderr)
        return 1
    job = dataclasses.replace(job, grader=cfg.grader if args.config or args.set else None)
    return run_job(job, cfg if args.config else None)


def run_job(job, cfg=None) -> int:
    """Every evaluation -> the tables (`repexp.jobs.AggregateJob`: the aggregate rule's and `repexp aggregate`'s);
    `cfg`: the loaded `job.config` where the caller has it."""
    out_dir = Path(job.out_dir)
    try:
        paths = find_eval_files(Path(job.eval_dir)) if job.eval_dir else [Path(p) for p in job.inputs]
        cfg = cfg or (load_config(job.config) if job.config else None)
        expected = sweep_runs(cfg) if cfg else None
        testtime_paths = [Path(p) for p in job.testtime]
        for path in [*paths, *testtime_paths]:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: {'testtime' if path in testtime_paths else 'eval'}.json not found")
        pooled = pooled_parts(cfg, paths) if cfg is not None and not job.eval_dir else []
        for spec in pooled:
            paths.append(layout.eval_json(cfg.results_dir, spec.task, spec.name))
            tt = layout.testtime_json(cfg.results_dir, spec.task, spec.name)
            if job.testtime and tt.is_file():
                testtime_paths.append(tt)
        grader = job.grader or (cfg.grader if cfg else None)
        train_dir = Path(cfg.results_dir) / layout.TRAIN_DIR if cfg is not None else None
        result = aggregate(paths, out_dir, expected=expected, drop_unexpected=bool(job.eval_dir), grader=grader,
                           testtime_paths=testtime_paths, train_dir=train_dir)
    except (ValueError, FileNotFoundError) as err:  # ConfigError is a ValueError
        print(f"aggregate: error: {err}", file=sys.stderr)
        return 1
    if pooled:
        print(f"aggregate: sweep.part {cfg.sweep.part} of {cfg.sweep.parts}: pooled {len(pooled)} runs of the other "
              "parts found in the results directory", file=sys.stderr)
    for name in result["missing"]:
        print(f"aggregate: missing run (no eval.json): {name}", file=sys.stderr)
    if result["ignored"]:
        print(f"aggregate: ignored runs not in the config: {', '.join(result['ignored'])}", file=sys.stderr)
    print(f"aggregate: {len(result['runs'])} runs → {out_dir}/{', '.join(layout.AGGREGATE_FILES)}")
    from repexp import tracking

    target = tracking.mlflow_target(job.tracking_uri, job.experiment, job.config)
    if target is not None:
        try:
            logged = log_sweep_point_metrics(result["runs"], target, result["testtime"])
            node = tracking.node_for_target(target)
            where = "kept for `repexp mlflow sync`" if node is not None and not node.online else "logged"
            print(f"aggregate: test pass@k {where} on {len(logged)} MLflow sweep-point runs ({target.experiment})")
        except Exception as err:  # the tables are written and valid; tracking failures are reported, not fatal
            print(f"aggregate: warning: MLflow logging failed ({type(err).__name__}: {err}); "
                  "the tables are complete, rerun with the same flags to log", file=sys.stderr)
    return 0
