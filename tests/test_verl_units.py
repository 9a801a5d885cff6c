"""Pure parts of the verl backend: pooling layouts, the shared bonus step as the trainer calls it, dev pass@k, settings,
overrides (no verl import)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from repexp import config as C
from repexp.bonus_step import BonusState, compute_step_bonus, group_metrics
from repexp.elliptical import projection_seed, sparse_projection
from repexp.features import (
    response_mask_right_padded,
    response_mean_masked,
    response_mean_packed,
    response_mean_right_padded,
)
from repexp.verl.overrides import build_overrides, hydra_value
from repexp.verl.settings import RepExpSettings, RunSettings
from repexp.verl.validation import dev_pass_at_k

# --------------------------------------------------------------------------- pooling


def _ragged(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.tensor([3, 1, 5, 2])
    response_lengths = torch.tensor([2, 4, 1, 0])
    seqs = [torch.randn(int(p + r), 6, generator=gen) for p, r in zip(prompt_lengths, response_lengths)]
    return seqs, prompt_lengths, response_lengths


def _reference_means(seqs, response_lengths):
    return torch.stack([
        s[len(s) - int(r):].mean(0) if r > 0 else torch.zeros(s.shape[1]) for s, r in zip(seqs, response_lengths)
    ])


def test_packed_pooling_is_the_mean_over_each_response():
    seqs, _, response_lengths = _ragged()
    offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    means = response_mean_packed(torch.cat(seqs), offsets, response_lengths)
    assert means.dtype == torch.float32
    torch.testing.assert_close(means, _reference_means(seqs, response_lengths))
    assert torch.equal(means[3], torch.zeros(6)), "an empty response pools to zeros, not NaN"


def test_right_padded_and_recipe_layouts_agree_with_packed():
    seqs, prompt_lengths, response_lengths = _ragged(1)
    width = max(len(s) for s in seqs) + 2
    right = torch.zeros(len(seqs), width, 6)
    for i, s in enumerate(seqs):
        right[i, : len(s)] = s
    seq_lengths = torch.tensor([len(s) for s in seqs])
    expected = _reference_means(seqs, response_lengths)
    torch.testing.assert_close(response_mean_right_padded(right, seq_lengths, response_lengths), expected)
    # the recipe's layout: prompt left-padded to P, response right-padded from column P
    p_width, r_width = int(prompt_lengths.max()), int(response_lengths.max())
    recipe = torch.zeros(len(seqs), p_width + r_width, 6)
    mask = torch.zeros(len(seqs), p_width + r_width, dtype=torch.bool)
    for i, (s, p, r) in enumerate(zip(seqs, prompt_lengths, response_lengths)):
        recipe[i, p_width - p: p_width + r] = s
        mask[i, p_width: p_width + r] = True
    torch.testing.assert_close(response_mean_masked(recipe, mask), expected)
    assert response_mask_right_padded(seq_lengths, response_lengths, width).sum() == response_lengths.sum()


def test_pooling_rejects_inconsistent_lengths():
    with pytest.raises(ValueError, match="response lengths"):
        response_mean_packed(torch.zeros(5, 2), torch.tensor([0, 2, 5]), torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="offsets end"):
        response_mean_packed(torch.zeros(6, 2), torch.tensor([0, 2, 5]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="padded width"):
        response_mean_right_padded(torch.zeros(2, 3, 2), torch.tensor([4, 1]), torch.tensor([1, 1]))


# --------------------------------------------------------------------------- bonus glue
def verl_step(hidden, uids, scores, excluded, settings, step, state, keys=None):
    """The shared step called as the verl trainer calls it (the node's settings carry β)."""
    return compute_step_bonus(hidden, uids, scores, settings, beta=settings.beta, step=step, state=state,
                              excluded=excluded, prompt_keys=keys)


def verl_state(settings):
    return BonusState(settings, sparse_dim=settings.sparse_dim, seed=settings.seed)



def _closed_form_leverage(x: np.ndarray, lamb: float) -> np.ndarray:
    x = x - x.mean(axis=0)
    a = lamb * np.eye(x.shape[1]) + x.T @ x
    return np.einsum("ij,jk,ik->i", x, np.linalg.inv(a), x)


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(10, 16, generator=gen)
    uids = ["a"] * 4 + ["b"] * 4 + ["pad", "pad"]
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    excluded = torch.tensor([False] * 8 + [True, True])
    return hidden, uids, scores, excluded


def test_step_bonus_matches_a_hand_computation():
    hidden, uids, scores, excluded = _batch()
    settings = RepExpSettings(beta=0.5, alpha=2.0, sparse_dim=3, lamb=1.0, seed=7)
    result = verl_step(hidden, uids, scores, excluded, settings, 5, verl_state(settings))

    projection = sparse_projection(16, 3, seed=projection_seed(7, 5))
    features = (hidden.float() @ projection).double().numpy()
    expected_raw = np.concatenate([_closed_form_leverage(features[:4], 1.0), _closed_form_leverage(features[4:8], 1.0)])
    np.testing.assert_allclose(result.bonus_raw[:8].numpy(), expected_raw, rtol=1e-9)
    # group b has no correct rollout: its bonus is turned off; padding rows never get one
    expected_scaled = np.concatenate([0.5 * expected_raw[:4], np.zeros(6)])
    np.testing.assert_allclose(result.bonus_scaled.numpy(), expected_scaled, rtol=1e-6)
    np.testing.assert_allclose(result.shaped.numpy(), 2.0 * scores.numpy() + expected_scaled, rtol=1e-6)
    assert result.bonus_raw[8:].abs().sum() == 0
    m = result.metrics
    assert m["repexp/groups/none_correct_frac"] == 0.5 and m["repexp/groups/some_correct_frac"] == 0.5
    assert m["repexp/groups/all_correct_frac"] == 0.0
    assert math.isclose(m["reward/verifier/mean"], 0.25)
    assert math.isclose(m["reward/shaped/mean"], float(result.shaped[:8].mean()))
    assert math.isclose(m["repexp/bonus_raw/mean"], float(expected_raw.mean()))
    assert math.isclose(m["repexp/bonus_scaled/max"], float(expected_scaled.max()), rel_tol=1e-6)
    assert m["repexp/bonus_turned_off_frac"] == 0.5


def test_turn_off_rules_and_leave_one_out():
    hidden, uids, scores, excluded = _batch(1)
    settings = RepExpSettings(beta=1.0, sparse_dim=4, lamb=0.5, reward_type="leave_one_out",
                              turn_off_if_none_correct=False, turn_off_if_rollout_incorrect=True)
    result = verl_step(hidden, uids, scores, excluded, settings, 0, verl_state(settings))
    features = (hidden.float() @ sparse_projection(16, 4, seed=projection_seed(0, 0))).double().numpy()
    h = _closed_form_leverage(features[:4], 0.5)
    np.testing.assert_allclose(result.bonus_raw[:4].numpy(), h / (1 - h), rtol=1e-8)
    # only correct rollouts keep their bonus
    assert torch.equal(result.bonus_scaled != 0, torch.tensor([True, False, True, False] + [False] * 6))


def test_projection_is_seeded_by_seed_and_step():
    settings = RepExpSettings(beta=0.01, sparse_dim=8, seed=3)
    state = verl_state(settings)
    assert torch.equal(state.projection(64, 10), sparse_projection(64, 8, seed=projection_seed(3, 10)))
    assert torch.equal(state.projection(64, 10), verl_state(settings).projection(64, 10))
    assert not torch.equal(state.projection(64, 10), state.projection(64, 11))
    other_seed = verl_state(RepExpSettings(beta=0.01, sparse_dim=8, seed=4))
    assert not torch.equal(state.projection(64, 10), other_seed.projection(64, 10))
    fixed = verl_state(RepExpSettings(beta=0.01, sparse_dim=8, seed=3, randomize_projection=False))
    assert torch.equal(fixed.projection(64, 1), fixed.projection(64, 99))
    assert torch.equal(fixed.projection(64, 1), sparse_projection(64, 8, seed=projection_seed(3, 0, randomize=False)))


def test_persistent_covariance_state_round_trip_continues_identically():
    settings = RepExpSettings(beta=0.01, sparse_dim=4, lamb=0.1, persist_covariance=True, randomize_projection=False)
    gen = torch.Generator().manual_seed(2)
    steps = [torch.randn(8, 12, generator=gen) for _ in range(3)]
    uids = ["u1"] * 4 + ["u2"] * 4
    keys = ["p1"] * 4 + ["p2"] * 4
    scores = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])
    none = torch.zeros(8, dtype=torch.bool)
    straight = verl_state(settings)
    first = [verl_step(h, uids, scores, none, settings, i, straight, keys) for i, h in enumerate(steps)]
    resumed = verl_state(settings)
    verl_step(steps[0], uids, scores, none, settings, 0, resumed, keys)
    verl_step(steps[1], uids, scores, none, settings, 1, resumed, keys)
    restored = verl_state(settings)
    restored.load_state_dict(resumed.state_dict())
    again = verl_step(steps[2], uids, scores, none, settings, 2, restored, keys)
    torch.testing.assert_close(again.bonus_raw, first[2].bonus_raw)
    assert not torch.allclose(first[2].bonus_raw, first[0].bonus_raw), "state must influence later steps"
    with pytest.raises(ValueError, match="prompt key"):
        verl_step(steps[0], uids, scores, none, settings, 0, verl_state(settings), None)


