"""The LIBERO connector on real scenes: episodes, settle steps, limits, scoring, scene access."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_gap.errors import EpisodeError, SimInputError, VariationError
from pytest_gap.sim.backend import Env
from pytest_gap.sim.libero import EnvOptions, make_env
from pytest_gap.sim.libero_backend import resolve
from pytest_gap.sim.pool import EnvPool
from pytest_gap.sim.variations import Variation
from tests.helpers import drop_into

NOOP = [0, 0, 0, 0, 0, 0, -1]


def _rollout(env, seed, actions, variation=None):
    env.reset(seed, variation=variation)
    qpos = [env.raw.sim.data.qpos.copy()]
    for action in actions:
        env.step(action)
        qpos.append(env.raw.sim.data.qpos.copy())
    return np.array(qpos)


def test_observation_is_8d_state_and_prompt_without_cameras(object_env):
    obs = object_env.reset(0)
    assert obs.images == {}
    assert obs.state.shape == (8,) and obs.state.dtype == np.float32
    assert obs.prompt == "pick up the alphabet soup and place it in the basket"
    np.testing.assert_allclose(obs.state[:3], object_env.scene.gripper().eef_pos, atol=1e-6)
    # Gripper open after the no-op settle steps: fingers symmetric, about 4 cm each.
    assert obs.state[6] > 0.03 and obs.state[7] < -0.03
    assert object_env.steps == 0


def test_settle_steps_are_ten_uncounted_noop_steps():
    with make_env("libero_object", 0, EnvOptions(settle_steps=0, max_steps=12)) as raw_env:
        raw_env.reset(2)
        sunk_z = raw_env.scene.pose("alphabet_soup_1").pos[2]
        for _ in range(10):
            raw_env.step(NOOP)
        manual = raw_env.raw.sim.data.qpos.copy()
        # LIBERO's stored states start objects sunk into the floor; settling lets them pop up.
        assert raw_env.scene.pose("alphabet_soup_1").pos[2] > sunk_z + 0.01
        raw_env.step(NOOP)
        raw_env.step(NOOP)
        with pytest.raises(EpisodeError, match="step limit 12"):
            raw_env.step(NOOP)
    with make_env("libero_object", 0) as env:
        env.reset(2)
        assert env.steps == 0
        assert np.array_equal(env.raw.sim.data.qpos, manual)


def test_step_limit_truncates_and_is_the_suite_protocol_by_default(object_env):
    assert object_env.max_steps == 280
    # Multisampling (4x MSAA) is off unless asked for: it costs a third more per frame.
    assert object_env.raw.sim.model._model.vis.quality.offsamples == 0
    with make_env("libero_object", 0, EnvOptions(max_steps=3, multisample=True)) as env:
        assert env.raw.sim.model._model.vis.quality.offsamples == 4
        env.reset(0)
        results = [env.step(NOOP) for _ in range(3)]
        assert [r.truncated for r in results] == [False, False, True]
        assert results[-1].done and results[-1].steps == 3
        with pytest.raises(EpisodeError):
            env.step(NOOP)
        env.reset(1)  # a reset starts the next episode
        assert env.step(NOOP).steps == 1


@pytest.mark.parametrize(("suite", "task"), [("libero_object", 2), ("libero_goal", 1)])
def test_pooled_env_replays_a_fresh_env_bit_for_bit(suite, task):
    rng = np.random.default_rng(7)
    actions = [np.append(rng.uniform(-1, 1, 6), rng.choice([-1.0, 1.0])) for _ in range(60)]
    variation = resolve("posvar", "basket_swap") if suite == "libero_object" else None
    pool = EnvPool(max_envs=1)
    pooled = pool.get(suite, task)
    _rollout(pooled, 5, actions[:30])  # dirty it: other seed, gripper closed, arm moved
    _rollout(pooled, 9, actions[30:], variation)
    assert pool.get(suite, task) is pooled and pool.stats.reused == 1
    again = _rollout(pooled, 3, actions, variation)
    pool.close()
    with make_env(suite, task) as fresh_env:  # never used before this episode
        fresh = _rollout(fresh_env, 3, actions, variation)
    assert np.array_equal(again, fresh)


def test_pool_is_a_bounded_lru():
    pool = EnvPool(max_envs=1)
    first = pool.get("libero_object", 0)
    second = pool.get("libero_object", 1)
    assert second is not first and len(pool) == 1 and pool.stats.evicted == 1
    with pytest.raises(EpisodeError, match="closed"):
        first.reset(0)
    with pytest.raises(SimInputError):
        pool.get("libero_object", 99)
    assert pool.get("libero_object", 1) is second  # a bad request evicted nothing
    assert pool.get("libero_object", 1, backend="libero") is second  # the default backend
    second.reset(0)  # (Python 3.11's protocol check reads `episode`, which needs one)
    assert isinstance(second, Env)  # what the runner, executor and skills rely on
    pool.close()


def test_success_and_completion_flip_when_target_lands_in_basket(object_env):
    object_env.reset(0)
    assert not object_env.success() and object_env.completion() == 0.0
    result = drop_into(object_env, "alphabet_soup_1", "basket_1")
    assert result.success and result.completion == 1.0 and result.reward == 1.0
    assert object_env.goal_status() == [True]


def test_grocery_packing_gives_partial_credit_per_item(object_env):
    variation = resolve("grocery_packing", "object")
    obs = object_env.reset(0, variation=variation)
    goal = object_env.goal
    items = [p[1] for p in goal]
    assert len(items) == 2  # task 0 packs 2 + 0 % 4 items
    for item in items:
        label = object_env.scene.object(item).category.replace("_", " ")
        assert label in obs.prompt
    first = drop_into(object_env, items[0], "basket_1", dx=-0.03)
    assert not first.success and first.completion == pytest.approx(0.5)
    second = drop_into(object_env, items[1], "basket_1", dx=0.03)
    assert second.success and second.completion == 1.0


def test_scene_access_names_poses_geometry_gripper_and_contacts(object_env):
    object_env.reset(0)
    scene = object_env.scene
    names = {o.name: o.category for o in scene.objects()}
    assert names["basket_1"] == "basket" and names["alphabet_soup_1"] == "alphabet_soup"
    assert len(names) == 7
    soup = scene.pose("alphabet_soup_1")
    lo, hi = scene.world_aabb("alphabet_soup_1")
    assert np.all(lo <= soup.pos) and np.all(soup.pos <= hi)
    assert lo[2] == pytest.approx(0.0, abs=0.005)  # resting on the floor
    ext = scene.extents("alphabet_soup_1")
    assert 0.02 < ext[0] < 0.05 and ext[0] == pytest.approx(ext[1], abs=0.01)
    assert scene.touching("alphabet_soup_1", "floor")
    assert not scene.touching("alphabet_soup_1", "basket_1")
    grip = scene.gripper()
    assert not grip.closed and grip.width > 0.06
    for _ in range(15):
        object_env.step([0, 0, 0, 0, 0, 0, 1])
    assert scene.gripper().closed
    region = scene.region("basket_1_contain_region")
    assert np.linalg.norm(region.pos[:2] - scene.pose("basket_1").pos[:2]) < 0.02
    with pytest.raises(SimInputError, match="this scene has"):
        scene.pose("banana_1")


def test_bad_actions_and_calls_outside_an_episode_raise_one_line_errors():
    env = make_env("libero_object", 1)
    with pytest.raises(EpisodeError, match="reset"):
        env.step(NOOP)
    env.reset(0)
    for bad in ([0, 0, 0], [0, 0, 0, 0, 0, 0, float("nan")], "left", [[1], [1, 2]], np.ones(40)):
        with pytest.raises(SimInputError, match="expected 7 finite numbers") as err:
            env.step(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(SimInputError, match="runs on suite libero_object_swap"):
        env.reset(0, variation=resolve("libero_pro", "object_swap"))
    with pytest.raises(SimInputError, match="unknown camera"):
        make_env("libero_object", 1, EnvOptions(cameras=("topdown",)))
    env.close()


class _BrokenVariation(Variation):
    """Fault injection: a generator that fails after the scene was reset."""

    def perturbation(self, task, seed, scene):
        raise VariationError("injected")


def test_a_failed_reset_leaves_no_episode_behind(object_env):
    object_env.reset(0)
    object_env.step(NOOP)
    broken = _BrokenVariation(family="posvar", variation="all", suite="libero_object")
    with pytest.raises(VariationError):
        object_env.reset(4, variation=broken)
    with pytest.raises(EpisodeError, match="call reset"):
        object_env.step(NOOP)


def test_reset_leaves_the_callers_global_numpy_rng_alone(object_env):
    np.random.seed(123)
    expected = np.random.rand(3)
    np.random.seed(123)
    object_env.reset(5)
    assert np.array_equal(np.random.rand(3), expected)
