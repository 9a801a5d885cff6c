"""RepExp (arXiv 2510.11686): GRPO on α·verifier + β·elliptical bonus of the frozen initial model's
features. The bonus itself is `repexp.elliptical` / `repexp.bonus_step` (its settings: the config's
`bonus` section, `BonusConfig`); this entry holds the swept point, sparse_dim and β."""

from __future__ import annotations

from dataclasses import dataclass

from repexp import bonus_defaults as B
from repexp.methods.base import Method, param


@dataclass(frozen=True)
class Params:
    sparse_dim: int = param(B.SPARSE_DIM, help="projection dimension of the bonus features", minimum=1)
    beta: float = param(B.BETA, help="bonus weight β (reward = α·verifier + β·bonus)", exclusiveMinimum=0)


def _text(p: Params) -> str:
    return f"dim={p.sparse_dim}, β={p.beta:g}"


METHOD = Method(name="repexp", params=Params, run_name="{backend}_repexp_k{sparse_dim}_b{beta}_s{seed}",
                label="RepExp", color="#dd8452", hooks=("reward",), point_text=_text)
