"""`repexp mlflow serve`: the tracking server of a results directory, on the host that runs Snakemake.

On a cluster every job logs over HTTP to one `mlflow server` on the submit host; only that
server opens the backend store, which lives on the submit host's local disk (SQLite by default,
or `tracking.server_store`, e.g. PostgreSQL). SQLite on the shared filesystem that every compute
node sees is never the cluster default: its POSIX locks and WAL are unreliable on NFS/Lustre
(docs/tracking.md). Artifacts go to `<results>/mlflow/artifacts` through the server.

The server requires a login (`tracking.server_auth`, default true; repexp.tracking.auth) and binds the
address this host's name resolves to, the one jobs are given (`tracking.server_host: auto`), not every
interface. `<results>/mlflow/server.json` records the running server (URI, pid, host, store); the
workflow starts and stops one as repexp.tracking.workflow says.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Optional

from repexp.io import read_json, write_json_atomic
from repexp.tracking import auth
from repexp.tracking.names import ARTIFACTS_DIR, AUTH_DB_FILE, DB_FILE, SERVER_FILE, SERVER_LOG, mlflow_dir, results_id
from repexp.tracking.store import is_sqlite, reachable, sqlite_path

START_TIMEOUT_S = 300.0  # `mlflow server` took 20-40 s to answer /health on a loaded 2-core machine
STOP_TIMEOUT_S = 20.0
DEFAULT_WORKERS = 2
LOCAL_STORE_ROOT = Path("/var/tmp")  # local disk on the submit host (not the shared results filesystem)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
AUTO_HOST = "auto"  # tracking.server_host: the address this host's name resolves to
# The name links to a loopback server use: browsers resolve every `*.localhost` name to loopback
# (RFC 6761), and MLflow's UI (3.17.2, main.*.js `isLocalServer`) opens its Assistant panel by itself on
# first load only where the page's host name is exactly localhost, 127.0.0.1 or ::1: there it would take
# a third of a 1440-pixel screen from the runs
BROWSER_LOOPBACK_NAME = "repexp.localhost"
# MLflow's own allowed Host names of a loopback server (mlflow.server.security_utils.get_default_allowed_hosts)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")


class ServerStartError(RuntimeError):
    """The server did not answer /health; `uri` is where it should have (jobs keep records for it)."""

    def __init__(self, message: str, uri: str):
        super().__init__(message)
        self.uri = uri


def server_file(results_dir: str | os.PathLike) -> Path:
    return mlflow_dir(results_dir) / SERVER_FILE


def default_store(cfg) -> str:
    """SQLite on the submit host's local disk: /var/tmp/repexp-mlflow-<user>/<name>-<results id>/mlflow.db."""
    directory = LOCAL_STORE_ROOT / f"repexp-mlflow-{getpass.getuser()}" / f"{cfg.name}-{results_id(cfg.results_dir)}"
    return f"sqlite:///{directory / DB_FILE}"


def private_store_dir(directory: Path) -> Path:
    """The SQLite store's directory, readable by its owner only (under /var/tmp with the default
    umask, any user of the login node could read the experiment's history). The
    per-user directory of the default store is made private too; an existing one is tightened."""
    directory.mkdir(parents=True, exist_ok=True)
    private = [directory]
    if directory.parent.name.startswith("repexp-mlflow-"):
        private.append(directory.parent)
    for path in private:
        if path.stat().st_uid == os.getuid():
            path.chmod(0o700)
    return directory


def _host_address(fallback: str) -> str:
    """The address this host's name resolves to, else `fallback`."""
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:
        return fallback


def bind_address(server_host: str) -> str:
    """The interface to bind for `tracking.server_host`. `auto`: the address this host's name
    resolves to, which advertised_host gives jobs, so the server listens where jobs reach it and
    on no other interface of a login node; every interface only where the name does not resolve."""
    return _host_address("0.0.0.0") if server_host == AUTO_HOST else server_host


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def advertised_host(bind_host: str) -> str:
    """How jobs reach a server bound to `bind_host`: this host's address when bound to every
    interface (an IP: MLflow refuses unknown Host names unless allowed)."""
    return _host_address(socket.gethostname()) if bind_host in WILDCARD_HOSTS else bind_host


