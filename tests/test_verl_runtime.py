"""The verl backend on verl 0.9.1 itself, on CPU: engine, worker, trainer, TransferQueue, checkpoints, merge.

Real verl code runs here: the representation engine inside verl's `TrainingWorker` (FSDP2 on a
one-rank gloo group, through tests/verl_platform_cpu.py), the worker method through verl's
``register``/``tqbridge`` wrappers, verl's own ``_compute_advantage`` and TransferQueue on a
private local Ray instance (one per module, 16 logical CPUs, one storage unit, no dashboard),
verl's FSDP checkpoint manager and ``verl.model_merger``. The stand-ins are the Ray dispatch
layer of the worker group (calls go to the worker object in this process), which is verl's.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import verl_platform_cpu as platform_cpu  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)
from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from verl_layouts import build_worker, hidden_means, nested, v0_batch, v1_batch  # noqa: E402

from repexp.elliptical import (
    projection_seed,  # noqa: E402
    sparse_projection,  # noqa: E402
)

TINY_OVERRIDES = [
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.repexp.dtype=fp32",
    "actor_rollout_ref.repexp.attn_implementation=sdpa",
    "actor_rollout_ref.repexp.use_remove_padding=true",
    "actor_rollout_ref.repexp.micro_batch_size_per_gpu=2",
    "actor_rollout_ref.repexp.sparse_dim=8",
    "actor_rollout_ref.repexp.bonus.lamb=1.0",
    "actor_rollout_ref.repexp.beta=0.5",
    "actor_rollout_ref.repexp.seed=11",
    "trainer.n_gpus_per_node=1",
]


def compose_config(model: str, run_dir: Path, *extra: str):
    with initialize_config_module(config_module="repexp.verl.config", version_base="1.3"):
        return compose(config_name="repexp_trainer", overrides=[
            f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={run_dir}/checkpoints",
            *TINY_OVERRIDES, *extra,
        ])


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """Tiny model, CPU platform, one-rank process group, and the representation worker built by verl."""
    from repexp.models import build_tiny_qwen2

    root = tmp_path_factory.mktemp("verl_runtime")
    model = str(build_tiny_qwen2(root / "tiny"))
    with contextlib.ExitStack() as stack:
        stack.enter_context(platform_cpu.cpu_platform())
        stack.enter_context(platform_cpu.single_process_group())
        cfg = compose_config(model, root / "run")
        # The worker object as verl's WorkerDict holds it, with the representation engine that
        # RepExpActorRolloutRefWorker.init_model builds (its actor and vLLM parts need a GPU).
        worker = build_worker(cfg.actor_rollout_ref)
        yield {"root": root, "model": model, "cfg": cfg, "worker": worker}


@pytest.fixture(scope="module")
def reference_backbone(runtime):
    from transformers import AutoModel

    return AutoModel.from_pretrained(runtime["model"], attn_implementation="sdpa").eval()


def _sequences(seed: int, prompt_lengths, response_lengths):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 4000, (int(n),), generator=gen) for n in prompt_lengths]
    responses = [torch.randint(3, 4000, (int(n),), generator=gen) for n in response_lengths]
    return prompts, responses


def _reference_means(backbone, prompts, responses) -> torch.Tensor:
    """Plain transformers: one unpadded forward per sequence, mean of the last hidden state over the response."""
    with torch.no_grad():
        return torch.stack([
            backbone(torch.cat([p, r])[None]).last_hidden_state[0, len(p):].mean(0) for p, r in zip(prompts, responses)
        ])


# --------------------------------------------------------------------------- engine and worker


def test_engine_is_registered_and_frozen(runtime):
    from repexp.verl.engine import RepExpHiddenMeanEngine

    from verl.workers.engine.base import EngineRegistry

    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry.get_engine_cls("repexp_hidden_mean", backend) is RepExpHiddenMeanEngine
    engine = runtime["worker"].repexp.engine
    assert isinstance(engine, RepExpHiddenMeanEngine)
    module = engine.module
    assert type(module).__name__.endswith("Qwen2Model"), "the backbone only: no LM head, no vocabulary logits"
    assert not any(name.startswith("lm_head") for name, _ in module.named_parameters())
    assert not any(p.requires_grad for p in module.parameters())
    assert engine.optimizer is None and engine.engine_config.forward_only


def test_pooling_equals_transformers_in_every_layout(runtime, reference_backbone):
    worker = runtime["worker"]
    prompts, responses = _sequences(0, [5, 3, 7, 4, 6, 2], [4, 6, 1, 3, 5, 2])
    expected = _reference_means(reference_backbone, prompts, responses)
    layouts = {
        "v1 packed (remove padding)": hidden_means(worker, v1_batch(prompts, responses), use_remove_padding=True),
        "v1 padded": hidden_means(worker, v1_batch(prompts, responses), use_remove_padding=False),
        "v0 packed": hidden_means(worker, v0_batch(prompts, responses), use_remove_padding=True),
        "v0 padded": hidden_means(worker, v0_batch(prompts, responses), use_remove_padding=False),
        # token-budget micro-batches in verl's workload order, restored to the input order
        "v1 packed, dynamic batch size": hidden_means(
            worker, v1_batch(prompts, responses), use_remove_padding=True, use_dynamic_bsz=True,
            max_token_len_per_gpu=16,
        ),
    }
    for name, means in layouts.items():
        assert means.shape == expected.shape, name
        torch.testing.assert_close(means, expected, atol=2e-5, rtol=2e-5, msg=name)


def test_worker_methods_are_registered_for_verls_worker_group():
    import ray

    from repexp.verl.worker import RepExpActorRolloutRefWorker

    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch
    from verl.single_controller.ray.base import RayClassWithInitArgs, create_colocated_worker_cls

    init = getattr(RepExpActorRolloutRefWorker.init_model, MAGIC_ATTR)
    assert init["dispatch_mode"] == Dispatch.ONE_TO_ALL
    compute = getattr(RepExpActorRolloutRefWorker.compute_repexp_hidden_mean, MAGIC_ATTR)
    assert compute["dispatch_mode"]["dispatch_fn"].args == ("repexp",)
    colocated = create_colocated_worker_cls(
        {"actor_rollout": RayClassWithInitArgs(cls=ray.remote(RepExpActorRolloutRefWorker), config=None,
                                               role="actor_rollout")}
    )
    methods = set(dir(colocated.cls.__ray_actor_class__))
    assert {"actor_rollout_init_model", "actor_rollout_compute_repexp_hidden_mean"} <= methods


def test_trainer_construction_roles_and_mode(runtime, tmp_path):
    from repexp.verl.trainer import RepExpTrainer
    from repexp.verl.worker import RepExpActorRolloutRefWorker

    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    assert get_trainer_cls("repexp") is RepExpTrainer
    cfg = compose_config(runtime["model"], tmp_path / "run")
    trainer = RepExpTrainer(cfg)
    assert cfg.trainer.v1.trainer_mode == "sync" and trainer.trainer_mode == "sync", "never verl's async branches"
    assert type(trainer.replay_buffer) is ReplayBuffer
    trainer._init_resource_pool_mgr()
    assert list(trainer.role_worker_mapping) == [Role.ActorRollout], "no reference model without a KL loss"
    assert trainer.role_worker_mapping[Role.ActorRollout].__ray_actor_class__ is RepExpActorRolloutRefWorker


def test_every_training_run_of_the_gpu_config_constructs_the_trainer(runtime, tmp_path, monkeypatch):
    """The overrides the DAG sends, not hand-written ones: RepExp and the GRPO baseline (beta 0, sparse_dim null)
    of configs/gpu.yaml each build a RepExpTrainer; only RepExp carries a bonus state. The trainer marks its
    start in the start-up log the entry point names (repexp.verl.startup)."""
    import yaml

    from repexp import config as C
    from repexp.verl import startup
    from repexp.verl.overrides import build_overrides
    from repexp.verl.trainer import RepExpTrainer

    marks = tmp_path / "startup.log"
    monkeypatch.setenv(startup.ENV, str(marks))

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "gpu.yaml").read_text())
    raw.update(model=runtime["model"], results_dir=str(tmp_path))
    cfg = C.load(raw)
    runs = [C.compose(cfg, spec) for spec in C.sweep_runs(cfg) if spec.trains]
    assert sorted(rc.method for rc in runs) == ["grpo", "repexp", "repexp"]
    for rc in runs:
        with initialize_config_module(config_module="repexp.verl.config", version_base="1.3"):
            composed = compose(config_name="repexp_trainer", overrides=build_overrides(rc))
        trainer = RepExpTrainer(composed)
        assert trainer.repexp.enabled == (rc.method == "repexp")
        assert (trainer.bonus_state is None) == (rc.method == "grpo"), rc.name
        assert composed.reward.num_workers == 1 and composed.actor_rollout_ref.rollout.agent.num_workers == 1
    assert [line.count('"trainer"') for line in marks.read_text().splitlines()] == [1, 1, 1]


# --------------------------------------------------------------------------- bonus injection through verl + TQ


@pytest.fixture(scope="module")
def transfer_queue_session(runtime):
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    saved = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = "local"  # never attach to another cluster on this machine
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    ray.init(num_cpus=16, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
    finally:
        tq.close()
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved


class InProcessWorkerGroup:
    """verl's RayWorkerGroup minus Ray: one rank, so its dispatch is the identity and calls go straight to the
    worker object (through verl's register/tqbridge wrappers, which read and write TransferQueue)."""

    def __init__(self, worker):
        self.worker = worker
        self.calls = 0

    def compute_repexp_hidden_mean(self, batch):
        self.calls += 1
        return self.worker.compute_repexp_hidden_mean(batch)


def _put_rollouts(tq, tag: str, uids, prompts, responses, scores):
    """Rows as verl's agent loop leaves them in TransferQueue (keys {uid}_{session}_{index})."""
    from verl.utils import tensordict_utils as tu

    keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)]
    rm_scores = []
    for response, score in zip(responses, scores):
        row = torch.zeros(len(response))
        row[-1] = score
        rm_scores.append(row)
    batch = v1_batch(prompts, responses)
    fields = tu.get_tensordict({
        **{name: batch[name] for name in batch.keys()},
        "prompts": nested(prompts),
        "response_mask": nested(torch.ones(len(r), dtype=torch.long) for r in responses),
        "rm_scores": nested(rm_scores),
        "uid": np.array(uids, dtype=object),
    })
    tags = [{"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3, "status": "finish",
             "prompt_len": len(p), "response_len": len(r), "seq_len": len(p) + len(r)}
            for p, r in zip(prompts, responses)]
    return tq.kv_batch_put(keys=[f"{tag}{k}" for k in keys], partition_id="train", fields=fields, tags=tags)


