"""llm_generation: an LLM writes the whole workflow for a task, zero-shot, once per task.

Two agents, one shot: a coordinator proposes the stages of the graph from the task prompt and
the skill catalogue; a writer turns the stages into workflow.json against the catalogue. The
workflow is validated by the workflow schema; its problems go back to the writer for at most
`composition.max_validation_retries` fixes. There is no rehearsal in the simulator and no
refinement from outcomes: the benchmark scores what the model wrote.

The model's output is data: a workflow can only call registered skills, so nothing the model
writes is executed as code. Every prompt and response is saved (keys redacted) under
`agent_traces/` beside the produced workflow.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from pytest_gap.config.llm import LLMConfig
from pytest_gap.producers.base import ProduceRequest
from pytest_gap.producers.chat import ChatClient, redact, resolve_settings
from pytest_gap.skills.catalogue import catalogue
from pytest_gap.workflow import schema
from pytest_gap.workflow.schema import (
    WORKFLOW_FILE,
    WorkflowError,
    fill_placeholders,
    validate_workflow,
)

COORDINATOR = """You plan robot manipulation programs for a Franka Panda arm on a tabletop \
(LIBERO, simulated). A program is a graph of calls to the skills listed below. Given a task, \
answer with JSON only: {"stages": [{"name": "...", "goal": "...", "skills": ["..."]}]}, \
the ordered stages of a graph that accomplishes the task, including how to check success and \
what to do when a skill fails (retry, recover, give up)."""

WRITER = """You write robot workflows as JSON. A workflow is a graph of skill calls with this \
format (the skills available are listed by the user):

{format}

Rules: answer with the workflow JSON object only, version 1. Call only the listed skills, with \
their listed inputs. Bind inputs to earlier outputs with {{"$ref": "node.field"}}. Every path \
must reach an end node; cap loops with max_visits."""


class Generation(BaseModel):
    workflow: dict[str, Any] | None  # the valid workflow, placeholders filled
    valid: bool
    problems: list[str]
    calls: int  # model responses used (cached or not)
    cached: int


def skill_summary() -> list[dict[str, Any]]:
    """The catalogue as the model sees it: names, one-line docs, input and output fields."""
    entries = []
    for entry in catalogue():
        inputs = entry["inputs"].get("properties", {})
        required = set(entry["inputs"].get("required", []))
        entries.append(
            {
                "name": entry["name"],
                "description": entry["description"],
                "inputs": {
                    k: {"type": v.get("type", "object"), "required": k in required}
                    | ({"default": v["default"]} if "default" in v else {})
                    for k, v in inputs.items()
                },
                "outputs": list(entry["outputs"].get("properties", {})),
            }
        )
    return entries


def extract_json(text: str) -> Any:
    """The JSON object in a model's answer (bare, fenced, or surrounded by prose)."""
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.S)
    candidate = fenced.group(1) if fenced else text
    start, end = candidate.find("{"), candidate.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("the answer holds no JSON object")
    return json.loads(candidate[start : end + 1])


def _task_text(prompt: str, objects: dict[str, str]) -> str:
    text = f"Task: {prompt}"
    if objects:
        hints = "; ".join(f"{k}: {v}" for k, v in objects.items())
        text += f"\nObjects: {hints}"
    return text


class _Tracer:
    def __init__(self, directory: Path | None, secret: str | None):
        self.directory, self.secret, self.count = directory, secret, 0

    def record(self, role: str, messages: list[dict], response: str, cached: bool) -> None:
        self.count += 1
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        body = {"role": role, "cached": cached, "messages": messages, "response": response}
        text = redact(json.dumps(body, indent=1), self.secret)
        (self.directory / f"{self.count:02d}_{role}.json").write_text(text + "\n")


def generate_workflow(
    prompt: str,
    *,
    chat: ChatClient,
    objects: dict[str, str] | None = None,
    values: dict[str, str] | None = None,
    max_validation_retries: int = 2,
    trace_dir: Path | None = None,
) -> Generation:
    """Coordinator, then writer, then up to `max_validation_retries` fixes."""
    objects = objects or {}
    tracer = _Tracer(trace_dir, chat.settings.api_key)
    skills = json.dumps(skill_summary(), indent=1)
    task = _task_text(prompt, objects)
    cached = 0

    plan_messages = [
        {"role": "system", "content": COORDINATOR},
        {"role": "user", "content": f"{task}\n\nSkills:\n{skills}"},
    ]
    stages, hit = chat.complete(plan_messages)
    cached += hit
    tracer.record("coordinator", plan_messages, stages, hit)

    messages = [
        {"role": "system", "content": WRITER.format(format=schema.__doc__.strip())},
        {
            "role": "user",
            "content": f"{task}\n\nSkills:\n{skills}\n\nStages:\n{stages}\n\n"
            "Write the workflow JSON.",
        },
    ]
    problems: list[str] = []
    workflow_schema = schema.Workflow.model_json_schema()
    for attempt in range(max_validation_retries + 1):
        answer, hit = chat.complete(messages, workflow_schema)
        cached += hit
        tracer.record("writer" if attempt == 0 else f"fix{attempt}", messages, answer, hit)
        problems = _problems(answer, values or {})
        if not problems:
            data, _ = fill_placeholders(extract_json(answer), values or {})
            return Generation(
                workflow=data, valid=True, problems=[], calls=tracer.count, cached=cached
            )
        feedback = "\n".join(f"- {p}" for p in problems)
        messages = [
            *messages,
            {"role": "assistant", "content": answer},
            {
                "role": "user",
                "content": f"The workflow has these problems:\n{feedback}\n"
                "Answer with the corrected workflow JSON only.",
            },
        ]
    return Generation(
        workflow=None, valid=False, problems=problems, calls=tracer.count, cached=cached
    )


def _problems(answer: str, values: dict[str, str]) -> list[str]:
    if not answer.strip():
        return ["the answer was empty"]
    try:
        data = extract_json(answer)
    except ValueError as exc:
        return [f"the answer is not a JSON object: {exc}"]
    filled, unfilled = fill_placeholders(data, values)
    if unfilled:
        return unfilled
    try:
        validate_workflow(filled, "generated workflow")
    except WorkflowError as exc:
        return exc.problems
    return []


class LLMProducer:
    """The llm_generation producer: `generate_workflow` with the request's llm: settings.

    Writes workflow.json when the model wrote a valid workflow (no workflow.json otherwise: the
    trial records `no_workflow`) and the agents' prompts and answers under agent_traces/.
    """

    needs_source: ClassVar[bool] = False
    needs_llm: ClassVar[bool] = True

    def write(self, request: ProduceRequest, directory: Path) -> dict[str, Any]:
        settings = resolve_settings(request.llm or LLMConfig(), request.config_source)
        generation = generate_workflow(
            request.instruction,
            chat=ChatClient(settings),
            objects=request.objects,
            values=request.placeholders,
            max_validation_retries=request.max_validation_retries,
            trace_dir=directory / "agent_traces",
        )
        if generation.valid:
            text = json.dumps(generation.workflow, indent=1) + "\n"
            (directory / WORKFLOW_FILE).write_text(text)
        return {
            "source": "llm",
            "provider": settings.provider,
            "model": settings.model,
            "prompt": request.instruction,
            "placeholders": request.placeholders,
            "valid": generation.valid,
            "problems": generation.problems,
            "calls": generation.calls,
            "cached": generation.cached,
        }