def allowed_hosts(bind_host: str, public: str) -> Optional[str]:
    """`--allowed-hosts` for a server other hosts reach: this host's names and addresses, and
    private networks (MLflow's own default covers localhost and private IPs only)."""
    if is_loopback(bind_host):  # MLflow's own list, and the name links use (BROWSER_LOOPBACK_NAME)
        names = (*LOOPBACK_HOSTS, BROWSER_LOOPBACK_NAME)
        return ",".join(p for name in names for p in (name, f"{name.replace('[', '[[]', 1)}:*"))
    names = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn(), public}
    patterns = {p for name in names if name for p in (name, f"{name}:*")} | {"10.*", "192.168.*", "172.*"}
    return ",".join(sorted(patterns))


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1" if host in WILDCARD_HOSTS else host, 0))
        return sock.getsockname()[1]


def _server_info(results_dir: str | os.PathLike) -> Optional[dict]:
    try:
        return read_json(server_file(results_dir))
    except (OSError, ValueError):
        return None


def running_server(results_dir: str | os.PathLike) -> Optional[dict]:
    """server.json of a server of this results directory that answers /health, else None. A server.json
    copied with the results directory names the original's server, which serves the original's artifacts."""
    info = _server_info(results_dir)
    if not info or info.get("artifacts_destination") != str(artifacts_dir(results_dir)):
        return None
    return info if reachable(info.get("uri", ""), timeout_s=5, login=False) is None else None


def artifacts_dir(results_dir: str | os.PathLike) -> Path:
    """Where the server keeps and serves the artifacts (`mlflow-artifacts:` URIs resolve below it)."""
    return (mlflow_dir(results_dir) / ARTIFACTS_DIR).resolve()


def browser_link(uri: str) -> str:
    """`uri` as a browser should open it: a loopback server by BROWSER_LOOPBACK_NAME."""
    parts = urllib.parse.urlsplit(uri)
    if parts.hostname and is_loopback(parts.hostname):
        parts = parts._replace(netloc=f"{BROWSER_LOOPBACK_NAME}:{parts.port}" if parts.port else BROWSER_LOOPBACK_NAME)
    return urllib.parse.urlunsplit(parts)


