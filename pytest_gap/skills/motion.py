"""Arm motion through the env's 7-D OSC_POSE action: IK reachability, closed-loop servoing.

The controller is proportional in the world frame: position error (metres) times 15 and
orientation error (axis-angle, radians) times 2, clipped to the action range, which the OSC
controller scales to 5 cm and 0.5 rad per step. Collision awareness is what tabletop
pick-and-place needs: moves between places go up to a safe height, across, then down.
"""

from __future__ import annotations

import numpy as np

from pytest_gap.sim.scene import ROBOT_LABEL
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import (
    down_rotation,
    quat_xyzw_to_matrix,
    rotation_error,
    wrap_angle,
)
from pytest_gap.skills.registry import SkillFailure

POS_GAIN = 15.0
ROT_GAIN = 2.0
HOME_XY = (-0.15, 0.0)  # above the near half of the table, the arm's comfortable middle
SAFE_Z = 0.25  # before anything was seen: above every object of a floor scene (libero_object)
IK_TOLERANCE = 0.01  # m: an IK residual above this means the pose is out of reach
IK_TURN_TOLERANCE = 0.05  # rad: and so does an orientation left this far off
REACH_STEP = 0.02  # m: how far down at a time to look for a height the arm reaches
WRIST_EASY = np.pi / 2 + 0.4  # rad of hand yaw either side of LIBERO's start pose
STALL_STEPS = 15  # steps without 2 mm of progress: blocked, stop pushing
# The links `arm_clear` keeps off what the cameras see (robosuite's Panda body names, after the
# robot's prefix), and by how much: the forearm and wrist, the links that come down near tall
# things beside a low grasp; depth points lie on surfaces, 2-5 mm apart at the cameras' range.
ARM_LINKS = ("link4", "link5", "link6", "link7")
ARM_CLEARANCE = 0.015
JOINT_MARGIN = 0.15  # rad: `clear_grip_yaw` passes over poses with a joint nearer its stop
# The Panda's elbow (joint 4, index 3 among the arm's joints) is straight at its upper limit
# (-0.07 rad). Straight, the OSC controller cannot bend it: no torque it computes for a move
# of the hand back towards the base turns that joint, and every later servo stalls where it
# is (libero_pro 10_swap task 8 seed 0: the hand stuck 0.21 m short until the episode's steps
# ran out). A reach check asks for the elbow bent at least ELBOW_MARGIN; a stall with the
# elbow within ELBOW_STRAIGHT of its limit tilts the fingers towards the base (UNFOLD_TURN
# per step, at most UNFOLD_STEPS steps) until it is bent UNFOLD_BENT, which the controller
# does do (measured there: 10 steps of 0.5 bent it to -0.42 rad and the servo then reached
# its target in 35 steps; a tilt about the other horizontal axis, or none, left it straight;
# 20 steps of 1.0 tilted the hand so far that turning it back down straightened it again).
ELBOW_JOINT, ELBOW_MARGIN, ELBOW_STRAIGHT = 3, 0.3, 0.02
UNFOLD_TURN, UNFOLD_STEPS, UNFOLD_BENT, UNFOLDS = 0.5, 12, 0.4, 2
# rad/s (norm over the arm's joints): slow enough to go down onto a grasp. A hand arriving
# from a crossing with no descent moves at about 1.0; after a descent of 3 cm at about 0.5.
SETTLE_SPEED = 0.6
SETTLE_STEPS = 20
GENTLE_ACTION, GENTLE_STALL_STEPS = 0.3, 5  # about 1.5 cm a step, and stop sooner
# The scene is at rest when, two steps running, fewer than STILL_PIXELS of the front camera's
# pixels on movable objects changed depth by more than STILL_DEPTH (a falling carton moves
# ~5 cm a step; at the top of its flight, under 5 mm in one of them).
STILL_DEPTH, STILL_PIXELS, STILL_STEPS = 0.003, 20, 40


