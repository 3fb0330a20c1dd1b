"""docs/tutorials/learned-policy.md, followed top to bottom (tests/tutorial_pages.py): demos
recorded as a dataset, a network trained on them, two checkpoints scored and chosen between."""

import json

from pytest_gap.results import scan_results
from tests.tutorial_pages import follow


def test_the_learned_policy_tutorial_runs_top_to_bottom(tmp_path):
    follow("learned-policy", tmp_path)
    (demos,) = (tmp_path / "runs/demos").iterdir()
    info = json.loads((demos / "dataset/meta/info.json").read_text())
    assert info["total_episodes"] == sum(r.success for r in scan_results(demos).values()) > 0
    # the session's run, then choose()'s (the same config, so the same output_dir)
    scored, chosen = sorted((tmp_path / "runs/held_out").iterdir())
    records = scan_results(scored)
    assert {r.policy_id for r in scan_results(chosen).values()} <= {"best", "candidate"}
    assert sorted(r.policy_id for r in records.values()) == ["early", "late"]
    assert not any(r.errored for r in records.values())
    # each checkpoint answered its own row: two files, two digests
    assert len({r.policy_digest for r in records.values()}) == 2
