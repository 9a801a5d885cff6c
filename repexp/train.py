"""The train stage of `repexp run train`: the training node of one sweep point.

    repexp run train --task gsm8k --run trl_repexp_k32_b0.01_s42 [--config CFG.yaml]

1. `run_node` writes the run's `TrainJob` config (repexp.jobs.compose) as `<run_dir>/job.yaml`; its
   hash is the training hash.
2. A run directory left by an unfinished attempt with the same training hash is resumed by the trainer
   (latest complete checkpoint); one whose config changed, or that had finished (a deliberate rerun),
   is moved to `<results>/train/<task>/.superseded/` first, so stale checkpoints are never resumed.
3. The backend trainer runs in a subprocess while the node's MLflow child run opens; the trainer finds
   the run id in `<run_dir>/mlflow_run.json` ($REPEXP_MLFLOW_RUN_FILE, its process only) when it first
   logs. TRL: ``python -m repexp.trl.train --config <run_dir>/job.yaml``; verl: ``python -m
   repexp.verl.train <overrides>`` (`repexp.verl.overrides.build_overrides`).
4. Under SLURM the trainer gets a deadline `train.walltime_margin_minutes` before the allocation ends
   (`repexp.walltime`); a trainer stopped there leaves `CHUNK_END` instead of `DONE`, the node run ends
   KILLED (tag `repexp.stopped`) and the job is requeued to resume from the chunk's checkpoint.
5. A non-zero exit marks the run FAILED and is returned; `repexp.error` says the exit status and the
   last line of the trainer's last traceback (repexp.joblog), e.g. `OSError: [Errno 28] No space left
   on device`. After success the `metrics.jsonl` points
   missing from MLflow are replayed, by (key, step), into the run or the outbox (`repexp mlflow sync`
   compares the same way), so a point logged live before an outage is never stored twice.

Training-run contract (`metrics.jsonl`, `best_dev.json`, `checkpoints/global_step_N/`, `DONE` last):
docs/architecture.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from repexp import joblog, layout, tracking, walltime
from repexp.io import read_json, write_json_atomic, write_text_atomic
from repexp.processes import describe_exit, exit_status, forwarding_signals
from repexp.tracking.names import ENV_ASYNC_LOGGING
from repexp.tracking.outputs import split_datasets
from repexp.verl import startup

STATE_FILE = layout.NODE_STATE  # {"training_hash", "status": running|failed|done}
RUN_FILE = layout.MLFLOW_RUN  # the node's MLflow run id, for the trainer (tracking.open_in_background)


def run_node(job, *, config=None, attempt: int = 1, snakemake_jobid: Optional[str] = None) -> int:
    """The train stage of `repexp run train` (job: repexp.jobs.TrainJob, composed from the snapshot): its own
    MLflow node, because its trainer is a subprocess that logs into the node's run."""
    from repexp import config as C
    from repexp.jobs import job_hash

    run_config = job.config
    run_dir = Path(run_config.run_dir)
    try:
        attention = node_attention(run_config)
        deadline = chunk_deadline(run_config)
        # built once here to fail before anything starts
        trainer_command(run_config, run_dir / layout.JOB_YAML, attention, mlflow=False, deadline=deadline)
    except (C.ConfigError, ValueError) as err:
        print(f"train: {err}", file=sys.stderr)
        return 2
    training_hash = job_hash(job)
    prepare_run_dir(run_dir, training_hash)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (layout.DONE, layout.CHUNK_END, RUN_FILE):
        (run_dir / name).unlink(missing_ok=True)
    job_yaml = write_text_atomic(run_dir / layout.JOB_YAML, C.dump_yaml(run_config))
    state = {"training_hash": training_hash, "status": "running", "attempt": attempt,
             "inputs": input_digests(run_config)}
    write_json_atomic(run_dir / STATE_FILE, state)

    restarts = walltime.restart_count()  # the allocations of one SLURM job (chunks, preemption) told apart
    tags = {"repexp.training_hash": training_hash, "repexp.backend": run_config.backend,
            **({"slurm.restart_count": restarts} if restarts is not None else {})}
    node = tracking.prepare_node("train", run_config.task, run_config.run, config=config,
                                 params=train_params(run_config, attention), tags=tags, attempt=attempt,
                                 snakemake_jobid=snakemake_jobid)
    node.log_inputs(split_datasets(Path(run_config.data_dir), ("train", "dev")))  # logged when the run opens
    try:
        _run_node(node, run_config, run_dir, job_yaml, state, attention, deadline)
    except tracking.NodeInterrupted as stop:  # a walltime chunk ended; the node run ended KILLED
        return next_chunk(stop)
    return 0


