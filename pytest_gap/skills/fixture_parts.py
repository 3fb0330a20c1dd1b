"""The articulated parts of the scene's fixtures: which joint moves what (a cabinet's drawers,
a slide joint each; the microwave's door, a hinge), a part resolved from a phrase, and the
joint's axis and "open" direction. Privileged reads, structure not state: the model's joint
names and axes, LIBERO's `default_open_ranges`.

Below the drawer skills (articulation.py) and the door (door.py), which both act on a `Part`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import SkillFailure

LEVELS = ("top", "middle", "bottom")


# What open_fixture and close_fixture return (articulation.py).
class Articulated(BaseModel):
    fixture: str  # scene name, e.g. wooden_cabinet_1
    part: str  # "top drawer", "door"
    moved: float  # how far the part moved: metres (drawer) or radians (door)
    open: bool  # the part's state afterwards, as measured


@dataclass(frozen=True)
class Part:
    fixture: str
    part: str  # "top drawer" / "door"
    joint: str  # the model's joint that moves it
    region: str | None  # the BDDL region riding on it (a drawer's inside)

    @property
    def level(self) -> str:
        return self.part.split()[0]


# -- resolving a phrase ---------------------------------------------------------------------------
def articulated_parts(ctx: SkillContext) -> list[Part]:
    """Every part of the scene's fixtures that a joint moves: each cabinet drawer
    (`<fixture>_<level>_level`) and the microwave door (privileged: the model's joint names)."""
    model = ctx.env.raw.sim.model._model
    joints = {model.joint(j).name for j in range(model.njnt)}
    parts = []
    for obj in ctx.env.scene.objects(include_fixtures=True):
        if not obj.fixture:
            continue
        for level in LEVELS:
            joint = f"{obj.name}_{level}_level"
            if joint in joints:
                parts.append(Part(obj.name, f"{level} drawer", joint, f"{obj.name}_{level}_region"))
        door = f"{obj.name}_microjoint"
        if door in joints:
            parts.append(Part(obj.name, "door", door, None))
    return parts


def resolve_part(ctx: SkillContext, name: str) -> Part:
    """The part a phrase names: "the middle drawer of the cabinet", "the top drawer", "the
    microwave" (its door). Fails naming the candidates when it names none, or several."""
    words = set(re.findall(r"[a-z]+", name.lower()))
    parts = articulated_parts(ctx)

    def fits(part: Part) -> bool:
        fixture_words = set(part.fixture.lower().split("_")) - {"1", "2"}
        named_fixture = words & (fixture_words - {"wooden", "white", "yellow"})
        colour = words & {"wooden", "white", "yellow"}
        if colour and not colour <= fixture_words:
            return False
        if part.part == "door":
            return bool(named_fixture) or "door" in words
        level = part.level
        drawerish = "drawer" in words or bool(named_fixture)
        return drawerish and level in words

    found = [p for p in parts if fits(p)]
    if len(found) != 1:
        options = ", ".join(f"the {p.part} of {p.fixture}" for p in parts) or "none"
        why = "names none" if not found else "fits several"
        raise SkillFailure(f"{name!r} {why} of the scene's articulated parts: {options}")
    return found[0]


# -- the joint's structure (privileged: the model) -------------------------------------------------
def joint_frame(ctx: SkillContext, joint: str) -> tuple[np.ndarray, float, int]:
    """The joint's axis in the world, the sign of its "open" direction (LIBERO's
    `default_open_ranges` lie on that side of 0), and its qpos address."""
    model, data = ctx.env.raw.sim.model._model, ctx.env.raw.sim.data._data
    j = model.joint(joint).id
    body = model.jnt_bodyid[j]
    axis = data.xmat[body].reshape(3, 3) @ model.jnt_axis[j]
    lo, hi = model.jnt_range[j]
    sign = -1.0 if abs(lo) > abs(hi) else 1.0
    return axis, sign, int(model.jnt_qposadr[j])
