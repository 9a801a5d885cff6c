"""`repexp figures`: pass@k curves, test-time curves, k-efficiency, sweep heatmaps, training curves and
training dynamics, plus `index.json` (docs/figures.md describes each figure).

Input: `repexp aggregate`'s `pass_at_k.csv` and `k_efficiency_by_k.csv` (with the bootstrap intervals),
optionally the pipeline config (the expected runs: anything missing is named on the figure, in `index.json`
and on stderr) and the training metrics (`results/train/<task>/<run>/metrics.jsonl`, or the MLflow store).
Outputs in `--out-dir` (`.pdf` and `.png`, named by repexp.layout), each written atomically, `index.json` last:
every figure's files, caption, notes, pixel size and plotted data, so tests and readers can check numbers
without looking at pixels.

Every figure shows every method present; labels, colours and markers come from the method table
(`repexp.methods`: `Method.point_label`, `color`, `marker`), so a new method needs no change here.

Modules: `style` (look and scaffolding), `series` (what a line is, seed means, missing-run notes), one per
figure kind (`curves`, `testtime`, `efficiency`, `heatmaps`, `training`), `publish` (MLflow artifacts);
the CLI and `make_figures` are here.

Figures are never skipped silently: a figure without data is drawn as a panel that says what is
missing, so every declared output exists and shows why it is empty.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from repexp import layout
from repexp.config import RunSpec

# the names tests and docs/figures.md use, importable from `repexp.figures`
from repexp.figures.curves import plot_pass_at_k
from repexp.figures.efficiency import plot_k_efficiency
from repexp.figures.heatmaps import plot_heatmap
from repexp.figures.publish import log_figures_run  # noqa: F401
from repexp.figures.series import select_repexp_points, table_specs  # noqa: F401
from repexp.figures.style import DPI, MAX_REPEXP_LINES, _save
from repexp.figures.testtime import STEM as TESTTIME_STEM
from repexp.figures.testtime import plot_testtime
from repexp.figures.training import (  # noqa: F401
    plot_dynamics,
    plot_training,
    read_metrics_jsonl,
    training_curves_from_jsonl,
    training_curves_from_mlflow,
)
from repexp.io import json_safe, write_json_atomic
from repexp.layout import figure_pairs

# --------------------------------------------------------------------------- CLI


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Paths are flags; `tracking.*` comes from the config (docs/figures.md)."""
    from repexp.jobs import config_options

    parser.add_argument("--table", type=Path, required=True, help="pass_at_k.csv written by `repexp aggregate`")
    parser.add_argument("--out-dir", type=Path, required=True, help="where figures and index.json go")
    parser.add_argument("--k-efficiency", type=Path,
                        help=f"{layout.K_EFFICIENCY_BY_K_CSV} written by `repexp aggregate` (default: the one beside "
                             "--table, if any; without it the k-efficiency figure has no bootstrap intervals)")
    parser.add_argument("--train-dir", type=Path, help="results/train: training curves from <task>/<run>/metrics.jsonl")
    parser.add_argument("--curves-from", choices=("auto", "mlflow", "jsonl", "none"), default="auto",
                        help="training-curve source (auto: MLflow with tracking.experiment set, else metrics.jsonl "
                             "with --train-dir, else none)")
    parser.add_argument("--max-repexp-lines", type=int, default=MAX_REPEXP_LINES,
                        help="sweep points of one method drawn in the pass@k figure before only one is kept "
                             "(RepExp's: the paper's setting)")
    config_options(parser, "tracking.experiment=sweep")


def figure_files(specs: Sequence[RunSpec], *, training: bool = True) -> dict[str, list[str]]:
    """File names `repexp figures` writes for these runs, by kind (repexp.layout names them).

    {"pass_at_k": [...], "testtime": [...], "k_efficiency": [...], "heatmaps": [...], "training": [...],
    "dynamics": [...], "index": ["index.json"]}, PNG before PDF.
    """
    files: dict[str, list[str]] = {kind: [] for kind in layout.FIGURE_KINDS}
    for stem in layout.figure_stems(specs, training=training):
        files[layout.figure_kind(stem)] += layout.figure_names(stem)
    return {**files, "index": [layout.FIGURE_INDEX]}


