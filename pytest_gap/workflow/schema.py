"""The workflow format: a directory holding `workflow.json` (versioned) and optional assets.

    {
      "version": 1, "name": "pick_place", "start": "find",
      "limits": {"max_node_executions": 100},
      "nodes": {
        "find":  {"type": "tool", "skill": "locate", "inputs": {"name": "{{target}}"},
                  "next": "grab", "on_error": "fail"},
        "grab":  {"type": "tool", "skill": "pick", "inputs": {"box": {"$ref": "find.box"}},
                  "next": "check"},
        "check": {"type": "router", "max_visits": 3,
                  "routes": [{"when": {"ref": "grab.lifted", "op": "eq", "value": true},
                              "next": "done"}],
                  "default": "find"},
        "done":  {"type": "end", "status": "success"},
        "fail":  {"type": "end", "status": "failure",
                  "recovery": [{"skill": "open_gripper"}]}
      }
    }

Edges: a tool node's `next`, its `on_error` (taken when the skill fails; without it the
workflow fails), a router's conditional `routes` (first match wins) and its `default`. Loops
are edges back to earlier nodes; every node's `max_visits` caps them. Inputs are literals,
`{"$ref": "node.field[.sub...]"}` bindings to an earlier tool node's outputs, or strings with
`{{placeholder}}`s filled before validation. Conditions are data, not code:
`{"ref", "op", "value"}` with op in eq ne lt le gt ge in truthy falsy, or all/any/not.

Every bound has a hard cap, checked at validation, so that no graph runs unbounded (even with
the trial watchdog off): limits.max_node_executions <= 1000, limits.max_sim_steps <= 5000,
max_visits <= 100, at most 20 recovery calls, skill count inputs (retries, attempts, windows,
steps, iterations) <= 1000.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import deque
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pytest_gap.errors import GapError
from pytest_gap.skills.catalogue import get_skill, skill_names
from pytest_gap.skills.registry import compatible, type_key, type_label

WORKFLOW_FILE = "workflow.json"
SCHEMA_VERSION = 1
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
OPS = ("eq", "ne", "lt", "le", "gt", "ge", "in", "truthy", "falsy")
# Hard caps. The shipped graphs need at most 120 node executions, 14 visits of a node and one
# episode's steps (LIBERO's longest protocol is 520); the caps leave ~10x headroom and still
# bound a trial's work to minutes when nodes take no sim steps (routers, perception, a policy
# that answers with no actions).
MAX_NODE_EXECUTIONS = 1_000
MAX_VISITS = 100
MAX_SIM_STEPS = 5_000  # the env's own episode limit applies as well
MAX_RECOVERY_CALLS = 20  # an end node's recovery calls do not count as node executions
# Counting inputs of skills (retries, attempts, windows, steps, iterations): literal values above
# the cap are refused, so no skill loops on an LLM's 10**9.
MAX_COUNT_INPUT = 1_000
COUNT_INPUT = re.compile(r"^max_|(steps|retries|attempts|iterations|windows|_every)$")


class WorkflowError(GapError, ValueError):
    """A workflow that cannot run; `problems` lists every reason, each naming node and field."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        super().__init__(f"{source}: {count}:\n" + "\n".join(f"  {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Compare(_Strict):
    ref: str
    op: Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "truthy", "falsy"]
    value: Any = None


class AllOf(_Strict):
    all: list[Condition]


class AnyOf(_Strict):
    any: list[Condition]


class NotOf(_Strict):
    not_: Condition = Field(alias="not")


Condition = Compare | AllOf | AnyOf | NotOf


class ToolNode(_Strict):
    type: Literal["tool"]
    skill: str
    inputs: dict[str, Any] = {}
    next: str
    on_error: str | None = None
    max_visits: int = Field(10, ge=1, le=MAX_VISITS)
    description: str = ""


class Route(_Strict):
    when: Condition
    next: str


class RouterNode(_Strict):
    type: Literal["router"]
    routes: list[Route] = Field(min_length=1)
    default: str
    max_visits: int = Field(10, ge=1, le=MAX_VISITS)
    description: str = ""


class SkillCall(_Strict):
    skill: str
    inputs: dict[str, Any] = {}


class EndNode(_Strict):
    type: Literal["end"]
    status: Literal["success", "failure"]
    recovery: list[SkillCall] = Field([], max_length=MAX_RECOVERY_CALLS)
    description: str = ""


Node = Annotated[ToolNode | RouterNode | EndNode, Field(discriminator="type")]


class Limits(_Strict):
    max_node_executions: int = Field(200, ge=1, le=MAX_NODE_EXECUTIONS)
    max_sim_steps: int | None = Field(None, ge=1, le=MAX_SIM_STEPS)  # None = the episode limit


