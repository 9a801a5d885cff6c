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

from repexp.config.model import OVERRIDES_KEY, REMOVED_KEYS, SECTIONS, TASKS, ConfigError, PipelineConfig

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
    raw = dict(raw)
    dotlist = [*split_overrides(raw.pop(OVERRIDES_KEY, None)), *overrides]
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


def _merge_task_overrides(cfg: PipelineConfig) -> None:
    """Check every task override against its section's dataclass; keep the converted values."""
    for task, override in cfg.task_overrides.items():
        if task not in TASKS:
            raise ConfigError(f"task_overrides.{task}: unknown task (known: {', '.join(TASKS)})")
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
