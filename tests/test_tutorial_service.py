"""docs/tutorials/service.md, followed top to bottom (tests/tutorial_pages.py)."""

from tests.tutorial_pages import follow


def test_the_service_tutorial_runs_top_to_bottom(tmp_path):
    follow("service", tmp_path)
