"""Follow a tutorial page of the docs site (docs/tutorials/*.md) top to bottom, as its reader
would, in an empty directory: a fenced block after `<!-- file: PATH -->` is written to PATH, a
```bash block is run with the repository's .venv/bin first on PATH, and each `# expect: TEXT`
line in it must appear in that block's output. A page whose commands stop working fails its
test (one test file per page, tests/test_tutorial_*.py, so xdist spreads them over workers)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "tutorials"
# The tutorials run real episodes on this simulator (and say so; tests/tiers.py reads it here).
SIMULATOR = "libero"
BLOCK = re.compile(r"(?:<!-- file: (?P<file>[^ ]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def steps(page: Path) -> list[tuple[str, str | None, str]]:
    """(language, file to write or None, body) of each fenced block, in page order."""
    return [(m["lang"], m["file"], m["body"]) for m in BLOCK.finditer(page.read_text())]


def follow(name: str, workdir: Path) -> None:
    """Run docs/tutorials/NAME.md in WORKDIR. Each bash block runs in a process group of its own;
    whatever a block leaves running in the background (a server the page starts with `&`) is
    stopped when the page ends, passed or failed. Secrets the `gap` doors write go under WORKDIR
    (XDG_STATE_HOME), not the user's home."""
    page = PAGES / f"{name}.md"
    assert SIMULATOR in page.read_text().lower()  # a CPU reader learns what it will run
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "GAP_NO_PLOTS": "1",
        "XDG_STATE_HOME": str(workdir / ".state"),
        "GAP_REPO": str(ROOT),  # where a page that imports examples/ finds them
    }
    groups: list[int] = []
    try:
        for lang, file, body in steps(page):
            if file:
                (workdir / file).parent.mkdir(parents=True, exist_ok=True)
                (workdir / file).write_text(body)
                continue
            if lang != "bash":
                continue
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", body], cwd=workdir, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )  # fmt: skip
            groups.append(proc.pid)
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"{page.name}: {body}\n{out[-3000:]}"
            for expected in re.findall(r"^# expect: (.+)$", body, re.M):
                wanted = f"{page.name}: {body}\nwanted {expected!r} in:\n{out[-3000:]}"
                assert expected in out, wanted
    finally:
        _stop(groups)


def _stop(groups: list[int]) -> None:
    """SIGTERM to every group still holding a process, then, a second later, SIGKILL to those
    that outlived it."""
    if _signal(groups, signal.SIGTERM):
        time.sleep(1.0)
        _signal(groups, signal.SIGKILL)


def _signal(groups: list[int], sig: signal.Signals) -> bool:
    """Send `sig` to each group; whether any group still had a process."""
    alive = False
    for group in groups:
        try:
            os.killpg(group, sig)
            alive = True
        except (ProcessLookupError, PermissionError):
            pass
    return alive
