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
    then = [(MILK.half_x, MILK.half_y)]  # another carton comes after this one
    best = plan_slots(BASKET, np.zeros((0, 3)), MILK, BASKET.top - 0.035, then=then)[0]
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


def _standing(center, item, turned, top, step=0.004):
    """Points on the top of `item` stood at `center` (world), turned with the hand or not."""
    hx, hy = (item.half_y, item.half_x) if turned else (item.half_x, item.half_y)
    xs = np.linspace(center[0] - hx, center[0] + hx, int(2 * hx / step) + 2)
    ys = np.linspace(center[1] - hy, center[1] + hy, int(2 * hy / step) + 2)
    return np.array([[x, y, top] for x in xs for y in ys])


def _pack(items):
    """Place the items one by one at the planner's best slot, each standing where it was put;
    return the support each one got."""
    inside, supports = np.zeros((0, 3)), []
    for k, item in enumerate(items):
        then = [(i.half_x, i.half_y) for i in items[k + 1 :]]
        best = plan_slots(BASKET, inside, item, min_release=BASKET.top - 0.035, then=then)[0]
        turned = abs(np.sin(best.yaw - BASKET.yaw)) > 0.5
        top = best.support + item.height
        inside = np.concatenate([inside, _standing(best.center, item, turned, top)])
        supports.append(best.support)
    return supports


# A milk carton, two bottles and a can: LIBERO's grocery items, which fill its basket to
# within a few mm (the can and the carton side by side leave 1 mm across the basket).
CARTON = HeldItem(half_x=0.0267, half_y=0.0267, height=0.14, hang=0.1)
KETCHUP = HeldItem(half_x=0.0244, half_y=0.0178, height=0.146, hang=0.11)
DRESSING = HeldItem(half_x=0.0259, half_y=0.0185, height=0.147, hang=0.11)
CAN = HeldItem(half_x=0.0305, half_y=0.0305, height=0.08, hang=0.05)
FLOOR_TOP = BASKET.bottom + 0.017


def test_four_standing_items_all_find_floor_when_a_snug_packing_exists():
    # Each is placed leaving room for the rest, tried in any order, at no clearance first:
    # the can that comes last stands on the floor, not on a carton over the rim.
    for items in ([CARTON, DRESSING, KETCHUP, CAN], [CARTON, KETCHUP, DRESSING, CAN]):
        assert np.allclose(_pack(items), FLOOR_TOP), items


def test_the_last_item_takes_a_snug_floor_slot_rather_than_a_neighbours_top():
    # A row of cartons leaves a 6.35 cm strip along the far wall: the 6.1 cm can fits with
    # 1 mm to spare each side, not with the usual 3 mm.
    inner_y = BASKET.half_extents[1] - 0.024
    edge = BASKET.center[1] + inner_y - 0.0635
    xs, ys = np.linspace(-0.056, 0.056, 29), np.linspace(BASKET.center[1] - inner_y, edge, 15)
    row = np.array([[x, y, 0.157] for x in xs for y in ys])
    best = plan_slots(BASKET, row, CAN, min_release=BASKET.top - 0.035)[0]
    assert best.support == FLOOR_TOP
    assert best.center[1] - CAN.half_y >= edge


def test_one_item_into_an_empty_container_goes_to_the_middle():
    # Nothing to pack against or leave room for: clear of every wall, not in a corner.
    best = plan_slots(BASKET, np.zeros((0, 3)), MILK, min_release=BASKET.top - 0.035)[0]
    assert np.allclose(best.center, BASKET.center[:2], atol=0.006)
    assert best.support == FLOOR_TOP


def test_a_carton_with_flat_items_to_come_still_goes_to_a_corner():
    # Flat things to come are not in `then` (they may lie on others), but they need floor:
    # a carton in the middle of the basket leaves them only its top, over the rim.
    best = plan_slots(BASKET, np.zeros((0, 3)), MILK, min_release=BASKET.top - 0.035, then=[])[0]
    assert best.center[1] < BASKET.center[1] - 0.02


def test_a_wider_margin_moves_a_blocked_slot_off_the_walls_of_an_empty_container():
    # Lowering was blocked (on the rim); planned again with a wider margin, the slot moves.
    turned = BASKET.model_copy(update={"yaw": -0.65})
    then = [(MILK.half_x, MILK.half_y)]
    first = plan_slots(turned, np.zeros((0, 3)), MILK, turned.top - 0.035, then=then)[0]
    again = plan_slots(turned, np.zeros((0, 3)), MILK, turned.top - 0.035, 0.01, then=then)[0]
    assert np.hypot(*np.subtract(again.center, first.center)) >= 0.006
