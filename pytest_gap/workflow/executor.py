"""Run a validated workflow against a simulator `Env`. Never raises because a workflow failed.

The run ends at an end node, when the simulator's goal check passes (whatever node is
running: LIBERO's protocol stops at the first successful step), or at a safety limit: the
episode's or the workflow's sim-step budget, `max_node_executions`, or a node's `max_visits`.
A skill failure follows the node's `on_error` edge, or ends the run with exit status `error`.
An exception the simulator, its renderer or the host raised in a node (faults.harness_fault:
decided by where it was raised) ends the run as an infrastructure failure (`infra_error`, with
the fault), never as the graph's; any other exception is the graph's bug (`error`, scored).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ValidationError

from pytest_gap.errors import InfraFailure
from pytest_gap.faults import HarnessFault, harness_fault
from pytest_gap.sim.backend import Env
from pytest_gap.sim.step_log import StepLog
from pytest_gap.skills.catalogue import get_skill, skill_names
from pytest_gap.skills.context import SkillContext, StepLimitReached, TaskSucceeded
from pytest_gap.skills.perception_setting import Perception
from pytest_gap.skills.registry import SkillFailure
from pytest_gap.workflow.schema import (
    AllOf,
    AnyOf,
    Compare,
    Condition,
    EndNode,
    NotOf,
    RouterNode,
    SkillCall,
    ToolNode,
    Workflow,
)
from pytest_gap.workflow.trace import TraceRecorder

if TYPE_CHECKING:
    from pytest_gap.policies.endpoint import PolicyEndpoint

# Exit statuses: how the run ended (success is the simulator's verdict, reported separately).
END_SUCCESS = "end_success"
END_FAILURE = "end_failure"
TASK_SUCCESS = "task_success"
STEP_LIMIT = "step_limit"
NODE_LIMIT = "node_limit"
LOOP_CAP = "loop_cap"
ERROR = "error"
INFRA_ERROR = "infra_error"


class RunResult(BaseModel):
    success: bool
    completion: float
    exit_status: str
    end_node: str | None = None
    error: str | None = None
    infra_failure: bool = False  # a policy server or other infrastructure failed, not the graph
    fault: HarnessFault | None = None  # the simulator, renderer or host fault that ended it
    # Policy id -> digest of the handshake metadata its server sent (SkillContext.served): which
    # policy answered, for the record's provenance.
    policy_digests: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    duration_s: float
    steps: int
    bringup_steps: int = 0  # of `steps`, a first-node bring-up's: charged to no budget
    node_executions: int
    trace_path: str | None = None


class _RefMissing(Exception):
    pass


def resolve_ref(outputs: dict[str, Any], ref: str) -> Any:
    node, *path = ref.split(".")
    if node not in outputs:
        raise _RefMissing(f"$ref {ref!r}: node {node} has not run yet")
    value = outputs[node]
    for part in path:
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise _RefMissing(f"$ref {ref!r}: {part!r} is not in the output")
    return value


def resolve_inputs(inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: resolve_ref(outputs, v["$ref"]) if isinstance(v, dict) and set(v) == {"$ref"} else v
        for k, v in inputs.items()
    }


_OPS = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "in": lambda a, b: a in b,
    "truthy": lambda a, _: bool(a),
    "falsy": lambda a, _: not a,
}


def evaluate(cond: Condition, outputs: dict[str, Any]) -> bool:
    if isinstance(cond, Compare):
        value = cond.value
        if isinstance(value, dict) and set(value) == {"$ref"}:
            value = resolve_ref(outputs, value["$ref"])
        return bool(_OPS[cond.op](resolve_ref(outputs, cond.ref), value))
    if isinstance(cond, AllOf):
        return all(evaluate(c, outputs) for c in cond.all)
    if isinstance(cond, AnyOf):
        return any(evaluate(c, outputs) for c in cond.any)
    assert isinstance(cond, NotOf)
    return not evaluate(cond.not_, outputs)


def _call(ctx: SkillContext, call: ToolNode | SkillCall, outputs: dict[str, Any]):
    spec = get_skill(call.skill)
    if spec.scene and ctx.env.scene is None:
        free = ", ".join(n for n in skill_names() if not get_skill(n).scene)
        raise SkillFailure(
            f"skill {call.skill} queries the scene (poses, gripper, cameras), which this "
            f"backend's envs do not offer; only scene-free skills run here ({free})"
        )
    resolved = resolve_inputs(call.inputs, outputs)
    try:
        args = spec.inputs.model_validate(resolved)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SkillFailure(
            f"input {'.'.join(map(str, first['loc']))} of {call.skill}: {first['msg']}"
        ) from None
    kwargs = {name: getattr(args, name) for name in spec.inputs.model_fields}
    return resolved, spec.fn(ctx, **kwargs).model_dump(mode="json")


def _charging(ctx: SkillContext, node: ToolNode, *, first: bool):
    """A bring-up skill (SkillSpec.bring_up) as the run's first node is the spec's policy_only
    bring-up: not charged to the episode's step budget. Anywhere else it is a skill like any
    other: a graph shares the episode's budget with everything it runs."""
    spec = get_skill(node.skill)
    if first and spec is not None and spec.bring_up:
        return ctx.uncharged()
    return contextlib.nullcontext()


