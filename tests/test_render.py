"""Cameras: upright images, only what was asked for, depth + segmentation geometry, video."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.sim.variations import resolve
from pytest_gap.sim.video import read_frames

pytestmark = pytest.mark.images


@pytest.fixture(scope="module")
def camera_env():
    with make_env(
        "libero_object", 0, EnvOptions(cameras=("agentview", "wrist"), height=128, width=160)
    ) as env:
        yield env


def test_observation_has_exactly_the_requested_cameras_upright(camera_env):
    obs = camera_env.reset(0)
    assert sorted(obs.images) == ["agentview", "wrist"]
    for image in obs.images.values():
        assert image.shape == (128, 160, 3) and image.dtype == np.uint8
    frame = camera_env.scene.render("agentview", height=128, width=160)
    assert np.array_equal(frame.rgb, obs.images["agentview"])
    # Upright: the robot stands behind the table, in the upper half of the front view.
    robot_rows = np.nonzero(frame.mask("robot"))[0]
    assert robot_rows.size and robot_rows.mean() < 128 / 2


def test_state_only_env_renders_nothing(object_env):
    object_env.reset(0)
    assert object_env.scene._renderer is None
    assert object_env.observe().images == {}


def test_depth_and_segmentation_back_project_onto_the_objects(camera_env):
    camera_env.reset(1)
    frame = camera_env.scene.render("agentview", height=128, width=160)
    scene = camera_env.scene
    for name in ("alphabet_soup_1", "basket_1", "milk_1"):
        mask = frame.mask(name)
        assert mask.sum() > 20, f"{name} not visible"
        points = frame.points(mask)
        lo, hi = scene.world_aabb(name)
        inside = np.all((points >= lo - 0.01) & (points <= hi + 0.01), axis=1)
        assert inside.mean() > 0.95, name
        # The pinhole model maps the object's centre into its own mask (or right next to it).
        center = np.append((lo + hi) / 2, 1.0)
        cam = np.linalg.inv(frame.cam_to_world) @ center
        u, v = (frame.intrinsics @ (cam[:3] / cam[2]))[:2]
        rows, cols = np.nonzero(mask)
        assert np.min(np.hypot(cols - u, rows - v)) < 3, name


@pytest.mark.parametrize(
    ("family", "variation"),
    [
        ("posvar", "pos_var"),
        ("posvar", "permutation"),
        ("posvar", "basket_swap"),
        ("posvar", "all"),
        ("grocery_packing", "permutation"),
    ],
)
def test_targets_are_never_hidden_from_the_front_camera(camera_env, family, variation):
    for seed in range(4):
        camera_env.reset(seed, variation=resolve(family, variation))
        frame = camera_env.scene.render("agentview", height=128, width=160, depth=False)
        for target in camera_env.episode.perturbation.details["targets"]:
            assert frame.mask(target).sum() >= 15, f"seed {seed}: {target} hidden"


def test_video_holds_exactly_one_episode(tmp_path):
    with make_env(
        "libero_object", 0, EnvOptions(cameras=("agentview",), height=64, width=64)
    ) as env:
        first = env.reset(0, video=tmp_path / "a.mp4")
        for _ in range(4):
            env.step([0, 0, 1, 0, 0, 0, -1])
        second = env.reset(
            7, variation=resolve("posvar", "pos_var"), video=tmp_path / "b.mp4", video_wrist=True
        )
        for _ in range(2):
            last = env.step([0, 0, -1, 0, 0, 0, 1])
        assert env.finish_video() == 3
    a, b = read_frames(tmp_path / "a.mp4"), read_frames(tmp_path / "b.mp4")
    assert len(a) == 5 and len(b) == 3  # the settled scene, then one frame per step
    assert a.shape[1:] == (64, 64, 3) and b.shape[1:] == (64, 128, 3)  # front | wrist

    def err(x, y):
        return np.abs(x.astype(float) - y.astype(float)).mean()

    assert err(a[0], first.images["agentview"]) < 6
    assert err(b[0][:, :64], second.images["agentview"]) < 6
    assert err(b[-1][:, :64], last.obs.images["agentview"]) < 6
    # Episode b starts from its own scene, not from where episode a ended.
    assert err(b[0][:, :64], a[-1]) > 2 * err(b[0][:, :64], second.images["agentview"])
