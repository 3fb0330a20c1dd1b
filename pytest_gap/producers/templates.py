"""The workflow templates shipped inside the package (pytest_gap/templates/<name>/).

A template is a workflow directory with {{policy_id}} / {{target}} / {{container}} / {{items}}
placeholders, filled per task by the prebuilt producer. A config names one with
`mode_overrides.<mode>.template: <name>`; `gap run --template <name>` runs one. They ship in
the wheel, so an installed package needs no checkout of the repository's examples/.
"""

from __future__ import annotations

import difflib
from importlib.resources import files
from pathlib import Path

from pytest_gap.errors import GapError
from pytest_gap.workflow.schema import WORKFLOW_FILE


class UnknownTemplate(GapError, ValueError):
    """A template name that is not shipped."""


def templates_root() -> Path:
    return Path(str(files("pytest_gap") / "templates"))


def template_names() -> list[str]:
    root = templates_root()
    return sorted(p.name for p in root.iterdir() if (p / WORKFLOW_FILE).is_file())


def unknown_template(name: str) -> str:
    """Why `name` is no template, with the fix ("did you mean" or the list)."""
    names = template_names()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(names)}"
    return f"unknown template {name!r}; {hint}"


def template_dir(name: str) -> Path:
    """The directory of the shipped template `name`; raises UnknownTemplate."""
    if name not in template_names():
        raise UnknownTemplate(unknown_template(name))
    return templates_root() / name
