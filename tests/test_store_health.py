"""A damaged or vanished MLflow store never silently loses the experiment's history (issue 27, item 1).

Real MLflow SQLite stores in tmp_path, real `repexp mlflow` commands and a real Snakemake run; the
damage is what the fault-injection run did: the file truncated to half, then deleted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from repexp import tracking as T
from repexp.tracking import health

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REPEXP = str(BIN / "repexp")
SNAKEMAKE = str(BIN / "snakemake")


def _env(**extra) -> dict:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop(T.ENV_TRACKING, None)
    return env


def _truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _runs(db: Path) -> set[str]:
    """The run ids in a store, read with sqlite3: an MlflowClient in this process would keep its
    cached engine on the file a restore renames away."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {row[0] for row in con.execute("SELECT run_uuid FROM runs")}
    finally:
        con.close()


def _repexp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([REPEXP, *args], capture_output=True, text=True, env=_env(), timeout=300)


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(T.ENV_TRACKING, raising=False)


def test_damaged_then_vanished_store_nodes_keep_records_sync_names_the_fix_restore_brings_it_back(
        tmp_path, clean_env):
    results = tmp_path / "results"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"name": "health-test", "results_dir": str(results), "model": "tiny",
                                   "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8],
                                             "betas": [0.01], "seeds": [42]}}))
    db = results / "mlflow" / "mlflow.db"
    with T.node_run("eval", "gsm8k", "base", config=cfg) as node:
        node.log_metrics({"pass_at_1": 0.5}, step=1)
    assert node.online
    runs = health.record_healthy(db, results)
    assert runs == len(_runs(db)) >= 2  # the node's run and its parent
    assert health.problem(db, results) is None

    first = health.backup(db, keep=2)
    assert first is not None and health.inspect(first) == (None, runs)
    assert health.backup(db, keep=2) is None  # unchanged since: no copy of a copy
    for _ in range(2):
        with T.node_run("eval", "gsm8k", "base", config=cfg):
            pass
        time.sleep(0.01)
        assert health.backup(db, keep=2) is not None
    assert len(health.backups(db)) == 2 and first not in health.backups(db)  # rotated: the newest two
    backed_up = health.inspect(health.backups(db)[0])[1]

    # the fault-injection run's first fault: the store truncated to half
    _truncate(db)
    found = health.problem(db, results)
    assert found is not None and found.kind == "damaged"
    with T.node_run("eval", "gsm8k", "base", config=cfg) as offline:  # a node never writes into it
        pass
    assert not offline.online and "damaged" in offline.offline_reason and str(db) in offline.offline_reason
    assert len(T.pending_records(results)) == 1

    proc = _repexp("mlflow", "sync", "--config", str(cfg))
    assert proc.returncode == 1, proc.stderr
    assert str(db) in proc.stderr and f"repexp mlflow restore --store sqlite:///{db}" in proc.stderr
    assert "--new-store" in proc.stderr and "Nothing was uploaded" in proc.stderr
    assert len(T.pending_records(results)) == 1

    proc = _repexp("mlflow", "restore", "--store", f"sqlite:///{db}")
    assert proc.returncode == 0, proc.stderr
    assert health.problem(db, results) is None and len(_runs(db)) == backed_up
    (damaged,) = db.parent.glob("mlflow.db.damaged-*")  # nothing is deleted
    assert damaged.stat().st_size < db.stat().st_size

    proc = _repexp("mlflow", "sync", "--config", str(cfg))
    assert proc.returncode == 0 and "1 record(s) uploaded" in proc.stderr and str(db) in proc.stderr, proc.stderr
    assert len(_runs(db)) == backed_up + 1  # the record kept during the damage is in the store now

    # the second fault: the store deleted. Nodes and sync never replace it with an empty one.
    healthy_runs = health.record_healthy(db, results)
    db.unlink()
    assert health.problem(db, results).kind == "missing"
    with T.node_run("eval", "gsm8k", "base", config=cfg) as offline:
        pass
    assert not offline.online and not db.exists()
    proc = _repexp("mlflow", "sync", "--config", str(cfg))
    assert proc.returncode == 1 and "is missing" in proc.stderr and f"{healthy_runs} runs" in proc.stderr
    assert not db.exists()

    # starting afresh is one explicit flag; the record kept meanwhile lands in the new store
    proc = _repexp("mlflow", "sync", "--config", str(cfg), "--new-store")
    assert proc.returncode == 0 and "1 record(s) uploaded" in proc.stderr, proc.stderr
    assert health.problem(db, results) is None
    # a store this results directory never used is simply new
    assert health.problem(tmp_path / "elsewhere" / "mlflow.db", results) is None


def test_an_empty_file_nobody_used_is_a_new_store_but_one_that_was_used_is_damaged(tmp_path):
    results = tmp_path / "results"
    db = results / "mlflow" / "mlflow.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"")
    assert health.problem(db, results) is None
    health.write_json_atomic(health.ledger_path(results), {str(db.resolve()): {"runs": 7, "last_seen": 0.0}})
    found = health.problem(db, results)
    assert found.kind == "damaged" and "empty" in found.detail and "7 runs" in found.message("x")
    assert "No backup of it exists" in found.message("x")


