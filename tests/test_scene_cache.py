"""The compiled-scene cache: a scene loaded from it is the compiled one, and the cache never
costs a user a scene (damaged entries, unwritable folders, a bound on its size)."""

from __future__ import annotations

import os
import time

import mujoco
import numpy as np
import pytest

from pytest_gap.errors import SimInputError
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.scene_cache import SceneCache, compiled_scenes, scene_cache_from_env

MESH_XML = """
<mujoco>
  <asset><mesh name="m" file="{mesh}"/></asset>
  <worldbody>
    <body pos="0 0 1"><freejoint/><geom type="mesh" mesh="m"/></body>
    <geom type="plane" size="1 1 .1"/>
  </worldbody>
</mujoco>
"""
# A tetrahedron, as a Wavefront OBJ.
TETRA = """v 0 0 0
v .1 0 0
v 0 .1 0
v 0 0 .1
f 1 3 2
f 1 2 4
f 1 4 3
f 2 3 4
"""
MARK_TIMESTEP = 0.0123


@pytest.fixture
def mesh_xml(tmp_path):
    mesh = tmp_path / "tetra.obj"
    mesh.write_text(TETRA)
    return MESH_XML.format(mesh=mesh), mesh


def test_a_second_build_loads_the_stored_scene(tmp_path, mesh_xml):
    xml, _ = mesh_xml
    cache = SceneCache(tmp_path / "cache", 2**30)
    first = cache.model(xml)
    stored = list((tmp_path / "cache").glob("*.mjb"))
    assert len(stored) == 1
    # The stored scene, marked where the XML does not say (its timestep; the XML's is MuJoCo's
    # default), under a new mtime: only a scene loaded from the cache carries the mark.
    marked = mujoco.MjModel.from_binary_path(str(stored[0]))
    assert marked.opt.timestep != MARK_TIMESTEP
    marked.opt.timestep = MARK_TIMESTEP
    mujoco.mj_saveModel(marked, str(stored[0]), None)
    again = cache.model(xml)
    assert again.opt.timestep == MARK_TIMESTEP  # loaded from the cache, not compiled
    assert again.nmeshvert == first.nmeshvert and np.array_equal(again.mesh_vert, first.mesh_vert)


def test_a_changed_mesh_file_is_a_different_scene(tmp_path, mesh_xml):
    xml, mesh = mesh_xml
    cache = SceneCache(tmp_path / "cache", 2**30)
    before = cache.key(xml)
    mesh.write_text(TETRA.replace("v 0 0 .1", "v 0 0 .2"))
    os.utime(mesh, ns=(time.time_ns() + 10**9,) * 2)
    assert cache.key(xml) != before
    assert cache.model(xml).mesh_vert.max() > 0.1  # compiled anew, not the stored scene


def test_a_damaged_entry_is_dropped_and_the_scene_compiled(tmp_path, mesh_xml, monkeypatch):
    xml, _ = mesh_xml
    monkeypatch.chdir(tmp_path)
    cache = SceneCache(tmp_path / "cache", 2**30)
    cache.model(xml)
    entry = cache.path(xml)
    entry.write_bytes(entry.read_bytes()[:100])  # as a crash mid-copy would leave it
    model = cache.model(xml)
    assert model.nmesh == 1
    assert mujoco.MjModel.from_binary_path(str(entry)).nmesh == 1  # stored again, whole
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()  # no litter in the user's folder


def test_an_unwritable_cache_still_gives_the_scene(tmp_path, mesh_xml):
    xml, _ = mesh_xml
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    assert SceneCache(blocker / "scenes", 2**30).model(xml).nmesh == 1


def test_the_cache_is_held_under_its_bound_least_recently_used_first(tmp_path, mesh_xml):
    xml, _ = mesh_xml
    root = tmp_path / "cache"
    probe = SceneCache(root, 2**30)
    probe.model(xml)
    size = probe.path(xml).stat().st_size
    cache = SceneCache(root, int(2.5 * size))  # room for two scenes
    xmls = [xml.replace('pos="0 0 1"', f'pos="0 0 {z}"') for z in (1, 2, 3)]
    for i, text in enumerate(xmls[:2]):
        cache.model(text)
        os.utime(cache.path(text), (1000 + i, 1000 + i))
    cache.model(xmls[0])  # used again: now the most recent
    cache.model(xmls[2])
    kept = {p.name for p in root.glob("*.mjb")}
    assert kept == {cache.path(xmls[0]).name, cache.path(xmls[2]).name}


def test_the_environment_names_the_cache(tmp_path):
    assert scene_cache_from_env({"GAP_SCENE_CACHE": "off"}) is None
    cache = scene_cache_from_env({"GAP_SCENE_CACHE": str(tmp_path), "GAP_SCENE_CACHE_MB": "10"})
    assert cache.root == tmp_path and cache.max_bytes == 10 * 2**20
    default = scene_cache_from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert default.root == tmp_path / "pytest-gap" / "scenes"
    with pytest.raises(SimInputError, match=r"GAP_SCENE_CACHE_MB='lots'.*unset it"):
        scene_cache_from_env({"GAP_SCENE_CACHE_MB": "lots"})


def test_robosuite_compiles_as_before_once_the_env_is_built(tmp_path, mesh_xml):
    from robosuite.utils.binding_utils import MjSim

    xml, _ = mesh_xml
    original = MjSim.__dict__["from_xml_string"]
    with pytest.raises(RuntimeError), compiled_scenes(SceneCache(tmp_path, 2**30)):
        assert MjSim.from_xml_string(xml).model._model.nmesh == 1
        raise RuntimeError("an env constructor that fails")
    assert MjSim.__dict__["from_xml_string"] is original
    assert len(list(tmp_path.glob("*.mjb"))) == 1  # stored while the cache was on


def _rollout(env, actions) -> tuple[np.ndarray, np.ndarray]:
    env.reset(3)
    for action in actions:
        env.step(action)
    image = env.libero_obs()["agentview_image"]
    return env.raw.sim.data.qpos.copy(), image


def test_a_libero_scene_from_the_cache_moves_and_looks_as_the_compiled_one(tmp_path, monkeypatch):
    """Same actions from the same init state: bit-identical joints and pixels, whether the
    scene was compiled (cache off), compiled and stored, or loaded."""
    rng = np.random.default_rng(0)
    actions = [np.concatenate([rng.uniform(-1, 1, 6), [rng.choice([-1.0, 1.0])]]) for _ in range(8)]
    outcomes, loads, stored_inode = [], [], None
    load = mujoco.MjModel.from_binary_path
    monkeypatch.setattr(
        mujoco.MjModel, "from_binary_path", staticmethod(lambda p: loads.append(p) or load(p))
    )
    for setting in ("off", str(tmp_path), str(tmp_path)):
        monkeypatch.setenv("GAP_SCENE_CACHE", setting)
        loads.clear()
        with make_env("libero_object", 1) as env:
            outcomes.append(_rollout(env, actions))
        stored = list(tmp_path.glob("*.mjb"))
        if setting != "off":
            assert len(stored) == 1
            if len(outcomes) == 3:
                # loaded, not compiled: the scene came from the stored file, which is the same
                # file (a store replaces it with a new one), and the load marked it as used
                assert loads == [str(stored[0])]
                assert stored[0].stat().st_ino == stored_inode
                assert stored[0].stat().st_mtime > 1000
            else:  # compiled and stored
                assert loads == []
                stored_inode = stored[0].stat().st_ino
            os.utime(stored[0], (1000, 1000))
    (q0, img0), *rest = outcomes
    for q, img in rest:
        assert np.array_equal(q, q0)
        assert np.array_equal(img, img0)
