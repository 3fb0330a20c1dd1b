"""Putting what is held on a support (`place_on`: an object's top, a fixture's surface, an open
drawer's floor, a compartment) or beside an anchor (`beside_yaw`, `beside_patch`), for the
`place` skill (place.py): where on the support it goes so that it, and what later steps put
there, find room (`_free_spot`), the footprints that takes, and the put-down itself."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from pytest_gap.instruction_references import SIDE_AXES
from pytest_gap.skills import motion, perception
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import (
    Box,
    beside,
    plan_spot,
    rect_samples,
    wrap_angle,
    wrap_half_turn,
)
from pytest_gap.skills.gripper import CLOSE, FINGER_REACH, FINGER_SIDE, OPEN, actuate
from pytest_gap.skills.registry import SkillFailure

# A held object's bottom passes this far over what stands on its way.
CARRY_CLEARANCE = 0.04
# place(relation=...) beside an anchor: the side, and the room left between the footprints.
BESIDE = {"left_of": "left", "right_of": "right", "front_of": "front", "behind": "back"}
BESIDE_GAP = 0.01  # just clear of the anchor (its box from depth runs a few mm wide)
# place(relation="on") where things already stand: the room kept between footprints (boxes
# from depth run a few mm wide); how far in from a fixture region's edge the held object's
# centre stays (LIBERO counts it on the region by its body's origin, which sits up to 1.2 cm
# off its box's centre: the moka pot's, towards its handle); how far off an object's centre
# it may go (LIBERO's On(a, b) for objects: centres within 0.03 m, `check_ontop`).
PLACE_GAP, SPOT_EDGE, ON_OBJECT_REACH = 0.01, 0.02, 0.015


# What `place` returns, whichever way it put the held object down.
class Placed(BaseModel):
    released: bool
    position: list[float]


def beside_yaw(ctx: SkillContext, anchor: str, relation: str) -> float:
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


def beside_patch(ctx: SkillContext, anchor: str, relation: str, yaw: float | None = None) -> Box:
    """The patch of the surface `anchor` stands on, beside it on the side `relation` names
    as the front camera sees the table (`instruction_references.SIDE_AXES`), room for what is
    held and BESIDE_GAP between: a flat box, its top that surface. `yaw`: the hand's yaw there
    (what is held turns with it)."""
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


def place_on(
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
    actuate(ctx, OPEN)
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
        motion.servo(ctx, [*motion.HOME_XY, pos[2]], yaw, OPEN, tolerance=0.03, max_steps=60)
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
    later = _later_footprints(ctx, support, radial)
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


def _later_footprints(ctx: SkillContext, support: str, radial: float | None) -> list:
    """Per object a later step puts "on" `support` (`next_step`'s `later_places`), the
    footprints it may stand with as it stands now (`_standing_footprint`): as it is and turned
    a quarter, and, given the direction the arm reaches in (`radial`), its long axis along it.
    One not found is left out."""
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
    return later


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
