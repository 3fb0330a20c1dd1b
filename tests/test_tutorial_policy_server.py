"""docs/tutorials/policy-server.md, followed top to bottom (tests/tutorial_pages.py)."""

from tests.tutorial_pages import follow


def test_the_policy_server_tutorial_runs_top_to_bottom(tmp_path):
    follow("policy-server", tmp_path)
