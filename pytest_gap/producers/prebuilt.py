"""A fixed workflow directory, materialised per (cell, task) with its placeholders filled.

The materialised copy is what the trials run and what a reader inspects afterwards. It is
written to a temporary directory and renamed into place, so concurrent workers of one cell
never see half a workflow: the first rename wins and the others reuse its result.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from pytest_gap.workflow.schema import WORKFLOW_FILE, fill_placeholders, load_workflow

PRODUCED_FILE = "produced.json"


def materialize(source: Path, dest: Path, values: dict[str, str], prompt: str) -> float:
    """Fill `source`'s placeholders into `dest` unless it exists; return seconds spent."""
    if (dest / PRODUCED_FILE).is_file():
        return 0.0
    t0 = time.perf_counter()
    load_workflow(source, values)  # every problem of the filled workflow, before writing
    data = json.loads((source / WORKFLOW_FILE).read_text(encoding="utf-8"))
    filled, _ = fill_placeholders(data, values)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    (tmp / WORKFLOW_FILE).write_text(json.dumps(filled, indent=1) + "\n")
    elapsed = time.perf_counter() - t0
    meta = {"source": str(source), "prompt": prompt, "placeholders": values, "produce_s": elapsed}
    (tmp / PRODUCED_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, dest)
    except OSError:  # another worker got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return elapsed
