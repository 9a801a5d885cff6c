"""Fault injection through the real pipeline commands (docs/reliability.md lists each fault).

Every fault is produced for real: configs and data files are broken on disk, processes are
killed with SIGTERM/SIGKILL, the MLflow server is really absent and then really started,
non-finite hidden states come from a model whose weights are really poisoned. The
components' own unit tests cover their internals; these tests go through `snakemake` and the
`repexp` commands that the rules run.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _reliability_fixtures as fx  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)
import psutil
import pytest
import yaml

REPO, VENV_BIN, SNAKEMAKE, REPEXP, TEST_CONFIG = fx.REPO, fx.VENV_BIN, fx.SNAKEMAKE, fx.REPEXP, fx.TEST_CONFIG
quiet_env, run = fx.quiet_env, fx.run


def last_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def assert_clear_failure(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Non-zero exit and an error that names the problem (the file or key), not a library's guts."""
    output = proc.stderr + proc.stdout
    assert proc.returncode != 0, f"expected a failure, got exit 0:\n{output[-3000:]}"
    for needle in needles:
        assert needle in output, f"error does not name {needle!r}:\n{output[-3000:]}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def signal_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal a process and all its descendants at once, as SLURM does to a job at its time limit."""
    try:
        root = psutil.Process(proc.pid)
        targets = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for target in targets:
        try:
            target.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def load_test_config() -> dict:
    if not TEST_CONFIG.exists():
        pytest.fail(f"{TEST_CONFIG} missing (written by the workflow engineer)")
    return yaml.safe_load(TEST_CONFIG.read_text())


def deep_update(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def require(path: Path, owner: str) -> None:
    """A component this test drives is not there yet: fail (never fake it) and say which."""
    if not path.exists():
        pytest.fail(f"waiting on {path.relative_to(REPO)} ({owner})")


def snakefile() -> Path:
    path = REPO / "Snakefile"
    if not path.exists():
        path = REPO / "workflow" / "Snakefile"
    require(path, "workflow engineer: the Snakefile")
    return path


# --------------------------------------------------------------------------- bad configs

# name -> (patch applied to configs/test.yaml, the key path the error must name). Snakemake's schema
# check reports it as instance['train']['lr'], repexp.config as train.lr; either names the key.
BROKEN_CONFIGS = {
    "wrong_type_number": ({"train": {"lr": "fast"}}, ("train", "lr")),
    "wrong_type_list_item": ({"sweep": {"seeds": ["forty-two"]}}, ("sweep", "seeds", 0)),
    "wrong_type_mapping": ({"eval": [1, 2]}, ("eval",)),
    "below_minimum": ({"train": {"n_rollouts": 1}}, ("train", "n_rollouts")),
    "above_maximum": ({"eval": {"top_p": 1.5}}, ("eval", "top_p")),
    "non_positive_beta": ({"sweep": {"methods": {"repexp": {"beta": [-0.1]}}}},
                          ("sweep", "methods", "repexp", "beta", 0)),
    "legacy_non_positive_beta": ({"sweep": {"betas": [-0.1]}}, ("sweep", "methods", "repexp", "beta", 0)),
    "passk_k_above_n_rollouts": ({"sweep": {"methods": {"passk": {"passk_k": [3]}}}},
                                 ("sweep", "methods", "passk", "passk_k")),
    "unknown_method": ({"sweep": {"methods": {"ppo": {}}}}, ("sweep", "methods", "ppo")),
    "null_required": ({"train": {"total_epochs": None}}, ("train", "total_epochs")),
    "unknown_key": ({"train": {"learning_rate": 1e-5}}, ("train", "learning_rate")),
    "unknown_section": ({"trainer": {"lr": 1e-5}}, ("trainer",)),
    "unknown_task": ({"sweep": {"tasks": ["mathematics"]}}, ("sweep", "tasks", 0)),
    "unknown_resource_rule": ({"resources": {"trian": {"mem_mb": 1000}}}, ("resources", "trian")),
    "mini_batch_does_not_divide_batch": ({"train": {"train_batch_size": 4, "ppo_mini_batch_size": 3}},
                                         ("train", "ppo_mini_batch_size")),
    "validated_step_without_checkpoint": ({"train": {"test_freq": 3, "save_freq": 2}}, ("train", "save_freq")),
    "duplicate_sweep_values": ({"sweep": {"methods": {"repexp": {"beta": [0.01, 0.010]}}}},
                               ("sweep", "methods", "repexp", "beta")),
    "missing_data_dir": ({"data": {"source": "/nonexistent/repexp-data"}}, ("/nonexistent/repexp-data",)),
}


def names_key(output: str, key_path: tuple) -> bool:
    """True if the error names the key as `a.b[0]` (repexp.config) or `['a']['b'][0]` (jsonschema)."""
    dotted = ""
    for part in key_path:
        dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else str(part))
    bracketed = "".join(f"[{part}]" if isinstance(part, int) else f"['{part}']" for part in key_path)
    if dotted in output or bracketed in output:
        return True
    # jsonschema's additionalProperties error: "('learning_rate' was unexpected)" ... "On instance['train']"
    parent = "".join(f"[{part}]" if isinstance(part, int) else f"['{part}']" for part in key_path[:-1])
    return f"'{key_path[-1]}' was unexpected" in output and f"On instance{parent}" in output


def _snakemake_dry_run(config: Path, workdir: Path) -> subprocess.CompletedProcess:
    return run([SNAKEMAKE, "-n", "--snakefile", str(snakefile()), "--directory", str(workdir),
                "--configfile", str(config), "--cores", "1"], cwd=workdir, timeout=300)


@pytest.fixture(scope="module")
def broken_config_results(tmp_path_factory):
    """Dry-run every broken config (two at a time: each is a fresh Snakemake process)."""
    base = load_test_config()
    root = tmp_path_factory.mktemp("broken_configs")
    cases = {}
    for name, (patch, _) in BROKEN_CONFIGS.items():
        workdir = root / name
        workdir.mkdir()
        config = workdir / "broken.yaml"
        isolated = deep_update(base, {"results_dir": str(workdir / "results")})
        config.write_text(yaml.safe_dump(deep_update(isolated, patch), sort_keys=False))
        cases[name] = (config, workdir)
    # YAML that does not parse at all
    workdir = root / "invalid_yaml"
    workdir.mkdir()
    (workdir / "broken.yaml").write_text(f"results_dir: {workdir / 'results'}\n" + "train: [unclosed\n")
    cases["invalid_yaml"] = (workdir / "broken.yaml", workdir)
    snakefile()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_snakemake_dry_run, config, workdir) for name, (config, workdir) in cases.items()}
        return {name: (future.result(), cases[name][1]) for name, future in futures.items()}


