"""The TRL backend (repexp.trl) on the offline tiny Qwen2: real GRPO steps on CPU, no mocks.

Data are a few GSM8K-style rows written to tmp_path in verl's row format. A random tiny model
never answers correctly, so the training runs switch `turn_off_if_none_correct` off to give the
bonus (and hence the GRPO advantage) something to do; the turn-off rule itself is tested on the
reward function with constructed completions of known correctness.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from repexp import config as C
from repexp import metrics as M
from repexp.checkpoints import checkpoint_dir, complete_steps, is_complete

REPO = Path(__file__).resolve().parents[1]
N_ROLLOUTS = 4


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from repexp.models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def write_rows(path: Path, count: int, split: str, offset: int = 0, *, data_source: str = "openai/gsm8k",
               ground_truths: dict[str, str] | None = None) -> None:
    """`count` addition questions; `ground_truths` (question -> answer) replaces the true sums it names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i in range(count):
        a, b = (i * 3 + offset) % 9 + 1, (i * 5 + offset) % 7 + 1
        question = f"What is {a} + {b}? Let's think step by step and output the final answer after \"####\"."
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": (ground_truths or {}).get(question, str(a + b))},
            "extra_info": {"split": split, "index": i, "problem_id": f"gsm8k/{split}/{i}"},
        })
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_rows(root / "train.parquet", 4, "train")  # 2 steps per epoch: the resume starts epoch 1
    write_rows(root / "dev.parquet", 2, "test", offset=4)
    return root


def run_config(root: Path, model: Path, data: Path, *, beta: float = 0.01, train: dict | None = None,
               bonus: dict | None = None, trl: dict | None = None, method: str | None = None,
               params: dict | None = None) -> C.RunConfig:
    """A resolved job config through the real schema (load + compose), pointed at test paths: RepExp with
    `beta` (GRPO for β = 0), or `method` with its `params` (the method's defaults for the rest)."""
    train_section = {
        "n_rollouts": N_ROLLOUTS, "lr": 1e-4, "train_batch_size": 2, "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 8, "max_prompt_length": 96, "max_response_length": 12,
        "total_steps": 4, "test_freq": 2, "save_freq": 2, "val_n": 2, **(train or {}),
    }
    raw = {
        "results_dir": str(root),
        "model": str(model),
        "sweep": {"tasks": ["gsm8k"], "backends": ["trl"], "sparse_dims": [8], "betas": [beta or 0.01], "seeds": [3]},
        "bonus": {"turn_off_if_none_correct": False, **(bonus or {})},
        "train": train_section,
        "trl": {"device": "cpu", "eval_batch_size": 2, "num_threads": 1, "bonus_micro_batch_size": 4, **(trl or {})},
    }
    if method is not None:
        spec = C.RunSpec.of("gsm8k", method, "trl", 3, **(params or {}))
    elif beta:
        spec = C.RunSpec.of("gsm8k", "repexp", "trl", 3, sparse_dim=8, beta=beta)
    else:
        spec = C.RunSpec.of("gsm8k", "grpo", "trl", 3)
    cfg = C.compose(C.load(raw), spec)
    return dataclasses.replace(cfg, data_dir=str(data), run_dir=str(root / "run"))


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("timing_s/") and k != "step_time"}


# --------------------------------------------------------------------------- settings (no model)


def test_settings_map_batches_and_reject_what_trl_cannot_honour(tmp_path):
    from repexp.trl import settings as S

    cfg = run_config(tmp_path, tmp_path / "m", tmp_path,
                     train={"train_batch_size": 4, "ppo_mini_batch_size": 2, "micro_batch_size_per_gpu": 4,
                            "total_steps": None, "total_epochs": 3})
    plan = S.plan_steps(cfg, num_train_prompts=10)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.optimizer_steps_per_step) == (4, 2, 2)
    assert plan.micro_batches_per_step == 4 and plan.steps_per_epoch == 2 and plan.total_steps == 6
    kwargs = S.grpo_config_kwargs(cfg, plan, output_dir=str(tmp_path), use_cpu=True)
    assert kwargs["max_steps"] == 12 and kwargs["save_steps"] == 4 and kwargs["loss_type"] == "dapo"
    assert kwargs["beta"] == 0.0 and kwargs["num_generations"] == N_ROLLOUTS

    from trl import GRPOConfig  # the kwargs are a valid GRPOConfig with the intended batch geometry

    args = GRPOConfig(**kwargs)
    assert args.generation_batch_size == 4 * N_ROLLOUTS and args.steps_per_generation == 4

    bad = [
        (dict(train={"loss_agg_mode": "seq-mean-token-sum"}), "train.loss_agg_mode"),
        (dict(bonus={"persist_covariance": True}), "bonus.persist_covariance"),
        (dict(bonus={"persist_covariance": True, "randomize_projection": False, "reward_type": "leave_one_out"}),
         "bonus.persist_covariance"),
    ]
    for overrides, key in bad:
        with pytest.raises(C.ConfigError, match=key.replace(".", r"\.")):
            S.check_run_config(run_config(tmp_path, tmp_path / "m", tmp_path, **overrides))
    with pytest.raises(C.ConfigError, match=r"^backend"):
        S.check_run_config(dataclasses.replace(cfg, backend="verl"))
    with pytest.raises(C.ConfigError, match=r"train\.micro_batch_size_per_gpu"):
        S.plan_steps(run_config(tmp_path, tmp_path / "m", tmp_path, train={"micro_batch_size_per_gpu": 3}), 10)
    with pytest.raises(C.ConfigError, match=r"train\.train_batch_size"):
        S.plan_steps(cfg, num_train_prompts=3)


