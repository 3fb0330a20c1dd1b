"""Every key of a benchmark config, read from the models themselves: what the docs site's config
reference is generated from (scripts/docs_hooks.py), so it cannot drift from what is validated.

A key's description is its Field description, else the comment lines right above its line in
the model's source, else its trailing comment; a section's is its model's docstring.
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic_core import PydanticUndefined


class KeyRow(typing.NamedTuple):
    key: str  # dotted, `<id>` for a mapping's keys and `[]` for a list's items
    type: str
    default: str
    allowed: str  # a Literal's values or a number's bounds; "" where free
    description: str


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the comments that describe it in the model's own source."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comment_at: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comment_at[token.start[0]] = token.string.lstrip("#").strip()
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comment_at.get(line, ""))
            line -= 1
        inline = [comment_at[n] for n in range(node.lineno, node.end_lineno + 1) if n in comment_at]
        found[node.target.id] = " ".join(above or inline)
    return found


def _name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _name(get_args(annotation)[0])
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(v).__name__ for v in get_args(annotation)))
    if origin in (Union, types.UnionType):
        return " | ".join(_name(a) for a in get_args(annotation))
    if origin is not None:
        inner = ", ".join(_name(a) for a in get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _allowed(annotation: Any, metadata: list) -> str:
    """A Literal's values, or the bounds a field or its type sets."""
    for arg in [annotation, *_flat(annotation)]:
        if get_origin(arg) is Literal:
            return ", ".join(repr(v) for v in get_args(arg))
    bounds = []
    for mark in [*metadata, *_marks(annotation)]:
        for kind, attr, sign in (
            (Ge, "ge", ">="),
            (Gt, "gt", ">"),
            (Le, "le", "<="),
            (Lt, "lt", "<"),
        ):
            if isinstance(mark, kind):
                bounds.append(f"{sign} {getattr(mark, attr)}")
    return ", ".join(dict.fromkeys(bounds))


def _flat(annotation: Any) -> list:
    if get_origin(annotation) in (Union, types.UnionType, typing.Annotated):
        return [x for a in get_args(annotation) for x in [a, *_flat(a)]]
    return []


def _marks(annotation: Any) -> list:
    if get_origin(annotation) is typing.Annotated:
        return list(get_args(annotation)[1:])
    return [m for a in _flat(annotation) for m in _marks(a)]


def _nested(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """(suffix, model) where a key holds a model, a mapping of them or a list of them."""
    if get_origin(annotation) is typing.Annotated:
        return _nested(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "", annotation
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            found = _nested(arg)
            if found:
                return found
    if origin is dict:
        found = _nested(get_args(annotation)[1])
        return (".<id>" + found[0], found[1]) if found else None
    if origin is list:
        found = _nested(get_args(annotation)[0])
        return ("[]" + found[0], found[1]) if found else None
    return None


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default if field.default_factory is None else field.default_factory()
    if isinstance(value, BaseModel):
        return "(its keys' defaults)"
    return (
        "null" if value is None else repr(value if not hasattr(value, "as_posix") else str(value))
    )


def _own_doc(model: type[BaseModel]) -> str:
    """The first paragraph of the model's own docstring (never pydantic's BaseModel's)."""
    doc = model.__dict__.get("__doc__") or ""
    return inspect.cleandoc(doc).split("\n\n")[0] if doc else ""


def key_rows(model: type[BaseModel], prefix: str = "") -> list[KeyRow]:
    """Every key under `model`, depth first in declaration order; excluded fields left out."""
    rows = []
    comments = _comments(model)
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = f"{prefix}{field.alias or name}"
        description = field.description or comments.get(name, "")
        nested = _nested(field.annotation)
        rows.append(
            KeyRow(
                key=key,
                type=_name(field.annotation),
                default=_default(field),
                allowed=_allowed(field.annotation, field.metadata),
                description=description or (_own_doc(nested[1]) if nested else ""),
            )
        )
        if nested:
            rows += key_rows(nested[1], f"{key}{nested[0]}.")
    return rows


def table_cell(text: object) -> str:
    """Text for one Markdown table cell: one line, pipes escaped, and `<`, `>`, `&` escaped
    outside code spans (Markdown would take `<run dir>` for an HTML tag and drop it; inside a
    code span it shows them as they are, and would show an escape as typed)."""
    parts = " ".join(str(text or "").split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def markdown_table(rows: list[KeyRow]) -> str:
    cell = table_cell
    lines = ["| key | type | default | allowed | what it does |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| `{r.key}` | {cell(r.type)} | {cell(f'`{r.default}`')} | {cell(r.allowed)} | "
        f"{cell(r.description)} |"
        for r in rows
    ]
    return "\n".join(lines)
