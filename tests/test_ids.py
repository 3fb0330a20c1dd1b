"""A trial's names (pytest_gap/ids.py): the forms users and files rely on, and that each form
taken apart gives back what made it."""

from __future__ import annotations

import pytest

from pytest_gap import ids
from pytest_gap.cells import Cell, Trial
from pytest_gap.results import TrialIdentity

GRID = ("policy_only", "pi05", "libero", "object", None)
SUITE = ("workflow", None, "libero", "object", "pick_place")


@pytest.mark.parametrize(
    "names, key, trial_id, slug",
    [
        (
            GRID,
            "policy_only/pi05/libero/object/task_03/seed_007",
            "policy_only@pi05::libero/object::task03::seed007",
            "policy_only__pi05__libero__object__task03__seed007",
        ),
        (
            ("workflow", None, "posvar", "spatial", None),
            "workflow/posvar/spatial/task_03/seed_007",
            "workflow::posvar/spatial::task03::seed007",
            "workflow__posvar__spatial__task03__seed007",
        ),
        (
            SUITE,
            "suites/pick_place/task_03/seed_007",
            "suites::pick_place::task03::seed007",
            "suites__pick_place__libero__object__task03__seed007",
        ),
    ],
    ids=["policy axis", "no policy", "suites"],
)
def test_the_four_forms_of_a_trial_name(names, key, trial_id, slug):
    cell_key = ids.cell_key(*names)
    assert ids.trial_key(cell_key, 3, 7) == key
    assert ids.cell_of_key(key) == cell_key
    assert ids.mode_of_key(key) == key.split("/")[0]
    assert ids.trial_id(ids.cell_id_parts(*names), 3, 7) == trial_id
    assert ids.slug(*names, 3, 7) == slug
    node = ids.node_id("benchmarks/grid.yaml", trial_id)
    assert ids.split_node_id(node) == ("benchmarks/grid.yaml", trial_id)
    assert ids.path_of(node) == "benchmarks/grid.yaml"
    assert ids.is_trial_node(node) and not ids.is_trial_node("tests/test_x.py::test_y")
    mode_part, cell_part, task, seed = ids.id_parts_of(trial_id)
    assert ids.phase_of(node) == f"benchmarks/grid.yaml::{mode_part}"
    assert ids.task_of(node) == f"benchmarks/grid.yaml::{mode_part}::{cell_part}::{task}"
    assert (task, seed) == ("task03", "seed007")


def test_plain_tests_keep_their_own_phase_and_task():
    node = "tests/test_x.py::TestA::test_b"
    assert ids.phase_of(node) == "tests/test_x.py"
    assert ids.task_of(node) == node
    assert ids.split_node_id("tests/test_x.py") == ("tests/test_x.py", "")


def test_the_plan_and_the_records_name_a_trial_through_ids():
    mode, policy, family, variation, _ = GRID
    cell = Cell(
        mode=mode,
        policy_id=policy,
        family=family,
        variation=variation,
        suite="libero_object",
        task_ids=[3],
        seeds=[7],
    )
    trial = Trial(cell=cell, task_id=3, seed=7)
    assert trial.key == "policy_only/pi05/libero/object/task_03/seed_007"
    assert trial.task_dir == "policy_only/pi05/libero/object/task_03"
    assert trial.id == "policy_only@pi05::libero/object::task03::seed007"
    identity = TrialIdentity.of(trial, nodeid=ids.node_id("g.yaml", trial.id), config="g.yaml")
    assert identity.slug == "policy_only__pi05__libero__object__task03__seed007"


def test_a_one_off_trial_is_labelled_by_what_it_runs_and_where():
    label = ids.run_label("pick_place", "libero", "object", 3, 7)
    assert label == "pick_place_libero_object_task03_seed007"
