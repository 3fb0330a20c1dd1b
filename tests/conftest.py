"""Shared fixtures. Envs are real LIBERO and expensive (seconds each): one per module."""

from __future__ import annotations

import pytest

from pytest_gap.sim.gl import ensure_gl_backend
from pytest_gap.sim.libero import make_env

# Before any test imports LIBERO, robosuite or mujoco directly (reference clients, BDDL parsers):
# mujoco picks its GL backend at import, and unset it picks GLFW, which needs a display.
ensure_gl_backend()

# pytester's in-process sessions drop every module they imported when they end; a session that
# draws plots/ would import matplotlib anew each time while modules imported earlier keep the
# old classes ("Single argument to subplot must be a three-digit integer"). Imported here once,
# it outlives every inner session.
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402


@pytest.fixture(scope="module")
def object_env():
    """libero_object task 0 (alphabet soup -> basket), no cameras."""
    with make_env("libero_object", 0) as env:
        yield env
