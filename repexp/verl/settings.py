"""The ``actor_rollout_ref.repexp`` and ``repexp_run`` config nodes as checked dataclasses (pure, no verl).

verl never converts these nodes, so `from_mapping` rejects unknown keys and bad values with the full key name.
`TRAINER_MODE` and `run_dir_of` live here because both `train` and the trainer it imports read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from repexp import layout
from repexp.config import (
    BonusConfig,
    TrainConfig,
    VerlConfig,
    check_bonus,
    check_fields,
    check_method_params,
    check_value,
    to_dataclass,
)
from repexp.methods import METHODS, Method

NODE = "actor_rollout_ref.repexp"
BONUS_KEY = "bonus"  # NODE's sub-node holding the pipeline's BonusConfig (config/repexp_trainer.yaml)
PARAMS_KEY = "params"  # NODE's sub-node holding the run method's Params (repexp.methods) as a mapping
RUN_NODE = "repexp_run"
TRAINER_MODE = "repexp"  # trainer.v1.trainer_mode under which repexp.verl.trainer registers RepExpTrainer
DTYPES = ("bf16", "fp16", "fp32")


@dataclass(kw_only=True)
class RepExpSettings(BonusConfig):
    """The node, read: the bonus settings are the pipeline's `BonusConfig` itself (inherited, so its fields,
    defaults and rules are not restated; the node carries them as its ``bonus`` sub-node), plus the sweep
    point (beta, sparse_dim, seed) and the frozen representation forward's settings. Being a `BonusConfig`,
    it is what `repexp.bonus_step` takes, as TRL passes `RunConfig.bonus`."""

    # the sweep point: no default, every run sets it (a default here would be a second copy of the sweep's)
    beta: float
    sparse_dim: Optional[int]  # null for the GRPO baseline (beta = 0), which projects nothing
    seed: int = 0
    strategy: str = VerlConfig.strategy
    dtype: str = "bf16"
    # the node's own defaults are what `verl.attn_implementation: auto` gives where flash-attn imports;
    # every pipeline run sets both to what repexp.verl.attention resolved on its node
    attn_implementation: str = "flash_attention_2"
    use_remove_padding: bool = True
    use_dynamic_bsz: bool = False
    micro_batch_size_per_gpu: int = VerlConfig.repexp_micro_batch_size_per_gpu
    max_token_len_per_gpu: int = 32768
    # the run's training method (a key of repexp.methods.METHODS); null: repexp when beta > 0, else grpo
    method: Optional[str] = None
    # the method's `Params` (from the node's ``params`` mapping, checked by the pipeline's check_method_params)
    params: Any = None

    @property
    def entry(self) -> Method:
        """The method's entry of `repexp.methods.METHODS` (its hooks say where the trainer applies it)."""
        return METHODS[self.method]

    @property
    def bonus(self) -> BonusConfig:
        """The `BonusConfig` part, as the pipeline config has it."""
        return BonusConfig(**{name: getattr(self, name) for name in _BONUS_FIELDS})

    @property
    def enabled(self) -> bool:
        """beta = 0 is the GRPO baseline: no representation model and no hidden-state forward."""
        return self.beta > 0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = NODE, *,
                     n_rollouts: Optional[int] = None) -> RepExpSettings:
        """`n_rollouts`: the run's group size (``actor_rollout_ref.rollout.n``), for the method's rules
        against the train section (pass@k's k <= n); None checks them against the pipeline's default."""
        raw = dict(raw)
        params = raw.pop(PARAMS_KEY, None) or {}
        if not isinstance(params, Mapping):
            raise ValueError(f"{where}.{PARAMS_KEY}: expected a mapping of the method's parameters, got {params!r}")
        # the bonus node -> the pipeline's dataclass in one call: its keys, types and defaults, unknown keys
        # refused with their full name; then its per-field and cross-field rules, the pipeline config's own
        bonus = to_dataclass(BonusConfig, raw.pop(BONUS_KEY, {}), prefix=f"{where}.{BONUS_KEY}.")
        check_fields(bonus, f"{where}.{BONUS_KEY}.")
        check_bonus(bonus, f"{where}.{BONUS_KEY}")
        own = [f for f in dataclasses.fields(cls) if f.name not in _BONUS_FIELDS and f.name != PARAMS_KEY]
        s = cls(**vars(bonus), **_strict_fields(own, raw, where))
        # the pipeline config's per-field rules for the settings it shares (hand-written overrides reach here unchecked)
        check_value(f"{where}.strategy", s.strategy, VerlConfig, "strategy")
        check_value(f"{where}.micro_batch_size_per_gpu", s.micro_batch_size_per_gpu, VerlConfig,
                    "repexp_micro_batch_size_per_gpu")
        # beta = 0 is the GRPO baseline here, where the sweep's betas are RepExp's (> 0)
        _require(s.beta >= 0, f"{where}.beta", f"must be >= 0, got {s.beta}")
        _require(not s.enabled or s.sparse_dim is not None and s.sparse_dim >= 1, f"{where}.sparse_dim",
                 f"must be >= 1 when beta > 0, got {s.sparse_dim}")
        _require(s.seed >= 0, f"{where}.seed", f"must be >= 0, got {s.seed}")
        _require(s.dtype in DTYPES, f"{where}.dtype", f"{s.dtype!r} is not one of {DTYPES}")
        _require(s.max_token_len_per_gpu >= 1, f"{where}.max_token_len_per_gpu", "must be >= 1")
        return _with_method(s, dict(params), where, n_rollouts)