def run_workflow(
    workflow: Workflow,
    env: Env,
    *,
    trace_dir=None,
    keep_images: bool = False,
    policies: Mapping[str, PolicyEndpoint] | None = None,
    task_prompt: str | None = None,
    perception: Perception = "privileged",
    before_connect: Callable[[str], None] | None = None,
    step_log: StepLog | None = None,
) -> RunResult:
    """Run from `workflow.start` on an env that was just reset; return what happened.

    `task_prompt` is the instruction the workflow was produced for, when it is not the env's
    own (skills that read the task or prompt a policy use it). `perception` is what the skills
    see with (`skills.perception_setting.PERCEPTION_CAMERAS`). `before_connect(policy_id)` runs
    before the run first talks to a policy's server (the runner's warm-up). `step_log` gets
    every control step's evidence (sim/step_log.py)."""
    ctx = SkillContext(
        env,
        max_sim_steps=workflow.limits.max_sim_steps,
        keep_images=keep_images,
        policies=dict(policies or {}),
        task_prompt=task_prompt,
        perception=perception,
        before_connect=before_connect,
        step_log=step_log,
    )
    try:
        return _run(workflow, env, ctx, trace_dir)
    finally:
        ctx.close()


class _Ending(NamedTuple):
    """How a run ended: its exit status, the node it ended at, the error, whether
    infrastructure failed (and the harness fault, if that was it)."""

    exit_status: str
    end_node: str | None = None
    error: str | None = None
    infra: bool = False
    fault: HarnessFault | None = None


def _run(workflow: Workflow, env: Env, ctx: SkillContext, trace_dir) -> RunResult:
    trace = TraceRecorder(workflow, trace_dir)
    t0 = time.perf_counter()
    outputs: dict[str, Any] = {}
    visits: dict[str, int] = {}
    executions = 0
    current = workflow.start

    while True:
        node = workflow.nodes[current]
        ending = _over_limit(workflow, node, current, executions, visits)
        if ending is not None:
            break
        executions += 1
        step = _execute(ctx, env, trace, node, current, outputs, first=executions == 1)
        if isinstance(step, _Ending):
            ending = step
            break
        trace.edge(current, step)
        current = step

    for event in ctx.events:
        trace.event("skill", **event)
    success = ending.exit_status == TASK_SUCCESS or env.success()
    result = RunResult(
        success=success,
        completion=1.0 if success else env.completion(),
        exit_status=ending.exit_status,
        end_node=ending.end_node,
        error=ending.error,
        infra_failure=ending.infra,
        fault=ending.fault,
        policy_digests=dict(ctx.served),
        outputs=outputs,
        duration_s=round(time.perf_counter() - t0, 3),
        steps=env.steps,
        bringup_steps=ctx.uncharged_steps,
        node_executions=executions,
    )
    path = trace.write(result.model_dump(exclude={"outputs", "trace_path"}))
    return result.model_copy(update={"trace_path": str(path) if path else None})


