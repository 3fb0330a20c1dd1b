"""Perception from rendered images: segmentation + depth -> point cloud -> oriented box.

Two cameras see each object (`SkillContext.cameras`): the front camera (agentview) and, by
default, one from above (birdview; with `skills.perception: policy_cameras`, the wrist camera
instead), so the box covers more than the camera-facing surface. Names are grounded against
the scene's object categories ("the alphabet soup" -> alphabet_soup_1).
"""

from __future__ import annotations

import re

import numpy as np

from pytest_gap.instruction_references import (
    Thing,
    anchor_names,
    parse_reference,
    resolve_reference,
)
from pytest_gap.instruction_stand_ins import stand_in
from pytest_gap.instruction_steps import StepsError, parse_steps
from pytest_gap.instructions import NoSuchObject, PhraseError, phrase_candidates, resolve_phrase
from pytest_gap.skills.calibration import CONTAINER_TURN
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import (
    Box,
    box_from_points,
    container_frame,
    support_height,
)
from pytest_gap.skills.registry import SkillFailure

MIN_PIXELS = 8
BOX_BIAS = 0.005  # boxes from depth run wide by the points on silhouette edges
LOOK_PX = 256  # the frames skills look at objects in (square)
# A container's walls are looked at in frames this large: at LOOK_PX a pixel of the front
# camera spans about 4 mm at the basket, and its width came out 154-161 mm for a true 157 mm
# over 15 grocery_packing scenes (512: 158-162). Two 53 mm cartons side by side need 107 mm of
# the 110 mm inside: 4 mm too narrow sent the second carton to the other row and left no
# floor for the can (grocery_packing/permutation task 7 seed 21). A look costs ~0.1 s more.
CONTAINER_LOOK_PX = 512
WALL_REACH = 0.01  # a compartment's walls stand within this of its region site's footprint
# What stands on a surface: seen this far over it (the surface's own points scatter a few mm).
ON_SURFACE = 0.01
SURFACE_THICKNESS = 0.01  # a fixture's region site this thin is a surface to put things on
RIM_BAND = 0.02  # a container's rim: its points this close to its top
# Travel height: this far above the surface the scene stands on (LIBERO's tallest movable
# things stand about 0.15 m), and this far above the tallest thing seen (a bowl on a cabinet).
SAFE_ABOVE_SUPPORT, SAFE_ABOVE_TALLEST = 0.25, 0.08


def ground_name(ctx: SkillContext, name: str, fixtures: bool = False) -> str:
    """The scene object a user- or LLM-given name refers to (`instructions.resolve_phrase`
    over the scene's names and categories): "the basket" -> red_basket_1, "milk carton" ->
    milk_1. A referring phrase ("the black bowl next to the plate") is resolved from where the
    cameras see things (`instruction_references.resolve_reference`), once: the answer is
    remembered, as the object moves when it is picked. `fixtures`: the scene's fixtures (the
    stove, the cabinet, the wine rack) may be named too: a place to put something, not a thing
    to pick. A thing to pick the instruction names but the scene lacks ("the book" where
    LIBERO-PRO swapped in a bowl) is the object that stands in for it
    (`instruction_stand_ins.stand_in`, among the movable objects the instruction's other
    phrases do not name), noted as "stand-in"."""
    resolved = ctx.memory.setdefault("referents", {})
    if name in resolved:
        return resolved[name]
    try:
        reference = parse_reference(name)
        if reference.relation is None:
            objects = ctx.env.scene.objects(include_fixtures=fixtures)
            try:
                return resolve_phrase(name, [(o.name, o.category) for o in objects])
            except NoSuchObject:
                # Only what the instruction names was swapped; a name given to a skill
                # directly ("locate the banana") means that and nothing else.
                phrases = _phrases(ctx)
                if fixtures or _plain(name) not in map(_plain, phrases):
                    raise
            found = stand_in(name, [(o.name, o.category) for o in objects], phrases)
            resolved[name] = found.name
            ctx.note("stand-in", phrase=name, object=found.name, reason=found.reason)
            return found.name
        resolved[name] = resolve_reference(name, seen_things(ctx, reference), table_center(ctx))
        ctx.note("reference resolved", phrase=name, object=resolved[name])
        return resolved[name]
    except PhraseError as exc:
        raise SkillFailure(str(exc)) from None


