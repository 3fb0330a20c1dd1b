"""Cameras: upright images, only what was asked for, depth + segmentation geometry, video."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.errors import SimInputError
from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.sim.libero_backend import resolve
from pytest_gap.sim.scene import SceneView
from pytest_gap.sim.video import VideoWriter, read_frames
from tests.helpers import MOVING_VARIATIONS

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


def test_images_are_what_libero_itself_renders_turned_upright():
    """Same state, LIBERO's own OffScreenRenderEnv: same pixels once its image is flipped."""
    options = EnvOptions(cameras=("agentview", "wrist"), height=96, width=96, multisample=True)
    with make_env("libero_object", 2, options) as env:
        # Imported only now: pytest-gap picks the GL backend before anything imports mujoco.
        from libero.libero.envs import OffScreenRenderEnv

        ours = env.reset(3)
        theirs = OffScreenRenderEnv(
            bddl_file_name=str(env.task.bddl_file), camera_heights=96, camera_widths=96
        )
        try:
            theirs.reset()
            obs = theirs.set_init_state(env.raw.sim.get_state().flatten())
        finally:
            theirs.close()
    for name, key in (("agentview", "agentview_image"), ("wrist", "robot0_eye_in_hand_image")):
        diff = np.abs(ours.images[name].astype(int) - obs[key][::-1].astype(int))
        assert diff.mean() < 1.0, name  # LIBERO's images are stored upside down


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


def test_floor_pixels_back_project_onto_the_floor(camera_env):
    camera_env.reset(0)
    frame = camera_env.scene.render("agentview", height=128, width=160)
    floor = frame.points(frame.segmentation == 0)
    floor = floor[np.abs(floor[:, 2]) < 0.05]  # drop the far wall and the sky
    assert len(floor) > 1000
    assert np.abs(np.median(floor[:, 2])) < 0.001
    with pytest.raises(SimInputError, match="alphabet_soup_1"):
        frame.mask("alphabet_soup")  # the scene name carries its instance suffix


def test_an_env_closed_beside_this_one_leaves_its_renders_intact(camera_env):
    """Issue 48: a pooled env's renders broke for good once the pool evicted another env while
    this one's GL context was current (mujoco.Renderer.close frees its GL objects in the current
    context): every later segmentation render raised IndexError inside mujoco's
    Renderer.render, RGB lost its textures. The other env's renderers are a second SceneView of
    the same scene here, closed as EnvPool.get closes an evicted env."""
    camera_env.reset(0)
    own = camera_env.scene
    before = own.render("agentview", height=128, width=160)
    other = SceneView(camera_env.raw)
    other.render("agentview", height=32, width=32, depth=False)
    own.render("agentview", height=128, width=160)  # rendered last: its context is current
    other.close()
    after = own.render("agentview", height=128, width=160)
    assert np.array_equal(after.segmentation, before.segmentation)
    assert np.array_equal(after.rgb, before.rgb) and np.array_equal(after.depth, before.depth)


def test_odd_sized_frames_are_padded_not_lost(tmp_path):
    writer = VideoWriter(tmp_path / "odd.mp4")
    for value in (10, 120, 240):
        writer.append(np.full((63, 65, 3), value, np.uint8))
    assert writer.close() == 3
    frames = read_frames(tmp_path / "odd.mp4")
    assert frames.shape == (3, 64, 66, 3)
    assert [int(np.median(f)) for f in frames] == pytest.approx([10, 120, 240], abs=3)


@pytest.mark.parametrize(("family", "variation"), MOVING_VARIATIONS)
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
