"""``python -m repexp.trl.train --config job.yaml [--resume auto|never]``: one training run on TRL.

Reads the job's resolved `RunConfig` (the same schema the verl backend reads) and writes the
training-run contract of docs/architecture.md under `run_dir`:

- `checkpoints/global_step_<N>/`: a Hugging Face model directory (weights, config, tokenizer)
  that also holds TRL/transformers' resume state (optimizer, scheduler, RNG, trainer_state.json)
  and the reward's training state (`bonus.persist_covariance`: the covariance; historical outcome
  exploration: the answer counts); `COMPLETE` is written last.
  TRL saves into `trl_staging/checkpoint-<optimizer step>/`, which is then renamed into place.
- `best_dev.json` via `repexp.checkpoints.BestDevTracker` after every validation and save.
- `metrics.jsonl`: one record per logged step (and step 0 for the initial validation).
- `DONE` (JSON: final step, best step, wall time) written last.
- `CHUNK_END` instead of `DONE` when `--deadline` (a walltime chunk's end, repexp.walltime) came
  before the last step: the step it stopped at is saved complete, and the next attempt resumes.

Resume (`--resume auto`, the default): incomplete checkpoint directories are removed, training
continues from the newest complete checkpoint, and the metrics/best-dev records of later steps
are dropped, so the finished run equals an uninterrupted one (data order, generation, projection
and validation sampling are all seeded).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from repexp import layout
from repexp import metrics as metric_names
from repexp.checkpoints import (
    BestDevTracker,
    TrainingTime,
    checkpoint_dir,
    complete_steps,
    finished_training,
    is_complete,
    mark_complete,
    prune_checkpoints,
    prune_when_done,
    resumable_steps,
    step_actions,
    write_done,
)
from repexp.config import ConfigError, RunConfig, load_run_config
from repexp.elliptical import projection_seed
from repexp.io import read_json, write_json_atomic
from repexp.methods import method
from repexp.trl import settings as trl_settings
from repexp.trl.runlog import MetricsLog, MlflowSink
from repexp.walltime import ChunkClock, write_chunk_end


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    done: Optional[dict]  # None when a walltime chunk ended before the last step (CHUNK_END written)
    reward: Any = None  # the RepExpReward (None when the run was already finished)
    trainer: Any = None


# --------------------------------------------------------------------------- data


def read_split(data_dir: str | Path, split: str) -> list[dict]:
    """Rows of `<data_dir>/<split>.parquet` (verl row format) as Python dicts."""
    import pyarrow.parquet as pq

    path = layout.split_file(data_dir, split)
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (run `repexp data prepare` for this task first)")
    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError for corrupt files
        raise ValueError(f"{path}: not a readable parquet file ({err})") from None
    missing = [c for c in ("data_source", "prompt", "reward_model", "extra_info") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (expected verl's row format)")
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        if not isinstance(row["reward_model"], dict) or "ground_truth" not in row["reward_model"]:
            raise ValueError(f"{path}: row {i} has no reward_model.ground_truth")
        if not isinstance(row["prompt"], list) or not row["prompt"]:
            raise ValueError(f"{path}: row {i} has no chat prompt (a list of messages)")
    return rows


def drop_long_prompts(rows: list[dict], tokenizer: Any, max_prompt_length: int) -> tuple[list[dict], list[list[int]]]:
    """Rows whose rendered prompt fits max_prompt_length (verl's filter_overlong_prompts), with their ids."""
    from repexp.trl.reward import prompt_token_ids

    ids = [prompt_token_ids(tokenizer, row["prompt"]) for row in rows]
    kept = [i for i, tokens in enumerate(ids) if len(tokens) <= max_prompt_length]
    return [rows[i] for i in kept], [ids[i] for i in kept]


# --------------------------------------------------------------------------- run directory


def prepare_run_dir(run_dir: Path, resume: str) -> Optional[int]:
    """Clean up after a kill and return the step to resume from (None: start fresh)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir / layout.TRL_STAGING_DIR, ignore_errors=True)
    if resume == "never":
        shutil.rmtree(layout.checkpoints_dir(run_dir), ignore_errors=True)
        (run_dir / layout.DONE).unlink(missing_ok=True)
    for directory in layout.checkpoint_dirs(run_dir):
        if not is_complete(directory):
            shutil.rmtree(directory)  # a save cut short by a kill
    steps = resumable_steps(run_dir)
    return steps[-1] if steps else None


# Files of a TRL checkpoint that only resuming reads (the kept best-dev checkpoint drops them).
RESUME_ONLY = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "repexp_state*", layout.TRL_OUTCOME_COUNTS)


@dataclasses.dataclass(frozen=True)
class CovLoss:
    """A `loss`-hook run's policy loss (KL-Cov / Clip-Cov, `repexp.methods.cov`) and what it takes from `train`."""

    params: Any  # repexp.methods.cov.Params
    seed: int  # Clip-Cov's random draw is seeded by (seed, optimizer step)
    clip_ratio: float
    loss_agg_mode: str

    @classmethod
    def of(cls, cfg: RunConfig) -> Optional[CovLoss]:
        if "loss" not in method(cfg.method).hooks:
            return None
        if cfg.method != "cov":
            raise NotImplementedError(f"method {cfg.method!r}: its loss hook has no TRL adapter")
        return cls(cfg.settings, cfg.seed, cfg.train.clip_ratio, cfg.train.loss_agg_mode)


# --------------------------------------------------------------------------- TRL pieces (imported lazily)


def _trainer_class():
    import torch
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    from repexp.methods.cov import cov_policy_loss

    class EpochSeededRepeatSampler(RepeatSampler):
        """TRL's sampler with the permutation seeded by (seed, epoch) instead of a running generator,
        so that a run resumed in a later epoch sees the same data order as an uninterrupted one."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)

        def __iter__(self):
            if self.shuffle:  # the same (seed, n) hash as a step's projection seed, here of (seed, epoch)
                self.generator.manual_seed(projection_seed(self.seed or 0, self.epoch))
            return super().__iter__()

    class RepExpGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer with the epoch-seeded sampler; for an `advantage`-hook method
        (`advantage_source`: the reward function), the advantages the reward function computed in place
        of TRL's group-mean-subtracted copy; for a `loss`-hook method (`cov_loss`), its policy loss in
        place of TRL's PPO loss."""

        def __init__(self, *args: Any, advantage_source: Any = None, cov_loss: Optional[CovLoss] = None,
                     vllm_engine: Optional[dict] = None, **kwargs: Any):
            with _vllm_engine_args(vllm_engine):  # trl.rollout_engine vllm: what TRL's LLM(...) leaves out
                super().__init__(*args, **kwargs)
            self.advantage_source = advantage_source
            self.cov_loss = cov_loss
            corrected = self.use_vllm and self.vllm_importance_sampling_correction  # off: repexp.trl.settings
            if cov_loss is not None and (self.beta != 0.0 or corrected or self.top_entropy_quantile < 1.0
                                         or self.off_policy_mask_threshold is not None or self.aux_loss_enabled
                                         or self.use_adaptive_entropy
                                         or self.importance_sampling_level != "token"):
                raise ValueError("the KL-Cov / Clip-Cov loss covers the GRPOConfig of repexp.trl.settings only")
            self._draws: Optional[torch.Generator] = None
            self._draws_step = -1

        def _generate_single_turn(self, *args: Any, **kwargs: Any):
            """TRL's generation; with the vLLM engine each completion is checked to end as the generate path's
            do (at its first stop token, kept, or at max_completion_length), so the reward, the features and
            the loss see the same kind of token sequence from either engine."""
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            if self.use_vllm:
                trl_settings.check_completions(completion_ids, self.eos_token_ids, self.max_completion_length)
            return completion_ids, logprobs

        def _get_train_sampler(self, dataset=None):
            return EpochSeededRepeatSampler(
                data_source=self.train_dataset if dataset is None else dataset,
                mini_repeat_count=self.num_generations,
                batch_size=self.args.generation_batch_size // self.num_generations,
                repeat_count=self.num_iterations * self.args.steps_per_generation,
                shuffle=self.shuffle_dataset,
                seed=self.args.seed,
            )

        def _generate_and_score_completions(self, inputs):
            """TRL subtracts each group's mean from the reward function's output. An advantage hook's
            advantage is final (outcome exploration's bonus keeps its group mean: UCB-Con's b0 acts
            through it), so the step trains on it as the reward function computed it in this call."""
            output = super()._generate_and_score_completions(inputs)
            if self.advantage_source is not None:
                own = self.advantage_source.last_advantages
                if own is None or own.shape != output["advantages"].shape:
                    raise RuntimeError("the reward function's advantages do not match the step's completions")
                output["advantages"] = own.to(output["advantages"].device, output["advantages"].dtype)
                # TRL's record of the step's advantages (`_logs`) names what the loss uses
                for _ in range(own.numel()):
                    self._logs["advantages"].pop()
                self._logs["advantages"].extend(own.tolist())
            return output

        def _compute_loss(self, model, inputs):
            if self.cov_loss is None:
                return super()._compute_loss(model, inputs)
            return self._cov_loss(model, inputs)

        def _cov_loss(self, model, inputs):
            """KL-Cov / Clip-Cov on TRL, which has no such loss: `GRPOTrainer._compute_loss` as this
            backend configures it (no KL term, no vLLM, token-level ratios, no entropy or off-policy
            masks: checked in __init__), with its per-token PPO term and aggregation replaced by
            `cov_policy_loss` (verl's KL-Cov / Clip-Cov) on the same log-probs, old log-probs, advantages
            and completion mask. The rest (scaling for gradient accumulation, entropy bonus, logged
            entropy) is TRL's, so a cov run differs from a GRPO run on TRL by its policy loss only."""
            completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"]
            per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
                torch.cat([inputs["prompt_mask"], mask], dim=1), completion_ids.size(1), compute_entropy=True)
            # TRL computes old log-probs only when a generation batch spans several optimizer steps; otherwise
            # the policy has not moved since generation and the old log-probs are the current ones, detached
            old_per_token_logps = inputs.get("old_per_token_logps")
            old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
            advantages = inputs["advantages"]
            advantages = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).expand_as(per_token_logps)
            loss, metrics = cov_policy_loss(per_token_logps, old_per_token_logps, advantages, mask,
                                            self.cov_loss.params, clip_ratio=self.cov_loss.clip_ratio,
                                            loss_agg_mode=self.cov_loss.loss_agg_mode, generator=self._clip_cov_draws())
            mode = "train" if self.model.training else "eval"
            accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            policy_loss = loss.detach()
            if self.loss_type == "dapo":  # token-mean: TRL divides the token sum by the accumulation window's tokens
                normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
                if mode == "train":
                    normalizer = normalizer * accumulation / self.args.steps_per_generation
                loss = loss * mask.sum() / normalizer
            else:  # seq-mean-token-mean ("grpo"): the micro-batch's mean over the accumulated micro-batches
                loss = loss / accumulation
            token_count = mask.sum().clamp(min=1.0)
            entropy = (entropies * mask).sum() / token_count
            if self._entropy_bonus_enabled:
                loss = loss - self.entropy_coef * entropy / accumulation
                self._metrics[mode]["policy_loss"].append(policy_loss.item())
                if mode == "train" and self.accelerator.sync_gradients:
                    self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
            self._metrics[mode]["entropy"].append(entropy.item())  # one process (train() checks WORLD_SIZE)
            for name, value in metrics.items():
                self._metrics[mode][name].append(value)
            return loss

        def _clip_cov_draws(self) -> Optional[torch.Generator]:
            """Clip-Cov's random draw, seeded by (seed, TRL optimizer step) at the first micro-batch of each
            optimizer step, so a resumed run draws the tokens an uninterrupted one draws."""
            if self.cov_loss.params.loss_mode != "clip_cov":
                return None
            if self._draws is None or self._draws_step != self.state.global_step:
                self._draws = torch.Generator().manual_seed(projection_seed(self.cov_loss.seed, self.state.global_step))
                self._draws_step = self.state.global_step
            return self._draws

    return RepExpGRPOTrainer


