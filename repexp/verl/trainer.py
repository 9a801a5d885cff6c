"""`RepExpTrainer`: verl 0.9.1's synchronous V1 trainer with the RepExp bonus, registered as mode ``repexp``.

What it changes, each through an overridable method of verl's `PPOTrainer`:

- `_init_resource_pool_mgr`: the actor role runs `RepExpActorRolloutRefWorker`.
- `_compute_advantage` (after batch balancing, while vLLM sleeps; `_validate` never calls it): hidden-state
  forward on the workers, bonus on the driver (`repexp.bonus_step`, shared with TRL), then verl's own
  advantage on ``alpha * score + beta * bonus``. Afterwards ``rm_scores`` is the verifier score again and
  ``token_level_rewards`` the shaped reward, so ``critic/score`` stays comparable with plain GRPO and
  ``critic/rewards`` shows what was optimised. beta = 0 (the GRPO baseline) leaves verl's computation
  untouched. Both log the group metrics, ``rollout/distinct_frac`` and ``rollout/all_correct_identical_frac``
  (padding rows left out).
- `_val_metrics_update`: adds unbiased ``dev/pass_at_k`` and records it in ``best_dev.json`` (as TRL).
- `_save_checkpoint` / `_load_checkpoint`: also the persistent covariance (``repexp_state.pt``) and the
  training time (``budget.json``); a checkpoint is marked complete after verl's save returns, then old ones
  are pruned (`repexp.checkpoints.prune_checkpoints`); resuming restores covariance and training time too.
- `on_train_begin` / `on_step_end`: walltime chunks (`repexp.walltime`): the step just trained is saved and
  made the last of this process when another one would not fit; `repexp.verl.train` then skips `DONE`.
- Every logged step is also appended to ``<run_dir>/metrics.jsonl`` (`{"step": N, <metric>: value}`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import ray
import torch
from omegaconf import DictConfig, open_dict
from transfer_queue import KVBatchMeta

from repexp import layout
from repexp import metrics as metric_names
from repexp.bonus_step import BonusState, compute_step_bonus, group_metrics
from repexp.checkpoints import (
    BestDevTracker,
    TrainingTime,
    checkpoint_dir,
    is_complete,
    mark_complete,
    prune_checkpoints,
)
from repexp.io import atomic_path, write_text_atomic
from repexp.verl import dataplane, startup
from repexp.verl.engine import OUTPUT_KEY
from repexp.verl.methods import PASSK_K_KEY, OutcomeReward
from repexp.verl.reward import FUNCTION_NAMES
from repexp.verl.settings import RESUME_ONLY, TRAINER_MODE, RunSettings, repexp_settings, run_dir_of
from repexp.verl.validation import dev_pass_at_k
from repexp.verl.worker import WORKER_FIELDS, RepExpActorRolloutRefWorker
from repexp.walltime import ChunkClock, write_chunk_end

from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer

logger = logging.getLogger(__name__)

ACTOR_ROLES = (Role.ActorRolloutRef, Role.ActorRollout, Role.Actor)


class JsonlMetricsLogger:
    """A verl `Tracking` backend appending ``{"step": N, <metric>: value}`` lines (the shared contract)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def log(self, data: dict, step: int) -> None:
        row = {"step": int(step)}
        for key, value in data.items():
            if isinstance(value, np.generic) or isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                row[key] = value
        with self.path.open("a") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")

    def truncate_after(self, step: int) -> None:
        """On (re)start from `step`: drop lines the restored state has not seen (all of them when step is 0,
        whose validation is logged again)."""
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines() if step > 0 else []
        kept = [line for line in lines if line and json.loads(line)["step"] <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))


