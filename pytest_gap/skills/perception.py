"""Perception from rendered images: segmentation + depth -> point cloud -> oriented box.

Two cameras see each object from the front (agentview) and from above (birdview), so the
box covers more than the camera-facing surface. Names are grounded against the scene's object
categories ("the alphabet soup" -> alphabet_soup_1).
"""

from __future__ import annotations

import numpy as np

from pytest_gap.instructions import PhraseError, resolve_phrase
from pytest_gap.skills.calibration import CONTAINER_TURN
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import (
    Box,
    box_from_points,
    container_frame,
    support_height,
)
from pytest_gap.skills.registry import SkillFailure

CAMERAS = ("agentview", "birdview")
MIN_PIXELS = 8
RIM_BAND = 0.02  # a container's rim: its points this close to its top


def ground_name(ctx: SkillContext, name: str) -> str:
    """The scene object a user- or LLM-given name refers to (`instructions.resolve_phrase`
    over the scene's names and categories): "the basket" -> red_basket_1, "milk carton" ->
    milk_1."""
    objects = ctx.env.scene.objects(include_fixtures=False)
    try:
        return resolve_phrase(name, [(o.name, o.category) for o in objects])
    except PhraseError as exc:
        raise SkillFailure(str(exc)) from None


def object_points(ctx: SkillContext, scene_name: str) -> tuple[np.ndarray, int]:
    """The named object's points (N, 3) from the cameras' depth and segmentation, and how
    many pixels showed it."""
    clouds, pixels = [], 0
    for camera in CAMERAS:
        frame = ctx.render(camera)
        mask = frame.mask(scene_name)
        pixels += int(mask.sum())
        if mask.sum() >= MIN_PIXELS:
            clouds.append(frame.points(mask))
    if not clouds:
        raise SkillFailure(f"{scene_name} is not visible from {' or '.join(CAMERAS)}")
    points = np.concatenate(clouds)
    # Depth edges of neighbours can leak into a mask: keep the bulk of the cloud.
    center = np.median(points, axis=0)
    dist = np.linalg.norm(points[:, :2] - center[:2], axis=1)
    return points[dist <= np.percentile(dist, 98) + 0.005], pixels


def locate_box(ctx: SkillContext, scene_name: str) -> tuple[Box, int]:
    """Box of the named object from the cameras' depth and segmentation; (box, pixels).

    It stands on the surface seen around it (`support_height`): the floor, a table, a plate."""
    points, pixels = object_points(ctx, scene_name)
    support = support_height(points, surroundings(ctx, scene_name))
    box = box_from_points(points, floor=support)
    if support is not None and box.bottom == support:
        # standing on its support, seen whole: remember how tall it is
        ctx.memory.setdefault("heights", {})[scene_name] = 2 * box.half_extents[2]
    return box, pixels


def locate_container(ctx: SkillContext, scene_name: str) -> Box:
    """A container's frame as the slots are planned in (`geometry.container_frame`): centre
    and extent of what the cameras see, yaw from its rim, the longer side along y."""
    points, _ = object_points(ctx, scene_name)
    support = support_height(points, surroundings(ctx, scene_name))
    return container_frame(points, _rim(points)[:, :2], floor=support, turn=CONTAINER_TURN)


def _rim(points: np.ndarray) -> np.ndarray:
    return points[points[:, 2] > points[:, 2].max() - RIM_BAND]


def surroundings(ctx: SkillContext, scene_name: str) -> np.ndarray:
    """Points (N, 3) of everything the cameras see but the object and the robot: the surface
    it stands on among them."""
    clouds = [np.zeros((0, 3))]
    for camera in CAMERAS:
        frame = ctx.render(camera)
        ids = [i for i, n in frame.labels.items() if n in (scene_name, "robot")]
        clouds.append(frame.points(~np.isin(frame.segmentation, ids)))
    return np.concatenate(clouds)


def visible_objects(ctx: SkillContext, camera: str = "agentview") -> list[str]:
    frame = ctx.render(camera)
    names = [o.name for o in ctx.env.scene.objects(include_fixtures=False)]
    return [n for n in names if frame.mask(n).sum() >= MIN_PIXELS]


def contents(ctx: SkillContext, container: str, box: Box, exclude: str | None = None) -> np.ndarray:
    """Points (N, 3) of everything seen inside a container's footprint, from above and the
    front: its walls and floor, the robot and `exclude` (what the hand holds) left out."""
    clouds = [np.zeros((0, 3))]
    for camera in CAMERAS:
        frame = ctx.render(camera)
        skip = {container, "robot", exclude}
        labels = [i for i, n in frame.labels.items() if n not in skip]
        mask = np.isin(frame.segmentation, labels)
        if mask.any():
            clouds.append(frame.points(mask))
    points = np.concatenate(clouds)
    inside = [box.contains([p[0], p[1], box.center[2]]) for p in points]
    return points[np.asarray(inside, bool)] if len(points) else points