def _rollout_data(seed: int, tag: str):
    uids = [f"{tag}u0"] * 4 + [f"{tag}u1"] * 4
    prompt_a, prompt_b = _sequences(seed, [5, 6], [1, 1])[0]
    prompts = [prompt_a] * 4 + [prompt_b] * 4
    responses = _sequences(seed + 1, [1] * 8, [4, 2, 6, 3, 5, 2, 4, 3])[1]
    scores = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # group u1: nobody correct -> bonus off
    return uids, prompts, responses, scores


def _hand_grpo(rewards: np.ndarray, groups: list[str]) -> np.ndarray:
    out = np.zeros_like(rewards)
    for group in set(groups):
        idx = [i for i, g in enumerate(groups) if g == group]
        values = torch.tensor(rewards[idx])
        out[idx] = ((values - values.mean()) / (values.std() + 1e-6)).numpy()  # verl: unbiased std, eps 1e-6
    return out


def _leverage(features: np.ndarray, lamb: float) -> np.ndarray:
    x = features - features.mean(axis=0)
    return np.einsum("ij,jk,ik->i", x, np.linalg.inv(lamb * np.eye(x.shape[1]) + x.T @ x), x)


def _trainer(cfg, worker_group, step: int):
    from repexp.verl.trainer import RepExpTrainer

    trainer = RepExpTrainer(cfg)
    trainer.actor_rollout_wg = worker_group
    trainer.timing_raw = {}
    trainer.global_steps = step
    return trainer


