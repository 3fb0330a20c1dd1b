"""Camera rendering on a live MuJoCo model: RGB, metric depth, object segmentation.

Images are upright HWC (row 0 is the top of the picture), as a person or a policy sees them.
Camera geometry uses the OpenCV convention (x right, y down, z forward): `intrinsics` is the
3x3 pinhole matrix and `cam_to_world` the 4x4 pose, so a pixel (u, v) with depth d back-projects
to cam_to_world @ [d (u - cx) / fx, d (v - cy) / fy, d, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pytest_gap.errors import RenderBackendError, SimInputError
from pytest_gap.sim.gl import make_renderer, render_backend_error, render_unavailable_reason

# What robosuite's offscreen renderer uses (MJCF's default vis.quality.offsamples).
MSAA_SAMPLES = 4
# User-facing camera names -> MuJoCo camera names in LIBERO scenes.
CAMERA_ALIASES = {"agentview": "agentview", "front": "agentview", "wrist": "robot0_eye_in_hand"}


@dataclass
class CameraFrame:
    camera: str
    rgb: np.ndarray | None
    depth: np.ndarray | None = None  # metres along the optical axis, float32 HxW
    segmentation: np.ndarray | None = None  # int32 HxW, index into labels; 0 = nothing named
    labels: dict[int, str] = field(default_factory=dict)
    intrinsics: np.ndarray = field(default_factory=lambda: np.eye(3))
    cam_to_world: np.ndarray = field(default_factory=lambda: np.eye(4))

    def mask(self, name: str) -> np.ndarray:
        """Pixels showing the named object (all False if it is in the scene but not visible)."""
        if self.segmentation is None:
            raise SimInputError("this frame was rendered without segmentation")
        ids = [i for i, label in self.labels.items() if label == name]
        if not ids:
            raise SimInputError(
                f"no object {name!r} in this frame's labels: {sorted(self.labels.values())}"
            )
        return np.isin(self.segmentation, ids)

    def points(self, mask: np.ndarray | None = None) -> np.ndarray:
        """World-frame 3-D points (N, 3) of the depth pixels under `mask` (all if None)."""
        if self.depth is None:
            raise SimInputError("this frame was rendered without depth")
        v, u = np.nonzero(mask if mask is not None else np.ones_like(self.depth, dtype=bool))
        d = self.depth[v, u].astype(np.float64)
        fx, fy = self.intrinsics[0, 0], self.intrinsics[1, 1]
        cx, cy = self.intrinsics[0, 2], self.intrinsics[1, 2]
        cam = np.stack([d * (u - cx) / fx, d * (v - cy) / fy, d, np.ones_like(d)])
        return (self.cam_to_world @ cam)[:3].T


def resolve_camera(model, name: str) -> str:
    mj_name = CAMERA_ALIASES.get(name, name)
    names = [model.camera(i).name for i in range(model.ncam)]
    if mj_name not in names:
        raise SimInputError(
            f"unknown camera {name!r}: use one of {sorted(set(CAMERA_ALIASES) | set(names))}"
        )
    return mj_name


class SceneRenderer:
    """Renders cameras of one MuJoCo model/data pair; one GL renderer per image size.

    `rgb` and `frame` take resolved MuJoCo camera names (see `resolve_camera`). With
    `egl_device` (under MUJOCO_GL=egl) the GL contexts are made on that EGL device."""

    def __init__(
        self,
        model,
        data,
        geom_labels: np.ndarray,
        labels: dict[int, str],
        egl_device: int | None = None,
    ):
        import mujoco

        self.egl_device = egl_device
        self._model = model
        self._data = data
        self._geom_labels = geom_labels  # geom id -> label index
        self._labels = labels
        self._renderers: dict[tuple[int, int, bool], object] = {}
        # As robosuite renders LIBERO: visual meshes (group 1) only, never the collision
        # geometry of group 0, which policies trained on LIBERO images have never seen.
        self._option = mujoco.MjvOption()
        self._option.geomgroup[0] = 0
        self._option.geomgroup[1] = 1

    def _renderer(self, height: int, width: int, multisample: bool | None = None):
        """One GL renderer per (size, MSAA); `multisample` None follows the model's setting."""
        quality = self._model.vis.quality
        if multisample is None:
            multisample = quality.offsamples > 0
        key = (height, width, multisample)
        if key not in self._renderers:
            reason = render_unavailable_reason()
            if reason:
                raise RenderBackendError(reason)
            vis = self._model.vis.global_
            vis.offwidth, vis.offheight = max(vis.offwidth, width), max(vis.offheight, height)
            # The GL context reads the sample count once, when it is made: set it for this one.
            saved, quality.offsamples = quality.offsamples, MSAA_SAMPLES if multisample else 0
            try:
                self._renderers[key] = make_renderer(self._model, height, width, self.egl_device)
            except RenderBackendError:
                raise
            except Exception as exc:  # context creation failures come as several types
                raise render_backend_error(exc) from exc
            finally:
                quality.offsamples = saved
        return self._renderers[key]

    def rgb(
        self,
        camera: str,
        height: int,
        width: int,
        *,
        multisample: bool | None = None,
        data=None,
    ) -> np.ndarray:
        """Upright RGB; `multisample` True renders with robosuite's 4x MSAA whatever the env's
        own setting (None: the env's setting); `data` renders another MjData of the same model
        (its kinematics computed) instead of the live one."""
        renderer = self._renderer(height, width, multisample)
        renderer.update_scene(
            self._data if data is None else data, camera=camera, scene_option=self._option
        )
        return renderer.render()

    def frame(
        self,
        camera: str,
        height: int,
        width: int,
        *,
        rgb: bool = True,
        depth: bool = False,
        segmentation: bool = False,
    ) -> CameraFrame:
        renderer = self._renderer(height, width)
        renderer.update_scene(self._data, camera=camera, scene_option=self._option)
        out = CameraFrame(camera=camera, rgb=renderer.render() if rgb else None)
        if depth:
            renderer.enable_depth_rendering()
            try:
                out.depth = renderer.render().copy()
            finally:
                renderer.disable_depth_rendering()
        if segmentation:
            renderer.enable_segmentation_rendering()
            try:
                raw = renderer.render()
            finally:
                renderer.disable_segmentation_rendering()
            import mujoco

            geom_ids, obj_types = raw[..., 0], raw[..., 1]
            is_geom = (obj_types == int(mujoco.mjtObj.mjOBJ_GEOM)) & (geom_ids >= 0)
            seg = np.zeros(geom_ids.shape, dtype=np.int32)
            seg[is_geom] = self._geom_labels[geom_ids[is_geom]]
            out.segmentation = seg
            out.labels = dict(self._labels)
        out.intrinsics, out.cam_to_world = self.camera_geometry(camera, height, width)
        return out

    def camera_geometry(self, camera: str, height: int, width: int):
        """(intrinsics, cam_to_world) for a resolved MuJoCo camera name."""
        cam = self._model.camera(camera)
        fovy = np.deg2rad(float(cam.fovy[0]))
        f = 0.5 * height / np.tan(0.5 * fovy)
        # Pixel (u, v) covers [u, u + 1); integer indices address pixel centres, so the
        # optical axis falls at (W - 1) / 2, (H - 1) / 2 in index coordinates.
        cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
        intrinsics = np.array([[f, 0.0, cx], [0.0, f, cy], [0.0, 0.0, 1.0]])
        pose = np.eye(4)
        # MuJoCo cameras look down -z with y up; flip y and z for the OpenCV convention.
        pose[:3, :3] = self._data.cam_xmat[cam.id].reshape(3, 3) @ np.diag([1.0, -1.0, -1.0])
        pose[:3, 3] = self._data.cam_xpos[cam.id]
        return intrinsics, pose

    def close(self) -> None:
        """Free every GL renderer, each in its own GL context (`close_renderer`)."""
        for renderer in self._renderers.values():
            close_renderer(renderer)
        self._renderers.clear()


def close_renderer(renderer) -> None:
    """Close a mujoco.Renderer with its own GL context current.

    mujoco.Renderer.close frees its MjrContext (framebuffers, textures, display lists) in
    whatever GL context is current, and GL object names are numbered per context. Closed while
    another renderer's context was current (a pooled env evicted after the env that stays
    rendered last), it deleted the other renderer's objects that share those numbers: every
    later render of the env that stayed read a framebuffer that no longer existed, RGB images
    wrong and segmentation ids decoded from them out of range (issue 48: `IndexError: index
    2040976 is out of bounds for axis 0 with size 71` in the segmentation branch of
    `Renderer.render`, on every trial of that env until it left the pool). mujoco.Renderer has
    no public handle on its context; `_gl_context` is the one its own `render` makes current."""
    context = getattr(renderer, "_gl_context", None)
    if context is not None and getattr(renderer, "_mjr_context", None) is not None:
        context.make_current()
    renderer.close()