def test_missing_data_is_a_clear_error(tmp_path, tiny_model):
    from repexp.trl.train import main

    cfg = run_config(tmp_path, tiny_model, tmp_path / "nowhere")
    job = tmp_path / "job.yaml"
    job.write_text(C.dump_yaml(cfg))
    assert main(["--config", str(job)]) == 2


def test_pruning_keeps_newest_whole_and_best_without_resume_state(tmp_path):
    from repexp.checkpoints import SLIM_MARKER, BestDevTracker, mark_complete, prune_checkpoints, resumable_steps
    from repexp.trl.train import RESUME_ONLY

    for step in (2, 4, 6, 8):
        directory = checkpoint_dir(tmp_path, step)
        directory.mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
            (directory / name).write_text(name)
        mark_complete(directory)
    tracker = BestDevTracker(tmp_path)
    for step, value in ((2, 0.1), (4, 0.5), (6, 0.2), (8, 0.3)):
        tracker.record_validation(step, {"dev/pass_at_1": value})
    assert prune_checkpoints(tmp_path, None, 4, RESUME_ONLY) == []  # null keeps everything
    assert complete_steps(tmp_path) == [2, 4, 6, 8]
    assert prune_checkpoints(tmp_path, 2, tracker.best()["step"], RESUME_ONLY) == [2]
    assert complete_steps(tmp_path) == [4, 6, 8]  # newest two plus the best (step 4)
    best = checkpoint_dir(tmp_path, 4)
    assert sorted(p.name for p in best.iterdir()) == sorted(["COMPLETE", SLIM_MARKER, "config.json",
                                                             "model.safetensors"])
    assert len(list(checkpoint_dir(tmp_path, 8).iterdir())) == 6  # the newest stay whole
    assert resumable_steps(tmp_path) == [6, 8]  # a retry never resumes from the slimmed one
    assert tracker.best()["step"] == 4  # still selectable


def test_pruning_after_done_keeps_the_best_checkpoint_only_and_repeats_safely(tmp_path):
    from repexp.checkpoints import SLIM_MARKER, mark_complete, prune_finished, remove_checkpoint
    from repexp.trl.train import RESUME_ONLY, prepare_run_dir

    def make(step):
        directory = checkpoint_dir(tmp_path, step)
        directory.mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
            (directory / name).write_text(name)
        mark_complete(directory)

    for step in (4, 6):  # retention left the slimmed best (4) and the newest whole (6)
        make(step)
    assert prune_finished(tmp_path, None, RESUME_ONLY) == [] and complete_steps(tmp_path) == [4, 6]  # no best: kept
    assert prune_finished(tmp_path, 4, RESUME_ONLY) == [6]
    assert complete_steps(tmp_path) == [4]
    listed = json.loads((checkpoint_dir(tmp_path, 4) / "COMPLETE").read_text())["files"]
    assert sorted(listed) == [SLIM_MARKER, "config.json", "model.safetensors"]  # what stays, nothing missing
    assert sorted(p.name for p in checkpoint_dir(tmp_path, 4).iterdir()) == ["COMPLETE", SLIM_MARKER, "config.json",
                                                                            "model.safetensors"]
    assert prune_finished(tmp_path, 4, RESUME_ONLY) == [] and complete_steps(tmp_path) == [4]  # idempotent
    make(8)  # a kill half-way through a removal: COMPLETE goes first, so what is left is no checkpoint
    (checkpoint_dir(tmp_path, 8) / "COMPLETE").unlink()
    assert complete_steps(tmp_path) == [4] and prepare_run_dir(tmp_path, "auto") is None  # nothing resumable
    assert not checkpoint_dir(tmp_path, 8).exists()  # the retry's clean-up removed the rest
    remove_checkpoint(checkpoint_dir(tmp_path, 4))
    assert complete_steps(tmp_path) == []


