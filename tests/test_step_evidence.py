"""Per-step evidence of policy trials (sim/step_log.py) and the failure labels read from it
(sim/failure_labels.py): on real LIBERO through run_policy and a policy server on loopback,
through vla-eval's own episode loop against a server built from vla-eval's classes, and in a
whole pytest session's records and summaries."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from vla_eval.model_servers.predict import PredictModelServer

from bench.twin import MessageLog, Served
from pytest_gap.policies.builtin import HoldPolicy, ReplayPolicy, ScriptedPolicy
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.policies.server import PolicyServer
from pytest_gap.producers.templates import template_dir
from pytest_gap.sim.backend import EnvOptions, get_backend
from pytest_gap.sim.failure_labels import FAILURE_LABELS, failure_label
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.step_log import STEPS_FILE, StepLog, goal_objects, read_steps
from pytest_gap.skills.policy import privileged_state
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow
from tests.service_configs import served_hold_config

pytest_plugins = ["pytester"]

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
BUDGET = 40
CHUNK = 5  # run_policy's replan_every in the templates
TARGET = "alphabet_soup_1"  # libero_object task 0's goal object


@pytest.fixture(scope="module")
def env():
    with make_env("libero_object", 0, EnvOptions(max_steps=BUDGET)) as env:
        yield env


class Remembering:
    """Each reply a chunk of CHUNK distinct actions (x encodes reply and place in it), the
    gripper closed for two replies, then open; remembers the state each observation carried
    and the actions it sent."""

    def __init__(self):
        self.states, self.sent = [], []

    def fork(self):
        return self

    def infer(self, obs: dict) -> dict:
        n = len(self.states)
        self.states.append(np.asarray(obs["state"], np.float32))
        actions = np.zeros((CHUNK, 7), np.float32)
        actions[:, 0] = 0.01 * n + 0.001 * np.arange(CHUNK)
        actions[:, 2] = 0.3
        actions[:, 6] = 0.7 if n % 4 < 2 else -0.7
        self.sent.append(actions)
        return {"actions": actions}


def _policy_only(env, policy, seed: int = 0, privileged: bool = False):
    env.reset(seed)
    log = StepLog(env.scene, goal_objects(env.episode.goal))
    template = load_workflow(template_dir("policy_only"), {"policy_id": "p"})
    with PolicyServer(policy).start() as server:
        endpoint = PolicyEndpoint(url=server.url, obs_format="gap", privileged=privileged)
        run = run_workflow(template, env, policies={"p": endpoint}, step_log=log)
    assert not run.infra_failure, run.error
    return run, log


def test_every_control_step_of_a_policy_trial_is_recorded_with_the_reply_it_came_from(
    env, tmp_path
):
    policy = Remembering()
    run, log = _policy_only(env, policy)
    steps = log.columns()
    assert len(log) == run.steps and list(steps["step"]) == list(range(1, run.steps + 1))
    # the bring-up's steps come first and are no reply's; then chunks of CHUNK, in order
    bring_up = run.bringup_steps
    assert (steps["reply"][:bring_up] == -1).all()
    replies = steps["reply"][bring_up:]
    assert list(replies) == [i // CHUNK for i in range(len(replies))]
    assert replies[-1] + 1 == len(policy.sent) == (BUDGET // CHUNK)
    # each step's action is what the policy sent for it
    np.testing.assert_array_equal(steps["action"][bring_up:], np.concatenate(policy.sent))
    # the state before a reply's first step is the state its observation carried
    for reply, seen in enumerate(policy.states):
        first = bring_up + reply * CHUNK
        np.testing.assert_allclose(steps["state"][first], seen, atol=1e-6)
    # each row's state is the one the step before it left: the hand climbs (dz 0.3)
    assert steps["state"][-1][2] > steps["state"][bring_up][2] + 0.02
    # the gripper as executed ramps toward the command's sign, a step at a time
    gripper = steps["gripper"][bring_up:]
    sign = np.sign(steps["action"][bring_up:, 6])
    assert np.all(np.diff(gripper) * sign[1:] >= -1e-6)  # never away from the command
    assert 0 < np.abs(np.diff(gripper)).max() < 1.0  # in ramps, not jumps
    assert gripper[2 * CHUNK - 1] == pytest.approx(1.0) and gripper[-1] == pytest.approx(-1.0)
    assert not steps["done"].any() and not steps["reward"].any()
    assert np.isfinite(steps["target_dist"]).all() and steps["target_dist"].min() > 0.05
    # the file gives back what was recorded
    back = read_steps(log.write(tmp_path / STEPS_FILE))
    assert set(back) == set(steps)
    for name, column in steps.items():
        if column.dtype == object:
            assert list(back[name]) == list(column)
        else:
            np.testing.assert_array_equal(back[name], column)
    schema = pq.read_schema(tmp_path / STEPS_FILE)
    assert str(schema.field("action").type) == "fixed_size_list<element: float>[7]"


class Climbing(MessageLog, PredictModelServer):
    """vla-eval's own server classes: one action per observation, up, with a gripper entry
    vla-eval's LIBERO adapter snaps to -1; asks for the state, remembers each one it got."""

    def __init__(self):
        super().__init__()
        self.states: list[np.ndarray] = []

    def get_observation_params(self):
        return {"send_state": True}

    def predict(self, obs, ctx):
        self.states.append(np.asarray(obs["states"], np.float32))
        return {"actions": np.array([0, 0, 0.4, 0, 0, 0, -0.3], np.float32)}


