"""The composed Hydra config of every task x setting is accepted by verl 0.9.1's own validation.

Each run of a paper-like pipeline config goes RunConfig -> build_overrides -> Hydra composition on
verl's ppo_trainer (through repexp/verl/config) -> verl's validate_config and dataclass
conversion of the sections verl converts, and the effective values are checked, so an override
that verl silently ignores (or that lands on a dead key) fails here.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repexp import config as C
from repexp.verl.attention import Attention, flash_attn_error, resolve
from repexp.verl.overrides import build_overrides

pytest.importorskip("verl")

from hydra import compose, initialize_config_module  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402

from repexp.verl.settings import RepExpSettings  # noqa: E402
from repexp.verl.train import check_config  # noqa: E402

from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

TASKS = ["math", "gsm8k", "aime24", "dapo-with-aime24"]


def paper_like_pipeline(model: str, results_dir: str) -> dict:
    """The paper's settings (upstream_recipe.md §4), on 8 GPUs, for every task."""
    return {
        "name": "paper",
        "results_dir": results_dir,
        "model": model,
        "data": {"dapo_source": "dapo.jsonl"},
        "sweep": {"tasks": TASKS, "backends": ["verl"], "sparse_dims": [32], "betas": [0.01], "seeds": [41, 42]},
        "train": {"n_rollouts": 8, "lr": 1e-6, "train_batch_size": 1024, "ppo_mini_batch_size": 256,
                  "micro_batch_size_per_gpu": 16, "max_prompt_length": 1024, "max_response_length": 1024,
                  "test_freq": 20, "save_freq": 20, "val_n": 128},
        "verl": {"n_gpus_per_node": 8, "rollout_tensor_parallel_size": 2, "gpu_memory_utilization": 0.6,
                 "max_num_batched_tokens": 8192, "log_prob_micro_batch_size_per_gpu": 16,
                 "repexp_micro_batch_size_per_gpu": 32},
        "task_overrides": {
            "dapo-with-aime24": {
                "sweep": {"sparse_dims": [128]},
                "train": {"train_batch_size": 512, "ppo_mini_batch_size": 128, "micro_batch_size_per_gpu": 8,
                          "max_prompt_length": 2048, "max_response_length": 8192, "test_freq": 10, "save_freq": 10},
                "verl": {"gpu_memory_utilization": 0.5, "max_num_batched_tokens": 10240,
                         "repexp_micro_batch_size_per_gpu": 16},
            },
        },
    }


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from repexp.models import build_tiny_qwen2

    return str(build_tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def run_configs(tiny_model, tmp_path_factory) -> list[C.RunConfig]:
    cfg = C.load(paper_like_pipeline(tiny_model, str(tmp_path_factory.mktemp("results"))))
    runs = [C.compose(cfg, spec) for spec in C.sweep_runs(cfg) if spec.trains and spec.seed == 42]
    assert {(r.task, r.method) for r in runs} == {(t, m) for t in TASKS for m in ("repexp", "grpo")}
    return runs


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="repexp.verl.config", version_base="1.3"):
        return compose(config_name="repexp_trainer", overrides=overrides)


