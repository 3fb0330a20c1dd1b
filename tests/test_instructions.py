"""Reading instructions as people write them, and resolving their phrases against a scene's
object list. Pure text: the table comes from the package's own BDDL files (every task's real
phrasing and objects), no simulator."""

from __future__ import annotations

import pytest

from pytest_gap.instructions import PhraseError, parse_instruction, parse_part, resolve_phrase
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