@register_trainer(TRAINER_MODE)
class RepExpTrainer(PPOTrainerSync):
    def __init__(self, config: DictConfig):
        startup.mark("trainer")
        self.repexp = repexp_settings(config.actor_rollout_ref)
        self.run_settings = RunSettings.of(config)
        self.run_dir = run_dir_of(config)
        # any mode other than "sync" switches verl to its async code paths
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
            if self.repexp.method == "passk":  # for verl's call of the registered estimator (repexp.verl.methods)
                config.algorithm[PASSK_K_KEY] = self.repexp.params.passk_k
        super().__init__(config)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.best_dev = BestDevTracker.load(self.run_dir)
        # the GRPO baseline (beta = 0, sparse_dim null) projects nothing, so it has no bonus state
        self.bonus_state = (BonusState(self.repexp, sparse_dim=self.repexp.sparse_dim, seed=self.repexp.seed)
                            if self.repexp.enabled else None)
        # outcome exploration's term and its answer counts (None for every other method)
        self.outcome = (OutcomeReward(self.repexp.params, _grader(config))
                        if self.repexp.method == "outcome" else None)
        # the "reward" hook: a per-rollout term added to the verifier score before verl's advantage;
        # the "advantage" hook's terms added to verl's advantage (pass@k's is verl's registered estimator itself)
        self._reward_terms = {"repexp": self._repexp_term}
        self._advantage_terms = {"outcome": self._outcome_term}
        self.metrics_logger = JsonlMetricsLogger(self.run_dir / layout.METRICS)
        self.training_time = TrainingTime()  # resumed in _load_checkpoint
        self.clock = ChunkClock(self.run_settings.chunk_deadline)
        self._first_step_marked = False

    # ------------------------------------------------------------------ workers

    def _init_resource_pool_mgr(self):
        startup.mark("data")  # verl's _setup calls this after the tokenizer and data loaders
        super()._init_resource_pool_mgr()
        replaced = [role for role in ACTOR_ROLES if role in self.role_worker_mapping]
        if not replaced:
            raise RuntimeError(f"no actor role among {sorted(map(str, self.role_worker_mapping))}: "
                               "verl's role mapping changed")
        for role in replaced:
            self.role_worker_mapping[role] = ray.remote(RepExpActorRolloutRefWorker)

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        if self.run_settings.replay_poll_seconds is not None:  # see VerlConfig.replay_poll_seconds
            buffer.poll_interval = self.run_settings.replay_poll_seconds
        return buffer

    # ------------------------------------------------------------------ the bonus

    def _hidden_means(self, batch: KVBatchMeta) -> torch.Tensor:
        request = dataplane.worker_request(batch, WORKER_FIELDS,
                                           {"temperature": 1.0, "compute_loss": False, "calculate_entropy": False})
        output = self.actor_rollout_wg.compute_repexp_hidden_mean(request)
        if len(output) != len(batch):
            raise RuntimeError(f"representation forward returned {len(output)} rows for {len(batch)} keys")
        return dataplane.dense_rows(dataplane.read_fields(batch, [OUTPUT_KEY])[OUTPUT_KEY])

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """The one dispatch on the method's hooks (repexp.methods): "reward" methods (RepExp) add their term to
        ``rm_scores`` before verl's advantage; "advantage" methods change verl's advantage: pass@k through the
        estimator the config names (repexp.verl.methods), outcome exploration by adding its term to it after the
        group normalisation; KL-Cov / Clip-Cov act in verl's policy loss on the workers (``loss`` hook); GRPO
        runs verl's computation unchanged."""
        if "reward" in self.repexp.entry.hooks:
            return self._advantage_of_shaped_reward(batch, metrics, self._reward_terms[self.repexp.method])
        data = dataplane.read_fields(batch, ["uid", "rm_scores", "responses"])
        scores = dataplane.row_sums(data["rm_scores"]).double()
        metrics.update(group_metrics(dataplane.non_tensor_list(data, "uid"), scores, dataplane.padding_rows(batch)))
        metrics.update(_distinct_fraction(batch, data))
        batch = super()._compute_advantage(batch, metrics)
        term = self._advantage_terms.get(self.repexp.method)
        return batch if term is None else term(batch, data, scores, metrics)

    def _advantage_of_shaped_reward(self, batch: KVBatchMeta, metrics: dict, term) -> KVBatchMeta:
        """verl's advantage on ``alpha * score + term`` (the term on each row's last token); afterwards
        ``rm_scores`` is the verifier score again and ``token_level_rewards`` the shaped reward."""
        rm_scores, shaped, data, term_metrics = term(batch)
        metrics.update(_distinct_fraction(batch, data))
        batch = super()._compute_advantage(batch, metrics)
        # verifier scores back for verl's critic/score; the shaped reward for critic/rewards (with a KL
        # reward verl wrote its own token_level_rewards = shaped - KL)
        restore = {"rm_scores": rm_scores}
        if not self.config.algorithm.use_kl_in_reward:
            restore["token_level_rewards"] = shaped
        batch = dataplane.write_fields(batch, restore)
        metrics.update(term_metrics)
        return batch

    def _repexp_term(self, batch: KVBatchMeta):
        """RepExp: hidden-state forward on the workers, ``beta * bonus`` on the driver (repexp.bonus_step)."""
        if not self.repexp.enabled:
            raise RuntimeError("method repexp with beta = 0: the settings check lets no such run through")
        with marked_timer(metric_names.TIMER_REPEXP_FORWARD, self.timing_raw, color="purple"):
            hidden = self._hidden_means(batch)
        with marked_timer(metric_names.TIMER_REPEXP_BONUS, self.timing_raw, color="purple"):
            names = ["uid", "rm_scores", "responses"] + (["extra_info"] if self.repexp.persist_covariance else [])
            data = dataplane.read_fields(batch, names)
            rm_scores = data["rm_scores"]
            excluded = dataplane.padding_rows(batch) | (dataplane.row_lengths(rm_scores) == 0)
            result = compute_step_bonus(
                hidden, dataplane.non_tensor_list(data, "uid"), dataplane.row_sums(rm_scores).double(), self.repexp,
                beta=self.repexp.beta, step=self.global_steps, state=self.bonus_state, excluded=excluded,
                prompt_keys=_prompt_keys(data) if self.repexp.persist_covariance else None)
            shaped = dataplane.add_at_last_token(rm_scores, self.repexp.alpha, result.bonus_scaled.float())
            dataplane.write_fields(batch, {"rm_scores": shaped})
        return rm_scores, shaped, data, result.metrics

    def _outcome_term(self, batch: KVBatchMeta, data, scores: torch.Tensor, metrics: dict) -> KVBatchMeta:
        """Outcome exploration: c * bonus of the final answers of the decoded responses
        (repexp.methods.outcome), added to every response token's advantage after verl's GRPO normalisation,
        as the paper's objective adds it (a per-group constant such as UCB-Con's b0 survives). `data` and
        `scores`: the rows' uid, rm_scores and responses and their verifier scores, as `_compute_advantage`
        read them before verl's advantage."""
        with marked_timer(metric_names.TIMER_OUTCOME_BONUS, self.timing_raw, color="purple"):
            extra = dataplane.read_fields(batch, ["data_source", "extra_info", "advantages"])
            excluded = dataplane.padding_rows(batch) | (dataplane.row_lengths(data["rm_scores"]) == 0)
            term, term_metrics = self.outcome(
                tokenizer=self.tokenizer, groups=dataplane.non_tensor_list(data, "uid"),
                question_keys=_question_keys(extra, excluded),
                data_sources=[str(source) for source in dataplane.non_tensor_list(extra, "data_source")],
                responses=dataplane.token_rows(data["responses"]), scores=scores, excluded=excluded)
            batch = dataplane.write_fields(batch, {"advantages": dataplane.add_per_row(extra["advantages"],
                                                                                        term.float())})
        metrics.update(term_metrics)
        return batch

    # ------------------------------------------------------------------ validation

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None) -> dict[str, float]:
        metric_dict = super()._val_metrics_update(
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns, expected_acc_counts=expected_acc_counts
        )
        dev = dev_pass_at_k(sample_uids, reward_extra_infos_dict["reward"])
        self.best_dev.record_validation(self.global_steps, dev)
        best = self.best_dev.best()
        if best is not None:
            dev[metric_names.DEV_BEST_STEP] = float(best["step"])
        return {**metric_dict, **dev}

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self):
        step_dir = checkpoint_dir(self.run_dir, self.global_steps)
        if self.repexp.enabled and self.repexp.persist_covariance:
            step_dir.mkdir(parents=True, exist_ok=True)
            with atomic_path(step_dir / layout.VERL_STATE) as tmp:
                torch.save(self.bonus_state.state_dict(), tmp)
        if self.outcome is not None:
            step_dir.mkdir(parents=True, exist_ok=True)
            self.outcome.save(step_dir / layout.VERL_OUTCOME_STATE)
        started = time.monotonic()
        super()._save_checkpoint()
        if self.config.actor_rollout_ref.actor.get("checkpoint", {}).get("async_save", False):
            logger.warning("async checkpoint saves are never marked complete; repexp select cannot pick them")
            return
        self.clock.save_took(time.monotonic() - started)
        self.training_time.save(step_dir)
        mark_complete(step_dir)
        best = self.best_dev.write()
        prune_checkpoints(self.run_dir, self.run_settings.max_checkpoints_to_keep, best["step"] if best else None,
                          RESUME_ONLY)

    # ------------------------------------------------------------------ walltime chunks (repexp.walltime)

    def _end_chunk_if_out_of_time(self) -> None:
        """At the end of a step (not the last): if the next one and a save would not end before the
        chunk's deadline, save this step (unless verl's schedule just did) and make it the last of
        this process; verl still validates it after this hook when its schedule says so."""
        step = self.global_steps
        self.clock.step_ended()
        if step >= self.total_training_steps or not self.clock.ends_chunk():
            return
        logger.warning("walltime chunk: stopping after step %d with a checkpoint; the next allocation resumes", step)
        if step % self.config.trainer.save_freq:  # verl saved this step already when it is on the save schedule
            self._save_checkpoint()
        write_chunk_end(self.run_dir, step, self.clock.deadline)
        self.total_training_steps = step  # fit's loop ends after this step

    def on_step_end(self):
        super().on_step_end()  # the new weights reach the rollout replicas first: validation samples them
        if not self._first_step_marked:
            startup.mark("first_step")
            self._first_step_marked = True
        self._end_chunk_if_out_of_time()

    def _load_checkpoint(self):
        startup.mark("servers")  # verl's _setup calls this last, after the reward workers and vLLM replicas
        super()._load_checkpoint()
        step = self.global_steps
        # forget what a previous attempt logged after the state we resume from
        self.metrics_logger.truncate_after(step)
        self.best_dev.history = [entry for entry in self.best_dev.history if entry["step"] <= step]
        self.best_dev.write()
        if step == 0:
            return
        step_dir = checkpoint_dir(self.run_dir, step)
        # training time counts on from what the resumed checkpoint had used
        self.training_time = TrainingTime.resume(step_dir, started=self.training_time.started)
        if not is_complete(step_dir):
            # verl writes latest_checkpointed_iteration.txt as the last act of its save: the files are all there
            mark_complete(step_dir)
            self.best_dev.write()
        if self.repexp.enabled and self.repexp.persist_covariance:
            state_path = step_dir / layout.VERL_STATE
            if not state_path.exists():
                raise FileNotFoundError(f"{state_path}: missing; cannot resume the persistent covariance")
            self.bonus_state.load_state_dict(torch.load(state_path, weights_only=False))
        if self.outcome is not None:
            self.outcome.load(step_dir / layout.VERL_OUTCOME_STATE)

    # ------------------------------------------------------------------ metrics.jsonl

    def _attach_metrics_logger(self) -> None:
        tracking = getattr(self, "logger", None)
        if tracking is not None and layout.METRICS not in tracking.logger:
            tracking.logger[layout.METRICS] = self.metrics_logger

    def on_validate_begin(self):
        self._attach_metrics_logger()
        if not self._first_step_marked:  # a validation before this process's first step (val_before_train)
            startup.mark("validation_begin")
        super().on_validate_begin()

    def on_validate_end(self):
        super().on_validate_end()
        if not self._first_step_marked:
            startup.mark("validation_end")

    def on_train_begin(self):
        self._attach_metrics_logger()
        super().on_train_begin()
        self.clock.start()


