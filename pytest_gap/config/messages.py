"""How config problems read: one line each, naming the file and the key path, all at once.

`ConfigError` carries every problem of a config; `describe_all` turns pydantic's errors into
such lines (under the key the user wrote, values masked under secret names, never a vast value
spelled out).
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel

from pytest_gap.errors import GapError, one_line
from pytest_gap.redaction import is_secret_name, redact_tree

MAX_LISTED = 20  # problems of one kind listed before "... and N more"
EMPTY_HINT = (
    "the file is empty; a benchmark config needs a benchmark: block (grid shape) or a suites: "
    "list (suites shape), see examples/benchmark/"
)


class ConfigError(GapError, ValueError):
    """A benchmark YAML that cannot be used; the message lists every problem, one per line.

    At most `MAX_LISTED` of them, then how many more: a list of a hundred thousand wrong
    values (written out, or through aliases) is one short message, not one line each."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = capped(problems)
        super().__init__("\n".join(f"{source}: {p}" for p in self.problems))


def capped(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_LISTED:
        return problems
    return [*problems[:MAX_LISTED], f"... and {len(problems) - MAX_LISTED} more like these"]


def key_path(loc: tuple) -> str:
    return ".".join(_key_part(p) for p in loc) or "(top level)"


def _key_part(part: Any) -> str:
    """A key as the message shows it: as written, unless it would break the one line (spaces,
    control characters) or run on (quoted, shortened)."""
    text = str(part)
    if text and text.isprintable() and " " not in text and len(text) <= 60:
        return text
    return repr(one_line(text, 60))


def describe_all(errors: list[dict], data: Any, root: type[BaseModel]) -> list[str]:
    """One line per offending key of `data` (validated as the model `root`). A value that fits
    none of a union's types (`command:` is a list or a string) gives pydantic one error per
    member, each under a loc with the member's type in it (`command.list[str]`): those become
    one line, under the key the user wrote."""
    grouped: dict[tuple, list[dict]] = {}
    for error in errors:
        loc = _data_loc(error["loc"], data, error["type"])
        grouped.setdefault(loc, []).append({**error, "loc": loc})
    lines = []
    for group in grouped.values():
        if len(group) == 1:
            lines.append(_describe(group[0], root))
            continue
        messages = list(dict.fromkeys(_message(e) for e in group))
        value = group[0].get("input")
        shown = _shown(group[0]["loc"], value)
        got = "" if isinstance(value, dict | list) else f" (got {shown})"
        lines.append(f"{key_path(group[0]['loc'])}: {'; or '.join(messages)}{got}")
    return lines


def _data_loc(loc: tuple, data: Any, kind: str) -> tuple:
    """`loc` without the parts that are not keys of the data (a union member's type name); a
    missing key's own name stays."""
    if len(loc) >= 2 and loc[-1] == "[key]":  # a mapping's key is wrong: name its mapping
        return _data_loc(loc[:-2], data, kind)
    kept, current = [], data
    for i, part in enumerate(loc):
        in_dict = isinstance(current, dict) and part in current
        in_list = isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        if in_dict or in_list:
            kept.append(part)
            current = current[part]
        elif i == len(loc) - 1 and kind == "missing":
            kept.append(part)
    return tuple(kept)


def _shown(loc: tuple, value: Any) -> str:
    """The offending value as an error shows it: masked under a secret name (`api_key: 123`
    is a wrong type, and still a key), with url passwords and tokens masked, on one line."""
    if loc and is_secret_name(str(loc[-1])):
        return "'***'"
    if isinstance(value, dict | list | tuple | set):  # never walked: aliases may make it vast
        return f"a {type(value).__name__} of {len(value)}"
    return one_line(repr(redact_tree(value)), 80)


def _message(error: dict) -> str:
    return one_line(error["msg"].removeprefix("Value error, "), 200)


def _describe(error: dict, root: type[BaseModel]) -> str:
    loc = error["loc"]
    if error["type"] == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        fields = _fields_at(parent, root)
        close = difflib.get_close_matches(str(key), fields, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "remove it"
        return f"{key_path(loc)}: unknown key; {hint}"
    if error["type"] == "missing":
        return f"{key_path(loc)}: a required key is missing; add it"
    message = _message(error)
    value = error.get("input")
    shown = _shown(loc, value)
    got = "" if isinstance(value, dict | list) or shown in message else f" (got {shown})"
    return f"{key_path(loc)}: {message}{got}"


def _fields_at(loc: tuple, root: type[BaseModel]) -> list[str]:
    """The known keys of the model at `loc` under `root` (for "did you mean" hints)."""
    model: Any = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            # dict[str, Model] value: the key is user data, keep the same model's value type
            continue
        model = _model_of(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
