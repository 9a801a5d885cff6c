"""The workflow's MLflow server requires a login, and its store is its owner's alone (issue 27, item 5).

One real `mlflow server` for the module, started by `repexp mlflow serve --background` (the code
path of the workflow's onstart: repexp.tracking.server.start) with MLflow's basic-auth app; real
HTTP requests, real nodes and `repexp mlflow sync`, and a second Unix user created for the test.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from repexp import tracking as T
from repexp.tracking import health, server, workflow
from repexp.tracking.names import AUTH_CONFIG_FILE, AUTH_DB_FILE

BIN = Path(sys.executable).parent
REPEXP = str(BIN / "repexp")
LOGIN_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=100"


def _env(**extra) -> dict:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key in ("MLFLOW_TRACKING_URI", T.ENV_TRACKING, *LOGIN_VARS):
        env.pop(key, None)
    return {**env, **extra}


def _repexp(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([REPEXP, *args], capture_output=True, text=True, env=_env(**env), timeout=300)


def _config(path: Path, results: Path, **tracking) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "auth-test", "results_dir": str(results), "model": "tiny",
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8], "betas": [0.01], "seeds": [42]},
        "tracking": {"server": "on", "server_host": "127.0.0.1", **tracking}}))
    return path


def _request(url: str, login: tuple[str, str] | None = None, payload: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=None if payload is None else json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def served():
    """The results directory's server with its defaults (`tracking.server_auth: true`), on loopback.
    The results directory is world-traversable (0755, as a shared filesystem's usually is), so only
    the files' own modes keep a second user out."""
    base = Path(tempfile.mkdtemp(prefix="repexp-auth-"))
    base.chmod(0o755)
    results = base / "results"
    cfg = _config(base / "cfg.yaml", results)
    proc = _repexp("mlflow", "serve", "--config", str(cfg), "--background", "--workers", "1")
    info = json.loads((results / "mlflow" / "server.json").read_text()) if proc.returncode == 0 else {}
    store = Path(info.get("backend_store_uri", "sqlite:///")[len("sqlite:///"):])
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        credentials = json.loads((results / "mlflow" / "credentials.json").read_text())
        yield SimpleNamespace(cfg=cfg, results=results, uri=proc.stdout.split()[0], store=store, info=info,
                              login=(credentials["username"], credentials["password"]))
    finally:
        _repexp("mlflow", "serve", "--config", str(cfg), "--stop")
        shutil.rmtree(base, ignore_errors=True)
        if store.name:
            shutil.rmtree(store.parent, ignore_errors=True)  # /var/tmp/repexp-mlflow-<user>/auth-test-<id>


@pytest.fixture
def no_login(monkeypatch):
    """No MLflow variables in this process; whatever a test (or on_start) sets is undone after it."""
    for key in ("MLFLOW_TRACKING_URI", T.ENV_TRACKING, *LOGIN_VARS):
        monkeypatch.setenv(key, "unset")  # recorded as absent before: undone by deleting it
        monkeypatch.delenv(key)
    return monkeypatch


def _experiment_runs(uri: str, login: tuple[str, str]) -> list[dict]:
    status, body = _request(f"{uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name=auth-test", login)
    assert status == 200, body
    experiment_id = json.loads(body)["experiment"]["experiment_id"]
    status, body = _request(f"{uri}/api/2.0/mlflow/runs/search", login,
                            {"experiment_ids": [experiment_id], "max_results": 1000})
    assert status == 200, body
    return json.loads(body).get("runs", [])


def test_requests_without_the_login_are_refused_and_jobs_with_it_lose_nothing(served, no_login, capsys):
    # the login: 0600 in the results directory; the app's config and users DB in the private store directory
    credentials = served.results / "mlflow" / "credentials.json"
    assert _mode(credentials) == 0o600
    assert _mode(served.store.parent) == _mode(served.store.parent.parent) == 0o700
    assert _mode(served.store.parent / AUTH_CONFIG_FILE) == 0o600 and (served.store.parent / AUTH_DB_FILE).exists()
    assert served.info["bind"] == "127.0.0.1" and served.info["credentials"] == str(credentials)
    assert served.login[1] not in (served.results / "mlflow" / "server.json").read_text()

    # plain HTTP without the login: refused, reading and writing alike; /health stays open for the health checks
    assert _request(f"{served.uri}/health")[0] == 200
    status, body = _request(served.uri + SEARCH)
    assert status == 401 and "not authenticated" in body, body
    assert _request(f"{served.uri}/api/2.0/mlflow/experiments/create", payload={"name": "intruder"})[0] == 401
    assert _request(served.uri + SEARCH, ("intruder", "guess"))[0] == 401
    status, body = _request(served.uri + SEARCH, served.login)
    assert status == 200 and "intruder" not in body, body

    # the workflow's start (onstart, as under SLURM) exports the URI and the login to its jobs
    workflow.on_start(served.cfg, non_local_exec=True)
    assert os.environ["MLFLOW_TRACKING_URI"] == served.uri
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == served.login
    assert "MLflow server reusing" in capsys.readouterr().err
    with T.node_run("eval", "gsm8k", "base", config=served.cfg) as node:
        node.log_metrics({"pass_at_1": 0.5}, step=1)
    assert node.online, node.offline_reason
    runs = len(_experiment_runs(served.uri, served.login))
    assert runs >= 2  # the node's run and its parents (`repexp mlflow parents` logged in too)

    # a job with a wrong login: refused with a message that says so, its record kept in the outbox
    no_login.setenv("MLFLOW_TRACKING_USERNAME", "intruder")
    no_login.setenv("MLFLOW_TRACKING_PASSWORD", "guess")
    with T.node_run("eval", "gsm8k", "base", config=served.cfg) as refused:
        refused.log_metrics({"pass_at_1": 0.25}, step=1)
    assert not refused.online
    assert "refused the credentials of user 'intruder' (HTTP 401" in refused.offline_reason, refused.offline_reason
    assert str(credentials) in refused.offline_reason
    assert len(T.pending_records(served.results)) == 1

    sync = _repexp("mlflow", "sync", "--config", str(served.cfg), MLFLOW_TRACKING_USERNAME="intruder",
                   MLFLOW_TRACKING_PASSWORD="guess")
    assert sync.returncode == 1, sync.stderr
    assert "refused the credentials of user 'intruder'" in sync.stderr and "requires a login" in sync.stderr
    assert len(T.pending_records(served.results)) == 1  # nothing lost

    # a sync by hand (no MLflow variables) logs in with the results directory's credentials file
    sync = _repexp("mlflow", "sync", "--config", str(served.cfg))
    assert sync.returncode == 0 and "1 record(s) uploaded" in sync.stderr, sync.stderr
    assert T.pending_records(served.results) == []
    assert len(_experiment_runs(served.uri, served.login)) == runs + 1


def test_a_second_unix_user_can_read_neither_the_store_nor_the_login(served):
    """Issue 27, item 5, as the fault was found: another user of the login node. Created here, removed after."""
    if os.geteuid() != 0:
        pytest.skip("creating a second Unix user needs root")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("runuser")):
        pytest.skip("useradd/userdel/runuser (passwd, util-linux) are not installed")
    user = f"rx{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user], check=True, capture_output=True)
    try:
        login_file = served.results / "mlflow" / "credentials.json"
        for path in (served.store, served.store.parent / AUTH_DB_FILE, login_file):
            other = subprocess.run(["runuser", "-u", user, "--", "cat", str(path)], capture_output=True, text=True)
            assert other.returncode != 0 and "Permission denied" in other.stderr, (path, other)
        # the results directory stays readable to them (a shared filesystem's usual modes): the file's mode does it
        assert subprocess.run(["runuser", "-u", user, "--", "ls", str(login_file.parent)],
                              capture_output=True).returncode == 0
        # the server answers them, without a login, with a refusal
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        probe = ("import urllib.request, urllib.error, sys\n"
                 f"try: urllib.request.urlopen({served.uri + SEARCH!r}, timeout=30)\n"
                 "except urllib.error.HTTPError as err: sys.exit(err.code - 400)\n")
        other = subprocess.run(["runuser", "-u", user, "--", python, "-c", probe], capture_output=True, text=True)
        assert other.returncode == 1, other  # HTTP 401
    finally:
        subprocess.run(["userdel", user], capture_output=True)
    # nothing lost: the owner's store is whole and the server still takes the owner's login
    assert health.problem(served.store, served.results) is None
    assert _request(served.uri + SEARCH, served.login)[0] == 200


