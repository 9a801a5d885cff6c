"""verl 0.9.1 + trl 1.x: verl's `apply_monkey_patch` (every FSDP engine build) imports
``AutoModelForCausalLMWithValueHead`` from trl whenever trl is importable, and trl 1.x ships none, so every
verl FSDP engine fails with ``ImportError``. GRPO builds no value-head critic, so when the class is missing
we tell that module trl is absent.
"""

from __future__ import annotations

import contextlib
import importlib


def patch_trl_value_head_import() -> bool:
    """Apply the fix in this process if needed; returns whether it was applied."""
    from verl.models.transformers import monkey_patch
    from verl.utils.import_utils import is_trl_available

    if not is_trl_available():
        return False
    for module in ("trl.experimental.ppo", "trl"):
        with contextlib.suppress(ImportError):
            if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                return False
    monkey_patch.is_trl_available = lambda: False
    return True
