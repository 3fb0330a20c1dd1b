"""Switching a fixture on or off by turning its knob: LIBERO's stove.

The knob is found from what the cameras see: the part of the fixture's point cloud that
stands clearly above its top surface (the stove's handle bar, `_knob`). The hand grips the
bar across its narrow side, turns the wrist about the knob's axis, lets go and looks again:
how far the bar turned is measured from the points, and the skill fails when that falls
short of the turn that switches it. Which way a knob turns, and how far switches it, is the
asset's (`calibration.KNOB_ON_TURN`); the joint angle the Switched output also reports is read
from the simulator (privileged: a camera cannot give it), for the record only.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from pytest_gap.instructions import PhraseError, resolve_phrase
from pytest_gap.skills import motion, perception
from pytest_gap.skills.calibration import KNOB_ABOVE, KNOB_GRIP_DOWN, KNOB_ON_TURN, KNOB_TURN
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import Box, box_from_points, wrap_half_turn
from pytest_gap.skills.gripper import CLOSE, OPEN, actuate
from pytest_gap.skills.registry import SkillFailure, skill

MIN_KNOB_POINTS = 20


class Switched(BaseModel):
    name: str  # the fixture's scene name
    on: bool  # as seen: the knob stands turned at least KNOB_ON_TURN from where it was off
    turned_by: float  # radians the knob turned in this skill, as seen (counter-clockwise +)
    joint_angle: float | None  # the knob joint's angle read from the sim (privileged), if any


def ground_fixture(ctx: SkillContext, name: str) -> str:
    """The fixture a phrase names ("the stove" -> flat_stove_1); fails naming the fixtures."""
    fixtures = [(o.name, o.category) for o in ctx.env.scene.objects() if o.fixture]
    try:
        return resolve_phrase(name, fixtures)
    except PhraseError as exc:
        raise SkillFailure(f"{exc} (fixtures here: {', '.join(n for n, _ in fixtures)})") from None


def _knob(ctx: SkillContext, fixture: str) -> Box:
    """The knob's handle as the cameras see it: the fixture's points more than KNOB_ABOVE over
    its top surface (the densest 5 mm level of its upper half: the stove's plate), boxed along
    the handle bar (`box_from_points`: the principal axis of a bar is its length)."""
    points, _ = perception.object_points(ctx, fixture)
    z = np.sort(points[:, 2])
    upper = z[z > np.median(z)]
    counts = np.searchsorted(upper, upper + 0.005) - np.searchsorted(upper, upper - 0.005)
    surface = float(upper[int(np.argmax(counts))])
    handle = points[points[:, 2] > surface + KNOB_ABOVE]
    if len(handle) < MIN_KNOB_POINTS:
        raise SkillFailure(
            f"no knob seen on {fixture}: {len(handle)} points stand over its top surface"
        )
    return box_from_points(handle)


def _joint_angle(ctx: SkillContext, fixture: str) -> float | None:
    """The fixture's hinge angle, read from the sim (privileged; reported, not acted on)."""
    model, data = ctx.env.raw.sim.model._model, ctx.env.raw.sim.data._data
    for j in range(model.njnt):
        if model.jnt_type[j] == 3 and model.joint(j).name.startswith(f"{fixture}_"):  # hinge
            return float(data.qpos[model.jnt_qposadr[j]])
    return None


def _turn(ctx: SkillContext, name: str, on: bool) -> Switched:
    fixture = ground_fixture(ctx, name)
    before = _knob(ctx, fixture)
    perception.safe_height(ctx)
    # Fingers close across the bar: the hand's y axis along the bar's narrow side.
    grip = wrap_half_turn(before.yaw)
    turn = KNOB_TURN if on else -KNOB_TURN
    where = [before.center[0], before.center[1], before.top - KNOB_GRIP_DOWN]
    # The grip or the same grip turned half round: the one from which the wrist can turn on.
    starts = [g for g in (grip, grip - np.pi if grip > 0 else grip + np.pi)]
    starts.sort(key=lambda g: abs(g + turn))
    start = next(
        (
            g
            for g in starts
            if motion.solve_ik(ctx, where, g) <= motion.IK_TOLERANCE
            and motion.solve_ik(ctx, where, g + turn) <= motion.IK_TOLERANCE
        ),
        None,
    )
    if start is None:
        raise SkillFailure(f"the knob of {fixture} cannot be gripped and turned from here")
    actuate(ctx, OPEN, min_steps=4)
    above = [*where[:2], before.top + 0.06]
    motion.travel(ctx, above, start, OPEN)
    motion.servo(ctx, where, start, OPEN, max_steps=60)
    actuate(ctx, CLOSE)
    # Turn in small steps of the wrist about the knob's axis, the grip site held on it.
    for k in range(1, 5):
        motion.servo(ctx, where, start + turn * k / 4, CLOSE, max_steps=40, tolerance=0.01)
    actuate(ctx, OPEN)
    motion.servo(ctx, above, motion.hand_yaw(ctx), OPEN, max_steps=60, tolerance=0.02)
    # Out of the cameras' way: the hand over the knob hides most of the bar from above.
    motion.servo(ctx, [*motion.HOME_XY, before.top + 0.15], 0.0, OPEN, max_steps=60, tolerance=0.03)
    after = _knob(ctx, fixture)
    turned = wrap_half_turn(after.yaw - before.yaw)
    ctx.note("knob turned", fixture=fixture, turned=round(turned, 3))
    # Turning on: the knob goes KNOB_ON_TURN counter-clockwise from off; turning off: back.
    done = turned >= KNOB_ON_TURN if on else turned <= -KNOB_ON_TURN
    if not done:
        raise SkillFailure(
            f"the knob of {fixture} turned {turned:+.2f} rad, not {'+' if on else '-'}"
            f"{KNOB_ON_TURN:.2f} as switching it {'on' if on else 'off'} needs"
        )
    return Switched(name=fixture, on=on, turned_by=turned, joint_angle=_joint_angle(ctx, fixture))


@skill
def turn_on(ctx: SkillContext, name: str) -> Switched:
    """Turn a fixture on by its knob ("the stove"), checking from the cameras that it turned.

    Grips the knob seen on it, turns it counter-clockwise, lets go and looks again.

    The knob is the part of the fixture standing over its top surface; the turn needed is
    the asset's (calibration.KNOB_ON_TURN). Fails naming the fixtures when the phrase fits
    none, and with how far it turned when it turned too little. `joint_angle` is read from the
    simulator (privileged), for the record."""
    return _turn(ctx, name, on=True)


@skill
def turn_off(ctx: SkillContext, name: str) -> Switched:
    """Turn a fixture off by its knob ("the stove"), checking from the cameras that it turned.

    As `turn_on`, the knob turned clockwise back. Fails as `turn_on` fails."""
    return _turn(ctx, name, on=False)
