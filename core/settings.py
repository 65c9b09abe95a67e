"""The flat view of a configuration tree. An executor's config holds the core's `CacheConfig` and
`SchedulerConfig` beside fields of its own, and every setting's name is unique in the tree, so a
tree reads and writes as one flat dict: a run's recorded settings, a sweep point, the flags
given, keyword arguments."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

from core.config import setting_fields

Config = TypeVar("Config")


def nested_configs(config_class: type) -> dict[str, type]:
    """The fields of ``config_class`` that hold a config of their own (a field whose default
    is built by a dataclass), with that config's class."""
    nested: dict[str, type] = {}
    for f in fields(config_class):
        factory: Any = f.default_factory
        if isinstance(factory, type) and is_dataclass(factory):
            nested[f.name] = factory
    return nested


def setting_names(config_class: type) -> list[str]:
    """Every setting of the tree, in field order, a nested config's in place of its field."""
    nested = nested_configs(config_class)
    names: list[str] = []
    for name in setting_fields(config_class):
        names.extend(setting_names(nested[name]) if name in nested else [name])
    return names


def flat_settings(config: object) -> dict[str, Any]:
    """The tree's settings by name (what a run records as its ``config``)."""
    nested = nested_configs(type(config))
    flat: dict[str, Any] = {}
    for name in setting_fields(type(config)):
        value = getattr(config, name)
        if name in nested:
            flat.update(flat_settings(value))
        else:
            flat[name] = value
    return flat


def _check_names(config_class: type, names: Mapping[str, Any]) -> None:
    known = setting_names(config_class)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(
            f"unknown setting {', '.join(map(repr, unknown))} for {config_class.__name__} "
            f"(its settings: {', '.join(known)})"
        )


def build(
    config_class: type[Config], settings: Mapping[str, Any] | None = None, /, **more: Any
) -> Config:
    """A ``config_class`` from flat settings (a mapping, keyword arguments or both), each
    nested config built from its own; what is not given keeps its default. An unknown name is
    refused."""
    given = {**(settings or {}), **more}
    _check_names(config_class, given)
    return _build(config_class, given)


def _build(config_class: type[Config], given: Mapping[str, Any]) -> Config:
    nested = nested_configs(config_class)
    kwargs: dict[str, Any] = {}
    for f in fields(config_class):  # type: ignore[arg-type]
        if f.name in nested:
            kwargs[f.name] = _build(nested[f.name], given)
        elif f.name in given:
            kwargs[f.name] = given[f.name]
    return config_class(**kwargs)


def with_settings(config: Config, **changes: Any) -> Config:
    """``config`` with these settings changed, wherever in the tree they live."""
    _check_names(type(config), changes)
    nested = nested_configs(type(config))
    updates: dict[str, Any] = {}
    for f in fields(config):  # type: ignore[arg-type]
        if f.name in nested:
            inner = {k: v for k, v in changes.items() if k in setting_names(nested[f.name])}
            if inner:
                updates[f.name] = with_settings(getattr(config, f.name), **inner)
        elif f.name in changes:
            updates[f.name] = changes[f.name]
    return replace(config, **updates)  # type: ignore[type-var]
