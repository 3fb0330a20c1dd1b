"""Boxes from point clouds and angle helpers: no simulator."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.skills.geometry import (
    Box,
    beside,
    box_from_points,
    container_frame,
    fit_yaw,
    free_spot,
    plan_spot,
    rect_samples,
    support_height,
    wrap_angle,
    wrap_half_turn,
)


def _square_faces(half: float, yaw: float, height: float, n: int = 40) -> np.ndarray:
    """Points on the top and two side faces of an upright square carton turned by `yaw`, as
    two cameras would see it (one side is hidden)."""
    u = np.linspace(-half, half, n)
    top = np.array([[a, b, height] for a in u for b in u])
    zs = np.linspace(0.0, height, n)
    front = np.array([[a, -half, z] for a in u for z in zs])
    side = np.array([[half, b, z] for b in u for z in zs])
    pts = np.concatenate([top, front, side])
    c, s = np.cos(yaw), np.sin(yaw)
    xy = pts[:, :2] @ np.array([[c, s], [-s, c]])
    return np.column_stack([xy + np.array([0.1, -0.2]), pts[:, 2]])


def _disc_top(radius: float, height: float, n: int = 60) -> np.ndarray:
    r, t = np.meshgrid(np.linspace(0, radius, n), np.linspace(0, 2 * np.pi, n, endpoint=False))
    xy = np.column_stack([(r * np.cos(t)).ravel(), (r * np.sin(t)).ravel()])
    # A camera in front sees more of the near side: the cloud is longer along x.
    front = np.column_stack([np.linspace(-radius, radius, n), np.full(n, -radius)])
    pts = np.concatenate([xy, front])
    return np.column_stack([pts, np.full(len(pts), height)])


@pytest.mark.parametrize("yaw_deg", [0, 12, 30, 41])
def test_a_square_cartons_box_runs_along_its_sides(yaw_deg):
    """A grasp across a carton's box must close across its faces, not its corners."""
    box = box_from_points(_square_faces(0.0265, np.deg2rad(yaw_deg), 0.13))
    off = (np.rad2deg(box.yaw) - yaw_deg) % 90
    assert min(off, 90 - off) < 2.5
    assert max(box.half_extents[:2]) == pytest.approx(0.0265, abs=0.002)
    assert box.bottom == 0.0 and box.top == pytest.approx(0.13)


def test_a_round_cans_box_keeps_its_principal_axis():
    points = _disc_top(0.031, 0.076)
    xy = points[:, :2]
    cov = np.cov((xy - xy.mean(axis=0)).T)
    major = np.linalg.eigh(cov)[1][:, 1]
    pca = np.arctan2(major[1], major[0])
    assert wrap_half_turn(fit_yaw(xy) - pca) == pytest.approx(0.0, abs=1e-6)


def test_angles_wrap():
    assert wrap_angle(3 * np.pi / 2) == pytest.approx(-np.pi / 2)
    assert wrap_angle(-np.pi) == pytest.approx(-np.pi)
    assert wrap_half_turn(np.pi) == pytest.approx(0.0, abs=1e-12)
    assert wrap_half_turn(-np.pi / 2) == pytest.approx(np.pi / 2)


def _basket(yaw: float, base: float, half=(0.079, 0.0835), height=0.14, n=50) -> np.ndarray:
    """Points of an open rectangular container turned by `yaw`, standing on a surface at
    `base`, its longer side along its own y: the rim all round, the outer walls the cameras
    see (front and one side) from 1 cm up, and its floor inside. Centre (0.1, -0.2)."""
    hx, hy = half
    u, v = np.linspace(-hx, hx, n), np.linspace(-hy, hy, n)
    zs = np.linspace(0.01, height, n)
    rim = [[a, s * hy, height] for a in u for s in (-1, 1)]
    rim += [[s * hx, b, height] for b in v for s in (-1, 1)]
    walls = [[a, -hy, z] for a in u for z in zs] + [[hx, b, z] for b in v for z in zs]
    floor = [[a, b, 0.017] for a in u[5:-5:3] for b in v[5:-5:3]]
    pts = np.array(rim + walls + floor)
    c, s = np.cos(yaw), np.sin(yaw)
    xy = pts[:, :2] @ np.array([[c, s], [-s, c]])
    return np.column_stack([xy + np.array([0.1, -0.2]), pts[:, 2] + base])


def _surface(base: float, r: float = 0.2, n: int = 80) -> np.ndarray:
    """A flat surface at `base` around (0.1, -0.2), with a taller neighbour in one corner."""
    g = np.linspace(-r, r, n)
    pts = np.array([[0.1 + a, -0.2 + b, base] for a in g for b in g])
    pts[(pts[:, 0] > 0.2) & (pts[:, 1] > -0.12), 2] = base + 0.08
    return pts


