"""Names that become paths: one strict pattern for every name a run dir is made of.

A run id, a policy registry key, a mode, a family, a variation or a suite name becomes a
directory of a run (`<run dir>/<mode>/<policy id>/<family>/<variation>/task_NN/seed_NNN`) or a
file name in it. Each of them matches one strict pattern, checked wherever such a name enters
(a config file, a submission, a hello frame), so a `..`, a separator or a control character
never reaches a path. layout.py's `inside` is the second lock, for what the name check missed.
"""

from __future__ import annotations

import re

from pytest_gap.errors import one_line

# A letter or digit, then letters, digits, `_`, `.`, `-`: never `.`/`..`, a separator, a space,
# a control character or a hidden file; at most 100 characters, well inside any file system's.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
NAME_RULE = "use letters, digits, '_', '.' and '-' (at most 100, starting with a letter or digit)"


def is_name(value: object) -> bool:
    """Whether `value` is a string that may become a path part (fullmatch: no trailing `\\n`)."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def name_problem(value: object, what: str) -> str | None:
    """Why `value` cannot name a `what` (it becomes a directory), or None."""
    if is_name(value):
        return None
    return f"{what} {one_line(repr(value), 60)}: {NAME_RULE}; it names a directory of the run"


def check_name(value: object, what: str) -> str:
    """`value`, if it can be a path part; ValueError (one line) otherwise (pydantic validators
    raise it so that the key is named)."""
    problem = name_problem(value, what)
    if problem:
        raise ValueError(problem)
    return value  # type: ignore[return-value]
