"""What the Snakefile's `onstart`/`onsuccess`/`onerror` do for tracking (called from
workflow/rules/common.smk in the main Snakemake process; no MLflow import here).

At the start: the SQLite store's health (repexp.tracking.health: a damaged store, one this
results directory used that is gone, or another store in its place, stops the workflow before any
job and says how to restore it or start a new one; a healthy one is backed up), then the
workflow's tracking server when the config asks for one (`tracking.server`: `on`, or `auto` with a
cluster executor and no tracking URI set), exported to every job as `MLFLOW_TRACKING_URI`; then
every parent run, once (`repexp mlflow parents`; beside the first jobs on a local SQLite store).
At the end: the parent runs' creation is awaited, the records nodes left in the outbox are uploaded
(`repexp mlflow sync`, which also waits for detached uploads under way), the server this workflow
started is stopped, and the store is backed up again (after success and failure alike), so even the
store a results directory's first workflow created has a backup.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repexp import layout as L
from repexp.tracking import auth, health, server
from repexp.tracking.gitinfo import REPO_ROOT
from repexp.tracking.names import ENV_MLFLOW_PASSWORD, ENV_MLFLOW_URI, ENV_MLFLOW_USERNAME, PARENTS_LOG, mlflow_dir
from repexp.tracking.node import load_config, tracking_enabled
from repexp.tracking.outbox import pending_records
from repexp.tracking.store import is_sqlite, resolve_tracking_uri, sqlite_path

PARENTS_TIMEOUT_S = 300
_started_server = False
_server_store = None  # the store of the server this workflow used (on_start), for the closing pointers
_sqlite_store: Path | None = None  # the SQLite file this workflow's runs land in, checked at the start
_parents: subprocess.Popen | None = None  # `repexp mlflow parents` started beside the first jobs


def wants_server(cfg, non_local_exec: bool) -> bool:
    mode = cfg.tracking.server
    return mode == "on" or (mode == "auto" and non_local_exec and not cfg.tracking.tracking_uri
                            and not os.environ.get(ENV_MLFLOW_URI))


def sqlite_store(cfg, non_local_exec: bool) -> Path | None:
    """The SQLite file this workflow's runs land in: the server's backend when the workflow runs a
    server, else the resolved tracking URI; None for a server it does not run, or PostgreSQL etc."""
    if wants_server(cfg, non_local_exec):
        uri = cfg.tracking.server_store or server.default_store(cfg)
    else:
        uri = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    return sqlite_path(uri) if is_sqlite(uri) else None


def guard_store(cfg, db: Path) -> None:
    """Before any job: stop on a damaged or vanished store (SystemExit: Snakemake starts nothing),
    unless `tracking.new_store` asks for a new one; back a healthy store up."""
    found = health.problem(db, cfg.results_dir)
    if found is not None:
        if not cfg.tracking.new_store:
            hint = f'run the workflow again with --config set="{health.NEW_STORE_SETTING}"'
            print(f"repexp: {found.message(hint)}\n  No job was started.", file=sys.stderr)
            raise SystemExit(1)
        moved = health.start_fresh(db, cfg.results_dir)
        kept = f"; the damaged file is kept as {moved}" if moved else ""
        print(f"repexp: WARNING: tracking.new_store: a new, empty MLflow store at {db}{kept}; the runs of "
              "the old one are not in it", file=sys.stderr)
        return
    back_up(cfg, db)


def back_up(cfg, db: Path) -> None:
    """Record a healthy store in the ledger and back it up (when it changed since its newest backup);
    a store that is not healthy is left alone (the next start stops on it and says why)."""
    try:
        if health.problem(db, cfg.results_dir) is not None:
            return
        health.record_healthy(db, cfg.results_dir)
        health.backup(db, cfg.tracking.store_backups)
    except (OSError, health.sqlite3.Error) as err:  # a backup that fails never stops the science
        print(f"repexp: WARNING: no backup of the MLflow store {db}: {err}", file=sys.stderr)


def on_start(config_path: str | Path, non_local_exec: bool) -> None:
    global _started_server, _server_store, _sqlite_store
    if not tracking_enabled():
        return
    cfg = load_config(str(config_path))
    _sqlite_store = sqlite_store(cfg, non_local_exec)
    if _sqlite_store is not None:
        guard_store(cfg, _sqlite_store)
    if wants_server(cfg, non_local_exec):
        try:
            info = server.start(cfg, owner="workflow")
            _started_server = not info.get("reused")
            _server_store = info.get("backend_store_uri")
            what = "reusing" if info.get("reused") else "started"
            print(f"repexp: MLflow server {what}: {info['uri']} (store {info['backend_store_uri']}); "
                  f"jobs log there", file=sys.stderr)
        except auth.AuthError as err:  # access control asked for and impossible: no job logs unprotected
            print(f"repexp: {err}\n  No job was started.", file=sys.stderr)
            raise SystemExit(1) from None
        except (server.ServerStartError, OSError) as err:
            info = {"uri": getattr(err, "uri", None)}
            print(f"repexp: WARNING: the MLflow server did not start ({err}); nodes keep their records in "
                  f"{cfg.results_dir}/mlflow/outbox: start `repexp mlflow serve --config ...` and run "
                  "`repexp mlflow sync` later", file=sys.stderr)
        if info.get("uri"):
            os.environ[ENV_MLFLOW_URI] = info["uri"]  # local jobs inherit it; sbatch --export=ALL passes it on
            login = auth.load_credentials(cfg.results_dir) if cfg.tracking.server_auth else None
            if login:  # the same way: MLflow's MLFLOW_TRACKING_USERNAME/PASSWORD
                os.environ.update({ENV_MLFLOW_USERNAME: login["username"], ENV_MLFLOW_PASSWORD: login["password"]})
    create_parents(cfg, config_path)


def create_parents(cfg, config_path: str | Path) -> None:
    """`repexp mlflow parents` before the first job. A server store has no lock across hosts, so the
    workflow waits for it (seconds, once). A local SQLite store serialises parent creation under its
    file lock anyway, so there it runs beside the first jobs instead of delaying them."""
    global _parents
    command = [sys.executable, "-m", "repexp", "mlflow", "parents", "--config", str(config_path)]
    if is_sqlite(resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)):
        log_path = mlflow_dir(cfg.results_dir) / PARENTS_LOG
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            _parents = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        start_new_session=True)
        return
    try:
        subprocess.run(command, check=False, timeout=PARENTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print("repexp: creating MLflow parent runs timed out; nodes create their own", file=sys.stderr)


def on_end(config_path: str | Path, results_dir: str | Path) -> None:
    if _parents is not None:  # its runs belong in the end's backup
        try:
            _parents.wait(timeout=PARENTS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print("repexp: creating MLflow parent runs is still under way; the store's backup may lack them",
                  file=sys.stderr)
    if pending_records(results_dir):
        subprocess.run([sys.executable, "-m", "repexp", "mlflow", "sync", "--config", str(config_path), "--finished"],
                       check=False)
    if _started_server:
        server.stop(results_dir, owner="workflow")
    if _sqlite_store is not None:  # the ledger and a backup: also of a store created by this run's jobs
        back_up(load_config(str(config_path)), _sqlite_store)


def where_lines(cfg, results: Path, aggregate: Path, figures: Path, config: Path | None = None) -> list[str]:
    """The closing lines of a successful run: where the table, the figures and the MLflow records are
    (only what exists: a run of a single target may have built neither table nor figures). `config`
    (the run's config snapshot) makes the MLflow line the one command that opens the eval runs compared."""
    lines = []
    table = next((aggregate / name for name in (L.PASS_AT_K_MD, L.PASS_AT_K_CSV) if (aggregate / name).exists()), None)
    if table is not None:
        lines.append(f"  table:   {table}  (the CSV and HTML beside it)")
    if figures.is_dir() and any(figures.glob("*.png")):
        lines.append(f"  figures: {figures}/  ({len(list(figures.glob('*.png')))} PNG, each also as PDF)")
    if tracking_enabled():
        store = _server_store or resolve_tracking_uri(results, cfg.tracking.tracking_uri)

        served = store.startswith(("http://", "https://"))
        # the results directory's own server (this run's, or the one `repexp mlflow ui` starts) asks for its login;
        # where no server ran yet, the file does not exist: the first server writes it
        credentials = auth.credentials_file(results)
        if served:
            login = f"  (its login is in {credentials})" if auth.own_credentials(store, results) is not None else ""
        elif not cfg.tracking.server_auth:
            login = ""
        elif credentials.exists():
            login = f"  (the server it starts asks for the login in {credentials})"
        else:
            login = f"  (the server it starts asks for a login, which it writes to {credentials})"
        if config is not None:
            lines.append(f"  MLflow:  {ui_command(config)}   # the eval runs by pass@k, in the MLflow UI")
            lines.append(f"           (store {store}){login}")
        elif served:
            lines.append(f"  MLflow:  open {store}{login}")
        else:
            lines.append(f"  MLflow:  mlflow ui --backend-store-uri {store}   # then open http://127.0.0.1:5000")
    return ["repexp: done. Results:", *lines] if lines else []


def ui_command(config: Path) -> str:
    """`repexp mlflow ui --config <snapshot>`, run where this workflow ran: the snapshot's results_dir
    is relative to Snakemake's workdir (this process's cwd)."""
    here = Path.cwd()
    try:
        shown = Path(config).resolve().relative_to(here)
    except ValueError:
        shown = Path(config).resolve()
    command = f"repexp mlflow ui --config {shown}"
    return command if here == REPO_ROOT.resolve() else f"cd {here} && {command}"