@pytest.mark.parametrize("yaw_deg", [0, 30, 90, 135, -90, 200])
@pytest.mark.parametrize("base", [0.0, 0.9])
def test_a_containers_frame_follows_its_body_at_any_yaw(yaw_deg, base):
    """Frame y along the longer side, whatever the yaw: up to the half turn a symmetric
    container cannot show. (The old frame was the least-area yaw in [0, 90) degrees turned
    half round, whatever way the container stood.)"""
    yaw = np.deg2rad(yaw_deg)
    points = _basket(yaw, base)
    rim = points[points[:, 2] > points[:, 2].max() - 0.02]
    floor = support_height(points, _surface(base))
    frame = container_frame(points, rim[:, :2], floor=floor, turn=np.pi)
    assert wrap_half_turn(frame.yaw - yaw) == pytest.approx(0.0, abs=np.deg2rad(1.5))
    assert frame.half_extents[:2] == pytest.approx((0.079, 0.0835), abs=0.002)
    assert frame.center[:2] == pytest.approx((0.1, -0.2), abs=0.002)
    assert frame.bottom == pytest.approx(base) and frame.top == pytest.approx(base + 0.14)


def test_an_object_on_a_raised_surface_stands_on_it():
    """A carton on a table 0.9 m up: its box reaches down to the table, not to z = 0 and not
    to the lowest point the cameras saw on its sides."""
    points = _square_faces(0.0265, 0.3, 0.13)
    points = points[points[:, 2] > 0.015] + np.array([0.0, 0.0, 0.9])
    support = support_height(points, _surface(0.9))
    assert support == pytest.approx(0.9)
    box = box_from_points(points, floor=support)
    assert box.bottom == pytest.approx(0.9) and box.top == pytest.approx(1.03)


def test_no_surface_seen_around_means_no_support():
    """Held up with nothing near: the box starts where the points do."""
    points = _square_faces(0.0265, 0.0, 0.13) + np.array([0.0, 0.0, 0.2])
    assert support_height(points, np.zeros((0, 3))) is None
    assert box_from_points(points, floor=None).bottom == pytest.approx(0.2)


@pytest.mark.parametrize(
    "what", ["a container's wall fills most of the ring", "the floor shows past the table's edge"]
)
def test_the_support_is_the_surface_not_a_neighbour_nor_the_floor_below(what):
    """A carton on a table 0.9 m up, right by a tall basket wall (which covers most of what is
    seen around it) or at the table's edge (the floor 0.9 m below shows beyond it)."""
    points = _square_faces(0.0265, 0.0, 0.13) + np.array([0.0, 0.0, 0.9])
    around = _surface(0.9, r=0.08)
    if what.startswith("a container"):  # a wall face and rim 4-8 cm high, taking 3/4 round
        angle = np.arctan2(around[:, 1] + 0.2, around[:, 0] - 0.1)
        around[angle > -np.pi / 2, 2] = (
            0.9 + 0.04 + 0.04 * np.random.default_rng(0).random(int((angle > -np.pi / 2).sum()))
        )
    else:
        around[around[:, 0] > 0.16, 2] = 0.0
    assert support_height(points, around) == pytest.approx(0.9, abs=0.003)
    assert box_from_points(points, floor=support_height(points, around)).bottom == pytest.approx(
        0.9, abs=0.003
    )


def test_beside_leaves_the_gap_between_the_footprints_whatever_the_item_turn():
    plate = Box(center=(0.1, 0.0, 0.9), half_extents=(0.09, 0.09, 0.01), yaw=0.0)
    # a 6 x 2 cm item turned a quarter round: 6 cm across world y
    item = Box(center=(0.0, 0.3, 1.0), half_extents=(0.03, 0.01, 0.02), yaw=np.pi / 2)
    assert beside(plate, item, 1, 1.0, 0.01) == pytest.approx((0.1, 0.09 + 0.03 + 0.01))
    assert beside(plate, item, 0, -1.0, 0.0) == pytest.approx((0.1 - 0.09 - 0.01, 0.0))


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.linalg.norm(a[:, None, :] - b[None], axis=2)))