def hand_pose(ctx: SkillContext) -> tuple[np.ndarray, np.ndarray]:
    grip = ctx.env.scene.gripper()
    return grip.eef_pos, quat_xyzw_to_matrix(grip.hand_quat_xyzw)


def hand_yaw(ctx: SkillContext) -> float:
    _, rot = hand_pose(ctx)
    x_axis = rot[:, 0]
    return float(np.arctan2(x_axis[1], x_axis[0]))


def servo(
    ctx: SkillContext,
    position,
    yaw: float,
    gripper: float,
    *,
    tolerance: float = 0.008,
    max_steps: int = 150,
    gentle: bool = False,
) -> float:
    """Drive the grip site to `position` pointing down at `yaw`; return the final error (m).

    Gives up early when blocked: no 2 mm (or, while the wrist turns, 0.02 rad) of progress in
    STALL_STEPS steps. `gentle`: move slowly and give up after GENTLE_STALL_STEPS, for going
    down among things; the controller pushes in proportion to how far ahead it is told to
    go, and a full push on something blocked drags it, the container it stands in too.
    Not gentle, a stall with the elbow straight is not given up on: `unfold` bends it, then
    on (UNFOLDS times at most)."""
    limit, stall_steps = (GENTLE_ACTION, GENTLE_STALL_STEPS) if gentle else (1.0, STALL_STEPS)
    target = np.asarray(position, float)
    desired = down_rotation(yaw)
    error, best, best_turn, best_at, unfolds = np.inf, np.inf, np.inf, 0, 0
    for i in range(max_steps):
        pos, rot = hand_pose(ctx)
        delta = target - pos
        rot_err = rotation_error(rot, desired)
        error = float(np.linalg.norm(delta))
        turn = float(np.linalg.norm(rot_err))
        if error < tolerance and turn < 0.05:
            return error
        if error < best - 0.002 or turn < best_turn - 0.02:
            best, best_turn, best_at = min(best, error), min(best_turn, turn), i
        elif i - best_at > stall_steps:
            # Going down among things a stall is what stops it; a tilt there would swing what
            # is held into its neighbours.
            if not gentle and unfolds < UNFOLDS and elbow_straight(ctx):
                unfolds += 1
                ctx.note("elbow straight: unfolding", bent=round(unfold(ctx, gripper), 2))
                best, best_turn, best_at = np.inf, np.inf, i
                continue
            ctx.note("servo stalled", target=target.round(3).tolist(), error=round(error, 4))
            return error
        action = np.concatenate(
            [
                np.clip(POS_GAIN * delta, -limit, limit),
                np.clip(ROT_GAIN * rot_err, -1, 1),
                [gripper],
            ]
        )
        ctx.act(action)
    return error


def _elbow(ctx: SkillContext) -> tuple[float, float]:
    """The elbow joint's angle now and its upper (straight) limit."""
    raw = ctx.env.raw
    robot = raw.robots[0]
    q = raw.sim.data.qpos[robot._ref_joint_pos_indexes[ELBOW_JOINT]]
    return float(q), float(raw.sim.model.jnt_range[robot._ref_joint_indexes[ELBOW_JOINT]][1])


def elbow_bend(ctx: SkillContext) -> float:
    """How far (rad) the elbow is bent off straight (its upper limit)."""
    q, straight = _elbow(ctx)
    return straight - q


def elbow_straight(ctx: SkillContext) -> bool:
    """Whether the elbow is within ELBOW_STRAIGHT of straight."""
    return elbow_bend(ctx) < ELBOW_STRAIGHT


def base_xy(ctx: SkillContext) -> np.ndarray:
    """Where the robot's base stands on the floor plan (x, y, world)."""
    raw = ctx.env.raw
    return np.asarray(raw.sim.data.get_body_xpos(raw.robots[0].robot_model.root_body))[:2].copy()


