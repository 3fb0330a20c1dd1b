"""The basic skills: look (observe, locate), move the hand (home, move_to, lift), open and
close the fingers, ask the simulator's goal check. Each acts only through the env's 7-D action
and its cameras; the one privileged read is `check_success`, which asks the simulator's own
goal check."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from pytest_gap.skills import motion, perception
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import Box
from pytest_gap.skills.gripper import (
    CLOSE,
    OPEN,
    Gripper,
    actuate,
    finger_width,
    hand_position,
    keep_grip,
)
from pytest_gap.skills.registry import SkillFailure, skill


# -- outputs -------------------------------------------------------------------------------------
class Observation(BaseModel):
    visible: list[str]
    gripper_width: float
    eef_position: list[float]


class Motion(BaseModel):
    reached: bool
    error: float
    position: list[float]


class Located(BaseModel):
    name: str
    category: str
    box: Box
    pixels: int


class Success(BaseModel):
    success: bool
    completion: float


# -- skills --------------------------------------------------------------------------------------
@skill
def observe(ctx: SkillContext) -> Observation:
    """Look with the front camera: which scene objects are visible, and the gripper state."""
    return Observation(
        visible=perception.visible_objects(ctx),
        gripper_width=finger_width(ctx),
        eef_position=hand_position(ctx),
    )


@skill
def home(ctx: SkillContext) -> Motion:
    """Move the hand to the home pose above the table, pointing down, at a travel height
    clear of everything seen (`perception.safe_height`)."""
    height = perception.safe_height(ctx, exclude=ctx.memory.get("held"))
    error = motion.travel(ctx, (*motion.HOME_XY, height), 0.0, keep_grip(ctx))
    return Motion(reached=error < 0.02, error=error, position=hand_position(ctx))


@skill
def open_gripper(ctx: SkillContext) -> Gripper:
    """Open the fingers (releases whatever is held)."""
    ctx.memory.pop("held", None)
    return actuate(ctx, OPEN)


@skill
def close_gripper(ctx: SkillContext) -> Gripper:
    """Close the fingers; `holding` tells whether they stopped on something."""
    return actuate(ctx, CLOSE)


@skill
def locate(ctx: SkillContext, name: str) -> Located:
    """Find an object by name: segmentation + depth -> point cloud -> oriented bounding box.

    Fails naming the candidates when the name fits no object or several; fails when no camera
    sees it."""
    scene_name = perception.ground_name(ctx, name)
    box, pixels = perception.locate_box(ctx, scene_name)
    category = ctx.env.scene.object(scene_name).category
    return Located(name=scene_name, category=category, box=box, pixels=pixels)


@skill
def move_to(
    ctx: SkillContext,
    position: list[float],
    yaw: float = 0.0,
    gripper: Literal["open", "closed"] = "open",
) -> Motion:
    """Move the grip site to a position, pointing down at a yaw (IK-checked, collision-aware).

    Fails when the position is not [x, y, z] or the arm cannot reach it at that yaw."""
    if len(position) != 3:
        raise SkillFailure(f"position must be [x, y, z], got {position}")
    motion.require_reachable(ctx, position, yaw)
    error = motion.travel(ctx, position, yaw, OPEN if gripper == "open" else CLOSE)
    return Motion(reached=error < 0.015, error=error, position=hand_position(ctx))


@skill
def lift(ctx: SkillContext, height: float = 0.2) -> Motion:
    """Raise the hand straight up to `height` metres above the surface the scene stands on
    (the floor, a table: `perception.safe_height`), keeping the grip."""
    perception.safe_height(ctx, exclude=ctx.memory.get("held"))
    z = ctx.memory["support_z"] + height if "support_z" in ctx.memory else height
    pos = ctx.env.scene.gripper().eef_pos
    error = motion.servo(ctx, [pos[0], pos[1], z], motion.hand_yaw(ctx), keep_grip(ctx))
    return Motion(reached=error < 0.015, error=error, position=hand_position(ctx))


@skill(scene=False)
def check_success(ctx: SkillContext) -> Success:
    """Ask the simulator's goal check whether the task is done, and how much of it.

    Privileged: fails under `skills.perception: policy_cameras`, where a graph ends on what its
    skills saw (route this node's on_error to its end)."""
    if not ctx.goal_check:
        raise SkillFailure(
            "the simulator's goal check is privileged and skills.perception is policy_cameras: "
            "end on what the skills saw"
        )
    return Success(success=ctx.env.success(), completion=ctx.env.completion())
