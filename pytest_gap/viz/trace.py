"""One trial's workflow run as the report draws it: the graph with each node's executions
(inputs, outputs, router decisions, perception images), the edges with how often each was
taken, the skill events, the policy's per-window timing, and the LLM agents' turns. Read from
the trial's trace dir (dag_trace.json and what the trace recorder wrote beside it).
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pytest_gap.viz.files import files_in, read_json, read_text, relative

log = logging.getLogger(__name__)

DAG_TRACE = "dag_trace.json"
POLICY_WINDOW = "policy window"  # the event run_policy records per observation -> actions


class NodeRun(BaseModel):
    seq: int
    status: str
    duration_ms: float | None
    start_step: int | None
    end_step: int | None
    inputs: Any = None
    outputs: Any = None
    error: str | None = None
    decision: Any = None
    images: list[str] = []  # what a perception node looked at, relative to the report


class GraphNode(BaseModel):
    id: str
    type: str
    skill: str | None
    status: str
    runs: list[NodeRun]
    x: float
    y: float


class GraphEdge(BaseModel):
    source: str
    target: str
    kind: str
    taken: int


class PolicyWindow(BaseModel):
    window: int
    step: int | None
    infer_ms: float | None
    actions: int | None


class TraceView(BaseModel):
    workflow: str | None
    result: dict[str, Any]
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    events: list[dict[str, Any]]
    windows: list[PolicyWindow]
    width: float
    height: float


class AgentTurn(BaseModel):
    name: str
    text: str  # the file as recorded (already redacted when it was written)


# -- layout -------------------------------------------------------------------------------------
NODE_W, NODE_H, GAP_X, GAP_Y = 150.0, 44.0, 30.0, 46.0


def layered_layout(node_ids: list[str], edges: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """(layer, slot) per node: layer is the fewest edges from the first node (the workflow's
    start), so loops back to a router do not stretch the drawing; nodes no edge reaches go in a
    last layer of their own."""
    if not node_ids:
        return {}
    following: dict[str, list[str]] = {n: [] for n in node_ids}
    for source, target in edges:
        if source in following and target in following:
            following[source].append(target)
    depth = {node_ids[0]: 0}
    queue = deque([node_ids[0]])
    while queue:
        node = queue.popleft()
        for nxt in following[node]:
            if nxt not in depth:
                depth[nxt] = depth[node] + 1
                queue.append(nxt)
    last = max(depth.values()) + 1
    slots: dict[int, int] = {}
    placed = {}
    for node in node_ids:  # workflow order within a layer keeps the drawing stable
        layer = depth.get(node, last)
        placed[node] = (layer, slots.get(layer, 0))
        slots[layer] = slots.get(layer, 0) + 1
    return placed


def _policy_windows(events: list[dict[str, Any]]) -> list[PolicyWindow]:
    return [
        PolicyWindow(
            window=int(e.get("window", i + 1)),
            step=e.get("step"),
            infer_ms=e.get("infer_ms"),
            actions=e.get("actions"),
        )
        for i, e in enumerate(x for x in events if x.get("message") == POLICY_WINDOW)
    ]


def trace_file(trace_dir: Path) -> Path | None:
    found = files_in(trace_dir, DAG_TRACE)
    return found[0] if found else None


def trace_images(trace_dir: Path) -> dict[int, list[Path]]:
    """A trace dir's perception images by the node execution (seq) that looked at them."""
    images: dict[int, list[Path]] = {}
    for path in files_in(trace_dir / "images", "*.png"):
        head = path.name.split("_", 1)[0]
        if head.isdigit():
            images.setdefault(int(head), []).append(path)
    return images


def read_trace(trace_dir: Path, base: Path) -> TraceView | None:
    """The workflow graph of one trial as it ran: nodes with their executions (inputs,
    outputs, router decisions, perception images), edges with how often each was taken, the
    skill events and the policy's per-window timing. None without a readable dag_trace.json.
    Only files that resolve inside `trace_dir` are read (the caller confines `trace_dir`)."""
    dag_file = trace_file(trace_dir)
    dag = read_json(dag_file) if dag_file else None
    if not isinstance(dag, dict) or not isinstance(dag.get("nodes"), list):
        return None
    try:
        return _trace_view(dag, trace_dir, base)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of the wrong type
        log.warning("gap viz: %s: not a trace this harness wrote (%s); not shown", dag_file, exc)
        return None


def _trace_view(dag: dict[str, Any], trace_dir: Path, base: Path) -> TraceView:
    io: dict[int, dict[str, Any]] = {}
    for path in files_in(trace_dir / "nodes", "*.json"):
        record = read_json(path)
        if isinstance(record, dict) and isinstance(record.get("seq"), int):
            io[record["seq"]] = record
    images = {
        seq: [relative(p, base) or "" for p in paths]
        for seq, paths in trace_images(trace_dir).items()
    }
    raw_nodes = [n for n in dag["nodes"] if isinstance(n, dict) and "id" in n]
    raw_edges = [e for e in dag.get("edges", []) if isinstance(e, dict)]
    edges = [
        GraphEdge(
            source=str(e.get("source")),
            target=str(e.get("target")),
            kind=str(e.get("kind", "")),
            taken=int(e.get("taken", 0)),
        )
        for e in raw_edges
    ]
    ids = [str(n["id"]) for n in raw_nodes]
    places = layered_layout(ids, [(e.source, e.target) for e in edges])
    nodes = []
    for n in raw_nodes:
        runs = []
        for ex in n.get("executions", []):
            seq = ex.get("seq")
            record = io.get(seq, {})
            runs.append(
                NodeRun(
                    seq=seq if isinstance(seq, int) else 0,
                    status=str(ex.get("status", "")),
                    duration_ms=ex.get("duration_ms"),
                    start_step=ex.get("start_step"),
                    end_step=ex.get("end_step"),
                    inputs=record.get("inputs"),
                    outputs=record.get("outputs"),
                    error=record.get("error") or ex.get("error"),
                    decision=ex.get("decision"),
                    images=images.get(seq, []) if isinstance(seq, int) else [],
                )
            )
        layer, slot = places[str(n["id"])]
        nodes.append(
            GraphNode(
                id=str(n["id"]),
                type=str(n.get("type", "")),
                skill=n.get("skill"),
                status=str(n.get("status", "")),
                runs=runs,
                x=GAP_X + slot * (NODE_W + GAP_X),
                y=GAP_Y / 2 + layer * (NODE_H + GAP_Y),
            )
        )
    events = [e for e in dag.get("events", []) if isinstance(e, dict)]
    return TraceView(
        workflow=dag.get("workflow"),
        result=dag.get("result") if isinstance(dag.get("result"), dict) else {},
        nodes=nodes,
        edges=edges,
        events=events,
        windows=_policy_windows(events),
        width=max((n.x for n in nodes), default=0.0) + NODE_W + GAP_X,
        height=max((n.y for n in nodes), default=0.0) + NODE_H + GAP_Y / 2,
    )


def read_agents(directory: Path) -> list[AgentTurn]:
    """The LLM agents' recorded prompts and answers, in the order they were written."""
    texts = ((p, read_text(p)) for p in files_in(directory, "*.json"))
    return [AgentTurn(name=p.stem, text=text) for p, text in texts if text is not None]