def test_bonus_enters_verls_advantage_and_padding_rows_get_none(runtime, reference_backbone, transfer_queue_session):
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    tq = transfer_queue_session
    uids, prompts, responses, scores = _rollout_data(0, "r")
    batch = _put_rollouts(tq, "r", uids, prompts, responses, scores)
    batch = upsample_batch_to_divisible_size(batch, 12, eos_token_id=2)  # verl's own padding rows
    assert len(batch) == 12 and sum(t.get("is_padding", False) for t in batch.tags) == 4

    cfg = compose_config(runtime["model"], runtime["root"] / "run_adv")
    group = InProcessWorkerGroup(runtime["worker"])
    trainer = _trainer(cfg, group, step=3)
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)
    assert group.calls == 1

    # by hand: plain transformers features, the seeded projection, closed-form leverage, turn-off, GRPO
    hidden = _reference_means(reference_backbone, prompts, responses)
    features = (hidden.float() @ sparse_projection(hidden.shape[1], 8, seed=projection_seed(11, 3))).double().numpy()
    bonus = np.concatenate([_leverage(features[:4], 1.0), np.zeros(4)])
    shaped = np.array(scores) + 0.5 * bonus
    expected = _hand_grpo(shaped, uids)

    data = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                           select_fields=["advantages", "rm_scores", "token_level_rewards"])
    advantages = data["advantages"].to_padded_tensor(float("nan"))
    for i in range(8):
        row = advantages[i, : len(responses[i])]
        np.testing.assert_allclose(row.numpy(), np.full(len(responses[i]), expected[i]), atol=2e-4)
    assert torch.all(advantages[8:].nan_to_num(0.0) == 0), "padding rows: no advantage"
    np.testing.assert_allclose(data["token_level_rewards"].to_padded_tensor(0.0).sum(1)[:8].numpy(), shaped, atol=1e-5)
    assert torch.all(data["token_level_rewards"].to_padded_tensor(0.0)[8:] == 0), "padding rows: no bonus"
    # rm_scores is the verifier score again, so verl's critic/score stays comparable with GRPO
    np.testing.assert_allclose(data["rm_scores"].to_padded_tensor(0.0).sum(1)[:8].numpy(), scores)

    for name in ("repexp/bonus_raw/mean", "repexp/bonus_scaled/max", "repexp/groups/none_correct_frac",
                 "repexp/groups/some_correct_frac", "repexp/groups/all_correct_frac",
                 "reward/verifier/mean", "reward/shaped/mean"):
        assert name in metrics, name
    assert metrics["repexp/groups/none_correct_frac"] == 0.5
    np.testing.assert_allclose(metrics["reward/shaped/mean"], shaped.mean(), atol=1e-5)
    # 8 different responses; verl's 4 padding rows (one pad uid, response [eos] each) would add a group at 1/4
    assert metrics["rollout/distinct_frac"] == 1.0
    assert set(trainer.timing_raw) == {"repexp_forward", "repexp_bonus"}
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_beta_zero_leaves_verls_advantage_unchanged(runtime, transfer_queue_session):
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    tq = transfer_queue_session
    # what the DAG's GRPO run sends (repexp/verl/overrides.py): beta 0 and no sparse_dim
    cfg = compose_config(runtime["model"], runtime["root"] / "run_grpo", "actor_rollout_ref.repexp.beta=0",
                         "actor_rollout_ref.repexp.sparse_dim=null")
    uids, prompts, responses, scores = _rollout_data(5, "g")
    responses[1] = responses[2] = responses[0].clone()  # group g u0: 2 distinct responses of 4
    responses[5] = responses[4][:2].clone()  # group g u1: a prefix is another response (4 of 4)
    ours = _put_rollouts(tq, "ours_", uids, prompts, responses, scores)
    plain = _put_rollouts(tq, "plain_", uids, prompts, responses, scores)

    no_workers = object()  # beta = 0 must not touch the workers at all
    metrics = {}
    _trainer(cfg, no_workers, step=3)._compute_advantage(ours, metrics)
    stub = PPOTrainerSync.__new__(PPOTrainerSync)
    stub.config = cfg
    PPOTrainerSync._compute_advantage(stub, plain, {})

    fields = ["advantages", "returns", "rm_scores"]
    got = tq.kv_batch_get(keys=ours.keys, partition_id="train", select_fields=fields)
    want = tq.kv_batch_get(keys=plain.keys, partition_id="train", select_fields=fields)
    for name in fields:
        assert torch.equal(got[name].to_padded_tensor(0.0), want[name].to_padded_tensor(0.0)), name
    assert metrics["reward/verifier/mean"] == metrics["reward/shaped/mean"] == 0.25
    assert metrics["rollout/distinct_frac"] == (2 / 4 + 4 / 4) / 2
    assert not any(key.startswith("repexp/bonus") for key in metrics)
    tq.kv_clear(keys=ours.keys + plain.keys, partition_id="train")
    # no group of this batch is all correct: the identical-share statistic is left out, never 0
    assert "rollout/all_correct_identical_frac" not in metrics


