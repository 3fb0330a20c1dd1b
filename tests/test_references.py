"""Referring expressions: "the black bowl between the plate and the ramekin" names one object,
read from where things are, never from the `_1` in a name."""

from __future__ import annotations

import pytest

from pytest_gap.instruction_references import (
    Reference,
    Thing,
    parse_reference,
    resolve_reference,
)
from pytest_gap.instructions import PhraseError, parse_instruction
from pytest_gap.sim.libero import EnvOptions, make_env


def _thing(name: str, category: str, center, half=(0.05, 0.05, 0.025)) -> Thing:
    return Thing(name=name, category=category, center=center, half_extents=half)


@pytest.mark.parametrize(
    ("phrase", "reference"),
    [
        ("the black bowl", Reference(noun="black bowl")),
        (
            "the black bowl between the plate and the ramekin",
            Reference(noun="black bowl", relation="between", anchors=["plate", "ramekin"]),
        ),
        (
            "black bowl next to the cookie box",
            Reference(noun="black bowl", relation="next_to", anchors=["cookie box"]),
        ),
        (
            "the bowl beside the plate",
            Reference(noun="bowl", relation="next_to", anchors=["plate"]),
        ),
        ("the black bowl from table center", Reference(noun="black bowl", relation="center")),
        ("the bowl in the center of the table", Reference(noun="bowl", relation="center")),
        (
            "the black bowl on the stove",
            Reference(noun="black bowl", relation="on", anchors=["stove"]),
        ),
        (
            "the bowl on top of the wooden cabinet",
            Reference(noun="bowl", relation="on", anchors=["wooden cabinet"]),
        ),
        (
            "the black bowl in the top drawer of the wooden cabinet",
            Reference(noun="black bowl", relation="in", anchors=["wooden cabinet"], level="top"),
        ),
        (
            "black bowl from the top drawer",
            Reference(noun="black bowl", relation="in", level="top"),
        ),
        ("the bowl in the drawer", Reference(noun="bowl", relation="in")),
    ],
)
def test_references_are_read_into_noun_relation_and_anchors(phrase, reference):
    assert parse_reference(phrase) == reference


def test_the_pick_target_keeps_its_reference_and_and_inside_it():
    parsed = parse_instruction(
        "pick up the black bowl between the plate and the ramekin and place it on the plate"
    )
    assert parsed.items == ["black bowl between the plate and the ramekin"]
    assert (parsed.container, parsed.relation) == ("plate", "on")


BOWLS = [
    _thing("bowl_a", "akita_black_bowl", (0.0, 0.0, 0.93)),
    _thing("bowl_b", "akita_black_bowl", (0.3, 0.0, 0.93)),
]


PLATES = [
    _thing("plate_1", "plate", (0.0, -0.2, 0.905), (0.07, 0.07, 0.005)),
    _thing("plate_2", "plate", (0.1, 0.15, 0.905), (0.07, 0.07, 0.005)),
]


@pytest.mark.parametrize(
    ("phrase", "name"),
    [
        # as the front camera sees it, at +x looking at the robot: its left is -y
        ("the left plate", "plate_1"),
        ("the right plate", "plate_2"),
        ("the rightmost plate", "plate_2"),
        ("the front plate", "plate_2"),  # nearer the camera, at +x
        ("the back plate", "plate_1"),
        ("the far plate", "plate_1"),
    ],
)
def test_a_side_names_the_one_farthest_that_way_as_the_camera_sees_it(phrase, name):
    assert parse_reference(phrase).relation == "side"
    assert resolve_reference(phrase, PLATES) == name
    # The names swapped: the answer moves with the geometry, not with the `_1`.
    swapped = [PLATES[0].model_copy(update={"center": PLATES[1].center}), PLATES[1]]
    swapped[1] = PLATES[1].model_copy(update={"center": PLATES[0].center})
    assert resolve_reference(phrase, swapped) != name


def test_a_side_among_one_or_level_things_says_why():
    with pytest.raises(PhraseError, match=r"needs two or more to choose from; .* plate_1"):
        resolve_reference("the left plate", PLATES[:1])
    level = [PLATES[0], PLATES[1].model_copy(update={"center": (0.1, -0.195, 0.905)})]
    with pytest.raises(PhraseError, match="fits two equally well: plate_1 and plate_2"):
        resolve_reference("the left plate", level)


def test_a_tie_names_both_candidates_and_their_distances():
    things = [*BOWLS, _thing("plate_1", "plate", (0.15, 0.2, 0.905), (0.07, 0.07, 0.005))]
    with pytest.raises(PhraseError, match=r"fits two equally well: bowl_a 0\.250 m, bowl_b"):
        resolve_reference("the black bowl next to the plate", things)


def test_nothing_on_the_anchor_names_the_candidates():
    things = [*BOWLS, _thing("cookies_1", "cookies", (0.0, 0.3, 0.91), (0.04, 0.03, 0.01))]
    with pytest.raises(PhraseError, match=r"0 black bowl\(s\) on cookies_1.*bowl_a, bowl_b"):
        resolve_reference("the black bowl on the cookie box", things)


