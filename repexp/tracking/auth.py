"""Access control of the workflow's MLflow server: MLflow's own basic-auth app.

Without it, anyone who reaches the submit host could list, edit or delete the runs through the REST
API. So the server `repexp mlflow serve` starts (the workflow's too) runs `--app-name basic-auth`:

- one admin login per results directory in `<results>/mlflow/credentials.json`, 0600 from its first
  byte, on the shared filesystem: the same user's jobs and syncs find it, other users cannot read it;
- the app's config (`default_permission = NO_PERMISSIONS`) and users DB live in the server's private
  local directory (0700); the password and Flask secret reach the server through its environment,
  never its command line (which `ps` shows every user);
- clients use MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (the workflow exports them to its
  jobs); where unset, the credentials file is used, but only for a URI this results directory's
  server was started at, so the password never goes to a server configured elsewhere.

No MLflow import here (the workflow's main process and nodes' checks use it).
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import importlib.util
import json
import os
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from repexp.io import atomic_path, read_json
from repexp.tracking.names import (
    AUTH_CONFIG_FILE,
    AUTH_DB_FILE,
    CREDENTIALS_FILE,
    ENV_MLFLOW_PASSWORD,
    ENV_MLFLOW_USERNAME,
    create_once,
    mlflow_dir,
)

AUTH_SETTING = "tracking.server_auth"
AUTH_PACKAGE = "flask_wtf"  # MLflow's basic-auth app refuses to load without it (the `mlflow[auth]` extra)
PROBE_TIMEOUT_S = 5.0
KEPT_URIS = 50  # a free port each start: the newest ones are the servers records can still point at
# A cheap authenticated read: the basic-auth app protects every API route (/health stays open)
PROBE_PATH = "/api/2.0/mlflow/experiments/search?max_results=1"
INI = """\
# Written by repexp (repexp/tracking/auth.py) for the MLflow server of {results}.
# The admin's password and the Flask secret come from the server's environment, not this file.
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = sqlite:///{db}
admin_username = {user}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
"""


class AuthError(RuntimeError):
    """The server cannot be started with access control (stops the workflow before any job)."""


def unavailable() -> Optional[str]:
    """None where MLflow's basic-auth app can run in this Python, else what is missing (one line)."""
    if importlib.util.find_spec(AUTH_PACKAGE) is None:
        return (f"the MLflow server (tracking.server) requires credentials ({AUTH_SETTING}: true), and MLflow's "
                f"basic-auth app needs the Flask-WTF package, which {sys.executable} lacks: install it "
                "(pip install 'mlflow[auth]==3.17.2', part of repexp's `workflow` extra), or set "
                f"{AUTH_SETTING}=false to run the server without access control (anyone who reaches it can "
                "edit or delete the runs)")
    return None


def credentials_file(results_dir: str | os.PathLike) -> Path:
    return mlflow_dir(results_dir) / CREDENTIALS_FILE


def _write_private(path: Path, text: str) -> None:
    """Create `path` readable by its owner only: the mode is set when the file is created, so no
    moment exists in which the umask's bits would let another user open it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the umask may have taken bits away; never added any
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def load_credentials(results_dir: str | os.PathLike) -> Optional[dict]:
    """The results directory's credentials, or None where there are none (yet). A file another
    user could read (copied with the default umask) is made 0600 again."""
    path = credentials_file(results_dir)
    try:
        found = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise AuthError(f"{path}: unreadable credentials ({err}); remove it and start the server again "
                        "(new credentials are created)") from None
    if not isinstance(found, dict) or not all(isinstance(found.get(k), str) for k in ("username", "password",
                                                                                       "secret_key")):
        raise AuthError(f"{path}: not a repexp credentials file (username, password, secret_key); remove it and "
                        "start the server again (new credentials are created)")
    with contextlib.suppress(OSError):
        if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
    return found


def ensure_credentials(results_dir: str | os.PathLike) -> tuple[dict, bool]:
    """The results directory's credentials, created on first use; (credentials, created now).

    `os.link` makes the creation atomic (as results_id's): two servers started at once for one
    results directory agree on one password."""
    found = load_credentials(results_dir)
    if found is not None:
        return found, False
    path = credentials_file(results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = {"username": getpass.getuser(), "password": secrets.token_urlsafe(32),
             "secret_key": secrets.token_urlsafe(32), "uris": []}
    created = create_once(path, lambda tmp: _write_private(tmp, json.dumps(fresh, indent=2) + "\n"))
    return load_credentials(results_dir), created


def record_uri(results_dir: str | os.PathLike, uri: str) -> None:
    """Remember that this results directory's server answers at `uri` (the credentials file's
    `uris`): only those URIs get its credentials from the file."""
    found = load_credentials(results_dir)
    if found is not None and uri not in found.get("uris", []):
        found["uris"] = [*found.get("uris", []), uri][-KEPT_URIS:]
        with atomic_path(credentials_file(results_dir)) as tmp:
            _write_private(tmp, json.dumps(found, indent=2) + "\n")


def server_env(results_dir: str | os.PathLike, private_dir: Path, created: bool) -> dict[str, str]:
    """What `mlflow server --app-name basic-auth` needs: its INI (0600) and users DB in the server's
    private directory, the admin's login and the Flask secret in the environment."""
    found = load_credentials(results_dir)
    config = private_dir / AUTH_CONFIG_FILE
    users_db = private_dir / AUTH_DB_FILE
    if created:
        # The app only sets the admin's password when it creates the user: a users DB left by
        # credentials that are gone would refuse the new ones.
        users_db.unlink(missing_ok=True)
    config.unlink(missing_ok=True)
    _write_private(config, INI.format(results=Path(results_dir).resolve(), db=users_db, user=found["username"]))
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_USERNAME": found["username"],
            "MLFLOW_AUTH_ADMIN_PASSWORD": found["password"], "MLFLOW_FLASK_SERVER_SECRET_KEY": found["secret_key"]}


