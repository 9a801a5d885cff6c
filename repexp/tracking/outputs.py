"""What a finished node's outputs say, in MLflow's terms.

- the command's flags → `cmd.*` params;
- declared outputs → artifacts (files up to 50 MB; never weights or parquet);
- `eval.json` → one metric per evaluated k (`test/pass_at_1` … `test/pass_at_<n>`, their SEMs,
  maj@k, `test/mean_at_n`, ...), the full curve k = 1..n as a table, the evaluated split as an
  input dataset;
- `select.json` → `select.*` params and `best_dev_value` at the selected step;
- `manifest.json` (preprocess) → the source files as input datasets;
- `testtime.json` → `testtime/*` metrics (pass@k of both orders at the reference ks, efficiency,
  samples-to-correct).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from repexp import layout
from repexp import metrics as metric_names
from repexp.io import read_json
from repexp.tracking.names import DATASET_CONTEXTS
from repexp.tracking.record import now_ms

ARTIFACT_MAX_BYTES = 50 * 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".parquet")  # never copied into MLflow
DIGEST_CHARS = 16  # MLflow shows a dataset's digest beside its name


def flag_params(argv: Sequence[str]) -> dict[str, str]:
    """A command line -> params: positionals as cmd.argN, `--flag value` as cmd.flag."""
    params: dict[str, str] = {}
    if argv:
        params["cmd"] = argv[0]
    i, position = 1, 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            key, _, value = token[2:].partition("=")
            if not value:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    value, i = argv[i + 1], i + 1
                else:
                    value = "true"
            params[f"cmd.{key}"] = value
        else:
            params[f"cmd.arg{position}"] = token
            position += 1
        i += 1
    return params


def log_outputs(node, outputs: Sequence[str]) -> None:
    """Log a finished node's declared outputs: artifacts, plus metrics/params read from known files."""
    for output in outputs:
        path = Path(output)
        if not path.exists():
            continue
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                if _loggable(file) and not file.name.startswith("."):
                    node.log_artifact(file, str(Path(path.name) / file.relative_to(path).parent))
            continue
        if _loggable(path):
            node.log_artifact(path)
        _log_known_output(node, path)


def _loggable(path: Path) -> bool:
    return path.suffix not in WEIGHT_SUFFIXES and path.stat().st_size <= ARTIFACT_MAX_BYTES


def _log_known_output(node, path: Path) -> None:
    try:
        if path.name == layout.EVAL_JSON:
            log_eval(node, read_json(path))
        elif path.name == layout.SELECT:
            pointer = read_json(path)
            node.log_params({f"select.{k}": v for k, v in pointer.items() if k not in ("value", "skipped")})
            if pointer.get("value") is not None:
                step = int(pointer.get("checkpoint_step") or 0)
                node.log_metric_rows([[metric_names.BEST_DEV_VALUE, pointer["value"], step, now_ms()]])
        elif path.name == layout.MANIFEST:
            node.log_inputs(source_datasets(read_json(path)))
        elif path.name == layout.TESTTIME_JSON:
            node.log_metric_rows([[name, value, 0, now_ms()] for name, value in
                                  metric_names.testtime_metrics(read_json(path)).items()])
    except Exception as err:  # noqa: BLE001 - a malformed output is the command's problem, not ours
        print(f"[repexp.tracking] could not read metrics from {path}: {err}", file=sys.stderr)


# --------------------------------------------------------------------------- eval.json


def pass_at_k_curve(result: dict[str, Any]) -> Optional[dict[str, list]]:
    """pass@k for every k = 1..n from the per-problem counts (the evaluated ks are a subset)."""
    import numpy as np

    from repexp import passk

    per_problem = result.get("per_problem") or []
    if not per_problem:
        return None
    n = np.array([p["n"] for p in per_problem], dtype=np.int64)
    c = np.array([p["c"] for p in per_problem], dtype=np.int64)
    ks = list(range(1, int(n.min()) + 1))
    mean, sem = passk.summarize(passk.pass_at_k(n, c, ks))
    return {"k": ks, "pass_at_k": [float(v) for v in mean],
            "sem": [None if not np.isfinite(v) else float(v) for v in sem]}


def log_eval(node, result: dict[str, Any]) -> None:
    split = result.get("split") or "test"
    ts = now_ms()
    node.log_metric_rows([[name, value, 0, ts] for name, value in metric_names.eval_metrics(result).items()])
    curve = pass_at_k_curve(result)
    if curve:
        node.log_table(metric_names.pass_at_k_table(split), curve)
    data_path = result.get("data_path")
    if data_path:
        node.log_inputs(split_datasets(Path(data_path).parent, [split]))


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