def start(cfg, *, host: Optional[str] = None, port: Optional[int] = None, store: Optional[str] = None,
          workers: int = DEFAULT_WORKERS, owner: str = "user", timeout_s: float = START_TIMEOUT_S,
          for_jobs: bool = True) -> dict:
    """Start `mlflow server` in its own session, wait for /health, write server.json. A server that
    already runs for this results directory is reused (its server.json is returned unchanged).

    With `tracking.server_auth` (the default) the server runs MLflow's basic-auth app; without the
    Flask-WTF package that needs, auth.AuthError is raised before anything starts. `for_jobs`: jobs log to
    it (a loopback address is then worth a warning); False for a server that only shows finished runs."""
    existing = running_server(cfg.results_dir)
    if existing:
        return {**existing, "reused": True}
    if cfg.tracking.server_auth and auth.unavailable():
        raise auth.AuthError(auth.unavailable())
    asked = host if host is not None else cfg.tracking.server_host
    host = bind_address(asked)
    if for_jobs and asked == AUTO_HOST and is_loopback(host):
        print(f"repexp: WARNING: tracking.server_host: auto: this host's name resolves to {host}; jobs on other "
              "hosts cannot reach the MLflow server there: set tracking.server_host to the address they use",
              file=sys.stderr)
    port = port or cfg.tracking.server_port or free_port(host)
    store = store or cfg.tracking.server_store or default_store(cfg)
    if is_sqlite(store):
        private_store_dir(sqlite_path(store).parent)
    login_env: dict[str, str] = {}
    if cfg.tracking.server_auth:
        credentials, created = auth.ensure_credentials(cfg.results_dir)
        # the app's users DB stays on this host's private local directory, beside the default store
        private = private_store_dir(sqlite_path(default_store(cfg)).parent)
        login_env = auth.server_env(cfg.results_dir, private, created)
    artifacts = artifacts_dir(cfg.results_dir)
    artifacts.mkdir(parents=True, exist_ok=True)
    public = advertised_host(host)
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
               "--artifacts-destination", str(artifacts), "--host", host, "--port", str(port),
               "--workers", str(workers)]
    if login_env:
        command += ["--app-name", "basic-auth"]
    allowed = allowed_hosts(host, public)
    if allowed:
        command += ["--allowed-hosts", allowed]
    if is_loopback(host):  # the origins the UI's pages send with their POSTs (browser_link's and MLflow's own)
        command += ["--cors-allowed-origins", ",".join(f"http://{name}:{port}" for name in (
            BROWSER_LOOPBACK_NAME, "localhost", "127.0.0.1", "[::1]", host))]
    # MLflow's job runner (GenAI jobs) is not used by the pipeline: 7 fewer processes on the submit host
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, **login_env}
    log_path = mlflow_dir(cfg.results_dir) / SERVER_LOG
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=mlflow_dir(cfg.results_dir))
    uri = f"http://{public}:{port}"
    deadline = time.monotonic() + timeout_s
    while reachable(uri, timeout_s=5, login=False) is not None:  # /health: open without a login
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited {proc.returncode}" if proc.poll() is not None else f"no answer in {timeout_s:.0f} s"
            _stop_group(proc.pid)
            tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
            raise ServerStartError(f"mlflow server on {host}:{port} did not become healthy ({why}); "
                                   f"log {log_path}:\n{tail}", uri)
        time.sleep(0.5)
    if login_env:
        auth.record_uri(cfg.results_dir, uri)
        why = auth.refused(uri, login=(credentials["username"], credentials["password"]))
        if why:  # a users DB whose admin has another password (changed through MLflow's API)
            _stop_group(proc.pid)
            raise ServerStartError(f"{why}: the server's users DB {private / AUTH_DB_FILE} holds another password "
                                   "for that user; remove that file and start again", uri)
    info = {"uri": uri, "pid": proc.pid, "host": socket.gethostname(), "bind": host, "port": port,
            "backend_store_uri": store, "artifacts_destination": str(artifacts), "owner": owner,
            "log": str(log_path), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "credentials": str(auth.credentials_file(cfg.results_dir)) if login_env else None}
    write_json_atomic(server_file(cfg.results_dir), info)
    return info


def stop(results_dir: str | os.PathLike, *, owner: Optional[str] = None) -> bool:
    """Stop the server recorded in server.json (only on the host that started it, and with
    `owner`, only a server of that owner). True if one was stopped."""
    info = _server_info(results_dir)
    if not info or info.get("host") != socket.gethostname() or (owner is not None and info.get("owner") != owner):
        return False
    stopped = _stop_group(int(info["pid"]))
    server_file(results_dir).unlink(missing_ok=True)
    return stopped


def _stop_group(pid: int) -> bool:
    """SIGTERM the server's session (uvicorn and its workers), SIGKILL what is left after a while."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        _reap(pid)
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def serve_foreground(cfg, info: dict) -> int:
    """Watch the server `start` gave (`info`) until Ctrl-C, then stop it."""
    if info.get("reused"):
        print(f"mlflow serve: already running at {info['uri']} (pid {info['pid']} on {info['host']})")
        return 0
    login = (f"; log in as {auth.load_credentials(cfg.results_dir)['username']!r}, the password is in "
             f"{info['credentials']}" if info.get("credentials") else "")
    print(f"mlflow serve: {info['uri']} (store {info['backend_store_uri']}, artifacts "
          f"{info['artifacts_destination']}{login}); Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(1)
            try:
                os.killpg(info["pid"], 0)
            except ProcessLookupError:
                print("mlflow serve: the server exited; see " + info["log"], file=sys.stderr)
                server_file(cfg.results_dir).unlink(missing_ok=True)
                return 1
    except KeyboardInterrupt:
        pass
    stop(cfg.results_dir)
    return 0
