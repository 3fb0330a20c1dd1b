"""Config -> cells -> trials: order, ids, the policy axis, and cells that cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gap.config import ConfigError, parse_config
from pytest_gap.plan import all_trials, plan
from pytest_gap.servers.registry import needed

ROOT = Path(__file__).resolve().parent.parent
PICK_PLACE = str(ROOT / "examples/workflows/pick_place")


def _grid(**block):
    data = {
        "benchmark": block,
        "policies": {"pi05": {"url": "ws://h:1"}, "molmo": {"url": "ws://h:2"}},
    }
    return parse_config(data, "grid.yaml", base=ROOT)


def test_grid_order_ids_and_dirs():
    config = _grid(
        families=["posvar"],
        variations=["pos_var", "all"],
        modes=["workflow"],
        task_ids=[3, 1],
        n_seeds=2,
        mode_overrides={"workflow": {"workflow_dir": PICK_PLACE}},
    )
    trials = all_trials(plan(config))
    assert [t.id for t in trials[:3]] == [
        "workflow::posvar/pos_var::task03::seed000",
        "workflow::posvar/pos_var::task03::seed001",
        "workflow::posvar/pos_var::task01::seed000",
    ]
    assert trials[-1].id == "workflow::posvar/all::task01::seed001"
    assert trials[0].key == "workflow/posvar/pos_var/task_03/seed_000"
    assert trials[0].task_dir == "workflow/posvar/pos_var/task_03"
    assert all(t.cell.error is None and t.cell.suite == "libero_object" for t in trials)
    assert [t.id for t in all_trials(plan(config))] == [t.id for t in trials]  # deterministic


def test_policy_axis_applies_to_policy_modes_only():
    cells = plan(
        _grid(
            families=["libero"],
            variations=["object"],
            modes=["llm_generation", "policy_only"],
            policies=["pi05", "molmo"],
            n_tasks=1,
            n_seeds=1,
        )
    )
    assert [(c.row, c.key) for c in cells] == [
        ("llm_generation", "llm_generation/libero/object"),
        ("policy_only@pi05", "policy_only/pi05/libero/object"),
        ("policy_only@molmo", "policy_only/molmo/libero/object"),
    ]
    assert cells[1].keywords == ["policy_only", "libero", "object", "libero_object", "pi05"]


def test_cells_that_cannot_run_are_planned_with_the_reason():
    cells = plan(_grid(families=["libero"], variations=["object"], n_tasks=1, n_seeds=1))
    assert [c.mode for c in cells] == ["llm_generation", "llm_plus_policy", "policy_only"]
    assert "llm.model is not set; name the model" in cells[0].error
    workflow = plan(
        _grid(families=["libero"], variations=["object"], modes=["workflow"], n_tasks=1, n_seeds=1)
    )[0]
    assert "benchmark.mode_overrides.workflow.workflow_dir is not set" in workflow.error


def test_seeds_tasks_and_overrides():
    config = _grid(
        families=["libero"],
        variations=["goal"],
        modes=["workflow", "llm_generation"],
        n_tasks=50,  # more than the suite has: its 10 tasks
        seeds=[7, 3, 11],
        mode_overrides={"workflow": {"workflow_dir": PICK_PLACE, "n_seeds": 2, "num_workers": 3}},
    )
    workflow, llm = plan(config)
    assert workflow.task_ids == tuple(range(10))
    assert workflow.seeds == (7, 3) and workflow.num_workers == 3
    assert llm.seeds == (7, 3, 11) and llm.num_workers == 8


def test_restricting_families_and_modes():
    config = _grid(families=["libero", "posvar"], variations=["object", "pos_var"], n_seeds=1)
    cells = plan(config, families=["posvar"], modes=["policy_only"])
    assert [(c.mode, c.family, c.variation) for c in cells] == [
        ("policy_only", "posvar", "pos_var")
    ]
    with pytest.raises(ConfigError, match="--families grocery_packing: not in this config's list"):
        plan(config, families=["grocery_packing"])


def test_task_ids_beyond_the_suite_are_a_config_error():
    with pytest.raises(ConfigError, match=r"task ids \[12\] do not exist in libero/object"):
        plan(_grid(families=["libero"], variations=["object"], task_ids=[0, 12]))


def test_suites_cells_dedupe_names_and_stagger_devices():
    config = parse_config(
        {
            "trials": {"trials_per_generation": 2, "num_workers": 2, "task_timeout_secs": 30},
            "suites": [
                {"suite_name": "libero_object", "task_ids": [0], "workflow_dir": PICK_PLACE},
                {
                    "suite_name": "libero_object",
                    "task_prompts": {4: "x"},
                    "num_workers": 3,
                    "workflow_dir": PICK_PLACE,
                    "timeout_secs": 900,
                },
                {"suite_name": "grocery_packing/object", "task_ids": [1], "seeds": [5]},
            ],
        },
        "suites.yaml",
        base=ROOT,
    )
    cells = plan(config)
    assert [c.suite_name for c in cells] == [
        "libero_object",
        "libero_object_02",
        "grocery_packing__object",
    ]
    assert [c.device_offset for c in cells] == [0, 2, 5]
    assert [c.timeout_s for c in cells] == [30, 900, 30]
    assert cells[1].task_ids == (4,) and cells[2].seeds == (5,)
    assert cells[2].mode == "llm_generation" and cells[2].error  # no workflow_dir: generation
    trial = cells[1].trials()[0]
    assert trial.id == "suites::libero_object_02::task04::seed000"
    assert trial.key == "suites/libero_object_02/task_04/seed_000"
    with pytest.raises(ConfigError, match="restrict a grid"):
        plan(config, families=["posvar"])


def test_policy_modes_need_a_template_and_fall_back_to_the_pi05_preset():
    config = _grid(
        families=["libero"],
        variations=["object"],
        modes=["policy_only"],
        n_tasks=1,
        n_seeds=1,
        mode_overrides={"policy_only": {"template": "policy_only"}},
    )
    no_policy = plan(config)[0]
    # The spec's implicit fallback: the pi05-libero preset, a managed entry booted like any.
    assert no_policy.error is None and no_policy.row == "policy_only@pi05-libero"
    assert config.policies["pi05-libero"].preset == "pi05-libero"
    assert needed(config, [no_policy]) == {"pi05-libero": config.policies["pi05-libero"]}
    no_template = plan(
        _grid(
            families=["libero"],
            variations=["object"],
            modes=["llm_plus_policy"],
            policies=["pi05"],
            n_tasks=1,
            n_seeds=1,
        )
    )[0]
    assert no_template.error == (
        "benchmark.mode_overrides.llm_plus_policy.template is not set: the llm_plus_policy mode "
        "runs a workflow template; set template: llm_plus_policy (shipped with pytest-gap) or a "
        "workflow_dir"
    )
    ready = plan(
        _grid(
            families=["libero"],
            variations=["object"],
            modes=["policy_only"],
            n_tasks=1,
            n_seeds=1,
            mode_overrides={"policy_only": {"template": "policy_only", "policy_id": "molmo"}},
        )
    )[0]
    assert ready.error is None and ready.row == "policy_only@molmo"


def test_tasks_that_ship_no_init_states_are_a_config_error(tmp_path):
    """LIBERO-PRO's libero_10_with_milk lists 10 tasks, but tasks 3 and 4 ship no init state:
    a default task list leaves them out; naming them is a config error, not a crash."""
    from pytest_gap.config import ConfigError, parse_config
    from pytest_gap.plan import plan

    def suites(**entry):
        wf = ROOT / "examples/workflows/pick_place"
        data = {"suites": [{"suite_name": "libero_10_with_milk", "workflow_dir": str(wf), **entry}]}
        return parse_config(data, "bench.yaml", tmp_path)

    assert [c.task_ids for c in plan(suites())] == [(0, 1, 2, 5, 6, 7, 8, 9)]  # by default
    with pytest.raises(ConfigError) as info:
        plan(suites(task_ids=[2, 3, 4]))
    assert info.value.problems == [
        "suites.0.task_ids: task ids [3, 4] of libero_10_with_milk (libero_10_with_milk) ship no "
        "init states and cannot run; leave them out of task_ids"
    ]
    assert [c.task_ids for c in plan(suites(task_ids=[0, 5]))] == [(0, 5)]