def test_an_unknown_anchor_says_what_the_scene_has():
    with pytest.raises(PhraseError, match="no object called 'stove' in this scene"):
        resolve_reference("the black bowl on the stove", BOWLS)


def test_the_suffix_does_not_decide():
    # The same scene with the names swapped: the answer moves with the geometry.
    plate = _thing("plate_1", "plate", (0.3, 0.15, 0.905), (0.07, 0.07, 0.005))
    assert resolve_reference("the black bowl next to the plate", [*BOWLS, plate]) == "bowl_b"
    swapped = [
        BOWLS[0].model_copy(update={"center": BOWLS[1].center}),
        BOWLS[1].model_copy(update={"center": BOWLS[0].center}),
        plate,
    ]
    assert resolve_reference("the black bowl next to the plate", swapped) == "bowl_a"


def _scene_things(env) -> list[Thing]:
    things = []
    for obj in env.scene.objects():
        lo, hi = env.scene.world_aabb(obj.name)
        things.append(
            Thing(
                name=obj.name,
                category=obj.category,
                center=tuple((lo + hi) / 2),
                half_extents=tuple((hi - lo) / 2),
            )
        )
    return things


@pytest.mark.parametrize("suite", ["libero_spatial", "libero_spatial_swap"])
def test_every_libero_spatial_reference_names_the_goal_bowl(suite):
    """All ten tasks, three init states each: the bowl the instruction refers to, found from
    where things stand, is the goal's `akita_black_bowl_1`; with the bowls' names traded, it
    is `akita_black_bowl_2`."""
    wrong = []
    for task in range(10):
        with make_env(suite, task, EnvOptions(max_steps=5)) as env:
            for seed in (0, 1, 2):
                obs = env.reset(seed)
                target = parse_instruction(obs.prompt).items[0]
                things = _scene_things(env)
                center = env.raw.workspace_offset[:2]
                got = resolve_reference(target, things, center)
                # The two bowls' boxes traded: the answer must follow the box, not the name.
                by = {t.name: t for t in things}
                one, two = by["akita_black_bowl_1"], by["akita_black_bowl_2"]
                traded = [
                    t.model_copy(update={"name": two.name if t is one else one.name})
                    if t in (one, two)
                    else t
                    for t in things
                ]
                again = resolve_reference(target, traded, center)
                if (got, again) != ("akita_black_bowl_1", "akita_black_bowl_2"):
                    wrong.append((task, seed, target, got, again))
    assert not wrong


CABINET = _thing("wooden_cabinet_1", "wooden_cabinet", (0.0, -0.3, 0.8), (0.1, 0.1, 0.15))


def test_a_drawer_named_alone_is_the_one_of_the_thing_with_drawers():
    # LIBERO-PRO spatial_lan task 4: "take the black bowl from the top drawer"
    in_drawer = _thing("bowl_in", "akita_black_bowl", (0.0, -0.3, 0.91), (0.05, 0.05, 0.025))
    on_table = _thing("bowl_out", "akita_black_bowl", (0.2, 0.1, 0.68), (0.05, 0.05, 0.025))
    things = [CABINET, in_drawer, on_table]
    assert resolve_reference("black bowl from the top drawer", things) == "bowl_in"
    with pytest.raises(PhraseError, match=r"0 black bowl\(s\) in the bottom drawer of wooden"):
        resolve_reference("black bowl from the bottom drawer", things)
    with pytest.raises(PhraseError, match=r"a drawer of which\? .*: none"):
        resolve_reference("black bowl from the top drawer", [in_drawer, on_table])
    second = CABINET.model_copy(update={"name": "white_cabinet_1", "category": "white_cabinet"})
    with pytest.raises(PhraseError, match=r"wooden_cabinet_1, white_cabinet_1"):
        resolve_reference("black bowl from the top drawer", [*things, second])


def test_not_between_names_the_other_one():
    # LIBERO-PRO spatial_task: "the akita black bowl not between the plate and the ramekin"
    things = [
        *BOWLS,
        _thing("plate_1", "plate", (-0.1, 0.0, 0.905), (0.07, 0.07, 0.005)),
        _thing("ramekin_1", "glazed_rim_porcelain_ramekin", (0.1, 0.0, 0.91)),
    ]
    phrase = "the black bowl not between the plate and the ramekin"
    assert parse_reference(phrase).negated
    assert resolve_reference("the black bowl between the plate and the ramekin", things) == "bowl_a"
    assert resolve_reference(phrase, things) == "bowl_b"
    third = _thing("bowl_c", "akita_black_bowl", (-0.3, 0.2, 0.93))
    with pytest.raises(PhraseError, match=r"2 black bowl\(s\) fit once bowl_a is left out"):
        resolve_reference(phrase, [*things, third])
