"""A pytest plugin for bench/first_step.py: stamps when a session reaches each stage.

Loaded with `-p bench.first_step_probe`; writes `<GAP_FIRST_STEP_DIR>/<pid>.json` with wall
clock times (time.time()) of: this plugin's import (Python, pytest and plugin imports done),
configure, collection finished, the first env built, and the first control step. Nothing in
pytest_gap is instrumented: the env's methods are wrapped here, in the measured process.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

STAMPS: dict[str, float] = {"imported": time.time()}


def _stamp(name: str) -> None:
    if name in STAMPS:
        return
    STAMPS[name] = time.time()
    out = Path(os.environ["GAP_FIRST_STEP_DIR"]) / f"{os.getpid()}.json"
    out.write_text(json.dumps(STAMPS))


def _wrap(owner, name: str, stamp: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def stamped(*args, **kwargs):
        result = original(*args, **kwargs)
        _stamp(stamp)
        return result

    setattr(owner, name, stamped)


def pytest_configure(config) -> None:
    _stamp("configured")
    from pytest_gap.sim.libero import LiberoEnv

    _wrap(LiberoEnv, "__init__", "env_built")
    _wrap(LiberoEnv, "reset", "env_reset")
    _wrap(LiberoEnv, "step", "first_step")


def pytest_collection_finish(session) -> None:
    _stamp("collected")
