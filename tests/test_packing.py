"""The slot planner on made-up scenes: no simulator."""

from __future__ import annotations

import numpy as np

from pytest_gap.skills.geometry import Box
from pytest_gap.skills.packing import HeldItem, footprint_along, plan_slots

BASKET = Box(center=(0.0, 0.25, 0.07), half_extents=(0.08, 0.085, 0.07), yaw=0.0)
MILK = HeldItem(half_x=0.027, half_y=0.027, height=0.13, hang=0.1)
FLAT = HeldItem(half_x=0.04, half_y=0.022, height=0.018, hang=0.01)


def _block(x0, x1, y0, y1, top, step=0.004):
    """Points on the top of a box standing in the basket."""
    xs, ys = np.arange(x0, x1, step), np.arange(y0, y1, step)
    return np.array([[x, y, top] for x in xs for y in ys])


def _inside_walls(center, item):
    return np.all(np.abs(np.asarray(center) - BASKET.center[:2]) + item.half_x <= 0.075)


def test_an_empty_container_fills_from_a_corner_on_the_floor():
    best = plan_slots(BASKET, np.zeros((0, 3)), MILK, min_release=BASKET.top - 0.035)[0]
    assert best.center[1] < BASKET.center[1] - 0.02  # against the -y wall
    assert abs(best.center[0] - BASKET.center[0]) > 0.02  # and into a corner
    assert best.support < 0.02 and best.drop < 0.04
    assert _inside_walls(best.center, MILK)


def test_the_next_item_goes_beside_what_is_there_not_on_it():
    can = _block(0.005, 0.06, 0.18, 0.245, top=0.093)  # a can in the far, -y corner
    best = plan_slots(BASKET, can, MILK, min_release=BASKET.top - 0.035)[0]
    assert best.support < 0.02  # on the floor
    x, y = best.center
    clear_in_y = y - MILK.half_y >= 0.245
    clear_in_x = x + MILK.half_x <= 0.005
    assert clear_in_x or clear_in_y


def test_a_flat_item_may_lie_on_a_short_one_when_the_floor_is_full():
    full = _block(-0.06, 0.06, 0.19, 0.31, top=0.093)
    best = plan_slots(BASKET, full, FLAT, min_release=BASKET.top - 0.035)[0]
    assert best.support == np.max(full[:, 2])
    assert best.release_z >= BASKET.top - 0.035  # the hand stays above the rim


def test_footprint_along_turns_with_the_hand():
    box = Box(center=(0, 0, 0), half_extents=(0.04, 0.02, 0.01), yaw=0.0)
    assert np.allclose(footprint_along(box, 0.0), (0.04, 0.02))
    assert np.allclose(footprint_along(box, np.pi / 2), (0.02, 0.04))


def test_a_wider_margin_keeps_the_slot_further_from_a_neighbour():
    can = _block(0.005, 0.06, 0.18, 0.245, top=0.093)
    near = plan_slots(BASKET, can, MILK, min_release=BASKET.top - 0.035)[0]
    far = plan_slots(BASKET, can, MILK, min_release=BASKET.top - 0.035, margin=0.01)[0]

    def gap(slot):  # clearance between the milk's box and the can's, along x or y
        x, y = slot.center
        return max(0.005 - (x + MILK.half_x), (y - MILK.half_y) - 0.245)

    assert near.support < 0.02 and far.support < 0.02
    assert 0.003 <= gap(near) < 0.01 <= gap(far)