class Workflow(_Strict):
    version: Literal[1]
    name: str
    description: str = ""
    start: str
    limits: Limits = Limits()
    nodes: dict[str, Node] = Field(min_length=1)

    def edges(self) -> list[tuple[str, str, str]]:
        """(source, target, kind) for every edge; kind is next, on_error, route:N or default."""
        out = []
        for name, node in self.nodes.items():
            if isinstance(node, ToolNode):
                out.append((name, node.next, "next"))
                if node.on_error:
                    out.append((name, node.on_error, "on_error"))
            elif isinstance(node, RouterNode):
                out += [(name, r.next, f"route:{i}") for i, r in enumerate(node.routes)]
                out.append((name, node.default, "default"))
        return out


AllOf.model_rebuild()
AnyOf.model_rebuild()
NotOf.model_rebuild()


# -- placeholders ----------------------------------------------------------------------------
def fill_placeholders(data: Any, values: dict[str, str], path: str = "") -> tuple[Any, list[str]]:
    """Substitute {{name}} in every string; return (data, problems for unfilled names)."""
    problems: list[str] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, str):
            missing = [m for m in PLACEHOLDER.findall(node) if m not in values]
            for name in missing:
                problems.append(
                    f"{where}: placeholder {{{{{name}}}}} is not filled; "
                    f"provide a value for {name!r}"
                )
            return PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), m.group(0))), node)
        if isinstance(node, dict):
            return {k: walk(v, f"{where}.{k}" if where else k) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(data, path), problems


def placeholders_in(data: Any) -> set[str]:
    return set(PLACEHOLDER.findall(json.dumps(data)))


# -- validation ------------------------------------------------------------------------------
_CAPS = ("less_than_equal", "too_long")


def _pydantic_problems(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "tagged")))
        loc = re.sub(r"\.(tool|router|end)(?=\.|$)", "", loc)  # drop the union tag segment
        cap = " (a hard cap: no workflow may run unbounded)" if err["type"] in _CAPS else ""
        problems.append(f"{loc or '<root>'}: {err['msg']}{cap}")
    return problems


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _ref_type(wf: Workflow, ref: str, where: str, problems: list[str]) -> tuple | None:
    """The type key of a `node.field[.sub]` reference, or None (and a problem) if it dangles."""
    node_name, _, rest = ref.partition(".")
    node = wf.nodes.get(node_name)
    if node is None:
        problems.append(f"{where}: $ref {ref!r} names no node{_suggest(node_name, list(wf.nodes))}")
        return None
    if not isinstance(node, ToolNode):
        problems.append(
            f"{where}: $ref {ref!r} names {node.type} node {node_name}, which has no outputs"
        )
        return None
    spec = get_skill(node.skill)
    if spec is None:
        return None  # reported as an unknown skill already
    if not rest:
        problems.append(
            f"{where}: $ref {ref!r} must name an output field, e.g. {node_name}.<field>"
        )
        return None
    model, annotation = spec.outputs, None
    for part in rest.split("."):
        if model is None:
            if type_key(annotation)[0] == "list" and part.isdigit():
                annotation = _list_item(annotation)
                model = annotation if _is_model(annotation) else None
                continue
            problems.append(
                f"{where}: $ref {ref!r}: {part!r} is inside a {type_label(type_key(annotation))}"
            )
            return None
        fields = model.model_fields
        if part not in fields:
            problems.append(
                f"{where}: $ref {ref!r}: skill {spec.name} has no output {part!r}; "
                f"its outputs are {', '.join(fields)}"
            )
            return None
        annotation = fields[part].annotation
        model = annotation if _is_model(annotation) else None
    return type_key(annotation)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _list_item(annotation: Any) -> Any:
    from typing import get_args

    args = [a for a in get_args(annotation) if a is not Ellipsis]
    return args[0] if args else Any


def _check_inputs(wf: Workflow, where: str, skill_name: str, inputs: dict, problems: list[str]):
    spec = get_skill(skill_name)
    if spec is None:
        problems.append(
            f"{where}.skill: unknown skill {skill_name!r}{_suggest(skill_name, skill_names())} "
            "(`gap skills` lists them)"
        )
        return
    fields = spec.inputs.model_fields
    for key, value in inputs.items():
        at = f"{where}.inputs.{key}"
        if key not in fields:
            problems.append(
                f"{at}: unknown input of skill {skill_name}{_suggest(key, list(fields))}; "
                f"its inputs are {', '.join(fields) or 'none'}"
            )
            continue
        want = fields[key].annotation
        if isinstance(value, dict) and set(value) == {"$ref"}:
            got = _ref_type(wf, str(value["$ref"]), at, problems)
            if got is not None and not compatible(got, type_key(want)):
                problems.append(
                    f"{at}: type mismatch: $ref {value['$ref']!r} is {type_label(got)}, "
                    f"skill {skill_name} wants {type_label(type_key(want))}"
                )
            continue
        try:
            TypeAdapter(want).validate_python(value, strict=True)
        except ValidationError as exc:
            problems.append(
                f"{at}: type mismatch: {value!r} is not a valid {type_label(type_key(want))} "
                f"({exc.errors()[0]['msg']})"
            )
            continue
        if COUNT_INPUT.search(key) and isinstance(value, int) and value > MAX_COUNT_INPUT:
            problems.append(
                f"{at}: {value} is above the cap of {MAX_COUNT_INPUT} for a count (a hard cap: "
                "no workflow may run unbounded)"
            )
    for key, info in fields.items():
        if info.is_required() and key not in inputs:
            problems.append(
                f"{where}.inputs.{key}: required input of skill {skill_name} is missing"
            )


