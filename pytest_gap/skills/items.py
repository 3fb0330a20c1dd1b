"""Walking a pack instruction's items: `read_task` reads the items and their container from
the instruction, `next_item` says which to pick next (in packing order, not yet in, not tried
too often), `verify_in_container` looks whether one is in. The reference graph that packs a
container (examples/workflows/pack_all) loops next_item -> pick -> place until `done`."""

from __future__ import annotations

from pydantic import BaseModel

from pytest_gap.instructions import parse_instruction
from pytest_gap.skills import packing, perception
from pytest_gap.skills.calibration import INSIDE_MARGIN
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.geometry import Box
from pytest_gap.skills.registry import SkillFailure, skill


# -- outputs -------------------------------------------------------------------------------------
class TaskInfo(BaseModel):
    prompt: str
    items: list[str]
    container: str


class NextItem(BaseModel):
    item: str
    remaining: int
    done: bool


class Inside(BaseModel):
    inside: bool


# -- skills --------------------------------------------------------------------------------------
@skill(scene=False)
def read_task(ctx: SkillContext) -> TaskInfo:
    """Read the instruction: the items to move and the container they go to.

    Fails when the instruction is not a pick-and-place or pack instruction, saying how to
    write one."""
    prompt = ctx.instruction
    parsed = parse_instruction(prompt)
    if parsed is None:
        raise SkillFailure(
            f"cannot read items and container from the instruction {prompt!r}; write it as "
            "'pick up the X and place it in the Y' or 'pack A, B and C into the Y'"
        )
    return TaskInfo(prompt=prompt, items=parsed.items, container=parsed.container)


@skill
def next_item(
    ctx: SkillContext, items: list[str], container: str, max_attempts: int = 2
) -> NextItem:
    """The next listed item not yet in the container and not tried `max_attempts` times.

    Tall things go first, the widest first, then cans, then flat things (`packing.KIND_ORDER`).
    An item that is over the container but not in it (perched on what is there) is not tried
    again: the fingers close on its neighbours too, and lifting drags the container along."""
    tries = ctx.memory.setdefault("next_item_attempts", {})
    placed = ctx.memory.get("placed", set())
    box = perception.locate_box(ctx, perception.ground_name(ctx, container))[0]
    # (packing order, item, scene name, footprint if it stands on the floor)
    remaining: list[tuple[tuple[int, float], str, str, tuple[float, float] | None]] = []
    blocked = 0
    for item in items:
        scene_name = perception.ground_name(ctx, item)
        try:
            found = perception.locate_box(ctx, scene_name)[0]
        except SkillFailure:  # unseen: buried in the container if this run put it there
            if scene_name not in placed:
                remaining.append(((len(packing.KIND_ORDER), 0.0), item, scene_name, None))
            continue
        if _inside(found, box, ctx.memory.get("heights", {}).get(scene_name)):
            continue
        if box.contains([*found.center[:2], box.center[2]]):
            blocked += 1
            continue
        hx, hy, hz = found.half_extents
        kind = packing.kind_of(2 * hz)
        half = None if kind == "flat" else _footprint_to_come(hx, hy)
        remaining.append(((packing.KIND_ORDER.index(kind), -hx * hy), item, scene_name, half))
    remaining.sort(key=lambda r: r[0])
    # The footprints still to stand on the container's floor, in order: `place` leaves room.
    ctx.memory["to_pack"] = {name: half for _, _, name, half in remaining if half is not None}
    for _, item, _, _ in remaining:
        if tries.get(item, 0) < max_attempts:
            tries[item] = tries.get(item, 0) + 1
            return NextItem(item=item, remaining=len(remaining) + blocked, done=False)
    return NextItem(item="", remaining=len(remaining) + blocked, done=True)


@skill
def verify_in_container(ctx: SkillContext, name: str, container: str) -> Inside:
    """Look whether an object rests inside a container (its centre within the container's box)."""
    scene_name = perception.ground_name(ctx, name)
    obj = perception.locate_box(ctx, scene_name)[0]
    box = perception.locate_box(ctx, perception.ground_name(ctx, container))[0]
    return Inside(inside=_inside(obj, box, ctx.memory.get("heights", {}).get(scene_name)))


def _inside(obj: Box, container: Box, height: float | None) -> bool:
    """Within the walls (the box is the outer hull; walls and a margin take 2.5 cm), centre
    below the rim: not perched on top of what is already in there.

    The walls hide the lower part of what stands inside, so the centre comes from the visible
    top and the height the object showed when it stood on the table, if it was seen there."""
    x, y, z = obj.center
    if height is not None:
        z = obj.top - height / 2
    within = container.contains([x, y, container.center[2]], margin=-INSIDE_MARGIN)
    return bool(within and z < container.top - 0.01)


def _footprint_to_come(hx: float, hy: float) -> tuple[float, float]:
    """The half footprint to leave floor for, from an item's box as seen where it stands.

    The box runs wide along its longer side by the points on silhouette edges
    (`perception.BOX_BIAS`), but not along its shorter one, often a face seen edge-on: a can's
    shorter side is its diameter as it is, less that it came out 2.5 mm narrow, and room left
    for so small a can was too little (grocery object task 2 seeds 2, 4: it went on top of the
    milk)."""
    if hx >= hy:
        return hx - perception.BOX_BIAS / 2, hy
    return hx, hy - perception.BOX_BIAS / 2
