"""The test tiers themselves (tests/tiers.py, tests/tripwire.py, tests/sim_guard/, tests/needs.py):
the marker rule on sample tests, the tripwire on a stand-in MuJoCo, and what a missing outside
requirement does under CI and outside it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import types

import pytest

from pytest_gap.servers.manager import PolicyManager
from pytest_gap.sim.libero import make_env
from tests import needs, tiers, tripwire
from tests.fake_session import BACKEND
from tests.sim_guard import gap_sim_guard


# -- sample tests, classified by the rule (never collected: their names do not start with test)
def _sample_env():
    with make_env("libero_object", 0) as env:
        env.reset(0)


def _sample_libero_session(pytester):
    pytester.makefile(".yaml", bench="suites: [{suite_name: libero_object}]")
    pytester.runpytest_subprocess("bench.yaml")


def _sample_fake_session(pytester):
    config = {"backend": BACKEND, "suites": [{"suite_name": "fake_easy"}]}
    pytester.makefile(".yaml", bench=json.dumps(config))
    pytester.runpytest_subprocess("bench.yaml")


def _sample_gap_command():
    subprocess.run(["gap", "schema"], check=True)


def _sample_script():
    script = "import mujoco\nmujoco.MjModel.from_xml_string('<mujoco/>')"
    subprocess.run(["python", "-c", script], check=True)


def _sample_pytester_run(pytester):
    pytester.run("gap", "schema")


def _sample_api_run():
    from pytest_gap import benchmark

    benchmark.run("bench.yaml")


@contextlib.contextmanager
def _serving():
    server = subprocess.Popen(["gap", "policy", "serve", "hold"])
    yield server
    server.kill()


def _sample_decorated_helper():
    with _serving():
        pass


def _sample_managed_server(tmp_path):
    PolicyManager(log_dir=tmp_path).start_all({})


def _sample_logic():
    assert sorted([2, 1]) == [1, 2]


def _item(fn) -> types.SimpleNamespace:
    fixtures = list(fn.__code__.co_varnames[: fn.__code__.co_argcount])
    return types.SimpleNamespace(obj=fn, fixturenames=fixtures, _fixtureinfo=None)


@pytest.mark.parametrize(
    ("sample", "tier"),
    [
        (_sample_env, tiers.LIBERO),
        (_sample_libero_session, tiers.LIBERO),
        (_sample_script, tiers.LIBERO),
        (_sample_fake_session, tiers.SLOW),
        (_sample_gap_command, tiers.SLOW),
        (_sample_pytester_run, tiers.SLOW),
        (_sample_api_run, tiers.SLOW),
        (_sample_decorated_helper, tiers.SLOW),
        (_sample_managed_server, tiers.SLOW),
        (_sample_logic, None),
    ],
)
def test_the_rule_reads_the_tier_from_what_a_test_runs(sample, tier):
    assert tiers.tier_of(_item(sample)) == tier


def test_the_fast_tier_command_leaves_out_both_simulator_and_process_tests():
    """`-m "not libero"` is the fast tier: a process test carries `libero` too."""
    assert tiers.MARKERS[tiers.LIBERO] == (tiers.LIBERO,)
    assert set(tiers.MARKERS[tiers.SLOW]) == {tiers.LIBERO, tiers.SLOW}


def test_these_logic_tests_are_in_the_fast_tier(request):
    """The module names make_env (in a sample), yet this test calls no sample that builds one."""
    assert not {m.name for m in request.node.iter_markers()} & {tiers.LIBERO, tiers.SLOW}


# -- the tripwire, on a stand-in for the mujoco module
def _stand_in_mujoco() -> types.ModuleType:
    class MjModel:
        @staticmethod
        def from_xml_string(xml):
            return ("model", xml)

        @staticmethod
        def from_xml_path(path):
            return ("model", path)

        @staticmethod
        def from_binary_path(path):
            return ("model", path)

    module = types.ModuleType("mujoco")
    module.MjModel = MjModel
    return module


def test_an_armed_process_cannot_build_a_model_and_says_which_test_did(tmp_path, monkeypatch):
    mujoco = _stand_in_mujoco()
    gap_sim_guard.patch_mujoco(mujoco)
    gap_sim_guard.patch_mujoco(mujoco)  # once only, however often it is asked
    assert mujoco.MjModel.from_xml_string.__wrapped__("<a/>") == ("model", "<a/>")
    monkeypatch.delenv(gap_sim_guard.ENV, raising=False)
    assert mujoco.MjModel.from_xml_string("<a/>") == ("model", "<a/>")  # not armed: builds
    log = tmp_path / "trips.jsonl"
    monkeypatch.setenv(gap_sim_guard.ENV, str(log))
    with pytest.raises(gap_sim_guard.SimulatorForbidden, match="not marked `libero`"):
        mujoco.MjModel.from_binary_path("scene.mjb")
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["built"] == "mujoco.MjModel.from_binary_path"


# -- the tripwire on processes
def _start_python(env: dict[str, str]) -> None:
    guard = str(tripwire.GUARD_DIR)
    env = {**os.environ, gap_sim_guard.NO_PROCESS: "1", **env, "PYTHONPATH": guard}
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)


def test_a_python_process_a_test_starts_records_itself_one_a_session_starts_does_not(
    tmp_path, request
):
    assert {tiers.LIBERO, tiers.SLOW} <= {m.name for m in request.node.iter_markers()}
    session_log = tmp_path / gap_sim_guard.SESSION_LOG
    test_log = tmp_path / "tests_test_x.py.jsonl"
    _start_python({gap_sim_guard.ENV: str(session_log)})  # as an xdist worker starts
    assert not session_log.exists()
    _start_python({gap_sim_guard.ENV: str(test_log)})
    (record,) = [json.loads(line) for line in test_log.read_text().splitlines()]
    assert record["started"][:3] == [sys.executable, "-c", "pass"]
    _start_python({gap_sim_guard.ENV: ""})  # not armed
    _start_python({gap_sim_guard.ENV: str(test_log), gap_sim_guard.NO_PROCESS: ""})  # `-m slow`
    assert len(test_log.read_text().splitlines()) == 1


def _marked(*names: str) -> types.SimpleNamespace:
    marks = [types.SimpleNamespace(name=name) for name in names]
    return types.SimpleNamespace(iter_markers=lambda: marks)


@pytest.mark.parametrize(
    ("selected", "simulator", "processes"),
    [
        ([(), ("libero",), ("libero", "slow")], False, False),  # the full tier
        ([(), ("images",)], True, True),  # the fast tier, whatever else is selected
        ([("libero", "slow"), ()], True, False),  # `-m slow`, or fast and process tests
        ([("images", "libero")], False, False),  # `-m images`: simulator tests
        ([("libero",)], False, False),
        ([], True, True),
    ],
)
def test_what_the_selected_tests_forbid(selected, simulator, processes):
    forbid = tripwire.forbidden([_marked(*names) for names in selected])
    assert (forbid.simulator, forbid.processes) == (simulator, processes)


def _watched_item(tmp_path) -> types.SimpleNamespace:
    item = types.SimpleNamespace(nodeid="tests/test_x.py::test_y", stash=pytest.Stash())
    tripwire.watch(tmp_path, item)
    return item


def test_the_tripwire_fails_a_test_that_built_a_simulator_or_started_a_process(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(gap_sim_guard.ENV, "")
    quiet = _watched_item(tmp_path)
    tripwire.check(quiet)  # nothing recorded: passes
    started = _watched_item(tmp_path)
    log = os.environ[gap_sim_guard.ENV]
    with open(log, "a") as trips:
        trips.write(json.dumps({"pid": 1, "started": ["python", "-m", "gap"]}) + "\n")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)started a Python process.*started:.*gap"):
        tripwire.check(started)
    built = _watched_item(tmp_path)  # a later test of the module reads from its own start
    tripwire.check(built)
    with open(log, "a") as trips:
        trips.write(json.dumps({"pid": 2, "built": "mujoco.MjModel.from_xml_path"}) + "\n")
        trips.write(json.dumps({"pid": 2, "started": ["python"]}) + "\n")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)builds one.*built:.*from_xml_path"):
        tripwire.check(built)
    cut = _watched_item(tmp_path)  # a process killed while it wrote: still a trip
    with open(log, "a") as trips:
        trips.write('{"pid": 3, "started": ["python", "-c", "imp\n')
    with pytest.raises(pytest.fail.Exception, match=r"(?s)started:.*imp"):
        tripwire.check(cut)


# -- outside requirements
def test_a_missing_requirement_skips_outside_ci_and_fails_under_it(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        needs.missing("no chromium")
    for value in ("1", "true", "yes"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.fail.Exception, match=r"no chromium \(CI is set"):
            needs.missing("no chromium")
    for value in ("", "0", "false"):
        monkeypatch.setenv("CI", value)
        assert not needs.in_ci()