def unfold(ctx: SkillContext, gripper: float) -> float:
    """Bend a straight elbow: hold the grip site where it is and tilt the fingers towards the
    robot's base (about the horizontal axis across the base-to-hand direction) until the
    elbow is bent UNFOLD_BENT off its limit, at most UNFOLD_STEPS steps; return how far it
    is bent then (rad). The servo that follows turns the hand back down."""
    target = hand_pose(ctx)[0].copy()
    radial = target[:2] - base_xy(ctx)
    radial /= max(float(np.linalg.norm(radial)), 1e-9)
    axis = np.array([-radial[1], radial[0], 0.0])  # world z x radial
    for _ in range(UNFOLD_STEPS):
        q, straight = _elbow(ctx)
        if q < straight - UNFOLD_BENT:
            break
        pos, _ = hand_pose(ctx)
        ctx.act(
            np.concatenate(
                [np.clip(POS_GAIN * (target - pos), -1, 1), UNFOLD_TURN * axis, [gripper]]
            )
        )
    q, straight = _elbow(ctx)
    return straight - q


def travel(
    ctx: SkillContext,
    position,
    yaw: float,
    gripper: float,
    *,
    safe_z: float | None = None,
    tolerance: float = 0.008,
) -> float:
    """Up to `safe_z` (default `travel_height(ctx)`), across, then down to `position`; return
    the final error (m)."""
    if safe_z is None:
        safe_z = travel_height(ctx)
    target = np.asarray(position, float)
    pos, _ = hand_pose(ctx)
    if np.linalg.norm(target[:2] - pos[:2]) > 0.03:
        cruise = max(safe_z, target[2])
        if pos[2] < cruise - 0.02:
            servo(ctx, [pos[0], pos[1], cruise], hand_yaw(ctx), gripper, tolerance=0.02)
        servo(ctx, [target[0], target[1], cruise], yaw, gripper, tolerance=0.015)
    return servo(ctx, target, yaw, gripper, tolerance=tolerance, max_steps=80)


def joint_speed(ctx: SkillContext) -> float:
    """How fast the arm moves now: the norm of its joint velocities (rad/s)."""
    raw = ctx.env.raw
    robot = raw.robots[0]
    return float(np.linalg.norm(raw.sim.data.qvel[np.asarray(robot._ref_joint_vel_indexes)]))


def home_pose(ctx: SkillContext) -> tuple[np.ndarray, np.ndarray]:
    """The grip site's position and the hand's rotation with the arm at the robot model's home
    joint angles (robosuite's `init_qpos`, which LIBERO's init states start near): forward
    kinematics on a scratch copy of the state. Reads the robot's model, no camera, no object."""
    import mujoco  # here: the skill modules import without a physics engine (config checks)

    raw = ctx.env.raw
    robot = raw.robots[0]
    model = raw.sim.model._model
    data = mujoco.MjData(model)
    data.qpos[:] = raw.sim.data.qpos
    data.qpos[np.asarray(robot._ref_joint_pos_indexes)] = robot.init_qpos
    mujoco.mj_kinematics(model, data)
    hand = model.body(robot.robot_model.eef_name).id
    return data.site_xpos[robot.eef_site_id].copy(), data.xmat[hand].reshape(3, 3).copy()


def hold_step(ctx: SkillContext, target: np.ndarray, desired: np.ndarray, gripper: float) -> None:
    """One control step pulling the hand back to `target`, turned as `desired`."""
    pos, rot = hand_pose(ctx)
    ctx.act(
        np.concatenate(
            [
                np.clip(POS_GAIN * (target - pos), -1, 1),
                np.clip(ROT_GAIN * rotation_error(rot, desired), -1, 1),
                [gripper],
            ]
        )
    )


def settle(
    ctx: SkillContext,
    position,
    yaw: float,
    gripper: float,
    *,
    max_speed: float = SETTLE_SPEED,
    max_steps: int = SETTLE_STEPS,
) -> int:
    """Hold the hand at `position` until the arm moves slower than `max_speed`; return the
    steps spent (none when it already does; at most `max_steps`)."""
    target = np.asarray(position, float)
    desired = down_rotation(yaw)
    for i in range(max_steps):
        if joint_speed(ctx) < max_speed:
            return i
        hold_step(ctx, target, desired, gripper)
    return max_steps


