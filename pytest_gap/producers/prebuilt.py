"""A fixed workflow directory, materialised per (cell, task) with its placeholders filled.

The materialised copy is what the trials run and what a reader inspects afterwards: the source
directory (a shipped template or the user's `workflow_dir`) with its workflow.json filled for
the task. `producers.base.produce` writes it atomically, once per destination.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

from pytest_gap.errors import GapError
from pytest_gap.producers.base import ProduceRequest, produce
from pytest_gap.workflow.schema import WORKFLOW_FILE, fill_placeholders, load_workflow

__all__ = ["Prebuilt", "materialize"]


class Prebuilt:
    """Copies `request.workflow_dir` (or a single workflow .json file) and fills its
    placeholders; every problem of the filled workflow is raised before anything is written."""

    needs_source: ClassVar[bool] = True
    needs_llm: ClassVar[bool] = False

    def write(self, request: ProduceRequest, directory: Path) -> dict[str, Any]:
        source = request.workflow_dir
        if source is None:
            raise GapError("a prebuilt workflow needs a template or workflow_dir; none was given")
        values = request.placeholders
        load_workflow(source, values)  # every problem of the filled workflow, before writing
        file = source / WORKFLOW_FILE if source.is_dir() else source
        filled, _ = fill_placeholders(json.loads(file.read_text(encoding="utf-8")), values)
        if source.is_dir():
            shutil.copytree(source, directory, dirs_exist_ok=True)
        (directory / WORKFLOW_FILE).write_text(json.dumps(filled, indent=1) + "\n")
        return {"source": str(source), "prompt": request.instruction, "placeholders": values}


def materialize(source: Path, dest: Path, values: dict[str, str], prompt: str) -> float:
    """Fill `source`'s placeholders into `dest` unless it exists; return seconds spent."""
    request = ProduceRequest(instruction=prompt, placeholders=values, workflow_dir=source)
    return produce(Prebuilt(), request, dest)
