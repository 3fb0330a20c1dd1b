"""The test tiers themselves (tests/tiers.py, tests/tripwire.py, tests/sim_guard/, tests/needs.py):
the marker rule on sample tests, the tripwire on a stand-in MuJoCo, and what a missing outside
requirement does under CI and outside it."""

from __future__ import annotations

import json
import subprocess
import types

import pytest

from pytest_gap.sim.libero import make_env
from tests import needs, tiers
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
        (_sample_logic, None),
    ],
)
def test_the_rule_reads_the_tier_from_what_a_test_runs(sample, tier):
    assert tiers.tier_of(_item(sample)) == tier


def test_this_module_is_in_the_fast_tier(request):
    """It names make_env (in a sample), yet no test of it calls a sample that builds one."""
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
