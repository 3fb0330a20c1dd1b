"""The floor grid and first-fit trial placement behind `plan_slots(then=...)`: no simulator."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.skills import floorplan
from pytest_gap.skills.geometry import Box
from pytest_gap.skills.packing import HeldItem, plan_slots

NONE = np.zeros((0, 2)), np.zeros(0)


def test_first_fit_fills_rows_from_the_minus_y_side_and_runs_out():
    grid = floorplan.FloorGrid(np.array([0.05, 0.05]), *NONE, floor=0.0)
    trial = grid.copy()
    assert floorplan.fits(trial, [(0.024, 0.024)] * 5, margin=0.0) == 4
    assert not grid.taken.any()  # trials on a copy leave the grid as it was
    first = grid.first_fit((0.024, 0.024))
    assert first is not None and first[1] < 0 and first[0] > 0  # -y row, +x end
    assert floorplan.fits(grid, [(0.024, 0.024)] * 4, margin=0.0) == 3  # 2 x 2 in 10 x 10 cm
    assert grid.first_fit((0.01, 0.01)) is None


def test_what_is_seen_inside_takes_its_cells():
    xy = np.array(
        [[x, y] for x in np.linspace(-0.05, 0.0, 20) for y in np.linspace(-0.05, 0.05, 40)]
    )
    grid = floorplan.FloorGrid(np.array([0.05, 0.05]), xy, np.full(len(xy), 0.1), floor=0.0)
    spot = grid.first_fit((0.02, 0.045))
    assert spot is not None and spot[0] > 0.0
    low = floorplan.FloorGrid(np.array([0.05, 0.05]), xy, np.full(len(xy), 0.0), floor=0.0)
    assert low.first_fit((0.045, 0.045)) is not None  # points on the floor take nothing


def test_the_slot_leaves_room_for_what_comes_next():
    """A box set along the floor's first row would leave too narrow a strip for the square
    to come; among slots as good, the planner turns it against a side wall instead."""
    box = Box(center=(0.0, 0.0, 0.07), half_extents=(0.104, 0.074, 0.07), yaw=0.0)
    inner = np.array([0.08, 0.05])  # 16 x 10 cm inside the walls
    bar = HeldItem(half_x=0.045, half_y=0.015, height=0.12, hang=0.1)
    square = (0.0375, 0.0375)
    none = np.zeros((0, 3))

    def room_after(slot):
        grid = floorplan.FloorGrid(inner, *NONE, floor=0.0)
        along_y = abs(np.sin(slot.yaw)) > 0.5
        grid.take(slot.center, (0.015, 0.045) if along_y else (0.045, 0.015))
        return floorplan.fits(grid, [square], margin=0.003)

    greedy = plan_slots(box, none, bar, min_release=0.1)[0]
    kept = plan_slots(box, none, bar, min_release=0.1, then=[square])[0]
    assert room_after(greedy) == 0  # the case this is about
    assert room_after(kept) == 1
    assert kept.support == greedy.support and kept.drop == pytest.approx(greedy.drop)