@contextlib.contextmanager
def _vllm_engine_args(extra: Optional[dict]):
    """While TRL builds its colocated engine, `vllm.LLM(...)` also gets `extra` (dtype, fixed KV cache,
    enforce_eager, the run's seed: `repexp.trl.settings.vllm_engine_kwargs`), which TRL 1.16 does not expose."""
    if not extra:
        yield
        return
    from trl.generation import vllm_generation

    real = getattr(vllm_generation, "LLM", None)
    if real is None:  # TRL imports vLLM's LLM only where vllm imports
        raise ConfigError("trl.rollout_engine: 'vllm', but TRL found no importable vllm in this Python")

    def llm(*args: Any, **kwargs: Any):
        return real(*args, **{**kwargs, **extra})

    vllm_generation.LLM = llm
    try:
        yield
    finally:
        vllm_generation.LLM = real


def own_rendezvous_port(environ: Optional[dict] = None) -> int:
    """The colocated vLLM engine joins a one-process torch.distributed group through MASTER_ADDR:MASTER_PORT.
    TRL fills an unset port with the first free one of a fixed list (29500, 23456, ...), so trainings that
    start side by side all pick 29500 and all but one fail with EADDRINUSE (seen on the GPU: 6 of 8). Each
    training takes an ephemeral port from the OS instead, probed on the wildcard address: torch's TCPStore
    server listens on every interface, so the port must be free on all of them, whatever MASTER_ADDR names.
    A port the environment sets (a launcher's) is kept; "", "0" and "auto" ask for one, as for TRL."""
    environ = os.environ if environ is None else environ
    environ.setdefault("MASTER_ADDR", "127.0.0.1")
    given = environ.get("MASTER_PORT", "").strip().lower()
    if given not in ("", "0", "auto"):
        if not given.isdigit() or not 0 < int(given) < 65536:
            raise ConfigError(f"MASTER_PORT={environ['MASTER_PORT']!r}: not a TCP port (unset it, or 0/auto for a "
                              "free one)")
        return int(given)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    environ["MASTER_PORT"] = str(port)
    return port


