"""verl's batch layouts and the representation worker built outside Ray (no Ray, one process).

Shared by tests/test_verl_runtime.py (CPU) and benchmarks/verl_engine_check.py (G1 of
docs/gpu-validation.md, on a GPU or with ``--cpu``), so the test and the GPU check feed verl the
same batches through the same worker. tests/conftest.py puts tests/ on ``sys.path``; the check
does the same. Nothing in the pipeline imports this.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


def nested(rows) -> torch.Tensor:
    return torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)


def v1_batch(prompts, responses) -> TensorDict:
    """The V1 trainer's TransferQueue layout: every field jagged, one row per trajectory."""
    ids = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    return TensorDict({
        "input_ids": nested(ids),
        "position_ids": nested(torch.arange(len(x)) for x in ids),
        "responses": nested(responses),
        "loss_mask": nested(torch.ones(len(r), dtype=torch.long) for r in responses),
    }, batch_size=len(ids))


def v0_batch(prompts, responses, pad_id: int = 0) -> TensorDict:
    """The legacy trainer's layout: left-padded prompts + right-padded responses through verl's
    left_right_2_no_padding."""
    from verl.workers.utils.padding import left_right_2_no_padding

    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    rows = len(prompts)
    input_ids = torch.full((rows, p_width + r_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_ids = torch.full((rows, r_width), pad_id, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[i, p_width - len(p): p_width] = p
        input_ids[i, p_width: p_width + len(r)] = r
        attention_mask[i, p_width - len(p): p_width + len(r)] = 1
        response_ids[i, : len(r)] = r
    batch = TensorDict({
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": response_ids, "response_mask": attention_mask[:, p_width:].clone(),
    }, batch_size=rows)
    return left_right_2_no_padding(batch)


def hidden_means(worker, batch: TensorDict, **flags) -> torch.Tensor:
    """`compute_repexp_hidden_mean` on a TensorDict (verl's wrappers pass it through) -> dense (B, H)."""
    from verl.utils import tensordict_utils as tu

    tu.assign_non_tensor(batch, temperature=1.0, compute_loss=False, **flags)
    return worker.compute_repexp_hidden_mean(batch)["repexp_hidden_mean"].to_padded_tensor(0.0)


def build_worker(actor_rollout_ref):
    """The worker object verl's WorkerDict holds, with the representation engine init_model builds."""
    from repexp.verl.compat import patch_trl_value_head_import
    from repexp.verl.worker import REPEXP_MESH, RepExpActorRolloutRefWorker, build_repexp_worker_config

    from verl.single_controller.base.worker import Worker
    from verl.workers.engine_workers import TrainingWorker

    patch_trl_value_head_import()
    worker = RepExpActorRolloutRefWorker.__new__(RepExpActorRolloutRefWorker)
    Worker.__init__(worker)
    worker.repexp = TrainingWorker(config=build_repexp_worker_config(actor_rollout_ref))
    worker.repexp.reset()
    worker.set_dispatch_collect(mesh_name=REPEXP_MESH, **worker.repexp.get_dispatch_collect())
    return worker