def make_figures(table, out_dir: Path, *, expected: Sequence[RunSpec] | None = None,
                 curves: dict | None = None, curves_source: str = "",
                 max_repexp_lines: int = MAX_REPEXP_LINES, table_path: str | None = None,
                 k_efficiency=None, k_efficiency_source: str = "") -> dict:
    """Draw and save every figure; write `index.json` last. Returns the index.

    `k_efficiency`: the per-reference-k table with bootstrap intervals (`aggregate.tables.read_k_efficiency` of
    `k_efficiency_by_k.csv`); None: computed from `table`, without intervals.
    """
    import matplotlib

    from repexp.aggregate import tables

    matplotlib.use("Agg")
    specs = list(expected) if expected is not None else table_specs(table)
    tasks = list(dict.fromkeys(s.task for s in specs))
    figures = []

    def save(drawn, stem: str | None = None) -> None:
        fig, record = drawn
        record["files"] = _save(fig, out_dir, stem or record["id"])
        figures.append(record)

    save(plot_pass_at_k(table, tasks=tasks, expected=expected, max_repexp_lines=max_repexp_lines),
         layout.PASS_AT_K_FIGURE)
    save(plot_testtime(table, tasks=tasks, expected=expected), TESTTIME_STEM)
    if k_efficiency is None:
        k_efficiency = tables.k_efficiency(table, by_reference_k=True)
        k_efficiency_source = (f"computed from the pass@k table: no {layout.K_EFFICIENCY_BY_K_CSV}, "
                               "no per-problem counts")
    save(plot_k_efficiency(k_efficiency, table, tasks=tasks, expected=expected, source=k_efficiency_source),
         layout.K_EFFICIENCY_FIGURE)
    for task, backend, method in layout.heatmap_grids(specs):  # two-parameter grids only (layout.heatmap_params)
        save(plot_heatmap(table, task, backend, method, expected=expected))
    if curves is not None:
        for task, backend in figure_pairs(specs):
            for plot in (plot_training, plot_dynamics):
                save(plot(curves, task, backend, specs=specs, source=curves_source))
    from_training = ("training", "dynamics")
    index = {"generated_by": "repexp figures", "table": table_path, "dpi": DPI,
             "expected_from_config": expected is not None,
             "missing_evaluations": sorted({m for f in figures if f["kind"] not in from_training
                                            for m in f["missing_runs"]}),
             "missing_training_metrics": sorted({m for f in figures if f["kind"] in from_training
                                                 for m in f["missing_runs"]}),
             "training_curves": curves_source or None, "figures": figures}
    write_json_atomic(out_dir / layout.FIGURE_INDEX, json_safe(index))
    return index


def run(args: argparse.Namespace) -> int:
    from repexp import jobs

    try:
        job, cfg = jobs.logging_hand_job(jobs.FiguresJob, args, table=args.table, out_dir=args.out_dir,
                                         k_efficiency=args.k_efficiency, curves_from=args.curves_from,
                                         train_dir=args.train_dir, max_repexp_lines=args.max_repexp_lines)
    except ValueError as err:  # a ConfigError names the key
        print(f"figures: error: {err}", file=sys.stderr)
        return 1
    return run_job(job, cfg if args.config else None)


def run_job(job, cfg=None) -> int:
    """Every figure (`repexp.jobs.FiguresJob`: the figures rule's and `repexp figures`'s); `cfg`: the loaded
    `job.config` where the caller has it."""
    from repexp import config, tracking
    from repexp.aggregate import tables

    table_path, out_dir = Path(job.table), Path(job.out_dir)
    train_dir = Path(job.train_dir) if job.train_dir else None
    try:
        table = tables.read_table(table_path)
        if table.empty:
            raise ValueError(f"{table_path}: the table has no rows")
        cfg = cfg or (config.load(job.config) if job.config else None)
        expected = config.sweep_runs(cfg) if cfg else None
        target = tracking.mlflow_target(job.tracking_uri, job.experiment, job.config)
        source = job.curves_from
        if source == "auto":
            source = "mlflow" if job.experiment else ("jsonl" if train_dir else "none")
        specs = list(expected) if expected is not None else table_specs(table)
        curves, curves_source = None, ""
        if source == "jsonl":
            if train_dir is None:
                raise ValueError("--curves-from jsonl needs --train-dir")
            if not train_dir.is_dir():
                raise FileNotFoundError(f"{train_dir}: training directory not found")
            curves, curves_source = training_curves_from_jsonl(train_dir, specs), layout.METRICS
        elif source == "mlflow":
            if target is None:
                raise ValueError("--curves-from mlflow needs tracking.experiment (or a node run)")
            curves, curves_source = training_curves_from_mlflow(target, specs), "MLflow"
        beside = table_path.parent / layout.K_EFFICIENCY_BY_K_CSV  # the default
        keff_path = Path(job.k_efficiency) if job.k_efficiency else beside if beside.is_file() else None
        keff = tables.read_k_efficiency(keff_path) if keff_path is not None else None
        lines = MAX_REPEXP_LINES if job.max_repexp_lines is None else job.max_repexp_lines
        index = make_figures(table, out_dir, expected=expected, curves=curves, curves_source=curves_source,
                             max_repexp_lines=lines, table_path=str(table_path), k_efficiency=keff,
                             k_efficiency_source=str(keff_path or ""))
    except (ValueError, FileNotFoundError) as err:
        print(f"figures: error: {err}", file=sys.stderr)
        return 1
    for key, what in (("missing_evaluations", "evaluation"), ("missing_training_metrics", "training metrics")):
        for name in index[key]:
            print(f"figures: missing {what}: {name}", file=sys.stderr)
    for figure in index["figures"]:
        for note in figure["notes"]:
            print(f"figures: {figure['id']}: {note}", file=sys.stderr)
    print(f"figures: {len(index['figures'])} figures → {out_dir}")
    if target is not None:
        figure_paths = [out_dir / name for f in index["figures"] for name in f["files"]]
        figure_paths.append(out_dir / layout.FIGURE_INDEX)
        table_files = [p for p in sorted(table_path.parent.iterdir())
                       if p.is_file() and p.suffix in (".csv", ".md", ".html") and not p.name.startswith(".")]
        try:
            run_id = log_figures_run(target, figure_paths, table_files)
            print(f"figures: figures and tables logged to MLflow run {run_id} ({target.experiment})")
        except Exception as err:  # the figures are written and valid; tracking failures are reported, not fatal
            print(f"figures: warning: MLflow logging failed ({type(err).__name__}: {err}); "
                  "the figures are complete, rerun with the same flags to log", file=sys.stderr)
    return 0
