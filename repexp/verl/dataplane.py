"""Every TransferQueue access of the RepExp trainer, in one place (verl may replace that data plane).

verl 0.9.1's V1 trainer passes `KVBatchMeta` handles between stages and keeps the data in TransferQueue
(one jagged row per trajectory key). Pitfalls handled here: ``select_fields`` silently drops a field missing
for any key, so `read_fields` checks everything came back; a field written for only some keys becomes
unreadable, so `write_fields` always writes every key of the batch (padding rows too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta


def read_fields(batch: KVBatchMeta, names: Sequence[str]) -> TensorDict:
    data = tq.kv_batch_get(keys=list(batch.keys), partition_id=batch.partition_id, select_fields=list(names))
    missing = [name for name in names if name not in data.keys()]
    if missing:
        raise KeyError(f"TransferQueue partition {batch.partition_id!r} lacks fields {missing} for this batch")
    return data


def write_fields(batch: KVBatchMeta, fields: Mapping[str, torch.Tensor]) -> KVBatchMeta:
    for name, value in fields.items():
        if value.shape[0] != len(batch):
            raise ValueError(f"field {name!r} has {value.shape[0]} rows for a batch of {len(batch)} keys")
    return tq.kv_batch_put(keys=list(batch.keys), partition_id=batch.partition_id,
                           fields=TensorDict(dict(fields), batch_size=len(batch)))


def worker_request(batch: KVBatchMeta, fields: Iterable[str], extra_info: Mapping) -> KVBatchMeta:
    """A view of `batch` that makes verl's tqbridge fetch only `fields` for a worker call."""
    return KVBatchMeta(keys=list(batch.keys), tags=list(batch.tags), partition_id=batch.partition_id,
                       fields=list(fields), extra_info=dict(extra_info))


def padding_rows(batch: KVBatchMeta) -> torch.Tensor:
    """Rows verl appended to make the batch divisible (``is_padding`` tag); they take no part in the bonus."""
    return torch.tensor([bool(tag.get("is_padding", False)) for tag in batch.tags], dtype=torch.bool)


def non_tensor_list(data: TensorDict, name: str) -> list:
    """A non-tensor field as a plain list (TQ returns a LinkedList, NonTensorStack or array by backend)."""
    value = data[name]
    return list(value.tolist()) if hasattr(value, "tolist") else list(value)


def dense_rows(field: torch.Tensor) -> torch.Tensor:
    """A jagged (B, j=H) field of equal-length rows as a dense (B, H) tensor."""
    return field.to_padded_tensor(0.0) if field.is_nested else field


def row_sums(field: torch.Tensor) -> torch.Tensor:
    """Per-row sums of a jagged (B, j) field (the verifier score of ``rm_scores``), in one vectorised call."""
    if not field.is_nested:
        return field.sum(dim=-1)
    offsets = field.offsets()
    rows = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
    return torch.zeros(offsets.numel() - 1, dtype=field.dtype).index_add_(0, rows, field.values())


def row_lengths(field: torch.Tensor) -> torch.Tensor:
    return field.offsets().diff() if field.is_nested else torch.full((field.shape[0],), field.shape[1])


def token_rows(field: torch.Tensor) -> list[list[int]]:
    """Each row of a jagged (B, j) token-id field as a list (``responses``: a row is exactly one response's
    tokens, no padding). A dense field's rows are taken whole."""
    if not field.is_nested:
        return field.tolist()
    offsets, values = field.offsets().tolist(), field.values().tolist()
    return [values[start:end] for start, end in zip(offsets[:-1], offsets[1:])]


def add_per_row(field: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
    """``row + addend[i]`` at every position of row i (an advantage term spread over a response's tokens:
    verl's nested fields hold the response tokens only). Returns a new jagged tensor with the same offsets."""
    offsets = field.offsets()
    values = field.values() + addend.to(field.values().dtype).repeat_interleave(offsets.diff())
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def add_at_last_token(field: torch.Tensor, scale: float, addend: torch.Tensor) -> torch.Tensor:
    """``scale * row`` with ``addend[i]`` added at the last position of row i (rows must be non-empty
    where addend is non-zero). Returns a new jagged tensor with the same offsets."""
    offsets = field.offsets()
    lengths = offsets.diff()
    if bool(((lengths == 0) & (addend != 0)).any()):
        raise ValueError("cannot place a reward on an empty response")
    values = field.values().clone() * scale
    has_tokens = lengths > 0
    last = offsets[1:][has_tokens] - 1
    values[last] += addend[has_tokens].to(values.dtype)
    return torch.nested.nested_tensor_from_jagged(values, offsets)
