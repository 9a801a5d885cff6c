"""The pipeline on a real single-host SLURM cluster (tests/slurm_cluster.py; docs/slurm.md).

The cluster is started once for this module from Debian's packages (installed on demand by
workflow/scripts/install_slurm.sh) and torn down at the end; the tests skip, with the reason,
only where SLURM cannot be installed or started here.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from repexp import config as C

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# First status poll of the Snakemake SLURM executor (default 40 s; short jobs here).
SLURM_STATUS_INIT_S = 5


import slurm_cluster as harness  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)


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


import _reliability_fixtures as fx  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)

# The end-to-end SLURM run is configs/test.yaml's DAG with two of its five methods, RepExp and GRPO (the paper's
# comparison), and the base model. What it checks holds per rule, not per method: every job goes through sbatch
# with its own log and exit code, MLflow goes through the workflow's server, the node runs carry their SLURM
# tags, the numbers equal the local run's. Every method runs through the same rules in the session's local
# reference run, which this test compares with; the other three methods cost 9 more sbatch jobs here, each with
# a Snakemake jobstep process of its own (docs/performance.md, "CI time").
SLURM_METHODS = ("repexp", "grpo")
_SLURM_SWEEP = {"methods": {name: grid for name, grid in yaml.safe_load(fx.TEST_CONFIG.read_text())["sweep"]["methods"]
                            .items() if name in SLURM_METHODS}}
# The rules of that DAG and how many jobs each has (1 task, one trained run per method + base): through sbatch,
# and the localrules that run in the main Snakemake process on the submit host.
_RUNS = [spec for spec in C.sweep_runs(C.load(fx.TEST_CONFIG)) if spec.method in (*SLURM_METHODS, "base")]
_TRAINED = len([spec for spec in _RUNS if spec.trains])
EXPECTED_JOBS = {"model": 1, "preprocess": 1, "train": _TRAINED, "eval": len(_RUNS), "testtime": len(_RUNS)}
LOCAL_JOBS = {"select": _TRAINED, "aggregate": 1, "figures": 1}


@pytest.mark.slow
@pytest.mark.parametrize("feature, runs", [("no_such_gpu", False)])
def test_a_node_constraint_reaches_sbatch(cluster, tmp_path, feature, runs):
    """resources.<rule>.constraint becomes sbatch's --constraint (docs/slurm.md "GPU types"): the
    test node has the feature repexp_test, so a job asking for it runs and one asking for a
    feature no node has is refused by sbatch itself, before anything runs. The job asking for
    repexp_test is the preprocess job of test_pipeline_end_to_end_through_slurm_matches_the_local_run
    (`NODE_CONSTRAINT`), which checks it ran through sbatch; its own run here cost about 27 s."""
    fx.isolated_config(tmp_path, tracking={"server": "off"})
    env = cluster.env(fx.quiet_env(REPEXP_SLURM_PARTITION=harness.PARTITION,
                                   REPEXP_SLURM_GPU_PARTITION=harness.PARTITION))
    manifest = fx.results(tmp_path) / "data" / "gsm8k" / "manifest.json"
    # the target relative to the workdir: the rules' outputs are written relative to it (_for_jobs)
    cmd = [*fx.snakemake_cmd(tmp_path, str(manifest.relative_to(tmp_path)), profile="slurm"),
           "--config", f"set=resources.preprocess.constraint={feature}",
           "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", str(SLURM_STATUS_INIT_S)]
    proc = subprocess.run(cmd, cwd=fx.REPO, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    if runs:
        assert proc.returncode == 0 and manifest.is_file(), f"{fx.output_tail(proc)}\n{cluster.diagnostics()}"
        assert "submitted with SLURM jobid" in output
    else:
        assert proc.returncode != 0 and not manifest.exists()
        assert "Invalid feature specification" in output, fx.output_tail(proc)


NODE_CONSTRAINT = f"set=resources.preprocess.constraint={harness.FEATURE}"


def test_pipeline_end_to_end_through_slurm_matches_the_local_run(cluster, tmp_path, tmp_path_factory):
    workdir = tmp_path
    # The cluster default (tracking.server: auto): the workflow starts `mlflow server` on the submit host and
    # every job logs over HTTP. Here it binds loopback and keeps its store in the test's tmp dir.
    server_db = tmp_path / "server-store" / "mlflow.db"
    fx.isolated_config(workdir, tracking={"server_host": "127.0.0.1", "server_store": f"sqlite:///{server_db}"},
                       sweep=_SLURM_SWEEP)
    assert [spec.name for spec in C.sweep_runs(C.load(workdir / "config.yaml"))] == [spec.name for spec in _RUNS]
    # Account and partitions come from the REPEXP_SLURM_* variables (docs/slurm.md); no account here.
    env = cluster.env(fx.quiet_env(REPEXP_SLURM_PARTITION=harness.PARTITION,
                                   REPEXP_SLURM_GPU_PARTITION=harness.PARTITION))
    cmd = [
        *fx.snakemake_cmd(workdir, "all", profile="slurm"),
        # a node constraint the test node meets (test_a_node_constraint_reaches_sbatch: one it does not meet)
        "--config", NODE_CONSTRAINT,
        # no slurmdbd on the test cluster: poll with squeue (docs/slurm.md), first poll after 5 s
        "--slurm-status-command", "squeue",
        "--slurm-init-seconds-before-status-checks", str(SLURM_STATUS_INIT_S),
        "--slurm-keep-successful-logs",
    ]
    earlier = {r["JobId"] for r in cluster.job_records()}  # other tests of this module share the cluster
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=fx.REPO, env=env, capture_output=True, text=True, timeout=1500)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"{fx.output_tail(proc)}\n{cluster.diagnostics()}"
    print(f"snakemake --profile slurm all: {elapsed:.0f} s")

    # Every job went through sbatch: SLURM recorded it (the jobcomp file; squeue forgets a job
    # MinJobAge = 600 s after it ends, which a slow run outlasts), it completed, and left its own log.
    jobs = {r["JobId"]: r for r in cluster.job_records()
            if r["Name"].startswith("repexp_") and r["JobId"] not in earlier}
    assert jobs and {r["JobState"] for r in jobs.values()} == {"COMPLETED"}, jobs
    assert len(jobs) == sum(EXPECTED_JOBS.values()), jobs
    assert all(r["ExitCode"] == "0:0" for r in jobs.values())
    slurm_logs = workdir / ".snakemake" / "slurm_logs"
    for rule, count in EXPECTED_JOBS.items():
        logs = sorted((slurm_logs / f"rule_{rule}").rglob("*.log"))
        assert len(logs) == count, (rule, logs)
        assert {log.stem for log in logs} <= set(jobs)
    submitted = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                 if "submitted with SLURM jobid" in line]
    assert len(submitted) == len(jobs)
    for rule in LOCAL_JOBS:  # localrules never reach sbatch
        assert not (slurm_logs / f"rule_{rule}").exists(), rule

    # Same seeds, same numbers: every eval.json agrees with the local-profile run.
    reference = fx.results(fx.reference_run(tmp_path_factory))
    ours = fx.results(workdir)
    evals = sorted(p.relative_to(ours) for p in (ours / "eval").rglob("eval.json"))
    assert [rel.parent.name for rel in evals] == sorted(spec.name for spec in _RUNS)
    for rel in evals:
        mine, theirs = json.loads((ours / rel).read_text()), json.loads((reference / rel).read_text())
        for key in ("pass_at_k", "per_problem", "num_problems", "n_samples", "checkpoint_step", "data_hash"):
            assert mine[key] == theirs[key], (rel, key, mine[key], theirs[key])
    # the table's rows of these runs are the reference's (its columns: those of the methods swept here)
    table = Path("aggregate") / "pass_at_k.csv"
    mine = _table_without_paths(ours / table)
    assert {row["run"] for row in mine} == {spec.name for spec in _RUNS}
    columns = list(mine[0])
    theirs = [row for row in _table_without_paths(reference / table) if row["run"] in {spec.name for spec in _RUNS}]
    assert set(columns) <= set(theirs[0]), (columns, list(theirs[0]))
    assert mine == [{key: row[key] for key in columns} for row in theirs]

    # MLflow went through the workflow's tracking server: started before the first job, stopped at the end;
    # no job opened a SQLite file on the shared results directory.
    output = proc.stdout + proc.stderr
    assert "MLflow server started: http://127.0.0.1:" in output, output[-3000:]
    assert not (ours / "mlflow" / "mlflow.db").exists()
    assert not (ours / "mlflow" / "server.json").exists()  # stopped with the workflow
    assert any((ours / "mlflow" / "artifacts").rglob("eval.json"))  # uploaded through the server
    # Every node run names its SLURM job; the jobstep's own Snakemake renumbers its jobs,
    # so no `snakemake.jobid` tag there (the main log's "submitted with SLURM jobid" line links them)
    from mlflow import MlflowClient

    from repexp.tracking import pending_records

    assert pending_records(ours) == []
    client = MlflowClient(tracking_uri=f"sqlite:///{server_db}")  # the server's own store, read after it stopped
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000)
    nodes = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(nodes) == len(jobs) + sum(LOCAL_JOBS.values())
    remote = [r for r in nodes if r.data.tags["snakemake.rule"] in EXPECTED_JOBS]
    assert {r.data.tags["slurm.job_id"] for r in remote} == set(jobs)
    assert not [r for r in remote if "snakemake.jobid" in r.data.tags]
    assert not [r for r in nodes if r not in remote and "slurm.job_id" in r.data.tags]  # localrules: submit host
    assert {r.info.status for r in runs} == {"FINISHED"}
    parents = {r.info.run_id for r in runs if "repexp.parent_key" in r.data.tags}
    # the experiment's, the task's and one per sweep point: made at start
    assert len(parents) == 2 + len(_RUNS) and {r.data.tags["mlflow.parentRunId"] for r in nodes} <= parents


def _table_without_paths(path: Path) -> list[dict]:
    """The aggregate table without `model_path` (absolute, so it differs between workdirs)."""
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k != "model_path"} for row in csv.DictReader(handle)]


CHUNK_RUN = "trl_repexp_k8_b0.01_s42"  # the RepExp point of configs/test.yaml
# 4 steps, checkpoint and validation every 2; the bonus stays on although the tiny model never
# answers correctly, so the policy really moves and equal final weights mean something.
CHUNK_TRAINING = "train.total_steps=4 train.test_freq=2 train.save_freq=2 bonus.turn_off_if_none_correct=false"
# A 1-minute allocation whose chunk deadline (0.98 min before the end) has passed once training
# starts: every allocation trains exactly one step, saves it and requeues the job (repexp.walltime).
CHUNK_WALLTIME = "resources.train.runtime=1 train.walltime_margin_minutes=0.98"


def _trainer_job_ids() -> set[str]:
    """SLURM job ids of the TRL trainer processes running on this host."""
    import psutil

    ids = set()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "repexp.trl.train" in " ".join(proc.info["cmdline"] or []):
                ids.add(proc.environ().get("SLURM_JOB_ID", ""))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ids - {""}


def _job_state(cluster, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], env=cluster.env(), capture_output=True, text=True,
                         timeout=30)
    found = re.search(r"\bJobState=(\w+)", out.stdout)
    return found.group(1) if found else ""


def _last_step(workdir: Path) -> int:
    """The last step the chunked training wrote to its metrics.jsonl (-1 before any)."""
    metrics = fx.results(workdir) / "train" / "gsm8k" / CHUNK_RUN / "metrics.jsonl"
    steps = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue  # a line being written
    return max(steps, default=-1)


def test_training_spans_walltime_chunks_and_a_preemption_and_matches_an_uninterrupted_run(cluster, tmp_path):
    """Issue 23, items 2 and 3. Under `--profile slurm` one training spans five allocations of one
    SLURM job: three end at the walltime chunk's deadline (the trainer saves, writes CHUNK_END, the
    job requeues itself), one is preempted by `scontrol requeue` from outside while its trainer
    starts, the last one finishes. It ends with the metrics.jsonl, best_dev.json and final weights
    of an uninterrupted local run, and MLflow holds every (metric, step) of the finished run once."""
    target = f"results/train/gsm8k/{CHUNK_RUN}/DONE"
    slurm_dir, local_dir = tmp_path / "slurm", tmp_path / "local"
    for workdir in (slurm_dir, local_dir):
        workdir.mkdir()
        fx.isolated_config(workdir, tracking={"server": "off"})
    env = cluster.env(fx.quiet_env(REPEXP_SLURM_PARTITION=harness.PARTITION,
                                   REPEXP_SLURM_GPU_PARTITION=harness.PARTITION))
    cmd = [*fx.snakemake_cmd(slurm_dir, target, profile="slurm"),
           "--config", f"set={CHUNK_TRAINING} {CHUNK_WALLTIME}",
           "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", str(SLURM_STATUS_INIT_S)]
    proc = subprocess.Popen(cmd, cwd=fx.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    job_id, preempted = None, None
    deadline = time.monotonic() + 1200
    while proc.poll() is None:
        assert time.monotonic() < deadline, "".join(output)[-5000:]
        cluster.release_requeued()
        running = _trainer_job_ids()
        if running:
            job_id = job_id or next(iter(running))
            # preempt the third allocation while its trainer starts (steps 1 and 2 are chunks behind it), or
            # the fourth where a loaded machine let the third pass unseen: either way one allocation more.
            # Only a RUNNING allocation whose trainer has not yet written its step: a trainer seen between
            # its chunk's end and the job's self-requeue, or one already done, is not preempted.
            restarts = cluster.restarts(job_id) if preempted is None else None
            if restarts in (2, 3) and _job_state(cluster, job_id) == "RUNNING" \
                    and _last_step(slurm_dir) <= restarts:
                requeue = subprocess.run(["scontrol", "requeue", job_id], env=cluster.env(), capture_output=True,
                                         text=True, timeout=30)
                assert requeue.returncode == 0, requeue.stderr
                preempted = restarts
        time.sleep(0.5)
    reader.join(timeout=30)
    text = "".join(output)
    assert proc.returncode == 0, f"{text[-6000:]}\n{cluster.diagnostics()}"
    assert preempted is not None and job_id is not None
    assert cluster.restarts(job_id) == 4, text[-4000:]  # 3 chunk ends + 1 preemption: 5 allocations

    local = fx.run([*fx.snakemake_cmd(local_dir, target), "--config", f"set={CHUNK_TRAINING}"], cwd=fx.REPO,
                   env=fx.quiet_env())
    assert local.returncode == 0, fx.output_tail(local)

    ours, theirs = (fx.results(d) / "train" / "gsm8k" / CHUNK_RUN for d in (slurm_dir, local_dir))
    done = json.loads((ours / "DONE").read_text())
    assert done["final_step"] == 4 and done["resumed_from_step"] == 3
    strip = lambda rows: [{k: v for k, v in r.items()  # noqa: E731
                           if not k.startswith("timing_s/") and k != "step_time"} for r in rows]  # clocks differ
    got, want = (strip(json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines())
                 for d in (ours, theirs))
    assert [r["step"] for r in got] == [r["step"] for r in want] == [0, 1, 2, 3, 4]
    for mine, reference in zip(got, want):
        assert mine == pytest.approx(reference, rel=1e-5, abs=1e-7), mine["step"]
    best = [json.loads((d / "best_dev.json").read_text()) for d in (ours, theirs)]
    assert best[0]["history"] == best[1]["history"] and best[0]["best_step"] == best[1]["best_step"]
    import torch
    from safetensors.torch import load_file

    from repexp.checkpoints import checkpoint_dir

    final = [load_file(checkpoint_dir(d, 4) / "model.safetensors") for d in (ours, theirs)]
    first = load_file(checkpoint_dir(ours, 1) / "model.safetensors")
    assert any(not torch.equal(t, first[name]) for name, t in final[1].items()), "weights never changed"
    for name, tensor in final[1].items():
        torch.testing.assert_close(final[0][name], tensor, rtol=1e-5, atol=1e-6)

    # MLflow: one node run per allocation. Chunk ends are KILLED on purpose (repexp.stopped), the
    # preempted allocation FAILED with SIGTERM, the last FINISHED; each names its SLURM restart.
    from mlflow import MlflowClient

    from repexp.tracking import default_tracking_uri

    client = MlflowClient(default_tracking_uri(fx.results(slurm_dir)))
    runs = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
            if r.data.tags.get("snakemake.rule") == "train" and r.data.tags.get("repexp.run") == CHUNK_RUN]
    from repexp.tracking import pending_records

    seen = sorted(((r.data.tags.get("slurm.restart_count"), r.info.status, r.info.start_time) for r in runs),
                  key=lambda run: run[2])  # by start time (an untagged run has None for its restart)
    pending = [(d.name, sorted(p.name for p in d.iterdir())) for d in pending_records(fx.results(slurm_dir))]
    assert all("slurm.restart_count" in r.data.tags for r in runs), (seen, pending)
    by_restart = {int(r.data.tags["slurm.restart_count"]): r for r in runs}
    assert sorted(by_restart) == [0, 1, 2, 3, 4], (seen, pending, preempted)
    statuses = [by_restart[n].info.status for n in range(5)]
    want = ["KILLED"] * 4 + ["FINISHED"]
    want[preempted] = "FAILED"
    assert statuses == want, statuses
    chunk_ends = [n for n in range(4) if n != preempted]
    for restart, step in zip(chunk_ends, (1, 2, 3)):
        assert by_restart[restart].data.tags["repexp.stopped"].startswith(f"walltime chunk ended at step {step} ")
    assert "SIGTERM" in by_restart[preempted].data.tags["repexp.error"]
    finished = by_restart[4]
    for key in ("actor/entropy", "dev/pass_at_1", "reward/shaped/mean"):
        steps = [m.step for m in client.get_metric_history(finished.info.run_id, key)]
        assert sorted(steps) == sorted(set(steps)) == sorted(r["step"] for r in got if key in r), (key, steps)
