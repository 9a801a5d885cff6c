"""Per-node cost of MLflow tracking, against the same node without tracking in the same run.

    .venv/bin/python benchmarks/tracking_overhead.py [--repeats 5] [--params 90] [--metric-keys 40] [--steps 25]

Two measurements on a fresh, already-migrated SQLite store under a temp results dir:

1. In-process (mlflow already imported): a node that writes a JSON output, run plain vs inside
   `tracking.node_run` with N params, K metric keys x S steps (one batched call per step, like a
   trainer) and the output as artifact. Overhead = tracked - plain, per node.
2. Fresh processes (what a Snakemake job pays): `repexp config validate CFG` vs
   `repexp mlflow node --rule select ... -- repexp config validate CFG`, i.e. interpreter start,
   the `mlflow` import, store/experiment/parent lookup, the child run, params from the flags.
3. Unreachable server (a closed 127.0.0.1 port): the same wrapped command, so the cost of
   detecting the outage and writing the outbox record.

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


def write_config(path: Path, results: Path, **tracking) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "bench-tracking", "results_dir": str(results), "model": "tiny",
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8], "betas": [0.01], "seeds": [42]},
        "tracking": tracking,
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
        command = ["config", "validate", str(cfg)]
        wrapped = [REPEXP, "mlflow", "node", "--config", str(cfg), "--rule", "select", "--task", "gsm8k",
                   "--run", "trl_grpo_s42", "--", "repexp", *command]
        bare_p = [timed_cmd([REPEXP, *command], env) for _ in range(args.repeats)]
        wrapped_p = [timed_cmd(wrapped, env) for _ in range(args.repeats)]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dead_cfg = write_config(tmp / "dead.yaml", tmp / "results-dead", tracking_uri=f"http://127.0.0.1:{port}")
        dead = [REPEXP, "mlflow", "node", "--config", str(dead_cfg), "--rule", "select", "--task", "gsm8k",
                "--run", "trl_grpo_s42", "--", "repexp", "config", "validate", str(dead_cfg)]
        dead_p = [timed_cmd(dead, env) for _ in range(args.repeats)]
        outbox = len(T.pending_records(tmp / "results-dead"))
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"python {platform.python_version()}, repeats {args.repeats}")
    print(f"import mlflow (this process): {import_s:.2f} s; first node on a new store (migrations): {first_s:.2f} s")
    print(f"in-process node, {args.params} params, {args.metric_keys} keys x {args.steps} steps, 1 artifact: "
          f"plain {1000 * med(plain):.1f} ms, tracked {1000 * med(tracked):.0f} ms, "
          f"overhead {med(tracked) - med(plain):.2f} s per node")
    print(f"fresh process: `repexp config validate` {med(bare_p):.2f} s, wrapped in `repexp mlflow node` "
          f"{med(wrapped_p):.2f} s, overhead {med(wrapped_p) - med(bare_p):.2f} s per node "
          f"({med(wrapped_p) / med(bare_p):.2f}x)")
    print(f"unreachable server: wrapped {med(dead_p):.2f} s, overhead {med(dead_p) - med(bare_p):.2f} s per node, "
          f"{outbox} outbox records written")
    worst = max(med(tracked) - med(plain), med(wrapped_p) - med(bare_p), med(dead_p) - med(bare_p))
    print(f"target < 2 s per node: {'met' if worst < 2 else 'MISSED'} (worst case {worst:.2f} s)")


if __name__ == "__main__":
    main()
