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

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from repexp import verify
from repexp.metrics import dev_metrics


@dataclasses.dataclass(frozen=True)
class DevProblem:
    prompt_ids: list[int]
    data_source: str
    ground_truth: str


def validation_seed(seed: int, step: int) -> int:
    state = np.random.SeedSequence([int(seed), int(step), 0xDE5]).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))


@contextlib.contextmanager
def _inference_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode with the KV cache usable, restoring train mode and gradient checkpointing after."""
    was_training = model.training
    checkpointing = bool(getattr(model, "is_gradient_checkpointing", False))
    if checkpointing:
        model.gradient_checkpointing_disable()
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.train(was_training)


def sample_and_score(
    model: Any,
    problems: Sequence[DevProblem],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    prompts_per_call: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    tokenizer: Any,
    seed: int,
    grader: str = verify.DEFAULT_GRADER,
) -> np.ndarray:
    """Number of correct samples (of n) per problem, scored under `grader`."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    config = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=n,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
    )
    eos = torch.tensor(list(eos_token_ids), device=device)
    correct = np.zeros(len(problems), dtype=np.int64)
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), _inference_mode(model):
        torch.manual_seed(seed)
        for start in range(0, len(problems), prompts_per_call):
            chunk = problems[start : start + prompts_per_call]
            width = max(len(p.prompt_ids) for p in chunk)
            input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, problem in enumerate(chunk):  # left padding for generation
                input_ids[row, width - len(problem.prompt_ids):] = torch.tensor(problem.prompt_ids)
                attention_mask[row, width - len(problem.prompt_ids):] = 1
            output = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
            )
            new_tokens = output[:, width:]
            is_eos = torch.isin(new_tokens, eos)
            ends = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), new_tokens.shape[1]).tolist()
            texts = tokenizer.batch_decode(
                [new_tokens[i, : ends[i]].tolist() for i in range(new_tokens.shape[0])], skip_special_tokens=True
            )
            for i, text in enumerate(texts):  # num_return_sequences rows per prompt, prompt-major
                problem = chunk[i // n]
                correct[start + i // n] += int(
                    verify.score(problem.data_source, text, problem.ground_truth, grader=grader) > 0
                )
    return correct


def validate(model: Any, problems: Sequence[DevProblem], *, step: int, cfg: Any, tokenizer: Any,
             eos_token_ids: Sequence[int]) -> dict[str, float]:
    """Dev pass@k of `model` at `step` under the run config `cfg` (a RunConfig)."""
    if not problems:
        raise ValueError("the dev set is empty; cannot validate")
    n = cfg.train.val_n
    correct = sample_and_score(
        model,
        problems,
        n=n,
        temperature=cfg.train.temperature,
        top_p=cfg.train.top_p,
        max_new_tokens=cfg.train.max_response_length,
        prompts_per_call=cfg.trl.eval_batch_size,
        eos_token_ids=eos_token_ids,
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
        seed=validation_seed(cfg.seed, step),
        grader=cfg.grader,
    )
    return dev_metrics(n, correct)
