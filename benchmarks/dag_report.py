"""What one finished DAG run produced: node wall times, test pass@k per run, one sweep point's MLflow tree.

    python benchmarks/dag_report.py --results results/gpu [--point gsm8k/verl_repexp_k32_b0.01_s42] [--out r.json]

Reads only what the pipeline wrote: Snakemake's benchmark tables (`<results>/benchmarks/<rule>/…tsv`,
one per node: wall seconds in column `s`), every `<results>/eval/<task>/<run>/eval.json`, and the
MLflow store the nodes logged to (the results directory's own store unless `--tracking-uri` or
`$MLFLOW_TRACKING_URI` names another), read back with `MlflowClient`: for the sweep point, its parent
run and every child run with its tags, parameter count, metric keys and the last value of each
metric. Used for docs/gpu-validation.md; works on any results directory (CPU runs too).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEADLINE_KS = ("1", "4", "8", "16", "32", "64", "128", "256")


def node_wall_times(results: Path) -> list[dict]:
    rows = []
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        with tsv.open() as handle:
            records = list(csv.DictReader(handle, delimiter="\t"))
        if records:
            node = str(tsv.relative_to(results / "benchmarks").with_suffix(""))
            rows.append({"node": node, "wall_s": round(float(records[-1]["s"]), 1),
                         "max_rss_mb": records[-1].get("max_rss")})
    return rows


def eval_table(results: Path) -> list[dict]:
    rows = []
    for path in sorted((results / "eval").glob("*/*/eval.json")):
        data = json.loads(path.read_text())
        curve = data.get("pass_at_k", {})
        rows.append({"task": path.parent.parent.name, "run": path.parent.name, "n_samples": data.get("n_samples"),
                     "num_problems": data.get("num_problems"), "engine": data.get("engine"),
                     "pass_at_k": {k: curve[k] for k in HEADLINE_KS if k in curve}})
    return rows


def mlflow_tree(tracking_uri: str, experiment: str | None, point: str | None) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = client.search_experiments()
    if experiment is not None:
        experiments = [e for e in experiments if e.name == experiment]
    tree: dict = {"tracking_uri": tracking_uri, "experiments": [e.name for e in experiments]}
    if not experiments or point is None:
        return tree
    ids = [e.experiment_id for e in experiments]
    runs = client.search_runs(ids, filter_string=f"tags.`repexp.sweep_point` = '{point}'", max_results=1000)
    by_id = {run.info.run_id: run for run in runs}
    parents = [run for run in runs if run.data.tags.get("mlflow.parentRunId") not in by_id]

    def describe(run) -> dict:
        metrics = run.data.metrics
        return {"name": run.info.run_name, "status": run.info.status,
                "rule": run.data.tags.get("repexp.rule"), "n_params": len(run.data.params),
                "params": {k: v for k, v in run.data.params.items() if "." not in k},
                "n_metrics": len(metrics), "metrics": dict(sorted(metrics.items()))}

    tree["point"] = point
    tree["parents"] = []
    for parent in parents:
        children = [describe(run) for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        tree["parents"].append({**describe(parent), "children": sorted(children, key=lambda c: c["name"] or "")})
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="the config's results_dir")
    parser.add_argument("--point", help="sweep point <task>/<run> whose MLflow tree to read back")
    parser.add_argument("--experiment", help="MLflow experiment (default: every experiment of the store)")
    parser.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else the results dir's SQLite store")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    from repexp.tracking import resolve_tracking_uri

    report = {"nodes": node_wall_times(args.results), "eval": eval_table(args.results)}
    report["mlflow"] = mlflow_tree(resolve_tracking_uri(args.results, args.tracking_uri), args.experiment, args.point)
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
