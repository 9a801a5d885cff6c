"""Reading a pipeline config: strict YAML, `set=` dotlist overrides, and parsing as an OmegaConf structured config.

`parse` merges a YAML mapping (and `set=` overrides) into `OmegaConf.structured(PipelineConfig)`:
unknown keys and wrong types fail naming the key, strings become numbers where the schema says so
(`lr: 1e-5`, which YAML reads as a string, and Snakemake's `--config`, which passes strings), and
`task_overrides.<task>.<section>` are merged onto their section by `OmegaConf.merge`. Structure,
types and conversions only: `repexp.config.rules` applies the rules (`load` = parse + check).

Pure: OmegaConf and PyYAML only (imported where used).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repexp.config.model import (
    LEGACY_SWEEP_KEYS,
    METHOD_GRIDS,
    OVERRIDES_KEY,
    REMOVED_KEYS,
    SECTIONS,
    TASKS,
    ConfigError,
    PipelineConfig,
)

# --------------------------------------------------------------------------- reading YAML


def read_yaml(path: str | Path) -> Any:
    """A YAML file, strictly: a repeated key is an error naming the file and line (PyYAML keeps the
    last one silently), and `1e-5` is a number (PyYAML, following YAML 1.1, reads it as a string)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        loader.flatten_mapping(node)
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise ConfigError(f"{path}: line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                                  f"(first at line {seen[key] + 1}); YAML would keep only the last one")
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path}: not found")
    try:
        return yaml.load(path.read_text(), Loader=StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: invalid YAML ({err})") from None


def read_configs(paths: Sequence[str | Path]) -> Any:
    """Several config files merged in order, as Snakemake merges `--configfile A B` (an overlay such as
    configs/overlays/pilot4.yaml on configs/pilot.yaml): a mapping in a later file merges into the same
    key's mapping, any other value replaces it. One path: that file as `read_yaml` reads it."""
    merged: Any = None
    for path in paths:
        raw = read_yaml(path)
        merged = raw if merged is None else merge_config(merged, raw)
    return merged


def merge_config(base: Any, overlay: Any) -> Any:
    if not (isinstance(base, Mapping) and isinstance(overlay, Mapping)):
        return base if overlay is None else overlay  # an empty overlay file changes nothing
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = merge_config(merged[key], value) if isinstance(merged.get(key), Mapping) \
            and isinstance(value, Mapping) else value
    return merged


# --------------------------------------------------------------------------- parsing (OmegaConf)


def split_overrides(value: Any) -> list[str]:
    """`set=` overrides as a list of `key.path=value` items. A string is split on whitespace outside
    brackets and quotes, so `sweep.betas=[0.01, 0.02] train.lr=2e-6` gives two items."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [item for entry in value for item in split_overrides(entry)]
    items, current, depth, quote = [], "", 0, None
    for char in str(value):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char.isspace() and depth == 0:
            if current:
                items.append(current)
            current = ""
            continue
        current += char
    if current:
        items.append(current)
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"{OVERRIDES_KEY}: {item!r} is not a key.path=value override")
    return items


def _omegaconf_error(err: Exception, prefix: str = "") -> ConfigError:
    """An OmegaConf error as a ConfigError that starts with the full key."""
    key = prefix + (getattr(err, "full_key", "") or "")
    message = (getattr(err, "msg", "") or str(err)).splitlines()[0].strip()
    if type(err).__name__ == "ConfigKeyError":
        object_type = getattr(err, "object_type", None)
        known = (f" (known: {', '.join(f.name for f in dataclasses.fields(object_type))})"
                 if dataclasses.is_dataclass(object_type) else "")
        message = REMOVED_KEYS.get(key.rsplit(".", 1)[-1], f"unknown key{known}")
    return ConfigError(f"{key or '<root>'}: {message}")


def _check_sections(tp: Any, raw: Any, prefix: str = "") -> None:
    """Sections (dataclasses and dicts) must be mappings: OmegaConf's merge error for `eval: [1, 2]` names no key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or '<root>'}: expected a mapping, got {raw!r}")
    is_dict = typing.get_origin(tp) is dict
    hints = dict.fromkeys(raw, typing.get_args(tp)[1]) if is_dict else typing.get_type_hints(tp)
    for name, value in raw.items():
        sub = hints.get(name)
        if value is not None and (dataclasses.is_dataclass(sub) or typing.get_origin(sub) is dict):
            _check_sections(sub, value, f"{prefix}{name}.")


def to_dataclass(cls_or_obj: Any, *raws: Any, prefix: str = "") -> Any:
    """Merge mappings onto a dataclass (a class: its defaults; an instance: its values) with OmegaConf's
    type checks and conversions, and return the dataclass instance."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        node = OmegaConf.merge(OmegaConf.structured(cls_or_obj), *raws)
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, prefix) from None


def parse(raw: Mapping, *, overrides: Sequence[str] = ()) -> PipelineConfig:
    """A config mapping (+ dotlist overrides, also from its `set` key) as a typed `PipelineConfig`:
    structure, types and conversions only; `check` applies the rules."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(raw, Mapping):
        raise ConfigError("<root>: the config must be a mapping")
    raw = _legacy_sweep(dict(raw))
    dotlist = [_legacy_override(item) for item in (*split_overrides(raw.pop(OVERRIDES_KEY, None)), *overrides)]
    _check_sections(PipelineConfig, raw)
    try:
        node = OmegaConf.merge(OmegaConf.structured(PipelineConfig), raw)
        for item in dotlist:
            try:
                node = OmegaConf.merge(node, OmegaConf.from_dotlist([item]))
            except OmegaConfBaseException as err:
                raise ConfigError(f"{_omegaconf_error(err)} (override {item!r})") from None
            except Exception as err:  # noqa: BLE001 - OmegaConf's dotlist grammar raises plain errors
                raise ConfigError(f"{OVERRIDES_KEY}: cannot parse override {item!r} ({err})") from None
        cfg = OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err) from None
    _merge_task_overrides(cfg)
    return cfg


