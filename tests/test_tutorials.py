"""Every tutorial of the docs site (docs/tutorials/*.md) followed top to bottom, as its reader
would, in an empty directory: a fenced block after `<!-- file: PATH -->` is written to PATH, a
```bash block is run with the repository's .venv/bin first on PATH, and each `# expect: TEXT`
line in it must appear in that block's output. A page whose commands stop working fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
# The tutorials run real episodes on this simulator (and say so; tests/tiers.py reads it here).
SIMULATOR = "libero"
BLOCK = re.compile(r"(?:<!-- file: (?P<file>[^ ]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def steps(page: Path) -> list[tuple[str, str | None, str]]:
    """(language, file to write or None, body) of each fenced block, in page order."""
    return [(m["lang"], m["file"], m["body"]) for m in BLOCK.finditer(page.read_text())]


def test_the_tutorial_reader_finds_files_commands_and_expectations():
    (page,) = [p for p in TUTORIALS if p.name == "workflow.md"]
    found = steps(page)
    assert ("json", "pick_into/workflow.json") in [(lang, f) for lang, f, _ in found]
    commands = [body for lang, f, body in found if lang == "bash"]
    assert any("# expect: gate PASS" in body for body in commands)


@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_a_tutorial_runs_top_to_bottom(page, tmp_path):
    assert SIMULATOR in page.read_text().lower()  # a CPU reader learns what it will run
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "GAP_NO_PLOTS": "1",
    }
    for lang, file, body in steps(page):
        if file:
            (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / file).write_text(body)
            continue
        if lang != "bash":
            continue
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{page.name}: {body}\n{out[-3000:]}"
        for expected in re.findall(r"^# expect: (.+)$", body, re.M):
            assert expected in out, f"{page.name}: {body}\nwanted {expected!r} in:\n{out[-3000:]}"
