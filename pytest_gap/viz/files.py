"""Reading a run dir as data: regular files only, each under a size cap, and every path a
record names confined to the run dir (`confined`), so the report reads, inlines and links
nothing else of the user's. A run dir is data, like a socket: whoever wrote it chose its paths.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
MAX_READ_BYTES = 64 * 1024 * 1024  # one trace, record or agent file (real ones: kB to a few MB)


def read_text(path: Path) -> str | None:
    """A regular file's text, or None: a FIFO or device would block or never end, and a file
    past MAX_READ_BYTES would be read whole into memory (a run dir is data, like a socket)."""
    try:
        if not path.is_file():
            return None
        if path.stat().st_size > MAX_READ_BYTES:
            log.warning("gap viz: %s is over %d bytes; not read", path, MAX_READ_BYTES)
            return None
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_json(path: Path) -> Any:
    try:
        text = read_text(path)
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, symlinks followed, lies in `root` (itself resolved)."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
        return False


def confined(root: Path, rel: str | None, what: str = "path") -> Path | None:
    """`root / rel` resolved, when `rel` is a relative path that stays in `root` (the run dir)
    once `..` and symlinks are followed; else None, with one warning line naming it.

    Paths in result.json are data a run dir (or whoever handed it over) wrote: an absolute one
    or one that climbs out would make the report read, inline or link any file of the user's
    (`/etc/passwd`, `../../.ssh`), so it is refused, not resolved."""
    if not rel:
        return None
    root = root.resolve()
    candidate = Path(rel)
    if candidate.is_absolute() or not inside(root / candidate, root):
        log.warning(
            "gap viz: %s %r is not a path inside the run dir %s; not read or linked (record "
            "paths relative to the run dir)",
            what,
            rel,
            root,
        )
        return None
    return (root / candidate).resolve()


def files_in(directory: Path, pattern: str) -> list[Path]:
    """`directory`'s files matching `pattern` that resolve inside it: a symlink in a trace dir
    pointing elsewhere is not read."""
    root = directory.resolve()
    return sorted(p for p in directory.glob(pattern) if p.is_file() and inside(p, root))


def relative(path: Path | None, base: Path) -> str | None:
    """`path` as the page links it from `base` (POSIX, `..` where needed); None if it is gone."""
    if path is None or not path.exists():
        return None
    return Path(os.path.relpath(path, base)).as_posix()
