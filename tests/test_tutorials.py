"""The tutorial reader (tests/tutorial_pages.py) and its coverage: every page of docs/tutorials
has a test file that follows it, so a new page cannot go unrun."""

from __future__ import annotations

import re

from tests.tutorial_pages import PAGES, ROOT, steps


def test_the_tutorial_reader_finds_files_commands_and_expectations():
    found = steps(PAGES / "workflow.md")
    assert ("json", "pick_into/workflow.json") in [(lang, f) for lang, f, _ in found]
    commands = [body for lang, f, body in found if lang == "bash"]
    assert any("# expect: gate PASS" in body for body in commands)


def test_every_tutorial_page_is_followed_by_a_test():
    pages = {p.stem for p in PAGES.glob("*.md")}
    followed = set()
    for test in (ROOT / "tests").glob("test_tutorial_*.py"):
        followed.update(re.findall(r'follow\("([\w-]+)"', test.read_text()))
    assert pages and pages <= followed, f"pages no test follows: {sorted(pages - followed)}"
