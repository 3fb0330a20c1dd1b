"""The gripper, shared by every skill that moves the fingers: the open and close commands,
the fingers' measures, the width and grip now, a top-down grasp (`Grasp`) and `actuate`, which
commands the fingers and waits until they stop.

One module below the skills (basic, grasp, place, push, switches, policy) and the helpers that
plan grasps (interior's handle grasps), so none of them imports another's skills for these.
"""

from __future__ import annotations

from pydantic import BaseModel

from pytest_gap.skills import motion
from pytest_gap.skills.context import SkillContext

OPEN, CLOSE = -1.0, 1.0
HOLD_WIDTH = 0.004  # fingers stopped this far apart: something is between them
FINGER_REACH = 0.045  # the open fingers' outer faces, from the grip site along the closing axis
# The open fingers' half width across the closing axis (their inner faces, and how far in
# from an object's end they may grip it: `grasp.FINGER_INNER`, `grasp.FINGER_ON_END`).
FINGER_SIDE = 0.02


# What open_gripper / close_gripper return: the width the fingers stopped at, and whether they
# stopped on something.
class Gripper(BaseModel):
    width: float
    holding: bool


# A top-down grasp: where the grip site goes, the hand's yaw there and the width between the
# fingers (`grasp.grasp_candidates`, the rim and handle grasps).
class Grasp(BaseModel):
    position: list[float]
    yaw: float
    width: float
    # The hand must come down at `yaw` itself, not the same grip turned half round: the other
    # turn brings the forearm onto something seen (`motion.clear_grip_yaw`).
    yaw_fixed: bool = False


def finger_width(ctx: SkillContext) -> float:
    """How far apart the fingers stand now (metres)."""
    return ctx.env.scene.gripper().width


def keep_grip(ctx: SkillContext) -> float:
    """The gripper command that keeps the fingers as they are: closed on what is held."""
    return CLOSE if ctx.memory.get("held") or finger_width(ctx) < 0.07 else OPEN


def hand_position(ctx: SkillContext) -> list[float]:
    """The grip site now, as a list (what the skills' outputs report)."""
    return [float(v) for v in ctx.env.scene.gripper().eef_pos]


def actuate(ctx: SkillContext, command: float, min_steps: int = 10, steps: int = 20) -> Gripper:
    """Command the fingers and hold the hand still until they stop moving.

    The Panda's finger command ramps over about 8 control steps, so nothing moves at first
    when reversing direction: wait at least `min_steps` before judging that they stopped.
    """
    pos, yaw = ctx.env.scene.gripper().eef_pos, motion.hand_yaw(ctx)
    last = finger_width(ctx)
    for i in range(steps):
        motion.servo(ctx, pos, yaw, command, max_steps=1, tolerance=0.0)
        width = finger_width(ctx)
        if i >= min_steps and abs(width - last) < 2e-4:
            break
        last = width
    width = finger_width(ctx)
    return Gripper(width=width, holding=command == CLOSE and width > HOLD_WIDTH)
