"""run_policy: hand the arm to a learned policy served over a websocket; bring_up before it.

Each window sends one observation and applies the first `replan_every` actions of the returned
chunk (action chunking), then asks again: openpi's LIBERO client loop. How the policy's control
ends is `until`:
- `success` (the bare templates, `policy_only`): as openpi's and vla-eval's own loops run a
  policy. It acts until the simulator's goal check passes (the executor stops the workflow, as
  for any skill), it replies `"done": true` (status `completed`), or the episode's step budget
  is spent (the suite's 220/280/300/520, or `trials.max_steps`; the executor ends the run at the
  step limit). Nothing else ends it: a release, a missed grasp it retries, a second object.
- `release` (a policy node inside a graph, `llm_plus_policy`): as above, and also at the first
  release after a verified hold: the fingers closed on a movable object (it touches both
  fingers, `SceneView.grasped`) and then the command opens them; `settle_steps` no-op steps let
  the object come to rest (status `released`). A close on nothing that reopens is no release.
`max_windows` caps the windows (status `max_windows`); unset, only the budget does.
What is sent and how a reply becomes actions is the endpoint's `obs_format`
(policies/formats.py): openpi-libero, vla-eval-libero or the native gap. A window is
`replan_every` actions: one request to a server that answers chunks, several to one that answers
single actions (vla-eval). Actions are OSC_POSE deltas with gripper -1 open / +1 closed; a reply
the format cannot use fails the skill (a policy failure).
A server that cannot be reached, fails, closes or answers late raises PolicyTransportError, an
infrastructure failure: the trial is not scored as a policy failure.
The policy is asked only for steps the budget allows (openpi's loop asks while t < max_steps;
vla-eval's sends one observation per step of its budget). Over vla-eval's protocol each
run_policy node is one episode of that protocol, started and ended with the messages vla-eval's
own loop sends (`_protocol_episode`), so a server sees the same stream from both loops.

`bring_up` is the spec's policy_only bring-up (home, gripper open) done without perception.
"""

from __future__ import annotations

import contextlib
import time
from typing import Literal

import numpy as np
from pydantic import BaseModel

from pytest_gap.policies.formats import ReplyError, obs_format, vla_eval_task
from pytest_gap.skills import motion
from pytest_gap.skills.basic import Motion, locate, move_to
from pytest_gap.skills.context import SkillContext, StepLimitReached, TaskSucceeded
from pytest_gap.skills.geometry import rotation_error
from pytest_gap.skills.grasp import grasp_candidates
from pytest_gap.skills.gripper import OPEN
from pytest_gap.skills.registry import SkillFailure, skill

CLOSE_THRESHOLD = 0.0  # a gripper command above this closes, below opens
NOOP_OPEN = np.array([0, 0, 0, 0, 0, 0, -1.0])
# bring_up: the hand within these of its home pose, the fingers this open, is home; it gives up
# after BRING_UP_MAX_STEPS (LIBERO's init states leave the hand 1-3 cm off: a few steps).
HOME_TOLERANCE, HOME_TURN_TOLERANCE, OPEN_FRACTION = 0.01, 0.05, 0.85
BRING_UP_MAX_STEPS = 60
Until = Literal["success", "release"]


class PolicyRun(BaseModel):
    status: Literal["completed", "released", "max_windows"]
    windows: int
    steps: int
    # until=release: the object the fingers held before the release that ended the run
    released: str | None = None


def privileged_state(env) -> dict:
    """Ground truth for oracle policies (registry entries with `privileged_state: true` only):
    the objects still to deliver, the container, every object's box, the grip site and width."""
    scene = env.scene
    goal = [p for p in env.goal if p[0] == "in"]
    status = env.goal_status()
    delivered = [done for p, done in zip(env.goal, status, strict=True) if p[0] == "in"]
    boxes = {}
    for obj in scene.objects():
        lo, hi = scene.world_aabb(obj.name)
        boxes[obj.name] = {"min": lo.tolist(), "max": hi.tolist()}
    grip = scene.gripper()
    return {
        "targets": [p[1] for p in goal],
        "delivered": delivered,
        "container": goal[0][2].removesuffix("_contain_region") if goal else None,
        "objects": boxes,
        "eef": grip.eef_pos.tolist(),
        "gripper_width": grip.width,
    }


@skill(scene=False)
def run_policy(
    ctx: SkillContext,
    policy: str,
    prompt: str = "",
    until: Until = "success",
    max_windows: int | None = None,
    replan_every: int = 5,
    settle_steps: int = 10,
) -> PolicyRun:
    """Let a learned policy act: observations in, action chunks out, until the task succeeds or
    the episode's steps run out (`until: success`), or also until it releases what it held
    (`until: release`). It is never asked for a step the budget would refuse.

    `prompt` defaults to the task's instruction (the one the workflow was produced for). Fails
    when `until: release` runs on a backend whose envs offer no gripper contacts. Over vla-eval's
    protocol the node is one episode of it (`_protocol_episode`)."""
    prompt = prompt or ctx.instruction
    if until == "release" and ctx.env.scene is None:
        raise SkillFailure(
            "until: release reads the fingers' contacts, which this backend's envs do not "
            "offer; use until: success"
        )
    client = ctx.policy(policy)  # raises for a policy without an endpoint
    try:
        with _protocol_episode(ctx, client, ctx.policies[policy].protocol):
            return _windows(
                ctx, client, policy, prompt, until, max_windows, replan_every, settle_steps
            )
    finally:
        ctx.policy_reply = None  # later steps are no reply's