def test_vla_evals_own_loop_records_each_step_through_its_recorder_its_messages_unchanged():
    short = 12
    model = Climbing()
    env = get_backend("vla-eval").make_env("libero_object", 0, EnvOptions(max_steps=short))
    try:
        with Served(model) as served:
            outcome = env.run_episode(3, url=f"ws://127.0.0.1:{served.port}")
    finally:
        env.close()
    assert not outcome.success and outcome.steps == short
    log = outcome.step_log
    steps = log.columns()
    assert len(log) == short and list(steps["reply"]) == list(range(short))
    # the action as vla-eval's adapter executed it: its gripper entry snapped to -1
    np.testing.assert_array_equal(steps["action"][:, 6], -np.ones(short))
    np.testing.assert_allclose(steps["action"][:, 2], 0.4)
    # the state before each step is the one that step's observation carried
    assert len(model.states) == short
    np.testing.assert_allclose(steps["state"], np.stack(model.states), atol=1e-5)
    assert (steps["gripper"] == -1.0).all() and log.targets == (TARGET,)
    assert np.isfinite(steps["target_dist"]).all() and (steps["grasped"] == None).all()  # noqa: E711
    # the loop's messages are vla-eval's own: the inactive recorder adds no recording payload
    (stream,) = model.streams(1)
    kinds = [kind for kind, _ in stream]
    assert kinds == ["episode_start", *["observation"] * short, "episode_end"]
    assert "recording" not in stream[0][1]
    label = failure_label(steps, log.targets, truncated=True)
    assert label == "never_reached_target"


# -- the labels -----------------------------------------------------------------------------------
def _columns(grasped, gripper=None, dist=None):
    n = len(grasped)
    return {
        "grasped": np.array(grasped, dtype=object),
        "gripper": np.asarray(gripper if gripper is not None else [1.0] * n, float),
        "target_dist": np.asarray(dist if dist is not None else [0.01] * n, float),
    }


G, W = "milk_1", "ketchup_1"  # a goal object, another one
LABEL_CASES = [
    ("out_of_steps_holding", _columns([None, G, G]), True),
    ("out_of_steps_holding", _columns([None, W, W]), True),  # holding anything
    ("grasped_and_dropped", _columns([None, G, None], gripper=[1, 1, 1]), True),
    ("placed_off_target", _columns([None, G, None], gripper=[1, 1, -1]), True),
    ("placed_off_target", _columns([G, None, G, None], gripper=[1, -1, 1, -1]), False),
    ("stopped_holding", _columns([None, G, G]), False),
    ("grasped_wrong_object", _columns([None, W, None], gripper=[1, 1, -1]), True),
    ("never_reached_target", _columns([None] * 3, dist=[0.3, 0.2, 0.06]), True),
    ("reached_not_grasped", _columns([None] * 3, dist=[0.3, 0.04, 0.2]), True),
    ("no_evidence", _columns([None] * 3, dist=[np.nan] * 3), True),
    ("no_evidence", _columns([]), True),
]


@pytest.mark.parametrize(("label", "steps", "truncated"), LABEL_CASES)
def test_each_failure_label_is_the_first_rule_that_holds(label, steps, truncated):
    assert failure_label(steps, (G,), truncated=truncated) == label


def test_every_label_has_a_case():
    assert {case[0] for case in LABEL_CASES} == set(FAILURE_LABELS)


