"""Placing on libero_goal's fixtures through the pick_place_on reference graph: the stove's
burner and the wine rack's top are grounded as place targets, and the simulator's own goal
check says the object ended where the instruction wants it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.sim.libero_backend import resolve
from pytest_gap.skills import grasp, perception, place
from pytest_gap.skills.context import SkillContext, TaskSucceeded
from pytest_gap.skills.registry import SkillFailure
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow
from pytest_gap.workflow.templates import task_placeholders

GRAPH = Path(__file__).parents[1] / "examples" / "workflows" / "pick_place_on"


@pytest.fixture(scope="module")
def envs():
    """One env per libero_goal task, made when first asked for."""
    made: dict[int, object] = {}

    def get(task: int):
        if task not in made:
            made[task] = make_env("libero_goal", task, EnvOptions())
        return made[task]

    yield get
    for env in made.values():
        env.close()


# 1: "put the bowl on the stove" (goal: on flat_stove_1_cook_region); 9: "put the wine bottle
# on the rack" (goal: on wine_rack_1_top_region); 6: "put the cream cheese in the bowl" (no
# room in the bowl: rested on it; goal: on akita_black_bowl_1).
@pytest.mark.parametrize("task", [1, 6, 9])
def test_pick_place_on_puts_it_on_the_fixture(envs, task):
    env = envs(task)
    obs = env.reset(0)
    result = run_workflow(load_workflow(GRAPH, task_placeholders(obs.prompt)), env)
    assert result.success, (obs.prompt, result.exit_status, result.error)
    assert env.success()


def test_a_place_naming_nothing_lists_the_objects_and_fixtures(envs):
    env = envs(1)
    env.reset(0)
    ctx = SkillContext(env)
    with pytest.raises(
        SkillFailure,
        match=r"'the microwave' in this scene; it has .*flat stove.*wine rack, wooden cabinet",
    ):
        place.place(ctx, container="the microwave", relation="on")


def test_the_left_and_right_plate_are_the_goals_plates():
    """libero_10 task 4: "put the white mug on the left plate and put the yellow and white mug
    on the right plate"; LIBERO's goal says which plate is which."""
    with make_env("libero_10", 4, EnvOptions()) as env:
        env.reset(0)
        goal = {obj: where for _, obj, where in env.scene.goal_state()}
        ctx = SkillContext(env)
        assert perception.ground_name(ctx, "the left plate") == goal["porcelain_mug_1"]
        assert perception.ground_name(ctx, "the right plate") == goal["white_yellow_mug_1"]


def test_the_book_goes_in_the_caddys_back_compartment_and_a_missing_part_is_named():
    """libero_10 task 5: "pick up the book and place it in the back compartment of the
    caddy" (goal: in desk_caddy_1_back_contain_region)."""
    with make_env("libero_10", 5, EnvOptions()) as env:
        obs = env.reset(0)
        ctx = SkillContext(env)
        with pytest.raises(SkillFailure, match="desk_caddy_1 has no 'top' part; it has back,"):
            place.place(ctx, container="the top compartment of the caddy")
        result = run_workflow(load_workflow(GRAPH, task_placeholders(obs.prompt)), env)
        assert result.success, (obs.prompt, result.exit_status, result.error)


def test_a_bare_compartment_is_the_one_thing_with_such_a_part():
    """LIBERO-PRO libero_10_lan task 5: "pick up the book and place in back compartment", no
    "of the caddy": the caddy is the one thing in the scene with a back compartment; a part
    nothing has fails naming what has compartments."""
    with make_env("libero_10", 5, EnvOptions()) as env:
        env.reset(0)
        ctx = SkillContext(env)
        with pytest.raises(
            SkillFailure, match=r"has a 'top' compartment; things with compartments: desk_caddy_1$"
        ):
            place.place(ctx, container="the top compartment")
        assert grasp.pick(ctx, name="book").holding
        with pytest.raises(TaskSucceeded):  # LIBERO's goal: in desk_caddy_1_back_contain_region
            place.place(ctx, container="back compartment")


def test_the_pudding_goes_to_the_right_of_the_plate_clear_of_the_mug_on_it():
    """LIBERO-PRO libero_10_lan task 6, "place white mug on plate and chocolate pudding to
    right": LIBERO's goal region beside the plate. The mug, put on the plate first, stands
    tall at its right edge (its handle); the hand closing along y hit it and the pudding was
    pushed out of the region (seed 0, completion 0.5)."""
    variation = resolve("libero_pro", "10_lan")
    with make_env(variation.suite, 6, EnvOptions()) as env:
        env.reset(0, variation=variation)
        ctx = SkillContext(env)
        assert grasp.pick(ctx, name="white mug").holding
        place.place(ctx, container="the plate", relation="on")
        assert env.completion() == pytest.approx(0.5)
        assert grasp.pick(ctx, name="chocolate pudding").holding
        with pytest.raises(TaskSucceeded):  # ('on', pudding, plate_right_region) held too
            place.place(ctx, container="the plate", relation="right_of")
