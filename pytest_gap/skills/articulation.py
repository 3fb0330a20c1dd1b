"""Articulated fixtures: a cabinet's drawers (a slide joint each) and the microwave's door (a
hinge). `open_fixture` / `close_fixture` move them through the env's 7-D action; progress is
measured from the cameras (the drawer front seen along its slide axis), not from the joint.

Privileged reads, named where they happen: which joint moves a part, its axis and which way
is "open" (the model's joint and LIBERO's `default_open_ranges`: structure, not state), and
the height of each drawer (its BDDL region site, which rides on the drawer). The drawer's
position and its handle come from depth + segmentation. The microwave door's angle is read
from its joint (privileged state: the door is one segment with the body).

Here the drawers and the two skills; which joint moves which part, and the joint's frame, are
fixture_parts.py; the door's sweep is door.py.
"""

from __future__ import annotations

import numpy as np

from pytest_gap.skills import motion, perception, push
from pytest_gap.skills.calibration import (
    DRAWER_BAND,
    DRAWER_DEPTH,
    DRAWER_FRONT_IN,
    DRAWER_OPEN_TRAVEL,
    HANDLE_DEPTH,
    HANDLE_REACH,
    PUSH_TILT,
    STANDOFF,
)
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.door import close_door
from pytest_gap.skills.fixture_parts import (
    Articulated,
    Part,
    articulated_parts,
    joint_frame,
    resolve_part,
)
from pytest_gap.skills.geometry import Box, rotation_error
from pytest_gap.skills.gripper import CLOSE, OPEN
from pytest_gap.skills.registry import SkillFailure, skill

# A drawer counts as opened/closed when its front moved at least this share of the way.
ENOUGH = 0.8
# A level hand, fingers closing vertically, reaches this far from its grip site (its body's
# half width); it passes this much over what stands on its way.
LEVEL_HAND_REACH, LEVEL_CLEARANCE = 0.1, 0.02
# Where an open drawer hangs: from its closed front SWEEP_BEHIND in (the cabinet's face) to
# SWEEP_REACH out (LIBERO's wooden cabinet: its handle stands 0.158 m further out when
# opened, measured on libero_goal task 3). A thing to be picked is pushed until its centre
# is SWEEP_CLEAR outside it: a hand going down to it, 0.034 m to either side of its closing
# axis (robosuite's Panda), misses the drawer. SPOT_ROOM: what stands this near where it goes
# would be met.
SWEEP_BEHIND, SWEEP_REACH, SWEEP_CLEAR, SPOT_ROOM = 0.05, 0.17, 0.045, 0.01
# A push ends within a couple of centimetres of its aim, short of it more often (a round
# bowl pushed off its centre line slides aside): aimed this much further out, the first
# push is enough (libero_goal task 3 seed 4: aimed 1 cm further, it took a second round).
PUSH_SPARE = 0.02
APPROACH_LEAD = 0.02  # `_approach` aims this far past where it goes
PULL_PAST = 0.004


def _slide_out(ctx: SkillContext, part: Part) -> np.ndarray:
    """The horizontal unit vector a drawer slides out along."""
    axis, sign, _ = joint_frame(ctx, part.joint)
    out = sign * axis
    out[2] = 0.0
    return out / np.linalg.norm(out)


# -- perception of a drawer ------------------------------------------------------------------------
def _band_points(ctx: SkillContext, part: Part) -> np.ndarray:
    """The fixture's points seen at the drawer's height (its region site's, privileged)."""
    z = ctx.env.scene.region(part.region).pos[2]
    clouds = [np.zeros((0, 3))]
    for camera in ctx.cameras:
        frame = ctx.render(camera)
        clouds.append(frame.points(frame.mask(part.fixture)))
    points = np.concatenate(clouds)
    return points[np.abs(points[:, 2] - z) < DRAWER_BAND]


def drawer_front(ctx: SkillContext, part: Part) -> tuple[float, np.ndarray]:
    """How far out the drawer's handle stands along its slide axis (metres, in the world
    projected on the axis) and the handle's centre (x, y, z), both from the cameras: the
    fixture's points at the drawer's height standing out furthest along the axis."""
    out = _slide_out(ctx, part)
    points = _band_points(ctx, part)
    if len(points) < perception.MIN_PIXELS:
        raise SkillFailure(f"the {part.part} of {part.fixture} is not visible")
    along = points[:, :2] @ out[:2]
    front = float(np.percentile(along, 99.5))
    handle = points[along > front - HANDLE_DEPTH]
    center = np.median(handle, axis=0)
    center[:2] += out[:2] * (front - HANDLE_DEPTH / 2 - float(center[:2] @ out[:2]))
    return front, center


