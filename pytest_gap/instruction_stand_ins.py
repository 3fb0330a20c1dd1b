"""Stand-ins: the scene object taken for one an instruction names but the scene lacks.
Pure text and the scene's object list (name, category), no simulator, no LLM.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from pydantic import BaseModel

from pytest_gap.instruction_references import parse_reference
from pytest_gap.instructions import (
    SAYINGS,
    NoSuchObject,
    PhraseError,
    phrase_candidates,
    phrase_words,
)

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
                    words = phrase_words(part)
                    names.update(n for n, c in objects if words & phrase_words(c))
    return names


def _spelling(noun: str, category: str) -> float:
    words = [
        *phrase_words(category),
        *(w for s in SAYINGS.get(category, ()) for w in phrase_words(s)),
    ]
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
    nouns = phrase_words(phrase.split()[-1]) if phrase.split() else frozenset()
    kin = [c for c in categories if nouns and nouns <= phrase_words(c)]
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