def hold_until_still(ctx: SkillContext, gripper: float, max_steps: int = STILL_STEPS) -> int:
    """Hold the hand where it is until what the front camera sees of the movable objects stops
    moving (`moving_pixels`, two steps running); return the steps spent (at least 2, at most
    `max_steps`). What is seen in flight is not where it will be: LIBERO's libero_10 task 1
    init states leave the milk and the orange juice sunk in the table, they spring half a
    metre up and land about 4 steps after the reset's settle steps; a travel height measured
    from them in the air is out of reach (seed 1: 1.2 m, the episode's steps ran out)."""
    names = [o.name for o in ctx.env.scene.objects(include_fixtures=False)]
    target, yaw = hand_pose(ctx)[0], hand_yaw(ctx)
    desired = down_rotation(yaw)
    before, still = ctx.render("agentview"), 0
    for i in range(max_steps):
        hold_step(ctx, target, desired, gripper)
        after = ctx.render("agentview")
        still = still + 1 if moving_pixels(before, after, names) < STILL_PIXELS else 0
        if still == 2:
            return i + 1
        before = after
    return max_steps


def moving_pixels(before, after, names: list[str]) -> int:
    """How many pixels on the named objects (in either of two frames of one camera) changed
    depth by more than STILL_DEPTH between them. Pixels the robot covers in either frame are
    left out: the arm still slowing down in front of an object is not the object moving
    (libero_goal task 3 seed 0: after the hand backed off an opened drawer, 27 steps)."""
    mask = np.zeros(before.depth.shape, bool)
    for name in names:
        mask |= before.mask(name) | after.mask(name)
    for frame in (before, after):
        robot = [i for i, label in frame.labels.items() if label == ROBOT_LABEL]
        mask &= ~np.isin(frame.segmentation, robot)
    return int(np.count_nonzero(np.abs(after.depth - before.depth)[mask] > STILL_DEPTH))


def travel_height(ctx: SkillContext) -> float:
    """The travel height `perception.safe_height` last measured in this run; SAFE_Z before."""
    return float(ctx.memory.get("safe_z", SAFE_Z))


def solve_ik(
    ctx: SkillContext, position, yaw: float, iterations: int = 200, elbow_margin: float = 0.0
) -> float:
    """Damped least-squares IK on a scratch copy of the model state; return the position
    residual (m), infinite where the hand cannot also point down at `yaw` there.
    `elbow_margin`: with the elbow kept bent at least that far off straight (`comfortable`).

    Answers "can the arm put its grip site there, pointing down?" without moving anything.
    Starts from the arm as it is, then, if that ends in a local minimum against the joint
    limits (it does after some long reaches), from the arm's start configuration.
    """
    return _posed(ctx, position, yaw, iterations, elbow_margin)[0]


def _posed(
    ctx: SkillContext, position, yaw: float, iterations: int = 200, elbow_margin: float = 0.0
):
    """(`solve_ik`'s residual, the scratch MjData with the arm posed by the better solve)."""
    import mujoco  # here: the skill modules import without a physics engine (config checks)

    raw = ctx.env.raw
    model = raw.sim.model._model
    data = mujoco.MjData(model)
    data.qpos[:] = raw.sim.data._data.qpos
    robot = raw.robots[0]
    residual = _ik_residual(model, data, robot, position, yaw, iterations, elbow_margin)
    if residual > IK_TOLERANCE:
        first = data.qpos.copy()
        data.qpos[np.asarray(robot._ref_joint_pos_indexes)] = robot.init_qpos
        again = _ik_residual(model, data, robot, position, yaw, iterations, elbow_margin)
        if again < residual:
            residual = again
        else:
            data.qpos[:] = first
    mujoco.mj_kinematics(model, data)
    return residual, data


