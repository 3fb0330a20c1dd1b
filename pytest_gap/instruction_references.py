"""Referring expressions: which object "the black bowl between the plate and the ramekin", "the
left plate" or "the bowl in the top drawer of the cabinet" names, read from the phrase
(`parse_reference`) and decided from where things are (`resolve_reference`, over `Thing`s:
name, category and upright box). Pure text and geometry, no simulator, no LLM.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel

from pytest_gap.instructions import (
    ARTICLE,
    PhraseError,
    phrase_candidates,
    plain_phrase,
    resolve_phrase,
)

# "the black bowl between the plate and the ramekin", "... next to the cookie box", "... on the
# stove", "... in the top drawer of the wooden cabinet", "... from table center".
_CENTER = re.compile(
    r"^(?P<noun>.+?)\s+(?:that\s+is\s+|which\s+is\s+)?(?:from|at|in|on)\s+"
    r"(?:the\s+)?(?:(?:table\s+(?:center|centre|middle))|(?:(?:center|centre|middle)\s+of\s+"
    r"(?:the\s+)?table))$"
)
_RELATION = re.compile(
    r"^(?P<noun>.+?)\s+(?:that\s+is\s+|which\s+is\s+|that's\s+)?(?P<not>not\s+|isn't\s+)?"
    r"(?:sitting\s+|standing\s+|lying\s+)?"
    r"(?P<rel>between|next\s+to|beside|near|by|close\s+to|on\s+top\s+of|on|atop|from|"
    r"inside(?:\s+of)?|in)\s+(?P<anchor>.+)$"
)
_DRAWER = re.compile(
    r"^(?:the\s+)?(?:(?P<level>top|upper|middle|bottom|lower)\s+)?drawer"
    r"(?:\s+(?:of|in)\s+(?P<anchor>.+))?$"
)
# "From the top drawer" names no piece of furniture: the one thing here whose name says it has
# drawers is meant (LIBERO-PRO spatial_lan task 4: "take the black bowl from the top drawer").
_HAS_DRAWERS = ("cabinet", "dresser", "drawer", "chest")
# "the left plate", "the rightmost bowl", "the front mug": a side as the front camera
# (agentview) sees the table, as LIBERO's instructions are written.
_SIDE = re.compile(r"^(?P<side>left|right|front|back|near|far)(?:most)?\s+(?P<noun>.+)$")
_SIDES = {"left": "left", "right": "right", "front": "front", "near": "front", "back": "back"}
_SIDES["far"] = "back"
# The camera stands at +x looking towards the robot at -x: its left is -y, its front (nearer
# to it) +x. Measured on LIBERO's goals: libero_10 task 4's "left plate" is plate_1 at y -0.32
# (plate_2 at +0.31), seeds 0-1; the desk caddy's left_contain_region is at y -0.29 (right at
# 0.00), its front_contain_region at x -0.36 (back at -0.42). The sign of a side's world axis,
# (axis, sign): the candidate with the largest sign * coordinate.
SIDE_AXES = {"left": (1, -1.0), "right": (1, 1.0), "front": (0, 1.0), "back": (0, -1.0)}
_LEVELS = {"top": "top", "upper": "top", "middle": "middle", "bottom": "bottom", "lower": "bottom"}
# Two candidates whose distances to the reference point differ by less than this are a tie.
TIE = 0.01  # m
# "On A": its bottom no higher than this above A's top ...
SUPPORT_ABOVE = 0.015  # m
# ... and above the surface A stands on; or, tilted over A's edge (a bowl on a ramekin dips its
# rim to 8 mm above the table), its top this far above A's.
TILTED_ABOVE = 0.04  # m
# Its centre within this of A's footprint: a bowl on a ramekin tilts 6 cm off its centre, 2 cm
# beyond its edge; one on the table beside A may reach over A's edge with its rim only.
SUPPORT_REACH = 0.05  # m


class Reference(BaseModel):
    """A referring phrase read: which kind of thing, and where it is relative to what."""

    noun: str
    relation: Literal["between", "next_to", "on", "in", "center", "side"] | None = None
    anchors: list[str] = []
    side: Literal["left", "right", "front", "back"] | None = None  # "the left plate"
    level: Literal["top", "middle", "bottom"] | None = None  # "in the top drawer of A"
    negated: bool = False  # "the bowl not between A and B": the one the rest does not name


class Thing(BaseModel):
    """An object as seen: name, category, and its upright box (centre and half extents, m)."""

    name: str
    category: str
    center: tuple[float, float, float]
    half_extents: tuple[float, float, float]

    @property
    def top(self) -> float:
        return self.center[2] + self.half_extents[2]

    @property
    def bottom(self) -> float:
        return self.center[2] - self.half_extents[2]

    def xy_distance(self, point: Sequence[float]) -> float:
        return float(np.hypot(self.center[0] - point[0], self.center[1] - point[1]))

    def overlaps(self, other: Thing) -> bool:
        """Whether the footprints (axis-aligned in the table plane) overlap."""
        return all(
            abs(self.center[i] - other.center[i]) < self.half_extents[i] + other.half_extents[i]
            for i in (0, 1)
        )


def parse_reference(phrase: str) -> Reference:
    """Read "<noun phrase> <relation> <anchor(s)>"; a phrase with no relation is all noun."""
    text = re.sub(r"\s+", " ", phrase.strip().lower())
    text = ARTICLE.sub("", text)
    center = _CENTER.fullmatch(text)
    if center:
        return Reference(noun=plain_phrase(center["noun"]), relation="center")
    match = _RELATION.fullmatch(text)
    if not match:
        side = _SIDE.fullmatch(text)
        if side:
            return Reference(
                noun=plain_phrase(side["noun"]), relation="side", side=_SIDES[side["side"]]
            )
        return Reference(noun=plain_phrase(text))
    reference = _related(phrase, plain_phrase(match["noun"]), match["rel"], match["anchor"])
    return reference.model_copy(update={"negated": bool(match["not"])})


def _related(phrase: str, noun: str, rel: str, anchor: str) -> Reference:
    if rel == "between":
        parts = re.split(r"\s+and\s+", anchor, maxsplit=1)
        if len(parts) != 2:
            raise PhraseError(f"{phrase!r}: 'between' needs two things, 'between A and B'")
        return Reference(noun=noun, relation="between", anchors=[plain_phrase(p) for p in parts])
    if rel.startswith(("next", "beside", "near", "by", "close")):
        return Reference(noun=noun, relation="next_to", anchors=[plain_phrase(anchor)])
    drawer = _DRAWER.fullmatch(anchor)
    if drawer:
        return Reference(
            noun=noun,
            relation="in",
            anchors=[plain_phrase(drawer["anchor"])] if drawer["anchor"] else [],
            level=_LEVELS[drawer["level"]] if drawer["level"] else None,
        )
    relation = "in" if rel.startswith(("in", "inside")) else "on"
    return Reference(noun=noun, relation=relation, anchors=[plain_phrase(anchor)])


_PART = re.compile(
    r"^(?:the\s+)?(?P<part>[a-z]+)\s+(?:compartment|section|slot)\s+(?:of|in)\s+"
    r"(?:the\s+)?(?P<whole>.+)$"
)


def parse_part(phrase: str) -> tuple[str, str] | None:
    """A named part of a thing: "the back compartment of the caddy" -> ("back", "caddy");
    None when the phrase names no part."""
    match = _PART.fullmatch(re.sub(r"\s+", " ", phrase.strip().lower()))
    return (match["part"], plain_phrase(match["whole"])) if match else None


_BARE_PART = re.compile(r"^(?:the\s+)?(?P<part>[a-z]+)\s+(?:compartment|section|slot)$")


def parse_bare_part(phrase: str) -> str | None:
    """A part named without its whole: "the back compartment" -> "back" (the scene says whose,
    `perception.part_owner`); None for anything else, "of the caddy" included (`parse_part`)."""
    match = _BARE_PART.fullmatch(re.sub(r"\s+", " ", phrase.strip().lower()))
    return match["part"] if match else None


def supported_by(thing: Thing, anchor: Thing, tilted: bool = False) -> bool:
    """Whether `thing` stands on or in `anchor`: its centre over `anchor`'s footprint (within
    SUPPORT_REACH), its bottom not above `anchor`'s top and above the surface `anchor` stands
    on; with `tilted`, also when its top is TILTED_ABOVE over `anchor`'s (leaning on its edge)."""
    inside = all(
        abs(thing.center[i] - anchor.center[i]) < anchor.half_extents[i] + SUPPORT_REACH
        for i in (0, 1)
    )
    raised = thing.bottom > anchor.bottom + 0.01 or (
        tilted and thing.top > anchor.top + TILTED_ABOVE
    )
    return (
        thing.name != anchor.name
        and inside
        and raised
        and thing.bottom <= anchor.top + SUPPORT_ABOVE
    )