def _over_limit(
    workflow: Workflow,
    node: ToolNode | RouterNode | EndNode,
    current: str,
    executions: int,
    visits: dict[str, int],
) -> _Ending | None:
    """The run's end when entering `current` would pass a safety limit: the workflow's
    `max_node_executions`, or the node's `max_visits` (counted here, in `visits`)."""
    if executions >= workflow.limits.max_node_executions:
        return _Ending(
            NODE_LIMIT,
            error=f"max_node_executions {workflow.limits.max_node_executions} reached at {current}",
        )
    visits[current] = visits.get(current, 0) + 1
    if not isinstance(node, EndNode) and visits[current] > node.max_visits:
        return _Ending(LOOP_CAP, error=f"node {current} exceeded max_visits {node.max_visits}")
    return None


def _execute(
    ctx: SkillContext,
    env: Env,
    trace: TraceRecorder,
    node: ToolNode | RouterNode | EndNode,
    current: str,
    outputs: dict[str, Any],
    *,
    first: bool,
) -> str | _Ending:
    """Run one node and trace it: the id of the node to go to next, or how the run ended. A
    skill failure goes on along the node's `on_error` edge where it has one; nothing raised in
    a node leaves here (a bug or a simulator fault ends the run as an error)."""
    trace.start(current, env.steps)
    ctx.images.clear()
    resolved: Any = None
    try:
        if isinstance(node, ToolNode):
            with _charging(ctx, node, first=first):
                resolved, outputs[current] = _call(ctx, node, outputs)
            trace.finish(
                current,
                "ok",
                env.steps,
                inputs=resolved,
                outputs=outputs[current],
                images=list(ctx.images),
            )
            return node.next
        if isinstance(node, RouterNode):
            nxt, decision = node.default, {"route": "default", "next": node.default}
            for i, route in enumerate(node.routes):
                if evaluate(route.when, outputs):
                    nxt, decision = route.next, {"route": i, "next": route.next}
                    break
            trace.finish(current, "ok", env.steps, decision=decision)
            return nxt
        for call in node.recovery:
            _call(ctx, call, outputs)
        trace.finish(current, "ok", env.steps)
        return _Ending(END_SUCCESS if node.status == "success" else END_FAILURE, end_node=current)
    except TaskSucceeded:
        trace.finish(current, "ok", env.steps, inputs=resolved, images=list(ctx.images))
        trace.event("task_success", node=current, step=env.steps)
        return _Ending(TASK_SUCCESS, end_node=current)
    except StepLimitReached as exc:
        trace.finish(current, "error", env.steps, inputs=resolved, error=str(exc))
        return _Ending(STEP_LIMIT, error=str(exc))
    except (SkillFailure, _RefMissing) as exc:
        message = f"{current}: {exc}"
        trace.finish(
            current, "error", env.steps, inputs=resolved, error=message, images=list(ctx.images)
        )
        on_error = getattr(node, "on_error", None)
        if on_error is None:
            return _Ending(ERROR, error=message)
        trace.event("on_error", node=current, next=on_error, error=str(exc))
        return on_error
    except InfraFailure as exc:
        message = f"{current}: {exc}"
        trace.finish(current, "error", env.steps, inputs=resolved, error=message)
        return _Ending(INFRA_ERROR, error=message, infra=True)
    except Exception as exc:  # a bug, or a fault of the harness: recorded, never raised
        fault = harness_fault(exc)
        message = f"{current}: {type(exc).__name__}: {exc}"
        trace.finish(current, "error", env.steps, inputs=resolved, error=message)
        trace.event(
            "exception",
            node=current,
            fault=fault.kind if fault else None,
            traceback=traceback.format_exc(limit=8),
        )
        if fault is not None:
            return _Ending(INFRA_ERROR, error=message, infra=True, fault=fault)
        return _Ending(ERROR, error=message)
