"""Workflow validation: every problem at once, each naming node and field. No simulator."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import BaseModel

from pytest_gap.skills.catalogue import catalogue
from pytest_gap.workflow.schema import WorkflowError, load_workflow, validate_workflow

BASE = {
    "version": 1,
    "name": "t",
    "start": "find",
    "nodes": {
        "find": {"type": "tool", "skill": "locate", "inputs": {"name": "milk"}, "next": "grab"},
        "grab": {
            "type": "tool",
            "skill": "grasp_candidates",
            "inputs": {"box": {"$ref": "find.box"}},
            "next": "go",
        },
        "go": {
            "type": "tool",
            "skill": "move_to",
            "inputs": {
                "position": {"$ref": "grab.best.position"},
                "yaw": {"$ref": "grab.best.yaw"},
            },
            "next": "ok?",
        },
        "ok?": {
            "type": "router",
            "routes": [{"when": {"ref": "go.reached", "op": "eq", "value": True}, "next": "done"}],
            "default": "fail",
        },
        "done": {"type": "end", "status": "success"},
        "fail": {"type": "end", "status": "failure", "recovery": [{"skill": "open_gripper"}]},
    },
}


def _problems(mutate) -> list[str]:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(WorkflowError) as err:
        validate_workflow(data, "wf.json")
    assert str(err.value).startswith("wf.json: ")
    return err.value.problems


def test_the_base_graph_is_valid_and_lists_its_edges():
    wf = validate_workflow(BASE)
    assert ("ok?", "done", "route:0") in wf.edges() and ("ok?", "fail", "default") in wf.edges()


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["nodes"]["find"].update(skill="locat"),
            "nodes.find.skill: unknown skill 'locat'; did you mean locate?",
        ),
        (
            lambda d: d["nodes"]["find"]["inputs"].update(nmae="x"),
            "nodes.find.inputs.nmae: unknown input of skill locate; did you mean name?",
        ),
        (
            lambda d: d["nodes"]["find"].update(inputs={}),
            "nodes.find.inputs.name: required input of skill locate is missing",
        ),
        (
            lambda d: d["nodes"]["find"]["inputs"].update(name=3),
            "nodes.find.inputs.name: type mismatch: 3 is not a valid str",
        ),
        (
            lambda d: d["nodes"]["go"]["inputs"].update(yaw={"$ref": "find.name"}),
            "nodes.go.inputs.yaw: type mismatch: $ref 'find.name' is str, "
            "skill move_to wants float",
        ),
        (
            lambda d: d["nodes"]["grab"]["inputs"].update(box={"$ref": "fnd.box"}),
            "nodes.grab.inputs.box: $ref 'fnd.box' names no node; did you mean find?",
        ),
        (
            lambda d: d["nodes"]["grab"]["inputs"].update(box={"$ref": "find.bux"}),
            "nodes.grab.inputs.box: $ref 'find.bux': skill locate has no output 'bux'",
        ),
        (
            lambda d: d["nodes"]["ok?"]["routes"][0]["when"].update(ref="go.arrived"),
            "nodes.ok?.routes[0].when.ref: $ref 'go.arrived': "
            "skill move_to has no output 'arrived'",
        ),
        (
            lambda d: d["nodes"]["go"].update(next="nowhere"),
            "nodes.go.next: edge to 'nowhere', which names no node",
        ),
        (
            lambda d: d["nodes"].update(orphan={"type": "end", "status": "failure"}),
            "nodes.orphan: unreachable end: no edge path from start 'find'",
        ),
        (
            lambda d: d["nodes"]["ok?"].update(
                default="go",
                routes=[{"when": {"ref": "go.reached", "op": "eq", "value": True}, "next": "go"}],
            ),
            "start: no end node is reachable from 'find'",
        ),
        (
            lambda d: (
                [d["nodes"].pop(k) for k in ("done", "fail")]
                and d["nodes"]["ok?"].update(
                    default="find",
                    routes=[{"when": {"ref": "go.reached", "op": "truthy"}, "next": "find"}],
                )
            ),
            "nodes: missing end: add a node of type 'end' (status success|failure)",
        ),
        (lambda d: d.update(start="begin"), "start: 'begin' names no node"),
        (
            lambda d: d["nodes"]["find"].update(code="import os"),
            "nodes.find.code: Extra inputs are not permitted",
        ),
        (
            lambda d: d["nodes"]["fail"]["recovery"].append({"skill": "selfdestruct"}),
            "nodes.fail.recovery[1].skill: unknown skill 'selfdestruct'",
        ),
    ],
)
def test_each_kind_of_error_names_node_and_field(mutate, expected):
    problems = _problems(mutate)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_problem_is_reported_at_once():
    def many(d):
        d["nodes"]["find"]["skill"] = "locat"
        d["nodes"]["go"]["inputs"]["speed"] = 2
        d["nodes"]["grab"]["inputs"]["box"] = {"$ref": "nope.box"}
        d["nodes"]["go"]["next"] = "nowhere"

    problems = _problems(many)
    assert len(problems) >= 4
    assert {p.split(":")[0] for p in problems} >= {
        "nodes.find.skill",
        "nodes.go.inputs.speed",
        "nodes.grab.inputs.box",
        "nodes.go.next",
    }


def test_placeholders_are_filled_or_reported(tmp_path):
    data = copy.deepcopy(BASE)
    data["nodes"]["find"]["inputs"]["name"] = "{{target}}"
    (tmp_path / "workflow.json").write_text(json.dumps(data))
    wf = load_workflow(tmp_path, {"target": "milk", "container": "basket"})
    assert wf.nodes["find"].inputs["name"] == "milk"
    with pytest.raises(WorkflowError) as err:
        load_workflow(tmp_path, {"container": "basket"})
    assert err.value.problems == [
        "nodes.find.inputs.name: placeholder {{target}} is not filled; provide a value for 'target'"
    ]


def test_missing_dir_and_bad_json_are_one_clear_problem(tmp_path):
    with pytest.raises(WorkflowError, match=r"no workflow\.json here"):
        load_workflow(tmp_path)
    (tmp_path / "workflow.json").write_text('{"version": 1,\n "nodes": }')
    with pytest.raises(WorkflowError, match=r"line 2 column 11: invalid JSON"):
        load_workflow(tmp_path)


def test_reference_graphs_validate():
    placeholders = {"target": "milk", "container": "basket"}
    assert load_workflow("examples/workflows/pick_place", placeholders).start == "home"
    assert load_workflow("examples/workflows/pack_all").start == "read"


def test_catalogue_is_machine_readable_with_typed_inputs_and_outputs():
    entries = {e["name"]: e for e in json.loads(json.dumps(catalogue()))}
    assert {
        "observe",
        "home",
        "open_gripper",
        "close_gripper",
        "locate",
        "grasp_candidates",
        "move_to",
        "lift",
        "place",
        "verify_in_container",
        "check_success",
    } <= set(entries)
    locate = entries["locate"]
    assert locate["inputs"]["required"] == ["name"]
    assert locate["inputs"]["properties"]["name"]["type"] == "string"
    assert "box" in locate["outputs"]["properties"]
    # No motion-planner choice is advertised: the IK servo is the only one (cuRobo is not wired).
    assert set(entries["move_to"]["inputs"]["properties"]) == {"position", "yaw", "gripper"}
    assert all(e["description"] for e in entries.values())


def test_every_bound_a_workflow_sets_has_a_hard_cap():
    """An LLM-written graph cannot run unbounded, even with the trial watchdog off."""

    def uncapped(data):
        data["limits"] = {"max_node_executions": 10**9, "max_sim_steps": 10**9}
        data["nodes"]["find"]["max_visits"] = 10**6
        data["nodes"]["ok?"]["max_visits"] = 101
        data["nodes"]["fail"]["recovery"] = [{"skill": "open_gripper"}] * 21

    assert _problems(uncapped) == [
        "limits.max_node_executions: Input should be less than or equal to 1000 (a hard cap: "
        "no workflow may run unbounded)",
        "limits.max_sim_steps: Input should be less than or equal to 5000 (a hard cap: "
        "no workflow may run unbounded)",
        "nodes.find.max_visits: Input should be less than or equal to 100 (a hard cap: "
        "no workflow may run unbounded)",
        "nodes.ok?.max_visits: Input should be less than or equal to 100 (a hard cap: "
        "no workflow may run unbounded)",
        "nodes.fail.recovery: List should have at most 20 items after validation, not 21 (a "
        "hard cap: no workflow may run unbounded)",
    ]

    def counting(data):
        data["nodes"]["find"] = {
            "type": "tool",
            "skill": "run_policy",
            "inputs": {"policy": "pi05", "max_windows": 1001, "settle_steps": 10**9},
            "next": "grab",
        }
        data["nodes"]["grab"]["inputs"]["box"] = {"$ref": "go.box"}

    problems = [p for p in _problems(counting) if "above the cap" in p]
    assert problems == [
        "nodes.find.inputs.max_windows: 1001 is above the cap of 1000 for a count (a hard cap: "
        "no workflow may run unbounded)",
        "nodes.find.inputs.settle_steps: 1000000000 is above the cap of 1000 for a count (a "
        "hard cap: no workflow may run unbounded)",
    ]
    capped = copy.deepcopy(BASE)
    capped["limits"] = {"max_node_executions": 1000, "max_sim_steps": 5000}
    capped["nodes"]["find"]["max_visits"] = 100
    validate_workflow(capped)  # the caps themselves are allowed


def test_a_skill_module_imported_anew_re_registers_but_a_name_clash_is_an_error(monkeypatch):
    """An in-process pytest session restores sys.modules, so the next one imports the skill
    modules again: the same functions replace themselves. Another function under a taken name
    stays an error naming both."""
    import importlib
    import sys

    from pytest_gap.skills import catalogue, registry

    monkeypatch.setattr(registry, "_SKILLS", dict(registry._SKILLS))
    catalogue.load_builtin_skills()
    before = set(registry._SKILLS)
    for name in ("pytest_gap.skills.basic", "pytest_gap.skills.grasp", "pytest_gap.skills.place"):
        monkeypatch.delitem(sys.modules, name)
        importlib.import_module(name)  # registers its skills again
    assert set(registry._SKILLS) == before

    def observe(ctx) -> ClashOut:
        return ClashOut()

    with pytest.raises(ValueError, match=r"skill observe registered twice \(pytest_gap\.skills"):
        registry.skill(observe)


class ClashOut(BaseModel):
    ok: bool = True
