"""The suite registry: what LIBERO and LIBERO-PRO ship, task ids, prompts, seeds -> init states."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.errors import SimInputError
from pytest_gap.sim.suites import get_suite, get_task, list_suites


def test_classic_and_pro_suites_are_registered_with_their_task_counts():
    suites = set(list_suites())
    for name, n in [
        ("libero_spatial", 10),
        ("libero_object", 10),
        ("libero_goal", 10),
        ("libero_10", 10),
        ("libero_90", 90),
    ]:
        assert name in suites
        assert get_suite(name).n_tasks == n
    pro = {
        "libero_object_swap",
        "libero_goal_lan",
        "libero_spatial_object",
        "libero_10_task",
        "libero_object_temp_x0.1",
        "libero_object_temp_y0.5",
    }
    assert pro <= suites


@pytest.mark.parametrize(
    ("suite", "steps"),
    [
        ("libero_spatial", 220),
        ("libero_object", 280),
        ("libero_goal", 300),
        ("libero_10", 520),
        ("libero_90", 400),
        ("libero_object_swap", 280),
        ("libero_goal_lan", 300),
    ],
)
def test_max_steps_follow_libero_protocol(suite, steps):
    assert get_suite(suite).max_steps == steps


def test_task_carries_prompt_bddl_and_init_states():
    task = get_task("libero_object", 3)
    assert task.prompt == "pick up the bbq sauce and place it in the basket"
    assert task.bddl_file.is_file() and task.init_states_file.is_file()
    assert task.n_init_states == 50
    # LIBERO-90 names carry a scene prefix that is not part of the instruction.
    assert not get_task("libero_90", 0).prompt.lower().startswith(("kitchen", "living"))


def test_perturbed_instruction_suites_take_the_prompt_from_the_bddl():
    classic, lan = get_task("libero_goal", 0), get_task("libero_goal_lan", 0)
    assert lan.name == classic.name
    assert lan.prompt == lan.bddl_language != classic.prompt
    # Task perturbation: the file name still says the old task; the goal and language changed.
    swapped = get_task("libero_object_task", 0)
    assert "alphabet soup" in swapped.name.replace("_", " ")
    assert "alphabet soup" not in swapped.prompt.lower()


def test_position_shift_suites_keep_libero_object_task_order():
    assert get_suite("libero_object_temp_x0.3").task_names == get_suite("libero_object").task_names


def test_seed_maps_to_init_state_modulo_count():
    task = get_task("libero_object", 0)
    index, state = task.init_state(53)
    assert index == 53 % task.n_init_states == 3
    assert np.array_equal(state, task.init_state(3)[1])
    assert not np.array_equal(state, task.init_state(4)[1])


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: get_suite("libero_objet"), "did you mean libero_object"),
        (lambda: get_task("libero_object", 10), "valid ids are 0..9"),
        (lambda: get_suite("libero_object_with_trigger"), "ships no init states for 10 of"),
        (lambda: get_task("libero_object", -1), "valid ids are 0..9"),
        (lambda: get_task("libero_object", "3"), "must be an integer"),
        (lambda: get_task("libero_object", 0).init_state(-1), "seeds are integers >= 0"),
        (lambda: get_task("libero_object", 0).init_state(True), "seeds are integers >= 0"),
        (lambda: get_task("libero_object", 0).init_state(1.5), "seeds are integers >= 0"),
    ],
)
def test_bad_suite_task_or_seed_raises_one_line_error(call, needle):
    with pytest.raises(SimInputError) as err:
        call()
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
