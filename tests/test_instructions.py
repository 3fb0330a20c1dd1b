"""Reading instructions as people write them, and resolving their phrases against a scene's
object list. Pure text: the table comes from the package's own BDDL files (every task's real
phrasing and objects), no simulator."""

from __future__ import annotations

import re

import pytest

from pytest_gap.instruction_references import parse_part
from pytest_gap.instruction_stand_ins import stand_in
from pytest_gap.instructions import (
    NoSuchObject,
    PhraseError,
    parse_instruction,
    phrase_candidates,
    resolve_phrase,
)
from pytest_gap.sim import suites

# libero_object and the LIBERO-PRO variants whose instruction names the goal's object (the
# backdoor-trigger suites' goals are a sticker the instruction does not mention).
OBJECT_SUITES = [
    s
    for s in suites.list_suites()
    if s.startswith("libero_object") and "episode" not in s and "trigger" not in s
]


def _problem(task: suites.TaskSpec) -> dict:
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    return robosuite_parse_problem(str(task.bddl_file))


def _cases():
    for suite in OBJECT_SUITES:
        spec = suites.get_suite(suite)
        for task_id in range(spec.n_tasks):
            yield pytest.param(suite, task_id, id=f"{suite}-{task_id}")


@pytest.mark.parametrize(("suite", "task_id"), list(_cases()))
def test_every_libero_object_instruction_resolves_to_its_goal(suite, task_id):
    """The prompt the env shows and the BDDL's own language both name the goal's object and
    container among the scene's objects: LIBERO-PRO's paraphrases ("grab alphabet soup and
    put it into basket") and swapped-in models (bigger_alphabet_soup_1, red_basket_1) too."""
    task = suites.get_task(suite, task_id)
    problem = _problem(task)
    objects = [(n, c) for c, names in problem["objects"].items() for n in names]
    fixtures = [(n, c) for c, names in problem["fixtures"].items() for n in names]
    [(predicate, target, region)] = problem["goal_state"]
    container = max((n for n, _ in objects + fixtures if region.startswith(n)), key=len)
    for prompt in {task.prompt, task.bddl_language}:
        parsed = parse_instruction(prompt)
        assert parsed is not None, prompt
        assert parsed.relation == predicate
        assert [resolve_phrase(i, objects) for i in parsed.items] == [target], prompt
        assert resolve_phrase(parsed.container, objects + fixtures) == container, prompt


@pytest.mark.parametrize(
    ("prompt", "items", "container", "relation"),
    [
        ("grab cream cheese and put into basket", ["cream cheese"], "basket", "in"),
        (
            "Take the can of tomato sauce, then drop it inside the basket.",
            ["tomato sauce"],
            "basket",
            "in",
        ),
        ("get a milk carton and set it on the plate", ["milk carton"], "plate", "on"),
        ("put the wine bottle on top of the cabinet", ["wine bottle"], "cabinet", "on"),
        (
            "put both the alphabet soup and the tomato sauce in the basket",
            ["alphabet soup", "tomato sauce"],
            "basket",
            "in",
        ),
        (
            "pick up the black bowl between the plate and the ramekin and place it on the plate",
            ["black bowl between the plate and the ramekin"],
            "plate",
            "on",
        ),
        (
            "pack the milk, the butter and the ketchup into the basket",
            ["milk", "butter", "ketchup"],
            "basket",
            "in",
        ),
    ],
)
def test_instructions_read_as_people_write_them(prompt, items, container, relation):
    parsed = parse_instruction(prompt)
    assert (parsed.items, parsed.container, parsed.relation) == (items, container, relation)


@pytest.mark.parametrize("prompt", ["turn on the stove", "open the middle drawer", ""])
def test_instructions_that_move_nothing_are_not_read_as_pick_and_place(prompt):
    assert parse_instruction(prompt) is None


SCENE = [
    ("bigger_alphabet_soup_1", "bigger_alphabet_soup"),
    ("red_basket_1", "red_basket"),
    ("milk_1", "milk"),
    ("bbq_sauce_1", "bbq_sauce"),
    ("tomato_sauce_1", "tomato_sauce"),
    ("akita_black_bowl_1", "akita_black_bowl"),
    ("akita_black_bowl_2", "akita_black_bowl"),
]


@pytest.mark.parametrize(
    ("phrase", "name"),
    [
        ("milk carton", "milk_1"),
        ("the basket", "red_basket_1"),
        ("alphabet soup", "bigger_alphabet_soup_1"),
        ("the can of bbq sauce", "bbq_sauce_1"),
        ("tomato sauces", "tomato_sauce_1"),
        ("akita_black_bowl_2", "akita_black_bowl_2"),
    ],
)
def test_phrases_resolve_against_the_scene_names_and_categories(phrase, name):
    assert resolve_phrase(phrase, SCENE) == name


@pytest.mark.parametrize(
    ("phrase", "message"),
    [
        ("sauce", "'sauce' could be any of bbq_sauce, tomato_sauce; say which"),
        ("black bowl", "'black bowl' is ambiguous here: akita_black_bowl_1, akita_black_bowl_2"),
        ("cookies", "no object called 'cookies' in this scene; it has akita black bowl, bbq"),
    ],
)
def test_a_phrase_that_fits_none_or_several_names_the_candidates(phrase, message):
    with pytest.raises(PhraseError) as failure:
        resolve_phrase(phrase, SCENE)
    assert message in str(failure.value)
    assert "\n" not in str(failure.value)