def _closed_front(ctx: SkillContext, part: Part) -> float | None:
    """Where a closed drawer's front stands: the least-out front of the fixture's other
    drawers as seen (None if it has no other)."""
    others = [
        p for p in articulated_parts(ctx) if p.fixture == part.fixture and p.part != part.part
    ]
    fronts = []
    for other in others:
        try:
            fronts.append(drawer_front(ctx, other)[0])
        except SkillFailure:
            continue
    return min(fronts) if fronts else None


def _facing(ctx: SkillContext, out: np.ndarray, closing: str, tilt: float = 0.0) -> np.ndarray:
    """The hand turned to point into a drawer front facing `out`, `tilt` radians down from
    level, the fingers closing "vertical"ly (on the handle bar's top and bottom) or "across"
    the front; of the two such orientations the one nearer the hand's now (the wrist turns
    least)."""
    level = -np.array([out[0], out[1], 0.0])
    z = np.cos(tilt) * level + np.sin(tilt) * np.array([0.0, 0.0, -1.0])
    across = np.array([-out[1], out[0], 0.0])
    y = across if closing == "across" else np.cross(z, across)
    options = [np.column_stack([np.cross(s * y, z), s * y, z]) for s in (1.0, -1.0)]
    _, now = motion.hand_pose(ctx)
    return min(options, key=lambda rot: float(np.linalg.norm(rotation_error(now, rot))))


def _servo_pose(ctx, position, rot, gripper, *, max_steps=150, tolerance=0.006, limit=1.0):
    """`motion.servo` for any hand orientation (it only points the hand down): drive the grip
    site to `position` with the hand at `rot`; give up after STALL steps without progress."""
    target = np.asarray(position, float)
    best, best_turn, best_at, error = np.inf, np.inf, 0, np.inf
    for i in range(max_steps):
        pos, now = motion.hand_pose(ctx)
        delta = target - pos
        turn = rotation_error(now, rot)
        error = float(np.linalg.norm(delta))
        if error < tolerance and float(np.linalg.norm(turn)) < 0.05:
            break
        turned = float(np.linalg.norm(turn))
        if error < best - 0.002 or turned < best_turn - 0.02:
            best, best_turn, best_at = min(best, error), min(best_turn, turned), i
        elif i - best_at > motion.STALL_STEPS:
            ctx.note(
                "servo stalled",
                target=target.round(3).tolist(),
                error=round(error, 4),
                turn=round(turned, 3),
            )
            break
        ctx.act(
            np.concatenate(
                [
                    np.clip(motion.POS_GAIN * delta, -limit, limit),
                    np.clip(motion.ROT_GAIN * turn, -1, 1),
                    [gripper],
                ]
            )
        )
    return error


def _open_drawer(ctx: SkillContext, part: Part) -> Articulated:
    """Grip the handle bar from the front, the hand level, and pull it out along the slide."""
    out = _slide_out(ctx, part)
    front, handle = drawer_front(ctx, part)
    closed = _closed_front(ctx, part)
    rot = _facing(ctx, out, "vertical")
    standoff = handle + out * STANDOFF
    perception.safe_height(ctx)
    # Level the hand on the way over to the front, at a height its level body clears what
    # stands on the way, then down to it: an episode's steps are few, and the climb to the
    # scene's travel height and back costs ~40 of them.
    cruise = _level_cruise(ctx, part.fixture, standoff)
    eef = ctx.env.scene.gripper().eef_pos
    if eef[2] < cruise - 0.02:
        motion.servo(ctx, [*eef[:2], cruise], motion.hand_yaw(ctx), OPEN, tolerance=0.02)
    _servo_pose(ctx, [*standoff[:2], cruise], rot, OPEN, max_steps=150, tolerance=0.015)
    _servo_pose(ctx, standoff, rot, OPEN, max_steps=150, tolerance=0.01)
    grip = handle - out * HANDLE_REACH
    _approach(ctx, grip, rot, OPEN, tolerance=0.005)
    for _ in range(12):
        _servo_pose(ctx, grip, rot, CLOSE, max_steps=1, tolerance=0.0)
    # To PULL_PAST beyond its travel, short of where it stops (0.158 m out, libero_goal task
    # 3): aimed past the stop, the pull waited out a stall against it (15 steps) every time.
    pulled = grip + out * (DRAWER_OPEN_TRAVEL + PULL_PAST)
    _approach(ctx, pulled, rot, CLOSE, tolerance=0.006, max_steps=120)
    # Let go while backing off: the way out is the way the drawer opens, so the fingers
    # still on the bar as they open pull it no further than it goes.
    pos = ctx.env.scene.gripper().eef_pos
    _servo_pose(ctx, pos + out * 0.08, rot, OPEN, max_steps=40, tolerance=0.02, limit=0.5)
    return _measure(ctx, part, front, closed, opening=True)


