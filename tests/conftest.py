"""Shared fixtures. Envs are real LIBERO and expensive (seconds each): one per module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_gap.sim.gl import ensure_gl_backend
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.scene_cache import scene_cache_from_env
from tests import tiers, tripwire

# Before any test imports LIBERO, robosuite or mujoco directly (reference clients, BDDL parsers):
# mujoco picks its GL backend at import, and unset it picks GLFW, which needs a display.
ensure_gl_backend()

# pytester's in-process sessions drop every module they imported when they end; a session that
# draws plots/ would import matplotlib anew each time while modules imported earlier keep the
# old classes ("Single argument to subplot must be a three-digit integer"). Imported here once,
# it outlives every inner session.
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402

# The sessions the tests start draw no plots/ (0.3-0.5 s each, a few hundred sessions) unless a
# test is about them and unsets this (test_viz.py): as cameras are off unless a test is about
# images. Every session here and in the processes the tests start reads it.
os.environ.setdefault("GAP_NO_PLOTS", "1")

# pytester points HOME at each test's own tmp dir, and the compiled-scene cache lives under HOME
# unless GAP_SCENE_CACHE names it: every pytester session on LIBERO compiled its scenes afresh
# (3-4 s) and wrote each into that tmp dir (about 250 MB). The sessions share the user's cache,
# named here while HOME is still the user's; a test about the cache sets its own.
_scenes = scene_cache_from_env()
if _scenes is not None:
    os.environ.setdefault("GAP_SCENE_CACHE", str(_scenes.root))

# The pytest sessions the tests start load no anyio plugin: with trio installed (selenium's, for
# the browser tests) it imports trio as every session starts, 0.3 s of a 1.2 s fake session;
# nothing here uses it. pytester drops PYTEST_ADDOPTS, so its tests get it back below.
NO_ANYIO = "-p no:anyio"
os.environ.setdefault("PYTEST_ADDOPTS", NO_ANYIO)


@pytest.fixture(autouse=True)
def _sessions_without_anyio(request: pytest.FixtureRequest) -> None:
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # which clears PYTEST_ADDOPTS as it starts
        request.getfixturevalue("monkeypatch").setenv("PYTEST_ADDOPTS", NO_ANYIO)


@pytest.fixture(scope="module")
def object_env():
    """libero_object task 0 (alphabet soup -> basket), no cameras."""
    with make_env("libero_object", 0) as env:
        yield env


_TRIP_LOGS = pytest.StashKey[Path | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_TRIP_LOGS] = None  # armed once the session knows which tests it runs
    # xdist's loadfile hands files out by their number of tests, most first, unless told not to:
    # then the longest files (a few long tests each: the twins, the fault campaign) start last
    # and end the run alone on one worker. The order below is the one to hand out.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# The files that take longest under `--dist loadfile` (docs/testing.md; the junit times of
# a fresh-clone run), handed out first, then the other files that build a simulator, then those
# that start processes, then the rest, which fill the end evenly. A stale entry only changes
# the order.
LONGEST_FIRST = (
    "test_twins.py",
    "test_ray_cluster.py",
    "test_service.py",
    "test_plugin.py",
    "test_faults_campaign.py",
    "test_bench_speed.py",
    "test_scene_determinism.py",
    "test_tutorial_scale_out.py",
    "test_llm.py",
    "test_shard.py",
)


def _handed_out_first(items: list[pytest.Item]):
    """A sort key keeping each file's tests together (module fixtures are built once) and in
    their order: the files of LONGEST_FIRST, then by the costliest tier a file holds."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tier: dict[Path, int] = {}
    for item in items:
        slow, libero = (item.get_closest_marker(m) for m in (tiers.SLOW, tiers.LIBERO))
        cost = 1 if slow else 0 if libero else 2
        tier[item.path] = min(tier.get(item.path, 2), cost)
    return lambda item: (rank.get(item.path.name, len(rank)), tier[item.path])


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.mark(items)
    items.sort(key=_handed_out_first(items))  # stable: order kept within a file


def pytest_collection_finish(session: pytest.Session) -> None:
    """Arm the tripwire for what none of the selected tests may do (tests/tripwire.py)."""
    forbid = tripwire.forbidden(session.items)
    if forbid.simulator:
        session.config.stash[_TRIP_LOGS] = tripwire.arm(session.config, forbid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    logs = item.config.stash[_TRIP_LOGS]
    if logs is not None:  # before any fixture: a module fixture's env is this test's doing
        tripwire.watch(logs, item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """With the tripwire armed, fail a test during which any process built a real simulator
    (even one whose error a harness session turned into an infra-failed trial) or, in the fast
    tier, a Python process started."""
    result = yield
    if item.config.stash[_TRIP_LOGS] is not None:
        tripwire.check(item)
    return result