def _plain(phrase: str) -> str:
    return re.sub(r"^(?:the|a|an)\s+", "", " ".join(phrase.lower().split()))


def _phrases(ctx: SkillContext) -> list[str]:
    """What the instruction's steps name: what each acts on and where it goes."""
    try:
        steps = parse_steps(ctx.instruction)
    except StepsError:
        return []
    return [p for step in steps for p in (step.object, step.target) if p]


def fixture_surface(ctx: SkillContext, fixture: str) -> Box:
    """The surface of a fixture to put things "on" (the stove's burner, the cabinet's top, the
    wine rack's top): a flat box, its top the surface's height.

    Where on the fixture that surface lies is a privileged read: LIBERO's region sites of the
    fixture (`<fixture>_cook_region`, `<fixture>_top_side`, `<fixture>_top_region`), the
    highest flat one (SURFACE_THICKNESS), as the cameras do not tell a burner from the rest of
    a stove. Its height comes from the cameras: the highest of the fixture's points seen over
    the site's footprint (the site may sit a few mm off the visual surface)."""
    sites = [ctx.env.scene.region(n) for n in sites_of(ctx, fixture) if "contain" not in n]
    flat = [s for s in sites if s.half_size[2] <= SURFACE_THICKNESS]
    if not flat:
        raise SkillFailure(f"{fixture} has no surface to put things on")
    return _site_top(ctx, fixture, max(flat, key=lambda s: s.pos[2]))


def fixture_part(ctx: SkillContext, fixture: str, part: str) -> Box:
    """A named compartment of a fixture ("back" of the desk caddy: its
    `desk_caddy_1_back_contain_region` site, a privileged read as in `fixture_surface`), as a
    flat box over it, its top the highest of the fixture's points seen over the footprint (the
    walls): what is put in goes in from above that."""
    names = [n for n in sites_of(ctx, fixture) if n.startswith(f"{fixture}_{part}_")]
    if not names:
        parts = sorted({n[len(fixture) + 1 :].split("_")[0] for n in sites_of(ctx, fixture)})
        raise SkillFailure(f"{fixture} has no {part!r} part; it has {', '.join(parts) or 'none'}")
    return _site_top(ctx, fixture, ctx.env.scene.region(names[0]), walls=True)


def part_owner(ctx: SkillContext, part: str) -> str:
    """The one scene object that has a part named `part` ("the back compartment" with no "of
    the caddy": desk_caddy_1, whose `desk_caddy_1_back_contain_region` site it is; a
    privileged read as in `fixture_part`). Fails naming the candidates when none or several
    have it."""
    names = [o.name for o in ctx.env.scene.objects(include_fixtures=True)]
    owners = [n for n in names if any(s.startswith(f"{n}_{part}_") for s in sites_of(ctx, n))]
    if len(owners) == 1:
        return owners[0]
    if owners:
        raise SkillFailure(
            f"the {part} compartment of which? {', '.join(sorted(owners))} each have one: "
            f"name it ('the {part} compartment of the ...')"
        )
    with_parts = sorted(n for n in names if any("contain" in s for s in sites_of(ctx, n)))
    raise SkillFailure(
        f"nothing in the scene has a {part!r} compartment; "
        f"things with compartments: {', '.join(with_parts) or 'none'}"
    )


def sites_of(ctx: SkillContext, fixture: str) -> list[str]:
    """The names of a fixture's region sites (`<fixture>_...` in LIBERO's `object_sites_dict`:
    a privileged read of the task's regions); none on an env without them."""
    return [n for n in getattr(ctx.env.raw, "object_sites_dict", {}) if n.startswith(f"{fixture}_")]