def resolve_reference(
    phrase: str, things: Sequence[Thing], table_center: Sequence[float] = (0.0, 0.0)
) -> str:
    """The one object a referring phrase names, from where things are (`parse_reference`).

    the left/right/front/back X: the X farthest that way as the front camera sees the table
    (`SIDE_AXES`); between A and B: the candidate nearest the midpoint of A's and B's
    centres; next to A: the nearest to A that does not stand on A; on A: the one standing on
    A and sticking out above its top (`supported_by`); in A: the one within A (a drawer: the
    top, middle or bottom third of A's height by where its bottom is); table center: the nearest to
    `table_center` (x, y). Names are never read for order (`bowl_1` is not "the first bowl").
    Raises PhraseError naming the candidates when none fits or two fit equally well."""
    ref = parse_reference(phrase)
    if not ref.negated:
        return _resolve(phrase, ref, things, table_center)
    # "Not between A and B": of the candidates, the one that is not the one it would be
    # (LIBERO-PRO spatial_task: "the akita black bowl not between the plate and the ramekin").
    objects = [(t.name, t.category) for t in things]
    anchors = set(anchor_names(ref, objects, phrase))
    names = [n for n in phrase_candidates(ref.noun, objects) if n not in anchors]
    try:
        excluded = {
            _resolve(phrase, ref.model_copy(update={"negated": False}), things, table_center)
        }
    except PhraseError:  # none is so: every candidate is not
        excluded = set()
    rest = [n for n in names if n not in excluded]
    if len(rest) != 1:
        raise PhraseError(
            f"{phrase!r}: {len(rest)} {ref.noun}(s) fit once "
            f"{', '.join(sorted(excluded)) or 'none'} is left out ({', '.join(rest) or 'none'})"
        )
    return rest[0]


