"""`Method`, the entry of one training method in `repexp.methods.METHODS` (a leaf: the method modules import it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from repexp.fields import param  # noqa: F401  (re-exported for the method modules)


@dataclass(frozen=True)
class Method:
    """One training method: its settings, its run name and how the pipeline shows it.

    `run_name`: a `str.format` template over ``backend``, ``seed`` and the `Params` fields (the run's
    stable path component; every field that may take several values must appear in it).
    `label`: the method's name in tables and legends; `point_label(params)` adds its settings.
    `check`: cross-field rules against the run's `train` section; returns an error message naming the
    parameter (``"k: 16 exceeds train.n_rollouts 8"``) or None.
    Hooks, each None where the method does not use it (docs/methods.md, "How a method plugs in"):
    `reward`: adds a per-rollout term to the verifier score before GRPO's group normalisation;
    `advantage`: replaces GRPO's group-normalised advantage; `loss`: changes the policy loss.
    """

    name: str
    params: type
    run_name: str
    label: str
    color: str
    marker: str = "o"
    check: Optional[Callable[[Any, Any], Optional[str]]] = None
    hooks: tuple[str, ...] = ()
    point_text: Optional[Callable[[Any], str]] = None
    point_name: Optional[Callable[[Any], str]] = None  # the label of one point where it depends on a parameter

    def fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.params)

    def named_fields(self) -> tuple[str, ...]:
        """The fields that appear in the run name (the only ones that may take several values)."""
        return tuple(f.name for f in self.fields() if "{" + f.name + "}" in self.run_name)

    def make(self, values: Mapping[str, Any] | None = None) -> Any:
        return self.params(**dict(values or {}))

    def point_label(self, params: Any, *, with_point: bool = True) -> str:
        """Label of one parameter point, e.g. ``RepExp (dim=32, β=0.01)``; the bare label without fields."""
        name = self.point_name(params) if self.point_name else self.label
        if not with_point or not self.named_fields():
            return name
        text = self.point_text(params) if self.point_text else ", ".join(
            f"{field}={_short(getattr(params, field))}" for field in self.named_fields())
        return f"{name} ({text})"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


def params_dict(params: Any) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