def _reachable(wf: Workflow, start: str) -> set[str]:
    adjacency: dict[str, list[str]] = {}
    for src, dst, _ in wf.edges():
        adjacency.setdefault(src, []).append(dst)
    seen, todo = set(), deque([start])
    while todo:
        node = todo.popleft()
        if node in seen or node not in wf.nodes:
            continue
        seen.add(node)
        todo.extend(adjacency.get(node, []))
    return seen


def _check_graph(wf: Workflow, problems: list[str]) -> None:
    for src, dst, kind in wf.edges():
        if dst not in wf.nodes:
            field = {"next": "next", "on_error": "on_error", "default": "default"}.get(
                kind, f"routes[{kind.removeprefix('route:')}].next"
            )
            problems.append(
                f"nodes.{src}.{field}: edge to {dst!r}, which names no node"
                f"{_suggest(dst, list(wf.nodes))}"
            )
    if wf.start not in wf.nodes:
        problems.append(f"start: {wf.start!r} names no node{_suggest(wf.start, list(wf.nodes))}")
        return
    ends = [n for n, node in wf.nodes.items() if isinstance(node, EndNode)]
    if not ends:
        problems.append("nodes: missing end: add a node of type 'end' (status success|failure)")
        return
    reachable = _reachable(wf, wf.start)
    for name in wf.nodes:
        if name not in reachable:
            kind = "end" if name in ends else "node"
            problems.append(
                f"nodes.{name}: unreachable {kind}: no edge path from start {wf.start!r}"
            )
    if not any(e in reachable for e in ends):
        problems.append(f"start: no end node is reachable from {wf.start!r}")
    for name in reachable:
        if name not in ends and not any(e in _reachable(wf, name) for e in ends):
            problems.append(f"nodes.{name}: no path from here to an end node (an endless loop)")


def _check_conditions(wf: Workflow, where: str, cond: Condition, problems: list[str]) -> None:
    if isinstance(cond, Compare):
        _ref_type(wf, cond.ref, f"{where}.ref", problems)
    elif isinstance(cond, AllOf | AnyOf):
        items = cond.all if isinstance(cond, AllOf) else cond.any
        for i, sub in enumerate(items):
            _check_conditions(
                wf, f"{where}.{'all' if isinstance(cond, AllOf) else 'any'}[{i}]", sub, problems
            )
    else:
        _check_conditions(wf, f"{where}.not", cond.not_, problems)


def validate_workflow(data: Any, source: str = "workflow") -> Workflow:
    """Parse and check a workflow; raise WorkflowError listing every problem at once."""
    leftover = sorted(placeholders_in(data))
    if leftover:
        _, problems = fill_placeholders(data, {})
        raise WorkflowError(source, problems)
    try:
        wf = Workflow.model_validate(data)
    except ValidationError as exc:
        raise WorkflowError(source, _pydantic_problems(exc)) from None
    problems: list[str] = []
    for name, node in wf.nodes.items():
        where = f"nodes.{name}"
        if isinstance(node, ToolNode):
            _check_inputs(wf, where, node.skill, node.inputs, problems)
        elif isinstance(node, RouterNode):
            for i, route in enumerate(node.routes):
                _check_conditions(wf, f"{where}.routes[{i}].when", route.when, problems)
        else:
            for i, call in enumerate(node.recovery):
                _check_inputs(wf, f"{where}.recovery[{i}]", call.skill, call.inputs, problems)
    _check_graph(wf, problems)
    if problems:
        raise WorkflowError(source, problems)
    return wf


def load_workflow(path: str | Path, values: dict[str, str] | None = None) -> Workflow:
    """Read WORKFLOW_DIR/workflow.json (or a .json file), fill placeholders, validate."""
    path = Path(path)
    file = path / WORKFLOW_FILE if path.is_dir() else path
    if not file.is_file():
        raise WorkflowError(
            str(path), [f"no {WORKFLOW_FILE} here; a workflow is a directory holding one"]
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise WorkflowError(
            str(file), [f"line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"]
        ) from None
    data, problems = fill_placeholders(data, values or {})
    if problems:
        raise WorkflowError(str(file), problems)
    return validate_workflow(data, str(file))
