"""Generated families: deterministic, physically valid, and each changes only what it says."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pytest_gap.errors import SimInputError
from pytest_gap.sim.libero_backend import resolve
from pytest_gap.sim.variations import GRID_RECT, grid_cells, list_families
from tests.helpers import MOVING_VARIATIONS, poses, positions

SEEDS = (0, 1, 17)
TOL = 0.006  # settling moves an object a few millimetres at most


def _episode(env, seed, family, variation):
    """Settled xy before and after the variation; heights and orientations must not change."""
    env.reset(seed)
    before = poses(env)
    env.reset(seed, variation=resolve(family, variation))
    after = poses(env)
    for name, (pos, quat) in before.items():
        assert after[name][0][2] == pytest.approx(pos[2], abs=0.003), f"{name} height changed"
        assert abs(np.dot(after[name][1], quat)) > 0.9999, f"{name} orientation changed"
    xy = {n: p[:2] for n, (p, _) in before.items()}
    return xy, {n: p[:2] for n, (p, _) in after.items()}, env.episode.perturbation


def _same(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) < TOL


def _unmoved(base, now, names):
    return [n for n in names if not _same(base[n], now[n])]


@pytest.mark.parametrize("seed", SEEDS)
def test_pos_var_moves_only_the_container_to_a_grid_cell(object_env, seed):
    base, now, pert = _episode(object_env, seed, "posvar", "pos_var")
    others = [n for n in base if n != "basket_1"]
    assert _unmoved(base, now, others) == []
    i, j = pert.details["grid_cell"]
    cell = next((x, y) for r, c, x, y in grid_cells() if (r, c) == (i, j))
    assert _same(now["basket_1"], cell)
    assert not _same(now["basket_1"], base["basket_1"])
    x0, x1, y0, y1 = GRID_RECT
    assert x0 <= cell[0] <= x1 and y0 <= cell[1] <= y1
    assert object_env.episode.prompt == object_env.task.prompt
    assert object_env.goal == (("in", "alphabet_soup_1", "basket_1_contain_region"),)


@pytest.mark.parametrize("seed", SEEDS)
def test_permutation_permutes_item_positions_and_leaves_the_container(object_env, seed):
    base, now, pert = _episode(object_env, seed, "posvar", "permutation")
    assert _same(now["basket_1"], base["basket_1"])
    mapping = pert.details["permutation"]
    assert sorted(mapping) == sorted(mapping.values()) == sorted(n for n in base if n != "basket_1")
    for item, took_place_of in mapping.items():
        assert _same(now[item], base[took_place_of]), item
    assert sum(a != b for a, b in mapping.items()) >= 2


@pytest.mark.parametrize("seed", SEEDS)
def test_basket_swap_exchanges_container_and_exactly_one_object(object_env, seed):
    base, now, pert = _episode(object_env, seed, "posvar", "basket_swap")
    partner = pert.details["swapped_with"]
    assert _same(now["basket_1"], base[partner]) and _same(now[partner], base["basket_1"])
    assert _unmoved(base, now, [n for n in base if n not in ("basket_1", partner)]) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_all_combines_permutation_swap_and_grid(object_env, seed):
    base, now, pert = _episode(object_env, seed, "posvar", "all")
    assert {"permutation", "swapped_with", "grid_cell"} <= set(pert.details)
    i, j = pert.details["grid_cell"]
    cell = next((x, y) for r, c, x, y in grid_cells() if (r, c) == (i, j))
    assert _same(now["basket_1"], cell)
    old_places = list(base.values())
    for item in (n for n in base if n != "basket_1"):  # every item sits on a former place
        assert any(_same(now[item], p) for p in old_places), item


@pytest.mark.parametrize("variation", ["object", "permutation"])
def test_grocery_packing_lists_n_items_in_prompt_and_goal(variation):
    from pytest_gap.sim.libero import make_env

    with make_env("libero_object", 3) as env:  # task 3 packs 2 + 3 % 4 = 5 items
        env.reset(4)
        base = positions(env)
        obs = env.reset(4, variation=resolve("grocery_packing", variation))
        now = positions(env)
        items = [p[1] for p in env.goal]
        assert len(items) == len(set(items)) == 5
        assert env.max_steps == 5 * 280  # what GroceryPacking.step_limit says (--gap-shard)
        assert all(p[0] == "in" and p[2] == "basket_1_contain_region" for p in env.goal)
        assert obs.prompt.startswith("pack the ") and obs.prompt.endswith(" into the basket")
        assert obs.prompt.count(" the ") == 6
        moved = _unmoved(base, now, list(base))
        if variation == "object":
            assert moved == []
        else:
            assert "basket_1" not in moved and len(moved) >= 2
        assert env.completion() == 0.0


@pytest.mark.parametrize(("family", "variation"), MOVING_VARIATIONS)
def test_generated_layouts_are_physically_valid(object_env, family, variation):
    for seed in range(6):
        object_env.reset(seed, variation=resolve(family, variation))
        placed = positions(object_env)
        for _ in range(10):  # things that rest stay put
            object_env.step([0, 0, 0, 0, 0, 0, -1])
        scene = object_env.scene
        for obj in scene.objects():
            lo, _ = scene.world_aabb(obj.name)
            assert lo[2] == pytest.approx(0.0, abs=0.01), f"{obj.name} not on the table"
            assert _same(scene.pose(obj.name).pos[:2], placed[obj.name]), f"{obj.name} moved"
        touching = [(c.a, c.b) for c in scene.contacts() if "floor" not in (c.a, c.b)]
        assert touching == [], f"seed {seed}: objects interpenetrate: {touching}"


def test_libero_and_libero_pro_map_to_package_suites_unchanged(object_env):
    assert resolve("libero", "object").suite == "libero_object"
    assert resolve("libero_pro", "object_swap").suite == "libero_object_swap"
    assert resolve("libero_pro", "object_temp_x0.3").suite == "libero_object_temp_x0.3"
    assert resolve("libero_pro", "goal_lan").suite == "libero_goal_lan"
    object_env.reset(2)
    base = positions(object_env)
    object_env.reset(2, variation=resolve("libero", "object"))
    assert object_env.episode.perturbation is None
    assert _unmoved(base, positions(object_env), list(base)) == []


def test_families_list_every_generated_variation():
    families = list_families()
    assert families["posvar"] == ["pos_var", "permutation", "basket_swap", "all"]
    assert families["grocery_packing"] == ["object", "permutation"]
    assert {"object_swap", "object_lan", "object_object", "object_task"} <= set(
        families["libero_pro"]
    )


@pytest.mark.parametrize(
    ("family", "variation", "needle"),
    [
        ("posvr", "pos_var", "unknown family 'posvr'"),
        ("posvar", "pos-var", "did you mean pos_var"),
        ("libero_pro", "nonsense", "unknown variation 'nonsense' of family libero_pro"),
    ],
)
def test_unknown_family_or_variation_is_a_one_line_error(family, variation, needle):
    with pytest.raises(SimInputError) as err:
        resolve(family, variation)
    assert needle in str(err.value) and "\n" not in str(err.value)


_PROBE = """
import json, hashlib, sys
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.libero_backend import resolve
out = {}
order = [("posvar", "all"), ("posvar", "pos_var"), ("grocery_packing", "permutation")]
seeds = [0, 51]
if sys.argv[1] == "reversed":  # episode order must not matter
    order, seeds = order[::-1], seeds[::-1]
