"""pass@k training (Chen et al., arXiv 2508.10751): GRPO with the analytic pass@k advantage in place of
the group-normalised verifier reward. The core is filled in by `passk_advantages` (docs/methods.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from repexp.methods.base import Method, param


@dataclass(frozen=True)
class Params:
    passk_k: int = param(4, help="k of the pass@k objective (k ≤ train.n_rollouts; k = 1 is GRPO)", minimum=1)


def _check(p: Params, train: Any) -> Optional[str]:
    if p.passk_k > train.n_rollouts:
        return f"passk_k: {p.passk_k} exceeds train.n_rollouts {train.n_rollouts} (pass@k needs k ≤ n rollouts)"
    return None


METHOD = Method(name="passk", params=Params, run_name="{backend}_passk_k{passk_k}_s{seed}", label="pass@k training",
                color="#55a868", marker="s", check=_check, hooks=("advantage",),
                point_text=lambda p: f"k={p.passk_k}")
