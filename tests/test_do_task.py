"""The do_task reference graph on real LIBERO: it reads an instruction of several steps, hands
them out one by one (next_step), routes each to its skill, and the simulator's own goal check
says the whole task is done."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow

GRAPH = Path(__file__).parents[1] / "examples" / "workflows" / "do_task"


def _skills_run(trace_dir: Path) -> list[str]:
    """The skills the graph ran, in the order it ran them."""
    trace = json.loads((trace_dir / "dag_trace.json").read_text())
    runs = [
        (run["start_ms"], node["skill"])
        for node in trace["nodes"]
        if node.get("skill")
        for run in node["executions"]
    ]
    return [skill for _, skill in sorted(runs)]


def test_turn_on_the_stove_then_put_the_moka_pot_on_it(tmp_path):
    """libero_10 task 2: two steps of different kinds, the second naming the first's object
    ("on it"); both goal conjuncts (turnon flat_stove_1, on moka_pot_1 the cook region) hold."""
    with make_env("libero_10", 2, EnvOptions()) as env:
        obs = env.reset(0)
        result = run_workflow(load_workflow(GRAPH, {}), env, trace_dir=tmp_path)
        assert obs.prompt == "turn on the stove and put the moka pot on it"
        assert result.success, (result.exit_status, result.error)
        assert env.completion() == 1.0
    skills = _skills_run(tmp_path)
    assert skills.index("turn_on") < skills.index("pick") < skills.index("place")


def test_an_instruction_no_step_reads_ends_the_graph_with_the_reason(tmp_path):
    with make_env("libero_goal", 7, EnvOptions()) as env:
        env.reset(0)
        result = run_workflow(
            load_workflow(GRAPH, {}), env, trace_dir=tmp_path, task_prompt="dance with the robot"
        )
    assert not result.success
    assert _skills_run(tmp_path) == ["next_step"]  # nothing moved but the end's recovery
    trace = (tmp_path / "dag_trace.json").read_text()
    assert "cannot read 'dance with the robot'" in trace


def test_a_step_that_cannot_be_done_is_passed_over_for_the_next(tmp_path):
    """The first step names nothing in the scene: pick fails, the retry finds nothing to pick
    (noted with the reason), and the stove is still turned on: the goal check has the last
    word, not the first failure."""
    with make_env("libero_goal", 7, EnvOptions()) as env:
        env.reset(0)
        prompt = "put the pineapple on the plate and turn on the stove"
        result = run_workflow(load_workflow(GRAPH, {}), env, trace_dir=tmp_path, task_prompt=prompt)
        assert result.success, (result.exit_status, result.error)
    skills = _skills_run(tmp_path)
    assert skills.count("pick") == 1 and "turn_on" in skills
    events = json.loads((tmp_path / "dag_trace.json").read_text())["events"]
    passed = [e for e in events if e.get("message") == "step passed over"]
    assert [e["task_step"] for e in passed] == ["put pineapple on plate"]
    assert "no object called 'pineapple'" in passed[0]["reason"]
