"""What the Snakefile's `onstart`/`onsuccess`/`onerror` do for tracking (called from
workflow/rules/common.smk in the main Snakemake process; no MLflow import here).

At the start: the workflow's tracking server when the config asks for one (`tracking.server`:
`on`, or `auto` with a cluster executor and no tracking URI set), exported to every job as
`MLFLOW_TRACKING_URI`; then every parent run, once (`repexp mlflow parents`; beside the first jobs
on a local SQLite store). At the end:
the records nodes left in the outbox are uploaded (`repexp mlflow sync`, which also waits for
detached uploads under way), then the server this workflow started is stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repexp import layout as L
from repexp.tracking.names import ENV_MLFLOW_URI, PARENTS_LOG, mlflow_dir
from repexp.tracking.node import load_config, tracking_enabled
from repexp.tracking.outbox import pending_records
from repexp.tracking.store import is_sqlite, resolve_tracking_uri

PARENTS_TIMEOUT_S = 300
_started_server = False
_server_store = None  # the store of the server this workflow used (on_start), for the closing pointers


def wants_server(cfg, non_local_exec: bool) -> bool:
    mode = cfg.tracking.server
    if mode == "on":
        return True
    return mode == "auto" and non_local_exec and not cfg.tracking.tracking_uri and not os.environ.get(ENV_MLFLOW_URI)


def on_start(config_path: str | Path, non_local_exec: bool) -> None:
    global _started_server, _server_store
    if not tracking_enabled():
        return
    cfg = load_config(str(config_path))
    if wants_server(cfg, non_local_exec):
        from repexp.tracking import server

        try:
            info = server.start(cfg, owner="workflow")
            _started_server = not info.get("reused")
            _server_store = info.get("backend_store_uri")
            what = "reusing" if info.get("reused") else "started"
            print(f"repexp: MLflow server {what}: {info['uri']} (store {info['backend_store_uri']}); "
                  f"jobs log there", file=sys.stderr)
        except (server.ServerStartError, OSError) as err:
            info = {"uri": getattr(err, "uri", None)}
            print(f"repexp: WARNING: the MLflow server did not start ({err}); nodes keep their records in "
                  f"{cfg.results_dir}/mlflow/outbox: start `repexp mlflow serve --config ...` and run "
                  "`repexp mlflow sync` later", file=sys.stderr)
        if info.get("uri"):
            os.environ[ENV_MLFLOW_URI] = info["uri"]  # local jobs inherit it; sbatch --export=ALL passes it on
    create_parents(cfg, config_path)


def create_parents(cfg, config_path: str | Path) -> None:
    """`repexp mlflow parents` before the first job. A server store has no lock across hosts, so the
    workflow waits for it (seconds, once). A local SQLite store serialises parent creation under its
    file lock anyway, so there it runs beside the first jobs instead of delaying them."""
    command = [sys.executable, "-m", "repexp", "mlflow", "parents", "--config", str(config_path)]
    if is_sqlite(resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)):
        log_path = mlflow_dir(cfg.results_dir) / PARENTS_LOG
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        return
    try:
        subprocess.run(command, check=False, timeout=PARENTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print("repexp: creating MLflow parent runs timed out; nodes create their own", file=sys.stderr)


def on_end(config_path: str | Path, results_dir: str | Path) -> None:
    if pending_records(results_dir):
        subprocess.run([sys.executable, "-m", "repexp", "mlflow", "sync", "--config", str(config_path)], check=False)
    if _started_server:
        from repexp.tracking import server

        server.stop(results_dir, owner="workflow")


def where_lines(cfg, results: Path, aggregate: Path, figures: Path) -> list[str]:
    """The closing lines of a successful run: where the table, the figures and the MLflow records are
    (only what exists: a run of a single target may have built neither table nor figures)."""
    lines = []
    table = next((aggregate / name for name in (L.PASS_AT_K_MD, L.PASS_AT_K_CSV) if (aggregate / name).exists()), None)
    if table is not None:
        lines.append(f"  table:   {table}  (the CSV and HTML beside it)")
    if figures.is_dir() and any(figures.glob("*.png")):
        lines.append(f"  figures: {figures}/  ({len(list(figures.glob('*.png')))} PNG, each also as PDF)")
    if tracking_enabled():
        store = _server_store or resolve_tracking_uri(results, cfg.tracking.tracking_uri)
        if store.startswith(("http://", "https://")):
            lines.append(f"  MLflow:  open {store}")
        else:
            lines.append(f"  MLflow:  mlflow ui --backend-store-uri {store}   # then open http://127.0.0.1:5000")
    return ["repexp: done. Results:", *lines] if lines else []
