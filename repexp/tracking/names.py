"""Every name the tracking layer uses: environment variables, run tags and files under
`<results>/mlflow/` (the results layout, repexp.layout, names the directory itself; metric names:
repexp.metrics). Defined here once (no MLflow import).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from repexp.layout import mlflow_dir  # noqa: F401  (`<results>/mlflow`, for the modules of this package)

# --------------------------------------------------------------------------- environment

ENV_CONFIG = "REPEXP_CONFIG"  # the pipeline config snapshot (set by workflow/rules/common.smk)
ENV_TRACKING = "REPEXP_TRACKING"  # "off" disables tracking (nothing logged, no outbox)
# "remote" inside a SLURM jobstep's own Snakemake, whose job ids are not the scheduler's (workflow/rules/common.smk)
ENV_SNAKEMAKE_EXEC = "REPEXP_SNAKEMAKE_EXEC"
ENV_RUN_FILE = "REPEXP_MLFLOW_RUN_FILE"  # set for a trainer whose node run opens while it starts up
# MLflow's own switches, honoured as MLflow documents them
ENV_MLFLOW_URI = "MLFLOW_TRACKING_URI"
ENV_MLFLOW_USERNAME = "MLFLOW_TRACKING_USERNAME"  # HTTP basic auth of MLflow's client (the workflow's server)
ENV_MLFLOW_PASSWORD = "MLFLOW_TRACKING_PASSWORD"
ENV_SYSTEM_METRICS = "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"
ENV_ASYNC_LOGGING = "MLFLOW_ENABLE_ASYNC_LOGGING"

# Rules pass `{{{jobid}}}` (the id in literal braces): a bare `{jobid}` fails `snakemake --lint`, and
# as a param it would make every job outdated whenever the numbering changes.
SNAKEMAKE_JOBID_HELP = "the scheduling Snakemake's job id, tagged snakemake.jobid (braces are stripped)"

# --------------------------------------------------------------------------- run tags

PARENT_KEY_TAG = "repexp.parent_key"  # on parent runs: what they group (point:<task>/<run>, task:<task>, experiment)
SCOPE_KEY_TAG = "repexp.scope_key"  # on node runs: the parent key they belong to
SCOPE_TAG = "repexp.scope"  # on parent runs: point | task | experiment
SWEEP_POINT_TAG = "repexp.sweep_point"  # "<task>/<run>" on a point's parent and node runs (repexp.aggregate reads it)
RESULTS_ID_TAG = "repexp.results_id"  # the results directory a run belongs to (parents are never shared across)
RESULTS_DIR_TAG = "repexp.results_dir"  # its absolute path, for people
RECORD_TAG = "repexp.record_id"  # one per node execution; finds a run again when an outbox record is replayed
EXECUTION_TAG = "repexp.execution"  # 1, 2, ...: how many times this node ran for its sweep point (all attempts)
LOG_TAG = "repexp.log"  # the node's own execution log (repexp.joblog), when `repexp run --log` ran it
PID_TAG = "repexp.pid"  # the process that opened a node run (with the `host` tag: is it still alive?)
SUPERSEDED_TAG = "repexp.superseded_by"  # on a RUNNING run whose process died: the run of the rerun that ended it
ERROR_TAG = "repexp.error"
STOPPED_TAG = "repexp.stopped"  # why a node run ended KILLED on purpose (a walltime chunk)
RULE_TAG = "snakemake.rule"
WILDCARDS_TAG = "snakemake.wildcards"
ATTEMPT_TAG = "snakemake.attempt"
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag

# --------------------------------------------------------------------------- files under <results>/mlflow/

DB_FILE = "mlflow.db"  # the embedded SQLite store (local runs)
ARTIFACTS_DIR = "artifacts"  # the server's artifact root; in an outbox record: its copied artifacts
OUTBOX_DIR = "outbox"
RECORD_FILE = "record.json"  # <outbox>/<record id>/record.json
SYNCED_FILE = "SYNCED"  # next to an uploaded record
SYNC_LOG = "sync.log"  # <outbox>/<record id>/sync.log: the detached upload's output
SERVER_LOG = "server.log"  # `repexp mlflow serve`'s output
PARENTS_LOG = "parents.log"  # the workflow's parent-run creation (onstart)
STORE_LOCK_FILE = ".repexp-tracking.lock"
SYNC_LOCK_FILE = ".sync.lock"
RESULTS_ID_FILE = "results_id"
PARENTS_FILE = "parents.json"  # parent run ids, written once at workflow start (`repexp mlflow parents`)
SERVER_FILE = "server.json"  # the tracking server `repexp mlflow serve` runs for this results directory
CREDENTIALS_FILE = "credentials.json"  # its login (mode 0600): user, password, the URIs it served at
AUTH_CONFIG_FILE = "basic_auth.ini"  # MLflow's basic-auth app config, in the server's private local directory
AUTH_DB_FILE = "basic_auth.db"  # the basic-auth app's users DB, beside it


def outbox_dir(results_dir: str | os.PathLike) -> Path:
    return mlflow_dir(results_dir) / OUTBOX_DIR


def default_tracking_uri(results_dir: str | os.PathLike) -> str:
    """Embedded SQLite store under the results directory (no server; local runs)."""
    return f"sqlite:///{mlflow_dir(results_dir).resolve() / DB_FILE}"


def results_id(results_dir: str | os.PathLike) -> str:
    """The identity of a results directory: a random id kept in `<results>/mlflow/results_id`.

    Parent runs are looked up by (key, results id), so two results directories that log into one
    store under one experiment never share parents. Created on first use; `os.link` makes the
    creation atomic, also across hosts on a shared filesystem.
    """
    path = mlflow_dir(results_dir) / RESULTS_ID_FILE
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    create_once(path, lambda tmp: tmp.write_text(uuid.uuid4().hex[:16] + "\n"))
    return path.read_text().strip()


def create_once(path: Path, write: Callable[[Path], object]) -> bool:
    """Create `path` from a temporary file that `write` fills, by `os.link`: it fails if another process
    created the file first, and theirs wins. True if created here."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    write(tmp)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- MLflow features per node

SYSTEM_METRICS_RULES = ("train", "eval")  # nodes that log MLflow's system metrics (CPU, memory, GPU, disk, network)

# Dataset contexts (`mlflow.data.context` on log_input)
DATASET_CONTEXTS = {"train": "training", "dev": "validation", "test": "evaluation"}