def own_credentials(uri: str, results_dir: Optional[str | os.PathLike]) -> Optional[dict]:
    """The results directory's credentials where its own server was started at `uri`, else None."""
    try:
        found = load_credentials(results_dir) if results_dir is not None else None
    except AuthError:
        return None
    served = {u.rstrip("/") for u in (found or {}).get("uris", [])}
    return found if uri.rstrip("/") in served else None


def credentials_for(uri: str, results_dir: Optional[str | os.PathLike]) -> Optional[tuple[str, str]]:
    """The login a client sends to `uri`: MLflow's variables where set, else the results
    directory's own credentials for a URI its server was started at."""
    if os.environ.get(ENV_MLFLOW_USERNAME):
        return os.environ[ENV_MLFLOW_USERNAME], os.environ.get(ENV_MLFLOW_PASSWORD, "")
    found = own_credentials(uri, results_dir)
    return (found["username"], found["password"]) if found else None


def use_results_login(uri: str, results_dir: Optional[str | os.PathLike]) -> None:
    """In a process that talks to one store only (a node): MLflow's variables from the results
    directory's credentials file where they are unset and `uri` is its server."""
    login = None if os.environ.get(ENV_MLFLOW_USERNAME) else credentials_for(uri, results_dir)
    if login is not None:
        os.environ[ENV_MLFLOW_USERNAME], os.environ[ENV_MLFLOW_PASSWORD] = login


@contextlib.contextmanager
def client_credentials(uri: str, results_dir: Optional[str | os.PathLike]) -> Iterator[None]:
    """MLflow's client reads MLFLOW_TRACKING_USERNAME/PASSWORD at every request: set them from the
    credentials file for the results directory's own server while the block runs, where the
    environment has none (a `repexp mlflow sync` by hand)."""
    preset = os.environ.get(ENV_MLFLOW_USERNAME)
    use_results_login(uri, results_dir)
    try:
        yield
    finally:
        if not preset and os.environ.get(ENV_MLFLOW_USERNAME):
            os.environ.pop(ENV_MLFLOW_USERNAME, None)
            os.environ.pop(ENV_MLFLOW_PASSWORD, None)


def refused(uri: str, results_dir: Optional[str | os.PathLike] = None,
            login: Optional[tuple[str, str]] = None, timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why a server whose /health answers refuses this client (HTTP 401/403), else None.

    One authenticated read, with the login the client would send (`login`, else
    `credentials_for`). Any other failure is left to MLflow's own calls to report."""
    login = login or credentials_for(uri, results_dir)
    request = urllib.request.Request(uri.rstrip("/") + PROBE_PATH)
    if login is not None:
        token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as err:
        if err.code not in (401, 403):
            return None
        status = f"HTTP {err.code} {err.reason}"
    except (urllib.error.URLError, OSError, ValueError):
        return None
    where = f"; this results directory's server takes the login in {credentials_file(results_dir)}" \
        if results_dir is not None else ""
    if login is None:
        return (f"{uri} refused a request without credentials ({status}): the server requires a login; set "
                f"{ENV_MLFLOW_USERNAME} and {ENV_MLFLOW_PASSWORD}{where}")
    return f"{uri} refused the credentials of user {login[0]!r} ({status}){where}"
