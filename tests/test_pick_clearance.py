"""pick on libero_10 task 1 ("put both the cream cheese box and the butter in the basket"):
it waits for the scene to come to rest before looking, and slides its grasp along a box clear
of a tall neighbour; a rim grasp beside a tall cabinet keeps the forearm off it."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.sim.libero_backend import resolve
from pytest_gap.skills import calibration, grasp, gripper, motion, perception, place
from pytest_gap.skills.context import SkillContext


@pytest.fixture(scope="module")
def env():
    with make_env("libero_10", 1, EnvOptions()) as made:
        yield made


def test_pick_waits_for_the_cartons_in_flight_to_land(env):
    """LIBERO's init states for this task leave the milk sunk in the table: after the reset's
    settle steps it is still in the air; a travel height measured from it (1.2 m) is out of
    reach. Once still, the milk stands on the table."""
    env.reset(1)
    ctx = SkillContext(env)
    assert perception.object_points(ctx, "milk_1")[0][:, 2].min() > 0.7  # in flight
    assert motion.hold_until_still(ctx, gripper.OPEN) > 1
    assert perception.object_points(ctx, "milk_1")[0][:, 2].min() < 0.5
    assert motion.hold_until_still(ctx, gripper.OPEN) == 2  # at rest: two looks a step apart


def test_the_cream_cheese_beside_the_milk_is_gripped_clear_of_it(env):
    """Seed 4: the cream cheese box lies along the milk carton; gripped at its centre the open
    fingers came down on the carton's edge, 11 cm over the grasp, every try."""
    env.reset(4)
    ctx = SkillContext(env)
    picked = grasp.pick(ctx, name="cream cheese box")
    assert picked.holding and picked.attempts == 1


def test_finger_slide_moves_the_grip_along_the_box_away_from_what_stands_beside_it():
    grip = [0.0, 0.0, 0.44]
    # A carton's wall 4 cm off along the closing axis (world y at yaw 0), x from -0.06 to 0.0.
    wall = np.array([[x, -0.04, z] for x in np.linspace(-0.06, 0.0, 13) for z in (0.46, 0.5)])
    assert 0.015 < grasp.finger_slide(wall, grip, 0.0, 0.025) <= 0.025  # away from it
    assert grasp.finger_slide(wall, grip, 0.0, 0.0) == 0.0  # no room on the box: as it was
    low = wall.copy()
    low[:, 2] = 0.43  # below the fingertips: not in the way
    assert grasp.finger_slide(low, grip, 0.0, 0.025) == 0.0


def test_a_rim_grasp_whose_hand_meets_an_overhang_is_not_clear():
    """The hand's body over a grip at the origin, fingers closing along x: a shelf 6 cm over
    the grip and 8 cm along the closing axis is in its way; beside it (across) or below the
    hand's body it is not."""
    grip, closing = np.zeros(2), np.array([1.0, 0.0])
    shelf = np.array([[0.08, dy, 0.06] for dy in np.linspace(-0.01, 0.01, 5)])
    assert not grasp._hand_clear(shelf, grip, closing, 0.0)
    assert grasp._hand_clear(shelf + np.array([0.0, 0.08, 0.0]), grip, closing, 0.0)
    assert grasp._hand_clear(shelf - np.array([0.0, 0.0, 0.03]), grip, closing, 0.0)


def test_a_box_hidden_in_the_basket_after_release_is_placed(env):
    """Seed 1: let go in the basket, the cream cheese box is hidden by its walls from both
    cameras; the look for it hanging over them failed the place, and the recovery and the
    way home cost 50 of the episode's steps."""
    env.reset(1)
    ctx = SkillContext(env)
    assert grasp.pick(ctx, name="cream cheese box").holding
    placed = place.place(ctx, container="basket")
    assert placed.released and env.goal_status()[0] is True  # ('in', cream_cheese_1, basket)