def test_real_failures_are_labelled_from_their_evidence(env):
    """A policy that holds still never reaches the can; the oracle stopped by the budget with
    the can in its hand runs out of steps holding it."""
    run, log = _policy_only(env, HoldPolicy())
    assert failure_label(log.columns(), log.targets, truncated=True) == "never_reached_target"
    with make_env("libero_object", 0, EnvOptions(max_steps=110)) as long_env:
        run, log = _policy_only(long_env, ScriptedPolicy(), privileged=True)
    assert run.exit_status == "step_limit" and not run.success
    steps = log.columns()
    assert steps["grasped"][-1] == TARGET  # the oracle grasps after 60-80 steps
    assert failure_label(steps, log.targets, truncated=True) == "out_of_steps_holding"


def test_a_release_away_from_the_basket_is_placed_off_target():
    """The oracle's own actions to 12 steps into its grasp, then the fingers opened."""
    with make_env("libero_object", 0, EnvOptions(max_steps=150)) as long_env:
        long_env.reset(0)
        oracle, applied = ScriptedPolicy(), []
        while len(applied) < 120:
            for action in oracle.infer({"privileged": privileged_state(long_env)})["actions"]:
                long_env.step(action)
                applied.append(action)
            closes = [i for i, a in enumerate(applied) if a[6] > 0]
            if closes and len(applied) - closes[0] >= 12:
                break
        opened = np.zeros((25, 7), np.float32)
        opened[:, 6] = -1.0
        replay = ReplayPolicy(np.concatenate([np.asarray(applied, np.float32), opened]))
        _, log = _policy_only(long_env, replay)
    steps = log.columns()
    assert TARGET in set(steps["grasped"]) and steps["grasped"][-1] is None
    assert failure_label(steps, log.targets, truncated=True) == "placed_off_target"


# -- in a session ---------------------------------------------------------------------------------
def test_a_sessions_records_and_summaries_say_how_its_failures_failed(pytester):
    data = served_hold_config(GAP, 15, seeds=[0, 1], n_seeds=None)
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(data))
    result = pytester.runpytest_subprocess("grid.yaml", timeout=300)
    assert result.ret == 0, result.stdout.str()
    (run_dir,) = (pytester.path / "runs").iterdir()
    records = [json.loads(p.read_text()) for p in sorted(run_dir.rglob("result.json"))]
    assert len(records) == 2
    for record in records:
        assert record["failure_label"] == "never_reached_target"
        steps = read_steps(run_dir / record["steps_file"])
        # a row per control step: the bring-up's and then the policy's (`steps`)
        assert len(steps["step"]) == record["bringup_steps"] + record["steps"]
        assert (steps["reply"] >= 0).sum() == 15  # the policy's whole budget, after bring-up
    (cell,) = json.loads((run_dir / "summary.json").read_text())["cells"]
    assert cell["failure_labels"] == {"never_reached_target": 2}
    header, row = (run_dir / "summary.tsv").read_text().splitlines()[:2]
    values = dict(zip(header.split("\t"), row.split("\t"), strict=True))
    assert values["fail_never_reached_target"] == "2"
    episodes = pq.read_table(run_dir / "episodes.parquet").to_pydict()
    assert episodes["failure_label"] == ["never_reached_target"] * 2
    assert all(p.endswith(STEPS_FILE) for p in episodes["steps_file"])


# -- the report's view ----------------------------------------------------------------------------
def test_the_reports_view_marks_holds_by_how_they_ended():
    from pytest_gap.viz.steps import holds_of

    steps = list(range(1, 9))
    grasped = [None, G, G, None, W, W, None, G]
    command = np.array([1, 1, 1, -1, 1, 1, 1, 1], float)
    holds = [(h.first, h.last, h.object, h.ended) for h in holds_of(steps, grasped, command)]
    assert holds == [(2, 3, G, "release"), (5, 6, W, "drop"), (8, 8, G, "end")]
    assert holds_of(steps, [None] * 8, command) == []


def test_the_reports_view_reads_a_trials_steps_file(env, tmp_path):
    from pytest_gap.viz.steps import steps_view

    run, log = _policy_only(env, Remembering())
    view = steps_view(log.write(tmp_path / STEPS_FILE))
    assert view.steps == list(range(1, run.steps + 1))
    assert view.chunks == list(range(run.bringup_steps + 1, run.steps + 1, CHUNK))
    assert view.command[-1] == pytest.approx(-0.7) and len(view.xyz) == 3
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    assert steps_view(tmp_path / "broken.parquet") is None
