"""`RepExpHiddenMeanEngine`: verl's FSDP engine, frozen and forward-only, returning response-mean hidden states.

Registered in verl's `EngineRegistry` as model type ``repexp_hidden_mean`` (FSDP1 and FSDP2), so a plain
`TrainingWorker` builds it. All but two methods are verl's `FSDPEngineWithLMHead` (packing, micro and dynamic
batching, CPU offload, mixed precision):

- `_build_module` loads the *backbone* (`AutoModel`) of the causal-LM checkpoint: no LM head, no logits.
  Its ``last_hidden_state`` is the output of the final norm, the recipe's feature.
- `prepare_model_outputs` pools it over each response (`repexp.features`) into ``{"repexp_hidden_mean": (B, H)}``.

``input_ids`` is always jagged (prompt + response). Response lengths come from jagged ``responses`` (V1
trainer) or, in the legacy layout of `left_right_2_no_padding`, from the dense ``attention_mask``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from repexp.features import response_mean_packed, response_mean_right_padded

from verl.utils import tensordict_utils as tu
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

REPEXP_MODEL_TYPE = "repexp_hidden_mean"
OUTPUT_KEY = "repexp_hidden_mean"


def response_lengths_of(micro_batch: TensorDict) -> torch.Tensor:
    """Number of response tokens of every row, in both layouts verl passes to engines."""
    responses = micro_batch["responses"]
    if responses.is_nested:
        return responses.offsets().diff()
    attention_mask = micro_batch["attention_mask"]
    if attention_mask.is_nested:
        raise ValueError("dense responses need the dense attention_mask of the legacy layout")
    return attention_mask[:, -responses.shape[1]:].sum(dim=-1)


# "cpu" beside the accelerators: the test platform of tests/verl_platform_cpu.py
@EngineRegistry.register(model_type=REPEXP_MODEL_TYPE, backend=["fsdp", "fsdp2"], device=["cuda", "npu", "cpu"])
class RepExpHiddenMeanEngine(FSDPEngineWithLMHead):
    def _build_module(self):
        if not self.engine_config.forward_only:
            raise ValueError("the RepExp representation engine is frozen: engine_config.forward_only must be true")
        hf_config = self.model_config.hf_config
        saved_architectures = list(hf_config.architectures)
        saved_model_type = self.model_config.model_type
        if "ForCausalLM" not in saved_architectures[0]:
            raise ValueError(
                f"representation model architecture {saved_architectures[0]!r} is not a *ForCausalLM; "
                "RepExp features need a causal-LM checkpoint (the initial policy)"
            )
        # `Qwen2ForCausalLM` -> `Qwen2Model`, which verl's `get_hf_auto_model_class` maps to `AutoModel`
        hf_config.architectures = [saved_architectures[0].replace("ForCausalLM", "Model")]
        # verl's loader only knows language_model/value_model; the architecture now selects AutoModel
        self.model_config.model_type = "language_model"
        try:
            module = super()._build_module()
        finally:
            self.model_config.model_type = saved_model_type
            hf_config.architectures = saved_architectures
        module.requires_grad_(False)
        return module

    def prepare_model_outputs(self, output, output_args, micro_batch: TensorDict, logits_processor_func):
        use_remove_padding = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
        input_ids = micro_batch["input_ids"]
        seq_offsets = input_ids.offsets()
        response_lengths = response_lengths_of(micro_batch).to(seq_offsets.device)
        hidden = output.last_hidden_state
        if use_remove_padding:
            # (1, tokens + pad, H) -> (tokens, H); also undoes Ulysses slicing when sp > 1
            hidden = self._gather_and_unpad_packed(hidden.squeeze(0), output_args["pad_size"])
            means = response_mean_packed(hidden, seq_offsets, response_lengths)
        else:
            means = response_mean_right_padded(hidden, seq_offsets.diff(), response_lengths)
        return {OUTPUT_KEY: means}