def test_all_correct_identical_fraction_is_logged_by_the_verl_advantage_step(runtime, transfer_queue_session):
    tq = transfer_queue_session
    cfg = compose_config(runtime["model"], runtime["root"] / "run_identical", "actor_rollout_ref.repexp.beta=0",
                         "actor_rollout_ref.repexp.sparse_dim=null")
    uids, prompts, responses, _ = _rollout_data(7, "i")
    responses[1] = responses[2] = responses[3] = responses[0].clone()  # group i u0: one response four times
    scores = [1.0] * 8  # both groups all correct; u1's four responses differ
    batch = _put_rollouts(tq, "identical_", uids, prompts, responses, scores)
    metrics = {}
    _trainer(cfg, object(), step=2)._compute_advantage(batch, metrics)
    assert metrics["repexp/groups/all_correct_frac"] == 1.0
    assert metrics["rollout/all_correct_identical_frac"] == 0.5  # u0 of {u0, u1}
    tq.kv_clear(keys=batch.keys, partition_id="train")


# --------------------------------------------------------------------------- checkpoints, resume, merge


class ActorWorkerGroup:
    """What verl's worker group forwards to ActorRolloutRefWorker.save/load_checkpoint: its actor TrainingWorker."""

    def __init__(self, actor):
        self.actor = actor

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.actor.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        self.actor.load_checkpoint(local_path, hdfs_path, del_local_after_load)


def _actor_worker(cfg):
    """The actor's TrainingWorker as ActorRolloutRefWorker.init_model configures it."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig

    with open_dict(cfg):
        cfg.actor_rollout_ref.actor.optim.total_training_steps = 10
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    # the engine settings ActorRolloutRefWorker.init_model assigns (micro-batching of log-prob and update calls)
    rollout = cfg.actor_rollout_ref.rollout
    actor.engine.use_dynamic_bsz = actor.use_dynamic_bsz
    actor.engine.infer_max_token_len_per_gpu = rollout.log_prob_max_token_len_per_gpu
    actor.engine.infer_micro_batch_size_per_gpu = rollout.log_prob_micro_batch_size_per_gpu
    actor.engine.max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
    actor.engine.micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
    actor.engine.use_remove_padding = model.use_remove_padding
    saved = os.environ.get("VERL_ENGINE_DEVICE")
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # verl registers its FSDP LM engine for accelerators only
    try:
        worker = TrainingWorker(config=TrainingWorkerConfig(
            model_type="language_model", model_config=model, engine_config=actor.engine,
            optimizer_config=actor.optim, checkpoint_config=actor.checkpoint,
        ))
    finally:
        if saved is None:
            os.environ.pop("VERL_ENGINE_DEVICE")
        else:
            os.environ["VERL_ENGINE_DEVICE"] = saved
    worker.reset()
    return worker


def _full_state(module) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in module.state_dict().items()}


def _perturb(module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(0.01 * torch.randn(local.shape, generator=gen))


def _validate(trainer, pass_rate: float) -> dict:
    """verl's _validate hands the per-sample uids and scores to _val_metrics_update."""
    n = 4
    scores = [1.0] * int(round(pass_rate * n)) + [0.0] * (n - int(round(pass_rate * n)))
    uids = ["p1"] * n + ["p2"] * n
    return trainer._val_metrics_update(["openai/gsm8k"] * 2 * n, uids, {"reward": scores * 2}, [1] * 2 * n)


