"""Compatibility fixes between verl 0.9.1 and the rest of the repexp environment.

`verl.models.transformers.monkey_patch.apply_monkey_patch` (run by every FSDP engine build: the
actor and the RepExp representation engine) imports ``AutoModelForCausalLMWithValueHead`` from
``trl.experimental.ppo`` or ``trl`` whenever trl is importable. trl 1.x ships neither, so in an
environment that also holds the TRL backend (trl 1.16) every verl FSDP engine fails with
``ImportError``. The import only serves trl value-head critics, which GRPO never builds, so when
the class is missing we tell that module trl is absent.
"""

from __future__ import annotations

import importlib


def _trl_has_value_head() -> bool:
    for module in ("trl.experimental.ppo", "trl"):
        try:
            if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                return True
        except ImportError:
            continue
    return False


def patch_trl_value_head_import() -> bool:
    """Apply the fix in this process if needed; returns whether it was applied."""
    from verl.models.transformers import monkey_patch
    from verl.utils.import_utils import is_trl_available

    if not is_trl_available() or _trl_has_value_head():
        return False
    monkey_patch.is_trl_available = lambda: False
    return True
