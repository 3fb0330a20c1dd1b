"""The skill catalogue: the skills pytest-gap ships, and every lookup of a skill by name.

The built-in skill modules register their skills (`@skill`, registry.py) when imported. Every
lookup imports them first, then the installed user skill packages (packages.py, the entry
point group `pytest_gap.skills`), so a package cannot take a built-in's name unnoticed: its
`@skill` fails naming both. `package_problems` checks a config's own `skills.packages` the
same way, after the built-ins and the installed ones.

The built-in modules are imported on the first lookup, not with this module: workflow/schema.py
imports the lookups, and through it the runner and the producers, and a process that never
looks a skill up need not pay a third of a second for every skill module. None of them imports
this module: the deferred import closes no circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_gap.skills.packages import SkillPackageError, load_entry_points, load_package
from pytest_gap.skills.registry import SkillSpec, registered, registered_names


def load_builtin_skills() -> None:
    """Register every built-in skill (importing its module does), then the installed packages'
    (once per process)."""
    # Deferred to the first lookup (see the module's docstring); importing twice is a no-op.
    from pytest_gap.skills import (  # noqa: F401
        articulation,
        basic,
        grasp,
        items,
        place,
        policy,
        push,
        steps,
        switches,
    )

    load_entry_points()  # installed user skill packages (entry point group pytest_gap.skills)


def get_skill(name: str) -> SkillSpec | None:
    load_builtin_skills()
    return registered(name)


def skill_names() -> list[str]:
    load_builtin_skills()
    return registered_names()


def catalogue() -> list[dict[str, Any]]:
    """Every skill's typed signature, machine-readable (the LLM's tool list)."""
    return [get_skill(n).describe() for n in skill_names()]


def package_problems(entries: object, base: Path) -> list[str]:
    """Load a config's `skills.packages`; one problem line per package that did not load
    (a malformed value is the config model's to report)."""
    problems = []
    try:
        skill_names()  # the built-ins first (a package may not take their names), installed ones
    except SkillPackageError as exc:
        problems.append(str(exc))
    if not isinstance(entries, list):
        return problems
    for index, entry in enumerate(entries):
        if isinstance(entry, str) and entry:
            try:
                load_package(entry, base, f"skills.packages[{index}]")
            except SkillPackageError as exc:
                problems.append(str(exc))
    return problems