def test_checkpoints_resume_and_merge(runtime, tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import AutoModelForCausalLM

    from repexp.bonus_step import compute_step_bonus
    from repexp.checkpoints import checkpoint_dir, is_complete, select
    from repexp.cli import main as repexp_cli
    from repexp.verl.merge import merge_checkpoint

    run_dir = tmp_path / "run"
    cfg = compose_config(
        runtime["model"], run_dir, "actor_rollout_ref.repexp.bonus.persist_covariance=true",
        "actor_rollout_ref.repexp.bonus.randomize_projection=false", "repexp_run.max_checkpoints_to_keep=1",
    )
    actor = _actor_worker(cfg)
    module = actor.engine.module

    def dataloader():
        return StatefulDataLoader(list(range(40)), batch_size=4, shuffle=True,
                                  generator=torch.Generator().manual_seed(0))

    gen = torch.Generator().manual_seed(3)
    hidden = [torch.randn(8, 128, generator=gen) for _ in range(4)]
    uids, keys = ["a"] * 4 + ["b"] * 4, ["p1"] * 4 + ["p2"] * 4
    scores, none = torch.tensor([1.0, 0, 1, 0, 1, 1, 1, 0]), torch.zeros(8, dtype=torch.bool)

    def step_bonus(trainer, features, step):  # the shared step with the trainer's settings and state
        return compute_step_bonus(features, uids, scores, trainer.repexp, beta=trainer.repexp.beta, step=step,
                                  state=trainer.bonus_state, excluded=none, prompt_keys=keys)

    first = _trainer(cfg, ActorWorkerGroup(actor), step=0)
    first.train_dataloader = dataloader()
    batches = iter(first.train_dataloader)
    states = {}
    for step, pass_rate in ((2, 0.75), (4, 0.5), (6, 0.25)):
        first.global_steps = step
        next(batches)
        step_bonus(first, hidden[step // 2 - 1], step)
        _perturb(module, step)  # "training"
        states[step] = _full_state(module)
        first._save_checkpoint()
        assert is_complete(checkpoint_dir(run_dir, step))
        assert (checkpoint_dir(run_dir, step) / "repexp_state.pt").exists()
        dev = _validate(first, pass_rate)
        assert dev["dev/pass_at_1"] == pytest.approx(pass_rate) and dev["dev/best_step"] == 2
        first.metrics_logger.log({"step_metric": float(step), **dev}, step)
    first.metrics_logger.log({"step_metric": 8.0}, 8)  # logged after the last checkpoint: forgotten on resume

    # the newest checkpoint and the best-dev one survive pruning; the best one without its resume state
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == ["global_step_2", "global_step_6"]
    from repexp.checkpoints import SLIM_MARKER, read_budget, resumable_steps

    assert not list(checkpoint_dir(run_dir, 2).glob("actor/optim_world_size_*"))
    assert not (checkpoint_dir(run_dir, 2) / "data.pt").exists() and (checkpoint_dir(run_dir, 2) / SLIM_MARKER).exists()
    assert list(checkpoint_dir(run_dir, 6).glob("actor/optim_world_size_*")) and resumable_steps(run_dir) == [6]
    assert read_budget(checkpoint_dir(run_dir, 6))["train_seconds"] > 0
    best = json.loads((run_dir / "best_dev.json").read_text())
    assert best["best_step"] == 2 and best["best_checkpoint"] == str(checkpoint_dir(run_dir, 2))
    expected_batch = next(batches)
    expected_bonus = step_bonus(first, hidden[3], 7)

    # a fresh process resumes from global_step_6: weights, data order, covariance
    _perturb(module, 99)
    resumed = _trainer(cfg, ActorWorkerGroup(actor), step=0)
    resumed.train_dataloader = dataloader()
    resumed._load_checkpoint()
    assert resumed.global_steps == 6
    assert resumed.training_time.used_before_s == read_budget(checkpoint_dir(run_dir, 6))["train_seconds"]
    for name, value in _full_state(module).items():
        torch.testing.assert_close(value, states[6][name], msg=name)
    assert torch.equal(next(iter(resumed.train_dataloader)), expected_batch)
    again = step_bonus(resumed, hidden[3], 7)
    torch.testing.assert_close(again.bonus_raw, expected_bonus.bonus_raw)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [2, 4, 6] and logged[0]["dev/pass_at_1"] == pytest.approx(0.75)

    # select -> merge the best checkpoint -> identical logits with plain transformers
    pointer = tmp_path / "select.json"
    pointer.write_text(json.dumps(select(run_dir, "verl")))
    out = tmp_path / "merged.json"
    assert repexp_cli(["merge", "--pointer", str(pointer), "--out", str(out)]) == 0
    merged_pointer = json.loads(out.read_text())
    assert merged_pointer["checkpoint_step"] == 2
    assert merged_pointer["model_path"] == str(checkpoint_dir(run_dir, 2) / "actor" / "hf")
    merged = AutoModelForCausalLM.from_pretrained(merged_pointer["model_path"]).eval()
    # verl's merger writes bfloat16 weights: the reference is step 2's weights in bfloat16
    reference = AutoModelForCausalLM.from_pretrained(runtime["model"], dtype=torch.bfloat16).eval()
    reference.load_state_dict(states[2])
    assert merged.dtype == torch.bfloat16
    for name, value in merged.state_dict().items():
        assert torch.equal(value, states[2][name].bfloat16()), name
    ids = torch.randint(3, 4000, (2, 12), generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, reference(ids).logits, rtol=0, atol=0)
    assert merge_checkpoint(checkpoint_dir(run_dir, 2)) == Path(merged_pointer["model_path"]), "idempotent"

    from repexp.checkpoints import complete_steps, mark_complete
    from repexp.verl.settings import RunSettings
    from repexp.verl.train import finish, finished_or_reset, write_done

    done = write_done(run_dir, 12.5)
    assert json.loads((run_dir / "DONE").read_text()) == done
    assert (done["final_step"], done["best_step"]) == (6, 2) and done["best_value"] == pytest.approx(0.75)
    (checkpoint_dir(run_dir, 6) / "COMPLETE").unlink()
    with pytest.raises(ValueError, match="not marked complete"):
        merge_checkpoint(checkpoint_dir(run_dir, 6))
    mark_complete(checkpoint_dir(run_dir, 6))

    # the final step (6) saved and validated: a retry that lost only DONE writes it without starting verl;
    # a run of more steps resumes (nothing is touched)
    assert finished_or_reset(run_dir, 6, validates=True)
    assert not finished_or_reset(run_dir, 8, validates=True) and complete_steps(run_dir) == [2, 6]
    finish(RunSettings(max_checkpoints_to_keep=1, prune_when_done=False), run_dir, time.time())
    assert complete_steps(run_dir) == [2, 6]  # off: the newest checkpoint stays whole
    # train.prune_when_done: after DONE only the best-dev checkpoint stays, slimmed; merge still reads it
    finish(RunSettings(max_checkpoints_to_keep=1, prune_when_done=True), run_dir, time.time())
    assert complete_steps(run_dir) == [2] and resumable_steps(run_dir) == []
    assert merge_checkpoint(checkpoint_dir(run_dir, 2)) == Path(merged_pointer["model_path"])
    # the state a kill while the final checkpoint was removed leaves (only a slimmed one): the retry starts
    # over, with no checkpoint of the earlier attempt left to resume or select
    assert not finished_or_reset(run_dir, 6, validates=True)
    assert not (run_dir / "checkpoints").exists()


def test_walltime_chunk_ends_fit_at_a_saved_step_without_done(runtime, tmp_path):
    """`repexp_run.chunk_deadline` in RepExpTrainer (repexp.walltime): with the deadline past, the
    step just trained (step 3, off the save/test schedule of every 2 steps) is saved complete, made
    the last one of this process and recorded in CHUNK_END; it is not validated (the schedule says
    no), and `write_done` is left to the next attempt, which resumes from step 3 with the training
    time counted on. Validation sampling needs vLLM (a GPU), so `_validate` is not reached here."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from repexp.checkpoints import checkpoint_dir, is_complete, read_budget
    from repexp.walltime import read_chunk_end

    run_dir = tmp_path / "run"
    cfg = compose_config(runtime["model"], run_dir, f"repexp_run.chunk_deadline={time.time() - 1}",
                         "trainer.save_freq=2", "trainer.test_freq=2")
    trainer = _trainer(cfg, ActorWorkerGroup(_actor_worker(cfg)), step=3)
    trainer.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=4)
    trainer.total_training_steps = 10
    trainer.clock.start()
    trainer._end_chunk_if_out_of_time()
    assert trainer.total_training_steps == 3, "fit's loop ends after step 3"
    assert is_complete(checkpoint_dir(run_dir, 3)) and read_budget(checkpoint_dir(run_dir, 3))["train_seconds"] > 0
    assert read_chunk_end(run_dir)["step"] == 3
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()

    # no deadline: a step never ends the chunk
    later = compose_config(runtime["model"], run_dir, "trainer.save_freq=2", "trainer.test_freq=2")
    resumed = _trainer(later, ActorWorkerGroup(_actor_worker(later)), step=0)
    resumed.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=4)
    resumed._load_checkpoint()
    assert resumed.global_steps == 3
    assert resumed.training_time.used_before_s == read_budget(checkpoint_dir(run_dir, 3))["train_seconds"]
    resumed.total_training_steps = 10
    resumed.global_steps = 4
    resumed.clock.start()
    resumed._end_chunk_if_out_of_time()
    assert resumed.total_training_steps == 10 and not is_complete(checkpoint_dir(run_dir, 4))


# --------------------------------------------------------------------------- the methods beside RepExp, one step each


def _method_config(runtime, run_dir: Path, method: str, params: str, *extra: str):
    """The tiny config of a run of `method` (no RepExp bonus: beta 0, no sparse_dim), with its verl settings as
    repexp.verl.overrides.method_settings gives them (checked by check_config, as the entry point does)."""
    from repexp.verl.overrides import BASE_METHOD_SETTINGS, hydra_value, method_settings
    from repexp.verl.settings import RepExpSettings
    from repexp.verl.train import check_config

    node = f"actor_rollout_ref.repexp.method={method}", f"actor_rollout_ref.repexp.params={params}"
    base = compose_config(runtime["model"], run_dir, "actor_rollout_ref.repexp.beta=0",
                          "actor_rollout_ref.repexp.sparse_dim=null", *node)
    settings = RepExpSettings.from_mapping(dict(base.actor_rollout_ref.repexp), n_rollouts=4)
    verl = {**BASE_METHOD_SETTINGS, **method_settings(method, settings.params)}
    cfg = compose_config(runtime["model"], run_dir, "actor_rollout_ref.repexp.beta=0",
                         "actor_rollout_ref.repexp.sparse_dim=null", *node,
                         *(f"{key}={hydra_value(value)}" for key, value in verl.items()), *extra)
    assert check_config(cfg).method == method
    return cfg


def test_passk_advantages_verl_used_equal_the_core(runtime, transfer_queue_session):
    """pass@k: verl's own _compute_advantage runs the registered `repexp_passk` estimator; the advantage of every
    token is `passk_advantages` of its group's 0/1 scores (k from the repexp node); verl's padding rows get 0."""
    from repexp.methods.passk import passk_advantages

    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    tq = transfer_queue_session
    cfg = _method_config(runtime, runtime["root"] / "run_passk", "passk", "{passk_k:2}")
    assert cfg.algorithm.adv_estimator == "repexp_passk"
    uids, prompts, responses, _ = _rollout_data(7, "k")
    scores = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # c = 2 and c = 1 of n = 4
    batch = upsample_batch_to_divisible_size(_put_rollouts(tq, "k", uids, prompts, responses, scores), 12,
                                             eos_token_id=2)
    trainer = _trainer(cfg, object(), step=1)  # no worker call: the advantage is the driver's
    assert get_adv_estimator_fn("repexp_passk").__module__ == "repexp.verl.methods", "registered by the trainer"
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)

    expected = passk_advantages(torch.tensor(scores), uids, 2)
    assert expected[0] > 0 > expected[1] and expected[5] > 0, "the hand check: pass@2 advantages, not GRPO's"
    advantages = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                 select_fields=["advantages"])["advantages"].to_padded_tensor(float("nan"))
    for i in range(8):
        row = advantages[i, : len(responses[i])].double()
        torch.testing.assert_close(row, torch.full_like(row, float(expected[i])), atol=1e-6, rtol=1e-6)
    assert torch.all(advantages[8:].nan_to_num(0.0) == 0), "padding rows: no advantage"
    assert metrics["reward/verifier/mean"] == metrics["reward/shaped/mean"] == 0.375
    tq.kv_clear(keys=batch.keys, partition_id="train")


OUTCOME_TEXTS = ["so #### 4", "it is #### 5", "#### 4", "no idea", "#### 7", "#### 7", "#### 7", "#### 8"]


def _put_answers(tq, tokenizer, tag: str, step: int):
    """Rollouts whose responses are real text with final answers, and the dataset columns outcome reads."""
    uids = [f"{tag}{step}u0"] * 4 + [f"{tag}{step}u1"] * 4
    prompts = _sequences(step, [5] * 8, [1] * 8)[0]
    responses = [torch.tensor(tokenizer.encode(text, add_special_tokens=False)) for text in OUTCOME_TEXTS]
    scores = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    batch = _put_rollouts(tq, f"{tag}{step}_", uids, prompts, responses, scores)
    extra = {"data_source": np.array(["openai/gsm8k"] * 8, dtype=object),
             "extra_info": np.array([{"problem_id": "q0", "index": 0}] * 4 + [{"problem_id": "q1", "index": 1}] * 4,
                                    dtype=object)}
    from verl.utils import tensordict_utils as tu

    tq.kv_batch_put(keys=list(batch.keys), partition_id="train", fields=tu.get_tensordict(extra))
    return batch, uids, responses, scores


@pytest.fixture(scope="module")
def actor_group(runtime):
    """The actor's TrainingWorker (FSDP2 on CPU), shared by the checkpoint and policy-loss steps below."""
    cfg = compose_config(runtime["model"], runtime["root"] / "run_actor")
    return _actor_worker(cfg)


def test_outcome_bonus_enters_the_advantage_and_its_counts_resume(runtime, transfer_queue_session, actor_group,
                                                                  tmp_path):
    """Outcome exploration (historical, UCB-Con): answers of the decoded responses, `outcome_bonus` added to
    every response token's advantage after verl's GRPO normalisation of the verifier score (the reward stays
    the verifier's); the answer counts saved in each checkpoint and restored on resume, so the resumed run's
    next bonus is the uninterrupted run's."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import AutoTokenizer

    from repexp import layout
    from repexp.checkpoints import checkpoint_dir, is_complete
    from repexp.methods.outcome import AnswerCounts, final_answer, outcome_bonus

    tq = transfer_queue_session
    tokenizer = AutoTokenizer.from_pretrained(runtime["model"])
    run_dir = tmp_path / "run"
    cfg = _method_config(runtime, run_dir, "outcome", "{outcome_mode:historical,outcome_c:0.5}")
    params = _trainer(cfg, object(), step=0).repexp.params

    def fresh(step):
        trainer = _trainer(cfg, ActorWorkerGroup(actor_group), step=step)
        trainer.tokenizer = tokenizer
        trainer.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=4)
        return trainer

    answers = [final_answer("openai/gsm8k", text, "repexp") for text in OUTCOME_TEXTS]
    assert answers[:4] == ["4", "5", "4", None] and answers[4:] == ["7", "7", "7", "8"]
    counts = AnswerCounts()
    trainer = fresh(1)
    for step in (1, 2):
        trainer.global_steps = step
        batch, uids, responses, scores = _put_answers(tq, tokenizer, "o", step)
        metrics = {}
        batch = trainer._compute_advantage(batch, metrics)
        expected, _ = outcome_bonus(params, groups=uids, question_keys=["q0"] * 4 + ["q1"] * 4, answers=answers,
                                    scores=torch.tensor(scores), state=counts)
        data = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                               select_fields=["rm_scores", "advantages"])
        np.testing.assert_allclose(data["rm_scores"].to_padded_tensor(0.0).sum(1).numpy(), scores)
        wanted = _hand_grpo(np.array(scores), uids) + expected.numpy()  # GRPO's advantage, then c * bonus
        advantages = data["advantages"].to_padded_tensor(0.0)
        for i, response in enumerate(responses):  # the term on every response token
            np.testing.assert_allclose(advantages[i, : len(response)].numpy(), wanted[i], atol=2e-4)
        shaped = advantages[:, 0].double()
        assert metrics["outcome/bonus/mean"] == pytest.approx(float(expected.mean()))
        assert metrics["outcome/questions_seen"] == 2.0 and "timing_s/outcome_bonus" not in metrics
        assert "outcome_bonus" in trainer.timing_raw
        if step == 1:
            assert float(expected[0]) == pytest.approx(0.25), "a new answer: 0.5 * (1 - b0)"
            trainer._save_checkpoint()
            saved = checkpoint_dir(run_dir, 1) / layout.VERL_OUTCOME_STATE
            assert is_complete(checkpoint_dir(run_dir, 1)) and saved.exists()
            assert json.loads(saved.read_text()) == counts.state_dict()
        else:
            uninterrupted = shaped
        tq.kv_clear(keys=batch.keys, partition_id="train")

    resumed = fresh(0)
    resumed._load_checkpoint()
    assert resumed.global_steps == 1 and resumed.outcome.counts.state_dict() != AnswerCounts().state_dict()
    batch = _put_answers(tq, tokenizer, "r", 2)[0]
    batch = resumed._compute_advantage(batch, {})
    again = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])
    torch.testing.assert_close(again["advantages"].to_padded_tensor(0.0)[:, 0].double(), uninterrupted)
    tq.kv_clear(keys=batch.keys, partition_id="train")


class ActorUpdateGroup:
    """verl's RayWorkerGroup minus Ray for the actor's log-prob and update calls: they go to a real
    ActorRolloutRefWorker holding the actor TrainingWorker with verl's ppo_loss (as init_model sets it),
    through verl's register/tqbridge wrappers (reading and writing TransferQueue)."""

    def __init__(self, cfg, actor):
        from functools import partial

        from repexp.verl.worker import RepExpActorRolloutRefWorker

        from verl.single_controller.base.worker import Worker
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.utils.losses import ppo_loss

        self.actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        worker = RepExpActorRolloutRefWorker.__new__(RepExpActorRolloutRefWorker)
        Worker.__init__(worker)
        worker.enable_routing_replay = False
        worker.actor = actor
        actor.set_loss_fn(partial(ppo_loss, config=self.actor_config))
        worker.set_dispatch_collect(mesh_name="actor", **actor.get_dispatch_collect())
        self.worker = worker

    def compute_log_prob(self, batch):
        return self.worker.compute_log_prob(batch)

    def update_actor(self, batch):
        return self.worker.update_actor(batch)


def test_clip_cov_step_runs_verls_policy_loss(runtime, transfer_queue_session, actor_group):
    """KL-Cov / Clip-Cov: verl's config carries the loss mode and its settings, and one actor update (verl's
    _compute_old_log_prob, _compute_advantage and _update_actor, FSDP2 on CPU) runs with it: on-policy, PPO's
    vanilla loss clips nothing, while Clip-Cov detaches cov_ratio of the tokens (a window holding every token)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    tq = transfer_queue_session
    cfg = _method_config(runtime, runtime["root"] / "run_cov", "cov",
                         "{loss_mode:clip_cov,cov_ratio:0.25,cov_clip_lb:-1000.0,cov_clip_ub:1000.0}",
                         # no vLLM here: the rows carry no rollout log-probs to compare with
                         "actor_rollout_ref.rollout.calculate_log_probs=false")
    group = ActorUpdateGroup(cfg, actor_group)
    loss = group.actor_config.policy_loss
    assert (loss.loss_mode, loss.clip_cov_ratio, loss.clip_cov_lb, loss.clip_cov_ub) == ("clip_cov", 0.25, -1000, 1000)
    assert get_policy_loss_fn(loss.loss_mode).__name__ == "compute_policy_loss_clip_cov"

    metrics, responses = _one_actor_update(tq, cfg, group, actor_group, 11, "c")
    tokens = sum(len(r) for r in responses)
    # each micro-batch of 2 rows detaches max(int(0.25 * its tokens), 1) of its tokens; vanilla would give 0
    assert metrics["actor/pg_clipfrac"] > 0.1, metrics
    assert metrics["actor/pg_clipfrac"] <= 0.5 and tokens == 29
    assert "actor/pg_clipfrac_lower" not in metrics, "PPO's vanilla loss reports it; Clip-Cov's does not"


def _one_actor_update(tq, cfg, group, actor_group, seed: int, tag: str):
    """One training step's actor side with the run's policy loss: verl's _compute_old_log_prob,
    _compute_advantage and _update_actor on 8 rollouts; asserts the weights changed. Returns the step's
    metrics and the responses."""
    uids, prompts, responses, _ = _rollout_data(seed, tag)
    batch = _put_rollouts(tq, tag, uids, prompts, responses, [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    trainer = _trainer(cfg, group, step=1)
    before = _full_state(actor_group.engine.module)
    metrics = {}
    batch = trainer._compute_old_log_prob(batch, metrics)
    batch = trainer._compute_advantage(batch, metrics)
    trainer._update_actor(batch, metrics)
    after = _full_state(actor_group.engine.module)
    assert any(not torch.equal(before[name], after[name]) for name in before), "the step updated the actor"
    tq.kv_clear(keys=batch.keys, partition_id="train")
    return metrics, responses


def test_kl_cov_step_runs_verls_policy_loss(runtime, transfer_queue_session, actor_group):
    """KL-Cov: verl's config carries the loss mode, its ratio and KL coefficient, and one actor update runs with
    verl's KL-Cov loss: it reports |log π − log π_old| (`actor/ppo_kl`) and, unlike PPO's vanilla loss, no clip
    fraction (KL-Cov does not clip). On-policy the penalty itself is 0 on the first mini-batch (log π = log π_old),
    so the loss equals −A·ratio there: the step shows the mode ran, not the penalty's size (tests/test_methods.py
    checks the loss against verl's function)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    tq = transfer_queue_session
    cfg = _method_config(runtime, runtime["root"] / "run_kl_cov", "cov", "{loss_mode:kl_cov,cov_ratio:0.25}",
                         "actor_rollout_ref.rollout.calculate_log_probs=false")
    group = ActorUpdateGroup(cfg, actor_group)
    loss = group.actor_config.policy_loss
    assert (loss.loss_mode, loss.kl_cov_ratio, loss.ppo_kl_coef) == ("kl_cov", 0.25, 1.0)
    assert get_policy_loss_fn(loss.loss_mode).__name__ == "compute_policy_loss_kl_cov"

    metrics, _ = _one_actor_update(tq, cfg, group, actor_group, 12, "k")
    assert "actor/ppo_kl" in metrics and "actor/pg_clipfrac" not in metrics, metrics
