"""Shared fixtures. Envs are real LIBERO and expensive (seconds each): one per module."""

from __future__ import annotations

import pytest

from pytest_gap.sim.libero import make_env


@pytest.fixture(scope="module")
def object_env():
    """libero_object task 0 (alphabet soup -> basket), no cameras."""
    with make_env("libero_object", 0) as env:
        yield env
