"""Outcome-based exploration (Song, Kempe, Munos, arXiv 2509.06941): a bonus on final answers, historical
(UCB-style counts of each answer per question over training) or batch (penalising answers repeated within
a group). The core is filled in by this module's functions (docs/methods.md)."""

from __future__ import annotations

from dataclasses import dataclass

from repexp.methods.base import Method, param

OUTCOME_MODES = ("historical", "batch")


@dataclass(frozen=True)
class Params:
    outcome_mode: str = param("historical", help="historical (UCB bonus on per-question answer counts) or batch "
                              "(penalty on answers repeated within a group)", enum=OUTCOME_MODES)
    outcome_c: float = param(1.0, help="bonus coefficient c", exclusiveMinimum=0)


METHOD = Method(name="outcome", params=Params, run_name="{backend}_outcome_{outcome_mode}_c{outcome_c}_s{seed}",
                label="Outcome exploration", color="#8172b3", marker="D", hooks=("reward",),
                point_text=lambda p: f"{p.outcome_mode}, c={p.outcome_c:g}")