def test_every_task_and_setting_passes_verls_validation(run_configs):
    from repexp.verl.worker import build_repexp_worker_config

    for rc in run_configs:
        overrides = build_overrides(rc)
        assert not [o for o in overrides if o.lstrip("+~").startswith(C.DEAD_VERL_KEY_PREFIXES)]
        cfg = _compose(overrides)
        settings = check_config(cfg)  # verl's validate_config plus the RepExp checks
        assert need_reference_policy(cfg) is False and need_critic(cfg) is False, "GRPO without KL: actor only"

        # verl's own dataclasses see our values (nothing silently ignored)
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
        algorithm = omega_conf_to_dataclass(cfg.algorithm)
        # verl never converts `reward` as a whole (RewardManagerConfig.__post_init__ fails in 0.9.1); the
        # reward loop reads the DictConfig
        train, verl = rc.train, rc.verl
        assert actor.optim.lr == train.lr and actor.ppo_mini_batch_size == train.ppo_mini_batch_size
        assert actor.ppo_micro_batch_size_per_gpu == train.micro_batch_size_per_gpu
        assert actor.clip_ratio_low == actor.clip_ratio_high == train.clip_ratio
        assert actor.use_kl_loss is False and actor.data_loader_seed == rc.seed
        assert actor.engine.seed == rc.seed and actor.strategy == verl.strategy
        assert rollout.n == train.n_rollouts and rollout.seed == rc.seed
        assert rollout.val_kwargs.n == train.val_n and rollout.val_kwargs.do_sample is True
        assert rollout.temperature == train.temperature == rollout.val_kwargs.temperature
        assert rollout.tensor_model_parallel_size == verl.rollout_tensor_parallel_size
        assert rollout.gpu_memory_utilization == verl.gpu_memory_utilization
        assert rollout.max_num_batched_tokens == verl.max_num_batched_tokens
        assert rollout.response_length == train.max_response_length
        here = resolve(verl.attn_implementation, verl.use_remove_padding, flash_attn_error())  # this node's
        assert model.path == rc.model and model.use_remove_padding == here.packing
        assert model.override_config["attn_implementation"] == here.implementation
        assert algorithm.adv_estimator == "grpo" and algorithm.use_kl_in_reward is False
        assert cfg.reward.custom_reward_function.path == "pkg://repexp.verl.reward"
        assert cfg.reward.custom_reward_function.name == "compute_score"
        assert cfg.data.seed == rc.seed and cfg.data.train_batch_size == train.train_batch_size
        assert cfg.data.max_prompt_length == train.max_prompt_length
        assert cfg.data.train_files == str(Path(rc.data_dir).resolve() / "train.parquet")
        assert cfg.trainer.default_local_dir == str(Path(rc.run_dir).resolve() / "checkpoints")
        assert (cfg.trainer.test_freq, cfg.trainer.save_freq) == (train.test_freq, train.save_freq)
        assert cfg.trainer.resume_mode == "auto" and cfg.trainer.v1.trainer_mode == "repexp"

        assert settings.beta == rc.beta and settings.enabled == (rc.method == "repexp")
        if rc.method == "repexp":
            assert settings.sparse_dim == rc.sparse_dim and settings.seed == rc.seed
            assert settings.bonus == rc.bonus
            worker = build_repexp_worker_config(cfg.actor_rollout_ref)
            assert worker.model_type == "repexp_hidden_mean"
            assert worker.engine_config.forward_only is True and worker.optimizer_config is None
            assert worker.engine_config.infer_micro_batch_size_per_gpu == verl.repexp_micro_batch_size_per_gpu
            assert worker.model_config.path == rc.model, "default representation model: the initial policy"
            assert worker.model_config.enable_gradient_checkpointing is False


def test_misspelled_keys_fail(run_configs):
    overrides = build_overrides(run_configs[0])
    with pytest.raises(ConfigCompositionException):
        _compose(overrides + ["actor_rollout_ref.repexp.betta=0.1"])
    with pytest.raises(ConfigCompositionException):
        _compose(overrides + ["trainer.save_frequency=5"])
    cfg = _compose(overrides + ["+actor_rollout_ref.repexp.betta=0.1"])  # "+" adds it; we still refuse it
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.betta: unknown key"):
        check_config(cfg)


def test_repexp_specific_checks(run_configs):
    overrides = build_overrides(next(rc for rc in run_configs if rc.method == "repexp"))
    with pytest.raises(ValueError, match="save_freq"):
        check_config(_compose(overrides + ["trainer.save_freq=7"]))
    with pytest.raises(ValueError, match="micro_batch_size_per_gpu"):
        check_config(_compose(overrides + ["actor_rollout_ref.repexp.micro_batch_size_per_gpu=48"]))
    check_config(_compose(overrides + ["actor_rollout_ref.repexp.micro_batch_size_per_gpu=48",
                                       "actor_rollout_ref.repexp.use_dynamic_bsz=true"]))
    with pytest.raises(ValueError, match="default_local_dir"):
        check_config(_compose(overrides + ["trainer.default_local_dir=/elsewhere/ckpt"]))
    with pytest.raises(ValueError, match="adv_estimator"):
        check_config(_compose(overrides + ["algorithm.adv_estimator=gae"]))
    settings = RepExpSettings.from_mapping({"beta": 0.1, "sparse_dim": 4,
                                            "bonus": {"persist_covariance": True, "randomize_projection": False}})
    assert settings.persist_covariance