def test_finger_clearance_moves_the_grip_across_when_along_the_box_is_blocked():
    """A bowl's rim 4 cm off along the closing axis, all along the box: no slide along it
    clears the finger on that side; moving the open fingers away across by all the room the
    box leaves between them does, when that is 1 cm or more."""
    grip = [0.0, 0.0, 0.91]
    rim = np.array([[x, -0.04, 0.97] for x in np.linspace(-0.1, 0.1, 41)])
    assert grasp.finger_slide(rim, grip, 0.0, 0.025) == 0.0  # along: blocked everywhere
    slide, shift = grasp.finger_clearance(rim, grip, 0.0, 0.025, 0.0135)
    # across, away from the rim: world +y, which is -y of the hand at yaw 0
    assert (slide, shift) == (0.0, -0.0135)
    assert grasp.finger_clearance(rim, grip, 0.0, 0.025, 0.005) == (0.0, 0.0)  # no room


@pytest.fixture(scope="module")
def goal_env():
    with make_env("libero_goal_object", 6, EnvOptions()) as made:
        yield made


def test_the_cream_cheese_by_a_bigger_bowl_is_gripped_and_put_in_its_middle(goal_env):
    """LIBERO-PRO goal_object task 6 ("put the cream cheese in the bowl") swaps in a bowl 16 cm
    across. Seed 23: its rim stood where the open finger came down beside the cheese, the grip
    closed 1.3 cm high and slipped, twice. Seed 22: one stray point of a neighbour inside the
    bowl made it look occupied; the cheese went 4.4 cm off its middle, and LIBERO's `On`
    wants it within 3 cm."""
    from pytest_gap.sim.libero_backend import resolve
    from pytest_gap.workflow.executor import run_workflow
    from pytest_gap.workflow.schema import load_workflow
    from pytest_gap.workflow.templates import task_placeholders

    variation = resolve("libero_pro", "goal_object")
    goal_env.reset(23, variation=variation)
    picked = grasp.pick(SkillContext(goal_env), name="cream cheese")
    assert picked.holding and picked.attempts == 1
    obs = goal_env.reset(22, variation=variation)
    graph = load_workflow("examples/workflows/do_task", task_placeholders(obs.prompt))
    result = run_workflow(graph, goal_env)
    assert result.success, result.error


@pytest.fixture(scope="module")
def bowl_by_the_cabinet():
    """libero_pro spatial_swap task 3 seed 20: the bowl on the cookie box stands beside the
    wooden cabinet, whose top is 0.18 m over the bowl's rim."""
    variation = resolve("libero_pro", "spatial_swap")
    with make_env(variation.suite, 3, EnvOptions()) as made:
        made.reset(20, variation=variation)
        yield made


def test_a_rim_grasp_whose_forearm_meets_the_cabinet_is_passed_over(bowl_by_the_cabinet):
    """The near-rim grasp, which the hand alone has room for, brought the forearm down on the
    cabinet's top edge and stopped the hand over the rim; the grasps chosen keep the forearm
    clear of it, at the yaw that does, and the pick holds at the first try."""
    ctx = SkillContext(bowl_by_the_cabinet)
    bowl = perception.ground_name(ctx, "the black bowl on the cookie box")
    box, _ = perception.locate_box(ctx, bowl)
    around = perception.surroundings(ctx, bowl)
    near_rim = [
        box.center[0] - min(box.half_extents[:2]) + calibration.RIM_IN,
        box.center[1],
        box.top,
    ]
    near_rim[2] -= calibration.RIM_DOWN
    yaw = motion.grip_yaw(ctx, near_rim, np.pi / 2)
    assert yaw is not None and not motion.arm_clear(ctx, near_rim, yaw, around)

    grasps = grasp._rim_grasps(ctx, bowl, box)
    assert grasps and all(g.yaw_fixed for g in grasps)
    assert all(motion.arm_clear(ctx, g.position, g.yaw, around) for g in grasps)
    picked = grasp.pick(ctx, name="the black bowl on the cookie box")
    assert picked.holding and picked.attempts == 1
