"""Skills on libero_spatial's tabletop scenes: references resolved from what the cameras see,
travel heights above the table, a bowl wider than the fingers picked by its rim and put "on"
the plate."""

from __future__ import annotations

import pytest

from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.skills import basic, grasp, gripper, perception, place
from pytest_gap.skills.context import SkillContext, TaskSucceeded
from pytest_gap.skills.registry import SkillFailure
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow
from pytest_gap.workflow.templates import task_placeholders


@pytest.fixture(scope="module")
def envs():
    """One env per libero_spatial task, made when first asked for; the suite's own 220-step
    episodes."""
    made: dict[int, object] = {}

    def get(task: int):
        if task not in made:
            made[task] = make_env("libero_spatial", task, EnvOptions())
        return made[task]

    yield get
    for env in made.values():
        env.close()


# 3: on the cookie box (hidden under the bowl); 4: in the open top drawer; 5: leaning on the
# ramekin's rim; 8: next to the plate.
@pytest.mark.parametrize("task", [3, 4, 5, 8])
def test_the_instructions_bowl_is_found_from_what_the_cameras_see(envs, task):
    env = envs(task)
    obs = env.reset(1)
    ctx = SkillContext(env)
    target = task_placeholders(obs.prompt)["target"]
    assert perception.ground_name(ctx, target) == "akita_black_bowl_1"
    assert ctx.events[-1]["message"] == "reference resolved"


def test_a_reference_that_fits_nothing_names_the_candidates(envs):
    envs(8).reset(0)
    ctx = SkillContext(envs(8))
    with pytest.raises(SkillFailure, match=r"on flat_stove_1.*akita_black_bowl_1, akita_black"):
        perception.ground_name(ctx, "the black bowl on the stove")


def test_home_travels_above_the_table_and_whatever_stands_on_the_cabinet(envs):
    env = envs(9)  # a bowl on the cabinet top, its rim about 0.28 m over the table
    env.reset(0)
    ctx = SkillContext(env)
    assert basic.home(ctx).reached
    tallest = max(env.scene.world_aabb(o.name)[1][2] for o in env.scene.objects())
    assert env.scene.gripper().eef_pos[2] > tallest + 0.05
    assert ctx.memory["support_z"] == pytest.approx(0.9, abs=0.01)  # main_table's top


def test_a_bowl_wider_than_the_fingers_is_picked_by_its_rim_and_placed_on_the_plate(envs):
    env = envs(0)
    obs = env.reset(0)
    ctx = SkillContext(env)
    target = task_placeholders(obs.prompt)["target"]
    picked = grasp.pick(ctx, target)
    assert picked.holding and picked.lifted_by > 0.05
    assert any(e["message"] == "rim grasp" for e in ctx.events)
    assert env.scene.pose("akita_black_bowl_1").pos[2] > 0.95  # up in the hand, off the table
    with pytest.raises(TaskSucceeded):  # the goal check passed while it was put down
        place.place(ctx, "plate", relation="on")


def test_a_bowl_tipped_on_the_ramekin_is_no_mug_and_is_picked_by_its_rim(envs):
    """Task 5's bowl falls from leaning 12 to 50 degrees on the ramekin in its first steps:
    its top band is an arc, not a ring with a handle, and once tipped it no longer looks open
    at the top; a bowl by name, it is gripped by its rim, not refused as too wide."""
    from pytest_gap.skills import interior, motion

    env = envs(5)
    env.reset(0)  # seed 0: the arc fitted a circle with the rest of the rim outside it
    ctx = SkillContext(env)
    motion.hold_until_still(ctx, gripper.OPEN)
    points, _ = perception.object_points(ctx, "akita_black_bowl_1")
    assert interior.rim_circle(points) is None
    assert interior.handle_grasps(ctx, "akita_black_bowl_1") is None
    env.reset(3)  # seed 3: tipped, its narrower side 8.8 cm, wider than the fingers open
    ctx = SkillContext(env)
    motion.hold_until_still(ctx, gripper.OPEN)
    assert grasp._fits_the_fingers(ctx, "akita_black_bowl_1")[1]  # by the rim
    assert any(e["message"] == "a bowl tipped over: gripped by the rim" for e in ctx.events)


@pytest.mark.parametrize("task", [2, 7])
def test_the_reference_graph_puts_the_named_bowl_on_the_plate(envs, task):
    env = envs(task)
    obs = env.reset(0)
    graph = load_workflow("examples/workflows/pick_place_on", task_placeholders(obs.prompt))
    result = run_workflow(graph, env)
    assert result.success, result.error


def test_the_approach_height_comes_down_to_where_the_arm_reaches(envs):
    """Task 4 seed 4: 10 cm over the bowl in the top drawer (z 1.22 at x 0.14) is out of the
    arm's reach; the approach goes as high as it reaches there instead."""
    from pytest_gap.skills import motion

    env = envs(4)
    env.reset(4)
    ctx = SkillContext(env)
    xy, yaw = (0.14, -0.131), 1.5708
    assert motion.solve_ik(ctx, [*xy, 1.22], yaw) > motion.IK_TOLERANCE
    z = motion.reachable_height(ctx, xy, yaw, 1.22, 1.1)
    assert 1.1 <= z < 1.22
    assert motion.solve_ik(ctx, [*xy, z], yaw) <= motion.IK_TOLERANCE
    assert motion.reachable_height(ctx, xy, yaw, 1.22, 1.2) == 1.22  # none: as asked