def _approach(ctx, position, rot, gripper, *, tolerance: float, max_steps: int = 60) -> float:
    """`_servo_pose` to `position`, aimed APPROACH_LEAD past it on the line there: the
    controller moves the hand in proportion to how far ahead it is aimed, and aimed at the
    point itself the last few centimetres crawl (2-4 mm a step: 20 steps for the 6 cm to a
    drawer's handle, libero_goal task 3 seed 0). Stops within `tolerance` of it, or stalled."""
    target = np.asarray(position, float)
    error, best, best_at = np.inf, np.inf, 0
    for i in range(max_steps):
        pos, _ = motion.hand_pose(ctx)
        gap = target - pos
        error = float(np.linalg.norm(gap))
        if error < tolerance:
            break
        if error < best - 0.002:
            best, best_at = error, i
        elif i - best_at > motion.STALL_STEPS:
            ctx.note("approach stalled", target=target.round(3).tolist(), error=round(error, 4))
            break
        aim = target + gap / error * APPROACH_LEAD
        _servo_pose(ctx, aim, rot, gripper, max_steps=1, tolerance=0.0)
    return error


def _level_cruise(ctx: SkillContext, fixture: str, standoff: np.ndarray) -> float:
    """The height to cross to a drawer's standoff at, the hand level: its body
    (LEVEL_HAND_REACH about the grip site) LEVEL_CLEARANCE over what the cameras see within
    that reach of the straight way there (the fixture left out: the standoff is in front of
    it); no lower than the standoff. A fixture the way crosses (the hand starting behind
    it) is not looked for: LIBERO's drawers face the robot."""
    eef = ctx.env.scene.gripper().eef_pos
    tallest = perception.tallest_along(
        ctx, eef[:2], standoff[:2], exclude=fixture, width=LEVEL_HAND_REACH
    )
    cruise = max(tallest + LEVEL_HAND_REACH + LEVEL_CLEARANCE, float(standoff[2]))
    ctx.note("drawer approach", cruise=round(cruise, 3), tallest=round(tallest, 3))
    return cruise


def _close_drawer(ctx: SkillContext, part: Part) -> Articulated:
    """Push the drawer in by its handle, the hand level and the closed fingers' tips on the
    bar, the hand lying across the front (so it stays clear of the table and the drawers
    above and below)."""
    out = _slide_out(ctx, part)
    front, handle = drawer_front(ctx, part)
    closed = _closed_front(ctx, part)
    standoff = handle + out * STANDOFF
    perception.safe_height(ctx)
    motion.travel(ctx, [*standoff[:2], motion.travel_height(ctx)], motion.hand_yaw(ctx), CLOSE)
    rot = _facing(ctx, out, "across", PUSH_TILT)
    _servo_pose(ctx, standoff, rot, CLOSE, max_steps=150, tolerance=0.01)
    # Past where a closed front stands: the cabinet stops it.
    target = handle - out * (DRAWER_OPEN_TRAVEL + 0.04)
    _servo_pose(ctx, target, rot, CLOSE, max_steps=150, tolerance=0.005, limit=0.5)
    pos = ctx.env.scene.gripper().eef_pos
    _servo_pose(ctx, pos + out * 0.1, rot, CLOSE, max_steps=40, tolerance=0.02)
    return _measure(ctx, part, front, closed, opening=False)


