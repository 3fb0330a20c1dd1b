"""The remote profile: what a config submitted over the network may not hold.

Read on the raw data as submitted, before anything is added to it, imported or looked up on the
server, from the marks the models put on their keys (keys.py: `ServerOnly`, `RemoteValue`).
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AliasChoices, BaseModel

from pytest_gap.config.keys import RemoteValue, ServerOnly
from pytest_gap.config.messages import key_path


def remote_problems(data: Any, model: type[BaseModel], path: tuple = ()) -> list[str]:
    """One line per key of the raw data `data` (of the model `model`, e.g. the whole config)
    that a submitted config may not hold (`ServerOnly`) or holds with a value it may not
    (`RemoteValue`). Read before anything is added to the data and before any of it is
    imported or checked against a catalogue; keys the model does not know are left to it."""
    if not isinstance(data, dict):
        return []
    problems = []
    for key, value in data.items():
        field = _field_named(model, key)
        if field is None:
            continue
        where = key_path((*path, key))
        refused = [m for m in field.metadata if isinstance(m, ServerOnly)]
        for mark in refused:
            problems.append(f"{where}: not allowed in a submitted config ({mark.why}); {mark.fix}")
        for mark in (m for m in field.metadata if isinstance(m, RemoteValue)):
            problem = mark.check(value)
            if problem:
                problems.append(f"{where}: {problem}")
        if not refused:
            problems += _remote_nested(field.annotation, value, (*path, key))
    return problems


def _field_named(model: type[BaseModel], key: Any):
    """The field of `model` that the raw key `key` sets (by name or by a validation alias)."""
    if not isinstance(key, str):
        return None
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        if key == name or key in choices:
            return field
    return None


def _remote_nested(annotation: Any, value: Any, path: tuple) -> list[str]:
    """`remote_problems` of the models inside a value: a model, a mapping or a list of them."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return remote_problems(value, annotation, path)
    if origin is Annotated:
        return _remote_nested(args[0], value, path)
    if origin in (Union, types.UnionType):
        return [p for arg in args for p in _remote_nested(arg, value, path)]
    if origin is dict and isinstance(value, dict):
        return [p for k, v in value.items() for p in _remote_nested(args[1], v, (*path, k))]
    if origin is list and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _remote_nested(args[0], v, (*path, i))]
    return []
