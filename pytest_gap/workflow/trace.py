"""What a workflow run did, on disk: `trace/dag_trace.json`, per-node I/O, perception images.

    trace/dag_trace.json       nodes (type, status, executions with start/end/duration_ms,
                               router decisions, errors), edges (with how often taken), events
    trace/nodes/NNN_<node>.json   resolved inputs and outputs of each execution
    trace/images/NNN_<node>_<camera>.png   what perception nodes looked at (if kept)

Node status: pending (not reached yet), running, ok, error, skipped (never reached).
Large numeric lists are summarised (shape, min, max, mean) so traces stay small.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from pytest_gap.workflow.schema import EndNode, RouterNode, ToolNode, Workflow

MAX_LIST = 32


def summarize(value: Any) -> Any:
    """JSON-safe copy of `value` with big arrays replaced by a summary."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): summarize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        flat = np.asarray(value, dtype=object).ravel()
        numeric = all(isinstance(v, int | float | np.number) for v in flat)
        if numeric and len(flat) > MAX_LIST:
            arr = np.asarray(value, dtype=float)
            return {
                "summary": "array",
                "shape": list(arr.shape),
                "min": float(arr.min()),
                "max": float(arr.max()),
                "mean": float(arr.mean()),
            }
        return [summarize(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return repr(value)


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _node_type(node) -> str:
    return {ToolNode: "tool", RouterNode: "router", EndNode: "end"}[type(node)]


class TraceRecorder:
    def __init__(self, workflow: Workflow, out_dir: str | Path | None = None):
        self.workflow = workflow
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.t0 = time.time()
        self.nodes: dict[str, dict[str, Any]] = {
            name: {
                "id": name,
                "type": _node_type(node),
                **({"skill": node.skill} if isinstance(node, ToolNode) else {}),
                "status": "pending",
                "executions": [],
            }
            for name, node in workflow.nodes.items()
        }
        self.taken: dict[tuple[str, str], int] = {}
        self.events: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self._seq = 0
        self._open: dict[str, Any] | None = None

    def _ms(self) -> float:
        return round((time.time() - self.t0) * 1000.0, 3)

    def start(self, name: str, step: int) -> None:
        self._seq += 1
        self._open = {"seq": self._seq, "start_ms": self._ms(), "start_step": step}
        self.nodes[name]["status"] = "running"
        self.nodes[name]["executions"].append(self._open)

    def finish(
        self,
        name: str,
        status: str,
        step: int,
        *,
        inputs: Any = None,
        outputs: Any = None,
        error: str | None = None,
        decision: dict | None = None,
        images: list[tuple[str, np.ndarray]] = (),
    ) -> None:
        run = self._open or {}
        end = self._ms()
        run.update(end_ms=end, duration_ms=round(end - run.get("start_ms", end), 3))
        run.update(end_step=step, status=status)
        if error:
            run["error"] = error
        if decision is not None:
            run["decision"] = decision
        self.nodes[name]["status"] = status
        record = {
            "seq": run.get("seq"),
            "node": name,
            "status": status,
            "inputs": summarize(inputs),
            "outputs": summarize(outputs),
        }
        if error:
            record["error"] = error
        if images:
            record["images"] = [
                self._save_image(run.get("seq", 0), name, c, im) for c, im in images
            ]
        self.records.append(record)
        self._open = None

    def _save_image(self, seq: int, node: str, camera: str, image: np.ndarray) -> str | None:
        if self.out_dir is None:
            return None
        import imageio.v2 as imageio

        rel = Path("images") / f"{seq:03d}_{_file_safe(node)}_{camera}.png"
        (self.out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        imageio.imwrite(self.out_dir / rel, image)
        return str(rel)

    def edge(self, source: str, target: str) -> None:
        self.taken[(source, target)] = self.taken.get((source, target), 0) + 1

    def event(self, kind: str, **data: Any) -> None:
        self.events.append({"t_ms": self._ms(), "kind": kind, **summarize(data)})

    def document(self, result: dict[str, Any]) -> dict[str, Any]:
        for node in self.nodes.values():
            if node["status"] == "pending":
                node["status"] = "skipped"
        edges = [
            {"source": s, "target": t, "kind": k, "taken": self.taken.get((s, t), 0)}
            for s, t, k in self.workflow.edges()
        ]
        return {
            "workflow": self.workflow.name,
            "version": self.workflow.version,
            "start": self.workflow.start,
            "result": summarize(result),
            "duration_ms": self._ms(),
            "nodes": list(self.nodes.values()),
            "edges": edges,
            "events": self.events,
        }

    def write(self, result: dict[str, Any]) -> Path | None:
        doc = self.document(result)
        if self.out_dir is None:
            return None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        nodes_dir = self.out_dir / "nodes"
        nodes_dir.mkdir(exist_ok=True)
        for record in self.records:
            path = nodes_dir / f"{record['seq']:03d}_{_file_safe(record['node'])}.json"
            path.write_text(json.dumps(record, indent=1), encoding="utf-8")
        path = self.out_dir / "dag_trace.json"
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        return path
