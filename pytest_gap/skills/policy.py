"""run_policy: hand the arm to a learned policy served over the openpi websocket protocol.

Each window sends one observation and applies the first `replan_every` actions of the returned
chunk (action chunking), then asks again. The run ends when
- the simulator's goal check passes (the executor stops the whole workflow, as for any skill);
- the policy completes a gripper cycle: it closed the gripper and then opened it again, which
  ends a pick-and-place; `settle_steps` no-op steps then let the object come to rest
  (status `gripper_cycle`);
- the policy says it is done (`"done": true` in a reply; status `completed`);
- `max_windows` windows were used (status `max_windows`).
What is sent and how a reply becomes actions is the endpoint's `obs_format`
(policies/formats.py): openpi-libero, vla-eval-libero or the native gap. A window is
`replan_every` actions: one request to a server that answers chunks, several to one that answers
single actions (vla-eval). Actions are OSC_POSE deltas with gripper -1 open / +1 closed; a reply
the format cannot use fails the skill (a policy failure).
A server that cannot be reached, fails, closes or answers late raises PolicyTransportError, an
infrastructure failure: the trial is not scored as a policy failure.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
from pydantic import BaseModel

from pytest_gap.policies.formats import ReplyError, obs_format
from pytest_gap.skills import library
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import SkillFailure, skill

CLOSE_THRESHOLD = 0.0  # a gripper command above this closes, below opens
NOOP_OPEN = np.array([0, 0, 0, 0, 0, 0, -1.0])


class PolicyRun(BaseModel):
    status: Literal["gripper_cycle", "completed", "max_windows"]
    windows: int
    steps: int


def privileged_state(ctx: SkillContext) -> dict:
    """Ground truth for oracle policies (registry entries with `privileged_state: true` only):
    the objects still to deliver, the container, every object's box, the grip site and width."""
    env, scene = ctx.env, ctx.env.scene
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
    max_windows: int = 20,
    replan_every: int = 5,
    settle_steps: int = 10,
) -> PolicyRun:
    """Let a learned policy act: observations in, action chunks out, until a gripper cycle.

    `prompt` defaults to the task's instruction (the one the workflow was produced for)."""
    prompt = prompt or ctx.instruction
    client = ctx.policy(policy)  # raises for a policy without an endpoint
    endpoint = ctx.policies[policy]
    fmt = obs_format(endpoint)
    privileged = endpoint.privileged
    server = getattr(client, "metadata", None) or {}
    closed = False
    steps0 = ctx.steps
    for window in range(1, max_windows + 1):
        pending = replan_every  # a window is replan_every actions, in one reply or several
        while pending > 0:
            obs = fmt.observation(ctx.env, prompt, server)
            if privileged:
                obs["privileged"] = privileged_state(ctx)
            asked = time.perf_counter()
            reply = client.infer(obs)
            infer_ms = round(1000 * (time.perf_counter() - asked), 1)
            try:
                chunk = fmt.actions(reply, replan_every)[:pending]
            except ReplyError as exc:
                raise SkillFailure(f"policy {policy} ({fmt.name}) {exc}") from None
            # each inference's latency, for `gap viz` and anyone reading the trace
            ctx.note("policy window", window=window, infer_ms=infer_ms, actions=len(chunk))
            for action in chunk:
                ctx.act(action)
                if action[6] > CLOSE_THRESHOLD:
                    closed = True
                elif closed:  # closed on something, now released: the pick-and-place is over
                    for _ in range(settle_steps):
                        ctx.act(NOOP_OPEN)
                    return PolicyRun(
                        status="gripper_cycle", windows=window, steps=ctx.steps - steps0
                    )
            pending -= len(chunk)
            if isinstance(reply, dict) and reply.get("done") is True:
                return PolicyRun(status="completed", windows=window, steps=ctx.steps - steps0)
    return PolicyRun(status="max_windows", windows=max_windows, steps=ctx.steps - steps0)


@skill
def approach(ctx: SkillContext, name: str, clearance: float = 0.08) -> library.Motion:
    """Bring the open hand `clearance` m above an object, turned for a top-down grasp of it."""
    located = library.locate(ctx, name)
    grasp = library.grasp_candidates(ctx, located.box).best
    above = [grasp.position[0], grasp.position[1], located.box.top + clearance]
    return library.move_to(ctx, above, yaw=grasp.yaw, gripper="open")