def _legacy_sweep(raw: dict) -> dict:
    """Earlier configs' `sweep.sparse_dims`, `sweep.betas`, `sweep.grpo_baseline` (also under a task
    override's `sweep`) read as the `sweep.methods` entries they meant (`LEGACY_SWEEP_KEYS`); beside a
    `methods` mapping they patch its `repexp` and `grpo` entries."""

    def rewrite(sweep: Any, where: str) -> Any:
        if not isinstance(sweep, Mapping) or not set(sweep) & set(LEGACY_SWEEP_KEYS):
            return sweep
        sweep = dict(sweep)
        # given beside `methods` (Snakemake's --config merges keys into the file's), they patch its entries
        methods = {name: (dict(value) if isinstance(value, Mapping) else value)
                   for name, value in (sweep.get("methods") or {}).items()}
        given = "methods" in sweep
        for old, (method, name) in LEGACY_SWEEP_KEYS.items():
            if old not in sweep:
                continue
            value = sweep.pop(old)
            if name is None:  # grpo_baseline: the method on ({}) or off (null)
                methods[method] = (methods.get(method) or {}) if value else None
            else:
                methods[method] = {**(methods.get(method) or {}), name: value}
        if where == "sweep" and not given:
            methods.setdefault("grpo", {})  # sweep.grpo_baseline's default was true
        sweep["methods"] = methods
        return sweep

    if "sweep" in raw:
        raw["sweep"] = rewrite(raw["sweep"], "sweep")
        methods = raw["sweep"].get("methods") if isinstance(raw["sweep"], Mapping) else None
        if isinstance(methods, Mapping):  # the methods a config lists are the sweep's, not added to the defaults
            raw["sweep"] = {**raw["sweep"], "methods": {**dict.fromkeys(METHOD_GRIDS), **methods}}
    overrides = raw.get("task_overrides")
    if isinstance(overrides, Mapping):
        raw["task_overrides"] = {task: ({**o, "sweep": rewrite(o["sweep"], f"task_overrides.{task}.sweep")}
                                        if isinstance(o, Mapping) and "sweep" in o else o)
                                 for task, o in overrides.items()}
    return raw


def _legacy_override(item: str) -> str:
    """A dotlist override of an earlier sweep key, e.g. `sweep.betas=[0.01]` -> `sweep.methods.repexp.beta=[0.01]`."""
    key, sep, value = item.partition("=")
    head, _, old = key.rpartition(".")
    if not sep or not head.endswith("sweep") or old not in LEGACY_SWEEP_KEYS:
        return item
    method, name = LEGACY_SWEEP_KEYS[old]
    if name is None:
        return f"{head}.methods.{method}=" + ("null" if value.strip().lower() in ("false", "0", "no") else "{}")
    return f"{head}.methods.{method}.{name}={value}"


def _merge_task_overrides(cfg: PipelineConfig) -> None:
    """Check every task override against its section's dataclass; keep the converted values."""
    for task, override in cfg.task_overrides.items():
        if task not in TASKS:
            raise ConfigError(f"task_overrides.{task}: unknown task (known: {', '.join(TASKS)})")
        methods = {}
        for name, patch in override.sweep.methods.items():
            where = f"task_overrides.{task}.sweep.methods.{name}"
            if name not in METHOD_GRIDS:
                raise ConfigError(f"{where}: unknown method (known: {', '.join(METHOD_GRIDS)})")
            if patch is not None and not isinstance(patch, Mapping):
                raise ConfigError(f"{where}: expected a mapping of parameter lists or null, got {patch!r}")
            grid = None if patch is None else to_dataclass(METHOD_GRIDS[name], patch, prefix=f"{where}.")
            methods[name] = None if grid is None else {key: getattr(grid, key) for key in patch}
        override.sweep.methods = methods
        for section in SECTIONS:
            patch = getattr(override, section)
            if patch:
                merged = to_dataclass(getattr(cfg, section), patch, prefix=f"task_overrides.{task}.{section}.")
                setattr(override, section, {key: getattr(merged, key) for key in patch})


def parse_files(raw: Mapping, files: Sequence[str | Path] = ()) -> PipelineConfig:
    """`parse` for a mapping that Snakemake loaded from `files`: each file is re-read strictly first
    (PyYAML, as Snakemake uses it, keeps the last of two equal keys without a word)."""
    for path in files:
        read_yaml(path)
    return parse(raw)


# --------------------------------------------------------------------------- writing YAML


def dump_yaml(obj: Any) -> str:
    import yaml

    data = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