with make_env("libero_object", 4) as env:
    for fam, var in order:
        for seed in seeds:
            env.reset(seed, variation=resolve(fam, var))
            p = env.episode.perturbation
            out[f"{fam}/{var}/{seed}"] = {
                "init": env.episode.init_state, "moves": p.moves, "goal": p.goal,
                "prompt": env.episode.prompt,
                "qpos": hashlib.sha256(env.raw.sim.data.qpos.tobytes()).hexdigest(),
            }
print(json.dumps(out, sort_keys=True))
"""


def test_init_states_and_perturbations_are_identical_across_processes():
    procs = [
        subprocess.Popen([sys.executable, "-c", _PROBE, order], stdout=subprocess.PIPE, text=True)
        for order in ("forward", "reversed")
    ]
    outs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    assert outs[0]["posvar/all/0"]["init"] == 0 and outs[0]["posvar/all/51"]["init"] == 1
    assert outs[0]["posvar/all/0"]["moves"] != outs[0]["posvar/all/51"]["moves"]


def _toy_layout():
    from pytest_gap.sim.variations import Footprint, SceneLayout

    def box(name, xy, half, height):
        return Footprint(
            name=name, category=name, xy=xy, lo=(-half, -half), hi=(half, half), height=height
        )

    objects = {
        "basket": box("basket", (0.0, 0.25), 0.08, 0.14),
        "soup": box("soup", (-0.1, -0.2), 0.03, 0.08),
        "milk": box("milk", (0.1, -0.2), 0.03, 0.3),  # a tall carton
    }
    return SceneLayout(objects=objects, container="basket", camera=(0.9, 0.0, 0.65))


def test_layout_checks_reject_overlap_out_of_reach_and_hidden_targets():
    from pytest_gap.sim.variations import layout_problems

    layout = _toy_layout()
    base = {n: fp.xy for n, fp in layout.objects.items()}
    assert layout_problems(layout, base, ["soup"]) == []
    overlap = dict(base, milk=(-0.08, -0.2))
    assert "soup overlaps milk" in layout_problems(layout, overlap, ["soup"])
    far = dict(base, milk=(0.6, -0.2))
    assert layout_problems(layout, far, ["soup"]) == ["milk out of reach at (0.600, -0.200)"]
    # The front camera looks down steeply: the soup stays visible over the low basket ...
    behind_basket = dict(base, basket=(0.1, 0.0), soup=(-0.15, 0.0))
    assert layout_problems(layout, behind_basket, ["soup"]) == []
    # ... but not behind the tall carton.
    hidden = dict(base, milk=(0.1, 0.0), soup=(-0.1, 0.0))
    assert layout_problems(layout, hidden, ["soup"]) == ["soup hidden behind milk"]


def test_generation_is_a_pure_function_of_its_inputs():
    layout = _toy_layout()
    goal = [("in", "soup", "basket_contain_region")]
    variation = resolve("posvar", "all")
    first = variation.generate(2, 11, layout, goal)
    variation.generate(2, 12, layout, goal)
    assert variation.generate(2, 11, layout, goal) == first
    assert resolve("posvar", "all").generate(3, 11, layout, goal) != first


def _drive_to(env, goal, max_steps=150):
    """Proportional Cartesian control through the env's 7-D action, gripper pointing down."""
    for _ in range(max_steps):
        err = goal - env.scene.gripper().eef_pos
        if np.linalg.norm(err) < 0.008:
            break
        env.step(np.concatenate([np.clip(15 * err, -1, 1), [0, 0, 0, -1]]))
    return float(np.linalg.norm(goal - env.scene.gripper().eef_pos))