# Gaps found by this corpus, reported to their owners; strict, so the test fails once they are fixed.
KNOWN_GAPS: dict[str, str] = {}  # broken configs we knowingly accept (none now)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name])) if name in KNOWN_GAPS else name
    for name in [*BROKEN_CONFIGS, "invalid_yaml"]
])
def test_broken_config_fails_at_parse_time_naming_the_problem(broken_config_results, name):
    proc, workdir = broken_config_results[name]
    output = proc.stdout + proc.stderr
    assert_clear_failure(proc)
    if name == "invalid_yaml":
        # Snakemake parses --configfile itself, before the Snakefile, and does not name the file;
        # `repexp config validate` (the same loader the Snakefile uses) names file and line.
        assert "Config file is not valid JSON or YAML" in output, output[-3000:]
        validate = run([REPEXP, "config", "validate", str(workdir / "broken.yaml")])
        assert_clear_failure(validate, "broken.yaml", "invalid YAML")
    else:
        key = BROKEN_CONFIGS[name][1]
        assert names_key(output, key), f"error does not name {key}:\n{output[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # nothing was scheduled: no job list, no job output
    assert "Job stats:" not in proc.stdout + proc.stderr
    assert not (workdir / "results" / "data").exists()


def test_broken_config_starts_no_job_in_a_real_run(tmp_path):
    """Not a dry run: the scheduler must never get to start the model or data jobs."""
    config = tmp_path / "broken.yaml"
    config.write_text(yaml.safe_dump(deep_update(load_test_config(), {"results_dir": str(tmp_path / "results"),
                                                                 "train": {"ppo_mini_batch_size": 3}})))
    proc = run([SNAKEMAKE, "--snakefile", str(snakefile()), "--directory", str(tmp_path),
                "--configfile", str(config), "--cores", "1", "all"], cwd=tmp_path, timeout=300)
    assert_clear_failure(proc, "train.ppo_mini_batch_size")
    produced = [p for p in (tmp_path / "results").rglob("*") if p.is_file() and "config" not in p.parts] \
        if (tmp_path / "results").exists() else []
    assert produced == [], f"jobs ran despite the broken config: {produced}"