def test_a_free_spot_is_the_centre_when_clear_and_beside_what_stands_there():
    pot = rect_samples((0.045, 0.068), 0.0)  # a moka pot with the fingers either side
    spot, clear = free_spot((0.1, -0.2), (0.055, 0.055), np.zeros((0, 2)), pot)
    assert clear and np.allclose(spot, (0.1, -0.2))
    there = rect_samples((0.039, 0.068), 0.0, center=(0.055, -0.2))
    spot, clear = free_spot((0.1, -0.2), (0.055, 0.055), there, pot)
    assert clear and _distance(pot + spot, there) >= 0.01
    assert abs(spot[0] - 0.1) <= 0.055 and abs(spot[1] + 0.2) <= 0.055
    # Nowhere clear: the spot with the least in the way, said so.
    crowd = rect_samples((0.2, 0.2), 0.0, center=(0.1, -0.2))
    _, clear = free_spot((0.1, -0.2), (0.055, 0.055), crowd, pot)
    assert not clear


def test_a_free_spot_leaves_room_for_what_comes_after():
    """Two moka pots on one 0.15 m burner region: centred, the first leaves the second no
    room inside the reach; it goes to one side so that both fit."""
    pot = rect_samples((0.045, 0.068), 0.0)
    alone, _ = free_spot((0.0, 0.0), (0.055, 0.055), np.zeros((0, 2)), pot)
    spot, clear = free_spot((0.0, 0.0), (0.055, 0.055), np.zeros((0, 2)), pot, later=[[pot]])
    assert np.allclose(alone, 0.0) and clear
    second, clear = free_spot((0.0, 0.0), (0.055, 0.055), pot + spot, pot)
    assert clear and _distance(pot + spot, pot + second) >= 0.01
    assert np.all(np.abs(second) <= 0.055 + 1e-9)


# libero_pro 10_swap task 8: the stove's cook region on the far edge of the table, the robot's
# base 0.88 m from its centre; the arm pointing down reaches only its near edge.
FAR_REGION, FAR_REACH, BASE = (0.218, 0.064), (0.055, 0.055), (-0.66, 0.0)


def test_a_free_spot_toward_a_point_is_the_clear_one_nearest_it():
    pot = rect_samples((0.045, 0.04), 0.0)
    at_centre, _ = free_spot(FAR_REGION, FAR_REACH, np.zeros((0, 2)), pot)
    spot, clear = free_spot(FAR_REGION, FAR_REACH, np.zeros((0, 2)), pot, toward=BASE)
    assert clear and np.allclose(at_centre, FAR_REGION, atol=0.003)
    # The region's corner nearest the base, on the search grid (5 mm).
    assert spot == pytest.approx((0.218 - 0.055, 0.064 - 0.055), abs=0.005)
    # Something standing there: the next clear spot towards the base, not back to the centre.
    there = rect_samples((0.02, 0.02), 0.0, center=(0.165, 0.01))
    spot, clear = free_spot(FAR_REGION, FAR_REACH, there, pot, toward=BASE)
    assert clear and _distance(pot + spot, there) >= 0.01
    assert spot[0] < FAR_REGION[0] - 0.03


def test_toward_the_base_two_pots_stand_side_by_side_at_the_near_edge():
    """Long along the reach (handle towards the base), two 9 cm wide moka pots fit across the
    11 cm of room at the region's near edge; the first leaves the second that room."""
    pot = rect_samples((0.07, 0.045), 0.0)
    first, clear = free_spot(FAR_REGION, FAR_REACH, np.zeros((0, 2)), pot, [[pot]], toward=BASE)
    assert clear
    second, clear = free_spot(FAR_REGION, FAR_REACH, pot + first, pot, toward=BASE)
    assert clear and _distance(pot + first, pot + second) >= 0.01
    near_edge = FAR_REGION[0] - FAR_REACH[0]
    assert first[0] == pytest.approx(near_edge, abs=0.005)
    assert second[0] == pytest.approx(near_edge, abs=0.005)


def test_a_plans_cost_says_which_turn_leaves_room():
    """Turned across the reach, the second pot no longer fits beside the first: it goes
    further out, and the plan says so in its cost; nowhere clear costs infinity."""
    along = rect_samples((0.07, 0.045), 0.0)
    across = rect_samples((0.07, 0.045), np.pi / 2)
    empty = np.zeros((0, 2))
    _, clear, cost_along = plan_spot(FAR_REGION, FAR_REACH, empty, along, [[along]], 0.01, BASE)
    _, _, cost_across = plan_spot(FAR_REGION, FAR_REACH, empty, across, [[across]], 0.01, BASE)
    assert clear and np.isfinite(cost_along) and cost_along < cost_across - 0.02
    spot, clear, cost = plan_spot(FAR_REGION, FAR_REACH, empty, along, gap=0.01, toward=BASE)
    assert clear and cost == pytest.approx(float(np.linalg.norm(spot - np.asarray(BASE))))
    crowd = rect_samples((0.2, 0.2), 0.0, center=FAR_REGION)
    _, clear, cost = plan_spot(FAR_REGION, FAR_REACH, crowd, along)
    assert not clear and cost == np.inf