def _site_top(ctx: SkillContext, fixture: str, site, walls: bool = False) -> Box:
    """A flat box over a region site's footprint at the height of the fixture seen over it:
    the surface (most of what is seen, the 95th percentile), or with `walls` the top of the
    walls around it (the highest point within WALL_REACH of the footprint)."""
    half = np.asarray(site.half_size[:2], float) + (WALL_REACH if walls else 0.0)
    center = np.asarray(site.pos, float)
    try:
        points, _ = object_points(ctx, fixture)
        over = points[np.all(np.abs(points[:, :2] - center[:2]) <= half, axis=1)]
    except SkillFailure:
        over = np.zeros((0, 3))
    # The top of what is seen over the footprint; the site's own height if nothing is.
    top = (
        float(np.percentile(over[:, 2], 100 if walls else 95))
        if len(over) >= MIN_PIXELS
        else float(center[2])
    )
    ctx.note("fixture surface", fixture=fixture, site=site.name, top=round(top, 3))
    thick = 0.005
    half = np.asarray(site.half_size[:2], float)
    return Box(
        center=(float(center[0]), float(center[1]), top - thick),
        half_extents=(float(half[0]), float(half[1]), thick),
        yaw=0.0,
    )


def seen_things(ctx: SkillContext, reference) -> list:
    """The reference's candidates and anchors as the cameras see them
    (`instruction_references.Thing`): the axis-aligned box around each one's points.

    A candidate's bottom is its lowest point seen: a bowl on a cookie box hides the box from
    the ring around it, and `locate_box` would stand it on the table. An anchor's bottom is
    where it stands (`locate_box`): its own lowest points are hidden by what is on it."""
    objects = [(o.name, o.category) for o in ctx.env.scene.objects()]
    nouns = phrase_candidates(reference.noun, objects)
    anchors = anchor_names(reference, objects)
    categories = dict(objects)
    things = []
    for scene_name in dict.fromkeys(nouns + anchors):
        try:
            points, _ = object_points(ctx, scene_name)
        except SkillFailure:  # unseen: it can be neither the answer nor the anchor
            continue
        lo, hi = points.min(axis=0), points.max(axis=0)
        if scene_name in anchors:
            lo[2] = min(lo[2], locate_box(ctx, scene_name)[0].bottom)
        things.append(
            Thing(
                name=scene_name,
                category=categories[scene_name],
                center=tuple(float(v) for v in (lo + hi) / 2),
                half_extents=tuple(float(v) for v in (hi - lo) / 2),
            )
        )
    return things


def table_center(ctx: SkillContext) -> tuple[float, float]:
    """Where "table center" is: the centre of the workspace's table top (LIBERO's
    `workspace_offset`, a privileged read: the table is not a segmented object)."""
    offset = getattr(ctx.env.raw, "workspace_offset", (0.0, 0.0, 0.0))
    return float(offset[0]), float(offset[1])


def scene_points(
    ctx: SkillContext, exclude: str | None = None, also: str | None = None
) -> np.ndarray:
    """Points (N, 3) of every object the cameras see (fixtures included), but `exclude` and
    `also`."""
    names = {o.name for o in ctx.env.scene.objects()} - {exclude, also}
    clouds = [np.zeros((0, 3))]
    for camera in ctx.cameras:
        frame = ctx.render(camera)
        ids = [i for i, n in frame.labels.items() if n in names]
        clouds.append(frame.points(np.isin(frame.segmentation, ids)))
    return np.concatenate(clouds)


def standing_on(
    ctx: SkillContext, support: str, surface: Box, around: float, exclude: str | None = None
) -> np.ndarray:
    """Points (N, 3) of the things seen standing on a surface (`surface`'s top, its footprint
    widened by `around`): every object's but the `support`'s own and `exclude`'s (what the
    hand holds), higher than ON_SURFACE over the top."""
    points = scene_points(ctx, exclude, also=support)
    if not len(points):
        return points
    local = (points[:, :2] - np.asarray(surface.center[:2])) @ np.array(
        [[np.cos(surface.yaw), -np.sin(surface.yaw)], [np.sin(surface.yaw), np.cos(surface.yaw)]]
    )
    within = np.all(np.abs(local) <= np.asarray(surface.half_extents[:2]) + around, axis=1)
    return points[within & (points[:, 2] > surface.top + ON_SURFACE)]


