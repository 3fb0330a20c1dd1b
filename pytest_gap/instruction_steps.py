"""Reading a multi-step task instruction into the steps a robot takes. Pure text: no simulator,
no LLM.

"turn on the stove and put the moka pot on it" is two steps, turn_on(stove) then
pick_place(moka pot, on, stove); "open the top drawer and put the bowl inside" is open(top
drawer) then pick_place(bowl, in, top drawer); "put the white mug on the left plate and the
yellow-white mug on the right plate" is two pick_place steps. A single pick-and-place clause is
read by `instructions.parse_instruction`, so every phrasing it knows works here too.

What the text cannot say is left to whoever sees the scene (the `next_step` skill): whether "the
yellow and white mug" is one mug or two things, and how many "moka pots" there are.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from pytest_gap.instructions import parse_instruction

Action = Literal["pick_place", "open", "close", "turn_on", "turn_off", "push"]
# Where a picked thing goes relative to `target`: into/onto it, or beside it on the table.
Relation = Literal["in", "on", "right_of", "left_of", "front_of", "behind", ""]


class Step(BaseModel):
    """One thing to do. `object` is what is acted on (the item picked, the drawer opened, the
    thing pushed); `target` is where it goes (container/support, or the pushed thing's
    destination), empty for open/close/turn_on/turn_off."""

    action: Action
    object: str
    target: str = ""
    relation: Relation = ""

    def describe(self) -> str:
        if self.action == "pick_place":
            where = self.relation.replace("_", " ")
            return f"put {self.object} {where} {self.target}".strip()
        if self.action == "push":
            return f"push {self.object} to {self.target}"
        return f"{self.action.replace('_', ' ')} {self.object}"


class StepsError(ValueError):
    """The instruction has a clause no step reads; the message quotes it."""


_VERBS = (
    r"put|place|pick|grab|grasp|take|lift|get|set|move|push|slide|shove|open|close|shut|turn|"
    r"switch|drop|stow|bring|transfer|leave|fetch|collect|pack"
)
# Clauses are split at "and"/"then"/"," only where a verb follows: "the yellow and white mug"
# and "between the plate and the ramekin" stay whole.
_SPLIT = re.compile(rf"\s*(?:,\s*)?(?:and\s+then|and|then|,)\s+(?=(?:{_VERBS})\b)")
_SIDE = r"(?P<side>right|left|front|back)"
# "to the right of the plate", "to right" (of whatever the last step put something on).
_BESIDE = re.compile(
    rf"^(?:put|place|set|drop|leave)\s+(?P<object>.+?)\s+(?:to\s+the|to|on\s+the|in)\s+"
    rf"{_SIDE}(?:\s+side)?(?:\s+of\s+(?P<anchor>.+))?$"
)
_BEHIND = re.compile(
    r"^(?:put|place|set|drop|leave)\s+(?P<object>.+?)\s+(?:behind|in\s+front\s+of)\s+"
    r"(?P<anchor>.+)$"
)
_OPEN = re.compile(r"^(?:slide\s+|pull\s+|swing\s+)?(?P<verb>open|close|shut)\s+(?P<object>.+)$")
_OPEN_AFTER = re.compile(
    r"^(?P<verb>slide|pull|push|swing)\s+(?P<object>.+?)\s+(?P<how>open|shut)$"
)
_TURN = re.compile(
    r"^(?:turn|switch)\s+(?:(?P<pre>on|off)\s+(?P<a>.+)|(?P<b>.+?)\s+(?P<post>on|off))$"
)
_PUSH = re.compile(
    r"^(?:push|slide|shove|move)\s+(?P<object>.+?)\s+(?:to(?:wards?)?|until\s+it\s+reaches)\s+"
    r"(?P<target>.+)$"
)
# "put the bowl inside" / "in it" / "there": the container is whatever the last step named.
_PLACE_HERE = re.compile(
    r"^(?:put|place|set|drop|stow|leave)\s+(?P<object>.+?)\s+"
    r"(?P<prep>inside|in(?:\s+it|\s+there)?|into\s+it|on(?:\s+it|\s+top)?|onto\s+it|there)$"
)
_PRONOUN = re.compile(r"^(?:it|them|there|that)$")
_PART_ONLY = re.compile(r"^(?:the\s+)?(?:door|lid|drawer)$")
_BARE_PICK = re.compile(r"^(?:pick(?:\s+up)?|grab|grasp|take|lift|get|fetch)\s+(?P<object>.+)$")
_PLACE_VERB = re.compile(r"^(?:put|place|set|drop|stow|leave|move|bring|transfer)\b")
_PREPS = r"into|inside|in|onto|on\s+top\s+of|on|atop"
# "place white mug on left plate and yellow-white mug on right plate": the second object shares
# the verb of the first.
_SHARED_VERB = re.compile(
    rf"^(?P<first>.+?)\s+and\s+(?P<object>[^,]+?)\s+(?P<prep>{_PREPS}|to)\s+(?P<rest>.+)$"
)


def normalize(prompt: str) -> str:
    """Lower case, one space, no final stop; possessives and LIBERO's "layer of the drawer"
    rewritten to the plain phrases the resolvers read ("the cabinet's middle drawer" -> "the
    middle drawer of the cabinet")."""
    text = re.sub(r"\s+", " ", prompt.strip().rstrip(".!").lower()).replace("\u2019", "'")
    text = re.sub(r"\b(top|middle|bottom)\s+layer\s+of\s+the\s+drawer\b", r"\1 drawer", text)
    text = re.sub(r"\bon\s+the\s+top\s+of\b", "on top of", text)
    # "the cabinet's middle drawer" -> "the middle drawer of the cabinet"; "the stove's front"
    # -> "the front of the stove".
    text = re.sub(
        r"\b(?:the\s+)?([a-z]+)'s\s+((?:top|middle|bottom)\s+drawer|front|back|door|top|left|"
        r"right|[a-z]+\s+compartment)\b",
        r"the \2 of the \1",
        text,
    )
    return text


def _strip_article(text: str) -> str:
    return re.sub(r"^(?:the|a|an)\s+", "", text.strip(" ,.;"))


def _clauses(text: str) -> list[str]:
    parts = [p for p in _SPLIT.split(text) if p]
    merged: list[str] = []
    for part in parts:
        # "pick up the book and place it in the caddy" is one pick-and-place: join a bare pick
        # with the place that follows it.
        if merged and _BARE_PICK.match(merged[-1]) and _PLACE_VERB.match(part):
            merged[-1] = f"{merged[-1]} and {part}"
        else:
            merged.append(part)
    return merged


def _refer(phrase: str, previous: Step | None) -> str:
    """A pronoun or a bare part ("close it", "close the door") names what the last step used:
    its target if it had one (the drawer a bowl went into), else its object (the stove turned
    on)."""
    phrase = _strip_article(phrase)
    if previous is None:
        return phrase
    last = previous.target or previous.object
    if _PRONOUN.match(phrase):
        return last
    if _PART_ONLY.match(phrase):
        part = phrase.split()[-1]
        if part in last.split():  # "... in the bottom drawer and close the drawer"
            return last
        if part in ("door", "lid"):  # "... in the microwave and close the door"
            return f"{part} of the {last}"
    return phrase


def _clause_steps(clause: str, previous: Step | None) -> list[Step]:
    if match := _OPEN.match(clause):
        action = "open" if match["verb"] == "open" else "close"
        return [Step(action=action, object=_refer(match["object"], previous))]
    if match := _OPEN_AFTER.match(clause):
        action = "open" if match["how"] == "open" else "close"
        return [Step(action=action, object=_refer(match["object"], previous))]
    if match := _TURN.match(clause):
        on = (match["pre"] or match["post"]) == "on"
        thing = match["a"] or match["b"]
        return [Step(action="turn_on" if on else "turn_off", object=_refer(thing, previous))]
    if (shared := _SHARED_VERB.match(clause)) and not re.match(_VERBS, shared["object"]):
        try:
            first = _clause_steps(shared["first"], previous)
        except StepsError:  # "put both A and B in C": the "and" joins two items, not clauses
            first = []
        if first and first[-1].action == "pick_place":
            verb = clause.split()[0]
            rest = f"{verb} {shared['object']} {shared['prep']} {shared['rest']}"
            return first + _clause_steps(rest, first[-1])
    if match := _BESIDE.match(clause):
        side = {"right": "right_of", "left": "left_of", "front": "front_of", "back": "behind"}
        anchor = match["anchor"] or (previous.target if previous else "")
        if not anchor:
            raise StepsError(f"{clause!r}: {match['side']} of what? name the object")
        return [
            Step(
                action="pick_place",
                object=_strip_article(match["object"]),
                target=_refer(anchor, previous),
                relation=side[match["side"]],
            )
        ]
    if match := _BEHIND.match(clause):
        relation = "behind" if "behind" in clause.split(match["object"], 1)[1] else "front_of"
        return [
            Step(
                action="pick_place",
                object=_strip_article(match["object"]),
                target=_refer(match["anchor"], previous),
                relation=relation,
            )
        ]
    if (match := _PUSH.match(clause)) and not re.match(r"^(?:on|in)", match["target"]):
        return [
            Step(
                action="push",
                object=_strip_article(match["object"]),
                target=_refer(match["target"], previous),
            )
        ]
    if (match := _PLACE_HERE.match(clause)) and previous is not None:
        relation = "on" if match["prep"].startswith("on") else "in"
        return [
            Step(
                action="pick_place",
                object=_strip_article(match["object"]),
                target=previous.target or previous.object,
                relation=relation,
            )
        ]
    parsed = parse_instruction(clause)
    if parsed is None:
        raise StepsError(
            f"cannot read {clause!r}: say pick/put X in/on Y, open/close X, turn on/off X, "
            "or push X to Y"
        )
    target = _refer(parsed.container, previous)
    return [
        Step(action="pick_place", object=item, target=target, relation=parsed.relation)
        for item in parsed.items
    ]


def parse_steps(prompt: str) -> list[Step]:
    """The steps of an instruction, in order. Raises StepsError quoting a clause it cannot
    read."""
    steps: list[Step] = []
    for clause in _clauses(normalize(prompt)):
        steps += _clause_steps(clause, steps[-1] if steps else None)
    if not steps:
        raise StepsError(f"empty instruction {prompt!r}")
    return steps
