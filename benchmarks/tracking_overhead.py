"""Per-node cost of MLflow tracking, against the same node without tracking in the same run.

    .venv/bin/python benchmarks/tracking_overhead.py [--repeats 5] [--params 90] [--metric-keys 40] [--steps 25]

On a fresh, already-migrated SQLite store under a temp results dir:

1. In-process (mlflow already imported): a node that writes a JSON output, run plain vs inside
   `tracking.node_run` with N params, K metric keys x S steps (one batched call per step, like a
   trainer) and the output as artifact. Overhead = tracked - plain, per node.
2. Fresh processes, as Snakemake jobs run them: a hand command plain vs its rule's `repexp run`
   (the stage in the same process, the run opened on a thread meanwhile): a short one (`repexp
   download data gsm8k` with no hub table: ends before MLflow is imported, its record is uploaded
   by a detached process) and a real preprocess node (`repexp data prepare gsm8k`). Between repeats
   the detached uploads are awaited (`tracking.sync`), so they do not slow the next measurement;
   their own time is shown.
3. The train node's critical path: what `repexp run train` does before its trainer starts, with the
   run opened beside the trainer (prepare + store check + opener thread) vs opened first.
4. Unreachable server (a closed 127.0.0.1 port): the cost of detecting it and writing the outbox.
5. Workflow start: `repexp mlflow parents` (every parent run of the config, once, in a fresh process),
   which the Snakefile's onstart runs before the first job.

Target (issue 7): tracking overhead under 2 s per node.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
REPEXP = str(Path(sys.executable).parent / "repexp")
DATA_DIR = REPO.parent / "shared" / "data"


def write_config(path: Path, results: Path, **tracking) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "bench-tracking", "results_dir": str(results), "model": "tiny",
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8], "betas": [0.01], "seeds": [42]},
        "data": {"source": str(DATA_DIR), "split_seed": 42}, "tracking": tracking,
    }))
    return path


def node_work(out: Path, i: int) -> None:
    out.write_text(json.dumps({"node": i, "values": list(range(100))}))


def timed_cmd(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--params", type=int, default=90, help="params per node (a train node logs ~90)")
    parser.add_argument("--metric-keys", type=int, default=40)
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args()

    t0 = time.perf_counter()
    import mlflow  # noqa: F401

    import_s = time.perf_counter() - t0
    from repexp import tracking as T

    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", T.ENV_TRACKING)}
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory(prefix="repexp-tracking-") as tmp:
        tmp = Path(tmp)
        results = tmp / "results"
        cfg = write_config(tmp / "cfg.yaml", results)
        t0 = time.perf_counter()
        with T.node_run("model", config=cfg):  # creates + migrates the store once (not per node)
            pass
        first_s = time.perf_counter() - t0

        params = {f"section{i // 10}.key{i}": i * 0.5 for i in range(args.params)}
        plain, tracked = [], []
        for i in range(args.repeats):
            out = tmp / f"out{i}.json"
            t0 = time.perf_counter()
            node_work(out, i)
            plain.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            with T.node_run("eval", "gsm8k", "trl_grpo_s42", config=cfg, params=params) as node:
                node_work(out, i)
                for step in range(args.steps):
                    node.log_metrics({f"metric/{k}": k * step * 0.01 for k in range(args.metric_keys)}, step=step)
                node.log_artifact(out)
            tracked.append(time.perf_counter() - t0)

        # fresh processes, as a Snakemake job runs them
        def plain_vs_wrapped(rule: str, task_args: list[str], command: list[str]):
            wrapped = [REPEXP, "run", rule, "--config", str(cfg), "--snakemake-jobid", "{1}", *task_args]
            plain_s, wrapped_s, upload_s = [], [], []
            for _ in range(args.repeats):
                plain_s.append(timed_cmd([REPEXP, *command], env))
                wrapped_s.append(timed_cmd(wrapped, env))
                t0 = time.perf_counter()
                synced, errors = T.sync(results)  # waits for the detached upload, if the node left one
                if errors:
                    raise SystemExit(f"upload failed: {errors}")
                upload_s.append(time.perf_counter() - t0)
            return plain_s, wrapped_s, upload_s

        short = plain_vs_wrapped("download_data", [], ["download", "data", "gsm8k", "--out", str(tmp / "dl")])
        prep = plain_vs_wrapped("preprocess", ["--task", "gsm8k"],
                                ["data", "prepare", "gsm8k", "--source", str(DATA_DIR), "--out", str(tmp / "gsm8k"),
                                 "--seed", "42"])

        # the train node: the wrapper's work before the trainer starts (in-process, mlflow imported)
        def before_trainer(background: bool) -> float:
            t0 = time.perf_counter()
            node = T.prepare_node("train", "gsm8k", "trl_grpo_s42", config=cfg, params=params)
            if background:
                opener = T.open_in_background(node, tmp / "mlflow_run.json") if node.check_store() else None
                elapsed = time.perf_counter() - t0
                opener.join()
            else:
                node.start()
                elapsed = time.perf_counter() - t0
            node.end("FINISHED")
            return elapsed

        train_first = [before_trainer(False) for _ in range(args.repeats)]
        train_beside = [before_trainer(True) for _ in range(args.repeats)]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dead_cfg = write_config(tmp / "dead.yaml", tmp / "results-dead", tracking_uri=f"http://127.0.0.1:{port}")
        dead = [REPEXP, "run", "download_data", "--config", str(dead_cfg)]
        dead_p = [timed_cmd(dead, env) for _ in range(args.repeats)]
        outbox = len(T.pending_records(tmp / "results-dead"))
        parents_s = [timed_cmd([REPEXP, "mlflow", "parents", "--config", str(cfg)], env) for _ in range(args.repeats)]
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"python {platform.python_version()}, repeats {args.repeats}")
    print(f"import mlflow (this process): {import_s:.2f} s; first node on a new store (migrations): {first_s:.2f} s")
    print(f"in-process node, {args.params} params, {args.metric_keys} keys x {args.steps} steps, 1 artifact: "
          f"plain {1000 * med(plain):.1f} ms, tracked {1000 * med(tracked):.0f} ms, "
          f"overhead {med(tracked) - med(plain):.2f} s per node")
    for label, (plain_s, wrapped_s, upload_s) in (("`repexp download data` (no table)", short),
                                                 ("`repexp data prepare gsm8k`", prep)):
        print(f"fresh process, {label}: plain {med(plain_s):.2f} s, in `repexp run` {med(wrapped_s):.2f} s, "
              f"overhead {med(wrapped_s) - med(plain_s):.2f} s per node; awaiting its upload afterwards "
              f"{med(upload_s):.2f} s (off the job's path: this process uploads it, or waits for the detached upload)")
    print(f"train node before its trainer starts (mlflow already imported here): run opened first "
          f"{1000 * med(train_first):.0f} ms + the import in a fresh process, "
          f"opened beside the trainer {1000 * med(train_beside):.1f} ms")
    print(f"unreachable server: wrapped {med(dead_p):.2f} s, overhead {med(dead_p) - med(short[0]):.2f} s per node, "
          f"{outbox} outbox records written")
    print(f"workflow start, `repexp mlflow parents` (5 parents, fresh process): {med(parents_s):.2f} s once per "
          "workflow")
    worst = max(med(tracked) - med(plain), med(short[1]) - med(short[0]), med(prep[1]) - med(prep[0]),
                med(train_beside), med(dead_p) - med(short[0]))
    print(f"target < 2 s per node: {'met' if worst < 2 else 'MISSED'} (worst case {worst:.2f} s)")


if __name__ == "__main__":
    main()
