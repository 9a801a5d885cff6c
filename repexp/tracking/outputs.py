"""A stage inside its node run, in one process: `run_stage` logs the stage's result (repexp.stage.StageResult,
built by the stage) and its declared outputs as artifacts (files up to 50 MB; never weights or parquet);
`dataset` and friends describe the datasets a stage read. No output format is known here."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from repexp import layout
from repexp.io import read_json
from repexp.tracking.names import DATASET_CONTEXTS, ENV_MLFLOW_URI

ARTIFACT_MAX_BYTES = 50 * 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".parquet")  # never copied into MLflow
DIGEST_CHARS = 16  # MLflow shows a dataset's digest beside its name


def run_stage(node, stage: Callable[[], Any], outputs: Sequence[str], what: str, *, in_run: bool = False) -> int:
    """Run `stage()` in this process inside `node`; returns its exit status.

    SIGTERM (SLURM, Snakemake) ends the stage with status 143 and the node FAILED. The node opens on a
    thread while the stage runs: the MLflow import and run creation overlap it. A stage that ends before
    its run is open does not wait: the record goes to the outbox and a detached `repexp mlflow sync
    --record` uploads it. `in_run`: the stage logs into the run itself (aggregate, figures), so the run
    is opened first and named to it through MLflow's environment variables. The stage returns a
    StageResult (or an exit status); a non-zero status or an exception ends the node FAILED with
    "`what` exited with status N" (and the last traceback's exception line written meanwhile, when
    `repexp run --log` keeps the output: repexp.joblog) or the exception as `repexp.error`.
    """
    from repexp import joblog
    from repexp.processes import describe_exit
    from repexp.tracking.node import as_current
    from repexp.tracking.outbox import upload_in_background

    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    node.check_store()  # an unreachable store is known (and warned about) before the stage starts
    opener = threading.Thread(target=node.start, name="mlflow-node-start", daemon=True)
    node.start() if in_run else opener.start()
    log = joblog.current()  # `repexp run --log`: a child's traceback in the output names the cause of a failure
    since = log.mark() if log is not None else 0
    saved, result, code, error = dict(os.environ), None, 1, None
    if in_run:  # the node's run for MLflow's own fluent API and repexp.tracking.targets
        run = {"MLFLOW_RUN_ID": node.run_id, "MLFLOW_EXPERIMENT_NAME": node.record.experiment} if node.online else {}
        os.environ.update({ENV_MLFLOW_URI: node.tracking_uri, **run})
    try:
        with as_current(node):
            result = stage()
        code = int(getattr(result, "code", result) or 0)
    except SystemExit as stop:
        code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
    except KeyboardInterrupt:
        code = 130
    except Exception as err:  # noqa: BLE001 - the node records it; the exit status says it
        traceback.print_exc()
        error = "".join(traceback.format_exception_only(type(err), err)).strip()
    finally:
        if in_run:  # (no opener thread reads the environment meanwhile)
            os.environ.clear()
            os.environ.update(saved)
    if not in_run and not node.defer():
        opener.join()
    if code:
        if error is None:
            cause = log.cause(since) if log is not None else None
            error = describe_exit(f"`{what}`", code) + (f": {cause}" if cause else "")
    else:
        try:
            log_result(node, result)
            log_artifacts(node, outputs)
        except SystemExit as stop:  # SIGTERM while logging
            code, error = stop.code, f"stopped while logging the outputs (status {stop.code})"
    node.end("FAILED" if code else "FINISHED", error=error)
    if node.deferred:  # the opener thread (a daemon) stops at its gate, writing nothing
        upload_in_background(node.outbox_record)
    return code


def log_result(node, result: Any) -> None:
    """A StageResult's metrics (at its step), curves (each point at its own step), params, input datasets
    and tables; an exit status has none."""
    if not hasattr(result, "metrics"):
        return
    node.log_params(result.params)
    node.log_metrics(result.metrics, step=result.step)
    stamp = int(time.time() * 1000)
    node.log_metric_rows([[name, value, step, stamp] for name, curve in getattr(result, "curves", {}).items()
                          for step, value in curve.items()])
    node.log_inputs(result.inputs)
    for name, data in result.tables.items():
        node.log_table(name, data)


def log_artifacts(node, outputs: Sequence[str]) -> None:
    """The declared outputs that exist, as artifacts (a directory's files below its name)."""
    for output in outputs:
        path = Path(output)
        if not path.exists():
            continue
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                if _loggable(file) and not file.name.startswith("."):
                    node.log_artifact(file, str(Path(path.name) / file.relative_to(path).parent))
        elif _loggable(path):
            node.log_artifact(path)


def _loggable(path: Path) -> bool:
    return path.suffix not in WEIGHT_SUFFIXES and path.stat().st_size <= ARTIFACT_MAX_BYTES


# --------------------------------------------------------------------------- datasets


def dataset(name: str, digest: str, source: str, *, context: Optional[str] = None, rows: Optional[int] = None,
            schema: Optional[list[str]] = None) -> dict[str, Any]:
    """A dataset for `log_input` (kept as a dict so an outbox record can hold it): a local file,
    named and digested as repexp's manifest names and hashes it."""
    out: dict[str, Any] = {"name": name, "digest": str(digest)[:DIGEST_CHARS], "source_type": "local",
                           "source": json.dumps({"uri": str(source)}), "context": context}
    if rows is not None:
        out["profile"] = json.dumps({"num_rows": int(rows)})
    if schema:
        out["schema"] = json.dumps({"mlflow_colspec": [{"name": col, "type": "string"} for col in schema]})
    return out


def split_datasets(data_dir: Path, splits: Sequence[str]) -> list[dict[str, Any]]:
    """The prepared splits of a task (`<results>/data/<task>/`), from its manifest.json."""
    manifest_path = layout.manifest_file(data_dir)
    if not manifest_path.exists():
        return []
    manifest = read_json(manifest_path)
    task = Path(data_dir).name
    out = []
    for split in splits:
        info = (manifest.get("splits") or {}).get(split)
        if not info or not info.get("sha256"):
            continue
        source = Path(data_dir).resolve() / info.get("file", layout.split_file(data_dir, split).name)
        out.append(dataset(f"{task}/{split}", info["sha256"], source, context=DATASET_CONTEXTS.get(split, split),
                           rows=info.get("rows"),
                           schema=["data_source", "prompt", "ability", "reward_model", "extra_info"]))
    return out


def source_datasets(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a task's splits were made from (preprocess's inputs)."""
    return [dataset(name, info["sha256"], info.get("origin", name), context="source", rows=info.get("rows"))
            for name, info in sorted((manifest.get("inputs") or {}).items()) if info.get("sha256")]
