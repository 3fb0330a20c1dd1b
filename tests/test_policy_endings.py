"""How a learned policy's control ends, on real LIBERO with real policy servers on loopback
(issue 32 section 1): `until: success` only at success, a `done` reply or the step budget, as
openpi's and vla-eval's loops run a policy; `until: release` also at a release after a verified
hold; policy_only's bring-up sees nothing and is not charged; no window cap under the budget."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.policies.builtin import HoldPolicy, ReplayPolicy, ScriptedPolicy
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.policies.server import PolicyServer
from pytest_gap.producers.templates import template_dir
from pytest_gap.sim.backend import EnvOptions
from pytest_gap.sim.libero import make_env
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.policy import bring_up, privileged_state
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow, validate_workflow

BUDGET = 60  # trials.max_steps of the short episodes
LONG = 150  # of those that grasp: the oracle closes on the can after 60-80 steps
CLOSE, OPEN = 1.0, -1.0


def _actions(*spans: tuple[float, int]) -> np.ndarray:
    """Zero motion, the gripper commanded `command` for `n` steps per span."""
    rows = [[0, 0, 0, 0, 0, 0, command] for command, n in spans for _ in range(n)]
    return np.asarray(rows, np.float32)


@pytest.fixture(scope="module")
def env():
    with make_env("libero_object", 0, EnvOptions(max_steps=BUDGET)) as env:
        yield env


@pytest.fixture(scope="module")
def long_env():
    with make_env("libero_object", 0, EnvOptions(max_steps=LONG)) as env:
        yield env


def _served(policy):
    return PolicyServer(policy).start()


def _policy_graph(until: str) -> object:
    return validate_workflow(
        {
            "version": 1,
            "name": f"policy_until_{until}",
            "start": "policy",
            "nodes": {
                "policy": {
                    "type": "tool",
                    "skill": "run_policy",
                    "inputs": {"policy": "p", "until": until},
                    "next": "end",
                },
                "end": {"type": "end", "status": "failure"},
            },
        }
    )


def _run(env, workflow, policy, seed: int = 0, privileged: bool = False):
    env.reset(seed)
    with _served(policy) as server:
        endpoint = PolicyEndpoint(url=server.url, obs_format="gap", privileged=privileged)
        return run_workflow(workflow, env, policies={"p": endpoint})


# Closes on nothing, reopens, again and again: a policy retrying a grasp it missed.
REGRASPS = _actions(*[(CLOSE, 8), (OPEN, 8)] * 10)


class Counted:
    """One episode of `policy` (forked once, as a server forks it per connection), its
    inferences counted."""

    def __init__(self, policy):
        self.policy, self.asked = policy.fork(), 0

    def infer(self, obs: dict) -> dict:
        self.asked += 1
        return self.policy.infer(obs)


def test_a_regrasping_policy_acts_to_the_step_budget_in_the_bare_template(env):
    """... and is asked only for steps the budget allows, as openpi's loop asks (`while t <
    max_steps`: a chunk of 5 at t = 0, 5, ..., BUDGET - 5), not once more at the budget."""
    assert BUDGET % 5 == 0  # the budget ends a window: where a further request was sent
    bare = load_workflow(template_dir("policy_only_bare"), {"policy_id": "p"})
    policy = Counted(ReplayPolicy(REGRASPS))
    run = _run(env, bare, policy)
    assert run.exit_status == "step_limit" and not run.infra_failure, run.error
    assert run.steps == BUDGET  # not 16: reopening the gripper ends nothing
    assert policy.asked == BUDGET // 5


def test_until_release_does_not_end_at_a_close_on_nothing(env):
    run = _run(env, _policy_graph("release"), ReplayPolicy(REGRASPS))
    assert run.exit_status == "step_limit", run.outputs
    assert run.steps == BUDGET


@pytest.fixture(scope="module")
def grasp_then_drop(long_env) -> tuple[np.ndarray, int]:
    """The oracle's own actions up to 12 steps into its grasp of the soup can (closed on it,
    lifting), then the fingers opened away from the basket: a verified hold, then a release
    that does not finish the task. Returns the actions and the step the release comes at."""
    env = long_env
    env.reset(0)
    oracle, applied = ScriptedPolicy(), []
    while len(applied) < LONG:
        chunk = oracle.infer({"privileged": privileged_state(env)})["actions"][:5]
        for action in chunk:
            env.step(action)
            applied.append(action)
        closes = [i for i, a in enumerate(applied) if a[6] > 0]
        if closes and len(applied) - closes[0] >= 12:
            break
    release_at = len(applied)
    assert release_at < LONG - 20 and env.scene.grasped() == "alphabet_soup_1"
    return np.concatenate([np.asarray(applied, np.float32), _actions((OPEN, 20))]), release_at


def test_until_release_ends_at_a_release_after_a_verified_hold(long_env, grasp_then_drop):
    actions, release_at = grasp_then_drop
    run = _run(long_env, _policy_graph("release"), ReplayPolicy(actions))
    outcome = run.outputs["policy"]
    assert outcome["status"] == "released" and outcome["released"] == "alphabet_soup_1"
    # the release step, then settle_steps (10) of no-op for the can to come to rest
    assert outcome["steps"] == release_at + 1 + 10 == run.steps
    assert not run.success


def test_until_success_goes_on_after_that_release(long_env, grasp_then_drop):
    actions, _ = grasp_then_drop
    run = _run(long_env, _policy_graph("success"), ReplayPolicy(actions))
    assert run.exit_status == "step_limit" and run.steps == LONG


def test_until_release_needs_a_backend_with_contacts(env):
    class NoScene:
        scene = None
        steps = 0
        max_steps = BUDGET

        def __getattr__(self, name):
            return getattr(env, name)

    env.reset(0)
    with _served(HoldPolicy()) as server:
        endpoint = PolicyEndpoint(url=server.url, obs_format="gap")
        run = run_workflow(_policy_graph("release"), NoScene(), policies={"p": endpoint})
    assert run.exit_status == "error"
    assert "until: release reads the fingers' contacts" in run.error and "until: success" in (
        run.error
    )


def test_bring_up_homes_the_hand_without_looking_and_is_not_charged(env, monkeypatch):
    env.reset(3)
    for _ in range(8):  # push the hand 6-7 cm off its home pose, gripper closing
        env.step([0.6, 0.5, 0.3, 0, 0, 0, CLOSE])
    off = env.steps

    def no_camera(*args, **kwargs):
        raise AssertionError("the bring-up looked through a camera")

    monkeypatch.setattr(type(env.scene), "render", no_camera)
    monkeypatch.setattr(type(env.scene), "renderer", property(no_camera))
    ctx = SkillContext(env)
    budget = env.max_steps
    with ctx.uncharged():
        moved = bring_up(ctx)
    assert moved.reached and moved.error < 0.01
    assert env.scene.gripper().width > 0.065  # open again
    taken = env.steps - off
    assert 0 < taken == ctx.uncharged_steps and env.max_steps == budget + taken


def test_the_policy_only_template_gives_the_policy_the_whole_budget_with_no_window_cap():
    """Above the 70 windows x 5 = 350 steps the template used to stop at (libero_10: 520)."""
    steps = 360  # 72 windows of 5: past the old cap
    template = load_workflow(template_dir("policy_only"), {"policy_id": "p"})
    with make_env("libero_object", 0, EnvOptions(max_steps=steps)) as long_env:
        run = _run(long_env, template, HoldPolicy())
    assert run.exit_status == "step_limit" and not run.infra_failure, run.error
    assert run.steps - run.bringup_steps == steps
    assert 0 <= run.bringup_steps < 30