def test_a_finished_training_keeps_its_best_checkpoint_only_and_select_and_eval_read_it(tmp_path, tiny_model,
                                                                                         data_dir):
    """`train.prune_when_done` (default) with `train.max_checkpoints_to_keep` set: after DONE only the best-dev
    checkpoint stays, without optimizer/scheduler/RNG/bonus state; select and eval use it; a retry that lost
    DONE (a kill while pruning) writes it again without training."""
    from repexp import cli
    from repexp.checkpoints import SLIM_MARKER, checkpoint_problems, select
    from repexp.trl.train import train

    # validated at steps 0 and 4 only, saved at 2 and 4: the final step is the best (the only one selectable)
    cfg = run_config(tmp_path, tiny_model, data_dir,
                     train={"max_checkpoints_to_keep": 1, "test_freq": 4, "save_freq": 2})
    run_dir = Path(cfg.run_dir)
    result = train(cfg)
    assert result.done["final_step"] == 4 and result.done["best_step"] == 4
    assert complete_steps(run_dir) == [4]  # step 2, the resume point while training, is gone
    best = checkpoint_dir(run_dir, 4)
    names = {p.name for p in best.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", SLIM_MARKER} <= names
    assert not names & {"optimizer.pt", "scheduler.pt", "rng_state.pth", "repexp_state.pt"}, names
    assert not any(name.startswith("repexp_state") for name in names)
    assert not checkpoint_problems(best)
    pointer = select(run_dir, "trl")
    assert pointer["checkpoint_step"] == 4 and pointer["model_path"] == str(best) and "skipped" not in pointer
    pointer_file = tmp_path / "select.json"
    pointer_file.write_text(json.dumps(pointer))
    out = tmp_path / "eval"
    assert cli.main(["eval", "--model-pointer", str(pointer_file), "--data", str(data_dir / "dev.parquet"),
                     "--out", str(out), "--set", "eval.n_samples=2", "eval.max_new_tokens=4", "eval.shard_size=2",
                     "--seed", "3", "--no-progress"]) == 0
    assert json.loads((out / "eval.json").read_text())["checkpoint_step"] == 4

    (run_dir / "DONE").unlink()  # as Snakemake does when the trainer was killed after DONE, while pruning
    again = train(cfg)
    assert again.trainer is None and again.done["final_step"] == 4 and again.done["best_step"] == 4
    assert complete_steps(run_dir) == [4] and (run_dir / "DONE").exists()


# --------------------------------------------------------------------------- features and reward


def test_pooling_equals_plain_forward_masked_mean(tiny_model):
    from transformers import AutoModel, AutoModelForCausalLM

    from repexp.features import completion_features

    backbone = AutoModel.from_pretrained(tiny_model, dtype=torch.float32).eval()
    causal_lm = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = [[5, 17, 99, 3], [5, 17], [7, 8, 9, 10, 11, 12], [42]]
    completions = [[100, 200, 300, 2], [], [400], [11, 12, 13, 14, 15, 16, 17]]  # one empty completion
    pooled = completion_features(backbone, prompts, completions, pad_token_id=0, micro_batch_size=3)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            last = causal_lm(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
        if completion:
            expected = last[len(prompt):].sum(dim=0) / len(completion)  # hand-computed masked mean
        else:
            expected = torch.zeros(last.shape[-1])
        torch.testing.assert_close(pooled[row], expected, atol=2e-5, rtol=1e-4)
    assert torch.isfinite(pooled).all() and pooled[1].abs().sum() == 0


def make_reward(cfg, tiny_model):
    from transformers import AutoTokenizer

    from repexp.trl.reward import RepExpReward

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    return RepExpReward(cfg, tokenizer, optimizer_steps_per_step=1, device=torch.device("cpu")), tokenizer


def constructed_batch(tokenizer):
    """Two groups of 4: every completion of group 0 wrong; group 1 has two correct ones (answer 7)."""
    texts = ["#### 3", "the answer is 5", "#### 12", "no idea",
             "3 + 4 = 7\n#### 7", "#### 8", "so #### 7", "#### 6"]
    prompts = ([[{"role": "user", "content": "What is 2 + 5?"}]] * 4
               + [[{"role": "user", "content": "What is 3 + 4?"}]] * 4)
    eos = tokenizer.eos_token_id
    completion_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    return dict(prompts=prompts, completions=[[{"role": "assistant", "content": t}] for t in texts],
                completion_ids=completion_ids, data_source=["openai/gsm8k"] * 8,
                reward_model=[{"ground_truth": "7"}] * 8, extra_info=[{"index": i // 4} for i in range(8)])


def test_turn_off_rule_zeroes_bonus_of_group_without_correct_completion(tmp_path, tiny_model):
    cfg = run_config(tmp_path, tiny_model, tmp_path, beta=0.5, bonus={"turn_off_if_none_correct": True})
    reward, tokenizer = make_reward(cfg, tiny_model)
    batch = constructed_batch(tokenizer)
    logged = {}
    advantages = torch.tensor(reward(**batch, log_metric=logged.__setitem__))
    assert reward.forward_calls == 1 and reward.backbone_loads == 1  # the real frozen forward ran
    shaped = reward.last_shaped.tolist()
    assert shaped[:4] == [0.0] * 4  # no correct completion: α·0 + β·(bonus switched off)
    bonus = [total - correct for total, correct in zip(shaped[4:], [1, 0, 1, 0])]  # α = 1
    assert all(b > 0 for b in bonus)  # the partially correct group keeps β·bonus on every rollout
    # returned: verl's GRPO advantage of the shaped reward, (r − mean) / (unbiased std + 1e-6) per group
    group = torch.tensor(shaped[4:], dtype=torch.float64)
    torch.testing.assert_close(advantages[4:], ((group - group.mean()) / (group.std() + 1e-6)).float())
    assert advantages[:4].abs().max() == 0
    assert logged["repexp/groups/none_correct_frac"] == 0.5 and logged["repexp/groups/some_correct_frac"] == 0.5
    assert logged["repexp/bonus_raw/min"] > 0  # raw bonuses exist for both groups before the rule
    assert logged["reward/verifier/mean"] == 0.25
    assert logged["rollout/distinct_frac"] == 1.0  # 8 different completions
    assert logged["timing_s/repexp_forward"] > 0 and logged["timing_s/repexp_bonus"] >= 0


def test_distinct_fraction_takes_consecutive_blocks_of_n_as_groups(tmp_path, tiny_model):
    cfg = run_config(tmp_path, tiny_model, tmp_path, beta=0.0)  # GRPO logs it too (no representation model)
    reward, tokenizer = make_reward(cfg, tiny_model)
    batch = constructed_batch(tokenizer)
    batch["completion_ids"][5:8] = [batch["completion_ids"][4]] * 3  # group 1: one completion four times
    batch["completion_ids"][1] = list(batch["completion_ids"][0])  # group 0: three distinct of four
    logged = {}
    reward(**batch, log_metric=logged.__setitem__)
    assert logged["rollout/distinct_frac"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert reward.forward_calls == 0
    # group 1 (four copies of "... #### 7") is the one all-correct group, and its rollouts are identical
    assert logged["repexp/groups/all_correct_frac"] == 0.5
    assert logged[M.ALL_CORRECT_IDENTICAL_FRACTION] == 1.0
    # final answers: group 0 "3", "3", "12", none (3 outcomes); group 1 "7" (1)
    assert logged[M.DISTINCT_ANSWERS] == 2.0


def test_all_correct_identical_fraction_is_logged_by_the_trl_reward(tmp_path, tiny_model):
    cfg = run_config(tmp_path, tiny_model, tmp_path, beta=0.0)
    reward, tokenizer = make_reward(cfg, tiny_model)
    batch = constructed_batch(tokenizer)
    correct = tokenizer("#### 7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    batch["completion_ids"][4:8] = [list(correct)] * 4  # group 1: all correct, all identical
    batch["completion_ids"][0:4] = [list(correct)] * 3 + [tokenizer("so #### 7", add_special_tokens=False)[
        "input_ids"] + [tokenizer.eos_token_id]]  # group 0: all correct, two distinct
    logged = {}
    reward(**batch, log_metric=logged.__setitem__)
    assert logged["repexp/groups/all_correct_frac"] == 1.0
    assert logged[M.ALL_CORRECT_IDENTICAL_FRACTION] == 0.5
    assert logged[M.DISTINCT_ANSWERS] == 1.0  # every rollout answers 7


def test_persistent_covariance_state_survives_save_and_load(tmp_path, tiny_model):
    bonus = {"persist_covariance": True, "randomize_projection": False}
    cfg = run_config(tmp_path, tiny_model, tmp_path, bonus=bonus)
    straight, tokenizer = make_reward(cfg, tiny_model)
    batch = constructed_batch(tokenizer)
    straight(**batch)
    expected = straight(**batch)  # the second visit scores against the accumulated covariance

    first, _ = make_reward(cfg, tiny_model)
    first(**batch)
    first.save_state(tmp_path)
    resumed, _ = make_reward(cfg, tiny_model)
    resumed.load_state(tmp_path)
    assert resumed(**batch) == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------- training runs


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model, data_dir):
    """4 GRPO steps with β > 0, checkpoint and validation every 2 steps (also the resume reference)."""
    from repexp.trl.train import train

    cfg = run_config(tmp_path_factory.mktemp("full"), tiny_model, data_dir)
    return cfg, train(cfg)


def test_repexp_training_steps(uninterrupted, tiny_model):
    cfg, result = uninterrupted
    run_dir = Path(cfg.run_dir)
    assert result.done["final_step"] == 4 and result.done["best_step"] in (2, 4)
    assert complete_steps(run_dir) == [2, 4]
    assert result.reward.backbone_loads == 1 and result.reward.forward_calls == 4

    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    for record in records[1:]:
        assert torch.isfinite(torch.tensor(record["actor/pg_loss"]))
        assert 1 / N_ROLLOUTS <= record["rollout/distinct_frac"] <= 1  # rollout diversity, every step
        assert record["actor/entropy"] > 0 and "entropy" not in record  # TRL's entropy under verl's name
        assert record["repexp/bonus_raw/mean"] > 0 and record["repexp/bonus_scaled/mean"] > 0
        for key in ("reward/verifier/mean", "reward/shaped/mean", "repexp/groups/none_correct_frac",
                    "repexp/bonus_turned_off_frac", "repexp/hidden_norm/mean",  # the verl backend's set too
                    "timing_s/repexp_forward", "timing_s/repexp_bonus", "timing_s/step"):
            assert key in record
    dev_keys = {"dev/pass_at_1", "dev/pass_at_2", "dev/num_problems", "dev/samples_per_problem"}  # as verl logs them
    assert dev_keys <= set(records[0]) and dev_keys <= set(records[2]) and records[0]["dev/num_problems"] > 0
    assert records[4]["dev/best_step"] == 2  # validated before its own checkpoint exists: the best saved one
    assert any(r["actor/grad_norm"] > 0 for r in records[1:])

    best = json.loads((run_dir / "best_dev.json").read_text())
    assert [h["step"] for h in best["history"]] == [0, 2, 4]
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    trained = AutoModelForCausalLM.from_pretrained(checkpoint_dir(run_dir, 4), dtype=torch.float32)
    changed = [name for (name, a), (_, b) in zip(initial.named_parameters(), trained.named_parameters())
               if not torch.equal(a, b)]
    assert changed, "training did not change any parameter"
    done = json.loads((run_dir / "DONE").read_text())
    assert done["final_step"] == 4 and 0 < done["train_hours"] < 1


def test_beta_zero_is_plain_grpo_without_representation_model(tmp_path, tiny_model, data_dir, monkeypatch):
    from mlflow.tracking import MlflowClient

    from repexp.trl.runlog import MlflowSink
    from repexp.trl.train import train

    # The wrapper pre-creates the node's MLflow run and passes its id in the environment.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("trl-test")).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)

    cfg = run_config(tmp_path, tiny_model, data_dir, beta=0.0,
                     train={"total_steps": 1, "test_freq": 1, "save_freq": 1, "val_before_train": False})
    result = train(cfg)
    assert result.reward.backbone_loads == 0 and result.reward.forward_calls == 0
    assert result.reward._backbone is None
    (record,) = read_metrics(Path(cfg.run_dir))
    assert not any(key.startswith(("repexp/bonus", "timing_s/repexp")) for key in record)
    assert record["reward/shaped/mean"] == record["reward/verifier/mean"]  # α = 1, no bonus
    assert 1 / N_ROLLOUTS <= record["rollout/distinct_frac"] <= 1 and record["actor/entropy"] > 0
    assert is_complete(checkpoint_dir(cfg.run_dir, 1))

    logged = client.get_run(run_id).data.metrics
    assert logged["reward/verifier/mean"] == record["reward/verifier/mean"]
    assert logged["dev/pass_at_1"] == record["dev/pass_at_1"]  # one name in metrics.jsonl and MLflow
    assert logged["rollout/distinct_frac"] == record["rollout/distinct_frac"]
    with pytest.warns(RuntimeWarning, match="MLflow tracking switched off"):
        broken = MlflowSink(run_id="no-such-run", tracking_uri=uri)
        broken.log({"step": 1, "x": 1.0}, 1)  # a tracking failure warns; it never raises
    assert not broken.enabled


def test_walltime_chunks_resume_to_the_uninterrupted_run(tmp_path, uninterrupted, tiny_model, data_dir):
    """A deadline already past (repexp.walltime): every chunk trains one step, saves it complete
    (steps 1 and 3 are off the save schedule of every 2 steps), writes CHUNK_END and returns
    without DONE; the next attempt resumes there. Three chunks and a last attempt give the
    uninterrupted run's metrics, best-dev record and final weights."""
    from safetensors.torch import load_file

    from repexp.trl.train import train
    from repexp.walltime import read_chunk_end

    reference_cfg, _ = uninterrupted
    cfg = run_config(tmp_path, tiny_model, data_dir)
    run_dir = Path(cfg.run_dir)
    past = time.time() - 1
    for step in (1, 2, 3):
        result = train(cfg, deadline=past)
        assert result.done is None and not (run_dir / "DONE").exists()
        assert read_chunk_end(run_dir)["step"] == step and is_complete(checkpoint_dir(run_dir, step))
        assert max(r["step"] for r in read_metrics(run_dir)) == step
    result = train(cfg, deadline=past)  # the last step ends the run whatever the clock says
    assert result.done["final_step"] == 4 and result.done["resumed_from_step"] == 3
    assert read_chunk_end(run_dir) is None and complete_steps(run_dir) == [1, 2, 3, 4]

    reference = [without_timings(r) for r in read_metrics(Path(reference_cfg.run_dir))]
    chunked = [without_timings(r) for r in read_metrics(run_dir)]
    assert [r["step"] for r in chunked] == [r["step"] for r in reference] == [0, 1, 2, 3, 4]
    for got, want in zip(chunked, reference):
        assert set(got) == set(want)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), f"step {want['step']} differs across chunks"
    want_best = json.loads((Path(reference_cfg.run_dir) / "best_dev.json").read_text())
    got_best = json.loads((run_dir / "best_dev.json").read_text())
    assert got_best["history"] == want_best["history"] and got_best["best_step"] == want_best["best_step"]
    got_weights = load_file(checkpoint_dir(run_dir, 4) / "model.safetensors")
    want_weights = load_file(checkpoint_dir(reference_cfg.run_dir, 4) / "model.safetensors")
    assert any(not torch.equal(t, load_file(checkpoint_dir(run_dir, 1) / "model.safetensors")[n])
               for n, t in want_weights.items()), "the weights never changed: the comparison would be empty"
    for name, tensor in want_weights.items():
        torch.testing.assert_close(got_weights[name], tensor, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- methods beside RepExp

# The tiny random model rarely writes a number. On `repexp/arith` rows (a response's last number is its
# answer) some completions have one: outcome exploration sees distinct answers, and ground truths taken
# from a first run's completions give pass@k training groups with correct and wrong rollouts.
ARITH = "repexp/arith"
ONE_STEP = {"total_steps": 1, "test_freq": 1, "save_freq": 1, "val_before_train": False}


def arith_data(root: Path, train_rows: int, ground_truths: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_rows(root / "train.parquet", train_rows, "train", data_source=ARITH, ground_truths=ground_truths)
    write_rows(root / "dev.parquet", 2, "test", offset=4, data_source=ARITH)
    return root


def step_rollouts(trainer) -> tuple[list[str], list[str]]:
    """The question and completion text of every rollout of the last step, as TRL logged them."""
    return ([prompt[-1]["content"] for prompt in trainer._logs["prompt"]],
            [completion[-1]["content"] for completion in trainer._logs["completion"]])


def trl_advantages(trainer) -> torch.Tensor:
    """The advantages TRL's loss used in the last step (after its own group-mean subtraction)."""
    return torch.tensor(list(trainer._logs["advantages"]), dtype=torch.float32)


@pytest.fixture(scope="module")
def known_answers(tmp_path_factory, tiny_model) -> tuple[Path, list[str], list[str], dict[str, str]]:
    """Arith data whose ground truths are answers the tiny model gives: a first GRPO step's rollouts, and
    per question of that step, the first number one of its completions ended on. Returns the data
    directory with those ground truths, the step's questions and completions, and the truths."""
    from repexp.methods.outcome import final_answer
    from repexp.trl.train import train

    root = tmp_path_factory.mktemp("known_answers")
    first = train(run_config(root / "first", tiny_model, arith_data(root / "d1", 4), method="grpo",
                             train=ONE_STEP)).trainer
    questions, completions = step_rollouts(first)
    truths: dict[str, str] = {}
    for question, completion in zip(questions, completions):
        answer = final_answer(ARITH, completion, "repexp")
        if answer is not None:
            truths.setdefault(question, answer)
    assert truths, "no completion of the first step gave a number"
    return arith_data(root / "d2", 4, truths), questions, completions, truths


def test_passk_training_uses_the_passk_advantage(tmp_path, tiny_model, known_answers):
    from repexp.methods.passk import passk_advantages
    from repexp.trl.train import train
    from repexp.verify import score

    data, questions, completions, truths = known_answers
    cfg = run_config(tmp_path, tiny_model, data, method="passk", params={"passk_k": 2}, train=ONE_STEP)
    result = train(cfg)
    assert step_rollouts(result.trainer) == (questions, completions)  # same seed: only the ground truths moved
    scores = [score(ARITH, completion, truths.get(question, "-1")) for question, completion in
              zip(questions, completions)]
    expected = passk_advantages(scores, [i // N_ROLLOUTS for i in range(len(scores))], 2).float()
    assert expected.abs().max() > 0, "no group with correct and wrong rollouts: the check would be empty"
    torch.testing.assert_close(result.reward.last_advantages, expected)  # what the reward returned
    torch.testing.assert_close(trl_advantages(result.trainer), expected)  # what the step trained on
    (record,) = read_metrics(Path(cfg.run_dir))
    assert record["reward/verifier/mean"] == pytest.approx(sum(scores) / len(scores))
    assert record["passk/advantage/mean"] == pytest.approx(0.0, abs=1e-6) and 0 < record["passk/group_pass_at_k"] <= 1


def test_outcome_exploration_shapes_the_reward_and_resumes_its_counts(tmp_path, tiny_model):
    """Two questions, one step an epoch: step 2 asks step 1's questions again, so its bonus depends on the
    counts step 1 left; a run stopped after step 1 and resumed must reach the same numbers."""
    from repexp import layout
    from repexp.trl.reward import group_normalized
    from repexp.trl.train import train

    data = arith_data(tmp_path / "data", 2)
    two_steps = {"total_steps": 2, "test_freq": 2, "save_freq": 1, "val_before_train": False}
    straight_cfg = run_config(tmp_path / "straight", tiny_model, data, method="outcome", train=two_steps)
    straight = train(straight_cfg)
    run_dir = Path(straight_cfg.run_dir)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:  # the bonus goes into the advantage, not the reward
        assert record["reward/shaped/mean"] == record["reward/verifier/mean"]
        assert record["outcome/questions_seen"] == 2 and record["outcome/distinct_answers"] >= 1
        assert 1 / N_ROLLOUTS <= record["rollout/distinct_frac"] <= 1
    assert records[0]["outcome/bonus/mean"] == pytest.approx(0.5)  # nothing seen yet: min{1, 1/√0} − b0
    assert records[1]["outcome/bonus/mean"] < 0.5  # step 2 repeats answers step 1 counted
    # the step trains on GRPO's advantage + c·bonus, the bonus's group mean (b0 and the counts) kept
    reward = straight.reward
    bonus = reward.last_advantages.double() - group_normalized(reward.last_shaped, N_ROLLOUTS).double()
    assert bonus.mean().item() == pytest.approx(records[1]["outcome/bonus/mean"], abs=1e-6) and bonus.abs().max() > 0
    torch.testing.assert_close(trl_advantages(straight.trainer), reward.last_advantages)
    counts = [json.loads((checkpoint_dir(run_dir, step) / layout.TRL_OUTCOME_COUNTS).read_text())
              for step in (1, 2)]
    for step, state in zip((1, 2), counts):  # every rollout counted once, under its question's problem_id
        assert sorted(state["counts"]) == ["gsm8k/train/0", "gsm8k/train/1"]
        assert sum(n for pairs in state["counts"].values() for _, n in pairs) == step * 2 * N_ROLLOUTS

    cfg = run_config(tmp_path / "resumed", tiny_model, data, method="outcome", train=two_steps)
    assert train(cfg, deadline=time.time() - 1).done is None  # a walltime chunk: step 1 saved, then stop
    result = train(cfg)
    assert result.done["resumed_from_step"] == 1
    resumed_dir = Path(cfg.run_dir)
    assert json.loads((checkpoint_dir(resumed_dir, 2) / layout.TRL_OUTCOME_COUNTS).read_text()) == counts[1]
    resumed = [without_timings(r) for r in read_metrics(resumed_dir)]
    reference = [without_timings(r) for r in records]
    for got, want in zip(resumed, reference, strict=True):
        assert set(got) == set(want) and got == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_cov_losses_replace_trls_policy_loss(tmp_path, tiny_model, known_answers):
    """Two PPO mini-batches per step, so the second is off-policy (log π ≠ log π_old) and the KL-Cov
    penalty acts; rollouts with known answers, so the advantages (and the covariances) are not all 0.
    GRPO and KL-Cov train on the same rollouts; only the policy loss differs."""
    from safetensors.torch import load_file

    from repexp.trl.train import train

    two_mini_batches = {**ONE_STEP, "ppo_mini_batch_size": 1}
    # the random model is almost uniform (entropy ≈ log V), so covariances are far below the paper's Clip-Cov
    # window (1, 5): the window here starts at 0
    clip_cov = {"loss_mode": "clip_cov", "cov_ratio": 0.2, "cov_clip_lb": 0.0}
    runs = {}
    for name, method, params in (("grpo", "grpo", {}), ("kl_cov", "cov", {"loss_mode": "kl_cov", "cov_ratio": 0.2}),
                                 ("clip_cov", "cov", clip_cov)):
        cfg = run_config(tmp_path / name, tiny_model, known_answers[0], method=method, params=params,
                         train=two_mini_batches)
        result = train(cfg)
        (record,) = read_metrics(Path(cfg.run_dir))
        runs[name] = (result, record, load_file(checkpoint_dir(cfg.run_dir, 1) / "model.safetensors"))
    (grpo, grpo_record, grpo_weights), (kl, kl_record, kl_weights) = runs["grpo"], runs["kl_cov"]
    assert grpo.trainer.cov_loss is None and kl.trainer.cov_loss.params.loss_mode == "kl_cov"
    assert step_rollouts(kl.trainer) == step_rollouts(grpo.trainer)  # the same batch
    torch.testing.assert_close(trl_advantages(kl.trainer), trl_advantages(grpo.trainer))
    assert trl_advantages(grpo.trainer).abs().max() > 0
    assert kl_record["actor/ppo_kl"] > 0 and kl_record["actor/cov_selected_frac"] > 0  # the cov loss ran
    assert "actor/ppo_kl" not in grpo_record and kl_record["actor/entropy"] > 0
    assert kl_record["actor/pg_loss"] != grpo_record["actor/pg_loss"]
    assert any(not torch.equal(kl_weights[n], grpo_weights[n]) for n in grpo_weights), "the KL-Cov update is GRPO's"
    clip_record = runs["clip_cov"][1]
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/cov_selected_frac", "actor/entropy"} <= set(clip_record)
    assert 0 < clip_record["actor/cov_selected_frac"] <= 0.2  # tokens whose loss the covariance rule removed


def test_chunk_clock_decides_from_the_longest_step_and_save():
    from repexp.walltime import ChunkClock, chunk_deadline, parse_slurm_time

    clock = ChunkClock(deadline=1000.0)
    clock.start(now=0.0)
    clock.step_ended(now=100.0)  # a 100 s step; no save seen yet: a save is assumed to cost a step
    assert not clock.ends_chunk(now=100.0) and clock.ends_chunk(now=800.0)  # 800 + 100 + 100 >= 1000
    clock.step_ended(now=150.0)  # a shorter step does not lower the estimate
    clock.save_took(300.0)
    assert clock.ends_chunk(now=600.0) and not clock.ends_chunk(now=599.0)  # 600 + 100 + 300
    assert not ChunkClock(deadline=None).ends_chunk(now=1e12)  # no walltime: chunks never end
    assert chunk_deadline(None, 5) is None and chunk_deadline(10_000.0, 5) == 9_700.0
    assert parse_slurm_time("N/A") is None and parse_slurm_time("UNLIMITED") is None
    assert parse_slurm_time("2026-12-04T00:38:15") == time.mktime((2026, 12, 4, 0, 38, 15, 0, 0, -1))


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tmp_path, uninterrupted, tiny_model, data_dir):
    from repexp.trl.train import train

    reference_cfg, _ = uninterrupted
    cfg = run_config(tmp_path, tiny_model, data_dir)
    run_dir = Path(cfg.run_dir)
    job = tmp_path / "job.yaml"
    job.write_text(C.dump_yaml(cfg))
    process = subprocess.Popen([sys.executable, "-m", "repexp.trl.train", "--config", str(job)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while not is_complete(checkpoint_dir(run_dir, 2)):
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "no step-2 checkpoint within 240 s"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)  # mid-run: step 3 is being trained
    finally:
        process.kill()
        process.wait()
    assert not (run_dir / "DONE").exists()
    (checkpoint_dir(run_dir, 3)).mkdir(parents=True, exist_ok=True)  # a save cut short: no COMPLETE marker

    result = train(cfg)
    assert result.done["resumed_from_step"] == 2 and result.done["final_step"] == 4
    assert not checkpoint_dir(run_dir, 3).exists() and complete_steps(run_dir) == [2, 4]
    reference = [without_timings(r) for r in read_metrics(Path(reference_cfg.run_dir))]
    resumed = [without_timings(r) for r in read_metrics(run_dir)]
    assert [r["step"] for r in resumed] == [r["step"] for r in reference] == [0, 1, 2, 3, 4]
    for got, want in zip(resumed, reference):
        assert set(got) == set(want)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), f"step {want['step']} differs after resume"
    want_best = json.loads((Path(reference_cfg.run_dir) / "best_dev.json").read_text())
    got_best = json.loads((run_dir / "best_dev.json").read_text())
    assert got_best["history"] == want_best["history"] and got_best["best_step"] == want_best["best_step"]
    from safetensors.torch import load_file

    got_weights = load_file(checkpoint_dir(run_dir, 4) / "model.safetensors")
    want_weights = load_file(checkpoint_dir(reference_cfg.run_dir, 4) / "model.safetensors")
    for name, tensor in want_weights.items():
        torch.testing.assert_close(got_weights[name], tensor, rtol=1e-5, atol=1e-6)


def test_restart_count_asks_a_busy_controller_again(tmp_path, monkeypatch):
    """`slurm.restart_count` tells a job's allocations apart in MLflow; a slurmctld too busy to
    answer once (exit 1, "Socket timed out") must not leave an allocation untagged. The SLURM
    client is a stand-in script here (the real cluster runs in tests/test_slurm.py)."""
    from repexp import walltime

    calls = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho x >> " + str(calls) + "\n"
                        "[ $(wc -l < " + str(calls) + ") -ge 2 ] || { echo 'Socket timed out' >&2; exit 1; }\n"
                        "echo 'JobId=7 JobName=train Restarts=3 BatchFlag=1'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(walltime, "SLURM_QUERY_PAUSE_S", 0.0)
    assert walltime.restart_count({"SLURM_JOB_ID": "7"}) == 3
    assert calls.read_text().count("x") == 2
    calls.unlink()
    scontrol.write_text("#!/bin/sh\necho x >> " + str(calls) + "\nexit 1\n")
    assert walltime.restart_count({"SLURM_JOB_ID": "7"}) is None  # still refusing: untagged, no error
    assert calls.read_text().count("x") == walltime.SLURM_QUERY_TRIES
    assert walltime.restart_count({}) is None  # outside SLURM: nothing is asked