def safe_height(ctx: SkillContext, exclude: str | None = None) -> float:
    """A travel height clear of everything: SAFE_ABOVE_SUPPORT above the surface the scene
    stands on (the lowest point of any object seen) and SAFE_ABOVE_TALLEST above the tallest
    (`exclude`: what the hand holds). Remembered in `ctx.memory["safe_z"]` for `motion`."""
    z = scene_points(ctx, exclude)[:, 2]
    if not len(z):
        return ctx.memory.get("safe_z", SAFE_ABOVE_SUPPORT)
    support = float(np.percentile(z, 0.5))
    ctx.memory["safe_z"] = max(support + SAFE_ABOVE_SUPPORT, float(z.max()) + SAFE_ABOVE_TALLEST)
    ctx.memory["support_z"] = support
    return ctx.memory["safe_z"]


def tallest_along(ctx: SkillContext, start, end, exclude: str | None = None, width: float = 0.08):
    """The height of the tallest thing seen within `width` of the straight path from `start`
    to `end` (x, y): what a hand carrying something along it must clear. The support under
    it when nothing stands there."""
    points = scene_points(ctx, exclude)
    a, b = np.asarray(start, float)[:2], np.asarray(end, float)[:2]
    seg = b - a
    t = np.clip((points[:, :2] - a) @ seg / max(float(seg @ seg), 1e-9), 0.0, 1.0)
    dist = np.linalg.norm(points[:, :2] - (a + t[:, None] * seg), axis=1)
    near = points[dist < width, 2]
    return float(near.max()) if len(near) else float(ctx.memory.get("support_z", 0.0))


def is_hollow(points: np.ndarray, box: Box) -> bool:
    """Whether an object is open at the top (a bowl): what is seen near the middle of its
    footprint lies well below its rim."""
    center = np.asarray(box.center[:2])
    radius = min(box.half_extents[:2])
    middle = points[np.linalg.norm(points[:, :2] - center, axis=1) < 0.4 * radius]
    return bool(len(middle) >= 10 and np.median(middle[:, 2]) < box.top - 0.015)


def object_points(
    ctx: SkillContext, scene_name: str, size: int = LOOK_PX
) -> tuple[np.ndarray, int]:
    """The named object's points (N, 3) from the cameras' depth and segmentation (frames of
    `size` pixels square), and how many pixels showed it."""
    clouds, pixels = [], 0
    for camera in ctx.cameras:
        frame = ctx.render(camera, height=size, width=size)
        mask = frame.mask(scene_name)
        pixels += int(mask.sum())
        if mask.sum() >= MIN_PIXELS:
            clouds.append(frame.points(mask))
    if not clouds:
        raise SkillFailure(f"{scene_name} is not visible from {' or '.join(ctx.cameras)}")
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
    points, _ = object_points(ctx, scene_name, size=CONTAINER_LOOK_PX)
    support = support_height(points, surroundings(ctx, scene_name))
    return container_frame(points, _rim(points)[:, :2], floor=support, turn=CONTAINER_TURN)


def _rim(points: np.ndarray) -> np.ndarray:
    return points[points[:, 2] > points[:, 2].max() - RIM_BAND]


def surroundings(ctx: SkillContext, scene_name: str) -> np.ndarray:
    """Points (N, 3) of everything the cameras see but the object and the robot: the surface
    it stands on among them."""
    clouds = [np.zeros((0, 3))]
    for camera in ctx.cameras:
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
    front: its walls and floor, the robot and `exclude` (what the hand holds) left out, and
    anything of which fewer than MIN_PIXELS points fall inside (a neighbour's depth edge:
    one such point made an empty bowl look occupied, and the cream cheese went 4.4 cm off
    its middle, where LIBERO's `On` wants 3 cm; libero_pro goal_object task 6 seed 22)."""
    clouds, owners = [np.zeros((0, 3))], [np.zeros(0, str)]
    for camera in ctx.cameras:
        frame = ctx.render(camera)
        skip = {container, "robot", exclude}
        for label, name in frame.labels.items():
            mask = frame.segmentation == label
            if name not in skip and mask.any():
                clouds.append(frame.points(mask))
                owners.append(np.full(int(mask.sum()), name))
    points, names = np.concatenate(clouds), np.concatenate(owners)
    inside = np.asarray([box.contains([p[0], p[1], box.center[2]]) for p in points], bool)
    points, names = points[inside], names[inside]
    found, counts = np.unique(names, return_counts=True)
    return points[np.isin(names, found[counts >= MIN_PIXELS])]
