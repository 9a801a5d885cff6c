"""`RepExpActorRolloutRefWorker`: verl's hybrid actor worker plus a frozen representation engine.

Besides verl's inner `TrainingWorker`s for actor and reference, a third one (model type
``repexp_hidden_mean``, forward only, parameters offloaded to CPU, no optimizer) on the actor's GPUs and
process; only when ``actor_rollout_ref.repexp.beta`` > 0. ``compute_repexp_hidden_mean`` is dispatched like
verl's ``compute_ref_log_prob``: verl's ``tqbridge`` fetches this rank's rows of the driver's `KVBatchMeta`
and writes the returned ``repexp_hidden_mean`` (jagged ``(B, j=H)``) back under the same keys.
"""

from __future__ import annotations

from omegaconf import DictConfig
from tensordict import TensorDict

from repexp.verl import engine as _engine  # registers the engine in every worker process
from repexp.verl import startup
from repexp.verl.compat import patch_trl_value_head_import
from repexp.verl.settings import repexp_settings

from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.trainer.config import CheckpointConfig
from verl.utils.memory_utils import aggressive_empty_cache
from verl.workers.config import FSDPEngineConfig, HFModelConfig, TrainingWorkerConfig
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

REPEXP_MESH = "repexp"
# what the representation forward reads from TransferQueue (limits tqbridge's fetch)
WORKER_FIELDS = ("input_ids", "position_ids", "responses", "loss_mask")


def build_repexp_worker_config(actor_rollout_ref: DictConfig) -> TrainingWorkerConfig:
    """The `TrainingWorkerConfig` of the frozen representation model (default: the initial policy)."""
    settings = repexp_settings(actor_rollout_ref)
    model = actor_rollout_ref.model
    model_config = HFModelConfig(
        path=settings.representation_model or model.path, use_shm=bool(model.get("use_shm", False)),
        trust_remote_code=bool(model.get("trust_remote_code", False)), use_remove_padding=settings.use_remove_padding,
        enable_gradient_checkpointing=False, override_config={"attn_implementation": settings.attn_implementation},
    )
    batch, tokens = settings.micro_batch_size_per_gpu, settings.max_token_len_per_gpu
    engine_config = FSDPEngineConfig(
        strategy=settings.strategy, forward_only=True, model_dtype=settings.dtype,
        mixed_precision={"param_dtype": settings.dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        use_dynamic_bsz=settings.use_dynamic_bsz, micro_batch_size_per_gpu=batch, infer_micro_batch_size_per_gpu=batch,
        max_token_len_per_gpu=tokens, infer_max_token_len_per_gpu=tokens, use_torch_compile=False,
        use_remove_padding=settings.use_remove_padding, ulysses_sequence_parallel_size=1, seed=settings.seed,
    )
    return TrainingWorkerConfig(model_type=_engine.REPEXP_MODEL_TYPE, model_config=model_config, optimizer_config=None,
                                engine_config=engine_config, checkpoint_config=CheckpointConfig())


class RepExpActorRolloutRefWorker(ActorRolloutRefWorker):
    # An override of a registered method must be registered again, or the worker group loses it.
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        startup.mark("actor_begin")
        patch_trl_value_head_import()
        super().init_model()
        startup.mark("actor_fsdp")
        self.repexp: TrainingWorker | None = None
        if "actor" in self.role and repexp_settings(self.config).enabled:
            self.repexp = TrainingWorker(config=build_repexp_worker_config(self.config))
            self.repexp.reset()
            self.set_dispatch_collect(mesh_name=REPEXP_MESH, **self.repexp.get_dispatch_collect())
            aggressive_empty_cache(force_sync=True)
        startup.mark("actor_end")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name=REPEXP_MESH))
    def compute_repexp_hidden_mean(self, data: TensorDict) -> TensorDict:
        if self.repexp is None:
            raise RuntimeError("compute_repexp_hidden_mean called but the representation model was not built "
                               "(beta = 0)")
        output = self.repexp.infer_batch(data=data)
        return output.cpu() if output is not None else None