def input_digests(run_config) -> dict[str, str]:
    """The recorded content digests (repexp.intermediates' sidecars) of what this training reads, its
    data splits and its model, by path: the workflow's start compares them when the inputs' times say
    the training is outdated, so that new times alone never retrain it (repexp.intermediates)."""
    from repexp.intermediates import read_sidecar

    paths = [layout.split_file(run_config.data_dir, split) for split in ("train", "dev")] + [Path(run_config.model)]
    recorded = {str(path): read_sidecar(path) for path in paths}
    return {path: entry["sha256"] for path, entry in recorded.items() if entry is not None}


def chunk_deadline(run_config) -> Optional[float]:
    """Under SLURM: when this allocation's chunk must have saved and stopped (logged once); else None."""
    end = walltime.allocation_end()
    deadline = walltime.chunk_deadline(end, run_config.train.walltime_margin_minutes)
    if deadline is not None:
        stamp = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))  # noqa: E731
        print(f"train: the allocation ends at {stamp(end)}; this chunk saves and stops by {stamp(deadline)} "
              f"(train.walltime_margin_minutes {run_config.train.walltime_margin_minutes:g})",
              file=sys.stderr, flush=True)
    return deadline


def node_attention(run_config):
    """verl runs: the attention this node supports (`verl.attn_implementation`), logged once; None for TRL."""
    if run_config.backend != "verl":
        return None
    from repexp.config import ConfigError
    from repexp.verl.attention import flash_attn_error, resolve

    verl = run_config.verl
    try:
        attention = resolve(verl.attn_implementation, verl.use_remove_padding, flash_attn_error())
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(f"train: attention {attention.describe()}", file=sys.stderr, flush=True)
    return attention


def trainer_command(run_config, job_yaml: Path, attention=None, *, mlflow: bool,
                    deadline: Optional[float] = None) -> list[str]:
    if run_config.backend == "trl":
        chunk = ["--deadline", repr(deadline)] if deadline is not None else []
        return [sys.executable, "-m", "repexp.trl.train", "--config", str(job_yaml), *chunk]
    from repexp.verl.overrides import build_overrides  # verl: the config allows no other backend

    loggers = ["console", "mlflow"] if mlflow else ["console"]
    overrides = build_overrides(run_config, attention, loggers=loggers, chunk_deadline=deadline)
    return [sys.executable, "-m", "repexp.verl.train", *overrides]