def _measure(ctx, part, front, closed, *, opening: bool) -> Articulated:
    """How far the front moved as the cameras see it now; fails when it did not do the job."""
    after, _ = drawer_front(ctx, part)
    moved = after - front if opening else front - after
    out_by = None if closed is None else after - closed
    ctx.note(f"{part.part} moved", moved=round(moved, 3), out_by=out_by and round(out_by, 3))
    is_open = (out_by if out_by is not None else moved) > ENOUGH * DRAWER_OPEN_TRAVEL
    if opening and not is_open:
        raise SkillFailure(
            f"the {part.part} front moved {max(moved, 0.0):.2f} m of {DRAWER_OPEN_TRAVEL:.2f} m"
        )
    if not opening and out_by is not None and out_by > 0.01:
        raise SkillFailure(
            f"the {part.part} front still stands {out_by:.2f} m out after a push of "
            f"{max(moved, 0.0):.2f} m"
        )
    return Articulated(fixture=part.fixture, part=part.part, moved=moved, open=is_open)


# -- skills ---------------------------------------------------------------------------------------
@skill
def open_fixture(ctx: SkillContext, name: str, keep_clear: list[str] | None = None) -> Articulated:
    """Open a drawer ("the middle drawer of the cabinet"): grip its handle and pull it out
    along its slide axis; `moved` is how far its front moved as the cameras see it.

    `keep_clear`: things to be picked later ("the bowl"). One standing where the open drawer
    will hang over it is first pushed out from under (`clear_sweep`): no grasp from above
    reaches it there.

    Fails naming the candidates when `name` fits no drawer, and with how far the front moved
    when it did not open (`drawer front moved 0.01 m of 0.14 m`). Privileged: the joint's axis
    and direction, the drawer's height (its region site)."""
    part = resolve_part(ctx, name)
    if part.part == "door":
        raise SkillFailure(f"opening the door of {part.fixture} is not supported yet")
    for thing in keep_clear or []:
        clear_sweep(ctx, part, thing)
    return _open_drawer(ctx, part)


def sweep(ctx: SkillContext, part: Part) -> tuple[np.ndarray, np.ndarray, tuple, tuple]:
    """Where a closed drawer will hang once open, from the cameras: its slide direction
    `out`, the direction across it, and the (min, max) it spans along `out` (from its front
    now to SWEEP_REACH past it) and across (the fixture's width seen at the drawer's
    height)."""
    out = _slide_out(ctx, part)
    across = np.array([-out[1], out[0]])
    front, _ = drawer_front(ctx, part)
    v = _band_points(ctx, part)[:, :2] @ across
    return out[:2], across, (front - SWEEP_BEHIND, front + SWEEP_REACH), (v.min(), v.max())


def clear_sweep(ctx: SkillContext, part: Part, thing: str) -> bool:
    """Push `thing` out from under where the drawer will hang once open (`sweep`), when it
    stands there lower than the drawer: to the nearest free spot SWEEP_CLEAR outside it,
    along the slide or across it either way (`push.push_to`). Return whether it was pushed;
    a thing not seen, not under the sweep, or with no free spot found is left (noted)."""
    try:
        name = perception.ground_name(ctx, thing)
        points, _ = perception.object_points(ctx, name)
    except SkillFailure as exc:
        ctx.note("sweep not checked", thing=thing, reason=str(exc))
        return False
    out, across, (u_lo, u_hi), (v_lo, v_hi) = sweep(ctx, part)
    drawer_z = ctx.env.scene.region(part.region).pos[2]  # privileged: the site rides on it
    low = points[points[:, 2] < drawer_z]
    u, v = low[:, :2] @ out, low[:, :2] @ across
    under = (u > u_lo) & (u < u_hi) & (v > v_lo) & (v < v_hi)
    if not under.any():
        return False
    others = perception.scene_points(ctx, exclude=name)
    others = others[others[:, 2] > float(points[:, 2].min()) + 0.01]
    center = (points[:, :2].min(axis=0) + points[:, :2].max(axis=0)) / 2
    radius = float(np.percentile(np.linalg.norm(low[:, :2] - center, axis=1), 98)) + SPOT_ROOM

    # Its centre SWEEP_CLEAR outside: a hand whose long side lies along that edge comes down
    # clear (`grasp._rim_grasps` looks for such a grasp).
    def clear(at, margin: float) -> bool:
        u, v = float(at @ out), float(at @ across)
        return u > u_hi + margin or v > v_hi + margin or v < v_lo - margin

    if clear(center, SWEEP_CLEAR):
        return False
    grid = np.arange(-0.25, 0.26, 0.01)
    spots = [center + a * out + b * across for a in grid if a >= 0 for b in grid]
    spots = [at for at in spots if clear(at, SWEEP_CLEAR + PUSH_SPARE)]
    for target in sorted(spots, key=lambda t: float(np.linalg.norm(t - center))):
        # Nothing seen where it goes nor on its way there: what it met would be pushed along,
        # or stop it.
        # Behind it (what it leans on now) is left out.
        way = target - center
        ahead = (others[:, :2] - center) @ way / float(way @ way)
        t = np.clip(ahead, 0.0, 1.0)
        gap = np.linalg.norm(others[:, :2] - (center + t[:, None] * way), axis=1)
        if np.any((gap < radius) & (ahead > 0.0)):
            continue
        ctx.note(
            "pushing out from under the drawer",
            thing=name,
            drawer=part.part,
            to=np.round(target, 3).tolist(),
        )
        push.push_to(ctx, name, target, there=lambda at: clear(at, SWEEP_CLEAR))
        return True
    ctx.note("no free spot out from under the drawer", thing=name, drawer=part.part)
    return False


