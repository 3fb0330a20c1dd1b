"""The Producer protocol and the one way a trial's workflow gets produced.

A producer writes a workflow directory for a request (the instruction, its placeholder values,
and what the producer starts from). `produce` makes that safe for many workers: one production
per destination under a cross-process lock, written to a temporary directory and renamed into
place with its `produced.json`, so no worker ever sees half a workflow and a destination that
has its `produced.json` is reused, never produced twice. What a trial asks for, and of which
producer, is decided a level up (pytest_gap/run/produce.py).

Producers are found by name in the session's mode table (pytest_gap/modes.py `ModeTable`), as
import strings resolved on first use, so the package does not import the LLM client to run a
template.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from pytest_gap.config.llm import LLMConfig
from pytest_gap.layout import PRODUCED_FILE, production_lock, production_scratch
from pytest_gap.throttle import slot

# What describes one production rather than the workflow it produced: produced.json's time, LLM
# call count and cache hit, and the agents' transcripts beside it. Two productions of the same
# workflow (two shards, a cache hit and a miss) differ in these alone.
PRODUCTION_FIELDS = ("produce_s", "calls", "cached")
PRODUCTION_DIRS = ("agent_traces",)


class ProduceRequest(BaseModel):
    """What a producer is asked for. Producers read only the fields they need."""

    model_config = ConfigDict(frozen=True)

    instruction: str  # the task the workflow is produced for
    placeholders: dict[str, str] = {}  # {{target}}, {{container}}, {{policy_id}}, objects
    objects: dict[str, str] = {}  # a suite entry's object hints (LLM context)
    workflow_dir: Path | None = None  # the directory a prebuilt producer fills
    llm: LLMConfig | None = None
    config_source: str = "config"  # for errors that name the file
    max_validation_retries: int = 2


class Producer(Protocol):
    """Writes the workflow for a request into an empty directory."""

    # Starts from a given workflow directory (a mode's `template` or `workflow_dir`).
    needs_source: ClassVar[bool]
    # Calls the config's LLM (the session's preflight checks its key and model first).
    needs_llm: ClassVar[bool]

    def write(self, request: ProduceRequest, directory: Path) -> dict[str, Any]:
        """Write workflow.json (left out when no valid workflow came of it) and anything worth
        keeping beside it into `directory`; return produced.json's fields (no secrets).
        Raise a GapError for a problem the user can fix, InfraFailure for a service that
        failed."""


def produce(producer: Producer, request: ProduceRequest, dest: Path) -> float:
    """Produce `dest` once, whatever the number of workers; return the seconds spent (0 when
    `dest` was produced already, by this process or another).

    The first worker to arrive produces under a lock; the others wait, then reuse its result
    (and a repeated LLM generation is answered from the LLM cache).
    """
    if (dest / PRODUCED_FILE).is_file():
        return 0.0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with slot(production_lock(dest), 1):
        if (dest / PRODUCED_FILE).is_file():
            return 0.0
        t0 = time.perf_counter()
        tmp = production_scratch(dest, os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            meta = producer.write(request, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        elapsed = time.perf_counter() - t0
        meta = {**meta, "produce_s": elapsed}
        (tmp / PRODUCED_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        os.rename(tmp, dest)
    return elapsed