def prepare_run_dir(run_dir: Path, training_hash: str) -> Optional[Path]:
    """Keep a resumable run directory; move a stale or finished one aside. Returns where it went."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    state_path = run_dir / STATE_FILE
    state = read_json(state_path) if state_path.exists() else None
    if state is None:
        from repexp import config as C

        try:
            old_hash = C.training_hash(C.load_run_config(run_dir / layout.JOB_YAML))
        except Exception:  # noqa: BLE001 - an unreadable old job.yaml just means "unknown"
            old_hash = None
        if old_hash is None or old_hash == training_hash:
            return None  # nothing says it is stale: let the trainer resume what it finds
        state = {"training_hash": old_hash, "status": "unknown"}
    if state.get("training_hash") == training_hash and state.get("status") != "done":
        return None  # an interrupted attempt of this very config: resume
    why = "finished before (a deliberate rerun)" if state.get("training_hash") == training_hash else "config changed"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = layout.superseded_dir(run_dir) / f"{run_dir.name}-{state.get('training_hash')}-{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(run_dir, target)
    print(f"train: {run_dir} {why}; moved to {target} and starting over", file=sys.stderr)
    return target


def _run_node(node, run_config, run_dir: Path, job_yaml: Path, state: dict, attention, deadline) -> None:
    with tracking.node_scope(node):
        # The run opens while the trainer starts up (imports, model load); the trainer reads its id
        # from RUN_FILE when it first logs, so the MLflow import never delays training.
        live = node.check_store()
        opener = tracking.open_in_background(node, run_dir / RUN_FILE) if live else None
        log = joblog.current()  # the trainer's output passes through it: its traceback's last line is the cause
        try:  # SIGTERM/SIGINT (walltime, preemption, Ctrl-C) go to the trainer, so it can stop cleanly
            command = trainer_command(run_config, job_yaml, attention, mlflow=live, deadline=deadline)
            since = log.mark() if log is not None else 0
            print("train: " + " ".join(command), file=sys.stderr, flush=True)
            with forwarding_signals(subprocess.Popen(command, env=trainer_env(node, run_dir, live))) as proc:
                code = exit_status(proc.wait())  # 128 + N when a signal N ended it
        finally:
            if opener is not None:
                opener.join()  # the run is open (or known refused) before it is ended
        node.log_artifact(job_yaml)

        def mark(status: str, **more) -> None:
            write_json_atomic(run_dir / STATE_FILE, {**state, "status": status, **more})

        if code:
            mark("failed", exit_code=code)
            message = describe_exit(f"the {run_config.backend} trainer", code)
            cause = log.cause(since) if log is not None else None
            if cause:
                message += f": {cause}"
            print(f"train: {message}", file=sys.stderr)
            raise tracking.NodeFailed(code, message)
        chunk, done = walltime.read_chunk_end(run_dir), (run_dir / layout.DONE).exists()
        if chunk is None and not done:
            mark("failed")
            raise RuntimeError(f"{run_dir}: the trainer exited 0 without writing {layout.DONE}")
        replayed = ensure_metrics(node, run_dir) if done else 0
        if replayed:
            where = "into MLflow" if node.online else "into the outbox for `repexp mlflow sync`"
            print(f"train: replayed {replayed} metric points from {layout.METRICS} {where}", file=sys.stderr)
        for name in (layout.BEST_DEV, layout.METRICS, layout.VERL_STARTUP):
            if (run_dir / name).exists():
                node.log_artifact(run_dir / name)
        if not done:
            mark("chunk_ended", step=chunk["step"])
            raise tracking.NodeInterrupted(
                walltime.CHUNK_EXIT_STATUS,
                f"walltime chunk ended at step {chunk['step']} (complete checkpoint); the next allocation resumes")
        mark("done")


def next_chunk(stop: tracking.NodeInterrupted) -> int:
    """After a chunk: requeue this SLURM job and wait to be stopped by it; where SLURM refuses,
    exit with CHUNK_EXIT_STATUS so that Snakemake's retries of the train rule run the next chunk."""
    print(f"train: {stop.message}", file=sys.stderr, flush=True)
    why = walltime.requeue()
    if why is not None:
        print(f"train: {why}; exiting {walltime.CHUNK_EXIT_STATUS} for Snakemake's retry to resume",
              file=sys.stderr, flush=True)
        return walltime.CHUNK_EXIT_STATUS
    print(f"train: requeued SLURM job {os.environ.get('SLURM_JOB_ID')}; waiting for SLURM to stop this allocation",
          file=sys.stderr, flush=True)
    time.sleep(walltime.REQUEUE_WAIT_S)
    print(f"train: still running {walltime.REQUEUE_WAIT_S} s after the requeue; exiting "
          f"{walltime.CHUNK_EXIT_STATUS}", file=sys.stderr, flush=True)
    return walltime.CHUNK_EXIT_STATUS


def train_params(run_config, attention=None) -> dict:
    """The train node's MLflow params: the run's config, and for verl what `auto` attention became here."""
    params = tracking.flatten({k: v for k, v in run_config.to_dict().items() if k != "config_hash"})
    if attention is not None:
        params.update({"verl.attention.resolved": attention.implementation,
                       "verl.attention.packing": attention.packing})
    return params


def trainer_env(node, run_dir: Path, live: bool) -> dict:
    """The trainer's environment: where its node run's id will appear, only when the store answered."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", tracking.ENV_RUN_FILE)}
    if live:
        env["MLFLOW_TRACKING_URI"] = node.tracking_uri
        env["MLFLOW_EXPERIMENT_NAME"] = node.record.experiment
        env[tracking.ENV_RUN_FILE] = str(Path(run_dir, RUN_FILE).resolve())
        # MLflow's async logging (verl's logger and repexp.trl's sink): a slow store never stalls a
        # training step; what did not arrive is replayed from metrics.jsonl afterwards (ensure_metrics)
        env.setdefault(ENV_ASYNC_LOGGING, "true")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[startup.ENV_STARTED] = repr(time.time())  # the first of verl's start-up marks (repexp.verl.startup)
    return env


def ensure_metrics(node, run_dir: Path) -> int:
    """Log the metrics.jsonl points the run lacks, compared by (key, step); offline they are kept for
    `repexp mlflow sync`, which compares the same way. Returns how many were logged or kept."""
    from repexp.trl.runlog import MetricsLog

    if not node.enabled:
        return 0
    now = int(time.time() * 1000)
    rows = [[key, float(value), record["step"], now]
            for record in MetricsLog(run_dir).records() for key, value in record.items()
            if key != "step" and not isinstance(value, bool) and isinstance(value, (int, float))]
    return node.fill_metric_rows(rows) if rows else 0
