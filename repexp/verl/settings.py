"""The ``actor_rollout_ref.repexp`` and ``repexp_run`` config nodes as checked dataclasses (pure, no verl).

verl never converts these nodes, so nothing else would notice a misspelled or out-of-range key:
`RepExpSettings.from_mapping` rejects unknown keys and bad values with the full key name.
`TRAINER_MODE` and `run_dir_of` are here, not in `train`, because both the entry (`train`) and the
trainer it registers (`trainer`) read them: `train` imports `trainer`, so `trainer` must not import `train`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from repexp import bonus_defaults as B
from repexp import layout
from repexp.config import BonusConfig, VerlConfig, check_bonus, check_value

NODE = "actor_rollout_ref.repexp"
RUN_NODE = "repexp_run"
TRAINER_MODE = "repexp"  # trainer.v1.trainer_mode under which repexp.verl.trainer registers RepExpTrainer
DTYPES = ("bf16", "fp16", "fp32")
# This node's settings that are the pipeline config's too: name → (section dataclass, field).
PIPELINE_FIELDS = {
    "alpha": (BonusConfig, "alpha"),
    "lamb": (BonusConfig, "lamb"),
    "reward_type": (BonusConfig, "reward_type"),
    "normalization": (BonusConfig, "normalization"),
    "strategy": (VerlConfig, "strategy"),
    "micro_batch_size_per_gpu": (VerlConfig, "repexp_micro_batch_size_per_gpu"),
}


@dataclass(frozen=True)
class RepExpSettings:
    # Defaults: the bonus's are repexp.bonus_defaults', the ones the pipeline config's `verl` section also
    # has are its defaults; config/repexp_trainer.yaml repeats them for people reading the node, and
    # tests/test_single_source.py keeps the two equal.
    beta: float = B.BETA
    alpha: float = B.ALPHA
    sparse_dim: int = B.SPARSE_DIM
    lamb: float = B.LAMB
    reward_type: str = B.REWARD_TYPE
    normalization: str = B.NORMALIZATION
    center: bool = B.CENTER
    randomize_projection: bool = B.RANDOMIZE_PROJECTION
    persist_covariance: bool = B.PERSIST_COVARIANCE
    turn_off_if_none_correct: bool = B.TURN_OFF_IF_NONE_CORRECT
    turn_off_if_some_correct: bool = B.TURN_OFF_IF_SOME_CORRECT
    turn_off_if_all_correct: bool = B.TURN_OFF_IF_ALL_CORRECT
    turn_off_if_rollout_incorrect: bool = B.TURN_OFF_IF_ROLLOUT_INCORRECT
    seed: int = 0
    model_path: Optional[str] = None
    strategy: str = VerlConfig.strategy
    dtype: str = "bf16"
    # the node's own defaults are what `verl.attn_implementation: auto` gives where flash-attn imports;
    # every pipeline run sets both to what repexp.verl.attention resolved on its node
    attn_implementation: str = "flash_attention_2"
    use_remove_padding: bool = True
    use_dynamic_bsz: bool = False
    micro_batch_size_per_gpu: int = VerlConfig.repexp_micro_batch_size_per_gpu
    max_token_len_per_gpu: int = 32768

    @property
    def enabled(self) -> bool:
        """beta = 0 is the GRPO baseline: no representation model and no hidden-state forward."""
        return self.beta > 0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = NODE) -> RepExpSettings:
        values = _strict_fields(cls, raw, where)
        settings = cls(**values)
        settings._check(where)
        return settings

    def _check(self, where: str) -> None:
        # Settings the pipeline config also has: its per-field rules (this node is also read from
        # hand-written overrides that no pipeline config checked).
        for name, (cls, field) in PIPELINE_FIELDS.items():
            check_value(f"{where}.{name}", getattr(self, name), cls, field)
        # beta = 0 is the GRPO baseline here, where the sweep's betas are RepExp's (> 0)
        _require(self.beta >= 0, f"{where}.beta", f"must be >= 0, got {self.beta}")
        _require(self.sparse_dim >= 1, f"{where}.sparse_dim", f"must be >= 1, got {self.sparse_dim}")
        _require(self.seed >= 0, f"{where}.seed", f"must be >= 0, got {self.seed}")
        _require(self.dtype in DTYPES, f"{where}.dtype", f"{self.dtype!r} is not one of {DTYPES}")
        _require(self.max_token_len_per_gpu >= 1, f"{where}.max_token_len_per_gpu", "must be >= 1")
        check_bonus(self, where)  # the pipeline config's own rules (this node has the same keys)


@dataclass(frozen=True)
class RunSettings:
    run_dir: Optional[str] = None
    max_checkpoints_to_keep: Optional[int] = None
    chunk_deadline: Optional[float] = None  # epoch seconds: a walltime chunk ends before it (repexp.walltime)
    mlflow_tracking_uri: Optional[str] = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = RUN_NODE) -> RunSettings:
        settings = cls(**_strict_fields(cls, raw, where))
        if settings.max_checkpoints_to_keep is not None:
            _require(settings.max_checkpoints_to_keep >= 1, f"{where}.max_checkpoints_to_keep", "must be >= 1 or null")
        if settings.chunk_deadline is not None:
            _require(settings.chunk_deadline > 0, f"{where}.chunk_deadline", "must be > 0 (epoch seconds) or null")
        return settings


def run_dir_of(config: DictConfig) -> Path:
    """The run directory; verl's checkpoint dir must be ``<run_dir>/checkpoints`` (the shared layout)."""
    run = RunSettings.from_mapping(OmegaConf.to_container(config.get(RUN_NODE, {}), resolve=True))
    local_dir = Path(config.trainer.default_local_dir)
    run_dir = Path(run.run_dir) if run.run_dir else local_dir.parent
    expected = layout.checkpoints_dir(run_dir)
    if local_dir.resolve() != expected.resolve():
        raise ValueError(
            f"trainer.default_local_dir: {local_dir} must be {expected} "
            f"({layout.BEST_DEV} and repexp select expect {layout.checkpoint_dir('<run_dir>', 'N')})"
        )
    return run_dir


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


def _strict_fields(cls: type, raw: Mapping[str, Any], where: str) -> dict:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(fields)})")
    values = {}
    for name, value in raw.items():
        default = fields[name].default
        key = f"{where}.{name}"
        if value is None:
            if default is not None:
                raise ValueError(f"{key}: must not be null")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: expected true/false, got {value!r}")
        elif isinstance(default, int) or name == "max_checkpoints_to_keep":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key}: expected an integer, got {value!r}")
        elif isinstance(default, float) or name == "chunk_deadline":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key}: expected a number, got {value!r}")
            value = float(value)
        elif not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        values[name] = value
    return values
