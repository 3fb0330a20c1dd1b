"""User skill packages: skills a user adds without forking pytest-gap.

A skill package is a Python module whose import registers skills with `@skill`
(pytest_gap.skills.registry), exactly as the built-in modules do, so its skills have the same
typed inputs and outputs, the same catalogue entry (`gap skills --json`, the LLM's tool list)
and the same failure rule (raise SkillFailure to take a node's `on_error` edge). Two ways in:
- an installed distribution declares it under the entry point group `pytest_gap.skills`
  (`[project.entry-points."pytest_gap.skills"] acme = "acme_skills"`): every process loads it;
- a config names it under `skills.packages`: an importable module (`acme_skills`) or a
  directory (relative to the config) whose `*.py` files are imported; every process that loads
  the config (the controller and each xdist worker) imports it.

A package that does not import (or registers a skill under a taken name) is one line naming the
package, the key and the error, never a traceback.

This module is how a package is imported. The lookups (catalogue.py) load the installed ones
after the built-in skills, and `catalogue.package_problems` checks a config's `skills.packages`
the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

from pytest_gap.errors import GapError, one_line

ENTRY_POINT_GROUP = "pytest_gap.skills"
# Modules imported from a skills directory live under this prefix in sys.modules (so their
# annotations resolve), named after the file: `<prefix><stem>`.
DIRECTORY_PREFIX = "gap_user_skills_"

_loaded: set[str] = set()  # entries imported in this process (a module name or a directory)
_entry_points_done = False


class SkillPackageError(GapError, ImportError):
    """A skill package could not be loaded: one line naming it and why."""


def _failed(where: str, name: str, exc: BaseException) -> SkillPackageError:
    why = one_line(f"{type(exc).__name__}: {exc}", 300)
    return SkillPackageError(
        f"{where}: skill package {name!r} failed to load ({why}); fix the package or remove it"
    )


def load_entry_points() -> None:
    """Import every installed package of the `pytest_gap.skills` group (once per process)."""
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True  # first: a package that looks skills up must not recurse
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            point.load()
        except Exception as exc:
            _entry_points_done = False  # say it again on the next look, do not forget it
            where = f"entry point {ENTRY_POINT_GROUP}:{point.name} = {point.value}"
            raise _failed(where, point.value, exc) from None


def is_directory_entry(entry: str) -> bool:
    """A path (has a separator, or starts with `.` or `~`), not a dotted module name."""
    return "/" in entry or entry.startswith((".", "~"))


def load_package(entry: str, base: Path, where: str) -> None:
    """Import one `skills.packages` entry: a module name, or a directory (relative to `base`)."""
    if is_directory_entry(entry):
        directory = (base / Path(entry).expanduser()).resolve()
        if str(directory) in _loaded:
            return
        if not directory.is_dir():
            raise SkillPackageError(
                f"{where}: skill directory {entry!r} ({directory}) does not exist; give a "
                "directory of skill modules (*.py) or an importable module name"
            )
        for path in sorted(directory.glob("*.py")):
            _import_file(path, where)
        _loaded.add(str(directory))
        return
    if entry in _loaded:
        return
    try:
        importlib.import_module(entry)
    except Exception as exc:
        raise _failed(where, entry, exc) from None
    _loaded.add(entry)


def _import_file(path: Path, where: str) -> None:
    name = DIRECTORY_PREFIX + path.stem
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise _failed(where, str(path), exc) from None
