"""The training loop's API (pytest_gap/evaluate.py): policies of this process served on loopback
and scored by an ordinary session on real LIBERO, and the sequential A/B choice between two,
which stops once decided and says `undecided` when the plan runs out."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from pytest_gap import evaluate
from pytest_gap.errors import GapError
from pytest_gap.policies.builtin import HoldPolicy, ScriptedPolicy
from pytest_gap.policies.wire import metadata_digest
from tests.service_configs import policy_only_config


def _config(tmp_path, seeds, max_steps=280):
    data = policy_only_config({}, max_steps, seeds=seeds, n_seeds=None, num_workers=1)
    data["benchmark"]["output_dir"] = "runs"
    path = tmp_path / "checkpoints.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Counting:
    """Zero motion, the gripper open; counts its calls (it runs in this process)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, obs):
        self.calls += 1
        assert set(obs["images"]) == {"agentview", "wrist"} and obs["state"].shape == (8,)
        return np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))


def quit_at_once(obs):
    return {"actions": np.zeros((1, 7), np.float32), "done": True}


def test_policies_of_this_process_are_scored_as_a_session_scores_them(tmp_path):
    fn = Counting()
    summary = evaluate.run(
        _config(tmp_path, [0, 1], max_steps=10),
        {"step_1000": fn, "hold": HoldPolicy()},
        metadata={"checkpoint": "run-a"},
        quiet=True,
    )
    assert [c.policy_id for c in summary.cells] == ["step_1000", "hold"]
    assert [c.n_trials for c in summary.cells] == [2, 2] and summary.success_rate == 0.0
    assert fn.calls == 1 + 2 * 2  # the warm-up, then two 10-step trials of 5-action replies
    records = [json.loads(p.read_text()) for p in sorted(summary.run_dir.rglob("result.json"))]
    served = {
        "policy": "step_1000",
        "served_by": evaluate.SERVED_BY,
        "checkpoint": "run-a",
    }
    digests = {r["policy_id"]: r["policy_digest"] for r in records}
    assert digests["step_1000"] == metadata_digest(served)
    assert all("token=" not in (r["policy_url"] or "") or "***" in r["policy_url"] for r in records)
    assert {r["failure_label"] for r in records} == {"never_reached_target"}


def test_choose_stops_once_the_candidate_is_decided_better(tmp_path):
    choice = evaluate.choose(
        _config(tmp_path, list(range(10))),
        best=quit_at_once,
        candidate=ScriptedPolicy(),  # the oracle: reads ground truth, says so itself
        alpha=0.2,
        block_seeds=2,
        quiet=True,
    )
    assert choice.verdict == "B better"
    (line,) = choice.pairs.values()
    assert line.startswith("policy_only libero/object: B better at n=")
    assert choice.trials_run < choice.trials_planned == 20  # it stopped before the plan's end


def test_choose_is_undecided_when_the_plan_runs_out(tmp_path):
    choice = evaluate.choose(
        _config(tmp_path, [0], max_steps=10), best=HoldPolicy(), candidate=quit_at_once, quiet=True
    )
    assert choice.verdict == "undecided"
    assert choice.trials_run == choice.trials_planned == 2


def test_the_verdict_over_several_pairs_is_the_worst_one():
    assert evaluate.overall_verdict(["B better", "B worse", "undecided"]) == "B worse"
    assert evaluate.overall_verdict(["B better", "undecided"]) == "undecided"
    assert evaluate.overall_verdict(["B better", "B not worse"]) == "B not worse"
    assert evaluate.overall_verdict(["B better", "B better"]) == "B better"
    with pytest.raises(GapError, match="expected some of"):
        evaluate.overall_verdict([])


def test_what_is_not_a_policy_is_refused_in_one_line(tmp_path):
    with pytest.raises(GapError, match="is not a policy: give an object with infer"):
        evaluate.run(_config(tmp_path, [0]), {"bad": 42})
    with pytest.raises(GapError, match="give at least one policy"):
        evaluate.run(_config(tmp_path, [0]), {})
