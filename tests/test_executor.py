"""The executor on real LIBERO: routing, loops and caps, failure exits, limits, traces."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from pytest_gap.sim.libero import make_env
from pytest_gap.skills.registry import skill
from pytest_gap.workflow.executor import evaluate, run_workflow
from pytest_gap.workflow.schema import Compare, WorkflowError, load_workflow, validate_workflow
from pytest_gap.workflow.templates import task_placeholders


class _Nothing(BaseModel):
    pass


@skill
def _test_explode(ctx) -> _Nothing:
    """Fault injection: a skill with a bug."""
    raise ZeroDivisionError("boom")


@pytest.fixture(scope="module")
def env():
    with make_env("libero_object", 0) as e:
        yield e


def wf(nodes: dict, start: str, **extra) -> object:
    return validate_workflow({"version": 1, "name": "t", "start": start, "nodes": nodes, **extra})


END = {"type": "end", "status": "success"}
FAIL = {"type": "end", "status": "failure", "recovery": [{"skill": "open_gripper"}]}


def test_router_loop_is_capped_by_max_visits(env, tmp_path):
    env.reset(0)
    graph = wf(
        {
            "grip": {"type": "tool", "skill": "close_gripper", "next": "again", "max_visits": 3},
            "again": {
                "type": "router",
                "max_visits": 5,
                "routes": [
                    {"when": {"ref": "grip.width", "op": "gt", "value": 1.0}, "next": "done"}
                ],
                "default": "grip",
            },
            "done": END,
        },
        "grip",
    )
    result = run_workflow(graph, env, trace_dir=tmp_path)
    assert result.exit_status == "loop_cap" and "grip exceeded max_visits 3" in result.error
    assert result.node_executions == 6 and not result.success
    trace = json.loads((tmp_path / "dag_trace.json").read_text())
    router = next(n for n in trace["nodes"] if n["id"] == "again")
    assert [e["decision"] for e in router["executions"]] == [
        {"route": "default", "next": "grip"}
    ] * 3
    taken = {(e["source"], e["target"]): e["taken"] for e in trace["edges"]}
    assert taken[("again", "grip")] == 3 and taken[("again", "done")] == 0
    assert next(n for n in trace["nodes"] if n["id"] == "done")["status"] == "skipped"


def test_skill_failure_follows_on_error_to_a_failure_end_with_recovery(env, tmp_path):
    env.reset(0)
    graph = wf(
        {
            "find": {
                "type": "tool",
                "skill": "locate",
                "inputs": {"name": "banana"},
                "next": "done",
                "on_error": "fail",
            },
            "done": END,
            "fail": FAIL,
        },
        "find",
    )
    result = run_workflow(graph, env, trace_dir=tmp_path)
    assert result.exit_status == "end_failure" and result.end_node == "fail"
    assert not result.success and result.steps > 0  # the recovery opened the gripper
    trace = json.loads((tmp_path / "dag_trace.json").read_text())
    find = next(n for n in trace["nodes"] if n["id"] == "find")
    assert (
        find["status"] == "error" and "no object called 'banana'" in find["executions"][0]["error"]
    )
    assert any(e["kind"] == "on_error" for e in trace["events"])


def test_failure_without_on_error_and_internal_errors_end_the_run_without_raising(env):
    env.reset(0)
    lost = wf(
        {
            "find": {
                "type": "tool",
                "skill": "locate",
                "inputs": {"name": "banana"},
                "next": "done",
            },
            "done": END,
        },
        "find",
    )
    result = run_workflow(lost, env)
    assert result.exit_status == "error" and result.error.startswith("find: no object called")
    buggy = wf(
        {"bug": {"type": "tool", "skill": "_test_explode", "next": "done"}, "done": END}, "bug"
    )
    result = run_workflow(buggy, env)
    assert result.exit_status == "error" and result.error == "bug: ZeroDivisionError: boom"


def test_safety_limits_stop_the_run(env):
    env.reset(0)
    homing = wf(
        {
            "go": {
                "type": "tool",
                "skill": "move_to",
                "inputs": {"position": [0.1, 0.2, 0.3]},
                "next": "done",
            },
            "done": END,
        },
        "go",
        limits={"max_sim_steps": 5},
    )
    result = run_workflow(homing, env)
    assert result.exit_status == "step_limit" and result.steps == 5
    env.reset(0)
    spin = wf(
        {
            "look": {"type": "tool", "skill": "check_success", "next": "loop", "max_visits": 100},
            "loop": {
                "type": "router",
                "max_visits": 100,
                "routes": [{"when": {"ref": "look.success", "op": "truthy"}, "next": "done"}],
                "default": "look",
            },
            "done": END,
        },
        "look",
        limits={"max_node_executions": 7},
    )
    result = run_workflow(spin, env)
    assert result.exit_status == "node_limit" and result.node_executions == 7


def test_conditions_compose_and_compare_with_refs():
    from pytest_gap.workflow.schema import AllOf, AnyOf, NotOf

    outputs = {"a": {"n": 3, "names": ["milk"]}, "b": {"n": 4}}
    assert evaluate(Compare(ref="a.n", op="lt", value={"$ref": "b.n"}), outputs)
    assert evaluate(Compare(ref="a.names.0", op="eq", value="milk"), outputs)
    assert evaluate(Compare(ref="a.names", op="truthy"), outputs)
    yes, no = Compare(ref="a.n", op="eq", value=3), Compare(ref="b.n", op="eq", value=3)
    assert evaluate(AllOf(all=[yes, NotOf(**{"not": no})]), outputs)
    assert not evaluate(AllOf(all=[yes, no]), outputs)
    assert evaluate(AnyOf(any=[no, yes]), outputs)
    nested = {"any": [{"not": {"ref": "x.y", "op": "truthy"}}]}
    with pytest.raises(WorkflowError) as err:
        validate_workflow(
            {
                "version": 1,
                "name": "c",
                "start": "r",
                "nodes": {
                    "r": {
                        "type": "router",
                        "default": "e",
                        "routes": [{"next": "e", "when": nested}],
                    },
                    "e": END,
                },
            }
        )
    assert err.value.problems == ["nodes.r.routes[0].when.any[0].not.ref: $ref 'x.y' names no node"]


def test_pick_place_succeeds_and_stops_at_the_successful_step(env, tmp_path):
    obs = env.reset(0)
    graph = load_workflow("examples/workflows/pick_place", task_placeholders(obs.prompt))
    result = run_workflow(graph, env, trace_dir=tmp_path, keep_images=True)
    assert result.success and result.exit_status == "task_success", result.error
    assert result.completion == 1.0 and result.steps < env.max_steps
    assert env.success()
    trace = json.loads((tmp_path / "dag_trace.json").read_text())
    assert trace["result"]["exit_status"] == "task_success"
    for node in trace["nodes"]:
        assert node["type"] in ("tool", "router", "end")
        assert node["status"] in ("ok", "error", "skipped")
        for run in node["executions"]:
            assert run["end_ms"] >= run["start_ms"] and run["duration_ms"] >= 0
    records = {p.name: json.loads(p.read_text()) for p in (tmp_path / "nodes").iterdir()}
    pick = next(r for n, r in records.items() if n.endswith("_pick.json"))
    assert pick["inputs"] == {"name": "alphabet soup", "retries": 1}
    assert pick["outputs"]["holding"] is True
    images = [i for r in records.values() for i in r.get("images", []) or []]
    assert images and all((tmp_path / i).is_file() for i in images)