def test_without_flask_wtf_the_workflow_stops_before_any_job_naming_the_setting(tmp_path, monkeypatch, capsys):
    """The offline GPU stack had no Flask-WTF: the workflow's server cannot require a login there, so
    the workflow stops at its start instead of running jobs against an open server."""
    monkeypatch.setitem(sys.modules, "flask_wtf", None)  # an absent package, as importlib sees it
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(T.ENV_TRACKING, raising=False)
    results = tmp_path / "results"
    cfg = _config(tmp_path / "cfg.yaml", results, server_store=f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    with pytest.raises(SystemExit) as stop:
        workflow.on_start(cfg, non_local_exec=True)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "tracking.server_auth" in err and "Flask-WTF" in err and "No job was started" in err, err
    assert not (results / "mlflow" / "server.json").exists() and not (results / "mlflow" / "credentials.json").exists()
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_auto_binds_the_address_jobs_are_given_and_no_other_interface():
    import socket

    try:
        address = socket.gethostbyname(socket.getfqdn())
    except OSError:
        address = "0.0.0.0"
    assert server.bind_address("auto") == address
    assert server.advertised_host(server.bind_address("auto")) in (address, socket.gethostname())
    assert server.bind_address("10.1.2.3") == "10.1.2.3"
    # a cluster-facing address: MLflow must accept this host's names and the address in Host headers
    assert "10.1.2.3:*" in server.allowed_hosts("10.1.2.3", "10.1.2.3").split(",")
    # loopback: MLflow's own names and the one browser links use (server.browser_link)
    assert set(server.allowed_hosts("127.0.0.1", "127.0.0.1").split(",")) >= {
        "localhost:*", "127.0.0.1:*", f"{server.BROWSER_LOOPBACK_NAME}:*"}
