"""``python -m repexp.verl.train [overrides...]``: RepExp (or GRPO, beta = 0) on verl 0.9.1.

A Hydra app composed on verl's own ``ppo_trainer`` config (``config/repexp_trainer.yaml``). It validates
the config (verl's `validate_config` plus the RepExp checks) and runs verl's `run_ppo` with a TaskRunner
that also imports `repexp.verl.trainer` (registering trainer mode ``repexp``). When verl returns,
``<run_dir>/DONE`` is written last (final step, best-dev step and value, wall time).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import hydra
import ray
from omegaconf import DictConfig, OmegaConf, open_dict

from repexp import checkpoints, layout, tracking
from repexp.checkpoints import BestDevTracker, complete_steps, prune_when_done, resumable_steps
from repexp.config import check_repexp_micro_batch, check_save_freq
from repexp.io import write_json_atomic
from repexp.verl import config as _schemas  # noqa: F401  stores the bonus node's schema before Hydra composes
from repexp.verl import startup
from repexp.verl.overrides import BASE_METHOD_SETTINGS, method_settings
from repexp.verl.settings import RESUME_ONLY, TRAINER_MODE, RepExpSettings, RunSettings, repexp_settings, run_dir_of
from repexp.walltime import read_chunk_end

from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device


def check_config(config: DictConfig) -> RepExpSettings:
    """What RepExp needs plus verl's own validation; raises ValueError naming the key."""
    settings = repexp_settings(config.actor_rollout_ref)
    run_dir_of(config)
    if config.trainer.v1.trainer_mode != TRAINER_MODE:
        raise ValueError(f"trainer.v1.trainer_mode: must be {TRAINER_MODE!r}, got {config.trainer.v1.trainer_mode!r}")
    if not config.trainer.use_v1:
        raise ValueError("trainer.use_v1: RepExp plugs into verl's V1 trainer; must be true")
    # the verl settings of the run's method (advantage estimator, policy loss), as build_overrides sets them
    for key, value in {**BASE_METHOD_SETTINGS, **method_settings(settings.method, settings.params)}.items():
        found = OmegaConf.select(config, key)
        if found != value:
            raise ValueError(f"{key}: method {settings.method} runs with {value!r}, got {found!r}")
    # The pipeline config's own rules (repexp.config), under verl's key names: this entry point also
    # runs on hand-written overrides that no pipeline config checked.
    check_save_freq(config.trainer.save_freq, config.trainer.test_freq, "trainer.save_freq", "trainer.test_freq")
    if settings.enabled and not settings.use_dynamic_bsz:
        check_repexp_micro_batch(
            settings.micro_batch_size_per_gpu, config.trainer.n_gpus_per_node * config.trainer.nnodes,
            config.actor_rollout_ref.actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n,
            "actor_rollout_ref.repexp.micro_batch_size_per_gpu",
            remedy=" (or set actor_rollout_ref.repexp.use_dynamic_bsz=true)")
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return settings


class _RepExpTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config: DictConfig):
        startup.mark("task_runner")
        import repexp.verl.trainer  # noqa: F401  registers trainer mode "repexp" in this process

        return super().run(config)

    def init_agent_loop_manager(self):
        super().init_agent_loop_manager()
        startup.mark("agent_loop")


RepExpTaskRunner = ray.remote(_RepExpTaskRunner)


def write_done(run_dir: Path, wall_time_s: float) -> dict:
    """The run's `DONE` marker (the Snakemake output), written last, once training returned."""
    steps = complete_steps(run_dir)
    if not steps:
        raise RuntimeError(f"{run_dir}: verl returned without a complete checkpoint; not writing {layout.DONE}")
    return checkpoints.write_done(run_dir, backend="verl", final_step=steps[-1],
                                  tracker=BestDevTracker.load(run_dir), wall_time_s=wall_time_s)


def finish(run: RunSettings, run_dir: Path, started: float) -> None:
    """`DONE`, then `train.prune_when_done` (`repexp merge` reads the kept checkpoint's model shards)."""
    prune_when_done(run_dir, write_done(run_dir, time.time() - started), RESUME_ONLY, enabled=run.prune_when_done,
                    keep=run.max_checkpoints_to_keep)