def _distinct_fraction(batch: KVBatchMeta, data) -> dict[str, float]:
    """`rollout/distinct_frac` and `rollout/all_correct_identical_frac` of the step (repexp.metrics.
    rollout_diversity) from the rows' ``responses`` and verifier scores (``rm_scores``) per uid, without
    verl's padding rows."""
    padding = dataplane.padding_rows(batch).tolist()
    scores = dataplane.row_sums(data["rm_scores"]).double().tolist()
    rows = zip(dataplane.non_tensor_list(data, "uid"), dataplane.token_rows(data["responses"]), scores, padding)
    kept = [(uid, tokens, score) for uid, tokens, score, is_padding in rows if not is_padding]
    return metric_names.rollout_diversity([uid for uid, _, _ in kept], [tokens for _, tokens, _ in kept],
                                          scores=[score for _, _, score in kept])


def _prompt_keys(data, excluded=None, needed_by: str = "persist_covariance") -> list[str]:
    """Stable per-prompt keys (persistent covariance, outcome exploration's answer counts): the dataset's
    problem_id, else its index. Excluded rows (verl's padding rows, which carry no extra_info) get ""."""
    keys = []
    skip = [False] * len(data["rm_scores"]) if excluded is None else excluded.tolist()
    for info, skipped in zip(dataplane.non_tensor_list(data, "extra_info"), skip):
        info = info or {}
        key = info.get("problem_id", info.get("index"))
        if key is None and not skipped:
            raise ValueError(f"{needed_by} needs extra_info.problem_id or extra_info.index in the dataset rows")
        keys.append("" if key is None else str(key))
    return keys


def _question_keys(data, excluded) -> list[str]:
    return _prompt_keys(data, excluded, needed_by="outcome exploration")


def _grader(config: DictConfig) -> str:
    """The run's grader, from the reward function verl calls (repexp.verl.reward.FUNCTION_NAMES)."""
    name = config.reward.custom_reward_function.get("name")
    graders = {function: grader for grader, function in FUNCTION_NAMES.items()}
    if name not in graders:
        raise ValueError(f"reward.custom_reward_function.name: {name!r} is not one of {sorted(graders)}")
    return graders[name]
