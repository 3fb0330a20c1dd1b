"""Where the next item goes in a container: slots planned from what is already inside.

Pure geometry, no simulator: the skills pass in the container's box, the points seen inside
it and the held item's footprint in the hand's frame.

A slot is a centre for the item on a 1 cm grid over the container's inside, with the hand
turned square to the walls (yaw along either side). The item's body must stand inside the
walls, and the hand lets go no lower than keeps the fingers above whatever is under them
(neighbours, or the wall when they reach over it) and the hand's wide body above the rim and
the tall neighbours; a slot where that means dropping the item too far is not used. Slots
rank by the lowest support under the item, then fill the container row by row from one
wall, so what is placed packs against the walls and the rest stays one free strip; among
slots as good, those that leave floor for the standing items still to come go first (judged
with no clearance, in any order, so a snug packing of the whole list is found when one
exists), even a slot a little closer to a neighbour than `MARGIN`. One item into an empty
container goes to the middle.
"""

from __future__ import annotations

import itertools

import numpy as np
from pydantic import BaseModel

from pytest_gap.skills import floorplan

# The container's walls and floor: measured on LIBERO's basket (see `calibration`).
from pytest_gap.skills.calibration import FLOOR, REACH, RIM_DIP, WALL, WALL_SLANT
from pytest_gap.skills.geometry import Box, wrap_half_turn

# WALL, WALL_SLANT, RIM_DIP, REACH, FLOOR: the container's walls and floor, measured on
# LIBERO's basket (`calibration`).
GRID = 0.01
MARGIN = 0.003  # clearance kept between the item and what is already there
# The least clearance worth trying: four grocery items fill LIBERO's basket to within a few
# mm (a 6.1 cm can beside a 5.3 cm carton across 11.4 cm), so the room left for the items
# still to come is judged first with none, and an item with no room at MARGIN tries the
# floor at this one before it goes on top of a neighbour, over the rim.
TIGHT = 0.001
ORDERS_UP_TO = 3  # the items to come are tried in every order up to this many (`_leave_room`)
FINGER_DEPTH = 0.017  # fingers stand this far out beyond the held item along the closing axis
FINGER_HALF_WIDTH = 0.012  # and this far either side along the hand's x axis
FINGER_BELOW_SITE = 0.012  # fingertips reach this far below the grip site
HAND_HALF = (0.035, 0.105)  # the hand's body around the grip site: along x, along closing
HAND_ABOVE_SITE = 0.045  # the hand's body starts this far above the grip site
CLEAR = 0.005
DROP = 0.015  # release the item this far above its support
FLAT, SHORT = 0.04, 0.09  # heights: flat things lie, short ones stand low, tall ones tip
# A standing thing dropped further may tip; a can dropped 6-7 cm rolls across the floor. The
# hand stays above the rim, so a can falls 4 cm or more.
MAX_DROP = {"flat": 0.11, "short": 0.06, "tall": 0.04}
# Packing order: tall things are lowered to the floor and stay where they are put; cans fall
# some way and roll, so they go in once walls and neighbours hem them in; flat things last.
KIND_ORDER = ("tall", "short", "flat")


class HeldItem(BaseModel):
    """The held object as placing needs it: footprint along the hand's axes, height, and how
    far below the grip site its bottom hangs."""

    half_x: float  # along the hand's x axis
    half_y: float  # along the closing axis
    height: float
    hang: float


class Slot(BaseModel):
    center: tuple[float, float]  # where the item's centre goes, world xy
    yaw: float  # hand yaw there
    support: float  # top of what is under the item there (the container floor if nothing)
    release_z: float  # grip-site height to let go at
    drop: float  # how far the item falls when let go


class _Scene:
    """What is inside the container, in its frame, and the heights of obstacles over areas."""

    def __init__(self, container: Box, occupied: np.ndarray):
        c, s = np.cos(container.yaw), np.sin(container.yaw)
        d = (
            occupied[:, :2] - np.asarray(container.center[:2])
            if len(occupied)
            else np.zeros((0, 2))
        )
        self.local = np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=1)
        self.z = occupied[:, 2] if len(occupied) else np.zeros(0)
        self.inner = np.asarray(container.half_extents[:2]) - WALL
        self.rim = container.top
        self.floor = container.bottom + FLOOR

    def top(self, center, half, walls: bool = False) -> float:
        """Highest thing over a rectangle (container frame): points, and the rim if `walls`
        and the rectangle reaches over the walls; -inf if nothing."""
        center, half = np.asarray(center), np.asarray(half)
        inside = np.all(np.abs(self.local - center) <= half, axis=1)
        top = float(self.z[inside].max()) if inside.any() else -np.inf
        if walls and np.any(np.abs(center) + half > self.inner + WALL_SLANT):
            top = max(top, self.rim - RIM_DIP)
        return top


