"""The pipeline on a real single-host SLURM cluster (tests/slurm_cluster.py; docs/slurm.md).

The cluster is started once for this module from Debian's packages (installed on demand by
workflow/scripts/install_slurm.sh) and torn down at the end; the tests skip, with the reason,
only where SLURM cannot be installed or started here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# First status poll of the Snakemake SLURM executor (default 40 s; short jobs here).
SLURM_STATUS_INIT_S = 5


def _load_harness():
    spec = importlib.util.spec_from_file_location("repexp_tests_slurm_cluster", Path(__file__).with_name("slurm_cluster.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


harness = _load_harness()


@pytest.fixture(scope="module")
def cluster():
    try:
        started = harness.SlurmCluster.start_new()
    except harness.SlurmUnavailable as err:
        pytest.skip(f"no SLURM cluster: {err}")
    yield started
    started.stop()
    started.remove_files()


def test_batch_job_with_nested_srun_is_visible_and_recorded(cluster):
    # The Snakemake jobstep strips SLURM_CONF before its nested `srun`; emulate that here.
    job = cluster.sbatch("echo job=$SLURM_JOB_ID; env -u SLURM_CONF srun -n1 echo nested-step-ran", name="smoke")
    assert cluster.wait(job) == "COMPLETED", cluster.diagnostics()
    log = cluster.job_log("smoke", job).read_text()
    assert f"job={job}" in log and "nested-step-ran" in log
    assert cluster.squeue(name="smoke")[job] == {"name": "smoke", "state": "COMPLETED"}
    (record,) = [r for r in cluster.job_records() if r["JobId"] == job]
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0"
    assert record["NodeList"] == "localhost"


def test_failed_job_keeps_its_exit_code(cluster):
    job = cluster.sbatch("echo about-to-fail >&2; exit 3", name="fails")
    assert cluster.wait(job) == "FAILED"
    (record,) = [r for r in cluster.job_records() if r["JobId"] == job]
    assert record["ExitCode"] == "3:0"
    assert "about-to-fail" in cluster.job_log("fails", job).read_text()


def test_no_accounting_database_so_status_comes_from_squeue(cluster):
    """The documented trade-off (docs/slurm.md): no slurmdbd, sacct is disabled, squeue keeps jobs."""
    proc = subprocess.run(["sacct", "-X", "--noheader"], env=cluster.env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "accounting storage is disabled" in (proc.stdout + proc.stderr)
    config = subprocess.run(["scontrol", "show", "config"], env=cluster.env(), capture_output=True, text=True).stdout
    min_job_age = next(line for line in config.splitlines() if line.startswith("MinJobAge"))
    # Snakemake's plugin uses squeue only while MinJobAge >= 3 x the first status-check delay.
    assert int(min_job_age.split("=")[1].split()[0]) >= 3 * SLURM_STATUS_INIT_S
