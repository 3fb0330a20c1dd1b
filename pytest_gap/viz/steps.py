"""A trial's per-step evidence (steps.parquet, sim/step_log.py) as the report draws it: the
actions and the gripper over time, where the hand held what, where it let go, and where each
policy reply (chunk) began. Pure functions from the file to a pydantic model."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from pytest_gap.sim.step_log import read_steps

log = logging.getLogger(__name__)

MAX_STEPS_BYTES = 64 * 2**20  # a steps file is tens of kB; a bigger one is not drawn
CLOSED = 0.0  # a gripper command above this closes


class Hold(BaseModel):
    """The hand held `object` from step `first` to step `last` (both included)."""

    first: int
    last: int
    object: str
    # how the hold ended: `release` (the gripper commanded open), `drop` (lost while closed),
    # or `end` (still held when the episode ended)
    ended: str


class StepsView(BaseModel):
    steps: list[int]
    xyz: list[list[float]]  # the action's three position deltas, one list each
    command: list[float]  # the action's gripper entry (-1 open, +1 close)
    gripper: list[float]  # the gripper command as executed
    target_dist: list[float | None]  # metres from the hand to the goal's objects
    chunks: list[int]  # the steps at which a policy reply's actions began
    holds: list[Hold]


def _rounded(values) -> list[float]:
    return [round(float(v), 4) for v in values]


def holds_of(steps: list[int], grasped: list, command: np.ndarray) -> list[Hold]:
    """The stretches in which one object was held, and how each ended."""
    holds: list[Hold] = []
    start = None
    for i, held in enumerate(grasped):
        if start is not None and held != grasped[start]:
            ended = "release" if command[i] <= CLOSED else "drop"
            holds.append(
                Hold(first=steps[start], last=steps[i - 1], object=grasped[start], ended=ended)
            )
            start = None
        if start is None and held is not None:
            start = i
    if start is not None:
        holds.append(Hold(first=steps[start], last=steps[-1], object=grasped[start], ended="end"))
    return holds


def steps_view(path: Path) -> StepsView | None:
    """The view of the steps file at `path`; None (logged) for one that cannot be read."""
    try:
        if path.stat().st_size > MAX_STEPS_BYTES:
            log.warning("gap viz: %s is over %d MiB; not drawn", path, MAX_STEPS_BYTES >> 20)
            return None
        columns = read_steps(path)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("gap viz: %s: not a steps file it can draw (%s)", path, exc)
        return None
    steps = [int(s) for s in columns["step"]]
    if not steps:
        return None
    action, reply = columns["action"], columns["reply"]
    began = [i for i in range(len(steps)) if reply[i] >= 0 and (i == 0 or reply[i] != reply[i - 1])]
    dist = columns["target_dist"]
    return StepsView(
        steps=steps,
        xyz=[_rounded(action[:, k]) for k in range(3)],
        command=_rounded(action[:, 6]),
        gripper=_rounded(columns["gripper"]),
        target_dist=[None if np.isnan(d) else round(float(d), 4) for d in dist],
        chunks=[steps[i] for i in began],
        holds=holds_of(steps, list(columns["grasped"]), action[:, 6]),
    )