def kind_of(height: float) -> str:
    """flat (lies), short (stands low: cans) or tall (cartons, bottles)."""
    return "flat" if height < FLAT else "short" if height < SHORT else "tall"


def plan_slots(
    container: Box,
    occupied: np.ndarray,
    item: HeldItem,
    min_release: float,
    margin: float = MARGIN,
    then: list[tuple[float, float]] | None = None,
) -> list[Slot]:
    """Slots for `item`, best first: those that need no long drop, then the rest.

    `occupied`: points (N, 3) seen inside the container, walls and floor excluded.
    `min_release`: the lowest grip-site height at which the hand itself stays above the rim.
    `margin`: the clearance to keep from what is there (and, beyond `MARGIN`, from the walls).
    `then`: footprints (half sizes) of the standing items to be packed after this one: among
    the slots as good as the best, those that leave floor for more of them come first.
    None: no items come after this one (one pick and place), so an empty container's middle.
    """
    scene = _Scene(container, occupied)
    ranked = _ranked(scene, container, item, min_release, margin)
    snug = _ranked(scene, container, item, min_release, TIGHT) if margin > TIGHT else []
    if ranked and snug and ranked[0][0][:2] != (False, False) and snug[0][0][:3] < ranked[0][0][:3]:
        # No slot inside the rim at this clearance: one on the floor with less beats one
        # perched on a neighbour, where the item sticks out and falls off.
        ranked, snug = snug, []
    if then and ranked:
        ranked = _leave_room(scene, ranked, snug, then, margin)
    elif then is None and not len(occupied):
        # One item into an empty container (pick and place): there is nothing to pack
        # against and nothing to leave room for, so the middle, clear of every wall. In the
        # corner the rows would start from, a turned basket's rim caught a bottle's bottom
        # three times running (posvar/all task 3 seed 61) until the episode's steps ran out.
        ranked.sort(key=lambda r: (r[0][:3], round(float(np.hypot(*r[2])), 3)))
    return [slot for _, slot, _, _ in ranked]


def _ranked(scene: _Scene, container: Box, item: HeldItem, min_release: float, margin: float):
    """Every grid slot as (rank key, slot, centre in the container's frame, half body), best
    first."""
    # A margin wider than the usual one is asked for after lowering was blocked. In an empty
    # container there is nothing else for it to keep off: keep the walls further off by as
    # much, or the slot tried again is the one that was blocked.
    off_walls = max(0.0, margin - MARGIN) if not len(scene.z) else 0.0
    ranked = []
    for turn in (0.0, np.pi / 2):
        body = _turned((item.half_x, item.half_y), turn)
        limit = np.minimum(scene.inner - body - off_walls, REACH)
        if np.any(limit < 0):
            continue  # the item does not fit this way round
        for u in _steps(limit[0]):
            for v in _steps(limit[1]):
                key, slot = _candidate(scene, container, item, turn, (u, v), min_release, margin)
                ranked.append((key, slot, (u, v), body))
    ranked.sort(key=lambda r: r[0])
    return ranked