# --------------------------------------------------------------------------- MLflow server


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 (sqlite backend), started on demand on a port chosen up front."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def start(self, timeout: float = 180) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "ab")
        # one worker and no job-runner consumers: the server is a logging sink here, and 2 cores are shared
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts")],
            cwd=self.root, env=quiet_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_for(self.healthy, timeout, f"mlflow server on port {self.port}", proc=self.proc, poll=0.5)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        signal_tree(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            signal_tree(self.proc, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """Not started yet: a test may first use its URI while nothing listens there."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    yield server
    server.stop()


def mlflow_rest(server: MlflowServer, endpoint: str, payload: dict | None = None) -> dict:
    """MLflow's REST API (no client import in the test process)."""
    url = f"{server.uri}/api/2.0/mlflow/{endpoint}"
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if payload is None else "POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def server_runs(server: MlflowServer, experiment: str) -> list[dict]:
    found = mlflow_rest(server, "experiments/get-by-name?experiment_name=" + experiment)
    experiment_id = found["experiment"]["experiment_id"]
    runs, token = [], None
    while True:
        page = mlflow_rest(server, "runs/search", {"experiment_ids": [experiment_id], "max_results": 1000,
                                                    **({"page_token": token} if token else {})})
        runs += page.get("runs", [])
        token = page.get("next_page_token")
        if not token:
            return runs


def run_tags(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def metric_history(server: MlflowServer, run_id: str, key: str) -> list[dict]:
    return mlflow_rest(server, f"metrics/get-history?run_id={run_id}&metric_key={key}").get("metrics", [])


def write_pipeline_config(path: Path, results_dir: Path, **patch) -> Path:
    config = deep_update(load_test_config(), {"results_dir": str(results_dir), **patch})
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def finished_training_run(run_dir: Path, steps=(1, 2), dev=(0.25, 0.5)) -> None:
    """A training run directory as the trainers leave it (checkpoint dirs + best_dev.json), for nodes
    that only read those files (`repexp select`): written with the real BestDevTracker."""
    from repexp.checkpoints import BestDevTracker, checkpoint_dir, mark_complete

    tracker = BestDevTracker(run_dir)
    tracker.record_validation(0, {"dev/pass_at_1": 0.0})
    for step, value in zip(steps, dev):
        ckpt = checkpoint_dir(run_dir, step)
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text("{}")
        mark_complete(ckpt)
        tracker.record_validation(step, {"dev/pass_at_1": value})
    (run_dir / "DONE").write_text(json.dumps({"final_step": steps[-1]}))


def test_mlflow_down_during_a_node_then_sync_uploads_once(tmp_path, mlflow_server):
    results = tmp_path / "results"
    config = write_pipeline_config(tmp_path / "config.yaml", results,
                                   tracking={"tracking_uri": mlflow_server.uri, "experiment": "outbox-test"})
    run_dir = results / "train" / "gsm8k" / "trl_grpo_s42"
    finished_training_run(run_dir)
    pointer = run_dir / "select.json"
    assert not mlflow_server.healthy()  # nothing listens on the configured port yet

    # the select rule's command line (workflow/rules/select.smk), with the server down
    node = run([REPEXP, "run", "select", "--config", str(config), "--task", "gsm8k", "--run", "trl_grpo_s42",
                "--attempt", "1"])
    assert node.returncode == 0, node.stderr[-3000:]
    assert json.loads(pointer.read_text())["checkpoint_step"] == 2
    assert "MLflow unavailable" in node.stderr
    outbox = results / "mlflow" / "outbox"
    records = [d for d in outbox.iterdir() if (d / "record.json").exists()]
    assert len(records) == 1
    record = json.loads((records[0] / "record.json").read_text())
    assert record["run_id"] is None and record["status"] == "FINISHED"
    assert record["params"]["job.backend"] == "trl" and record["metrics"], record

    mlflow_server.start()  # the server comes back
    sync = run([REPEXP, "mlflow", "sync", "--config", str(config)])
    assert sync.returncode == 0, sync.stderr[-3000:]
    assert "1 record(s) uploaded" in sync.stderr

    def children():
        return [r for r in server_runs(mlflow_server, "outbox-test") if "repexp.record_id" in run_tags(r)]

    (child,) = children()
    tags = run_tags(child)
    assert tags["repexp.record_id"] == record["record_id"] and tags["snakemake.rule"] == "select"
    assert child["info"]["status"] == "FINISHED"
    stored_params = {p["key"]: p["value"] for p in child["data"].get("params", [])}
    assert stored_params == record["params"]
    logged = Counter(m[0] for m in record["metrics"])  # metric key -> points logged by the node

    def stored_points():
        return {key: len(metric_history(mlflow_server, child["info"]["run_id"], key)) for key in logged}

    assert stored_points() == logged

    # Syncing again uploads nothing; replaying a record whose SYNCED marker was lost (a crash
    # between upload and marking) finds its run by the record id instead of creating another.
    again = run([REPEXP, "mlflow", "sync", "--config", str(config)])
    assert again.returncode == 0 and "0 record(s) uploaded" in again.stderr
    (records[0] / "SYNCED").unlink()
    replay = run([REPEXP, "mlflow", "sync", "--config", str(config)])
    assert replay.returncode == 0 and "1 record(s) uploaded" in replay.stderr
    (same,) = children()
    assert same["info"]["run_id"] == child["info"]["run_id"]
    assert stored_points() == logged
    parents = [r for r in server_runs(mlflow_server, "outbox-test") if "repexp.parent_key" in run_tags(r)]
    assert [run_tags(p)["repexp.parent_key"] for p in parents] == ["point:gsm8k/trl_grpo_s42"]


# One pipeline job's tracking, as a node does it (repexp.tracking.node_run), into two stores.
CONCURRENT_JOB = """
import sys
from repexp.tracking import node_run

index = int(sys.argv[1])
rule = ("train", "select", "eval", "aggregate")[index % 4]
for config in sys.argv[2:]:
    with node_run(rule, "gsm8k", None if rule == "aggregate" else f"trl_grpo_s{index // 4}", config=config,
                  params={"job": index, "rule": rule, "lr": 1e-5 * (index + 1), "batch": 2, "note": "concurrency"},
                  attempt=1) as node:
        for step in range(3):
            node.log_metrics({"loss": index + step / 10, "reward/mean": step * 0.5, "timing_s/step": 0.01 * index},
                             step=step)
        if not node.online:
            sys.exit(f"job {index}: tracking went offline: {node.offline_reason}")
"""
# The jobs start together, forked from one interpreter that imported the tracking package (and MLflow) once:
# each then opens its own runs, stores and connections, as a job process does. 32 fresh interpreters spent most
# of this test importing MLflow (about 3 CPU s each on the 2-core CI machine; docs/performance.md, "CI time").
CONCURRENT_FORKS = """
import json, os, sys
import repexp.tracking  # what every job imports; nothing of it is opened before the fork
import mlflow  # imported by the tracking package on first use: once here, not in every job
import mlflow.store.tracking.rest_store, mlflow.store.tracking.sqlalchemy_store, mlflow.tracking

job, n, logs, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
children = {}
for index in range(n):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the job: its output to its own log, then the job's code as its __main__, exit as it ends
        log = os.open(os.path.join(logs, f"job-{index}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.argv = ["-c", str(index), *configs]
        exec(compile(job, "<job>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    children[pid] = index
codes = {}
while children:
    pid, status = os.wait()
    codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""
CONCURRENT_JOBS = 32
JOB_PARAMS = 5  # the params each job logs (above)
JOB_METRIC_POINTS = 9  # 3 keys x 3 steps


def sqlite_counts(db: Path, experiment: str) -> dict:
    """Children, params and metric points of node runs, read straight from MLflow's SQLite schema."""
    import sqlite3

    with sqlite3.connect(db) as con:
        (experiment_id,) = con.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
        runs = con.execute("SELECT run_uuid, status FROM runs WHERE experiment_id = ? AND lifecycle_stage = 'active'",
                           (experiment_id,)).fetchall()
        tags = {}
        for run_id, key, value in con.execute("SELECT run_uuid, key, value FROM tags"):
            tags.setdefault(run_id, {})[key] = value
        children = [r for r, _ in runs if "repexp.record_id" in tags.get(r, {})]
        parents = sorted(tags[r]["repexp.parent_key"] for r, _ in runs if "repexp.parent_key" in tags.get(r, {}))

        def per_run(table):
            query = f"SELECT COUNT(*) FROM {table} WHERE run_uuid = ?"
            return {r: con.execute(query, (r,)).fetchone()[0] for r in children}

        return {"children": len(children), "parents": parents, "params": per_run("params"),
                "metrics": per_run("metrics"),
                "unfinished": [r for r, status in runs if r in children and status != "FINISHED"]}


def server_counts(server: MlflowServer, experiment: str) -> dict:
    runs = server_runs(server, experiment)
    children = [r for r in runs if "repexp.record_id" in run_tags(r)]
    parents = sorted(run_tags(r)["repexp.parent_key"] for r in runs if "repexp.parent_key" in run_tags(r))
    metrics = {}
    for child in children:
        run_id = child["info"]["run_id"]
        keys = [m["key"] for m in child["data"].get("metrics", [])]
        metrics[run_id] = sum(len(metric_history(server, run_id, key)) for key in keys)
    return {"children": len(children), "parents": parents,
            "params": {c["info"]["run_id"]: len(c["data"].get("params", [])) for c in children},
            "metrics": metrics,
            "unfinished": [c["info"]["run_id"] for c in children if c["info"]["status"] != "FINISHED"]}


@pytest.mark.slow
def test_32_concurrent_jobs_lose_nothing_in_sqlite_or_server(tmp_path, mlflow_server):
    mlflow_server.start()
    sqlite_results, server_results = tmp_path / "sqlite_results", tmp_path / "server_results"
    seeds = {"seeds": list(range(CONCURRENT_JOBS // 4))}  # a node's run is one of its config's runs
    sqlite_config = write_pipeline_config(tmp_path / "sqlite.yaml", sqlite_results, sweep=seeds,
                                          tracking={"tracking_uri": None, "experiment": "concurrency"})
    server_config = write_pipeline_config(tmp_path / "server.yaml", server_results, sweep=seeds,
                                          tracking={"tracking_uri": mlflow_server.uri, "experiment": "concurrency"})
    logs = tmp_path / "job_logs"
    logs.mkdir()
    started = time.monotonic()
    forks = run([sys.executable, "-c", CONCURRENT_FORKS, CONCURRENT_JOB, str(CONCURRENT_JOBS), str(logs),
                 str(sqlite_config), str(server_config)])
    elapsed = time.monotonic() - started
    assert forks.returncode == 0, forks.stderr[-3000:]
    codes = {int(i): code for i, code in json.loads(forks.stdout.splitlines()[-1]).items()}
    assert sorted(codes) == list(range(CONCURRENT_JOBS)), codes
    failed = {i: (code, (logs / f"job-{i}.log").read_text()[-1500:]) for i, code in codes.items() if code != 0}
    assert not failed, failed
    print(f"{CONCURRENT_JOBS} concurrent jobs x 2 stores: {elapsed:.1f} s")

    expected_parents = sorted(["experiment"] + [f"point:gsm8k/trl_grpo_s{k}" for k in range(CONCURRENT_JOBS // 4)])
    # each node run also carries its sweep point's params (task, method, backend, beta, seed; none for aggregate)
    from repexp.config import RunSpec
    from repexp.tracking import scope_for

    point_params = len(scope_for("gsm8k", RunSpec.of("gsm8k", "grpo", "trl", 0)).params)
    for name, counts, results in (
        ("sqlite", sqlite_counts(sqlite_results / "mlflow" / "mlflow.db", "concurrency"), sqlite_results),
        ("server", server_counts(mlflow_server, "concurrency"), server_results),
    ):
        assert counts["children"] == CONCURRENT_JOBS, (name, counts)
        assert counts["parents"] == expected_parents, (name, counts["parents"])
        expected_params = ([JOB_PARAMS] * (CONCURRENT_JOBS // 4)
                           + [JOB_PARAMS + point_params] * (CONCURRENT_JOBS * 3 // 4))
        assert sorted(counts["params"].values()) == sorted(expected_params), name
        assert set(counts["metrics"].values()) == {JOB_METRIC_POINTS}, (name, counts["metrics"])
        assert counts["unfinished"] == [], name
        outbox = results / "mlflow" / "outbox"
        assert not outbox.exists() or not any(outbox.glob("*/record.json"))


def kill_server(server: MlflowServer) -> float:
    """SIGKILL the server and all its workers at once (a crashed host, the OOM killer); returns when (ms)."""
    signal_tree(server.proc, signal.SIGKILL)
    server.proc.wait(timeout=30)
    return time.time() * 1000


def stored_steps(server: MlflowServer, run_id: str, key: str) -> list[int]:
    return sorted(int(m["step"]) for m in metric_history(server, run_id, key))


@pytest.mark.slow
def test_mlflow_server_killed_during_training_then_sync_stores_every_point_once(tmp_path, mlflow_server, tiny_assets):
    """Issue 20, fault 1: the server dies after the train run opened and the trainer had logged points
    live; after a restart, `repexp mlflow sync` leaves every metrics.jsonl point in MLflow exactly once."""
    from repexp.tracking import metric_name

    mlflow_server.start()
    results = tmp_path / "results"
    shutil.copytree(tiny_assets / "model", results / "models" / "tiny")
    shutil.copytree(tiny_assets / "data", results / "data" / "gsm8k")
    config = write_pipeline_config(tmp_path / "config.yaml", results, train={"total_steps": 4},
                                   tracking={"tracking_uri": mlflow_server.uri, "experiment": "outage-train"})
    run_dir = results / "train" / "gsm8k" / TRAIN_RUN
    with open(tmp_path / "train.log", "w") as log:
        train = subprocess.Popen([REPEXP, "run", "train", "--config", str(config), "--task", "gsm8k",
                                  "--run", TRAIN_RUN], env=quiet_env(), stdout=log, stderr=subprocess.STDOUT)

    def trained_step_logged_live():
        published = run_dir / "mlflow_run.json"
        if not published.exists():
            return None
        run_id = json.loads(published.read_text())["run_id"]
        metrics = mlflow_rest(mlflow_server, f"runs/get?run_id={run_id}")["run"]["data"].get("metrics", [])
        return run_id if any(m["key"] == "reward/verifier/mean" for m in metrics) else None

    run_id = wait_for(trained_step_logged_live, 600, "a training step logged live", proc=train, poll=0.3)
    killed_ms = kill_server(mlflow_server)
    assert train.poll() is None, "training ended before the server was killed; the test lost its window"
    assert train.wait(timeout=900) == 0, (tmp_path / "train.log").read_text()[-4000:]
    assert "MLflow unavailable" in (tmp_path / "train.log").read_text()
    (record,) = [json.loads(p.read_text()) for p in (results / "mlflow" / "outbox").glob("*/record.json")]
    assert record["run_id"] == run_id and record["fill_metrics"]  # metrics.jsonl points kept for the sync

    mlflow_server.start()  # the same store comes back
    sync = run([REPEXP, "mlflow", "sync", "--config", str(config)])
    assert sync.returncode == 0 and "1 record(s) uploaded" in sync.stderr, sync.stderr[-3000:]
    again = run([REPEXP, "mlflow", "sync", "--config", str(config)])
    assert again.returncode == 0 and "0 record(s) uploaded" in again.stderr

    expected: dict[str, list[int]] = {}
    for step, row in read_metrics(run_dir).items():
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(metric_name(key), []).append(step)
    live, replayed = 0, 0
    for key, steps in expected.items():
        assert stored_steps(mlflow_server, run_id, key) == sorted(steps), key  # every point, exactly once
        for point in metric_history(mlflow_server, run_id, key):
            live, replayed = (live + 1, replayed) if int(point["timestamp"]) < killed_ms else (live, replayed + 1)
    assert live and replayed, (live, replayed)  # the fault's condition held: some live, some replayed
    (stored,) = [r for r in server_runs(mlflow_server, "outage-train") if r["info"]["run_id"] == run_id]
    assert stored["info"]["status"] == "FINISHED"


@pytest.mark.slow
def test_aggregate_with_mlflow_down_gives_the_parents_their_pass_at_k_after_sync(tmp_path, mlflow_server):
    """Issue 20, fault 3: aggregate runs while the server is down; its parents' metrics wait in the outbox."""
    from repexp.config import load, sweep_runs
    from repexp.evaluate.core import eval_result

    mlflow_server.start()
    results = tmp_path / "results"
    config = write_pipeline_config(tmp_path / "config.yaml", results,
                                   tracking={"tracking_uri": f"http://127.0.0.1:{free_port()}",
                                             "experiment": "aggregate-offline"}, testtime={"enabled": False})
    evals = []
    for i, spec in enumerate(sweep_runs(load(config))):
        path = results / "eval" / spec.task / spec.name / "eval.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(eval_result(problem_ids=["p1", "p2"], scores=[[1, 0, 0, 0], [1] * i + [0] * (4 - i)],
                                               answers=None, metadata={"split": "test"})))
        evals.append((spec, json.loads(path.read_text())))
    proc = run([REPEXP, "run", "aggregate", "--config", str(config)])  # the job reads every eval.json above
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kept for `repexp mlflow sync`" in proc.stdout, proc.stdout

    sync = run([REPEXP, "mlflow", "sync", "--config", str(config), "--tracking-uri", mlflow_server.uri])
    assert sync.returncode == 0, sync.stderr[-3000:]
    parents = {run_tags(r)["repexp.parent_key"]: r for r in server_runs(mlflow_server, "aggregate-offline")
               if "repexp.parent_key" in run_tags(r)}
    for spec, result in evals:
        metrics = {m["key"]: m["value"] for m in parents[f"point:{spec.task}/{spec.name}"]["data"].get("metrics", [])}
        assert metrics["test/pass_at_1"] == pytest.approx(result["pass_at_k"]["1"]), spec.name
        assert metrics["test/pass_at_4"] == pytest.approx(result["pass_at_k"]["4"]), spec.name


# --------------------------------------------------------------------------- bad data files

SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()
PREPARE_LIMITS = ["data.limit_train=8", "data.limit_dev=4", "data.limit_test=4"]  # configs/test.yaml's


def gsm8k_source_copy(root: Path) -> Path:
    """A writable copy of the offline GSM8K source files (without MANIFEST.json, so edits are allowed)."""
    source = root / "source"
    (source / "gsm8k").mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        shutil.copy(SHARED_DATA / "gsm8k" / name, source / "gsm8k" / name)
    return source


def corrupt_line(path: Path, lineno: int, text: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[lineno - 1] = text
    path.write_text("".join(lines))


def truncate(path: Path, fraction: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


@pytest.mark.parametrize("damage, message", [
    ("bad_json_line", "train.jsonl:3: not valid JSON"),
    ("truncated_file", "test.jsonl:"),
    ("not_an_object", "train.jsonl:5: expected a JSON object"),
    ("missing_directory", "data source directory not found"),
])
def test_corrupt_jsonl_source_fails_data_prepare_cleanly(tmp_path, damage, message):
    source = gsm8k_source_copy(tmp_path)
    if damage == "bad_json_line":
        corrupt_line(source / "gsm8k" / "train.jsonl", 3, '{"question": "cut off mid-reco\n')
    elif damage == "truncated_file":  # an interrupted copy: the last line stops mid-record
        text = (source / "gsm8k" / "test.jsonl").read_text()
        (source / "gsm8k" / "test.jsonl").write_text(text[: len(text) // 2])
    elif damage == "not_an_object":
        corrupt_line(source / "gsm8k" / "train.jsonl", 5, "[1, 2, 3]\n")
    else:
        shutil.rmtree(source)
    out = tmp_path / "out"
    proc = run([REPEXP, "data", "prepare", "gsm8k", "--out", str(out), "--set", f"data.source={source}",
                *PREPARE_LIMITS])
    assert_clear_failure(proc, message)
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir()), "a failed prepare left outputs behind"


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    """The offline tiny model and prepared GSM8K splits, made by the pipeline's own commands."""
    root = tmp_path_factory.mktemp("tiny_assets")
    model = run([REPEXP, "model", "tiny", "--out", str(root / "model")])
    assert model.returncode == 0, model.stderr[-3000:]
    data = run([REPEXP, "data", "prepare", "gsm8k", "--out", str(root / "data"), "--set",
                f"data.source={SHARED_DATA}", *PREPARE_LIMITS])
    assert data.returncode == 0, data.stderr[-3000:]
    return root


def eval_cmd(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [REPEXP, "eval", "--model", str(model), "--data", str(data), "--out", str(out), "--no-progress", "--set",
            "eval.engine=hf", "eval.n_samples=2", "eval.max_new_tokens=4", "eval.batch_size=4", "eval.shard_size=2",
            *extra]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "wrong_columns"])
def test_corrupt_parquet_split_fails_eval_cleanly(tmp_path, tiny_assets, damage):
    split = tmp_path / "test.parquet"
    if damage == "truncated":
        shutil.copy(tiny_assets / "data" / "test.parquet", split)
        truncate(split)
    elif damage == "garbage":
        split.write_bytes(b"PAR1" + os.urandom(512))
    else:  # a valid parquet file, but not verl's row format
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"question": ["1+1?"], "answer": ["2"]}), split)
    proc = run(eval_cmd(tiny_assets / "model", split, tmp_path / "eval"))
    assert_clear_failure(proc, str(split))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "eval" / "eval.json").exists()


def test_truncated_model_weights_fail_eval_naming_the_checkpoint(tmp_path, tiny_assets):
    model = tmp_path / "global_step_2"
    shutil.copytree(tiny_assets / "model", model)
    (weights,) = model.glob("*.safetensors")
    truncate(weights)
    proc = run(eval_cmd(model, tiny_assets / "data" / "test.parquet", tmp_path / "eval"))
    assert_clear_failure(proc, str(model))
    assert not (tmp_path / "eval" / "eval.json").exists()


def test_truncated_sample_shard_is_set_aside_and_regenerated(tmp_path, tiny_assets):
    """Issue 20, fault 4: a damaged shard used to fail every rerun (and a stale eval.json stayed)."""
    out = tmp_path / "eval"
    data = tiny_assets / "data" / "test.parquet"
    first = run(eval_cmd(tiny_assets / "model", data, out, "--overwrite"))  # as workflow/rules/eval.smk runs it
    assert first.returncode == 0, first.stderr[-3000:]
    reference = json.loads((out / "eval.json").read_text())
    shard = out / "samples" / "shard-00001.parquet"
    truncate(shard)

    # a rerun that stops before regenerating anything must not leave the old eval.json behind
    stopped = run(eval_cmd(tiny_assets / "model", data, out, "--overwrite", "--max-shards", "1"))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "shard-00001.parquet is damaged" in stopped.stderr and not (out / "eval.json").exists()
    (aside,) = (out / "samples" / "corrupt").iterdir()
    assert aside.name.startswith("shard-00001.parquet.") and not shard.exists()

    healed = run(eval_cmd(tiny_assets / "model", data, out, "--overwrite"))
    assert healed.returncode == 0, healed.stderr[-3000:]
    assert "1/2 shards complete; generating 1" in healed.stderr
    result = json.loads((out / "eval.json").read_text())
    for key in ("pass_at_k", "per_problem", "num_problems", "n_samples", "data_hash"):
        assert result[key] == reference[key], key


def test_select_skips_a_truncated_checkpoint_for_the_next_best_complete_one(tmp_path_factory, tmp_path):
    """Issue 20, fault 4: `select` checked only COMPLETE, so eval failed on the truncated weights every attempt."""
    from repexp.checkpoints import BestDevTracker, checkpoint_dir

    source = fx.results(fx.reference_run(tmp_path_factory)) / "train" / "gsm8k" / TRAIN_RUN
    for marker_kind in ("sizes", "legacy"):  # a COMPLETE listing file sizes, and one from before it did
        run_dir = tmp_path / marker_kind / TRAIN_RUN
        shutil.copytree(source, run_dir)
        tracker = BestDevTracker.load(run_dir)
        tracker.record_validation(TOTAL_STEPS, {"dev/pass_at_1": 1.0, "dev/pass_at_2": 1.0})  # the best score of all
        best = checkpoint_dir(run_dir, TOTAL_STEPS)
        truncate(best / "model.safetensors")
        if marker_kind == "legacy":
            (best / "COMPLETE").write_text("ok\n")
        out = tmp_path / marker_kind / "select.json"
        proc = run([REPEXP, "select", "--run-dir", str(run_dir), "--backend", "trl", "--out", str(out)])
        assert proc.returncode == 0, proc.stderr
        assert f"skipping step {TOTAL_STEPS}" in proc.stderr and "model.safetensors" in proc.stderr, proc.stderr
        pointer = json.loads(out.read_text())
        assert pointer["checkpoint_step"] < TOTAL_STEPS and [s["step"] for s in pointer["skipped"]] == [TOTAL_STEPS]
        load = run([sys.executable, "-c", "import sys, safetensors.torch as st; st.load_file(sys.argv[1])",
                    str(Path(pointer["model_path"]) / "model.safetensors")])
        assert load.returncode == 0, load.stderr[-2000:]  # what eval will load is whole


def test_a_node_killed_by_sigterm_reports_it_in_one_wording(tmp_path, tiny_assets):
    """Issue 20, item 6: the eval wrapper and `repexp run train` describe a SIGTERM the same way
    (the train side is checked in test_training_killed_by_sigterm_then_sigkill_resumes_and_matches)."""
    results = tmp_path / "results"
    config = write_pipeline_config(tmp_path / "config.yaml", results, tracking={"tracking_uri": None},
                                   model=str(tiny_assets / "model"),
                                   eval={"n_samples": 2, "max_new_tokens": 4, "batch_size": 4, "shard_size": 2})
    shutil.copytree(tiny_assets / "data", results / "data" / "gsm8k")  # where the eval job reads its split
    out = results / "eval" / "gsm8k" / "base"
    proc = subprocess.Popen([REPEXP, "run", "eval", "--config", str(config), "--task", "gsm8k", "--run", "base"],
                            env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: (out / "samples" / "meta.json").exists(), 300, "the eval to start", proc=proc)
    proc.send_signal(signal.SIGTERM)  # to the wrapper, as SLURM and Snakemake stop a job
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, output[-3000:]
    sync = run([REPEXP, "mlflow", "sync", "--config", str(config)])  # a deferred record, if the run was not open yet
    assert sync.returncode == 0, sync.stderr
    from mlflow import MlflowClient

    from repexp.tracking import default_tracking_uri

    client = MlflowClient(default_tracking_uri(results))
    (node,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
               if r.data.tags.get("snakemake.rule") == "eval"]
    assert node.info.status == "FAILED"
    assert node.data.tags["repexp.error"] == "`repexp eval` exited with status 143 (SIGTERM)"


def test_corrupt_best_dev_json_fails_select_naming_the_file(tmp_path):
    run_dir = tmp_path / "trl_grpo_s42"
    finished_training_run(run_dir)
    (run_dir / "best_dev.json").write_text('{"metric": "dev/pass_at_1", "history": [{"step": 1, ')  # cut off
    proc = run([REPEXP, "select", "--run-dir", str(run_dir), "--backend", "trl",
                "--out", str(tmp_path / "select.json")])
    assert_clear_failure(proc, "best_dev.json")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "select.json").exists()


# --------------------------------------------------------------------------- killed nodes


def job_processes(root_pid: int, marker: str | None) -> list[psutil.Process]:
    """The processes of the running job whose command line contains `marker` (the rule's shell and
    everything below it), or, with no marker, `root_pid` and all its descendants."""
    try:
        root = psutil.Process(root_pid)
        descendants = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    if marker is None:
        return [root, *descendants]
    found: list[psutil.Process] = []
    for proc in descendants:
        try:
            if marker in " ".join(proc.cmdline()) and proc not in found:
                found += [proc, *(c for c in proc.children(recursive=True) if c not in found)]
        except psutil.Error:
            continue
    return found


def kill_when(ready, snakemake: subprocess.Popen, marker: str | None, sig: int, what: str, timeout: float = 600) -> int:
    """Signal a job's processes (or, marker None, Snakemake and all jobs) the moment `ready()` holds.

    The process list is refreshed while waiting, so the signal lands within a poll interval of the
    event (SLURM's time limit or the OOM killer signal every process of the job at once)."""
    targets: list[psutil.Process] = []
    deadline = time.monotonic() + timeout
    refreshed = 0.0
    while not ready():
        if snakemake.poll() is not None:
            raise AssertionError(f"snakemake exited ({snakemake.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        if time.monotonic() - refreshed > 0.25:
            targets, refreshed = job_processes(snakemake.pid, marker), time.monotonic()
        time.sleep(0.005)
    signalled = 0
    for batch in (targets, job_processes(snakemake.pid, marker)):  # cached first: no lookup delay
        for proc in batch:
            try:
                proc.send_signal(sig)
                signalled += 1
            except psutil.NoSuchProcess:
                pass
    return signalled


class SnakemakeRun:
    """A `snakemake --profile local` invocation in the background (its own session), output to a log file."""

    def __init__(self, workdir: Path, *targets: str):
        self.log = workdir / f"snakemake-{time.time_ns()}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(fx.snakemake_cmd(workdir, "--cores", "2", *targets), cwd=REPO,
                                         env=quiet_env(), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = 900) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            signal_tree(self.proc, signal.SIGKILL)
            raise AssertionError(f"snakemake still running after {timeout:.0f} s:\n{self.output()[-4000:]}") from None


TRAIN_RUN = "trl_repexp_k8_b0.01_s42"  # a RepExp point of configs/test.yaml (bonus state is resumed too)
TOTAL_STEPS = 2  # configs/test.yaml: train.total_steps, saved every step


def read_metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), {}).update(row)
    return by_step


def deterministic(metrics: dict) -> dict:
    """Drop wall-clock quantities; everything else is seeded and must match an uninterrupted run."""
    return {k: v for k, v in metrics.items() if not any(t in k for t in ("time", "timing", "runtime", "per_second"))}


def assert_same_metrics(resumed: dict[int, dict], reference: dict[int, dict]) -> None:
    assert sorted(resumed) == sorted(reference)
    for step in reference:
        want, got = deterministic(reference[step]), deterministic(resumed[step])
        assert sorted(got) == sorted(want), (step, set(got) ^ set(want))
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key, got[key], value)


@pytest.fixture(scope="module")
def kill_workdir(tmp_path_factory):
    """A workdir whose model and data jobs have run (the fault tests kill later nodes)."""
    workdir = tmp_path_factory.mktemp("killed_nodes")
    fx.isolated_config(workdir)
    prep = SnakemakeRun(workdir, "results/models/tiny", "results/data/gsm8k/manifest.json")
    assert prep.wait() == 0, prep.output()[-4000:]
    return workdir


@pytest.mark.slow
def test_training_killed_by_sigterm_then_sigkill_resumes_and_matches(kill_workdir, tmp_path_factory):
    workdir = kill_workdir
    run_dir = fx.results(workdir) / "train" / "gsm8k" / TRAIN_RUN
    from repexp.checkpoints import checkpoint_dir

    step_done = lambda step: (checkpoint_dir(run_dir, step) / "COMPLETE").exists()  # noqa: E731
    target = f"results/train/gsm8k/{TRAIN_RUN}/DONE"

    # 1. SIGTERM to the training job's processes right after checkpoint 1 is complete, as SLURM does
    #    at a time limit; Snakemake (alive) retries the job (`retries:` in train.smk).
    first = SnakemakeRun(workdir, target)
    assert kill_when(lambda: step_done(1), first.proc, "repexp run train", signal.SIGTERM, "checkpoint 1") > 0
    assert not step_done(TOTAL_STEPS), "step 2 finished before the kill; the test lost its window"

    # 2. The retry resumes and saves step 2: SIGKILL Snakemake and every job at once while that
    #    checkpoint is being written (TRL stages it under trl_staging/ before it is renamed into
    #    place and marked COMPLETE), as when the whole allocation or the login shell dies.
    def saving_step_2():
        staging = run_dir / "trl_staging"
        return (staging.exists() and any(staging.glob("checkpoint-*"))) or checkpoint_dir(run_dir, TOTAL_STEPS).exists()

    wait_for(lambda: job_processes(first.proc.pid, "repexp run train"), 120, "the retry of the train job",
             proc=first.proc)
    kill_when(saving_step_2, first.proc, None, signal.SIGKILL, "the retry saving step 2")
    first.proc.wait(timeout=60)
    assert not (run_dir / "DONE").exists(), "the retry finished before the kill; the test lost its window"

    # 3. Rerun the target (after `--unlock`: a SIGKILLed Snakemake leaves its lock behind).
    unlock = run(fx.snakemake_cmd(workdir, "--unlock"), cwd=REPO)
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    rerun = SnakemakeRun(workdir, target)
    assert rerun.wait() == 0, rerun.output()[-5000:]

    done = json.loads((run_dir / "DONE").read_text())
    assert done["final_step"] == TOTAL_STEPS
    assert done["resumed_from_step"] in (1, TOTAL_STEPS), done  # never from scratch
    # every checkpoint left is complete; the partial one of the SIGKILL was discarded
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    assert [c.name for c in ckpts] == [f"global_step_{s}" for s in range(1, TOTAL_STEPS + 1)]
    assert all((c / "COMPLETE").exists() for c in ckpts)

    reference = fx.results(fx.reference_run(tmp_path_factory)) / "train" / "gsm8k" / TRAIN_RUN
    assert_same_metrics(read_metrics(run_dir), read_metrics(reference))
    ours, theirs = (json.loads((d / "best_dev.json").read_text()) for d in (run_dir, reference))
    assert ours["best_step"] == theirs["best_step"]
    assert [deterministic(h) for h in ours["history"]] == [deterministic(h) for h in theirs["history"]]

    # MLflow (issue 20, faults 2 and 6): one node run per execution, none left RUNNING: the SIGKILLed
    # retry's run was ended by the rerun, although both are snakemake.attempt 1 with a new job id
    runs = node_runs(fx.results(workdir), "train", TRAIN_RUN)
    by_execution = {r.data.tags["repexp.execution"]: r for r in runs}
    assert sorted(by_execution) == ["1", "2", "3"], [(r.data.tags, r.info.status) for r in runs]
    assert [by_execution[e].info.status for e in ("1", "2", "3")] == ["FAILED", "KILLED", "FINISHED"]
    assert by_execution["2"].data.tags["repexp.superseded_by"] == by_execution["3"].info.run_id
    assert [by_execution[e].data.tags["snakemake.attempt"] for e in ("1", "2", "3")] == ["1", "2", "1"]
    assert re.fullmatch(r"the trl trainer exited with status \d+( \(SIG[A-Z]+\))?",
                        by_execution["1"].data.tags["repexp.error"]), by_execution["1"].data.tags["repexp.error"]


def test_select_ignores_a_checkpoint_without_complete_marker(tmp_path_factory, tmp_path):
    """A later, better-scoring checkpoint directory that lacks COMPLETE (killed mid-save) is never selected."""
    from repexp.checkpoints import BestDevTracker, checkpoint_dir

    source = fx.results(fx.reference_run(tmp_path_factory)) / "train" / "gsm8k" / TRAIN_RUN
    run_dir = tmp_path / TRAIN_RUN
    shutil.copytree(source, run_dir)
    partial = checkpoint_dir(run_dir, TOTAL_STEPS + 1)
    shutil.copytree(checkpoint_dir(run_dir, TOTAL_STEPS), partial)
    (partial / "COMPLETE").unlink()
    (partial / "model.safetensors").write_bytes((partial / "model.safetensors").read_bytes()[:1000])
    tracker = BestDevTracker.load(run_dir)
    tracker.record_validation(TOTAL_STEPS + 1, {"dev/pass_at_1": 1.0, "dev/pass_at_2": 1.0})  # the best score of all
    proc = run([REPEXP, "select", "--run-dir", str(run_dir), "--backend", "trl",
                "--out", str(tmp_path / "select.json")])
    assert proc.returncode == 0, proc.stderr
    pointer = json.loads((tmp_path / "select.json").read_text())
    assert pointer["checkpoint_step"] <= TOTAL_STEPS
    assert (Path(pointer["model_path"]) / "COMPLETE").exists()


@pytest.mark.slow
def test_eval_killed_mid_generation_resumes_from_complete_shards(kill_workdir, tmp_path_factory):
    workdir = kill_workdir
    out = fx.results(workdir) / "eval" / "gsm8k" / "base"
    first_shard = out / "samples" / "shard-00000.parquet"
    snake = SnakemakeRun(workdir, "results/eval/gsm8k/base/eval.json")
    # SIGKILL (the OOM killer, a node failure) of the eval job as soon as shard 0 is complete
    assert kill_when(first_shard.exists, snake.proc, "repexp run eval", signal.SIGKILL, "the first sample shard") > 0
    kept = first_shard.stat()
    shards_at_kill = sorted(p.name for p in (out / "samples").glob("shard-*.parquet"))
    assert not (out / "eval.json").exists()
    meta = json.loads((out / "samples" / "meta.json").read_text())
    assert len(shards_at_kill) < meta["num_shards"], "every shard finished before the kill; the test lost its window"

    # Snakemake's retry (`retries:` in eval.smk) must continue from the complete shards, not regenerate them.
    assert snake.wait() == 0, snake.output()[-5000:]
    log = (fx.results(workdir) / "logs" / "eval" / "gsm8k" / "base.log").read_text()
    assert f"eval: {len(shards_at_kill)}/{meta['num_shards']} shards complete" in log, log[-3000:]
    again = first_shard.stat()
    assert (again.st_ino, again.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns), "a complete shard was regenerated"

    resumed = json.loads((out / "eval.json").read_text())
    reference_results = fx.results(fx.reference_run(tmp_path_factory))
    reference = json.loads((reference_results / "eval" / "gsm8k" / "base" / "eval.json").read_text())
    for key in ("pass_at_k", "per_problem", "num_problems", "n_samples", "data_hash"):
        assert resumed[key] == reference[key], key
    # the killed attempt's run (if it was open by then) was ended by the retry: nothing stays RUNNING
    statuses = [r.info.status for r in sorted(node_runs(fx.results(workdir), "eval", "base"),
                                              key=lambda r: r.info.start_time)]
    assert statuses[-1] == "FINISHED" and set(statuses[:-1]) <= {"KILLED"}, statuses


def node_runs(results: Path, rule: str, run_name: str) -> list:
    """The node runs of one rule and sweep point in a results directory's embedded SQLite store."""
    from mlflow import MlflowClient

    from repexp.tracking import default_tracking_uri

    client = MlflowClient(default_tracking_uri(results))
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [r for r in client.search_runs(experiments, max_results=1000)
            if r.data.tags.get("snakemake.rule") == rule and r.data.tags.get("repexp.run") == run_name]


# --------------------------------------------------------------------------- non-finite features

POISON_NORM = """
import sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file

(weights,) = Path(sys.argv[1]).glob("*.safetensors")
tensors = load_file(weights)
norm = tensors["model.norm.weight"]
norm[: norm.numel() // 2] = float("nan")  # the final norm feeds last_hidden_state: NaN and inf features
norm[norm.numel() // 2 :] = float("inf")
save_file(tensors, weights, metadata={"format": "pt"})
"""


@pytest.mark.slow
def test_non_finite_hidden_states_fail_the_training_step_loudly(tmp_path, tiny_assets):
    """Chosen behaviour (docs/reliability.md): the step fails loudly; a NaN reward never reaches the optimizer."""
    results = tmp_path / "results"
    shutil.copytree(tiny_assets / "model", results / "models" / "tiny")
    shutil.copytree(tiny_assets / "data", results / "data" / "gsm8k")
    poisoned = tmp_path / "poisoned_representation_model"
    shutil.copytree(tiny_assets / "model", poisoned)
    poison = run([sys.executable, "-c", POISON_NORM, str(poisoned)])
    assert poison.returncode == 0, poison.stderr
    config = write_pipeline_config(tmp_path / "config.yaml", results,
                                   bonus={"representation_model": str(poisoned)})
    proc = run([REPEXP, "run", "train", "--config", str(config), "--task", "gsm8k", "--run", TRAIN_RUN], timeout=900)
    run_dir = results / "train" / "gsm8k" / TRAIN_RUN
    assert_clear_failure(proc, "NaN or infinite")
    assert not (run_dir / "DONE").exists()
    assert not list((run_dir / "checkpoints").glob("global_step_*")) if (run_dir / "checkpoints").exists() else True
    if (run_dir / "metrics.jsonl").exists():  # only the pre-training validation may have been logged
        for row in read_metrics(run_dir).values():
            assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
            assert not any(k.startswith(("reward/", "repexp/bonus")) for k in row), row


def test_corrupt_training_parquet_is_named_not_a_pyarrow_traceback(tmp_path):
    from repexp.trl.train import read_split

    (tmp_path / "train.parquet").write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(ValueError, match=r"train\.parquet: not a readable parquet file"):
        read_split(tmp_path, "train")
