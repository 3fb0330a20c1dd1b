"""docs/tutorials/workflow.md, followed top to bottom (tests/tutorial_pages.py)."""

from tests.tutorial_pages import follow


def test_the_workflow_tutorial_runs_top_to_bottom(tmp_path):
    follow("workflow", tmp_path)