def _leave_room(
    scene: _Scene, ranked: list, snug: list, then: list[tuple[float, float]], margin: float
):
    """Re-rank the slots of the best tier (above the rim or not, long drop or not, support)
    by how many of the items to come still find floor after this one (`floorplan`): first
    with no clearance (can they fit at all), then at `margin` (with room to spare).

    `snug`: the slots planned at `TIGHT` clearance; those of the same tier compete too, and
    win where they leave floor for more of the items to come: an item set a few mm closer to
    its neighbour beats a later one left with no floor but a neighbour's top.

    The items to come are tried in more than one order (all of them, for up to
    `ORDERS_UP_TO`; else as given and the largest first): which one goes next is not yet
    known here, and a first-fit in the wrong order misses a packing that exists."""
    tier = ranked[0][0][:3]
    best = [r for r in ranked if r[0][:3] == tier]
    pool = [(r, 0) for r in best] + [(r, 1) for r in snug if r[0][:3] == tier]
    grid = floorplan.FloorGrid(scene.inner, scene.local, scene.z, scene.floor)
    orders = _orders(then)
    scored, rooms = [], {}
    for (key, slot, uv, body), tight in pool:
        at = (*np.round(uv, 4), *np.round(body, 4))  # the snug slots repeat the roomy ones
        if at not in rooms:
            trial = grid.copy()
            trial.take(uv, body)
            rooms[at] = [-_most_that_fit(trial, orders, clear) for clear in (0.0, margin)]
        room = rooms[at]
        scored.append(((tier, room[0], tight, room[1], *key[3:]), slot, uv, body))
    scored.sort(key=lambda r: r[0])
    return scored + ranked[len(best) :]


def _most_that_fit(grid: floorplan.FloorGrid, orders: list, clearance: float) -> int:
    """The most of the items to come that find floor, over the orders tried."""
    most = 0
    for order in orders:
        most = max(most, floorplan.fits(grid.copy(), order, clearance))
        if most == len(order):
            break  # all of them: no order does better
    return most


def _orders(then: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The orders to try the items to come in (see `_leave_room`)."""
    if len(then) <= ORDERS_UP_TO:
        return [list(p) for p in itertools.permutations(then)]
    return [list(then), sorted(then, key=lambda h: -h[0] * h[1])]


def _turned(pair, turn: float) -> np.ndarray:
    """A (hand x, closing axis) pair in the container's frame: hand x along the container's
    x axis at turn 0, along its y axis at turn pi/2."""
    return np.array(pair if turn == 0 else pair[::-1], float)


def _candidate(scene: _Scene, container: Box, item: HeldItem, turn: float, uv, min_release, margin):
    """(rank key, slot) for the item centred at `uv` (container frame) with the hand turned."""
    center = np.asarray(uv, float)
    body = _turned((item.half_x, item.half_y), turn)
    closing = _turned((0.0, 1.0), turn)
    finger = _turned((FINGER_HALF_WIDTH, FINGER_DEPTH / 2), turn)
    support = max(scene.top(center, body + margin), scene.floor)
    kind = kind_of(item.height)
    offset = (item.half_y + FINGER_DEPTH / 2) * closing
    fingers = max(scene.top(center + k * offset, finger, walls=True) for k in (-1, 1))
    release = max(
        support + DROP + item.hang,
        min_release,
        fingers + FINGER_BELOW_SITE + CLEAR,
        scene.top(center, _turned(HAND_HALF, turn)) - HAND_ABOVE_SITE + CLEAR,
    )
    drop = release - item.hang - support
    # Within the goal's height (a tall thing on a can is not "in") and a short drop first,
    # then the lowest; then row by row along the container's x axis from its -y wall: its y
    # side is the longer, so a can and a carton fit in a row across it.
    above = support + item.height / 2 > scene.rim - 0.012
    key = (above, drop > MAX_DROP[kind], round(support - scene.floor, 2), round(uv[1], 2), -uv[0])
    slot = Slot(
        center=tuple(_world(container, center)),
        yaw=wrap_half_turn(container.yaw + turn),
        support=support,
        release_z=release,
        drop=drop,
    )
    return key, slot


def _steps(limit: float) -> list[float]:
    """Grid offsets from -limit to limit, always including both ends and the middle."""
    n = int(np.floor(limit / GRID))
    inner = [k * GRID for k in range(-n, n + 1)]
    return sorted({-limit, *inner, limit})


def _world(container: Box, local) -> np.ndarray:
    c, s = np.cos(container.yaw), np.sin(container.yaw)
    u, v = local
    return np.asarray(container.center[:2]) + np.array([c * u - s * v, s * u + c * v])


def footprint_along(box: Box, yaw: float) -> tuple[float, float]:
    """A box's half extents along a hand's x axis at `yaw` and along its closing axis."""
    hx, hy, _ = box.half_extents
    d = yaw - box.yaw
    c, s = abs(np.cos(d)), abs(np.sin(d))
    return float(c * hx + s * hy), float(s * hx + c * hy)