def arm_clear(
    ctx: SkillContext, position, yaw: float, points: np.ndarray, clearance: float = ARM_CLEARANCE
) -> bool:
    """Whether the forearm and wrist (`ARM_LINKS`' collision meshes), the arm posed by IK to
    put the grip site at `position` pointing down at `yaw`, stay `clearance` clear of every
    point seen (N, 3). The hand's own room is the grasp planner's to check.

    The arm knows its own shape; the scene is only what the cameras saw (libero_pro
    spatial_swap task 3: the grasp on the near rim of a bowl beside the wooden cabinet was
    clear for the hand, but the forearm came down on the cabinet's top edge and stopped the
    hand 1.3-2.5 cm over the rim, seeds 20 and 23)."""
    return _clear_as_posed(ctx, _posed(ctx, position, yaw)[1], points, clearance)


def _clear_as_posed(ctx: SkillContext, data, points: np.ndarray, clearance: float) -> bool:
    if not len(points):
        return True
    # Here: scipy costs import time, and its C modules do not import twice in one process
    # (pytester's inner sessions, `geometry._sum`).
    from scipy.spatial import cKDTree

    vertices = _link_vertices(ctx.env.raw.sim.model._model, data, ctx.env.raw.robots[0])
    distance, _ = cKDTree(np.asarray(points, float)).query(vertices, distance_upper_bound=clearance)
    return bool(np.all(np.isinf(distance)))


def _link_vertices(model, data, robot) -> np.ndarray:
    """World points of the collision meshes of the robot's ARM_LINKS as `data` poses them."""
    prefix = robot.robot_model.naming_prefix
    bodies = {model.body(prefix + link).id for link in ARM_LINKS}
    clouds = [np.zeros((0, 3))]
    for geom in range(model.ngeom):
        if model.geom_bodyid[geom] not in bodies or not model.geom_contype[geom]:
            continue
        if model.geom_type[geom] != 7:  # mjGEOM_MESH; others: their bounding sphere's centre
            clouds.append(data.geom_xpos[geom][None])
            continue
        mesh = model.geom_dataid[geom]
        start, count = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
        local = model.mesh_vert[start : start + count]
        clouds.append(local @ data.geom_xmat[geom].reshape(3, 3).T + data.geom_xpos[geom])
    return np.concatenate(clouds)


def comfortable(ctx: SkillContext, position, yaw: float) -> bool:
    """Whether the arm reaches `position` pointing down at `yaw` with its elbow bent at least
    ELBOW_MARGIN: from there it can still come back towards its base (`ELBOW_JOINT`)."""
    return solve_ik(ctx, position, yaw, elbow_margin=ELBOW_MARGIN) <= IK_TOLERANCE


def _ik_residual(
    model, data, robot, position, yaw: float, iterations: int, elbow_margin: float = 0.0
) -> float:
    import mujoco  # here: the skill modules import without a physics engine (config checks)

    qidx = np.asarray(robot._ref_joint_pos_indexes)
    didx = np.asarray(robot._ref_joint_vel_indexes)
    site = robot.eef_site_id
    hand = model.body(robot.robot_model.eef_name).id
    lo, hi = model.jnt_range[robot._ref_joint_indexes].T.copy()
    hi[ELBOW_JOINT] -= elbow_margin
    target = np.asarray(position, float)
    desired = down_rotation(yaw)
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    residual, turn = np.inf, np.inf
    for _ in range(iterations):
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        pos_err = target - data.site_xpos[site]
        rot_err = rotation_error(data.xmat[hand].reshape(3, 3), desired)
        residual, turn = float(np.linalg.norm(pos_err)), float(np.linalg.norm(rot_err))
        if residual < 1e-3 and turn < 1e-2:
            break
        mujoco.mj_jacSite(model, data, jacp, jacr, site)
        jac = np.vstack([jacp[:, didx], jacr[:, didx]])
        err = np.concatenate([pos_err, 0.5 * rot_err])
        dq = jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(6), err)
        data.qpos[qidx] = np.clip(data.qpos[qidx] + dq, lo, hi)
    # The wrist at its limit reaches the place but not the yaw: that pose is out of reach too.
    return residual if turn < IK_TURN_TOLERANCE else np.inf


