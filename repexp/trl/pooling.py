"""Bonus features: the mean of a frozen model's last hidden state over each completion (pure torch).

As in the RepExp recipe, a rollout's feature is the mean of the backbone's `last_hidden_state`
(the output of the final norm, = `hidden_states[-1]`) over the completion positions, the first
EOS included, with the prompt in context but not pooled. Rows are right-padded
(prompt + completion + pad), so positions and causal attention of the real tokens are exactly
those of an unpadded forward. An empty completion gives a zero vector (upstream gave NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def right_padded_batch(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_token_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, completion_mask), each [B, T], rows = prompt + completion + padding."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max(lengths, default=0)
    batch = len(lengths)
    input_ids = torch.full((batch, width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    completion_mask = torch.zeros((batch, width), dtype=torch.bool)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids)):
        p, c = len(prompt), len(completion)
        input_ids[row, : p + c] = torch.tensor([*prompt, *completion], dtype=torch.long)
        attention_mask[row, : p + c] = 1
        completion_mask[row, p : p + c] = True
    return input_ids, attention_mask, completion_mask


def masked_mean(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of hidden [B, T, H] over the positions where mask [B, T] is true → [B, H] float32 (0 if none)."""
    if hidden.dim() != 3 or tuple(mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"expected hidden [B, T, H] and mask [B, T], got {tuple(hidden.shape)} and "
                         f"{tuple(mask.shape)}")
    weights = mask.to(device=hidden.device, dtype=torch.float32)
    sums = torch.einsum("bt,bth->bh", weights, hidden.float())
    return sums / weights.sum(dim=1).clamp(min=1.0).unsqueeze(1)


@torch.no_grad()
def completion_features(
    backbone: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    micro_batch_size: int,
) -> Tensor:
    """Mean-pooled `last_hidden_state` of `backbone` over each completion → [B, H] float32.

    `backbone` is a transformers base model (e.g. `AutoModel`, no LM head). Sequences are
    forwarded in micro-batches of similar length; the output keeps the input order and lives
    on the backbone's device.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    batch = len(prompt_ids)
    device = next(backbone.parameters()).device
    hidden_size = backbone.config.hidden_size
    features = torch.zeros(batch, hidden_size, dtype=torch.float32, device=device)
    order = sorted(range(batch), key=lambda i: len(prompt_ids[i]) + len(completion_ids[i]))
    for start in range(0, batch, micro_batch_size):
        rows = order[start : start + micro_batch_size]
        input_ids, attention_mask, completion_mask = right_padded_batch(
            [prompt_ids[i] for i in rows], [completion_ids[i] for i in rows], pad_token_id
        )
        hidden = backbone(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).last_hidden_state
        features[torch.tensor(rows, device=device)] = masked_mean(hidden, completion_mask)
    return features
