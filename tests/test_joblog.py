"""Each execution of a job keeps its own log and number, and a failure keeps its cause.

Real `repexp run` processes (the rules' one command), a real child process that fails, a real MLflow
SQLite store for the uploads; a closed port stands for an unreachable tracking server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from repexp import layout as L
from repexp.tracking.names import EXECUTION_TAG, LOG_TAG

BIN = Path(sys.executable).parent
NO_SPACE = "OSError: [Errno 28] No space left on device"

_ATTEMPT = """
import subprocess, sys
from repexp import joblog
log = joblog.start(sys.argv[1])
print("before the child", flush=True)
since = log.mark()
subprocess.run([sys.executable, "-c", "import os; print('x' * 100000); raise OSError(28, os.strerror(28))"])
cause = log.cause(since)
joblog.stop()
print(f"CAUSE={cause!r} EXECUTION={log.execution}", file=sys.stderr)
"""


def _small_disk():
    """Files written by the process may grow to 32 KiB only (EFBIG, an OSError like a full disk's)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, 32 * 1024))


def test_a_failed_childs_cause_is_kept_when_its_log_cannot_be_written_and_each_execution_has_its_own_log(tmp_path):
    log = tmp_path / "logs" / "train" / "gsm8k" / "run.log"
    for execution in (1, 2):  # two attempts of one job, each on a disk too full for the child's traceback
        proc = subprocess.run([sys.executable, "-c", _ATTEMPT, str(log)], capture_output=True, text=True,
                              preexec_fn=_small_disk, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        # the cause, from the output's tail kept in memory
        assert f"CAUSE={NO_SPACE!r} EXECUTION={execution}" in proc.stderr, proc.stderr[-2000:]
        assert proc.stdout.startswith("before the child\n")  # the output still goes where it went
    logs = L.execution_logs(log)
    assert sorted(logs) == [1, 2] and logs[1] == log.with_name("run.execution-1.log")
    for path in logs.values():  # each execution's own file, cut off by the full disk (stdout and stderr reach
        # it side by side, so whether the traceback got in before the cut is a race: the cause above is not)
        text = path.read_text()
        assert text.startswith("before the child\n") and path.stat().st_size == 32 * 1024


def _config(tmp_path: Path, results: Path, uri: str) -> Path:
    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "test.yaml").read_text())
    raw.update(results_dir=str(results), tracking={"tracking_uri": uri})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_executions_keep_their_own_numbers_and_logs_in_the_outbox_and_in_mlflow(tmp_path):
    """Two failed executions of one job while the server is down; the later one is uploaded first.
    Before, it became execution 1 (the number came from the runs the store already held: two attempts
    on a full disk were both named "#2"), and Snakemake's log held the last attempt only."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key in ("MLFLOW_TRACKING_URI", "REPEXP_TRACKING", "REPEXP_CONFIG"):
        env.pop(key, None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    results = tmp_path / "results"
    config = _config(tmp_path, results, dead)
    log = L.log_file(results, "select", "gsm8k", "trl_grpo_s42")
    log.parent.mkdir(parents=True)
    for attempt in (1, 1):  # Snakemake's attempt starts at 1 again after `snakemake --unlock`
        with open(log, "w") as shell_redirect:  # the rule's `> {log} 2>&1`
            proc = subprocess.run([str(BIN / "repexp"), "run", "select", "--config", str(config), "--task", "gsm8k",
                                   "--run", "trl_grpo_s42", "--attempt", str(attempt), "--log", str(log)],
                                  stdout=shell_redirect, stderr=shell_redirect, env=env, timeout=300)
        assert proc.returncode == 1, log.read_text()
    logs = L.execution_logs(log)
    assert sorted(logs) == [1, 2] and all("best_dev.json: missing" in path.read_text() for path in logs.values())
    records = {}
    for record in (results / "mlflow" / "outbox").glob("*/record.json"):
        data = json.loads(record.read_text())
        records[int(data["tags"][EXECUTION_TAG])] = (record.parent, data)
    assert sorted(records) == [1, 2]
    assert all(data["tags"][LOG_TAG] == str(logs[n].resolve()) for n, (_, data) in records.items())

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    # the later execution reaches the store first (the earlier one's record is still in the outbox)
    proc = subprocess.run([str(BIN / "repexp"), "mlflow", "sync", "--record", str(records[2][0]),
                           "--tracking-uri", f"sqlite:///{db}"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import sqlite3

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:  # read as stored, no MLflow client needed
        named = con.execute("SELECT t.value, r.name FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                            "WHERE t.key = ? AND r.name LIKE 'select %'", (EXECUTION_TAG,)).fetchall()
    assert named == [("2", "select gsm8k/trl_grpo_s42 #2")]
