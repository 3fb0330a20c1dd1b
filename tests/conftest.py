"""Shared fixtures. Envs are real LIBERO and expensive (seconds each): one per module."""

from __future__ import annotations

import pytest

from pytest_gap.sim.gl import ensure_gl_backend
from pytest_gap.sim.libero import make_env

# Before any test imports LIBERO, robosuite or mujoco directly (reference clients, BDDL parsers):
# mujoco picks its GL backend at import, and unset it picks GLFW, which needs a display.
ensure_gl_backend()


@pytest.fixture(scope="module")
def object_env():
    """libero_object task 0 (alphabet soup -> basket), no cameras."""
    with make_env("libero_object", 0) as env:
        yield env