@pytest.mark.parametrize(
    ("phrase", "part"),
    [
        ("back compartment of the caddy", ("back", "caddy")),
        ("the left  compartment in the desk caddy", ("left", "desk caddy")),
        ("caddy", None),
        ("top of the cabinet", None),
    ],
)
def test_a_named_part_of_a_thing_is_read(phrase, part):
    assert parse_part(phrase) == part


def _swapped_cases():
    """Every pick-and-place step of LIBERO-PRO's object-swap suites whose instruction names an
    object the scene lacks: (suite, task, phrase, scene objects, other phrases, goal objects)."""
    from pytest_gap.instruction_steps import parse_steps

    for suite in suites.list_suites():
        if not suite.endswith("_object"):
            continue
        for task_id in range(suites.get_suite(suite).n_tasks):
            task = suites.get_task(suite, task_id)
            problem = _problem(task)
            objects = [(n, c) for c, names in problem["objects"].items() for n in names]
            steps = parse_steps(task.prompt)
            phrases = [p for s in steps for p in (s.object, s.target) if p]
            goal = {name for predicate in problem["goal_state"] for name in predicate[1:]}
            for step in steps:
                if step.action != "pick_place":
                    continue
                try:
                    phrase_candidates(step.object, objects)
                except NoSuchObject:
                    yield pytest.param(
                        step.object, objects, phrases, goal, id=f"{suite}-{task_id}-{step.object}"
                    )
                except PhraseError:
                    pass


SWAPPED = list(_swapped_cases())


def test_the_swap_suites_have_instructions_naming_objects_their_scenes_lack():
    """libero_10_object: "the book" (a black bowl now), "the yellow and white mug" (a red mug)."""
    assert {case.values[0] for case in SWAPPED} >= {"book", "yellow and white mug"}


@pytest.mark.parametrize(("phrase", "objects", "phrases", "goal"), SWAPPED)
def test_a_stand_in_is_the_goals_object_or_the_failure_names_it_among_the_candidates(
    phrase, objects, phrases, goal
):
    """The goal is read here only to judge the answer: what stands in for a missing object is
    the one the task moves, or the failure says it cannot tell and names that one too."""
    try:
        found = stand_in(phrase, objects, phrases)
    except PhraseError as failure:
        named = set(re.findall(r"[a-z_]+_\d+", str(failure)))
        assert "ambiguous" in str(failure) and goal & named, (failure, goal)
    else:
        assert found.name in goal, found


BOOK_SCENE = [("black_bowl_1", "black_bowl"), ("white_yellow_mug_1", "white_yellow_mug")]
MUG_SCENE = [
    ("porcelain_mug_1", "porcelain_mug"),
    ("red_coffee_mug_1", "red_coffee_mug"),
    ("yellow_plate_1", "yellow_plate"),
    ("yellow_plate_2", "yellow_plate"),
]


@pytest.mark.parametrize(
    ("phrase", "objects", "others", "name", "reason"),
    [
        # The other mug is the white mug the instruction names: the red one is left.
        (
            "yellow and white mug",
            MUG_SCENE,
            ["white mug", "left plate", "yellow and white mug", "right plate"],
            "red_coffee_mug_1",
            "the only mug no other phrase names",
        ),
        # Nothing of its kind: the name spelled closest to the noun ("book" ~ "bowl").
        ("book", BOOK_SCENE, ["book", "back compartment of the caddy"], "black_bowl_1", "'book'"),
        # One movable object no other phrase names.
        (
            "ketchup",
            [("tomato_sauce_1", "tomato_sauce"), ("red_basket_1", "red_basket")],
            ["ketchup", "basket"],
            "tomato_sauce_1",
            "the only movable object",
        ),
    ],
)
def test_an_object_the_scene_lacks_is_the_one_standing_in_for_it(
    phrase, objects, others, name, reason
):
    found = stand_in(phrase, objects, others)
    assert found.name == name and reason in found.reason


@pytest.mark.parametrize(
    ("phrase", "objects", "others", "candidates"),
    [
        # Two mugs, neither named elsewhere: which is "the yellow and white mug" is a guess.
        (
            "yellow and white mug",
            MUG_SCENE[:2],
            ["microwave"],
            ["porcelain_mug_1", "red_coffee_mug_1"],
        ),
        # No kin, no name spelled near "pineapple".
        (
            "pineapple",
            [("akita_black_bowl_1", "akita_black_bowl"), ("wine_bottle_1", "wine_bottle")],
            ["plate"],
            ["akita_black_bowl_1", "wine_bottle_1"],
        ),
        # Everything movable is named by another phrase.
        ("book", BOOK_SCENE, ["black bowl", "mug"], []),
    ],
)
def test_a_stand_in_that_is_a_guess_fails_naming_the_candidates(
    phrase, objects, others, candidates
):
    with pytest.raises(PhraseError, match="ambiguous" if candidates else "none is left") as failure:
        stand_in(phrase, objects, others)
    for name in candidates:
        assert name in str(failure.value)
    if not candidates:
        assert "other phrases name black_bowl_1, white_yellow_mug_1" in str(failure.value)
