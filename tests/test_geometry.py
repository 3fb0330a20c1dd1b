"""Boxes from point clouds and angle helpers: no simulator."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.skills.geometry import box_from_points, fit_yaw, wrap_angle, wrap_half_turn


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