_BONUS_FIELDS = {f.name for f in dataclasses.fields(BonusConfig)}
_REPEXP_POINT = ("sparse_dim", "beta")  # RepExp's Params, which the node also carries as its own keys


def _with_method(s: RepExpSettings, params: dict, where: str, n_rollouts: Optional[int]) -> RepExpSettings:
    """The node's method and its parameters, checked by the pipeline's own rules (`check_method_params`,
    errors naming ``<where>.params.<field>``). RepExp's point stays in ``beta``/``sparse_dim`` (the
    representation worker reads them there); its ``params``, when given, must agree with them. Every other
    method runs without the elliptical bonus (beta = 0)."""
    method = s.method if s.method is not None else ("repexp" if s.enabled else "grpo")
    _require(method in METHODS, f"{where}.method", f"{method!r} is not a training method (known: {', '.join(METHODS)})")
    train = TrainConfig() if n_rollouts is None else dataclasses.replace(TrainConfig(), n_rollouts=int(n_rollouts))
    if method == "repexp":
        _require(s.enabled, f"{where}.beta", "must be > 0 for method repexp")
        given = dict(params)
        params = {**{name: getattr(s, name) for name in _REPEXP_POINT}, **given}
    settings = check_method_params(method, params, train, f"{where}.{PARAMS_KEY}")
    if method == "repexp":
        for name in given:
            _require(getattr(settings, name) == getattr(s, name), f"{where}.{PARAMS_KEY}.{name}",
                     f"{getattr(settings, name)!r} disagrees with {where}.{name} {getattr(s, name)!r}")
    else:
        _require(not s.enabled, f"{where}.beta", f"must be 0 for method {method} (beta is RepExp's bonus weight)")
    return dataclasses.replace(s, method=method, params=settings)


# Files of a verl checkpoint that only resuming reads (the kept best-dev checkpoint drops them;
# `repexp merge` needs the model shards, fsdp_config.json and huggingface/ only).
RESUME_ONLY = ("actor/optim_world_size_*", "actor/extra_state_world_size_*", "data.pt", layout.VERL_STATE,
               layout.VERL_OUTCOME_STATE)


@dataclass(frozen=True)
class RunSettings:
    run_dir: Optional[str] = None
    max_checkpoints_to_keep: Optional[int] = None
    prune_when_done: bool = False  # train.prune_when_done
    chunk_deadline: Optional[float] = None  # epoch seconds: a walltime chunk ends before it (repexp.walltime)
    mlflow_tracking_uri: Optional[str] = None
    replay_poll_seconds: Optional[float] = None  # null: verl's own poll interval

    @classmethod
    def of(cls, config: DictConfig) -> RunSettings:
        return cls.from_mapping(OmegaConf.to_container(config.get(RUN_NODE, {}), resolve=True))

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = RUN_NODE) -> RunSettings:
        settings = cls(**_strict_fields(dataclasses.fields(cls), raw, where))
        keep, deadline = settings.max_checkpoints_to_keep, settings.chunk_deadline
        _require(keep is None or keep >= 1, f"{where}.max_checkpoints_to_keep", "must be >= 1 or null")
        _require(deadline is None or deadline > 0, f"{where}.chunk_deadline", "must be > 0 (epoch seconds) or null")
        poll = settings.replay_poll_seconds
        _require(poll is None or poll > 0, f"{where}.replay_poll_seconds", "must be > 0 or null")
        return settings


def repexp_settings(actor_rollout_ref: DictConfig) -> RepExpSettings:
    node = actor_rollout_ref.get("repexp")
    if node is None:
        raise ValueError("actor_rollout_ref.repexp: missing; launch through python -m repexp.verl.train")
    rollout = actor_rollout_ref.get("rollout") or {}
    return RepExpSettings.from_mapping(OmegaConf.to_container(node, resolve=True), n_rollouts=rollout.get("n"))


def run_dir_of(config: DictConfig) -> Path:
    """The run directory; verl's checkpoint dir must be ``<run_dir>/checkpoints`` (the shared layout)."""
    run = RunSettings.of(config)
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


# annotation -> (accepted types, what the error says is expected); bools are ints to Python, so only "bool" takes them
_TYPES = {"bool": (bool, "true/false"), "int": (int, "an integer"), "float": ((int, float), "a number"),
          "str": (str, "a string")}


def _strict_fields(fields: Sequence[dataclasses.Field], raw: Mapping[str, Any], where: str) -> dict:
    """The values of `raw` for these fields, type-checked by each field's annotation (a string, from
    ``from __future__ import annotations``); unknown keys, nulls where none is allowed and missing
    required keys raise ValueError naming the full key."""
    known = {f.name: f for f in fields}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(known)})")
    # "???": the YAML's mark of a required key that no override set (OmegaConf.to_container keeps it)
    missing = [name for name, f in known.items() if f.default is dataclasses.MISSING and raw.get(name, "???") == "???"]
    if missing:
        raise ValueError(f"{where}.{missing[0]}: missing (no default: every run sets it)")
    values = {}
    for name, value in raw.items():
        kind = known[name].type
        base = kind.removeprefix("Optional[").removesuffix("]")
        if value is None and base == kind:
            raise ValueError(f"{where}.{name}: must not be null")
        types, expected = _TYPES[base]
        if value is not None and (not isinstance(value, types) or isinstance(value, bool) != (base == "bool")):
            raise ValueError(f"{where}.{name}: expected {expected}, got {value!r}")
        values[name] = float(value) if base == "float" and value is not None else value
    return values
