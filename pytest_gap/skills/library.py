"""The built-in skills. Each acts only through the env's 7-D action and its cameras; the one
privileged read is `check_success`, which asks the simulator's own goal check."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel

from pytest_gap.instructions import SIDE_AXES, parse_bare_part, parse_instruction, parse_part
from pytest_gap.skills import articulation, interior, motion, packing, perception
from pytest_gap.skills.calibration import (
    ENTRY_CLEAR,
    INSIDE_MARGIN,
    RIM_DOWN,
    RIM_HOLD_WIDTH,
    RIM_IN,
    WIDTH_SLACK,
)
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import (
    Box,
    beside,
    plan_spot,
    rect_samples,
    wrap_angle,
    wrap_half_turn,
)
from pytest_gap.skills.registry import SkillFailure, skill

HOME_XY = (-0.15, 0.0)  # above the near half of the table, the arm's comfortable middle
OPEN, CLOSE = -1.0, 1.0
HOLD_WIDTH = 0.004  # fingers stopped this far apart: something is between them
BOX_BIAS = 0.005  # boxes from depth run wide by the points on silhouette edges
# The hand's body starts about 4.5 cm above the grip site: the grip site may go this far
# below a container's rim with the body still 1 cm above it.
HAND_BELOW_RIM = 0.035
LIFT_ABOVE = 0.15  # a picked object is lifted until the grip site is this far over its top was
TILT = 0.015  # a rim whose height varies this much around is tilted
# A held object's bottom passes this far over what stands on its way.
CARRY_CLEARANCE = 0.04
FINGER_REACH = 0.045  # the open fingers' outer faces, from the grip site along the closing axis
# The open fingers' inner faces from the grip site along the closing axis (the object itself
# is between them), their half width across it and how far in from the object's end they
# may grip it.
FINGER_INNER, FINGER_SIDE, FINGER_ON_END = 0.03, 0.02, 0.015
# Moved across, an open finger's inner face keeps this far outside the object it comes down by.
FINGER_OUTSIDE = 0.005
# The hand's body over a top-down grip: from HAND_BODY_ABOVE over the grip site up, half
# HAND_HALF_LENGTH along the closing axis and HAND_HALF_WIDTH across (robosuite's Panda
# collision mesh reaches 0.034 either side, 0.1 along; a few mm slack).
HAND_BODY_ABOVE, HAND_HALF_LENGTH, HAND_HALF_WIDTH = 0.04, 0.105, 0.04
# Points the forearm may meet at a rim grasp: this far over the rim (the Panda's link 7 stands
# about 0.15 m over the grip site, pointing down) and within this distance of the object.
ARM_ABOVE_GRIP, ARM_NEAR = 0.1, 0.35
# Lowering that stops this far above the release height is blocked, not done: plan again,
# keeping these clearances in turn.
BLOCKED, UNBLOCK_MARGINS = 0.02, (0.01, 0.02)
HANGING = 0.01  # an item let go whose top stays this far over where it stands still hangs
# place(relation=...) beside an anchor: the side, and the room left between the footprints.
BESIDE = {"left_of": "left", "right_of": "right", "front_of": "front", "behind": "back"}
BESIDE_GAP = 0.01  # just clear of the anchor (its box from depth runs a few mm wide)
# place(relation="on") where things already stand: the room kept between footprints (boxes
# from depth run a few mm wide); how far in from a fixture region's edge the held object's
# centre stays (LIBERO counts it on the region by its body's origin, which sits up to 1.2 cm
# off its box's centre: the moka pot's, towards its handle); how far off an object's centre
# it may go (LIBERO's On(a, b) for objects: centres within 0.03 m, `check_ontop`).
PLACE_GAP, SPOT_EDGE, ON_OBJECT_REACH = 0.01, 0.02, 0.015
# Kinds of thing open at the top by what they are, as the scene's object list names them.
OPEN_KINDS = frozenset({"bowl", "mug", "cup"})
DOOR_OPEN_ENOUGH = 1.0  # rad: a door open less than this is in the way of what goes in


# -- outputs -------------------------------------------------------------------------------------
class Observation(BaseModel):
    visible: list[str]
    gripper_width: float
    eef_position: list[float]


class Motion(BaseModel):
    reached: bool
    error: float
    position: list[float]


class Gripper(BaseModel):
    width: float
    holding: bool


class Located(BaseModel):
    name: str
    category: str
    box: Box
    pixels: int


class Grasp(BaseModel):
    position: list[float]
    yaw: float
    width: float
    # The hand must come down at `yaw` itself, not the same grip turned half round: the other
    # turn brings the forearm onto something seen (`motion.clear_grip_yaw`).
    yaw_fixed: bool = False


class GraspCandidates(BaseModel):
    candidates: list[Grasp]
    best: Grasp


class Picked(BaseModel):
    holding: bool
    attempts: int
    lifted_by: float


class Placed(BaseModel):
    released: bool
    position: list[float]


class Inside(BaseModel):
    inside: bool


class Success(BaseModel):
    success: bool
    completion: float


class TaskInfo(BaseModel):
    prompt: str
    items: list[str]
    container: str


class NextItem(BaseModel):
    item: str
    remaining: int
    done: bool


# -- helpers -------------------------------------------------------------------------------------
def _width(ctx: SkillContext) -> float:
    return ctx.env.scene.gripper().width


def _keep_grip(ctx: SkillContext) -> float:
    """The gripper command that keeps the fingers as they are: closed on what is held."""
    return CLOSE if ctx.memory.get("held") or _width(ctx) < 0.07 else OPEN


def _position(ctx: SkillContext) -> list[float]:
    return [float(v) for v in ctx.env.scene.gripper().eef_pos]


def _gripper(ctx: SkillContext, command: float, min_steps: int = 10, steps: int = 20) -> Gripper:
    """Command the fingers and hold the hand still until they stop moving.

    The Panda's finger command ramps over about 8 control steps, so nothing moves at first
    when reversing direction: wait at least `min_steps` before judging that they stopped.
    """
    pos, yaw = ctx.env.scene.gripper().eef_pos, motion.hand_yaw(ctx)
    last = _width(ctx)
    for i in range(steps):
        motion.servo(ctx, pos, yaw, command, max_steps=1, tolerance=0.0)
        width = _width(ctx)
        if i >= min_steps and abs(width - last) < 2e-4:
            break
        last = width
    width = _width(ctx)
    return Gripper(width=width, holding=command == CLOSE and width > HOLD_WIDTH)


# -- skills --------------------------------------------------------------------------------------
@skill
def observe(ctx: SkillContext) -> Observation:
    """Look with the front camera: which scene objects are visible, and the gripper state."""
    return Observation(
        visible=perception.visible_objects(ctx),
        gripper_width=_width(ctx),
        eef_position=_position(ctx),
    )


@skill
def home(ctx: SkillContext) -> Motion:
    """Move the hand to the home pose above the table, pointing down, at a travel height
    clear of everything seen (`perception.safe_height`)."""
    height = perception.safe_height(ctx, exclude=ctx.memory.get("held"))
    error = motion.travel(ctx, (*HOME_XY, height), 0.0, _keep_grip(ctx))
    return Motion(reached=error < 0.02, error=error, position=_position(ctx))


@skill
def open_gripper(ctx: SkillContext) -> Gripper:
    """Open the fingers (releases whatever is held)."""
    ctx.memory.pop("held", None)
    return _gripper(ctx, OPEN)


@skill
def close_gripper(ctx: SkillContext) -> Gripper:
    """Close the fingers; `holding` tells whether they stopped on something."""
    return _gripper(ctx, CLOSE)


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
def grasp_candidates(ctx: SkillContext, box: Box) -> GraspCandidates:
    """Top-down grasps for a box: fingers across its narrower side, at a height it allows."""
    hx, hy, hz = box.half_extents
    across_y = hx >= hy  # fingers close across the narrower horizontal axis
    narrow = hy if across_y else hx
    # Hand y (the closing axis) at yaw 0 is world -y; rotate it onto the narrow axis.
    closing_angle = box.yaw + (np.pi / 2 if across_y else 0.0)
    yaw = wrap_half_turn(closing_angle - np.pi / 2)
    depth = min(0.035, hz)  # fingertips reach 3.5 cm down, less on flat things
    z = max(box.top - depth, box.bottom + 0.01)
    cands = []
    for dz in (0.0, -0.01):
        position = [box.center[0], box.center[1], max(z + dz, box.bottom + 0.008)]
        cands.append(Grasp(position=position, yaw=yaw, width=2 * narrow))
    return GraspCandidates(candidates=cands, best=cands[0])


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
    return Motion(reached=error < 0.015, error=error, position=_position(ctx))


@skill
def lift(ctx: SkillContext, height: float = 0.2) -> Motion:
    """Raise the hand straight up to `height` metres above the surface the scene stands on
    (the floor, a table: `perception.safe_height`), keeping the grip."""
    perception.safe_height(ctx, exclude=ctx.memory.get("held"))
    z = ctx.memory["support_z"] + height if "support_z" in ctx.memory else height
    pos = ctx.env.scene.gripper().eef_pos
    error = motion.servo(ctx, [pos[0], pos[1], z], motion.hand_yaw(ctx), _keep_grip(ctx))
    return Motion(reached=error < 0.015, error=error, position=_position(ctx))


@skill
def pick(ctx: SkillContext, name: str, retries: int = 1) -> Picked:
    """Grasp and lift an object; `name` may be a phrase ("the black bowl next to the plate").

    A referring phrase is resolved from where the cameras see things
    (`perception.ground_name`); one it cannot resolve fails naming the candidates. An object
    open at the top and wider than the fingers open (a bowl) is gripped by its rim. Fails at
    once on a closed object wider than the fingers open, naming both widths."""
    scene_name = perception.ground_name(ctx, name)
    _grip_plan(ctx, scene_name)  # refuse what the fingers cannot grip before spending a step
    motion.hold_until_still(ctx, OPEN)  # things in flight are not where they will be
    seen, rim, by_handle = _grip_plan(ctx, scene_name)  # the first attempt's box: no second render
    perception.safe_height(ctx)
    attempts = 0
    for attempt in range(retries + 1):
        attempts = attempt + 1
        box = seen if attempt == 0 or by_handle else perception.locate_box(ctx, scene_name)[0]
        grasps = _rim_grasps(ctx, scene_name, box) if rim else by_handle
        if grasps is not None and not grasps:
            part = "rim" if rim else "handle"
            raise SkillFailure(f"no reachable grasp on the {part} of {scene_name}")
        grasps = grasps or _clear_of_neighbours(ctx, scene_name, box)
        grasp = grasps[min(attempt, len(grasps) - 1)]
        above = [*grasp.position[:2], max(box.top + 0.08, box.bottom + 0.15)]
        yaw = grasp.yaw if grasp.yaw_fixed else motion.grip_yaw(ctx, grasp.position, grasp.yaw)
        if yaw is None:
            raise SkillFailure(
                f"the grasp of {scene_name} at {np.round(grasp.position, 3).tolist()} is out of "
                "the arm's reach, the hand turned either way"
            )
        # Clear of the object's top, and lower where the arm does not reach that high there.
        above[2] = motion.reachable_height(ctx, above[:2], yaw, above[2], box.top + 0.02)
        _gripper(ctx, OPEN, min_steps=4)
        # Over what stands on the way there, not over the tallest thing in the scene.
        eef = ctx.env.scene.gripper().eef_pos
        tallest = perception.tallest_along(ctx, eef[:2], above[:2], exclude=scene_name)
        motion.travel(ctx, above, yaw, OPEN, safe_z=min(motion.travel_height(ctx), tallest + 0.05))
        # Crossing low, the hand may reach the point above the grasp with no descent to slow
        # it: going down at speed it grips off-centre (grocery object task 0 seeds 1 and 3:
        # the milk so gripped stayed stuck to a finger after its release and left the basket).
        motion.settle(ctx, above, yaw, OPEN)
        motion.servo(ctx, grasp.position, yaw, OPEN, max_steps=60)
        reached = np.linalg.norm(ctx.env.scene.gripper().eef_pos - np.asarray(grasp.position))
        closed = _gripper(ctx, CLOSE)
        gripped_at = ctx.env.scene.gripper().eef_pos[:2].copy()
        ctx.note("grasp closed", width=round(closed.width, 4), off_by=round(float(reached), 3))
        if not closed.holding:
            motion.servo(ctx, above, yaw, OPEN, max_steps=40)
            continue
        # High enough to see it rose and to carry it on (`place` climbs as the way needs).
        lift_z = min(motion.travel_height(ctx), box.top + LIFT_ABOVE)
        lift_z = motion.reachable_height(ctx, grasp.position[:2], yaw, lift_z, box.top + 0.07)
        lift_to = [*grasp.position[:2], lift_z]
        motion.servo(ctx, lift_to, yaw, CLOSE, tolerance=0.02)
        after, _ = perception.locate_box(ctx, scene_name)
        rose = after.bottom - box.bottom
        ctx.note("lifted", rose=round(rose, 3), width=round(_width(ctx), 4))
        if _width(ctx) > (RIM_HOLD_WIDTH if rim else HOLD_WIDTH) and rose > 0.05:
            ctx.memory["held"] = scene_name
            ctx.memory["picked_box"], ctx.memory["picked_yaw"] = box, yaw
            # Held by the rim, the object's centre is where the grasp put it from the hand: a
            # look at it in the hand sees it half hidden by the fingers (libero_10 task 3
            # seed 3: the bowl's box in the hand was 3 cm narrow, its centre 2 cm off, and it
            # came down on the drawer's front wall and jammed the drawer open).
            offset = (gripped_at - np.asarray(box.center[:2]), motion.hand_yaw(ctx))
            ctx.memory["rim_offset"] = {scene_name: offset} if rim else {}
            return Picked(holding=True, attempts=attempts, lifted_by=rose)
        _gripper(ctx, OPEN)
    return Picked(holding=False, attempts=attempts, lifted_by=0.0)


def _clear_of_neighbours(ctx: SkillContext, scene_name: str, box: Box) -> list[Grasp]:
    """`grasp_candidates` for a box, slid along its length (the fingers' side of it) to the
    nearest place where the open fingers come down clear of what stands next to it
    (`finger_slide`): libero_10 task 1 seed 4, the cream cheese box beside the milk carton,
    the fingers came down on the carton's edge 11 cm over the grasp, every try."""
    grasps = grasp_candidates(ctx, box).candidates
    points = perception.scene_points(ctx, exclude=scene_name)
    first = grasps[0]
    length = max(world_half_extents_along(box, first.yaw) - FINGER_ON_END, 0.0)
    # Across, the open fingers may stand off-centre as long as both still come down outside it.
    room = max(ctx.env.scene.gripper().max_width / 2 - first.width / 2 - FINGER_OUTSIDE, 0.0)
    slide, shift = finger_clearance(points, first.position, first.yaw, length, room)
    if slide == 0.0 and shift == 0.0:
        return grasps
    along = np.array([np.cos(first.yaw), np.sin(first.yaw), 0.0])
    closing = np.array([np.sin(first.yaw), -np.cos(first.yaw), 0.0])
    moved = slide * along + shift * closing
    ctx.note("grasp slid clear of a neighbour", by=round(slide, 3), across=round(shift, 3))
    return [
        g.model_copy(update={"position": (np.asarray(g.position) + moved).tolist()}) for g in grasps
    ]


def world_half_extents_along(box: Box, yaw: float) -> float:
    """How far the box reaches from its centre along the hand's x axis at `yaw` (across the
    fingers' closing axis)."""
    turn = box.yaw - yaw
    return float(abs(np.cos(turn)) * box.half_extents[0] + abs(np.sin(turn)) * box.half_extents[1])


def finger_slide(points: np.ndarray, grip, yaw: float, length: float) -> float:
    """How far along the hand's x axis (at `yaw`) to move a top-down grip at `grip` so that
    no point of `points` above its height stands where the open fingers come down: the
    smallest such slide within +-`length`, 0 when none is needed or none is clear
    (`finger_clearance` without moving across)."""
    return finger_clearance(points, grip, yaw, length, 0.0)[0]


def finger_clearance(
    points: np.ndarray, grip, yaw: float, length: float, room: float
) -> tuple[float, float]:
    """How far to move a top-down grip at `grip` (at `yaw`), along the hand's x axis (within
    +-`length`) and along its closing axis, hand y (within +-`room`), so that no point of `points`
    above its height stands where the open fingers come down (out to FINGER_REACH along the
    closing axis, FINGER_SIDE across): the smallest slide along if one clears, else the
    whole `room` across with the smallest slide that clears, (0, 0) when none is needed or
    none is clear. Across: libero_pro goal_object task 6 seed 23, the cream cheese 4 cm from
    a bowl 16 cm wide, whose rim stopped the finger on its side 1.3 cm over the grasp."""
    grip = np.asarray(grip, float)
    along = np.array([np.cos(yaw), np.sin(yaw)])
    closing = np.array([np.sin(yaw), -np.cos(yaw)])  # hand y: world -y at yaw 0
    high = points[points[:, 2] > grip[2] + 0.005, :2] - grip[:2]
    u, c = high @ along, high @ closing

    outside = np.abs(c) > FINGER_INNER  # not where the object itself is

    def clear(slide: float, shift: float) -> bool:
        beside = outside & (np.abs(c - shift) <= FINGER_REACH + 0.005)
        return np.count_nonzero(beside & (np.abs(u - slide) <= FINGER_SIDE)) <= 2

    slides = sorted(np.linspace(-length, length, 2 * int(length / 0.005) + 1), key=abs)
    # Along the box first. Across, all the room there is: a neighbour close enough to need it
    # is close enough to be brushed by a finger just clear of it (seed 23: 8 mm across still
    # pushed the bowl 4 cm; 13.5 mm did not). Both fingers close on it in the end.
    moves = [(a, 0.0) for a in slides]
    moves += sorted(((a, b) for a in slides for b in (-room, room) if b), key=lambda m: abs(m[0]))
    for slide, shift in moves:
        if clear(slide, shift):
            return float(slide), float(shift)
    return 0.0, 0.0


def _grip_plan(ctx: SkillContext, scene_name: str) -> tuple[Box, bool, list[Grasp] | None]:
    """How to grip the object: its box as seen now; whether by its rim; the grasps on its
    handle, if it is an open object wider than the fingers with a handle the cameras see
    (a mug: `interior.handle_grasps`). Held by the handle, it hangs ahead of the hand, which
    lets `place` put it under a roof (the microwave). Otherwise as `_fits_the_fingers` says."""
    handled = interior.handle_grasps(ctx, scene_name)
    if handled is not None:
        return handled[0], False, handled[1]
    return (*_fits_the_fingers(ctx, scene_name), None)


def _fits_the_fingers(ctx: SkillContext, scene_name: str) -> tuple[Box, bool]:
    """The object's box as seen now, and whether it is to be grasped by its rim: an object
    open at the top (a bowl) wider than the fingers open, seen so or named so (`OPEN_KINDS`:
    tipped, the cameras may not see into it). Fails at once on a closed one whose
    narrower side is wider than the fingers open, instead of spending the episode's steps on
    grasps that cannot close on it."""
    box, _ = perception.locate_box(ctx, scene_name)
    width = grasp_candidates(ctx, box).best.width
    reach = ctx.env.scene.gripper().max_width
    if width <= reach + WIDTH_SLACK:
        return box, False
    if perception.is_hollow(perception.object_points(ctx, scene_name)[0], box):
        return box, True
    if OPEN_KINDS & set(ctx.env.scene.object(scene_name).category.split("_")):
        # Tipped over, its middle no longer shows below its rim, and still a bowl: the black
        # bowl leaning on the ramekin falls from 12 to 50 degrees in its first 5 steps
        # (libero_spatial task 5, every seed); it is gripped by the rim (its high side,
        # `_rim_grasps`), not refused (seed 3: refused, then gripped so from the home pose,
        # 31 steps later). What it is comes from the scene's object list: a look at it in
        # the air says nothing (LIBERO-PRO's 9.4 cm soup can, dropped in, looked open).
        ctx.note("a bowl tipped over: gripped by the rim", object=scene_name)
        return box, True
    raise SkillFailure(
        f"{scene_name} is {width:.3f} m across its narrower side and the fingers open "
        f"{reach:.3f} m: it cannot be grasped from above"
    )


def _rim_grasps(ctx: SkillContext, scene_name: str, box: Box) -> list[Grasp]:
    """Grasps on the rim of an open object, one finger inside its wall, one outside, the
    fingers closing along a radius: the two radii whose outer finger has the most room
    (nothing seen within reach of it at the fingers' height), among those the arm reaches.

    The outer finger needs the room: beside a neighbour or a drawer's wall it would land on
    it. Which radius is free is read from the points around, not assumed."""
    radius = min(box.half_extents[:2]) - RIM_IN
    points, _ = perception.object_points(ctx, scene_name)
    around = perception.surroundings(ctx, scene_name)
    center = np.asarray(box.center[:2])
    options = []
    for angle in np.deg2rad(np.arange(-180.0, 180.0, 22.5)):
        radial = np.array([np.cos(angle), np.sin(angle)])
        grip = center + radius * radial
        # The rim's height there: a bowl leaning on something has its rim higher on one side.
        near = points[np.linalg.norm(points[:, :2] - grip, axis=1) < 0.015]
        z = (float(near[:, 2].max()) if len(near) else box.top) - RIM_DOWN
        outer = center + (radius + FINGER_REACH) * radial
        low = around[around[:, 2] > z - 0.03]
        room = float(np.min(np.linalg.norm(low[:, :2] - outer, axis=1))) if len(low) else 1.0
        clear = _hand_clear(around, grip, radial, z)
        options.append((clear, round(min(room, 0.05), 2), -radial[0], [*grip, z], angle))
    rims = [o[3][2] for o in options]
    # With the room alike: on a tilted rim (leaning on something) its high side, where the
    # wall stands nearly upright between the fingers (the low side leans out and slips: task
    # 5's bowl on the ramekin, seeds 0-4, 1/5 first grasps held on the near side, 4/5 on the
    # high side); on a level one the near side (towards the robot, -x), the arm's easiest reach.
    # First those whose hand comes down clear of what hangs over the object (an open drawer).
    tilted = max(rims) - min(rims) > TILT
    options.sort(key=lambda o: (o[0], o[1], o[3][2] if tilted else o[2]), reverse=True)
    # What stands tall near it (a cabinet beside the bowl) may meet the forearm: where it
    # does, the grasps whose arm clears it come first, at the yaw that clears it. Only the
    # scene's objects and fixtures: what else the depth sees is the room's walls and the
    # robot's own markers.
    things = perception.scene_points(ctx, exclude=scene_name)
    tall = things[
        (things[:, 2] > min(rims) + ARM_ABOVE_GRIP)
        & (np.linalg.norm(things[:, :2] - center, axis=1) < ARM_NEAR)
    ]
    passes = [True, False] if len(tall) else [False]
    grasps = []
    for check_arm in passes:
        for _, room, _, grip, angle in options:
            # The fingers close along hand y, world -y at yaw 0: turn it onto the radius.
            yaw = wrap_half_turn(angle + np.pi / 2)
            position = [float(v) for v in grip]
            if check_arm:
                yaw = motion.clear_grip_yaw(ctx, position, yaw, tall)
            elif motion.grip_yaw(ctx, position, yaw) is None:
                continue
            if yaw is None or any(np.allclose(g.position, position) for g in grasps):
                continue
            ctx.note(
                "rim grasp", angle=round(float(np.rad2deg(angle))), room=room, arm_clear=check_arm
            )
            grasps.append(Grasp(position=position, yaw=yaw, width=2 * RIM_IN, yaw_fixed=check_arm))
            if len(grasps) == 2:
                return grasps
    return grasps


def _hand_clear(around: np.ndarray, grip, closing, z: float) -> bool:
    """Whether the hand's body, coming down to a grip at `grip` (x, y) and height `z` with
    its fingers closing along `closing`, meets nothing seen: no point above HAND_BODY_ABOVE
    over the grip within HAND_HALF_LENGTH of it along the closing axis and HAND_HALF_WIDTH
    across (libero_goal task 3: the top drawer opened over the bowl's far half stopped the
    hand 4 cm over the rim, every seed)."""
    rel = around[around[:, 2] > z + HAND_BODY_ABOVE, :2] - np.asarray(grip)[:2]
    along = np.abs(rel @ np.asarray(closing))
    across = np.abs(rel @ np.array([-closing[1], closing[0]]))
    return int(np.count_nonzero((along < HAND_HALF_LENGTH) & (across < HAND_HALF_WIDTH))) <= 2


@skill
def place(
    ctx: SkillContext,
    container: str,
    relation: Literal["in", "on", "left_of", "right_of", "front_of", "behind"] = "in",
) -> Placed:
    """Put what is held "in" a container (a free slot) or "on" a support (centred on its top):
    an object, or a fixture's surface (the stove's burner, the cabinet's top, the wine rack's
    top: `perception.fixture_surface`, where on the fixture from LIBERO's region site).

    It is released there and the hand backs off up. "in": the slot comes from the container's
    inside as seen now (`packing.plan_slots`): room for the item and the fingers, the hand
    square to the walls, as low as what is there allows. "on" (`_place_on`): the held object's
    offset from the hand and how far it hangs are read from a look at it in the hand.
    "left_of"/"right_of"/"front_of"/"behind" (as the front camera sees the table, the way
    LIBERO's instructions say it): on the surface beside the container, BESIDE_GAP apart. An
    object with no room "in" a container too small for it (cream cheese in a bowl) is rested
    on the container's top centre instead. A phrase naming nothing fails naming the scene's
    objects and fixtures. Fails when nothing is held, and when no reachable room is left in a
    fixture or in a container for an item it holds."""
    drawer = articulation.drawer_inside(ctx, container) if relation == "in" else None
    if drawer:  # onto the floor of the open drawer, centred on its spot
        return _place_on(ctx, *drawer)
    part = _named_part(ctx, container)
    if part is not None:  # "the back compartment (of the caddy)": in from above its walls
        return _place_on(ctx, part[0], perception.fixture_part(ctx, *part))
    scene_name = perception.ground_name(ctx, container, fixtures=True)
    fixture = ctx.env.scene.object(scene_name).fixture
    roofed = interior.heating_region(ctx, scene_name) if fixture and relation == "in" else None
    if roofed is not None:  # under a roof: in level through the open front
        return _place_under_roof(ctx, scene_name, *roofed)
    if relation in BESIDE:
        yaw = _beside_yaw(ctx, scene_name, relation)
        return _place_on(ctx, scene_name, _beside(ctx, scene_name, relation, yaw), yaw)
    if relation == "on":
        surface = perception.fixture_surface(ctx, scene_name) if fixture else None
        return _place_on(ctx, scene_name, surface, free=True)
    # Its frame from perception, at whatever yaw it stands (`calibration.CONTAINER_TURN`).
    box = perception.locate_container(ctx, scene_name)
    held = ctx.memory.get("held")
    item = _held_item(ctx, held)
    slot, yaw = _plan(ctx, scene_name, box, held, item)
    if slot is None:
        if not held or fixture:
            raise SkillFailure(f"no reachable room for {held or 'the held object'} in {scene_name}")
        # Too small a container for it to go in (cream cheese in a bowl): LIBERO counts it
        # "on" the container when it rests on it, so rest it on its top centre.
        ctx.note("no room inside: resting it on top", item=held, container=scene_name)
        return _place_on(ctx, scene_name)
    slot, yaw = _lower_into(ctx, scene_name, box, held, item, slot, yaw)
    _gripper(ctx, OPEN)
    _set_down(ctx, held, item, slot, yaw, min_release=box.top - HAND_BELOW_RIM)
    if held:
        ctx.memory.setdefault("placed", set()).add(held)
    ctx.memory.pop("held", None)
    pos = ctx.env.scene.gripper().eef_pos
    up = [pos[0], pos[1], motion.travel_height(ctx)]
    motion.servo(ctx, up, yaw, OPEN, tolerance=0.02, max_steps=40)
    return Placed(released=True, position=[*slot.center, slot.release_z])


def _named_part(ctx: SkillContext, container: str) -> tuple[str, str] | None:
    """(scene object, part) for a phrase naming a part: "the back compartment of the caddy",
    or "the back compartment" alone, of the one thing in the scene with such a part
    (`perception.part_owner`); None when the phrase names no part."""
    part = parse_part(container)
    if part is not None:
        return perception.ground_name(ctx, part[1], fixtures=True), part[0]
    bare = parse_bare_part(container)
    return (perception.part_owner(ctx, bare), bare) if bare is not None else None


def _place_under_roof(ctx: SkillContext, fixture: str, site, out: np.ndarray) -> Placed:
    """Put what is held inside a fixture with a roof (the microwave), in its region `site`
    (`interior.heating_region`): the held object's centre interior.INSIDE_DEPTH past the
    region's front edge, across in its middle. The hand goes down in front of the opening
    with the object just over the region's floor, moves in level along -`out`, lowers it
    gently until it stands, lets go and backs out the way it came before going up. The
    object's offset from the hand and how far it hangs are read from a look at it in the
    hand; where the region and its floor are is the site's (privileged: under the roof the
    cameras see nothing)."""
    held = ctx.memory.get("held")
    if not held:
        raise SkillFailure(f"nothing is held to put in {fixture}")
    door = interior.door_angle(ctx, fixture)
    if door is not None and door < DOOR_OPEN_ENOUGH:
        raise SkillFailure(f"the door of {fixture} is closed: open it first")
    in_hand, _ = perception.locate_box(ctx, held)
    eef = ctx.env.scene.gripper().eef_pos
    offset = np.asarray(eef[:2]) - np.asarray(in_hand.center[:2])
    hang = float(np.clip(eef[2] - in_hand.bottom, 0.0, 0.2))
    center, half = np.asarray(site.pos, float), np.asarray(site.half_size, float)
    # The site's half extent along `out` (its frame's y, `heating_region`).
    front = center[:2] + out * half[1]
    target = front - out * interior.INSIDE_DEPTH + offset
    floor = center[2] - half[2]
    level = floor + hang + ENTRY_CLEAR
    start = target + out * interior.APPROACH
    yaw = motion.hand_yaw(ctx)
    tallest = perception.tallest_along(ctx, eef[:2], start, exclude=held)
    cruise = max(tallest + hang + CARRY_CLEARANCE, level + 0.05)
    motion.travel(ctx, [*start, level], yaw, CLOSE, safe_z=cruise, tolerance=0.006)
    motion.servo(ctx, [*target, level], yaw, CLOSE, max_steps=80, tolerance=0.006)
    motion.servo(ctx, [*target, floor + hang - 0.02], yaw, CLOSE, max_steps=40, gentle=True)
    _gripper(ctx, OPEN)
    ctx.memory.setdefault("placed", set()).add(held)
    ctx.memory.pop("held", None)
    # The hand stops short of the roof, and so may what hangs ahead of it: back off, close the
    # fingers and nudge it in low, their tips near its bottom, the hand's body still outside.
    reached = ctx.env.scene.gripper().eef_pos.copy()
    low = floor + interior.NUDGE_HEIGHT
    motion.servo(ctx, [*(reached[:2] + out * interior.BACK_OFF), reached[2]], yaw, OPEN)
    motion.servo(ctx, [*(reached[:2] + out * interior.BACK_OFF), low], yaw, CLOSE)
    motion.servo(ctx, [*(reached[:2] - out * interior.NUDGE), low], yaw, CLOSE, max_steps=60)
    pos = ctx.env.scene.gripper().eef_pos
    motion.servo(
        ctx, [*(pos[:2] + out * interior.APPROACH), pos[2] + 0.01], yaw, OPEN, max_steps=60
    )
    pos = ctx.env.scene.gripper().eef_pos
    motion.servo(ctx, [pos[0], pos[1], cruise], yaw, OPEN, tolerance=0.02, max_steps=40)
    return Placed(released=True, position=[*(target - offset).tolist(), floor])


def _beside_yaw(ctx: SkillContext, anchor: str, relation: str) -> float:
    """The hand yaw to put what is held down beside `anchor`: the fingers closing across the
    side's axis, so that neither they nor the hand (about 0.2 m long along the closing axis)
    reach towards the anchor and what stands on it (libero_10_lan task 6: closing along y,
    the hand hit the mug just put on the plate when it put the pudding to the plate's right,
    seed 0). Of the two such yaws, the reachable one nearer the hand's now
    (`motion.grip_yaw`); the hand's yaw now when neither is."""
    now = motion.hand_yaw(ctx)
    axis, _ = SIDE_AXES[BESIDE[relation]]
    # The fingers close along hand y, world -y at yaw 0: across x at yaw 0, across y at pi/2.
    across = np.pi / 2 if axis == 1 else 0.0
    box, _ = perception.locate_box(ctx, anchor)
    yaw = motion.grip_yaw(ctx, [*box.center[:2], motion.travel_height(ctx)], across)
    return now if yaw is None else yaw


def _beside(ctx: SkillContext, anchor: str, relation: str, yaw: float | None = None) -> Box:
    """The patch of the surface `anchor` stands on, beside it on the side `relation` names
    as the front camera sees the table (`instructions.SIDE_AXES`), room for what is held and
    BESIDE_GAP between: a flat box, its top that surface. `yaw`: the hand's yaw there (what
    is held turns with it)."""
    held = ctx.memory.get("held")
    if not held:
        raise SkillFailure(f"nothing is held to place {relation.replace('_', ' ')} {anchor}")
    box, _ = perception.locate_box(ctx, anchor)
    in_hand, _ = perception.locate_box(ctx, held)
    if yaw is not None:
        turn = wrap_angle(yaw - motion.hand_yaw(ctx))
        in_hand = in_hand.model_copy(update={"yaw": in_hand.yaw + turn})
    axis, sign = SIDE_AXES[BESIDE[relation]]
    x, y = beside(box, in_hand, axis, sign, BESIDE_GAP)
    return Box(center=(x, y, box.bottom - 0.005), half_extents=(0.01, 0.01, 0.005), yaw=0.0)


def _place_on(
    ctx: SkillContext,
    support: str,
    surface: Box | None = None,
    yaw: float | None = None,
    free: bool = False,
) -> Placed:
    """Put what is held onto `support`'s top, its centre over the support's centre: the offset
    of the held object from the grip site and how far it hangs below are read from a look at
    it in the hand; lower gently until it stops on the top, release, back off up. `surface`:
    the part of a fixture to put it on (`perception.fixture_surface`), instead of the top of
    the support's box. `yaw`: the hand's yaw to put it down at (the offset turns with it);
    the hand's yaw now by default. `free`: not over the centre if something already stands
    there, nor so that what later steps put on the same support finds no room
    (`_free_spot`)."""
    held = ctx.memory.get("held")
    if not held:
        raise SkillFailure(f"nothing is held to place on {support}")
    box = surface if surface is not None else perception.locate_box(ctx, support)[0]
    in_hand, _ = perception.locate_box(ctx, held)
    eef = ctx.env.scene.gripper().eef_pos
    offset = _turned(_held_offset(ctx, held, eef, in_hand), ctx, yaw)
    hang = float(np.clip(eef[2] - in_hand.bottom, 0.0, 0.2))
    yaw = motion.hand_yaw(ctx) if yaw is None else yaw
    spot = np.asarray(box.center[:2])
    release = box.top + hang
    if free:
        fixture = surface is not None
        spot, yaw, offset = _free_spot(
            ctx, support, box, held, offset, yaw, fixture, release + 0.02
        )
    target = spot + offset
    # Carried just over what stands on the way, not over the tallest thing in the scene.
    tallest = perception.tallest_along(ctx, eef[:2], target, exclude=held)
    cruise = max(tallest + hang + CARRY_CLEARANCE, release + 0.05)
    motion.travel(ctx, [*target, release + 0.02], yaw, CLOSE, safe_z=cruise, tolerance=0.005)
    motion.servo(ctx, [*target, release - 0.02], yaw, CLOSE, max_steps=50, gentle=True)
    _gripper(ctx, OPEN)
    ctx.memory.setdefault("placed", set()).add(held)
    ctx.memory.pop("held", None)
    pos = ctx.env.scene.gripper().eef_pos
    motion.servo(ctx, [pos[0], pos[1], cruise], yaw, OPEN, tolerance=0.02, max_steps=40)
    pos = ctx.env.scene.gripper().eef_pos
    if motion.elbow_bend(ctx) < motion.ELBOW_MARGIN or not motion.comfortable(ctx, pos, yaw):
        # Left out there the arm hides the table behind it from the front camera (libero_pro
        # 10_swap task 8 seed 0: the second moka pot, seen half hidden, was gripped on its
        # lid three times) and its elbow, straight, traps the controller (`motion.unfold`).
        ctx.note("hand withdrawn from beyond easy reach", at=np.round(pos, 3).tolist())
        if motion.elbow_bend(ctx) < motion.UNFOLD_BENT:
            motion.unfold(ctx, OPEN)
        motion.servo(ctx, [*HOME_XY, pos[2]], yaw, OPEN, tolerance=0.03, max_steps=60)
    return Placed(released=True, position=[*target.tolist(), release])


def _free_spot(
    ctx: SkillContext,
    support: str,
    surface: Box,
    held: str,
    offset: np.ndarray,
    yaw: float,
    fixture: bool,
    hand_z: float,
) -> tuple[np.ndarray, float, np.ndarray]:
    """Where on `surface` to put the held object's centre (`geometry.free_spot`), and the hand
    yaw and offset (grip site from that centre) to put it down with: clear, by PLACE_GAP, of
    what the cameras see standing there, its footprint the box it showed when picked, turned
    as the hand turned since, and the open fingers around the grip site (`offset` from its
    centre); leaving room for the objects later steps put "on" the same support
    (`next_step`'s `later_places`: as they stand now, the fingers across their narrower
    side). Within a fixture's region its centre keeps SPOT_EDGE in from the edge; on an
    object, within ON_OBJECT_REACH of its centre (libero_10 task 8: both moka pots went to
    the burner's centre, the second onto the first, every seed).

    Where the arm does not reach over the region's centre (the hand `hand_z` high) with its
    elbow bent (`motion.comfortable`), the spots nearest the robot's base come first, and
    the held object may be turned a quarter either way (`_turns`) if that plans its spot and
    those to come nearer the base (libero_pro 10_swap task 8: the stove on the far edge of
    the table, where a hand pointing down reaches only the region's near edge: both moka
    pots must stand there side by side, their handles towards the base, or the second went 8
    cm beyond the first, the servo stalled 5 cm short and it knocked the first off)."""
    center = np.asarray(surface.center[:2])
    toward = None
    if fixture:
        reach = np.maximum(np.asarray(surface.half_extents[:2]) - SPOT_EDGE, 0.0)
        if not motion.comfortable(ctx, [*(center + offset), hand_z], yaw):
            toward = motion.base_xy(ctx)
    else:
        reach = np.full(2, ON_OBJECT_REACH)
    # The direction the arm reaches in to get there: things long along it stand side by side.
    radial = None if toward is None else float(np.arctan2(*(center - toward)[::-1]))
    later = []
    for name, target, relation in ctx.memory.get("later_places", []):
        try:
            if relation != "on" or perception.ground_name(ctx, target, fixtures=True) != support:
                continue
            box = perception.locate_box(ctx, perception.ground_name(ctx, name))[0]
        except SkillFailure:
            continue
        turns = [0.0, np.pi / 2]
        if radial is not None:
            turns.append(wrap_half_turn(radial - _long_axis(box)))
        later.append([_standing_footprint(box, turn) for turn in turns])
    footprint = np.concatenate([_held_footprint(ctx, held, yaw), _fingers(offset, yaw)])
    # Turned about the grip site the footprint stays within its farthest point's circle.
    around = float(np.max(np.linalg.norm(footprint, axis=1))) + PLACE_GAP + float(np.max(reach))
    occupied = perception.standing_on(ctx, support, surface, around, exclude=held)[:, :2]
    best = None
    options = [(yaw, offset)]
    if radial is not None:
        # Whether the wrist turns so is asked where the hand is (the region's near edge may be
        # a centimetre beyond what the IK calls reached; the wrist's range is alike there).
        near = ctx.env.scene.gripper().eef_pos[:2] - offset
        turns = [np.pi / 2, -np.pi / 2]
        picked = ctx.memory.get("picked_box")
        if picked is not None:  # its long axis along the reach
            now = _long_axis(picked) + yaw - ctx.memory.get("picked_yaw", yaw)
            turns.insert(0, wrap_half_turn(radial - now))
        options += _turns(ctx, near, hand_z, yaw, offset, turns)
    for turn_yaw, turn_offset in options:
        shape = np.concatenate(
            [_held_footprint(ctx, held, turn_yaw), _fingers(turn_offset, turn_yaw)]
        )
        spot, clear, cost = plan_spot(center, reach, occupied, shape, later, PLACE_GAP, toward)
        if best is None or (clear, -cost) > (best[1], -best[2]):
            best = (spot, clear, cost, turn_yaw, turn_offset)
    spot, clear, cost, yaw, offset = best
    if len(occupied) or later or toward is not None:
        ctx.note(
            "place spot",
            at=np.round(spot, 3).tolist(),
            off_centre=round(float(np.linalg.norm(spot - center)), 3),
            clear=clear,
            later=len(later),
            toward_base=toward is not None,
            yaw=round(float(yaw), 2),
            cost=round(float(cost), 3),
        )
    return spot, yaw, offset


def _long_axis(box: Box) -> float:
    """The direction (rad, world) of a box's longer side in the table plane."""
    hx, hy = box.half_extents[:2]
    return float(box.yaw if hx >= hy else box.yaw + np.pi / 2)


def _turns(
    ctx: SkillContext,
    near: np.ndarray,
    hand_z: float,
    yaw: float,
    offset: np.ndarray,
    turns: list[float],
) -> list[tuple[float, np.ndarray]]:
    """The hand yaws `turns` from `yaw` (or the same turned half round, `motion.grip_yaw`)
    the arm reaches with at `near` (the grip site `offset` from it, turned with the hand),
    each with the offset so turned."""
    out = []
    for quarter in turns:
        if abs(quarter) < 0.05:
            continue  # the yaw as it is: already an option
        c, s = np.cos(quarter), np.sin(quarter)
        turned = np.array([c * offset[0] - s * offset[1], s * offset[0] + c * offset[1]])
        option = motion.grip_yaw(ctx, [*(near + turned), hand_z], wrap_angle(yaw + quarter))
        if option is None:
            continue
        half = wrap_angle(option - yaw - quarter)  # 0 or a half turn: the offset flips
        if abs(half) > np.pi / 2:
            turned = -turned
        out.append((option, turned))
    return out


def _held_footprint(ctx: SkillContext, held: str, yaw: float) -> np.ndarray:
    """The held object's footprint around its centre (points), as it will stand put down at
    the hand's `yaw`: the box it showed when picked, turned as the hand turns; the box seen
    in the hand if it was not picked here."""
    picked = ctx.memory.get("picked_box")
    if picked is None:
        picked = perception.locate_box(ctx, held)[0]
        turn = wrap_angle(yaw - motion.hand_yaw(ctx))
    else:
        turn = wrap_angle(yaw - ctx.memory.get("picked_yaw", yaw))
    return rect_samples(picked.half_extents[:2], picked.yaw + turn)


def _fingers(offset: np.ndarray, yaw: float) -> np.ndarray:
    """The open fingers' footprint around a grip site `offset` from the held object's
    centre: FINGER_REACH either way along the closing axis (hand y), FINGER_SIDE across."""
    return rect_samples((FINGER_SIDE, FINGER_REACH), yaw, center=offset)


def _standing_footprint(box: Box, turn: float) -> np.ndarray:
    """An object's footprint, turned by `turn` about its centre, with the open fingers of a
    top-down grasp across its narrower side (`grasp_candidates`)."""
    hx, hy = box.half_extents[:2]
    across_y = hx >= hy
    body = rect_samples((hx, hy), box.yaw + turn)
    reach = (FINGER_SIDE, FINGER_REACH) if across_y else (FINGER_REACH, FINGER_SIDE)
    return np.concatenate([body, rect_samples(reach, box.yaw + turn)])


def _held_offset(ctx: SkillContext, held: str, eef, in_hand: Box) -> np.ndarray:
    """The hand's horizontal offset from the held object's centre, at the hand's yaw now:
    for an object held by its rim, as the grasp set it (`pick`'s `rim_offset`, turned as
    the hand turned since); else from the look at it in the hand."""
    rim = ctx.memory.get("rim_offset", {}).get(held)
    if rim is None:
        return np.asarray(eef[:2]) - np.asarray(in_hand.center[:2])
    offset, at_yaw = rim
    turn = wrap_angle(motion.hand_yaw(ctx) - at_yaw)
    c, s = np.cos(turn), np.sin(turn)
    return np.array([c * offset[0] - s * offset[1], s * offset[0] + c * offset[1]])


def _turned(offset: np.ndarray, ctx: SkillContext, yaw: float | None) -> np.ndarray:
    """A horizontal offset fixed to the hand, as it will be once the hand is turned to `yaw`."""
    if yaw is None:
        return offset
    turn = wrap_angle(yaw - motion.hand_yaw(ctx))
    c, s = np.cos(turn), np.sin(turn)
    return np.array([c * offset[0] - s * offset[1], s * offset[0] + c * offset[1]])


def _lower_into(
    ctx: SkillContext,
    container: str,
    box: Box,
    held: str | None,
    item: packing.HeldItem,
    slot: packing.Slot,
    yaw: float,
) -> tuple[packing.Slot, float]:
    """Bring the held item over the slot and lower it in; return the slot and yaw it ended at.

    It stops square over the slot with the item just above the rim before going in: lowering
    while the hand still catches up sideways drags the item's bottom across the rim. Lowering
    that stops well above the release height is blocked: the item rests on a rim or on a
    neighbour's edge, and let go there it perches. Then it backs up over the rim and goes
    down again where the room, planned anew, keeps more clearance."""
    cruise = max(motion.travel_height(ctx), box.top + item.hang + 0.04)
    above = box.top + item.hang + 0.015
    for extra in (None, *UNBLOCK_MARGINS):
        if extra is not None:
            pos = ctx.env.scene.gripper().eef_pos
            if pos[2] <= slot.release_z + BLOCKED:
                break
            ctx.note("lowering blocked", height=round(float(pos[2] - slot.release_z), 3))
            motion.servo(ctx, [*pos[:2], max(above, pos[2] + 0.02)], yaw, CLOSE, tolerance=0.01)
            again, again_yaw = _plan(ctx, container, box, held, item, extra)
            if again is None:
                break
            slot, yaw, cruise = again, again_yaw, above
        entry = [*slot.center, max(slot.release_z, above)]
        motion.travel(ctx, entry, yaw, CLOSE, safe_z=cruise, tolerance=0.005)
        motion.servo(ctx, [*slot.center, slot.release_z], yaw, CLOSE, max_steps=50, gentle=True)
    return slot, yaw


def _set_down(
    ctx: SkillContext,
    held: str | None,
    item: packing.HeldItem,
    slot: packing.Slot,
    yaw: float,
    min_release: float,
) -> None:
    """After the fingers open, look whether the item came down onto its support; if it still
    hangs (on one open finger, its pad pressed to the item's side), lower the open hand until
    the item stands, before the hand climbs away and lifts it with that finger (grocery
    object task 7 seed 3: the milk hung 2 cm up, rose with the hand, fell 1.5 cm off its
    slot and left no floor for the can)."""
    if not held:
        return
    try:
        top = perception.locate_box(ctx, held)[0].top
    except SkillFailure as exc:
        # Unseen, it came down out of sight, below the rim, under the open hand (libero_pro
        # 10_object task 7: the 1.8 cm cream cheese lying flat in the basket): one hanging on
        # a finger would hang in view above the rim.
        ctx.note("item out of sight after release", item=held, seen=str(exc))
        return
    hanging = top - (slot.support + item.height)
    if hanging < HANGING:
        return
    ctx.note("item hangs after release", by=round(float(hanging), 3))
    pos = ctx.env.scene.gripper().eef_pos
    low = max(pos[2] - hanging - 0.005, min_release)
    motion.servo(ctx, [*pos[:2], low], yaw, OPEN, max_steps=30, gentle=True)


def _plan(
    ctx: SkillContext,
    container: str,
    box: Box,
    held: str | None,
    item: packing.HeldItem,
    margin: float = packing.MARGIN,
) -> tuple[packing.Slot | None, float]:
    """The best reachable slot for the held item in the container as it is now, and the hand
    yaw there. The hand's body is wider than the container: it stops above the rim, the
    fingers below."""
    inside = perception.contents(ctx, container, box, exclude=held)
    min_release = box.top - HAND_BELOW_RIM
    to_pack = ctx.memory.get("to_pack")  # None: no `next_item`, one item to place
    then = None if to_pack is None else [h for name, h in to_pack.items() if name != held]
    slots = packing.plan_slots(box, inside, item, min_release=min_release, margin=margin, then=then)
    return _first_reachable(ctx, slots)


def _first_reachable(
    ctx: SkillContext, slots: list[packing.Slot]
) -> tuple[packing.Slot | None, float]:
    """The best slot the arm reaches, and the hand yaw to use there (`motion.grip_yaw`)."""
    for slot in slots:
        yaw = motion.grip_yaw(ctx, [*slot.center, slot.release_z], slot.yaw)
        if yaw is not None:
            return slot, yaw
    return None, 0.0


def _held_item(ctx: SkillContext, held: str | None) -> packing.HeldItem:
    """The held object's footprint along the hand's axes, from how it lay when it was picked,
    and how far it hangs below the grip site, from a look at it in the hand."""
    eef_z = ctx.env.scene.gripper().eef_pos[2]
    picked = ctx.memory.get("picked_box")
    if not held or picked is None:
        return packing.HeldItem(half_x=0.03, half_y=0.03, height=0.06, hang=0.03)
    in_hand = perception.locate_box(ctx, held)[0]
    half_x, _ = packing.footprint_along(picked, ctx.memory.get("picked_yaw", 0.0))
    # Across the closing axis the fingers measure the object exactly; along the hand the box
    # from depth, which runs a few mm wide or narrow, is no narrower than that (the fingers
    # close across the narrow side).
    half_y = _width(ctx) / 2
    half_x = max(half_x - BOX_BIAS, half_y)
    hang = float(np.clip(eef_z - in_hand.bottom, 0.0, 0.2))
    return packing.HeldItem(
        half_x=half_x, half_y=half_y, height=2 * picked.half_extents[2], hang=hang
    )


def _footprint_to_come(hx: float, hy: float) -> tuple[float, float]:
    """The half footprint to leave floor for, from an item's box as seen where it stands.

    The box runs wide along its longer side by the points on silhouette edges (`BOX_BIAS`),
    but not along its shorter one, often a face seen edge-on: a can's shorter side is its
    diameter as it is, less that it came out 2.5 mm narrow, and room left for so small a can
    was too little (grocery object task 2 seeds 2, 4: it went on top of the milk)."""
    if hx >= hy:
        return hx - BOX_BIAS / 2, hy
    return hx, hy - BOX_BIAS / 2


@skill
def verify_in_container(ctx: SkillContext, name: str, container: str) -> Inside:
    """Look whether an object rests inside a container (its centre within the container's box)."""
    scene_name = perception.ground_name(ctx, name)
    obj = perception.locate_box(ctx, scene_name)[0]
    box = perception.locate_box(ctx, perception.ground_name(ctx, container))[0]
    return Inside(inside=_inside(obj, box, ctx.memory.get("heights", {}).get(scene_name)))


def _inside(obj: Box, container: Box, height: float | None) -> bool:
    """Within the walls (the box is the outer hull; walls and a margin take 2.5 cm), centre
    below the rim: not perched on top of what is already in there.

    The walls hide the lower part of what stands inside, so the centre comes from the visible
    top and the height the object showed when it stood on the table, if it was seen there."""
    x, y, z = obj.center
    if height is not None:
        z = obj.top - height / 2
    within = container.contains([x, y, container.center[2]], margin=-INSIDE_MARGIN)
    return bool(within and z < container.top - 0.01)


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


@skill(scene=False)
def read_task(ctx: SkillContext) -> TaskInfo:
    """Read the instruction: the items to move and the container they go to.

    Fails when the instruction is not a pick-and-place or pack instruction, saying how to
    write one."""
    prompt = ctx.instruction
    parsed = parse_instruction(prompt)
    if parsed is None:
        raise SkillFailure(
            f"cannot read items and container from the instruction {prompt!r}; write it as "
            "'pick up the X and place it in the Y' or 'pack A, B and C into the Y'"
        )
    return TaskInfo(prompt=prompt, items=parsed.items, container=parsed.container)


@skill
def next_item(
    ctx: SkillContext, items: list[str], container: str, max_attempts: int = 2
) -> NextItem:
    """The next listed item not yet in the container and not tried `max_attempts` times.

    Tall things go first, the widest first, then cans, then flat things (`packing.KIND_ORDER`).
    An item that is over the container but not in it (perched on what is there) is not tried
    again: the fingers close on its neighbours too, and lifting drags the container along."""
    tries = ctx.memory.setdefault("next_item_attempts", {})
    placed = ctx.memory.get("placed", set())
    box = perception.locate_box(ctx, perception.ground_name(ctx, container))[0]
    # (packing order, item, scene name, footprint if it stands on the floor)
    remaining: list[tuple[tuple[int, float], str, str, tuple[float, float] | None]] = []
    blocked = 0
    for item in items:
        scene_name = perception.ground_name(ctx, item)
        try:
            found = perception.locate_box(ctx, scene_name)[0]
        except SkillFailure:  # unseen: buried in the container if this run put it there
            if scene_name not in placed:
                remaining.append(((len(packing.KIND_ORDER), 0.0), item, scene_name, None))
            continue
        if _inside(found, box, ctx.memory.get("heights", {}).get(scene_name)):
            continue
        if box.contains([*found.center[:2], box.center[2]]):
            blocked += 1
            continue
        hx, hy, hz = found.half_extents
        kind = packing.kind_of(2 * hz)
        half = None if kind == "flat" else _footprint_to_come(hx, hy)
        remaining.append(((packing.KIND_ORDER.index(kind), -hx * hy), item, scene_name, half))
    remaining.sort(key=lambda r: r[0])
    # The footprints still to stand on the container's floor, in order: `place` leaves room.
    ctx.memory["to_pack"] = {name: half for _, _, name, half in remaining if half is not None}
    for _, item, _, _ in remaining:
        if tries.get(item, 0) < max_attempts:
            tries[item] = tries.get(item, 0) + 1
            return NextItem(item=item, remaining=len(remaining) + blocked, done=False)
    return NextItem(item="", remaining=len(remaining) + blocked, done=True)