_EMPTY_STORE = ("import sys; from mlflow import MlflowClient; "
                "MlflowClient(tracking_uri=sys.argv[1]).search_experiments()")


def test_an_empty_or_foreign_store_in_place_of_a_known_one_is_refused_like_a_deleted_one(tmp_path, clean_env,
                                                                                           capsys):
    """The fault-injection run's empty store: `mlflow.db` deleted and re-created empty by an MLflow client;
    then the store shrunk by a run, whose backup must not rotate out the larger one's."""
    import sqlite3

    from repexp.tracking.workflow import guard_store

    results = tmp_path / "results"
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({"name": "swap-test", "results_dir": str(results), "model": "tiny",
                                        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8],
                                                  "betas": [0.01], "seeds": [42]}}))
    from repexp.tracking.node import load_config

    cfg = load_config(str(cfg_path))
    db = results / "mlflow" / "mlflow.db"
    for _ in range(2):
        with T.node_run("eval", "gsm8k", "base", config=cfg):
            pass
    runs = len(_runs(db))
    guard_store(cfg, db)  # a workflow's start: healthy, recorded and backed up
    (good,) = health.backups(db)
    assert health.read_ledger(results)[str(db.resolve())]["runs"] == runs

    db.unlink()  # any MLflow client (or `mlflow ui`) on that path now creates an empty store
    subprocess.run([sys.executable, "-c", _EMPTY_STORE, f"sqlite:///{db}"], check=True, env=_env(), timeout=120)
    assert db.exists() and not _runs(db)
    found = health.problem(db, results)
    assert found is not None and found.kind == "replaced" and "another store" in found.detail
    with pytest.raises(SystemExit) as stop:  # the workflow's start
        guard_store(cfg, db)
    assert stop.value.code == 1
    assert health.record_healthy(db, results) is None  # the ledger keeps the count of the store it stands for
    assert health.read_ledger(results)[str(db.resolve())]["runs"] == runs
    assert health.backups(db) == [good]  # the empty store was not backed up
    with T.node_run("eval", "gsm8k", "base", config=cfg) as node:  # a node keeps its record instead
        pass
    assert not node.online and "not the store it was" in node.offline_reason and not _runs(db)
    proc = _repexp("mlflow", "sync", "--config", str(cfg_path))
    assert proc.returncode == 1 and f"the MLflow store {db} is not the store it was" in proc.stderr, proc.stderr
    assert f"({runs} runs when last seen healthy" in proc.stderr and f"{good.name}: {runs} runs" in proc.stderr
    assert f"repexp mlflow restore --store sqlite:///{db}" in proc.stderr and "--new-store" in proc.stderr

    assert health.restore(db, results)[0] == good  # `repexp mlflow restore`
    assert len(_runs(db)) == runs and health.problem(db, results) is None
    assert list(db.parent.glob("mlflow.db.damaged-*"))  # the empty store is kept aside, not deleted

    # the same store with fewer runs than counted (a copy from before some runs)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM runs WHERE run_uuid = (SELECT run_uuid FROM runs ORDER BY start_time DESC LIMIT 1)")
    found = health.problem(db, results, thorough=False)
    assert found.kind == "replaced" and f"holds {runs - 1} runs, fewer than the {runs}" in found.detail

    # its backup never pushes out the copy of the larger store, and says so
    time.sleep(0.01)
    capsys.readouterr()
    smaller = health.backup(db, keep=1)
    assert smaller is not None and health.backups(db) == [smaller, good]
    warning = capsys.readouterr().err
    assert "WARNING: kept the backup" in warning and str(good) in warning and f"({runs} runs)" in warning
    assert f"at most {runs - 1} runs" in warning


def _snakemake(workdir: Path, config: Path, target: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
                           "--configfile", str(config), "--cores", "1", target, *extra],
                          cwd=REPO, capture_output=True, text=True, env=_env(), timeout=600)


def _wait_for_parents(results: Path, timeout: float = 120) -> None:
    """The workflow creates its parent runs beside the first jobs on a SQLite store: let it finish."""
    deadline = time.monotonic() + timeout
    while not (results / "mlflow" / "parents.json").exists():
        assert time.monotonic() < deadline, "parents.json was never written"
        time.sleep(0.5)


