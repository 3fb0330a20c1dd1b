"""What a user is told when a session cannot do what was asked, and how many workers it starts.

Real sessions on the fake backend (tests/fake_backend.py): `gap benchmark` and `pytest` as a user
runs them, with real managed policy servers and real xdist workers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pytest_gap.policies.manager import PolicyUnreachable, free_port, preflight
from pytest_gap.workers import capacity_warning, fit_workers
from tests.fake_session import BACKEND, FakeSession

GAP = str(Path(sys.executable).with_name("gap"))
pytest_plugins = ["pytester"]


@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


def _grid(fake: FakeSession, *, seeds=(1,), policies: dict | None = None) -> Path:
    """A grid of trials that succeed (fake/easy task 0, `seeds`): the policy_only mode on the
    `policies` when given, else the workflow mode on the session's `wf`."""
    block = {
        "backend": BACKEND,
        "families": ["fake"],
        "variations": ["easy"],
        "task_ids": [0],
        "seeds": list(seeds),
        "num_workers": 1,
        "output_dir": "runs",
    }
    if policies:
        block |= {
            "modes": ["policy_only"],
            "policies": list(policies),
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        }
    else:
        block |= {"modes": ["workflow"], "mode_overrides": {"workflow": {"workflow_dir": "wf"}}}
    return fake.config({"benchmark": block, **({"policies": policies} if policies else {})})


def _processes(fake: FakeSession) -> int:
    """The pytest processes the session ran (controller and workers; fake_conftest's record)."""
    return len(fake.modules.read_text().splitlines())


# -- why a session stopped ------------------------------------------------------------------------
def test_preflight_names_an_unreachable_server_and_its_cause_once():
    port = free_port()  # nothing listens there
    url = f"ws://127.0.0.1:{port}"
    with pytest.raises(PolicyUnreachable) as info:
        preflight({"ghost": (url, "openpi")}, timeout_s=2)
    message = str(info.value)
    assert "\n" not in message
    assert message.count(url) == 1 and message.count("start it") == 1, message
    assert "ConnectionRefusedError" in message and "policies.ghost.url" in message


def test_gap_benchmark_says_why_a_policy_server_did_not_start(fake):
    """A managed server that exits before listening errors its cells (an infrastructure
    failure, exit 1 under --gate); gap's own last lines say why, not only the gate's
    "errored cells"."""
    config = _grid(fake, policies={"a": {"command": [sys.executable, "-c", "exit(3)"]}})
    out = fake.pytester.run(GAP, "benchmark", str(config), "--gate", timeout=120)
    assert out.ret == 1
    errors = out.stderr.str().strip().splitlines()
    assert len(errors) == 1, errors
    assert errors[0].startswith("gap: errored policy_only@a fake/easy: ")
    assert "the server exited with status 3 before listening" in errors[0]


def test_gap_benchmark_says_why_a_session_scored_nothing(fake):
    """Every trial's setup failed (a broken fixture): the session recorded nothing. gap says
    what broke in one line instead of "run it with -v to see why"."""
    config = _grid(fake)
    out = fake.pytester.run(GAP, "benchmark", str(config), timeout=120)
    assert out.ret == 0, out.stdout.str() + out.stderr.str()
    fake.setenv(GAP_FAKE_SETUP_ERROR="0:1")
    out = fake.pytester.run(GAP, "benchmark", str(config), timeout=120)
    errors = out.stderr.str().strip().splitlines()
    assert out.ret == 1 and len(errors) == 1, errors
    assert "scored nothing: " in errors[0] and "-v to see why" not in errors[0]
    assert "RuntimeError: broken fixture for task 0 seed 1" in errors[0]


# -- how many workers ------------------------------------------------------------------------------
def test_workers_never_outnumber_trials_and_warn_beyond_the_machine():
    assert fit_workers(8, 1) == 1 and fit_workers(8, 0) == 1 and fit_workers(2, 5) == 2
    assert capacity_warning(2, cores=4, memory_gb=64) is None
    assert capacity_warning(8, cores=2, memory_gb=64) == (
        "8 trial workers exceed this machine's 2 CPU cores: trials will run slower or be killed "
        "for memory; -n 2 fits"
    )
    warning = capacity_warning(8, cores=16, memory_gb=6.0)
    assert "6.0 GB of available memory (about 2 GB per env)" in warning and "-n 3 fits" in warning


def test_gap_benchmark_starts_one_process_for_one_trial(fake):
    config = _grid(fake)
    out = fake.pytester.run(GAP, "benchmark", str(config), "-n", "8", timeout=120)
    assert out.ret == 0, out.stdout.str() + out.stderr.str()
    assert _processes(fake) == 1  # no xdist: the one trial runs in the session's process


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux)")
def test_pytest_n_starts_no_more_workers_than_planned_trials(fake):
    """Plain `pytest CONFIG -n 3` on two trials, on one core (taskset): the controller fits
    xdist to two workers before it starts any, says so, and warns that two outnumber the core."""
    config = _grid(fake, seeds=(1, 2))
    pytest_cmd = [sys.executable, "-m", "pytest", config.name, "-n", "3", "-p", "no:cacheprovider"]
    result = fake.pytester.run("taskset", "-c", "0", *pytest_cmd, timeout=120)
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "gap: 3 workers asked for 2 planned trials: starting 2" in out
    assert "gap: 2 trial workers exceed this machine's 1 CPU cores" in out
    assert _processes(fake) == 3  # the controller and two workers
