"""The plugin's own hooks, from outside: a third-party writer plugin and the repo's conftest.py
join a real pytest session without any change to pytest_gap's modules (on the fake backend,
tests/fake_backend.py: the hooks are the harness's, not the simulator's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.fake_session import GIVE_UP, write_workflow

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# A writer as a third party would ship it: a plain module passed with `-p`.
WRITER = """
import json
import os

import pytest

SEEN = []


@pytest.hookimpl
def pytest_gap_trial_result(config, result, run_dir, replayed):
    SEEN.append(
        {
            "nodeid": result.nodeid,
            "success": result.success,
            "replayed": replayed,
            "on_worker": hasattr(config, "workerinput"),
        }
    )


@pytest.hookimpl
def pytest_gap_write_outputs(config, run_dir, summary, results, benchmark):
    (run_dir / "third_party.json").write_text(
        json.dumps(
            {
                "seen": SEEN,
                "config": str(benchmark.source),
                "gate": summary.gate.line(),
                "cells": [c.key for c in summary.cells],
                "results": sorted(results),
                "summary_tsv_exists": (run_dir / "summary.tsv").is_file(),
                "done_flag_exists": (run_dir / "aaa_done_flag.txt").is_file(),
                "on_worker": hasattr(config, "workerinput"),
            }
        )
    )
"""


def _give_up_config(tmp: Path, output_dir: str) -> dict:
    workflow = write_workflow(tmp / "give_up", GIVE_UP)
    return {
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow"],
            "task_ids": [0],
            "n_seeds": 1,
            "output_dir": output_dir,
            "mode_overrides": {"workflow": {"workflow_dir": str(workflow)}},
        }
    }


def _writer_project(root: Path) -> None:
    """The repo's conftest.py, the third-party writer plugin, the main job
    (benchmarks/grid.yaml) and a second config elsewhere, both of one give-up trial."""
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")
    (root / "gap_writer.py").write_text(WRITER)
    (root / "benchmarks").mkdir()
    main_job = _give_up_config(root, "../benchmark_runs/grid")
    (root / "benchmarks/grid.yaml").write_text(yaml.safe_dump(main_job))
    (root / "elsewhere.yaml").write_text(yaml.safe_dump(_give_up_config(root, "other_runs")))


def _first_session_written(pytester, result) -> tuple[Path, dict, str]:
    """What the third-party writer recorded of the first session over both configs (each
    trial once, on the process that writes outputs; the main job's config and gate): the run
    dir, that record, and the main job's trial node id."""
    assert result.ret == 1, result.stdout.str()  # give_up fails: gate FAIL
    (run_dir,) = (pytester.path / "benchmark_runs/grid").iterdir()
    written = json.loads((run_dir / "third_party.json").read_text())
    nodeid = "benchmarks/grid.yaml::workflow::fake/easy::task00::seed000"
    other = "elsewhere.yaml::workflow::fake/easy::task00::seed000"
    assert sorted(written["seen"], key=lambda s: s["nodeid"]) == [
        {"nodeid": nodeid, "success": False, "replayed": False, "on_worker": False},
        {"nodeid": other, "success": False, "replayed": False, "on_worker": False},
    ]
    assert written["config"] == str(pytester.path / "benchmarks/grid.yaml")
    assert written["gate"].startswith("gate FAIL: success_rate=0.000")
    return run_dir, written, nodeid


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_a_third_party_writer_and_the_repo_conftest_get_every_trial_and_the_summary(pytester):
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    pytester._monkeypatch.setenv("PYTHONPATH", path)  # where the fake backend is
    _writer_project(pytester.path)
    _git(pytester.path, "init", "-q")
    _git(pytester.path, "add", "conftest.py")
    _git(pytester.path, "commit", "-q", "-m", "x")
    commit = _git(pytester.path, "rev-parse", "--short=12", "HEAD")

    result = pytester.runpytest_subprocess(
        "benchmarks", "elsewhere.yaml", "-p", "gap_writer", "-n", "2", timeout=300
    )
    # on the xdist controller, once per trial of the session (both configs')
    run_dir, written, nodeid = _first_session_written(pytester, result)
    assert not written["on_worker"]
    assert written["cells"] == ["workflow/fake/easy"]
    assert written["results"] == ["workflow/fake/easy/task_00/seed_000"]
    # the harness's writers ran before it; the done flag is written after every writer
    assert written["summary_tsv_exists"] and not written["done_flag_exists"]
    assert (run_dir / "aaa_done_flag.txt").is_file()

    # A resumed session replays the record: the writer hears of it, flagged as replayed.
    result = pytester.runpytest_subprocess(
        "benchmarks", "--gap-resume", "-p", "gap_writer", timeout=300
    )
    assert result.ret == 1, result.stdout.str()
    written = json.loads((run_dir / "third_party.json").read_text())
    assert [(s["nodeid"], s["replayed"]) for s in written["seen"]] == [(nodeid, True)]

    # The repo conftest: one line per session of the main job's config, none for the other.
    lines = (pytester.path / "benchmark_runs/history.tsv").read_text().splitlines()
    assert lines[0].split("\t") == [
        "utc_time",
        "commit",
        "config",
        "n_trials",
        "n_success",
        "success_rate",
        "gate",
    ]
    rows = [line.split("\t") for line in lines[1:]]
    assert [row[1:] for row in rows] == [
        [commit, "benchmarks/grid.yaml", "1", "0", "0.000", "FAIL"]
    ] * 2
    assert all(row[0].endswith("+00:00") for row in rows)
    (other_run,) = (pytester.path / "other_runs").iterdir()
    assert json.loads((other_run / "third_party.json").read_text())["cells"] == [
        "workflow/fake/easy"
    ]


def test_a_third_party_writer_and_the_repo_conftest_in_process(pytester):
    """The fast tier's counterpart of the test above: the same hooks in sessions in this
    process, without xdist (a session outside git records `-` for its commit)."""
    pytester._monkeypatch.syspath_prepend(str(TESTS))  # where the fake backend is
    pytester.syspathinsert()  # where the writer is
    _writer_project(pytester.path)

    result = pytester.runpytest_inprocess("benchmarks", "elsewhere.yaml", "-p", "gap_writer")
    run_dir, written, nodeid = _first_session_written(pytester, result)
    assert written["cells"] == ["workflow/fake/easy"]
    assert written["results"] == ["workflow/fake/easy/task_00/seed_000"]
    assert written["summary_tsv_exists"] and not written["done_flag_exists"]
    assert (run_dir / "aaa_done_flag.txt").is_file()

    result = pytester.runpytest_inprocess("benchmarks", "--gap-resume", "-p", "gap_writer")
    assert result.ret == 1, result.stdout.str()
    written = json.loads((run_dir / "third_party.json").read_text())
    assert [(s["nodeid"], s["replayed"]) for s in written["seen"]] == [(nodeid, True)]

    lines = (pytester.path / "benchmark_runs/history.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines[1:]]
    assert [row[1:] for row in rows] == [
        ["-", "benchmarks/grid.yaml", "1", "0", "0.000", "FAIL"]
    ] * 2
    (other_run,) = (pytester.path / "other_runs").iterdir()
    assert json.loads((other_run / "third_party.json").read_text())["cells"] == [
        "workflow/fake/easy"
    ]