def test_the_arm_reaches_the_grid_corners_and_the_reach_boundary():
    from pytest_gap.sim.libero import EnvOptions, make_env
    from pytest_gap.sim.variations import REACH_RADII, ROBOT_BASE_XY, in_reach

    x0, x1, y0, y1 = GRID_RECT
    points = [(x, y) for x in (x0, x1) for y in (y0, y1)]
    for radius in REACH_RADII:
        for degrees in (-22, 0, 22):
            angle = np.deg2rad(degrees)
            rim = np.array(ROBOT_BASE_XY) + radius * np.array([np.cos(angle), np.sin(angle)])
            points.append(tuple(rim))
    assert all(in_reach(x, y) for x, y in points)
    with make_env("libero_object", 0, EnvOptions(max_steps=5000)) as env:
        env.reset(0)
        # A test's hand clears the table, so only the arm's kinematics can get in the way.
        for i, obj in enumerate(env.scene.objects()):
            joint = env.raw.objects_dict[obj.name].joints[-1]
            qpos = env.raw.sim.data.get_joint_qpos(joint).copy()
            qpos[:2] = (1.5 + 0.3 * i, 1.5)
            env.raw.sim.data.set_joint_qpos(joint, qpos)
        env.raw.sim.forward()
        home = np.array([-0.15, 0.0, 0.25])
        for x, y in points:
            for z in (0.17, 0.03):  # above the tallest object; grasp height of a flat box
                _drive_to(env, home)
                assert _drive_to(env, np.array([x, y, z])) < 0.01, (x, y, z)
