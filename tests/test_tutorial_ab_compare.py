"""docs/tutorials/ab-compare.md, followed top to bottom (tests/tutorial_pages.py)."""

from tests.tutorial_pages import follow


def test_the_ab_compare_tutorial_runs_top_to_bottom(tmp_path):
    follow("ab-compare", tmp_path)
