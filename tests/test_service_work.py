"""The work a config asks for, counted without planning it (pytest_gap/service/work.py), against
what the planner makes of the same config: the trials `plan` + `all_trials` build, and the steps
`--gap-shard`'s own step limit gives each (scale/shard.py: a second, independent reading of
each task's limit). The count must equal the plan's on every shape the service may see, and
stop early, in little memory, on one it would refuse."""

from __future__ import annotations

import tracemalloc

import pytest

from pytest_gap.config.document import parse_config
from pytest_gap.plan import all_trials, plan
from pytest_gap.scale.shard import _step_limit
from pytest_gap.service.limits import ServiceLimits
from pytest_gap.service.work import count_work, work_problems

POLICY = {"remote": {"url": "ws://127.0.0.1:1", "obs_format": "gap"}}
OVERRIDE = {"policy_only": {"template": "policy_only"}}


def _grid(trials: dict | None = None, **block) -> dict:
    base = {"modes": ["policy_only"], "policies": ["remote"], "mode_overrides": OVERRIDE}
    return {"policies": POLICY, "trials": trials or {}, "benchmark": {**base, **block}}


CONFIGS = {
    "one_suite": _grid(families=["libero"], variations=["object"], task_ids=[0, 1], n_seeds=3),
    "every_posvar_with_controls": _grid(
        families=["posvar"], task_ids=[0, 2], seeds=[1, 5], controls=True
    ),
    "grocery_steps_grow_with_items": _grid(families=["grocery_packing"], n_tasks=4, n_seeds=2),
    "mode_seeds_and_max_steps": _grid(
        {"max_steps": 33},
        families=["libero"],
        variations=["spatial", "goal"],
        n_tasks=3,
        n_seeds=5,
        mode_overrides={"policy_only": {"template": "policy_only", "n_seeds": 2}},
    ),
    "two_modes_two_policies": {
        **_grid(
            families=["libero"],
            variations=["object"],
            task_ids=[3],
            n_seeds=2,
            modes=["policy_only", "workflow"],
            policies=["remote", "other"],
            mode_overrides={**OVERRIDE, "workflow": {"template": "policy_only"}},
        ),
        "policies": {**POLICY, "other": {"url": "ws://127.0.0.1:2", "obs_format": "gap"}},
    },
    "suites": {
        "policies": POLICY,
        "suites": [
            {"suite_name": "libero_object", "task_ids": [0, 1], "trials_per_generation": 2},
            {"suite_name": "posvar/pos_var", "seeds": [0, 3, 4], "task_ids": [2]},
        ],
    },
}


@pytest.mark.parametrize("data", CONFIGS.values(), ids=CONFIGS)
def test_the_count_is_what_the_planner_plans(data):
    config = parse_config(data, "c.yaml")
    trials = all_trials(plan(config))
    steps = sum(
        t.cell.max_steps
        or _step_limit(t.cell.backend, t.cell.family, t.cell.variation, t.cell.suite, t.task_id)
        for t in trials
    )
    work = count_work(config)
    assert (work.trials, work.steps) == (len(trials), steps)
    assert work_problems(config, ServiceLimits(), "c.yaml") == []
    tight = ServiceLimits(max_trials_per_run=len(trials) - 1 or 1, max_steps_per_run=steps)
    if len(trials) > 1:
        (line,) = work_problems(config, tight, "c.yaml")
        assert "at least" in line
        assert "--max-trials-per-run" in line


def test_a_huge_product_is_counted_in_constant_memory_and_stops_at_the_bound():
    data = _grid(families=["posvar", "libero_pro"], n_tasks=100_000, n_seeds=100_000)
    config = parse_config(data, "c.yaml")
    tracemalloc.start()
    (line,) = work_problems(config, ServiceLimits(), "c.yaml")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak  # bytes: no cell, trial or seed tuple was built
    assert "--max-trials-per-run" in line and "at most 20,000 per run" in line
    steps = _grid({"max_steps": 100_000}, families=["libero"], variations=["object"], n_seeds=20)
    (line,) = work_problems(parse_config(steps, "s.yaml"), ServiceLimits(), "s.yaml")
    assert "20,000,000 steps" in line and "--max-steps-per-run" in line