def _resolve(
    phrase: str, ref: Reference, things: Sequence[Thing], table_center: Sequence[float]
) -> str:
    objects = [(t.name, t.category) for t in things]
    names = phrase_candidates(ref.noun, objects)
    if ref.relation is None:
        return resolve_phrase(ref.noun, objects)
    by_name = {t.name: t for t in things}
    anchors = [by_name[a] for a in anchor_names(ref, objects, phrase)]
    cands = [by_name[n] for n in names if n not in {a.name for a in anchors}]
    listed = ", ".join(c.name for c in cands) or "none"
    if ref.relation == "side":
        return _by_side(phrase, cands, ref.side)
    if ref.relation in ("between", "next_to", "center"):
        if ref.relation == "between":
            a, b = anchors
            point = [(a.center[i] + b.center[i]) / 2 for i in (0, 1)]
        elif ref.relation == "next_to":
            point = anchors[0].center[:2]
            cands = [c for c in cands if not supported_by(c, anchors[0])]
        else:
            point = table_center
        ranked = sorted(cands, key=lambda c: c.xy_distance(point))
        if not ranked:
            raise PhraseError(f"{phrase!r}: no {ref.noun} here besides the anchors")
        if len(ranked) > 1 and ranked[1].xy_distance(point) - ranked[0].xy_distance(point) < TIE:
            dists = ", ".join(f"{c.name} {c.xy_distance(point):.3f} m" for c in ranked[:2])
            raise PhraseError(f"{phrase!r} fits two equally well: {dists}; say which")
        return ranked[0].name
    anchor = anchors[0]
    held = [c for c in cands if supported_by(c, anchor, tilted=ref.relation == "on")]
    if ref.relation == "on":
        fits = [c for c in held if c.top > anchor.top]
    else:
        fits = [c for c in held if c.top <= anchor.top + SUPPORT_ABOVE]
        if ref.level is not None:
            fits = [c for c in fits if _level(c, anchor) == ref.level]
    if len(fits) != 1:
        where = (
            "on"
            if ref.relation == "on"
            else f"in the {ref.level or ''} drawer of".replace("  ", " ")
        )
        raise PhraseError(
            f"{phrase!r}: {len(fits)} {ref.noun}(s) {where} {anchor.name} "
            f"({', '.join(c.name for c in fits) or 'none'}); candidates: {listed}"
        )
    return fits[0].name


def anchor_names(ref: Reference, objects: Sequence[tuple[str, str]], phrase: str = "") -> list[str]:
    """The scene names of a reference's anchors; for a drawer named without its furniture
    ("from the top drawer"), the one thing with drawers (`_drawer_owner`)."""
    if ref.relation == "in" and not ref.anchors:
        return [_drawer_owner(phrase, objects)]
    return [resolve_phrase(a, objects) for a in ref.anchors]


def _drawer_owner(phrase: str, objects: Sequence[tuple[str, str]]) -> str:
    """The one object whose name or category says it has drawers (`_HAS_DRAWERS`), for a
    drawer named without its furniture."""
    owners = [
        name
        for name, category in objects
        if any(word in f"{name} {category}".lower() for word in _HAS_DRAWERS)
    ]
    if len(owners) != 1:
        raise PhraseError(
            f"{phrase!r}: a drawer of which? things with drawers here: "
            f"{', '.join(owners) or 'none'}; name it ('the top drawer of the cabinet')"
        )
    return owners[0]


def _level(thing: Thing, anchor: Thing) -> str:
    """Which third of `anchor`'s height `thing`'s bottom is in: a drawer's level."""
    height = max(anchor.top - anchor.bottom, 1e-6)
    frac = (thing.bottom - anchor.bottom) / height
    return "top" if frac >= 2 / 3 else "middle" if frac >= 1 / 3 else "bottom"


def _by_side(phrase: str, cands: Sequence[Thing], side: str) -> str:
    """The candidate farthest towards `side` (`SIDE_AXES`); one alone has no side to be on."""
    axis, sign = SIDE_AXES[side]
    ranked = sorted(cands, key=lambda c: -sign * c.center[axis])
    if len(ranked) < 2:
        raise PhraseError(
            f"{phrase!r}: 'the {side} one' needs two or more to choose from; this scene has "
            f"{', '.join(c.name for c in ranked) or 'none'}"
        )
    gap = sign * (ranked[0].center[axis] - ranked[1].center[axis])
    if gap < TIE:
        raise PhraseError(
            f"{phrase!r} fits two equally well: {ranked[0].name} and {ranked[1].name} are "
            f"{gap:.3f} m apart that way; say which"
        )
    return ranked[0].name
