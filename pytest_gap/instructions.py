"""Reading a task instruction: which items go into (or onto) which container, and which scene
object a phrase names. Pure text, no simulator, no LLM.

Instructions are read as people write them: "pick up the alphabet soup and place it in the
basket" (LIBERO), "grab alphabet soup and put it into basket" (LIBERO-PRO's paraphrases), "put
the can of tomato sauce on the plate", "pack A, B and C into the basket". Phrases are resolved
against the scene's own object list (names and categories), so "milk carton" finds `milk_1` and
"the basket" finds `red_basket_1` when that is the only basket.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel

DEFAULT_CONTAINER = "basket"

_PICK = r"(?:pick(?:\s+up)?|grab|grasp|take|get|lift|fetch|collect)"
_PLACE = r"(?:place|put|drop|set|move|bring|transfer|stow|leave)"
# Longest first: "on top of" before "on", "into" before "in".
_PREP = r"(?P<prep>into|in\s+to|inside(?:\s+of)?|within|in|onto|on\s+top\s+of|on\s+to|on|atop)"
_PICK_PLACE = re.compile(
    rf"{_PICK}\s+(?P<target>.+?)\s+(?:and|then|,)\s+(?:then\s+)?{_PLACE}(?:\s+(?:it|them))?\s+"
    rf"{_PREP}\s+(?P<container>.+)"
)
_PLACE_ONLY = re.compile(rf"{_PLACE}\s+(?P<target>.+?)\s+{_PREP}\s+(?P<container>.+)")
_PACK = re.compile(rf"pack\s+(?P<items>.+?)\s+{_PREP}\s+(?P<container>.+)")
_ARTICLE = re.compile(r"^(?:the|a|an|some|both)\s+")
# "the can of tomato sauce", "a box of cream cheese": the package word says nothing the
# scene's names do.
_PACKAGE = re.compile(
    r"^(?:(?:can|box|bottle|carton|jar|pack|packet|tub|tin|bag|block|stick|bar|container)"
    r"\s+of\s+)"
)
_STOPWORDS = frozenset({"the", "a", "an", "of", "some", "and"})


class Instruction(BaseModel):
    items: list[str]
    container: str
    relation: Literal["in", "on"] = "in"


class PhraseError(ValueError):
    """A phrase names no scene object, or several; the message names the candidates."""


class NoSuchObject(PhraseError):
    """A phrase names no scene object at all (not several)."""


def _phrase(text: str) -> str:
    text = text.strip(" ,.;")
    for _ in range(2):  # "the can of the soup"
        text = _PACKAGE.sub("", _ARTICLE.sub("", text))
    return text.strip()


def _relation(prep: str) -> Literal["in", "on"]:
    return "on" if prep.startswith(("on", "atop")) else "in"


def parse_instruction(prompt: str) -> Instruction | None:
    """Items, container and relation ("in"/"on") of a pick-and-place or pack instruction; None
    when the text is not one (e.g. "turn on the stove").

    Verbs: pick (up)/grab/take/get/lift ... and place/put/drop/set ...; "put X on Y" alone;
    "pack A, B and C into Y". Articles and package words ("the can of") are dropped."""
    text = re.sub(r"\s+", " ", prompt.strip().rstrip(".!").lower())
    match = _PICK_PLACE.fullmatch(text) or _PLACE_ONLY.fullmatch(text)
    if match:
        target = match["target"]
        # "put both the soup and the sauce in the basket": two items, however "and" is used
        # inside a referring phrase ("the bowl between the plate and the ramekin").
        both = re.fullmatch(r"both\s+(?P<a>.+?)\s+and\s+(?P<b>.+)", target)
        items = [_phrase(both["a"]), _phrase(both["b"])] if both else [_phrase(target)]
    else:
        match = _PACK.fullmatch(text)
        if not match:
            return None
        items = [_phrase(p) for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", match["items"])]
    return Instruction(
        items=[i for i in items if i],
        container=_phrase(match["container"]),
        relation=_relation(match["prep"]),
    )


# What LIBERO's instructions call an asset whose category names its maker or material instead
# ("porcelain_mug" is "the white mug"), read off the suites' instructions next to their goals.
SAYINGS: dict[str, tuple[str, ...]] = {
    "porcelain_mug": ("white mug",),
    "white_yellow_mug": ("yellow and white mug", "yellow white mug"),
    "red_coffee_mug": ("red mug",),
    "chefmate_8_frypan": ("frying pan", "pan"),
}
_SYNONYMS = {"cup": "mug", "skillet": "pan", "frypan": "pan"}
# Words naming a package, not the thing: "the cream cheese box" is the cream cheese.
_PACKAGE_WORDS = frozenset(
    {"box", "can", "carton", "jar", "pack", "packet", "tub", "tin", "bag", "block", "bar"}
)


def _tokens(text: str) -> frozenset[str]:
    words = re.split(r"[\s_\-]+", _phrase(text.lower()))
    # Plurals and digits: "sauces" is a sauce, "bowl_1" is a bowl.
    words = [
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words
    ]
    words = [_SYNONYMS.get(w, w) for w in words]
    return frozenset(w for w in words if w and w not in _STOPWORDS and not w.isdigit())


def names_every_word(phrase: str, category: str) -> bool:
    """Every word of the phrase belongs to the category's name or to what people call it:
    "yellow and white mug" is all white_yellow_mug; "cream cheese box and butter" is not all
    one thing."""
    words = _tokens(phrase)
    return bool(words) and (
        words <= _tokens(category) or _phrase(phrase.lower()) in SAYINGS.get(category, ())
    )


def _best_overlap(phrase: str, words: frozenset[str], categories: list[str]) -> str | None:
    """The category whose words contain the phrase's or are contained in them, the closest
    overlap winning; None when none does. Raises PhraseError on a tie."""
    scored: dict[str, float] = {}
    for category in categories:
        have = _tokens(category)
        if words and have and (words <= have or have <= words):
            scored[category] = len(words & have) / len(words | have)
    if not scored:
        return None
    best = max(scored.values())
    top = [c for c, s in scored.items() if s == best]
    if len(top) > 1:
        raise PhraseError(f"{phrase!r} could be any of {', '.join(sorted(top))}; say which")
    return top[0]


def phrase_candidates(
    phrase: str, objects: Sequence[tuple[str, str]], *, loose: bool = True
) -> list[str]:
    """Every scene object (name, category) a phrase may name, in scene order.

    In order: its exact name; its category; what people call the category (`SAYINGS`: "white
    mug" -> porcelain_mug); a category whose words contain the phrase's or are contained in
    them ("basket" -> red_basket, "milk carton" -> milk), the closest overlap winning; a near
    spelling. With `loose` (a swapped-in model the words do not quite name), then: the same
    without package words ("cream cheese box" -> red_cream_cheese), and the one category with
    the phrase's last noun ("the yellow and white mug" -> red_coffee_mug when it is the only
    mug). Raises PhraseError naming the candidates when no object fits, or several categories
    fit equally well."""
    key = re.sub(r"[\s\-]+", "_", _phrase(phrase.lower()))
    names = [n for n, _ in objects]
    if key in names:
        return [key]
    categories = list(dict.fromkeys(c for _, c in objects))
    spoken = key.replace("_", " ")
    said = [c for c in categories if c == key or spoken in SAYINGS.get(c, ())]
    words = _tokens(phrase)
    category = said[0] if len(said) == 1 else _best_overlap(phrase, words, categories)
    if category is None:
        close = difflib.get_close_matches(key, sorted(categories), n=2, cutoff=0.8)
        category = close[0] if len(close) == 1 else None
    if category is None and loose:
        category = _best_overlap(phrase, words - _PACKAGE_WORDS, categories)
        if category is None and words:
            head = _tokens(phrase.split()[-1])
            nouns = [c for c in categories if head and head <= _tokens(c)]
            category = nouns[0] if len(nouns) == 1 else None
    if category is not None:
        return [n for n, c in objects if c == category]
    spoken = ", ".join(sorted({c.replace("_", " ") for c in categories}))
    raise NoSuchObject(f"no object called {phrase!r} in this scene; it has {spoken}")


def resolve_phrase(phrase: str, objects: Sequence[tuple[str, str]]) -> str:
    """The one scene object (name, category) a phrase names; its name (`phrase_candidates`).
    Raises PhraseError naming the candidates when none or several fit."""
    found = phrase_candidates(phrase, objects)
    if len(found) > 1:
        raise PhraseError(
            f"{phrase!r} is ambiguous here: {', '.join(found)}; name one of them exactly"
        )
    return found[0]


# -- stand-ins ----------------------------------------------------------------------------------
# LIBERO-PRO's object variations swap a task's object for another model and leave the
# instruction as it was: "pick up the book ..." in a scene with a black bowl where the book
# stood. A stand-in of another kind is taken by the spelling of its name only when it is this
# close to the phrase's noun (difflib ratio: "book"/"bowl" 0.50, "book"/"mug" 0.00) ...
STAND_IN_SPELLING = 0.5
# ... and this much closer than any other candidate.
STAND_IN_LEAD = 0.2


class StandIn(BaseModel):
    """The scene object taken for one a phrase names but the scene lacks, and why."""

    name: str
    reason: str


def _named_by(phrases: Sequence[str], objects: Sequence[tuple[str, str]]) -> set[str]:
    """The scene objects the phrases name (each phrase's noun and anchors), those that name
    several included; phrases that name nothing are skipped."""
    names: set[str] = set()
    for phrase in phrases:
        reference = parse_reference(phrase)
        for part in [reference.noun, *reference.anchors]:
            try:
                names.update(phrase_candidates(part, objects))
            except PhraseError as exc:
                if not isinstance(exc, NoSuchObject):  # several fit equally: all are named
                    words = _tokens(part)
                    names.update(n for n, c in objects if words & _tokens(c))
    return names


def _spelling(noun: str, category: str) -> float:
    words = [*_tokens(category), *(w for s in SAYINGS.get(category, ()) for w in _tokens(s))]
    return max((difflib.SequenceMatcher(None, noun, w).ratio() for w in words), default=0.0)


def stand_in(
    phrase: str, objects: Sequence[tuple[str, str]], others: Sequence[str] = ()
) -> StandIn:
    """The movable scene object (name, category) that takes the place of the one `phrase`
    names when the scene has none (`phrase_candidates` finds nothing): a swapped-in model.

    Only objects no other phrase of the instruction (`others`) names can stand in: in "put the
    white mug on the left plate and the yellow and white mug on the right plate", not the
    white mug. Of those, in order: the one of the phrase's kind (its last noun: "the yellow and
    white mug" -> the one mug left); the one object left; the one whose name is spelled
    closest to the phrase's noun (STAND_IN_SPELLING, STAND_IN_LEAD: "book" -> black_bowl over
    white_yellow_mug). Raises PhraseError naming the candidates when several fit as well, and
    what the other phrases name when none is left."""
    taken = _named_by([o for o in others if o != phrase], objects)
    free = [(n, c) for n, c in objects if n not in taken]
    categories = list(dict.fromkeys(c for _, c in free))
    nouns = _tokens(phrase.split()[-1]) if phrase.split() else frozenset()
    kin = [c for c in categories if nouns and nouns <= _tokens(c)]
    if kin:
        chosen, why = kin, f"the only {' '.join(sorted(nouns))} no other phrase names"
    elif len(categories) == 1:
        chosen, why = categories, "the only movable object no other phrase names"
    else:
        noun = next(iter(nouns), "")
        scores = sorted(((_spelling(noun, c), c) for c in categories), reverse=True)
        lead = scores[0][0] - (scores[1][0] if len(scores) > 1 else 0.0) if scores else 0.0
        fits = scores and scores[0][0] >= STAND_IN_SPELLING and lead >= STAND_IN_LEAD
        chosen = [scores[0][1]] if fits else categories
        why = f"the name no other phrase takes spelled closest to {noun!r}"
    found = [n for n, c in free if c in chosen]
    if len(found) == 1:
        return StandIn(name=found[0], reason=why)
    said = f"other phrases name {', '.join(sorted(taken))}" if taken else "none named elsewhere"
    if not found:
        raise PhraseError(f"no object called {phrase!r} in this scene, and none is left: {said}")
    raise PhraseError(
        f"no object called {phrase!r} in this scene, and which one stands in for it is "
        f"ambiguous: {', '.join(found)} ({said}); name one of them"
    )


# -- referring expressions -----------------------------------------------------------------------
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
    text = _ARTICLE.sub("", text)
    center = _CENTER.fullmatch(text)
    if center:
        return Reference(noun=_phrase(center["noun"]), relation="center")
    match = _RELATION.fullmatch(text)
    if not match:
        side = _SIDE.fullmatch(text)
        if side:
            return Reference(noun=_phrase(side["noun"]), relation="side", side=_SIDES[side["side"]])
        return Reference(noun=_phrase(text))
    reference = _related(phrase, _phrase(match["noun"]), match["rel"], match["anchor"])
    return reference.model_copy(update={"negated": bool(match["not"])})


def _related(phrase: str, noun: str, rel: str, anchor: str) -> Reference:
    if rel == "between":
        parts = re.split(r"\s+and\s+", anchor, maxsplit=1)
        if len(parts) != 2:
            raise PhraseError(f"{phrase!r}: 'between' needs two things, 'between A and B'")
        return Reference(noun=noun, relation="between", anchors=[_phrase(p) for p in parts])
    if rel.startswith(("next", "beside", "near", "by", "close")):
        return Reference(noun=noun, relation="next_to", anchors=[_phrase(anchor)])
    drawer = _DRAWER.fullmatch(anchor)
    if drawer:
        return Reference(
            noun=noun,
            relation="in",
            anchors=[_phrase(drawer["anchor"])] if drawer["anchor"] else [],
            level=_LEVELS[drawer["level"]] if drawer["level"] else None,
        )
    relation = "in" if rel.startswith(("in", "inside")) else "on"
    return Reference(noun=noun, relation=relation, anchors=[_phrase(anchor)])


_PART = re.compile(
    r"^(?:the\s+)?(?P<part>[a-z]+)\s+(?:compartment|section|slot)\s+(?:of|in)\s+"
    r"(?:the\s+)?(?P<whole>.+)$"
)


def parse_part(phrase: str) -> tuple[str, str] | None:
    """A named part of a thing: "the back compartment of the caddy" -> ("back", "caddy");
    None when the phrase names no part."""
    match = _PART.fullmatch(re.sub(r"\s+", " ", phrase.strip().lower()))
    return (match["part"], _phrase(match["whole"])) if match else None


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
