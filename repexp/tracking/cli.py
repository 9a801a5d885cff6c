"""`repexp mlflow sync | restore | parents | serve | ui | uri`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repexp.tracking import health, server, ui
from repexp.tracking.names import RESULTS_ID_FILE, mlflow_dir
from repexp.tracking.node import load_config
from repexp.tracking.outbox import pending_records, sync, sync_one
from repexp.tracking.parents import run_parents
from repexp.tracking.record import Record
from repexp.tracking.store import is_sqlite, resolve_tracking_uri, sqlite_path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("sync", help="upload records kept in <results>/mlflow/outbox while MLflow was unreachable")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG)")
    src.add_argument("--results-dir", type=Path, help="results directory holding mlflow/outbox")
    src.add_argument("--record", type=Path, help="only this record directory (<results>/mlflow/outbox/<id>)")
    s.add_argument("--tracking-uri", help="upload here instead of each record's own URI")
    s.add_argument("--finished", action="store_true",
                   help="no node of this results directory runs any more (the workflow's end): records of nodes "
                        "that never recorded their end are uploaded as KILLED")
    s.add_argument("--new-store", action="store_true",
                   help="where the SQLite store is damaged or gone, start a new, empty one (the damaged file is kept)")

    r = sub.add_parser("restore", help="put the newest healthy backup of a SQLite store in its place (the "
                                       "damaged file is kept beside it)")
    where = r.add_mutually_exclusive_group()
    where.add_argument("--store", help="the store, sqlite:///PATH (default: the config's tracking URI)")
    where.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG)")
    r.add_argument("--backup", type=Path, help="this backup file instead of the newest healthy one")

    p = sub.add_parser("parents", help="create every parent run of a config (the workflow does it at its start)")

    v = sub.add_parser("serve", help="run the MLflow tracking server of a results directory on this host")
    action = v.add_mutually_exclusive_group()
    action.add_argument("--background", action="store_true", help="start, wait until healthy, print the URI, return")
    action.add_argument("--stop", action="store_true", help="stop the server recorded in <results>/mlflow/server.json")
    v.add_argument("--store", help="backend store URI (default: tracking.server_store, else SQLite on this host's "
                                   "local disk); e.g. the embedded store of a local run, to browse it")

    b = sub.add_parser("ui", help="print (and with --open, open) the link to the MLflow UI's runs table of the eval "
                                  "runs, sorted by the headline pass@k with task, method, seed and the methods' "
                                  "parameters shown; starts the results directory's server unless one runs")
    b.add_argument("--open", action="store_true", help="also open the link in this host's web browser")
    b.add_argument("--store", help="backend store URI, if a server is started (default: the results directory's "
                                   "SQLite store if it exists, else the one `repexp mlflow serve` opens)")
    for serving, started, workers in ((v, "", 2), (b, ", if a server is started", 1)):
        serving.add_argument("--host", help=f"interface to bind{started} (default: tracking.server_host)")
        serving.add_argument("--port", type=int, help=f"port{started} (default: tracking.server_port; 0 = a free port)")
        serving.add_argument("--workers", type=int, default=workers,
                             help=f"uvicorn workers{started} (default {workers})")

    u = sub.add_parser("uri", help="print the tracking URI of a config (for `mlflow ui --backend-store-uri`)")
    for takes_config in (p, v, b, u):
        takes_config.add_argument("--config", type=Path, help="pipeline config (default: $REPEXP_CONFIG)")


def run(args: argparse.Namespace) -> int:
    from repexp import config as C

    try:
        return {"uri": _uri, "sync": _sync, "restore": _restore, "parents": _parents, "serve": _serve,
                "ui": _ui}[args.action](args)
    except (C.ConfigError, ValueError, FileNotFoundError) as err:
        print(f"mlflow {args.action}: {err}", file=sys.stderr)
        return 2
    except (server.ServerStartError, server.auth.AuthError) as err:  # serve, ui
        print(f"mlflow {args.action}: {err}", file=sys.stderr)
        return 1


def _uri(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    print(resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri))
    return 0


def _parents(args: argparse.Namespace) -> int:
    return run_parents(load_config(args.config))


def _sync(args: argparse.Namespace) -> int:
    if args.record:
        results_dir = Path(args.record).resolve().parent.parent.parent  # <results>/mlflow/outbox/<id>
    else:
        results_dir = args.results_dir or load_config(args.config).results_dir
    uris = sync_targets(results_dir, args.record, args.tracking_uri)
    # a damaged or vanished store is never written to (MLflow would start an empty one)
    for uri in filter(is_sqlite, uris):
        found = health.problem(sqlite_path(uri), results_dir)
        if found is None:
            continue
        if not args.new_store:
            print(f"mlflow sync: {found.message('repexp mlflow sync --new-store ...')}\n  Nothing was uploaded.",
                  file=sys.stderr)
            return 1
        moved = health.start_fresh(found.path, results_dir)
        print(f"mlflow sync: a new, empty store at {found.path}" + (f" (the damaged file is {moved})" if moved else ""),
              file=sys.stderr)
    running: list[str] = []
    if args.record:
        synced, errors = sync_one(args.record, args.tracking_uri)
    else:
        synced, errors = sync(results_dir, args.tracking_uri, finished=args.finished, running=running)
    for line in errors:
        print(f"mlflow sync: kept {line}", file=sys.stderr)
    if running:
        print(f"mlflow sync: {len(running)} record(s) of nodes that may still be running were left for later "
              "(once the workflow has ended, `repexp mlflow sync --finished` uploads them)", file=sys.stderr)
    print(f"mlflow sync: {synced} record(s) uploaded, {len(errors)} still pending "
          f"(store{'s' if len(uris) > 1 else ''}: {', '.join(uris) or 'none'})", file=sys.stderr)
    if errors:
        print(f"mlflow sync: {sync_fix(errors, uris, mlflow_dir(results_dir))}", file=sys.stderr)
    return 1 if errors else 0


def sync_targets(results_dir, record, tracking_uri) -> list[str]:
    """The store URIs the pending records go to (each record names its own unless --tracking-uri)."""
    if tracking_uri:
        return [tracking_uri]
    uris = []
    for directory in ([Path(record)] if record else pending_records(results_dir)):
        try:
            uris.append(Record.load(directory).tracking_uri)
        except (OSError, ValueError, TypeError, KeyError):
            continue  # an unreadable record is reported by the sync itself
    return sorted(set(uris))


def sync_fix(errors: list[str], uris: list[str], mlflow_root: Path) -> str:
    """What to do about records that stayed pending, by what went wrong."""
    text = " ".join(errors)
    if "malformed" in text or "not a database" in text or "DatabaseError" in text:
        return ("the SQLite store is damaged: `repexp mlflow restore --store URI` puts its newest backup in place, "
                "or `repexp mlflow sync --new-store` starts an empty one; then sync again")
    if "refused a request without credentials" in text or "refused the credentials" in text:
        return (f"the tracking server requires a login: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
                f"sync against this results directory's own server (its login is in {mlflow_root / 'credentials.json'}"
                "); the records stay in the outbox until then")
    if "Connection" in text or "answered HTTP" in text or "unreachable" in text or "URLError" in text:
        return ("the tracking server does not answer: start it (`repexp mlflow serve --config CFG --background`) "
                "or pass --tracking-uri, then sync again")
    return (f"the records stay in {mlflow_root / 'outbox'} (nothing is lost); fix the cause named above for "
            f"{', '.join(uris) or 'the store'} and sync again")


def _restore(args: argparse.Namespace) -> int:
    results_dir = None
    if args.store:
        uri = args.store
    else:
        cfg = load_config(args.config)
        results_dir = cfg.results_dir
        uri = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    if not is_sqlite(uri):
        raise ValueError(f"{uri}: only a SQLite store (sqlite:///PATH) has repexp's backups; pass --store")
    path = sqlite_path(uri)
    if results_dir is None and path.parent.name == "mlflow":
        results_dir = path.parent.parent  # the default store: <results>/mlflow/mlflow.db
    used, runs, moved = health.restore(path, results_dir, args.backup)
    kept = f"; the file it replaced is {moved}" if moved else ""
    print(f"mlflow restore: {path} is now the backup {used} ({runs} runs){kept}. Runs logged after the backup "
          "are not in it; records still in the outbox are (`repexp mlflow sync`).", file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.stop:
        stopped = server.stop(cfg.results_dir)
        print("mlflow serve: stopped" if stopped else "mlflow serve: no server of this host to stop", file=sys.stderr)
        return 0
    # with --store it shows a store (a local run's); without, it is the server jobs log to
    info = server.start(cfg, owner="user", host=args.host, port=args.port, store=args.store, workers=args.workers,
                        for_jobs=args.store is None)
    if not args.background:
        return server.serve_foreground(cfg, info)
    print(info["uri"])
    login = f"; its login is in {info['credentials']}" if info.get("credentials") else ""
    print(f"mlflow serve: {'already running' if info.get('reused') else 'started'} (pid {info['pid']}, store "
          f"{info['backend_store_uri']}{login}); stop with `{_stop_command(args)}`", file=sys.stderr)
    return 0


def _stop_command(args: argparse.Namespace) -> str:
    """The command that stops the server just started, runnable as printed (the config as it was given)."""
    import shlex

    return "repexp mlflow serve" + (f" --config {shlex.quote(str(args.config))}" if args.config else "") + " --stop"


def _ui(args: argparse.Namespace) -> int:
    """The link to the eval runs compared (repexp.tracking.ui), on the config's tracking server or
    on the results directory's own (reused when it runs, else started in the background)."""
    cfg = load_config(args.config)
    records = mlflow_dir(cfg.results_dir)
    if not records.is_dir():
        raise FileNotFoundError(f"{records}: no MLflow records of this results directory (run the workflow first)")
    configured = resolve_tracking_uri(cfg.results_dir, cfg.tracking.tracking_uri)
    if args.store is None and configured.startswith(("http://", "https://")):
        uri, how = configured, "the config's tracking server"
    else:
        # A local run's runs are in <results>/mlflow/mlflow.db; a cluster run's in the server's store.
        store = args.store or (configured if is_sqlite(configured) and sqlite_path(configured).exists() else None)
        info = server.start(cfg, owner="user", host=args.host, port=args.port, store=store, workers=args.workers,
                            for_jobs=False)
        uri = info["uri"]
        login = f"; the browser asks for the login in {info['credentials']}" if info.get("credentials") else ""
        how = (f"{'already running' if info.get('reused') else 'started'} (pid {info['pid']}, store "
               f"{info['backend_store_uri']}{login}); stop with `{_stop_command(args)}`")
    id_file = records / RESULTS_ID_FILE
    results = id_file.read_text().strip() if id_file.exists() else None
    metric = ui.headline_metric(cfg)
    try:
        with server.auth.client_credentials(uri, cfg.results_dir):  # the results directory's server asks for its login
            url, table = ui.publish_view(uri, cfg.tracking.experiment or cfg.name, metric, results, ui.columns(cfg),
                                         ui.curve_metrics(cfg), ui.headline_metrics(cfg))
    except ValueError as err:
        print(f"mlflow ui: {err}", file=sys.stderr)
        return 1
    url, table = server.browser_link(url), server.browser_link(table)
    print(url)
    print(f"mlflow ui: the eval runs' pass@k against k, then {metric} and the other headline metrics (saved view "
          f"of the experiment; the same runs as a table, by {metric}: {table}); server {how}", file=sys.stderr)
    if args.open:
        import webbrowser

        if not webbrowser.open(url):
            print("mlflow ui: no web browser on this host; open the link above", file=sys.stderr)
    return 0
