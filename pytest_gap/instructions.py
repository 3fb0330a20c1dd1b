"""Reading a task instruction: which items go into (or onto) which container, and which scene
object a phrase names. Pure text, no simulator, no LLM.

Instructions are read as people write them: "pick up the alphabet soup and place it in the
basket" (LIBERO), "grab alphabet soup and put it into basket" (LIBERO-PRO's paraphrases), "put
the can of tomato sauce on the plate", "pack A, B and C into the basket". Phrases are resolved
against the scene's own object list (names and categories), so "milk carton" finds `milk_1` and
"the basket" finds `red_basket_1` when that is the only basket.

Which object a referring phrase names from where things are ("the bowl between the plate and
the ramekin") is instruction_references.py's; which object stands in for one the scene lacks
(a swapped-in model) is instruction_stand_ins.py's. Both read phrases with the helpers here.
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
ARTICLE = re.compile(r"^(?:the|a|an|some|both)\s+")
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


def plain_phrase(text: str) -> str:
    """The phrase without its edge punctuation, articles and package words ("the can of tomato
    sauce." -> "tomato sauce"): what is matched against the scene's names."""
    text = text.strip(" ,.;")
    for _ in range(2):  # "the can of the soup"
        text = _PACKAGE.sub("", ARTICLE.sub("", text))
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
        items = (
            [plain_phrase(both["a"]), plain_phrase(both["b"])] if both else [plain_phrase(target)]
        )
    else:
        match = _PACK.fullmatch(text)
        if not match:
            return None
        items = [plain_phrase(p) for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", match["items"])]
    return Instruction(
        items=[i for i in items if i],
        container=plain_phrase(match["container"]),
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


def phrase_words(text: str) -> frozenset[str]:
    """The words a phrase (or a name, `red_coffee_mug`) names a thing by, compared as sets."""
    words = re.split(r"[\s_\-]+", plain_phrase(text.lower()))
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
    words = phrase_words(phrase)
    return bool(words) and (
        words <= phrase_words(category) or plain_phrase(phrase.lower()) in SAYINGS.get(category, ())
    )


def _best_overlap(phrase: str, words: frozenset[str], categories: list[str]) -> str | None:
    """The category whose words contain the phrase's or are contained in them, the closest
    overlap winning; None when none does. Raises PhraseError on a tie."""
    scored: dict[str, float] = {}
    for category in categories:
        have = phrase_words(category)
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
    key = re.sub(r"[\s\-]+", "_", plain_phrase(phrase.lower()))
    names = [n for n, _ in objects]
    if key in names:
        return [key]
    categories = list(dict.fromkeys(c for _, c in objects))
    spoken = key.replace("_", " ")
    said = [c for c in categories if c == key or spoken in SAYINGS.get(c, ())]
    words = phrase_words(phrase)
    category = said[0] if len(said) == 1 else _best_overlap(phrase, words, categories)
    if category is None:
        close = difflib.get_close_matches(key, sorted(categories), n=2, cutoff=0.8)
        category = close[0] if len(close) == 1 else None
    if category is None and loose:
        category = _best_overlap(phrase, words - _PACKAGE_WORDS, categories)
        if category is None and words:
            head = phrase_words(phrase.split()[-1])
            nouns = [c for c in categories if head and head <= phrase_words(c)]
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
