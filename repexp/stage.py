"""`StageResult`: what a stage returns to its node run. A leaf module (standard library only), so the
stages, the stage table (repexp.stages) and the tracking layer share it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    """What a stage produced, for its node run: exit status, `metrics` (at `step`), params, input
    datasets (repexp.tracking.outputs.dataset dicts), tables ({artifact file: {column: values}}) and
    curves ({metric: {step: value}}: pass@k logged at step = k, which MLflow draws against k)."""

    code: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, dict[str, list]] = field(default_factory=dict)
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
