"""docs/deviations.md, the deviations from the spec kept on purpose: each one is listed with its
reason, and each still holds in a real session on the fake backend (tests/fake_backend.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.fake_session import BACKEND, FakeSession

pytest_plugins = ["pytester"]

DEVIATIONS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "deviations.md"
DEVIATIONS = (
    "Trial-grained resume.",
    "The `n_infra` column.",
    "`[privileged]` labels.",
    "`task_NN/workflow/` instead of `<cell>__wf`.",
    "`cell_result.json` for errored cells.",
    "The lead boots the policy servers.",
    "Fixture jitter from the seed, on the vla-eval backend too.",
)


def test_the_docs_list_each_deviation_with_its_reason():
    section = DEVIATIONS_PAGE.read_text()
    bullets = re.split(r"\n- \*\*", section)[1:]
    named = {b.split("**", 1)[0]: b for b in bullets}
    assert list(named) == list(DEVIATIONS)
    assert all("Why:" in b for b in bullets)


def test_each_deviation_holds_in_a_session(pytester):
    fake = FakeSession(pytester)
    fake.config(
        {
            "policies": {"oracle": {"url": "ws://127.0.0.1:9", "privileged_state": True}},
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["workflow", "policy_only"],
                "policies": ["oracle"],
                "task_ids": [0],
                "n_seeds": 2,
                "gate_threshold": 0.0,
                "output_dir": "runs",
                "mode_overrides": {
                    "workflow": {"workflow_dir": "wf"},
                    "policy_only": {"workflow_dir": "wf"},
                },
            },
        }
    )
    fake.run("bench.yaml")  # the oracle's server is down: its cell errors, the run goes on
    run_dir = fake.run_dir()
    header, _, oracle_row = (run_dir / "summary.tsv").read_text().splitlines()[:3]
    columns = header.split("\t")
    # the n_infra column, between n_trials and wall_clock_s
    assert columns[columns.index("n_trials") + 1 : columns.index("n_trials") + 3] == [
        "n_infra",
        "wall_clock_s",
    ]
    oracle = dict(zip(columns, oracle_row.split("\t"), strict=False))
    assert oracle["n_infra"] == "2" and oracle["n_trials"] == "0"
    # ... and the reference loops' rate after the interval columns: the down server's trials
    # count as failures there
    after_intervals = columns.index("completion_ci_high") + 1
    assert columns[after_intervals : after_intervals + 4] == [
        "ref_success_rate",
        "ref_n_trials",
        "ref_success_ci_low",
        "ref_success_ci_high",
    ]
    assert (oracle["ref_success_rate"], oracle["ref_n_trials"]) == ("0.000", "2")
    # the [privileged] label
    assert oracle["policy_id"] == "oracle [privileged]"
    # cell_result.json for the errored cell, with its error
    errored = json.loads((run_dir / "policy_only/oracle/fake/easy/cell_result.json").read_text())
    assert "oracle" in errored["error"]
    # the produced workflow in the cell's task dir, no __wf sibling
    assert (run_dir / "workflow/fake/easy/task_00/workflow/workflow.json").is_file()
    assert not list(run_dir.rglob("*__wf"))
    # trial-grained resume: one trial's record gone, only that trial runs again
    kept = run_dir / "workflow/fake/easy/task_00/seed_000/result.json"
    before = kept.read_text()
    (run_dir / "workflow/fake/easy/task_00/seed_001/result.json").unlink()
    # -rN: the failures once each (CI=1 would repeat them, untruncated, in a short summary)
    resumed = fake.run("bench.yaml", "--gap-resume", "-rN")
    out = resumed.stdout.str()
    assert kept.read_text() == before
    assert (run_dir / "workflow/fake/easy/task_00/seed_001/result.json").is_file()
    assert out.count("recorded by an earlier session, not re-run") == 1, out
