"""The bonus feature of a rollout: the mean of a frozen model's last hidden state over its response.

One definition for every consumer (docs/bonus.md): the TRL reward and `repexp testtime` forward a
frozen base model here (`load_backbone`, `completion_features`); verl's engine pools its FSDP worker's
hidden states with `response_mean_packed` / `response_mean_right_padded`; `response_mean_masked` is
the mean they all reduce to.

As in the RepExp recipe, the feature is the backbone's `last_hidden_state` (the output of the final
norm, = `hidden_states[-1]`) averaged over the response positions, the first EOS included, with the
prompt in context but not pooled. Means are accumulated in float32. An empty response gives a zero
vector (the recipe produced NaN).

torch only at import time (transformers inside `load_backbone`): verl's engine and the GPU check
import the pooling without loading a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# --------------------------------------------------------------------------- verl's layouts


def _check_lengths(seq_lengths: torch.Tensor, response_lengths: torch.Tensor) -> None:
    if seq_lengths.shape != response_lengths.shape or seq_lengths.dim() != 1:
        raise ValueError(
            f"sequence and response lengths must be 1-D of equal size, got {tuple(seq_lengths.shape)} "
            f"and {tuple(response_lengths.shape)}"
        )
    if bool((response_lengths < 0).any()) or bool((response_lengths > seq_lengths).any()):
        raise ValueError(
            f"response lengths {response_lengths.tolist()} must lie in [0, sequence length] "
            f"(sequence lengths {seq_lengths.tolist()})"
        )


def response_mean_packed(
    hidden: torch.Tensor, seq_offsets: torch.Tensor, response_lengths: torch.Tensor
) -> torch.Tensor:
    """(B, H) float32 per-sequence response mean of packed hidden states (verl's remove-padding layout):
    hidden (total_tokens, H); seq_offsets (B + 1,) cumulative sequence starts ending at total_tokens;
    response_lengths (B,) trailing response tokens of each sequence."""
    if hidden.dim() != 2:
        raise ValueError(f"packed hidden states must be (tokens, hidden), got shape {tuple(hidden.shape)}")
    seq_offsets = seq_offsets.to(device=hidden.device, dtype=torch.long)
    response_lengths = response_lengths.to(device=hidden.device, dtype=torch.long)
    seq_lengths = seq_offsets.diff()
    _check_lengths(seq_lengths, response_lengths)
    if int(seq_offsets[-1]) != hidden.shape[0]:
        raise ValueError(f"offsets end at {int(seq_offsets[-1])} but there are {hidden.shape[0]} packed tokens")
    batch = seq_lengths.numel()
    segment = torch.repeat_interleave(torch.arange(batch, device=hidden.device), seq_lengths)
    position = torch.arange(hidden.shape[0], device=hidden.device) - seq_offsets[:-1][segment]
    in_response = position >= (seq_lengths - response_lengths)[segment]
    sums = torch.zeros(batch, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, segment[in_response], hidden[in_response].float())
    return sums / response_lengths.clamp(min=1).unsqueeze(1).float()


def response_mean_masked(hidden: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over the sequence dimension: hidden (B, T, H), response_mask (B, T) -> (B, H) float32.

    This is the recipe's layout (left-padded prompt, right-padded response) and the reference
    the other layouts are tested against.
    """
    if hidden.dim() != 3 or response_mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"expected hidden (B, T, H) and mask (B, T), got {tuple(hidden.shape)} and {tuple(response_mask.shape)}"
        )
    mask = response_mask.to(device=hidden.device, dtype=torch.float32)
    sums = torch.einsum("bt,bth->bh", mask, hidden.float())
    return sums / mask.sum(dim=1).clamp(min=1).unsqueeze(1)


def response_mask_right_padded(
    seq_lengths: torch.Tensor, response_lengths: torch.Tensor, width: int
) -> torch.Tensor:
    """(B, width) mask of the response positions of right-padded rows (sequence in columns [0, len))."""
    seq_lengths = seq_lengths.long()
    response_lengths = response_lengths.to(seq_lengths.device).long()
    _check_lengths(seq_lengths, response_lengths)
    if seq_lengths.numel() and int(seq_lengths.max()) > width:
        raise ValueError(f"sequence length {int(seq_lengths.max())} exceeds the padded width {width}")
    columns = torch.arange(width, device=seq_lengths.device).unsqueeze(0)
    end = seq_lengths.unsqueeze(1)
    return (columns < end) & (columns >= end - response_lengths.unsqueeze(1))


def response_mean_right_padded(
    hidden: torch.Tensor, seq_lengths: torch.Tensor, response_lengths: torch.Tensor
) -> torch.Tensor:
    """Response mean of right-padded rows: hidden (B, T, H), the row's sequence in columns [0, seq_len)."""
    if hidden.dim() != 3:
        raise ValueError(f"padded hidden states must be (B, T, H), got shape {tuple(hidden.shape)}")
    mask = response_mask_right_padded(seq_lengths.to(hidden.device), response_lengths, hidden.shape[1])
    return response_mean_masked(hidden, mask)


# --------------------------------------------------------------------------- a frozen backbone's forward


def load_backbone(path: str, *, dtype: torch.dtype, device: torch.device, key: str) -> torch.nn.Module:
    """A frozen transformers base model (no LM head) for the bonus features; `key` names the setting
    that chose `path` in the error."""
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"{key}: cannot load the representation model from {path!r} ({err})") from None
    return model.to(device).eval().requires_grad_(False)


@torch.no_grad()
def completion_features(
    backbone: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    micro_batch_size: int,
) -> torch.Tensor:
    """Mean-pooled `last_hidden_state` of `backbone` over each completion → [B, H] float32.

    `backbone` is a transformers base model (e.g. `load_backbone`, no LM head). Sequences are
    forwarded in micro-batches of similar length, right-padded (prompt + completion + padding: the
    real tokens keep exactly the positions and causal attention of an unpadded forward); the output
    keeps the input order and lives on the backbone's device.
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
        width = max(len(prompt_ids[i]) + len(completion_ids[i]) for i in rows)
        input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        completion_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for row, i in enumerate(rows):
            p, c = len(prompt_ids[i]), len(completion_ids[i])
            input_ids[row, : p + c] = torch.tensor([*prompt_ids[i], *completion_ids[i]], dtype=torch.long)
            attention_mask[row, : p + c] = 1
            completion_mask[row, p : p + c] = True
        hidden = backbone(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).last_hidden_state
        features[torch.tensor(rows, device=device)] = response_mean_masked(hidden, completion_mask)
    return features