def policy_stop_token_ids(model_dir: str, tokenizer: Any) -> list[int]:
    """TRL's `eos_token_ids` of the policy (GRPOTrainer: the generation config's eos ids, with the tokenizer's
    eos first where they lack it), read without loading the weights."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: transformers derives it from the model config
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir))
    ids = generation.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]


def _callback_class():
    from transformers import TrainerCallback

    @dataclasses.dataclass
    class RunCallback(TrainerCallback):
        """Maps TRL's optimizer steps onto training steps: validation, logging, checkpoints."""

        cfg: RunConfig
        plan: trl_settings.StepPlan
        run_dir: Path
        metrics: MetricsLog
        tracker: BestDevTracker
        mlflow: MlflowSink
        reward: Any
        validate: Callable[[Any, int], dict]
        training_time: TrainingTime
        clock: ChunkClock
        pending: dict = dataclasses.field(default_factory=dict)
        step_started: float = dataclasses.field(default_factory=time.perf_counter)
        save_requested: float = dataclasses.field(default_factory=time.perf_counter)
        chunk_end: Optional[int] = None  # the step a walltime chunk ended at

        def _record(self, record: dict) -> None:
            self.metrics.append(record)
            self.mlflow.log(record, record["step"])

        def _validate(self, model: Any, step: int) -> dict:
            start = time.perf_counter()
            dev = self.validate(model, step)
            self.tracker.record_validation(step, dev)
            best = self.tracker.best()
            if best is not None:
                dev[metric_names.DEV_BEST_STEP] = float(best["step"])
            return {**dev, metric_names.timing(metric_names.TIMER_TESTING): time.perf_counter() - start}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 0 and self.cfg.train.val_before_train:
                self._record({"step": 0, **self._validate(model, 0)})
            self.step_started = time.perf_counter()
            self.clock.start()

        def on_step_begin(self, args, state, control, **kwargs):
            if self.plan.at_boundary(state.global_step):
                self.step_started = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if not self.plan.at_boundary(state.global_step):
                control.should_save = False
                return
            step = self.plan.step_of(state.global_step)
            self.pending[metric_names.timing(metric_names.TIMER_STEP)] = time.perf_counter() - self.step_started
            last = state.global_step >= state.max_steps
            validate, save = step_actions(step, test_freq=self.cfg.train.test_freq,
                                          save_freq=self.cfg.train.save_freq, last=last)
            if validate:
                self.pending.update(self._validate(model, step))
                control.should_log = True
            self.clock.step_ended()
            if not last and self.clock.ends_chunk():  # the walltime: save this step and stop
                self.chunk_end, save = step, True
                control.should_training_stop = True
            if save:
                control.should_save = True
                self.save_requested = time.perf_counter()
            if last or self.chunk_end is not None:
                control.should_log = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:  # the end-of-training summary is not a step
                return
            step = self.plan.step_of(state.global_step)
            # TRL's log keys under verl's names, without TRL's advantage statistics
            renamed = {metric_names.TRL_TO_VERL.get(key, key): value for key, value in logs.items()
                       if key not in metric_names.TRL_DROPPED}
            self._record({"step": step, **renamed, **self.pending})
            self.pending = {}

        def on_save(self, args, state, control, **kwargs):
            step = self.plan.step_of(state.global_step)
            source = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            target = checkpoint_dir(self.run_dir, step)
            shutil.rmtree(target, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
            self.reward.save_state(target)
            write_json_atomic(target / layout.TRL_CHECKPOINT_INFO, {
                "step": step, "optimizer_steps": state.global_step, "run": self.cfg.run,
                "config_hash": self.cfg.config_hash,
            })
            self.training_time.save(target)
            mark_complete(target)
            best = self.tracker.write()  # as the verl trainer: best_dev.json first, then pruning keeps that step
            prune_checkpoints(self.run_dir, self.cfg.train.max_checkpoints_to_keep,
                              best["step"] if best else None, RESUME_ONLY)
            self.clock.save_took(time.perf_counter() - self.save_requested)

    return RunCallback


# --------------------------------------------------------------------------- the run


def train(cfg: RunConfig, *, resume: str = "auto", backbone_loader: Optional[Callable] = None,
          deadline: Optional[float] = None) -> TrainResult:
    """Train one run to completion (or finish a killed one). Returns what it wrote to DONE; with a
    `deadline` (epoch seconds, a walltime chunk's end) it may instead stop early with a complete
    checkpoint and `CHUNK_END` (`done` None)."""
    started, attempt_started = time.time(), time.monotonic()
    trl_settings.check_run_config(cfg)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("trl: the TRL backend runs in one process (the bonus needs every group of a step in it)")
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)

    run_dir = Path(cfg.run_dir)
    if resume == "auto" and (run_dir / layout.DONE).exists():
        return TrainResult(run_dir, read_json(run_dir / layout.DONE))
    (run_dir / layout.CHUNK_END).unlink(missing_ok=True)
    resume_step = prepare_run_dir(run_dir, resume)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg.trl.num_threads is not None:
        torch.set_num_threads(cfg.trl.num_threads)
    if cfg.trl.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trl.device: 'cuda' requested but torch.cuda.is_available() is False")
    trl_settings.check_rollout_host(cfg, cuda=torch.cuda.is_available(), where="this job's machine")
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if cfg.trl.device == "auto" else cfg.trl.device)
    if device.type == "cuda" and cfg.trl.gpu_memory_fraction is not None:
        # jobs that share one GPU (resources.train.gpu_share) each keep to their fraction of its memory
        torch.cuda.set_per_process_memory_fraction(cfg.trl.gpu_memory_fraction, device.index or 0)
    from repexp.trl.reward import RepExpReward
    from repexp.trl.validation import validate

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"model: the tokenizer of {cfg.model} has no chat template; cannot render chat prompts")

    train_rows, _ = drop_long_prompts(read_split(cfg.data_dir, "train"), tokenizer, cfg.train.max_prompt_length)
    dev_rows, dev_ids = drop_long_prompts(read_split(cfg.data_dir, "dev"), tokenizer, cfg.train.max_prompt_length)
    if not dev_rows:
        raise ValueError(f"{layout.split_file(cfg.data_dir, 'dev')}: no prompt fits train.max_prompt_length "
                         f"{cfg.train.max_prompt_length}")
    plan = trl_settings.plan_steps(cfg, len(train_rows))
    if resume_step is not None and resume_step > plan.total_steps:
        raise ConfigError(
            f"train.total_steps: the run directory holds a checkpoint of step {resume_step}, beyond the "
            f"{plan.total_steps} steps configured; use --resume never to start over"
        )
    if finished_training(run_dir, plan.total_steps, validated_after_save=False):  # only its DONE was lost:
        resume_step = plan.total_steps  # written again, nothing trained
    elif resume_step is None:  # starting over: no slimmed checkpoint of an earlier attempt stays to be selected
        shutil.rmtree(layout.checkpoints_dir(run_dir), ignore_errors=True)

    metrics = MetricsLog(run_dir)
    metrics.truncate(resume_step)
    tracker = BestDevTracker.load(run_dir) if resume_step is not None else BestDevTracker(run_dir)
    tracker.history = [h for h in tracker.history if resume_step is not None and h["step"] <= resume_step]
    tracker.write()

    vllm = cfg.trl.rollout_engine == "vllm"
    if vllm:
        own_rendezvous_port()
    kwargs = trl_settings.grpo_config_kwargs(
        cfg, plan, output_dir=str(run_dir / layout.TRL_STAGING_DIR), use_cpu=device.type == "cpu",
        stop_token_ids=policy_stop_token_ids(cfg.model, tokenizer) if vllm else None,
    )
    settings_record = {"plan": dataclasses.asdict(plan), "grpo_config": kwargs,
                       "train_prompts": len(train_rows), "dev_prompts": len(dev_rows)}
    write_json_atomic(run_dir / layout.TRL_SETTINGS, settings_record)
    reward = RepExpReward(
        cfg, tokenizer, optimizer_steps_per_step=plan.optimizer_steps_per_step, device=device,
        dtype=torch.bfloat16 if cfg.trl.dtype == "bfloat16" else torch.float32, backbone_loader=backbone_loader,
    )
    resume_dir = checkpoint_dir(run_dir, resume_step) if resume_step is not None else None
    training_time = TrainingTime.resume(resume_dir, started=attempt_started)
    trainer = None
    if resume_step is None or resume_step < plan.total_steps:
        from datasets import Dataset
        from trl import GRPOConfig

        policy = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)  # fp32 master weights
        vllm_engine = None
        if vllm:  # the colocated engine's own settings (docs/trl_backend.md, "Rollout engine")
            kv_bytes = trl_settings.vllm_kv_cache_bytes(cfg, policy.config)
            trl_settings.check_vllm_memory(
                cfg, weights_bytes=policy.num_parameters() * (2 if cfg.trl.dtype == "bfloat16" else 4),
                kv_cache_bytes=kv_bytes, gpu_total_bytes=torch.cuda.get_device_properties(device).total_memory)
            vllm_engine = trl_settings.vllm_engine_kwargs(cfg, kv_bytes)
            write_json_atomic(run_dir / layout.TRL_SETTINGS, {**settings_record, "vllm_engine": vllm_engine})
        trainer = _trainer_class()(model=policy, reward_funcs=[reward], args=GRPOConfig(**kwargs),
                                   train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                                   advantage_source=reward if "advantage" in method(cfg.method).hooks else None,
                                   cov_loss=CovLoss.of(cfg), vllm_engine=vllm_engine)
        if vllm and list(trainer.eos_token_ids) != kwargs["generation_kwargs"]["stop_token_ids"]:
            raise RuntimeError(f"the vLLM engine's stop tokens {kwargs['generation_kwargs']['stop_token_ids']} are not "
                               f"TRL's eos_token_ids {list(trainer.eos_token_ids)}")
        run_validation = functools.partial(validate, rows=dev_rows, prompt_ids=dev_ids, cfg=cfg, tokenizer=tokenizer,
                                           eos_token_ids=list(trainer.eos_token_ids))
        callback = _callback_class()(
            cfg=cfg, plan=plan, run_dir=run_dir, metrics=metrics, tracker=tracker,
            mlflow=MlflowSink(tracking_uri=cfg.tracking.tracking_uri), reward=reward, validate=run_validation,
            training_time=training_time, clock=ChunkClock(deadline),
        )
        trainer.add_callback(callback)
        if resume_dir is not None:
            reward.load_state(resume_dir)
        try:
            trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None)
        finally:  # a save that failed half-way (a full disk) frees its space now, not at the next attempt
            shutil.rmtree(run_dir / layout.TRL_STAGING_DIR, ignore_errors=True)
        if callback.chunk_end is not None:
            if not is_complete(checkpoint_dir(run_dir, callback.chunk_end)):
                raise RuntimeError(f"{run_dir}: the chunk ended at step {callback.chunk_end} without its checkpoint")
            write_chunk_end(run_dir, callback.chunk_end, deadline)
            return TrainResult(run_dir, None, reward, trainer)

    final = complete_steps(run_dir)
    if not final or final[-1] != plan.total_steps:
        raise RuntimeError(f"{run_dir}: training ended without a checkpoint of the last step {plan.total_steps}")
    done = write_done(run_dir, backend="trl", final_step=final[-1], tracker=tracker,
                      wall_time_s=time.time() - started, resumed_from_step=resume_step)
    prune_when_done(run_dir, done, RESUME_ONLY, enabled=cfg.train.prune_when_done,
                    keep=cfg.train.max_checkpoints_to_keep)
    return TrainResult(run_dir, done, reward, trainer)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repexp.trl.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="the job's resolved RunConfig (job.yaml)")
    parser.add_argument("--resume", choices=["auto", "never"], default="auto",
                        help="auto: continue from the newest complete checkpoint; never: start over")
    parser.add_argument("--deadline", type=float, default=None,
                        help="epoch seconds by which a walltime chunk must have saved and stopped (repexp.walltime)")
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args.config)
        result = train(cfg, resume=args.resume, deadline=args.deadline)
    except (ConfigError, FileNotFoundError) as err:
        print(f"repexp.trl.train: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # bad input data, non-finite features: say what, not where
        print(f"repexp.trl.train: failed: {err}", file=sys.stderr)
        return 1
    if result.done is None:
        print(f"repexp.trl.train: walltime chunk ended at step {read_json(result.run_dir / layout.CHUNK_END)['step']}; "
              "the next attempt resumes there", file=sys.stderr)
        return 0
    print(f"repexp.trl.train: done at step {result.done['final_step']} (best dev step {result.done['best_step']})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
