"""`repexp download`: fetch a hub model or the hub datasets once, on the submit host.

    repexp download model Qwen/Qwen2.5-7B-Instruct --out results/models/hub/Qwen--Qwen2.5-7B-Instruct
    repexp download data math gsm8k dapo-with-aime24 --out results/downloads/data --tables --dapo

The workflow runs these as localrules (`download_model`, `download_data`), so compute nodes never
need internet: every job reads these local copies (the workflow sets HF_HUB_OFFLINE=1 for jobs;
this command lifts it for its own process).

- `model`: config, tokenizer and safetensors weights into a temporary sibling directory, renamed
  into place when complete, so a half-finished download is never taken for a model.
- `data`: the Hugging Face tables the tasks read (`repexp.data.TABLES`) as JSONL in a local data
  source's layout, plus a `MANIFEST.json` (rows, hashes, origins) that `repexp data prepare` verifies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from repexp import layout

# Files a Hugging Face model directory needs for transformers, vLLM and verl.
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py")
DAPO_FILE = layout.DAPO_SOURCE_FILE
MANIFEST = layout.SOURCE_MANIFEST
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def data_files(tasks: Sequence[str], *, source_hf: bool, dapo_hf: bool) -> list[str]:
    """Relative paths of the JSONL files `data` writes for these tasks (the workflow's outputs)."""
    from repexp import data

    names = dict.fromkeys(name for task in tasks for name in data.tables_needed(task, data.Options())
                          if (dapo_hf if name == "dapo" else source_hf))
    return [DAPO_FILE if name == "dapo" else data.TABLES[name].local_path for name in names]


def _go_online() -> None:
    """The workflow marks jobs offline; a download is the one step that must reach the Hub."""
    for name in OFFLINE_VARIABLES:
        os.environ.pop(name, None)


def download_model(repo_id: str, out: Path, revision: Optional[str] = None) -> Path:
    _go_online()
    from huggingface_hub import snapshot_download

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    snapshot_download(repo_id, revision=revision, local_dir=partial, allow_patterns=list(MODEL_PATTERNS))
    if not (partial / "config.json").is_file():
        raise FileNotFoundError(f"{repo_id}: the download has no config.json; not a Hugging Face model repository")
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping of the local dir
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return out


def download_data(tasks: Sequence[str], out: Path, *, tables: bool, dapo: bool,
                  loader=None) -> dict:
    """Write the hub tables of `tasks` as JSONL under `out`; returns the manifest it writes last."""
    from repexp import data
    from repexp.io import atomic_path, write_json_atomic

    if loader is None:
        _go_online()
    out = Path(out)
    entries = []
    for path in data_files(tasks, source_hf=tables, dapo_hf=dapo):
        name = "dapo" if path == DAPO_FILE else next(n for n, spec in data.TABLES.items() if spec.local_path == path)
        table = data.load_hf([name], **({"loader": loader} if loader else {}))[name]
        target = out / path
        with atomic_path(target) as tmp:  # makes the parent directories
            tmp.write_text("".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in table.rows),
                           encoding="utf-8")
        entries.append({"path": path, "rows": len(table.rows), "sha256": data.sha256_file(target),
                        "hf_origin": table.origin})
    manifest = {"note": "written by `repexp download data` from the Hugging Face Hub", "files": entries}
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import config_options

    sub = parser.add_subparsers(dest="action", required=True)
    m = sub.add_parser("model", help="a model repository into a local directory")
    m.add_argument("repo_id", help="Hugging Face model id, e.g. Qwen/Qwen2.5-7B-Instruct")
    m.add_argument("--out", type=Path, help="default: the config's results/models/hub/<org>--<name>")
    m.add_argument("--revision", help="branch, tag or commit (default: main)")
    config_options(m, "results_dir=results")
    d = sub.add_parser("data", help="the hub tables of the config's sweep.tasks as a local data source (the "
                                    "benchmark tables where data.source is hf, the DAPO set where data.dapo_source is)")
    d.add_argument("--out", type=Path, help="default: the config's results/downloads/data")
    config_options(d, "sweep.tasks=[gsm8k] data.source=hf")


def run(args: argparse.Namespace) -> int:
    from repexp import jobs

    try:
        if args.action == "model":
            job = jobs.hand_job("download_model", args, wildcards={"hub_model": layout.hub_model_name(args.repo_id)},
                                out=args.out, revision=args.revision)
            return run_model_job(job)
        return run_data_job(jobs.hand_job("download_data", args, out=args.out))
    except ValueError as err:  # a ConfigError names the key
        print(f"download: {err}", file=sys.stderr)
        return 2


def run_model_job(job) -> int:
    """A hub model into its local directory (`repexp.jobs.DownloadModelJob`)."""
    try:
        path = download_model(job.repo_id, job.out, job.revision)
    except Exception as err:  # noqa: BLE001 - network and Hub errors come in many types; name them and fail
        print(f"repexp download model: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    from repexp.intermediates import record_content

    record_content(path)  # a byte-identical download reruns nothing made from it
    print(f"{job.repo_id}: downloaded to {path}")
    return 0


def run_data_job(job) -> int:
    """The hub tables of some tasks as a local data source (`repexp.jobs.DownloadDataJob`)."""
    if not data_files(list(job.tasks), source_hf=job.tables, dapo_hf=job.dapo):
        # the config reads every table of its tasks offline: say why nothing is fetched, not "wrote 0"
        print(f"repexp download data: nothing to download for sweep.tasks={list(job.tasks)}: the config reads "
              "them from a local source (data.source / data.dapo_source are not hf); e.g. --config "
              "configs/paper.yaml, or --set data.source=hf", file=sys.stderr)
        return 0
    try:
        manifest = download_data(list(job.tasks), job.out, tables=job.tables, dapo=job.dapo)
    except Exception as err:  # noqa: BLE001
        print(f"repexp download data: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(f"wrote {len(manifest['files'])} tables to {job.out}")
    return 0
