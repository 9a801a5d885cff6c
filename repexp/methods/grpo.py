"""GRPO: the baseline every other method is compared with. Verifier reward, group-normalised advantage
((r − mean) / (unbiased std + 1e-6), verl's GRPO), PPO clipped loss; no settings of its own."""

from __future__ import annotations

from dataclasses import dataclass

from repexp.methods.base import Method


@dataclass(frozen=True)
class Params:
    """GRPO has no parameters of its own (the shared `train` section is its whole setting)."""


METHOD = Method(name="grpo", params=Params, run_name="{backend}_grpo_s{seed}", label="GRPO", color="#4c72b0")