def require_reachable(ctx: SkillContext, position, yaw: float) -> None:
    residual = solve_ik(ctx, position, yaw)
    if residual > IK_TOLERANCE:
        why = f"IK residual {residual:.3f} m" if np.isfinite(residual) else "the wrist's limits"
        raise SkillFailure(
            f"pose {np.round(position, 3).tolist()} yaw {yaw:.2f} is out of the arm's reach ({why})"
        )


def reachable_height(ctx: SkillContext, xy, yaw: float, z: float, lowest: float) -> float:
    """`z`, or the highest height under it, down to `lowest` in REACH_STEP steps, where the
    arm reaches over `xy` pointing down at `yaw` (`solve_ik`); `z` when none is. Far out and
    high the servo crawls: libero_spatial task 4 seed 4, a bowl in the cabinet's top drawer
    at x 0.14, the point 10 cm over it (z 1.22, IK residual 3.5 cm) stalled 2.3 cm short
    after 71 steps, the lift to 1.26 after 41 more, and the episode's 220 steps ran out."""
    steps = 0
    # Each height from z by a whole number of steps, rounded to a micron, so `lowest` itself is
    # tried and returned as given rather than a sum's rounding error away from it.
    while (height := round(z - steps * REACH_STEP, 6)) >= lowest - 1e-9:
        if solve_ik(ctx, [xy[0], xy[1], height], yaw) <= IK_TOLERANCE:
            return float(height)
        steps += 1
    return float(z)


def grip_yaw(ctx: SkillContext, position, yaw: float) -> float | None:
    """The hand yaw for a parallel grip at `yaw`: it or the same grip turned half round, the
    one reachable there that is nearer the hand's yaw now, among those in the wrist's easy
    range first; None if neither is reachable.

    The two grip alike, but turning the wrist half round on the way swings what is held, and
    the controller's rotation error is ill-defined near a half turn: the arm flails. Near the
    wrist's limits (yaw beyond WRIST_EASY) the controller tracks poorly."""
    for option in _yaw_options(yaw, hand_yaw(ctx)):
        if solve_ik(ctx, position, option) <= IK_TOLERANCE:
            return float(option)
    return None


def _yaw_options(yaw: float, now: float) -> list[float]:
    """A grip's two yaws (it and it turned half round), in `grip_yaw`'s order of preference."""
    turned = yaw - np.pi if yaw > 0 else yaw + np.pi

    def key(option: float) -> tuple[bool, float, float]:
        return abs(option) > WRIST_EASY, round(abs(wrap_angle(option - now)), 1), abs(option)

    return sorted((yaw, turned), key=key)


def clear_grip_yaw(ctx: SkillContext, position, yaw: float, points: np.ndarray) -> float | None:
    """`grip_yaw`, among only the yaws whose forearm and wrist clear `points` (`arm_clear`):
    the wrist stands off the hand's axis, on one side or the other as the hand turns half
    round, and the forearm follows it. None when neither yaw is both reachable and clear."""
    robot = ctx.env.raw.robots[0]
    lo, hi = ctx.env.raw.sim.model._model.jnt_range[robot._ref_joint_indexes].T
    qidx = np.asarray(robot._ref_joint_pos_indexes)
    for option in _yaw_options(yaw, hand_yaw(ctx)):
        residual, data = _posed(ctx, position, option)
        if residual > IK_TOLERANCE:
            continue
        # A pose with a joint at its stop is one the controller gets stuck short of (the wrist
        # turning the long way round into its limit: libero_pro spatial_swap task 2 seed 20).
        q = data.qpos[qidx]
        if np.min(np.minimum(q - lo, hi - q)) < JOINT_MARGIN:
            continue
        if _clear_as_posed(ctx, data, points, ARM_CLEARANCE):
            return float(option)
    return None
