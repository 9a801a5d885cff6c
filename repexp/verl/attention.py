"""Which attention the verl actor and the frozen representation model use on this node (pure).

The same config runs on nodes with and without flash-attn (no wheel exists for every CUDA/torch
pair; the offline GPU stack has none), so `verl.attn_implementation: auto` is decided where the job
runs, at its start: flash_attention_2 with packed sequences (verl's `use_remove_padding`) when
`flash_attn` imports, else PyTorch's SDPA with packing off, the one pair that works without it.
An explicit value is taken as given, except that flash_attention_2 without flash-attn stops the
job before anything starts, naming the key. vLLM's rollouts and evaluation pick their own kernels.

    attention = resolve(cfg.verl.attn_implementation, cfg.verl.use_remove_padding, flash_attn_error())
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from repexp.config import ATTENTION as IMPLEMENTATIONS

AUTO, FLASH = IMPLEMENTATIONS[:2]


@dataclass(frozen=True)
class Attention:
    implementation: str  # the actor's and the frozen model's attn_implementation
    packing: bool  # verl's use_remove_padding for both
    reason: str  # one line for the job log and the MLflow param

    def describe(self) -> str:
        return f"{self.implementation}, packed sequences {'on' if self.packing else 'off'} ({self.reason})"


def flash_attn_error() -> Optional[str]:
    """None when `flash_attn` imports here, else why not (one line). Importing, not just finding,
    the package: a wheel built for another torch or CUDA is found but fails to load."""
    try:
        importlib.import_module("flash_attn")
    except Exception as err:  # noqa: BLE001 - ImportError, OSError (undefined symbols) and friends
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
    return None


def resolve(requested: str, packing: Optional[bool], flash_error: Optional[str],
            key: str = "verl.attn_implementation") -> Attention:
    """The attention for this node. `packing` None follows the attention (on with flash-attn)."""
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"{key}: {requested!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if requested == AUTO:
        if flash_error is None:
            return Attention(FLASH, True if packing is None else packing, "auto: flash_attn imports on this node")
        return Attention("sdpa", False if packing is None else packing,
                         f"auto: flash_attn does not import on this node ({flash_error})")
    if requested == FLASH and flash_error is not None:
        raise ValueError(f"{key}: flash_attention_2 was asked for, but flash_attn does not import on this node "
                         f"({flash_error}); use 'auto' (SDPA where flash-attn is missing) or install flash-attn "
                         "(docs/verl_backend.md, 'Attention')")
    return Attention(requested, (requested == FLASH) if packing is None else packing, "set in the config")
