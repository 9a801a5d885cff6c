"""Dev validation during training: `val_n` samples per dev prompt from the in-memory policy → pass@k.

Sampling uses HF `generate` at the training temperature/top-p (top-k off), `max_response_length`
new tokens, inside a forked RNG seeded by (seed, step): the result depends only on the model
and the step, and validation never perturbs the training RNG (so a resumed run matches an
uninterrupted one). Responses are decoded up to the first EOS with special tokens skipped and
scored with `repexp.verify.score` under the run's grader; `repexp.metrics.dev_metrics` (the verl
backend's function too) gives the unbiased pass@k of `repexp.passk`, averaged over problems, for
k = 1, 2, 4, … ≤ val_n (and val_n), and the problem and sample counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from repexp import verify
from repexp.metrics import dev_metrics


def validation_seed(seed: int, step: int) -> int:
    state = np.random.SeedSequence([int(seed), int(step), 0xDE5]).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))


def validate(model: Any, step: int, *, rows: Sequence[dict], prompt_ids: Sequence[list[int]], cfg: Any,
             tokenizer: Any, eos_token_ids: Sequence[int]) -> dict[str, float]:
    """Dev pass@k of `model` at `step` on the dev `rows` (verl's row format; `prompt_ids`: each one's rendered
    prompt) under the run config `cfg` (a RunConfig)."""
    from transformers import GenerationConfig

    n, pad_token_id, prompts_per_call = cfg.train.val_n, tokenizer.pad_token_id, cfg.trl.eval_batch_size
    device = next(model.parameters()).device
    config = GenerationConfig(
        do_sample=True, temperature=cfg.train.temperature, top_p=cfg.train.top_p, top_k=0, repetition_penalty=1.0,
        max_new_tokens=cfg.train.max_response_length, num_return_sequences=n, eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
    )
    eos = torch.tensor(list(eos_token_ids), device=device)
    correct = np.zeros(len(rows), dtype=np.int64)
    devices = [device.index or 0] if device.type == "cuda" else []
    # eval mode with the KV cache usable; train mode and gradient checkpointing are restored after
    was_training, checkpointing = model.training, bool(getattr(model, "is_gradient_checkpointing", False))
    if checkpointing:
        model.gradient_checkpointing_disable()
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(validation_seed(cfg.seed, step))
            for start in range(0, len(rows), prompts_per_call):
                chunk = prompt_ids[start : start + prompts_per_call]
                width = max(map(len, chunk))
                input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
                attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, ids in enumerate(chunk):  # left padding for generation
                    input_ids[i, width - len(ids):] = torch.tensor(ids)
                    attention_mask[i, width - len(ids):] = 1
                output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                        generation_config=config)
                new_tokens = output[:, width:]
                is_eos = torch.isin(new_tokens, eos)
                ends = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), new_tokens.shape[1]).tolist()
                texts = tokenizer.batch_decode(
                    [new_tokens[i, : ends[i]].tolist() for i in range(new_tokens.shape[0])], skip_special_tokens=True
                )
                for i, text in enumerate(texts):  # num_return_sequences rows per prompt, prompt-major
                    row = rows[start + i // n]
                    truth = str(row["reward_model"]["ground_truth"])
                    correct[start + i // n] += int(verify.score(row["data_source"], text, truth, grader=cfg.grader) > 0)
    finally:
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.train(was_training)
    return dev_metrics(n, correct)