def finished_or_reset(run_dir: Path, total_steps: int, validates: bool) -> bool:
    """Before verl starts. True when the training had finished: its final step saved complete and, where
    the run validates, validated (verl saves before it validates), only its `DONE` lost (a kill after
    the validation, or while pruning after `DONE`): `DONE` is written again without starting verl.
    Otherwise, where only checkpoints without resume state are left (`prune_finished` was killed while
    it removed the final one), the training starts over: no slimmed checkpoint of the earlier attempt
    stays to be resumed or selected."""
    if checkpoints.finished_training(run_dir, total_steps, validated_after_save=validates):
        return True
    steps = complete_steps(run_dir)
    if steps and not resumable_steps(run_dir):
        shutil.rmtree(layout.checkpoints_dir(run_dir))
        print(f"repexp.verl.train: no resumable checkpoint left of an earlier attempt (steps {steps} kept without "
              "resume state); starting over", flush=True)
    return False


def use_node_run(config: DictConfig) -> None:
    """Log into the node's MLflow run that `repexp run train` opened while this process imported verl
    and Ray: its id goes into the environment the TaskRunner inherits; without one (MLflow
    unreachable) verl's mlflow logger is dropped and metrics.jsonl keeps the curves."""
    node_run = tracking.await_node_run()
    if node_run is None:
        return
    if node_run.get("run_id"):
        os.environ["MLFLOW_RUN_ID"] = node_run["run_id"]
        os.environ["MLFLOW_TRACKING_URI"] = node_run["tracking_uri"]
        return
    print(f"repexp.verl.train: MLflow off for this run ({node_run.get('offline_reason')})", flush=True)
    with open_dict(config):
        config.trainer.logger = [name for name in config.trainer.logger if name != "mlflow"]


def start_marks(run_dir: Path) -> Path:
    """This attempt's start-up log (repexp.verl.startup), begun with the process start the node wrapper
    recorded (else now) and the end of the imports; Ray workers inherit its path from the environment."""
    log = run_dir / layout.VERL_STARTUP_LOG
    log.unlink(missing_ok=True)
    os.environ[startup.ENV] = str(log.resolve())
    started = os.environ.get(startup.ENV_STARTED)
    if started:
        startup.write_mark(log, "process", float(started))
    startup.mark("imported")
    return log


def write_startup(run_dir: Path, log: Path) -> None:
    """``startup.json``: where this attempt's start-up went, also printed."""
    result = startup.summary(startup.read_marks(log))
    write_json_atomic(run_dir / layout.VERL_STARTUP, result)
    total = f"{result['startup_s']:.1f} s" if "startup_s" in result else "unknown"
    print(f"repexp.verl.train: start-up {total} (process start to first validation):\n"
          + startup.table(result["phases"]), flush=True)


def launch(config: DictConfig) -> None:
    started = time.time()
    auto_set_device(config)
    check_config(config)
    run_dir = run_dir_of(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    run = RunSettings.of(config)
    if finished_or_reset(run_dir, config.trainer.total_training_steps, config.trainer.test_freq > 0):
        print("repexp.verl.train: the final step is saved and validated (only DONE was missing); writing DONE "
              "without starting verl", flush=True)
        finish(run, run_dir, started)
        return
    log = start_marks(run_dir)
    if run.mlflow_tracking_uri:
        # before ray.init: the TaskRunner (where verl's Tracking lives) inherits this environment
        os.environ.setdefault("MLFLOW_TRACKING_URI", run.mlflow_tracking_uri)
    use_node_run(config)
    (run_dir / layout.CHUNK_END).unlink(missing_ok=True)
    run_ppo(config, task_runner_class=RepExpTaskRunner)
    write_startup(run_dir, log)
    chunk = read_chunk_end(run_dir)
    if chunk is not None:  # the trainer stopped for the walltime (repexp.walltime): no DONE yet
        print(f"repexp.verl.train: walltime chunk ended at step {chunk['step']}; the next attempt resumes there",
              flush=True)
        return
    finish(run, run_dir, started)


@hydra.main(config_path="config", config_name="repexp_trainer", version_base="1.3")
def main(config: DictConfig) -> None:
    launch(config)


if __name__ == "__main__":
    main()
