"""YAML text -> plain data, for files and for text that arrived over the network alike.

The reader refuses, each with one line and before anything is built: a file too big, not
UTF-8, empty or not YAML; tags that are not plain data (`!!python/object`, `!include`); a key
given twice in one mapping; aliases that contain themselves or expand past a bound (an alias
bomb); nesting deeper than the parser's recursion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pytest_gap.config.messages import EMPTY_HINT, ConfigError, capped, key_path
from pytest_gap.errors import one_line

# A benchmark config is a page or two of YAML. A far bigger file is something else (a log, a
# dataset, a wrong path): it is refused before it is parsed.
MAX_CONFIG_BYTES = 1 << 20
# What the data may expand to, YAML aliases expanded, in values (scalars, lists, mappings). A real
# config has hundreds; an alias bomb ("billion laughs") reaches billions from a few lines and is
# refused from its node graph, before any of it is built or validated.
MAX_CONFIG_VALUES = 100_000
# The tags yaml.safe_load knows (str, int, map, ...). Any other tag (`!!python/object`, `!include`)
# is named with its key: a config is plain data.
_SAFE_TAGS = frozenset(tag for tag in yaml.SafeLoader.yaml_constructors if tag is not None)


def read_yaml(path: Path) -> Any:
    """The data of a YAML file, or ConfigError (one line per problem, none a traceback) for a
    file that is unreadable, too big, not UTF-8, empty, not YAML, tagged with anything but plain
    data tags, holding a key twice, or an alias bomb."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(source, ["is a directory; give a benchmark YAML file"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read the file: {exc.strerror}"]) from None
    if len(raw) > MAX_CONFIG_BYTES:
        size = _file_size(path, len(raw))
        raise ConfigError(
            source,
            [
                f"the file is {size}, over the {MAX_CONFIG_BYTES >> 20} MiB limit of a benchmark "
                "config; is it the right file?"
            ],
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            source,
            [
                f"line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start});"
                " a benchmark config is a YAML text file: check the path, or save it as UTF-8"
            ],
        ) from None
    return _yaml_data(text, source)


def read_yaml_text(text: str, source: str) -> Any:
    """The data of a config that arrived as text (a submission), through `read_yaml`'s checks:
    the same size limit, tags, duplicate keys, depth and alias bombs, the same messages."""
    size = len(text) if len(text) > MAX_CONFIG_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_CONFIG_BYTES:  # more characters than the limit's bytes: over it, uncounted
        shown = f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"
        raise ConfigError(
            source,
            [
                f"the config is {shown}, over the {MAX_CONFIG_BYTES >> 20} MiB limit of a "
                "benchmark config; is it the right file?"
            ],
        )
    return _yaml_data(text, source)


def _yaml_data(text: str, source: str) -> Any:
    """Compose the node graph, check it (`_node_problems`), and only then build the data."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [_yaml_problem(exc, text)]) from None
    except RecursionError:
        raise ConfigError(
            source, ["nested too deeply to be a benchmark config; check the brackets"]
        ) from None
    if node is None:
        raise ConfigError(source, [EMPTY_HINT])
    problems = _node_problems(node)
    if problems:
        raise ConfigError(source, problems)
    try:
        return yaml.SafeLoader("").construct_document(node)
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # `!!int abc`, a bad `<<:` merge
        raise ConfigError(source, [_yaml_problem(exc)]) from None


def _file_size(path: Path, read: int) -> str:
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    size = max(size, read)
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"


def _yaml_problem(exc: Exception, text: str = "") -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark else ""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses (a NUL byte)
        where = f"line {text[: exc.position].count(chr(10)) + 1}: "
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"{where}not valid YAML: {one_line(problem)}"


def _tag_name(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org") else tag


def _node_problems(root: yaml.Node) -> list[str]:
    """Walk the composed node graph once (an alias is the node it names, visited once): tags
    that are not plain data, keys given twice in one mapping, aliases that contain themselves,
    and the size the data would expand to (each node's expanded size, memoized)."""
    tags: list[str] = []
    duplicates: list[str] = []
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    class _Refused(Exception):
        pass

    def walk(node: yaml.Node, path: tuple) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _Refused(
                f"{key_path(path)}: line {node.start_mark.line + 1}: a YAML alias that contains "
                "itself (an endless value); remove the alias"
            )
        if node.tag not in _SAFE_TAGS:
            tags.append(
                f"{key_path(path)}: line {node.start_mark.line + 1}: the YAML tag "
                f"{one_line(_tag_name(node.tag), 60)} is not allowed (a benchmark config is "
                "plain data: no tags that build objects or include files); remove the tag"
            )
        open_nodes.add(id(node))
        size = 1
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                size += walk(child, (*path, i))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                if isinstance(key_node, yaml.ScalarNode) and key != "<<":
                    line = key_node.start_mark.line + 1
                    if key in seen:
                        duplicates.append(
                            f"{key_path((*path, key))}: the key is given twice (lines "
                            f"{seen[key]} and {line}); YAML would keep only the last: keep one"
                        )
                    seen.setdefault(key, line)
                size += walk(key_node, (*path, key)) + walk(value_node, (*path, key))
        open_nodes.discard(id(node))
        if size > MAX_CONFIG_VALUES:
            raise _Refused(
                f"{key_path(path)}: expands to over {MAX_CONFIG_VALUES} values through YAML "
                "aliases (an alias bomb?); a benchmark config is far smaller: write it out "
                "without the nested aliases"
            )
        sizes[id(node)] = size
        return size

    try:
        walk(root, ())
    except _Refused as refused:
        return [str(refused)]
    except RecursionError:
        return ["nested too deeply to be a benchmark config; check the brackets"]
    return capped(tags) + capped(duplicates)