@skill
def close_fixture(ctx: SkillContext, name: str) -> Articulated:
    """Close a drawer or the microwave door: push it shut.

    A drawer is pushed in along its slide axis with the closed fingers on its front; closed
    means its front, as the cameras see it, stands no further out than its closed
    neighbours'. The microwave door ("the microwave") is swept shut along its arc with the
    closed fingers. Fails naming the candidates when `name` fits no part, and with how far the
    front still stands out (or the door still stands open). Privileged: the joint's axis and
    direction, the drawer's height; for the door its hinge, shape and angle."""
    part = resolve_part(ctx, name)
    if part.part == "door":
        return close_door(ctx, part)
    return _close_drawer(ctx, part)


# -- the inside of an open drawer, for `place` -----------------------------------------------------
def drawer_inside(ctx: SkillContext, phrase: str) -> tuple[str, Box] | None:
    """The fixture and the spot in the open drawer a phrase names ("the top drawer of the
    cabinet") to put an item on, as a thin box whose top is the drawer's floor; None
    when the phrase says no "drawer". From the cameras: the fixture's points at the drawer's
    height standing out beyond where its closed neighbours' fronts stand (the part pulled
    out); its floor is the lowest of them. Fails when the drawer is not open."""
    if "drawer" not in phrase.lower():
        return None
    part = resolve_part(ctx, phrase)
    out = _slide_out(ctx, part)
    closed = _closed_front(ctx, part)
    front, _ = drawer_front(ctx, part)
    if closed is None or front - closed < ENOUGH * DRAWER_OPEN_TRAVEL:
        raise SkillFailure(f"the {part.part} of {part.fixture} is not open: open it first")
    z = ctx.env.scene.region(part.region).pos[2]  # privileged: the site rides on the drawer
    clouds = [np.zeros((0, 3))]
    for camera in ctx.cameras:
        frame = ctx.render(camera)
        clouds.append(frame.points(frame.mask(part.fixture)))
    points = np.concatenate(clouds)
    along = points[:, :2] @ out[:2]
    pulled = points[(along > closed + 0.01) & (along < front - HANDLE_DEPTH * 1.5)]
    pulled = pulled[np.abs(pulled[:, 2] - z) < DRAWER_DEPTH]
    if len(pulled) < perception.MIN_PIXELS:
        raise SkillFailure(f"the inside of the {part.part} of {part.fixture} is not visible")
    across = np.array([-out[1], out[0]])
    v = pulled[:, :2] @ across
    # Along the slide the item's centre goes midway between the front's inside and where the
    # cabinet's face stands (further in, the drawer above hangs over it; at the front, it
    # catches on the front's wall); across, the middle of what is seen.
    mid_u, mid_v = (closed + front - DRAWER_FRONT_IN) / 2, (v.min() + v.max()) / 2
    center_xy = mid_u * out[:2] + mid_v * across
    floor = float(np.percentile(pulled[:, 2], 2))
    # The spot to put the item on: a thin box whose top is the drawer's floor.
    box = Box(
        center=(float(center_xy[0]), float(center_xy[1]), floor - 0.005),
        half_extents=(0.01, 0.01, 0.005),
        yaw=float(np.arctan2(out[1], out[0])),
    )
    ctx.note("drawer inside", center=[round(c, 3) for c in box.center], floor=round(floor, 3))
    return part.fixture, box
