"""Walking an instruction's steps: `next_step` says what to do now, `step_done` moves on.

A reference graph that reads any instruction (examples/workflows/do_task) loops: next_step ->
route on its `action` to pick+place, open_fixture, close_fixture, turn_on, turn_off or push ->
step_done -> next_step, until `done`. A step that fails goes back to next_step, which hands it
out again until it has had `max_attempts`.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from pytest_gap.instruction_references import parse_reference
from pytest_gap.instruction_steps import Step, StepsError, parse_steps
from pytest_gap.instructions import PhraseError, names_every_word, phrase_candidates
from pytest_gap.skills import items, perception
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import SkillFailure, skill


class NextStep(BaseModel):
    action: str  # pick_place, open, close, turn_on, turn_off or push; "" when done
    object: str
    target: str
    relation: str
    description: str
    index: int
    total: int
    done: bool
    # What later steps pick: an open drawer must not hang over it (`open_fixture`'s
    # keep_clear).
    later_picks: list[str] = []


class StepDone(BaseModel):
    index: int
    remaining: int


def _plural(phrase: str) -> bool:
    last = phrase.split()[-1] if phrase.split() else ""
    return len(last) > 3 and last.endswith("s") and not last.endswith("ss")


def _one_object(phrase: str, objects: list[tuple[str, str]]) -> str | None:
    try:
        found = phrase_candidates(phrase, objects, loose=False)
    except PhraseError:
        return None
    return found[0] if len(found) == 1 else None


def expand(step: Step, objects: list[tuple[str, str]]) -> list[Step]:
    """What only the scene can say about a pick_place step's object: "the yellow and white mug"
    is one mug when the scene has one, "alphabet soup and tomato sauce" two items when each
    part names its own object and no object is named by every word; "moka pots" is every moka
    pot. Anything else is left for `pick` to resolve (and to fail on, naming the candidates)."""
    if step.action != "pick_place" or parse_reference(step.object).relation is not None:
        return [step]
    parts = [p for p in re.split(r"\s*,\s*(?:and\s+)?|\s+and\s+", step.object) if p]
    if len(parts) > 1 and not any(names_every_word(step.object, c) for _, c in objects):
        named = [_one_object(p, objects) for p in parts]
        if None not in named and len(set(named)) == len(named):
            return [step.model_copy(update={"object": p}) for p in parts]
    try:
        found = phrase_candidates(step.object, objects, loose=False)
    except PhraseError:  # a swapped-in model the words do not quite name: `pick` grounds it
        return [step]
    if len(found) > 1 and _plural(step.object):
        return [step.model_copy(update={"object": name}) for name in found]
    return [step]


def _plan(ctx: SkillContext) -> list[Step]:
    if "steps" not in ctx.memory:
        try:
            steps = parse_steps(ctx.instruction)
        except StepsError as exc:
            raise SkillFailure(str(exc)) from None
        objects = [(o.name, o.category) for o in ctx.env.scene.objects(include_fixtures=False)]
        ctx.memory["steps"] = [part for step in steps for part in expand(step, objects)]
        ctx.note("steps", steps=[s.describe() for s in ctx.memory["steps"]])
    return ctx.memory["steps"]


def _settled(ctx: SkillContext, step: Step) -> str | None:
    """Why a pick_place step tried before need not be tried again, or None: what it moves is
    already in its container (it fell in while a failed place looked at it), or no camera sees
    it any more (nothing to pick)."""
    if step.action != "pick_place":
        return None
    try:
        if (
            step.relation == "in"
            and items.verify_in_container(ctx, step.object, step.target).inside
        ):
            return f"{step.object} is already in {step.target}"
    except SkillFailure:
        pass
    try:
        perception.locate_box(ctx, perception.ground_name(ctx, step.object))
    except SkillFailure as exc:
        return str(exc)
    return None


@skill
def next_step(ctx: SkillContext, max_attempts: int = 2) -> NextStep:
    """The instruction's next step not yet done (`instruction_steps.parse_steps`): its action
    (pick_place, open, close, turn_on, turn_off, push), object, target and relation; `done`
    when every step is; `later_picks`, what the steps after it pick. A step handed out
    `max_attempts` times without `step_done` is given up (noted) and the next one handed out,
    as is a pick-and-place whose object is already in its container or seen by no camera: the
    goal check after the last step has the final word.
    Fails when the instruction cannot be read."""
    steps = _plan(ctx)
    tries = ctx.memory.setdefault("step_attempts", {})
    index = ctx.memory.get("step_index", 0)
    while index < len(steps):
        step, tried = steps[index], tries.get(index, 0)
        why = "tried too often" if tried >= max_attempts else tried and _settled(ctx, steps[index])
        if not why:
            break
        ctx.note("step passed over", task_step=step.describe(), attempts=tried, reason=why)
        index += 1
        ctx.memory["step_index"] = index
    if index >= len(steps):
        return NextStep(
            action="", object="", target="", relation="", description="", index=index,
            total=len(steps), done=True,
        )  # fmt: skip
    tries[index] = tries.get(index, 0) + 1
    later = [s.object for s in steps[index + 1 :] if s.action == "pick_place"]
    # Where later steps put things: `place` leaves room on a support for what comes after.
    ctx.memory["later_places"] = [
        (s.object, s.target, s.relation) for s in steps[index + 1 :] if s.action == "pick_place"
    ]
    return NextStep(
        later_picks=list(dict.fromkeys(later)),
        action=step.action,
        object=step.object,
        target=step.target,
        relation=step.relation,
        description=step.describe(),
        index=index,
        total=len(steps),
        done=False,
    )


@skill
def step_done(ctx: SkillContext) -> StepDone:
    """Mark the step `next_step` handed out as done; the next call hands out the one after."""
    steps = _plan(ctx)
    index = min(ctx.memory.get("step_index", 0) + 1, len(steps))
    ctx.memory["step_index"] = index
    return StepDone(index=index, remaining=len(steps) - index)
