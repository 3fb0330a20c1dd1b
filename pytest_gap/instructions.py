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
_STOPWORDS = frozenset({"the", "a", "an", "of", "some"})


class Instruction(BaseModel):
    items: list[str]
    container: str
    relation: Literal["in", "on"] = "in"


class PhraseError(ValueError):
    """A phrase names no scene object, or several; the message names the candidates."""


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


def _tokens(text: str) -> frozenset[str]:
    words = re.split(r"[\s_\-]+", _phrase(text.lower()))
    # Plurals and digits: "sauces" is a sauce, "bowl_1" is a bowl.
    words = [
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words
    ]
    return frozenset(w for w in words if w and w not in _STOPWORDS and not w.isdigit())


def resolve_phrase(phrase: str, objects: Sequence[tuple[str, str]]) -> str:
    """The one scene object (name, category) a phrase names; its name.

    In order: its exact name; its category; a category whose words contain the phrase's or are
    contained in them ("basket" -> red_basket, "milk carton" -> milk), the closest overlap
    winning; a near spelling. Raises PhraseError naming the candidates when none or several fit."""
    key = re.sub(r"[\s\-]+", "_", _phrase(phrase.lower()))
    names = [n for n, _ in objects]
    if key in names:
        return key
    by_category = [n for n, c in objects if c == key]
    if not by_category:
        words = _tokens(phrase)
        scored: dict[str, float] = {}
        for _, category in objects:
            have = _tokens(category)
            if words and have and (words <= have or have <= words):
                scored[category] = len(words & have) / len(words | have)
        if scored:
            best = max(scored.values())
            top = [c for c, s in scored.items() if s == best]
            if len(top) > 1:
                raise PhraseError(f"{phrase!r} could be any of {', '.join(sorted(top))}; say which")
            by_category = [n for n, c in objects if c == top[0]]
        else:
            categories = sorted({c for _, c in objects})
            close = difflib.get_close_matches(key, categories, n=2, cutoff=0.8)
            if len(close) == 1:
                by_category = [n for n, c in objects if c == close[0]]
    if len(by_category) == 1:
        return by_category[0]
    if by_category:
        raise PhraseError(
            f"{phrase!r} is ambiguous here: {', '.join(by_category)}; name one of them exactly"
        )
    spoken = ", ".join(sorted({c.replace("_", " ") for _, c in objects}))
    raise PhraseError(f"no object called {phrase!r} in this scene; it has {spoken}")