@contextlib.contextmanager
def _protocol_episode(ctx: SkillContext, client, protocol: str):
    """vla-eval's protocol, as its SyncEpisodeRunner speaks it: EPISODE_START with the task
    (`formats.vla_eval_task`) before the first observation, and EPISODE_END with the result
    (`{"metrics": {"success"}, "steps", "elapsed_sec"}`) when the policy's control ends: at
    success, at the budget, or as the node returns (a `done` reply, a release, `max_windows`).
    After an error (the server's, a reply the format refuses, the simulator's) none is sent,
    as vla-eval's loop sends none: its error passes its `end_episode`. openpi's protocol has no
    episodes. A failed EPISODE_END is a PolicyTransportError, as it fails vla-eval's episode."""
    if protocol != "vla-eval":
        yield
        return
    t0, steps0 = time.monotonic(), ctx.steps
    client.episode_start({"task": vla_eval_task(ctx.env)})

    def end(success: bool) -> None:
        elapsed = round(time.monotonic() - t0, 3)
        result = {"metrics": {"success": success}, "steps": ctx.steps - steps0}
        client.episode_end({**result, "elapsed_sec": elapsed})

    try:
        yield
    except (TaskSucceeded, StepLimitReached) as ending:
        end(isinstance(ending, TaskSucceeded))
        raise
    end(False)  # ctx.act raises TaskSucceeded at the first successful step: not reached then


def _windows(
    ctx: SkillContext,
    client,
    policy: str,
    prompt: str,
    until: Until,
    max_windows: int | None,
    replan_every: int,
    settle_steps: int,
) -> PolicyRun:
    """run_policy's windows (its docstring): ask, apply, until an ending."""
    scene = ctx.env.scene
    endpoint = ctx.policies[policy]
    fmt = obs_format(endpoint)
    privileged = endpoint.privileged
    server = getattr(client, "metadata", None) or {}
    held: str | None = None  # until=release: what a hold verified since the last close
    steps0, window = ctx.steps, 0
    while max_windows is None or window < max_windows:
        window += 1
        pending = replan_every  # a window is replan_every actions, in one reply or several
        while pending > 0:
            # No observation for a step the budget refuses: openpi's loop asks only while
            # t < max_steps, vla-eval's sends one observation per step of its budget.
            ctx.check_budget()
            obs = fmt.observation(ctx.env, prompt, server)
            if privileged:
                obs["privileged"] = privileged_state(ctx.env)
            asked = time.perf_counter()
            reply = client.infer(obs)
            infer_ms = round(1000 * (time.perf_counter() - asked), 1)
            try:
                chunk = fmt.actions(reply, replan_every)[:pending]
            except ReplyError as exc:
                raise SkillFailure(f"policy {policy} ({fmt.name}) {exc}") from None
            # each inference's latency, for `gap viz` and anyone reading the trace
            ctx.note("policy window", window=window, infer_ms=infer_ms, actions=len(chunk))
            ctx.policy_reply, ctx.policy_replies = ctx.policy_replies, ctx.policy_replies + 1
            for action in chunk:
                ctx.act(action)  # ends the run on success or at the step budget
                if until != "release":
                    continue
                if action[6] > CLOSE_THRESHOLD:
                    held = held or scene.grasped()
                elif held is not None:  # held something, now released: the node is done
                    ctx.policy_reply = None  # the settle steps are the node's, not a reply's
                    for _ in range(settle_steps):
                        ctx.act(NOOP_OPEN)
                    return PolicyRun(
                        status="released",
                        windows=window,
                        steps=ctx.steps - steps0,
                        released=held,
                    )
            pending -= len(chunk)
            if isinstance(reply, dict) and reply.get("done") is True:
                return PolicyRun(status="completed", windows=window, steps=ctx.steps - steps0)
    return PolicyRun(status="max_windows", windows=window, steps=ctx.steps - steps0)


@skill(bring_up=True)
def bring_up(ctx: SkillContext) -> Motion:
    """Ready the arm for a policy without looking: the hand to its home pose (the robot model's
    home joint angles, by forward kinematics: no camera, no object) with the gripper opening.
    As a workflow's first node its steps are not charged to the episode's step budget (the
    spec's policy_only bring-up: the policy after it still has the whole budget)."""
    target, desired = motion.home_pose(ctx)
    opened = OPEN_FRACTION * ctx.env.scene.gripper().max_width
    error = np.inf
    for _ in range(BRING_UP_MAX_STEPS):
        pos, rot = motion.hand_pose(ctx)
        error = float(np.linalg.norm(target - pos))
        turn = float(np.linalg.norm(rotation_error(rot, desired)))
        home = error < HOME_TOLERANCE and turn < HOME_TURN_TOLERANCE
        if home and ctx.env.scene.gripper().width >= opened:
            break
        motion.hold_step(ctx, target, desired, OPEN)
    return Motion(
        reached=error < HOME_TOLERANCE, error=error, position=motion.hand_pose(ctx)[0].tolist()
    )


@skill
def approach(ctx: SkillContext, name: str, clearance: float = 0.08) -> Motion:
    """Bring the open hand `clearance` m above an object, turned for a top-down grasp of it."""
    located = locate(ctx, name)
    grasp = grasp_candidates(ctx, located.box).best
    above = [grasp.position[0], grasp.position[1], located.box.top + clearance]
    return move_to(ctx, above, yaw=grasp.yaw, gripper="open")
