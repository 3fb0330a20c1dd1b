"""The conftest of a pytester session on the fake backend (tests/fake_backend.py).

The session runs with tests/ on PYTHONPATH, so a config's `backend: fake_backend:FakeBackend`
resolves in the controller and in every xdist worker. This conftest registers `idle`, a
scene-free skill that takes control steps, and, with GAP_TEST_FAKE_MODULES set, appends to that file
which simulator modules each process of the session imported (none may be, on the fake backend).
GAP_TEST_FAKE_SETUP_S makes every item's setup take that long (inside its watchdog, as slow fixtures
or imports would); GAP_TEST_FAKE_SETUP_ERROR (comma-separated `task:seed` pairs) makes those trials'
setup raise, as a broken fixture would: the trial never runs and leaves no record.
"""

from __future__ import annotations

import json
import os
import sys
import time

from pydantic import BaseModel

from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import skill

SIMULATOR_MODULES = ("libero", "mujoco", "robosuite")


class Idled(BaseModel):
    steps: int


@skill(scene=False)
def idle(ctx: SkillContext, steps: int = 5) -> Idled:
    """Hold still for `steps` control steps (no scene needed: runs on every backend)."""
    for _ in range(steps):
        ctx.act([0.0] * 6 + [-1.0])
    return Idled(steps=steps)


def pytest_runtest_setup(item):
    time.sleep(float(os.environ.get("GAP_TEST_FAKE_SETUP_S") or 0))
    broken = os.environ.get("GAP_TEST_FAKE_SETUP_ERROR", "")
    trial = getattr(item, "trial", None)
    if trial is not None and f"{trial.task_id}:{trial.seed}" in broken.split(","):
        raise RuntimeError(f"broken fixture for task {trial.task_id} seed {trial.seed}")


def pytest_unconfigure(config):
    path = os.environ.get("GAP_TEST_FAKE_MODULES")
    if path:
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in SIMULATOR_MODULES)
        with open(path, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "simulator_modules": loaded}) + "\n")