# Two bonus sections that, between them, set every BonusConfig field to a value other than its default
# (persist_covariance needs reward_type leverage, so leave_one_out is the second one's).
CHANGED_BONUSES = [
    C.BonusConfig(lamb=0.25, normalization="z_score", center=False, randomize_projection=False, persist_covariance=True,
                  alpha=0.5, turn_off_if_none_correct=False, turn_off_if_some_correct=True,
                  turn_off_if_all_correct=True, turn_off_if_rollout_incorrect=True,
                  representation_model="org/frozen-model"),
    C.BonusConfig(reward_type="leave_one_out", normalization="rnd"),
]


def test_the_bonus_reaches_verl_as_one_node_and_comes_back_the_same(run_configs):
    """The run's `BonusConfig` is one override of one node, ``actor_rollout_ref.repexp.bonus``, and verl's side
    reads back the same dataclass, every field; no bonus key is anywhere else in the node."""
    default = C.BonusConfig()
    assert {f.name for bonus in CHANGED_BONUSES for f in dataclasses.fields(bonus)
            if getattr(bonus, f.name) != getattr(default, f.name)} == {f.name for f in dataclasses.fields(default)}
    from repexp.verl.worker import repexp_settings

    rc = next(rc for rc in run_configs if rc.method == "repexp")
    for bonus in CHANGED_BONUSES:
        overrides = build_overrides(dataclasses.replace(rc, bonus=bonus))
        assert len([o for o in overrides if o.startswith("actor_rollout_ref.repexp.bonus")]) == 1
        cfg = _compose(overrides)
        assert set(cfg.actor_rollout_ref.repexp) == {"bonus"} | {
            f.name for f in dataclasses.fields(RepExpSettings) if f.name not in {g.name for g in
                                                                                 dataclasses.fields(default)}}
        for settings in (check_config(cfg), repexp_settings(cfg.actor_rollout_ref)):  # the trainer's, the worker's
            assert settings.bonus == bonus
            assert (settings.beta, settings.sparse_dim, settings.seed) == (rc.beta, rc.sparse_dim, rc.seed)


def test_a_misspelled_bonus_key_fails_naming_it(run_configs):
    overrides = build_overrides(next(rc for rc in run_configs if rc.method == "repexp"))
    for typo in ("actor_rollout_ref.repexp.bonus.lamd=0.1", "actor_rollout_ref.repexp.bonus={lamd:0.1}",
                 "actor_rollout_ref.repexp.lamb=0.1"):  # the node's schema is BonusConfig: Hydra refuses them
        with pytest.raises(ConfigCompositionException, match=re.escape(typo.split("=")[0])):
            _compose(overrides + [typo])
    with pytest.raises(ConfigCompositionException, match=r"actor_rollout_ref\.repexp\.bonus\.lamb"):
        _compose(overrides + ["actor_rollout_ref.repexp.bonus.lamb=abc"])
    cfg = _compose(overrides + ["+actor_rollout_ref.repexp.bonus.lamd=0.1"])  # "+" adds it; the conversion refuses
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.repexp\.bonus\.lamd: unknown key"):
        check_config(cfg)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.bonus\.reward_type: 'levrage'"):
        check_config(_compose(overrides + ["actor_rollout_ref.repexp.bonus.reward_type=levrage"]))