def test_group_metrics_for_the_grpo_baseline():
    metrics = group_metrics(["a", "a", "b", "b", "c", "c"], torch.tensor([1.0, 1, 0, 1, 0, 0]),
                            torch.tensor([False, False, False, False, True, True]))
    assert metrics == {"repexp/groups/none_correct_frac": 0.0, "repexp/groups/some_correct_frac": 0.5,
                       "repexp/groups/all_correct_frac": 0.5, "reward/verifier/mean": 0.75, "reward/shaped/mean": 0.75}


# --------------------------------------------------------------------------- dev pass@k


def test_dev_pass_at_k_is_unbiased_and_checks_scores():
    uids = ["a"] * 4 + ["b"] * 4
    scores = [1, 0, 0, 0, 1, 1, 0, 0]
    metrics = dev_pass_at_k(uids, scores)
    assert set(metrics) == {"dev/pass_at_1", "dev/pass_at_2", "dev/pass_at_4", "dev/num_problems",
                            "dev/samples_per_problem"}
    assert math.isclose(metrics["dev/pass_at_1"], (0.25 + 0.5) / 2)
    assert math.isclose(metrics["dev/pass_at_2"], ((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert metrics["dev/pass_at_4"] == 1.0 and metrics["dev/num_problems"] == 2.0
    with pytest.raises(ValueError, match="0/1"):
        dev_pass_at_k(uids, [1, -1, -1, -1, 1, 1, -1, -1])


# --------------------------------------------------------------------------- settings


def test_settings_reject_unknown_keys_and_bad_values():
    point = {"beta": 0.1, "sparse_dim": 4}  # the sweep point: required, every run sets it
    assert RepExpSettings.from_mapping({"beta": 0, "sparse_dim": None}).enabled is False
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.betta: unknown key"):
        RepExpSettings.from_mapping({**point, "betta": 0.1})
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.beta: missing"):
        RepExpSettings.from_mapping({"sparse_dim": 4})
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.sparse_dim: missing"):
        RepExpSettings.from_mapping({"beta": 0.1, "sparse_dim": "???"})  # the YAML's value when no override set it
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.sparse_dim: must be >= 1 when beta > 0"):
        RepExpSettings.from_mapping({"beta": 0.1, "sparse_dim": None})
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.lamb: unknown key"):  # it is bonus.lamb
        RepExpSettings.from_mapping({**point, "lamb": 0.1})
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.bonus\.reward_type"):
        RepExpSettings.from_mapping({**point, "bonus": {"reward_type": "levrage"}})
    with pytest.raises(ValueError, match=r"sparse_dim: expected an integer"):
        RepExpSettings.from_mapping({"beta": 0.1, "sparse_dim": 3.5})
    with pytest.raises(ValueError, match="randomize_projection=false"):
        RepExpSettings.from_mapping({**point, "bonus": {"persist_covariance": True}})
    with pytest.raises(ValueError, match=r"repexp_run\.max_checkpoints_to_keep"):
        RunSettings.from_mapping({"max_checkpoints_to_keep": 0})


# --------------------------------------------------------------------------- overrides


def _run_configs(tmp_path, **pipeline) -> dict:
    cfg = C.load({"results_dir": str(tmp_path), "model": "Qwen/Qwen2.5-7B-Instruct",
                  "sweep": {"tasks": ["gsm8k"], "backends": ["verl", "trl"], "sparse_dims": [32], "betas": [0.01],
                            "seeds": [41]}, **pipeline})
    return {(s.backend, s.method): C.compose(cfg, s) for s in C.sweep_runs(cfg) if s.trains}


def _as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in overrides)


def test_overrides_map_the_run_config(tmp_path):
    runs = _run_configs(tmp_path)
    repexp = _as_dict(build_overrides(runs[("verl", "repexp")]))
    grpo = _as_dict(build_overrides(runs[("verl", "grpo")]))
    run_dir = (tmp_path / "train" / "gsm8k" / "verl_repexp_k32_b0.01_s41").resolve()
    assert repexp["trainer.default_local_dir"] == f"{run_dir}/checkpoints"
    assert repexp["repexp_run.run_dir"] == str(run_dir)
    assert repexp["hydra.run.dir"] == f"{run_dir}/hydra"
    assert repexp["data.train_files"] == str((tmp_path / "data" / "gsm8k" / "train.parquet").resolve())
    assert repexp["actor_rollout_ref.repexp.beta"] == "0.01" and grpo["actor_rollout_ref.repexp.beta"] == "0.0"
    # GRPO has no sparse_dim, and the node no default for it
    key = "actor_rollout_ref.repexp.sparse_dim"
    assert (repexp[key], grpo[key]) == ("32", "null")
    for key in ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.repexp.seed",
                "actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.actor.fsdp_config.seed"):
        assert repexp[key] == "41", key
    assert repexp["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-7B-Instruct"  # a Hub id stays as it is
    assert repexp["trainer.logger"] == "[console]"
    assert not any(k.startswith("+") for k in repexp), "every key must already exist in verl's config"
    assert not [k for k in repexp if k.startswith(C.DEAD_VERL_KEY_PREFIXES)]
    with pytest.raises(ValueError, match="not a verl run"):
        build_overrides(runs[("trl", "repexp")])


def test_overrides_refuse_dead_raw_keys_and_follow_tracking(tmp_path):
    with pytest.raises(C.ConfigError, match="^verl.overrides: reward_model.enable is a legacy key"):
        _run_configs(tmp_path, verl={"overrides": ["+reward_model.enable=true"]})  # at parse time
    grpo = _run_configs(tmp_path)[("verl", "grpo")]
    grpo = dataclasses.replace(grpo, verl=dataclasses.replace(grpo.verl, overrides=["+reward_model.enable=true"]))
    with pytest.raises(ValueError, match="reward_model.enable is a legacy key"):
        build_overrides(grpo)  # and again where the overrides are built
    runs = _run_configs(tmp_path, tracking={"tracking_uri": "http://mlflow:5000"},
                        verl={"overrides": ["trainer.log_val_generations=2"]})
    overrides = build_overrides(runs[("verl", "repexp")])
    assert overrides[-1] == "trainer.log_val_generations=2"
    assert _as_dict(overrides)["trainer.logger"] == "[console,mlflow]"


def test_hydra_values_round_trip_through_hydras_parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for value in ["plain/path_1.0", "with space", "it's", "a=b,c", "null", "1e-06", "", "$HOME/x"]:
        parsed = parser.parse_override(f"k={hydra_value(value)}").value()
        assert parsed == value, value
    assert parser.parse_override(f"k={hydra_value(['console', 'mlflow'])}").value() == ["console", "mlflow"]
    assert parser.parse_override(f"k={hydra_value(None)}").value() is None
    assert parser.parse_override(f"k={hydra_value(1e-6)}").value() == 1e-6


# --------------------------------------------------------------------------- start-up phases


def test_startup_phases_fold_missing_marks_and_total_to_the_first_validation(tmp_path, monkeypatch):
    """Marks from several processes (a later one of the same name wins, as the slowest rank ends a phase);
    a mark no process wrote (GRPO builds no frozen model) folds its time into the next phase."""
    from repexp.verl import startup

    log = tmp_path / "startup.log"
    startup.write_mark(log, "process", 100.0)
    monkeypatch.setenv(startup.ENV, str(log))
    times = {"imported": 103.0, "task_runner": 110.0, "trainer": 112.0, "data": 115.0, "actor_begin": 130.0,
             "actor_fsdp": 140.0, "servers": 190.0, "agent_loop": 200.0, "validation_begin": 201.0,
             "validation_end": 211.0, "first_step": 215.0}
    for name, t in times.items():
        startup.write_mark(log, name, t)
    startup.write_mark(log, "actor_fsdp", 139.0)  # an earlier rank
    log.write_text(log.read_text() + "{\"mark\": \"servers\", \"t\": 1\n")  # a line cut short by a kill
    startup.mark("first_step")  # now: later than every mark above

    result = startup.summary(startup.read_marks(log))
    phases = {row["phase"]: row["seconds"] for row in result["phases"]}
    assert list(phases) == ["imported", "task_runner", "trainer", "data", "actor_begin", "actor_fsdp", "servers",
                            "agent_loop", "validation_begin", "validation_end", "first_step"]
    assert phases["actor_fsdp"] == 10.0 and phases["servers"] == 50.0  # actor_end absent: folded into servers
    assert result["startup_s"] == 101.0  # process start to the first validation
    assert sum(phases[name] for name in list(phases)[:9]) == result["startup_s"]
    assert result["to_first_step_s"] > 115.0
    with pytest.raises(ValueError, match="unknown start-up mark"):
        startup.write_mark(log, "warmup", 1.0)
    assert "validation_end" in startup.table(result["phases"])