def test_the_workflow_stops_before_any_job_on_a_damaged_or_missing_store_and_says_how_on(tmp_path):
    results = tmp_path / "results"
    raw = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    raw.update(results_dir=str(results), data={"split_seed": 0})  # targets: relative to the workdir (Snakemake's form)
    raw["sweep"]["tasks"] = ["arith", "arith-hard"]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    db = results / "mlflow" / "mlflow.db"
    data = results / "data"

    proc = _snakemake(tmp_path, config, "results/data/arith/test.parquet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _wait_for_parents(results)
    before = _runs(db)
    assert before
    # the first workflow created the store; its end backed it up, parents (created beside the jobs) included
    newest = health.newest_backup(db)
    assert newest is not None and newest[2] == len(before), health.backups(db)

    # a second start backs the store up, then the store is damaged
    proc = _snakemake(tmp_path, config, "results/data/arith/test.parquet", "--forcerun", "preprocess")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert health.backups(db)
    _truncate(db)
    target = data / "arith-hard" / "test.parquet"
    relative = str(target.relative_to(tmp_path))
    proc = _snakemake(tmp_path, config, relative)
    assert proc.returncode != 0
    assert f"the MLflow store {db} is damaged" in proc.stderr and "No job was started" in proc.stderr
    assert f"repexp mlflow restore --store sqlite:///{db}" in proc.stderr
    assert 'tracking.new_store=true' in proc.stderr
    assert not target.exists()

    proc = _repexp("mlflow", "restore", "--store", f"sqlite:///{db}")
    assert proc.returncode == 0, proc.stderr
    proc = _snakemake(tmp_path, config, relative)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert target.exists() and before <= _runs(db)  # the history is back

    # deleted: stopped again, then a new store only when asked for
    db.unlink()
    stamp = target.stat().st_mtime
    proc = _snakemake(tmp_path, config, relative, "--forcerun", "preprocess")
    assert proc.returncode != 0 and f"the MLflow store {db} is missing" in proc.stderr
    assert target.stat().st_mtime == stamp and not db.exists()
    proc = _snakemake(tmp_path, config, relative, "--forcerun", "preprocess",
                      "--config", "set=tracking.new_store=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "a new, empty MLflow store" in proc.stderr and target.stat().st_mtime > stamp
    assert db.exists()


# --------------------------------------------------------------------------- a full disk (issue 27, item 2)

_NODE_ATTEMPT = """
import sys
from repexp import tracking as T
config, artifact, points = sys.argv[1], sys.argv[2], int(sys.argv[3])
with T.node_run("eval", "gsm8k", "base", config=config) as node:
    node.log_metric_rows([[f"m{i % 50}", float(i), i, 0] for i in range(points)])
    if artifact:
        node.log_artifact(artifact)
    raise SystemExit(3)  # the attempt fails, as ENOSPC made it fail
"""


def _small_disk():
    """In the child: every file it writes may grow to 32 KiB only (writes beyond fail with EFBIG,
    an OSError like ENOSPC; a real full filesystem needs privileges a test machine may lack)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, 32 * 1024))


def test_attempts_that_fail_on_a_full_disk_keep_a_record_and_sync_uploads_both(tmp_path, clean_env):
    import socket

    with socket.socket() as sock:  # a closed port: the nodes are offline and everything goes to the outbox
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    results = tmp_path / "results"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"name": "disk-test", "results_dir": str(results), "model": "tiny",
                                   "tracking": {"tracking_uri": dead},
                                   "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8],
                                             "betas": [0.01], "seeds": [42]}}))
    big = tmp_path / "eval.json"
    big.write_text("x" * 100_000)  # too big to copy into the outbox on the small disk
    T.results_id(results)  # as the workflow's start leaves it

    def attempt(artifact: str, points: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _NODE_ATTEMPT, str(cfg), artifact, str(points)],
                              capture_output=True, text=True, env=_env(), preexec_fn=_small_disk, timeout=300)

    # 1: its end (5,000 metric points) cannot be written: the record it wrote when it started stays
    first = attempt("", 5000)
    assert first.returncode == 3, first.stderr
    assert "could not write" in first.stderr and "stays there" in first.stderr
    # 2: its end is written, but its artifact cannot be copied: the record points at the output
    second = attempt(str(big), 10)
    assert second.returncode == 3, second.stderr
    records = {d.name: T.Record.load(d) for d in T.pending_records(results)}
    assert sorted(r.status for r in records.values()) == ["FAILED", "RUNNING"]
    (failed,) = [r for r in records.values() if r.status == "FAILED"]
    assert "artifacts not copied" in failed.error and failed.artifacts == [[str(big.resolve()), None]]

    # an outbox directory with no record at all (cut off before this change) is reported, not skipped
    orphan = results / "mlflow" / "outbox" / ("0" * 32)
    (orphan / "artifacts").mkdir(parents=True)
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))

    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    proc = _repexp("mlflow", "sync", "--config", str(cfg), "--tracking-uri", f"sqlite:///{store}")
    assert proc.returncode == 1 and "2 record(s) uploaded, 1 still pending" in proc.stderr, proc.stderr
    assert f"{orphan}: no record.json" in proc.stderr

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    exp = client.get_experiment_by_name("disk-test")
    nodes = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("snakemake.rule") == "eval"]
    by_status = {r.info.status: r for r in nodes}
    assert sorted(by_status) == ["FAILED", "KILLED"]  # both attempts reached MLflow
    assert "never recorded" in by_status["KILLED"].data.tags["repexp.error"]
    assert "artifacts not copied" in by_status["FAILED"].data.tags["repexp.error"]
    assert [a.path for a in client.list_artifacts(by_status["FAILED"].info.run_id)] == ["eval.json"]