def test_the_entry_point_composes_the_same_config(run_configs, tmp_path):
    """``python -m repexp.verl.train --cfg job`` (Hydra prints the job config instead of running it)."""
    rc = next(rc for rc in run_configs if rc.task == "dapo-with-aime24" and rc.method == "repexp")
    result = subprocess.run(
        [sys.executable, "-m", "repexp.verl.train", "--cfg", "job", "--resolve", *build_overrides(rc)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    import yaml

    printed = yaml.safe_load(result.stdout)
    assert printed["actor_rollout_ref"]["repexp"]["sparse_dim"] == 128
    assert printed["data"]["max_response_length"] == 8192
    assert printed["actor_rollout_ref"]["rollout"]["response_length"] == 8192
    assert printed["trainer"]["v1"]["trainer_mode"] == "repexp"


def test_verls_reward_loader_finds_the_project_verifier(run_configs):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    rc = next(rc for rc in run_configs if rc.task == "gsm8k")
    score = get_custom_reward_fn(_compose(build_overrides(rc)))
    kwargs = {"data_source": "openai/gsm8k", "ground_truth": "42", "extra_info": {"index": 0}}
    assert score(solution_str="6 * 7 = 42.\n#### 42", **kwargs) == 1.0
    assert score(solution_str="#### 41", **kwargs) == 0.0


def test_the_verl_entry_logs_into_the_node_run_or_drops_its_mlflow_logger(run_configs, tmp_path, monkeypatch):
    """`repexp run train` publishes the node's run id while verl starts (repexp.tracking.open_in_background)."""
    import json

    from repexp import tracking
    from repexp.verl.train import use_node_run

    rc = next(r for r in run_configs if r.method == "repexp")
    run_file = tmp_path / "mlflow_run.json"
    monkeypatch.setenv(tracking.ENV_RUN_FILE, str(run_file))
    # use_node_run writes os.environ itself: recorded here, both variables are put back after the test (else
    # MLFLOW_TRACKING_URI=sqlite:///x.db leaks into later tests, which then create x.db in the working directory)
    for name in ("MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)

    run_file.write_text(json.dumps({"run_id": "abc123", "tracking_uri": "sqlite:///x.db", "experiment": "e",
                                    "offline_reason": None}))
    cfg = _compose(build_overrides(rc, loggers=["console", "mlflow"]))
    use_node_run(cfg)
    assert os.environ["MLFLOW_RUN_ID"] == "abc123" and os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///x.db"
    assert list(cfg.trainer.logger) == ["console", "mlflow"]

    monkeypatch.delenv("MLFLOW_RUN_ID")
    run_file.write_text(json.dumps({"run_id": None, "tracking_uri": "http://127.0.0.1:9", "experiment": "e",
                                    "offline_reason": "connection refused"}))
    cfg = _compose(build_overrides(rc, loggers=["console", "mlflow"]))
    use_node_run(cfg)
    assert list(cfg.trainer.logger) == ["console"] and "MLFLOW_RUN_ID" not in os.environ
    check_config(cfg)  # still a valid verl config


def test_the_gpu_config_composes_into_configs_verl_validates(tiny_model, tmp_path):
    """configs/gpu.yaml (one GPU, eager rollouts, attention `auto`): every training run passes verl's checks;
    here, as on the offline GPU stack, flash-attn is missing, so `auto` gives SDPA without packing."""
    assert flash_attn_error() is not None
    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "gpu.yaml").read_text())
    raw.update(model=tiny_model, results_dir=str(tmp_path))
    cfg = C.load(raw)
    runs = [C.compose(cfg, spec) for spec in C.sweep_runs(cfg) if spec.trains]
    assert sorted(rc.method for rc in runs) == ["grpo", "repexp", "repexp"]
    for rc in runs:
        composed = _compose(build_overrides(rc, loggers=["console", "mlflow"]))
        settings = check_config(composed)
        assert settings.enabled == (rc.method == "repexp") and settings.attn_implementation == "sdpa"
        assert composed.trainer.n_gpus_per_node == 1 and composed.actor_rollout_ref.rollout.enforce_eager is True
        assert composed.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
        assert composed.actor_rollout_ref.model.use_remove_padding is False
        assert list(composed.trainer.logger) == ["console", "mlflow"]


# --------------------------------------------------------------------------- attention (docs/verl_backend.md)


@pytest.mark.parametrize("requested, packing, flash_error, expected", [
    ("auto", None, None, ("flash_attention_2", True)),
    ("auto", None, "ModuleNotFoundError: No module named 'flash_attn'", ("sdpa", False)),
    ("auto", False, None, ("flash_attention_2", False)),
    ("sdpa", None, None, ("sdpa", False)),
    ("eager", None, "missing", ("eager", False)),
    ("flash_attention_2", None, None, ("flash_attention_2", True)),
])
def test_auto_attention_follows_what_imports_on_the_node(requested, packing, flash_error, expected):
    attention = resolve(requested, packing, flash_error)
    assert (attention.implementation, attention.packing) == expected
    assert attention.implementation in attention.describe()


def test_flash_attention_asked_for_where_it_does_not_import_fails_naming_the_key():
    with pytest.raises(ValueError, match=r"^verl.attn_implementation: flash_attention_2 was asked for.*no flash"):
        resolve("flash_attention_2", None, "no flash")


@pytest.mark.parametrize("attention", [Attention("flash_attention_2", True, "test"), Attention("sdpa", False, "test")])
def test_the_resolved_attention_reaches_the_actor_and_the_frozen_model(run_configs, attention):
    rc = next(r for r in run_configs if r.method == "repexp")
    cfg = _compose(build_overrides(rc, attention))
    settings = check_config(cfg)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    assert model.override_config["attn_implementation"] == settings.attn_implementation == attention.implementation
    assert model.use_remove_padding is settings.use_remove_padding is attention.packing


def test_train_stops_before_anything_when_flash_attention_is_asked_for_but_missing(tiny_model, tmp_path):
    import yaml

    raw = paper_like_pipeline(tiny_model, str(tmp_path / "results"))
    raw["verl"]["attn_implementation"] = "flash_attention_2"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    repexp = str(Path(sys.executable).parent / "repexp")
    proc = subprocess.run([repexp, "run", "train", "--config", str(cfg), "--task", "gsm8k", "--run", "verl_grpo_s42"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "verl.attn_implementation: flash_attention_2 was asked for" in proc.stderr
    assert not (tmp_path / "results" / "train").exists()


def test_the_attention_choice_is_logged_once_and_becomes_mlflow_params(run_configs, capsys):
    from repexp import train

    rc = next(r for r in run_configs if r.method == "repexp")
    attention = train.node_attention(rc)
    assert attention == resolve(rc.verl.attn_implementation, rc.verl.use_remove_padding, flash_attn_error())
    assert capsys.readouterr().err.strip() == f"train: attention {attention.describe()}"
    params = train.train_params(rc, attention)
    assert params["verl.attn_implementation"] == "auto"  # what the config says ...
    assert (params["verl.attention.resolved"], params["verl.attention.packing"]) == ("sdpa", False)  # ... and got


# --------------------------------------------------------------------------- the methods beside RepExp


@pytest.fixture(scope="module")
def method_runs(tiny_model, tmp_path_factory) -> dict[str, C.RunConfig]:
    """One verl run per point of pass@k, outcome exploration (both modes) and KL-Cov / Clip-Cov, as the DAG
    composes them (a sweep.methods grid), keyed by run name."""
    raw = paper_like_pipeline(tiny_model, str(tmp_path_factory.mktemp("results")))
    raw.pop("task_overrides")
    raw["sweep"] = {"tasks": ["gsm8k"], "backends": ["verl"], "seeds": [42], "methods": {
        "passk": {"passk_k": [4]}, "outcome": {"outcome_mode": ["historical", "batch"], "outcome_c": [0.5]},
        "cov": {"loss_mode": ["kl_cov", "clip_cov"], "cov_ratio": [0.002]}}}
    cfg = C.load(raw)
    return {spec.name: C.compose(cfg, spec) for spec in C.sweep_runs(cfg) if spec.trains}


def test_each_method_reaches_verl_as_its_own_settings(method_runs):
    """method -> verl keys and values, through verl's own validation and dataclasses: pass@k's estimator,
    outcome exploration's plain GRPO, KL-Cov's and Clip-Cov's policy loss; every one without RepExp's bonus."""
    from repexp.verl.overrides import PASSK_ESTIMATOR

    assert sorted(method_runs) == ["verl_clip_cov_r0.002_s42", "verl_kl_cov_r0.002_s42", "verl_outcome_batch_c0.5_s42",
                                   "verl_outcome_historical_c0.5_s42", "verl_passk_k4_s42"]
    for name, rc in method_runs.items():
        cfg = _compose(build_overrides(rc))
        settings = check_config(cfg)
        assert settings.method == rc.method and settings.params == rc.settings, name
        assert settings.enabled is False and settings.beta == 0.0 and settings.sparse_dim is None, name
        assert dict(cfg.actor_rollout_ref.repexp.params) == rc.params, name
        algorithm = omega_conf_to_dataclass(cfg.algorithm)  # verl's AlgoConfig takes the composed section
        loss = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
        assert need_reference_policy(cfg) is False and need_critic(cfg) is False, name
        assert algorithm.adv_estimator == (PASSK_ESTIMATOR if rc.method == "passk" else "grpo"), name
        p = rc.settings
        if rc.method == "cov":
            assert loss.loss_mode == p.loss_mode, name
            if p.loss_mode == "kl_cov":
                assert (loss.kl_cov_ratio, loss.ppo_kl_coef) == (p.cov_ratio, p.cov_kl_coef)
            else:
                assert (loss.clip_cov_ratio, loss.clip_cov_lb, loss.clip_cov_ub) == (
                    p.cov_ratio, p.cov_clip_lb, p.cov_clip_ub)
        else:
            assert loss.loss_mode == "vanilla", name


def _with_params(overrides: list[str], params: str) -> list[str]:
    """The run's overrides with its ``actor_rollout_ref.repexp.params`` mapping replaced (a hand-written one)."""
    key = "actor_rollout_ref.repexp.params="
    return [f"{key}{params}" if o.startswith(key) else o for o in overrides]


def test_a_bad_method_param_fails_naming_its_key(method_runs):
    passk = build_overrides(method_runs["verl_passk_k4_s42"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.params\.passk_k: 16 exceeds train\.n_rollouts 8"):
        check_config(_compose(_with_params(passk, "{passk_k:16}")))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.params\.passk_kk: unknown parameter of passk"):
        check_config(_compose(_with_params(passk, "{passk_kk:2}")))
    cov = build_overrides(method_runs["verl_kl_cov_r0.002_s42"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.params\.loss_mode"):
        check_config(_compose(_with_params(cov, "{loss_mode:kl_covv}")))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.params\.cov_ratio"):
        check_config(_compose(_with_params(cov, "{cov_ratio:0.0}")))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.method: 'pass_k' is not a training method"):
        check_config(_compose(passk + ["actor_rollout_ref.repexp.method=pass_k"]))
    # the method's verl settings must be what it runs with (a hand-written override contradicting them)
    with pytest.raises(ValueError, match=r"^algorithm\.adv_estimator: method passk runs with 'repexp_passk'"):
        check_config(_compose(passk + ["algorithm.adv_estimator=grpo_passk"]))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.policy_loss\.kl_cov_ratio: method cov"):
        check_config(_compose(cov + ["actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.5"]))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.repexp\.beta: must be 0 for method passk"):
        check_config(_compose(passk + ["actor_rollout_ref.repexp.beta=0.1", "actor_rollout_ref.repexp.sparse_dim=4"]))


# --------------------------------------------------------------------------- step cost (docs/performance.md)


def test_a_token_budget_reaches_every_micro_batched_forward(tiny_model, tmp_path):
    """verl.dynamic_batch_tokens turns on verl's token-budget micro-batches for the actor's update, its old
    log-probs and the frozen model's forward; each lands where verl's own dataclasses read it."""
    from repexp.verl.settings import RunSettings
    from repexp.verl.worker import build_repexp_worker_config

    raw = paper_like_pipeline(tiny_model, str(tmp_path))
    raw["sweep"]["tasks"] = ["gsm8k"]
    raw["verl"].update(dynamic_batch_tokens=4096, replay_poll_seconds=0.05)
    cfg = C.load(raw)
    rc = next(C.compose(cfg, s) for s in C.sweep_runs(cfg) if s.trains and s.method == "repexp")
    composed = _compose(build_overrides(rc))
    check_config(composed)
    actor = omega_conf_to_dataclass(composed.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(composed.actor_rollout_ref.rollout)
    assert actor.use_dynamic_bsz is True and actor.ppo_max_token_len_per_gpu == 4096
    assert rollout.log_prob_use_dynamic_bsz is True and rollout.log_prob_max_token_len_per_gpu == 4096
    engine = build_repexp_worker_config(composed.actor_rollout_ref).engine_config
    assert engine.use_dynamic_bsz is True and engine.infer_max_token_len_per_gpu == 4096
    assert RunSettings.of(composed).replay_poll_seconds == 0.05

    raw["verl"]["dynamic_batch_tokens"] = 1000  # < max_prompt_length + max_response_length = 2048
    with pytest.raises(C.ConfigError, match=r"verl\.dynamic_batch_tokens: 1000 tokens cannot hold one sequence"):
        C.load(raw)


def test_the_poll_interval_is_the_one_verls_replay_buffer_sleeps():
    """RepExpTrainer sets `poll_interval` on the buffer verl built; verl's sync sampler must wait that long
    between its checks for finished rollouts (a rename in verl would silently bring back its 2 s)."""
    import time

    from repexp.verl.trainer import RepExpTrainer

    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    assert "_build_replay_buffer" in vars(RepExpTrainer)
    assert any("_build_replay_buffer" in vars(base) for base in RepExpTrainer.__mro__[1:])
    buffer = ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                          max_off_policy_strategy="drop", sampler_kwargs={})
    assert buffer.poll_interval == 2.0  # verl's default
    buffer.poll_interval = 0.01
    started = time.perf_counter()
    buffer._wait_for_next_poll("train", time.time())
    assert time.perf_counter() - started < 0.5
