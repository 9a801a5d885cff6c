"""Mean of the last hidden state over response tokens, for every data layout verl feeds an engine.

Pure torch (no verl): the engine calls these on its model output, and the GPU check runs them
against a plain transformers forward. A sequence is prompt tokens followed by response tokens;
the feature of a rollout is the mean of the model's last hidden state (after the final norm)
over its response positions, EOS included, as in the RepExp recipe. Means are accumulated in
float32. An empty response gives a zero vector (the recipe produced NaN).
"""

from __future__ import annotations

import torch


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
    """Per-sequence response mean of packed hidden states.

    Args:
        hidden: (total_tokens, H), all sequences concatenated (verl's remove-padding layout).
        seq_offsets: (B + 1,) cumulative sequence starts, ``seq_offsets[-1] == total_tokens``.
        response_lengths: (B,) number of trailing response tokens of each sequence.

    Returns:
        (B, H) float32.
    """
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
