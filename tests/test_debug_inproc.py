"""GAP_PARALLEL_INPROC=1: with one worker, `gap benchmark` (the Python API it uses) runs the
session in the current process, so monkeypatches and breakpoints reach the trials; the run is
marked a debug run in summary.json, the manifest and the gate line."""

from __future__ import annotations

import json
import os

import pytest

from pytest_gap.sim.pool import env_pool
from tests.fake_session import BACKEND, TESTS, FakeSession

pytest_plugins = ["pytester"]


@pytest.fixture
def grid(pytester, monkeypatch):
    fake = FakeSession(pytester)
    monkeypatch.chdir(fake.path)
    monkeypatch.syspath_prepend(str(TESTS))  # the in-process session imports fake_backend here
    config = {
        "benchmark": {
            "backend": BACKEND,
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow"],
            "task_ids": [0],
            "seeds": [1],  # succeeds on the fake backend
            "num_workers": 1,
            "gate_threshold": 0.5,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
        }
    }
    fake.path_config = fake.config(config)
    fake.two_trials = fake.config(
        {"benchmark": {**config["benchmark"], "seeds": [1, 2]}}, "two.yaml"
    )
    return fake


def fake_backend_globals() -> dict:
    """The globals of this process's fake backend (pytest_gap caches one instance per process,
    whose module may be gone from sys.modules): what a trial run here reads GOAL_STEPS from."""
    from pytest_gap.sim.backend import get_backend

    return type(get_backend(BACKEND)).make_env.__globals__


def test_gap_parallel_inproc_runs_the_session_here_as_a_debug_run(grid, monkeypatch):
    from pytest_gap.benchmark import run

    monkeypatch.setitem(fake_backend_globals(), "GOAL_STEPS", 10_000)  # seen by a session here
    monkeypatch.setenv("GAP_PARALLEL_INPROC", "1")
    env_pool().close()  # an env an earlier test pooled in this process would be reused
    summary = run(grid.path_config, quiet=True)
    (env,) = grid.env_records()
    assert env["pid"] == os.getpid()  # no subprocess, no xdist worker
    assert summary.n_trials == 1 and summary.n_success == 0  # the monkeypatch reached the trial
    assert summary.gate_line.endswith(
        "recorded 1/1 planned [debug run: in-process (GAP_PARALLEL_INPROC=1), not for scoring]"
    )
    assert summary.summary["debug_run"] is True and summary.summary["gate"]["debug"] is True
    manifest = json.loads((summary.run_dir / "run_manifest.json").read_text())
    assert manifest["debug_run"] is True and manifest["sessions"][-1]["debug_run"] is True


def test_without_it_or_with_more_workers_the_session_is_a_subprocess(grid, monkeypatch, capfd):
    from pytest_gap.benchmark import run

    monkeypatch.setitem(fake_backend_globals(), "GOAL_STEPS", 10_000)  # a subprocess never does
    summary = run(grid.path_config, quiet=True)
    assert summary.n_success == 1 and summary.summary["debug_run"] is False
    assert "debug run" not in summary.gate_line
    monkeypatch.setenv("GAP_PARALLEL_INPROC", "1")
    again = run(grid.two_trials, quiet=True, workers=2, output_dir="runs2")
    assert again.n_success == 2 and again.summary["debug_run"] is False
    assert "GAP_PARALLEL_INPROC=1 ignored" in capfd.readouterr().err
    pids = {record["pid"] for record in grid.env_records()}
    assert os.getpid() not in pids
