"""docs/tutorials/scale-out.md, followed top to bottom (tests/tutorial_pages.py).

The page's Ray head runs as `ray start --head --block` in the background of its own block, not
as a daemon: it is in that block's process group, which the block's trap ends (and the reader
stops at the page's end, passed or failed), with its files in a temp dir of its own. So no
`ray stop` here, which would stop every Ray process of the machine (another test's cluster)."""

from tests.tutorial_pages import follow


def test_the_scale_out_tutorial_runs_top_to_bottom(tmp_path):
    follow("scale-out", tmp_path)
