"""The benchmark session's xdist scheduler (pytest_gap/plugin/scheduling.py): its decisions with
fake nodes and no processes, as xdist tests its own schedulers; then real sessions on the fake
backend (tests/fake_backend.py): modes do not interleave, and a SIGKILLed worker neither hangs
the session nor loses trials."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from pytest_gap.ids import task_of
from pytest_gap.plugin.scheduling import ModePhaseScheduling, PhaseGate, phases
from tests.fake_session import CONFTEST, FakeSession

pytest_plugins = ["pytester"]


class FakeNode:
    """What the scheduler sees of an xdist WorkerController: what it was sent."""

    def __init__(self, name: str):
        self.name, self.sent, self.shutting_down = name, [], False

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.name


def ids(mode_tasks: dict[str, dict[str, int]]) -> list[str]:
    """Trial node ids: {mode: {cell: n_tasks}}, two seeds per task, in collection order."""
    out = []
    for mode, cells in mode_tasks.items():
        for cell, n_tasks in cells.items():
            for task in range(n_tasks):
                out += [f"b.yaml::{mode}::{cell}::task{task:02d}::seed{s:03d}" for s in range(2)]
    return out


def started(collection, n_nodes, tmp_path):
    sched = ModePhaseScheduling(None, gate=PhaseGate(tmp_path), numnodes=n_nodes)
    nodes = [FakeNode(f"gw{i}") for i in range(n_nodes)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    assert sched.collection_is_completed
    sched.schedule()
    return sched, nodes


def complete(sched, node, n=1):
    for _ in range(n):
        sched.mark_test_complete(node, sched.node2pending[node][0])


def test_phases_are_modes_in_collection_order():
    collection = ids({"a": {"f/x": 1}, "b@p1": {"f/x": 1}, "b@p2": {"f/x": 1}})
    collection += ["b.yaml::suites::s1::task00::seed000", "tests/test_x.py::test_y"]
    assert phases(collection) == [0, 0, 1, 1, 2, 2, 3, 4]
    assert task_of(collection[1]) == "b.yaml::a::f/x::task00"


def test_a_mode_runs_to_its_end_before_the_next_one_starts(tmp_path):
    collection = ids({"a": {"f/x": 2, "f/y": 1}, "b": {"f/x": 2}})  # a: items 0-5, b: 6-9
    sched, (n0, n1) = started(collection, 2, tmp_path)
    # Each worker takes a whole task of mode a: both seeds, so its env is reused.
    assert (n0.sent, n1.sent) == ([0, 1], [2, 3])
    complete(sched, n0)  # n0 ran seed 0 of task 0: it takes the next task nobody is on
    assert n0.sent == [0, 1, 4]
    complete(sched, n1)
    assert n1.sent == [2, 3, 5]  # the tail of mode a: n1 takes the other seed of n0's task
    complete(sched, n1)
    # Mode a has nothing left to hand out: n1's last trial of a needs a successor queued, the
    # first of b, which waits at the gate until every trial of a is done.
    assert n1.sent == [2, 3, 5, 6]
    complete(sched, n0, 2)
    assert n0.sent == [0, 1, 4, 8, 9]  # a task of b nobody is on, then its other seed
    assert not PhaseGate(tmp_path).is_open(1)  # item 5 of a still runs on n1
    complete(sched, n1)
    assert PhaseGate(tmp_path).is_open(1)  # all of a done: b may start
    assert n1.sent == [2, 3, 5, 6, 7]
    assert not n0.shutting_down and not sched.tests_finished
    complete(sched, n0)
    complete(sched, n1)
    # Nothing left to hand out: each worker is told to run its last trial and stop.
    assert sched.tests_finished and n0.shutting_down and n1.shutting_down


def test_fewer_trials_than_workers_leaves_workers_idle_until_the_next_mode(tmp_path):
    collection = ids({"a": {"f/x": 1}, "b": {"f/x": 3}})  # a: 0-1, b: 2-7
    sched, nodes = started(collection, 4, tmp_path)
    assert [n.sent for n in nodes] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    gate = PhaseGate(tmp_path)
    assert not gate.is_open(1)  # gw1-gw3 hold b's trials, which wait at the gate
    complete(sched, nodes[0], 2)
    assert gate.is_open(1)


def test_a_dead_worker_gives_back_its_queue_and_its_running_trial_is_the_crash(tmp_path):
    collection = ids({"a": {"f/x": 2}, "b": {"f/x": 1}})  # a: 0-3, b: 4-5
    sched, (n0, n1) = started(collection, 2, tmp_path)
    complete(sched, n1)
    assert n1.sent == [2, 3, 4]  # n1 holds b's first trial behind its last of a
    crash = sched.remove_node(n0)  # SIGKILLed while running item 0, item 1 queued
    assert crash == collection[0]
    # Item 1 (mode a) may not go behind n1's trial of b: it waits for a fresh worker.
    assert n1.sent == [2, 3, 4] and sched.unsent == [1, 5]
    assert not sched.tests_finished
    fresh = FakeNode("gw2")
    sched.add_node(fresh)
    sched.add_node_collection(fresh, collection)
    sched.schedule()
    assert fresh.sent == [1, 5]
    complete(sched, n1)
    complete(sched, fresh)
    assert PhaseGate(tmp_path).is_open(1)  # the crash counts as done; item 1 ran on gw2
    complete(sched, n1)
    complete(sched, fresh)
    assert sched.tests_finished and not sched.has_pending


def test_a_crash_of_the_last_worker_leaves_its_trials_pending(tmp_path):
    """With no worker left, its trials stay to hand out: xdist's replacement takes them (or
    xdist stops on its restart limit), never a session that reports done with trials lost."""
    sched, (n0,) = started(ids({"a": {"f/x": 2}}), 1, tmp_path)
    assert sched.remove_node(n0) == "b.yaml::a::f/x::task00::seed000"
    assert sched.unsent == [1, 2, 3] and sched.has_pending and not sched.tests_finished


# -- real sessions ---------------------------------------------------------------------------------
def _times(run_dir):
    out = []
    for path in run_dir.rglob("result.json"):
        record = json.loads(path.read_text())
        start, end = (
            datetime.fromisoformat(record[k]) if record.get(k) else None
            for k in ("started_at", "finished_at")
        )
        out.append((path.relative_to(run_dir).parts[0], start, end, record))
    return out


AGAIN_MODE = """

from pytest_gap.modes import Mode


def pytest_gap_modes(config):
    return [Mode(name="again", producer="prebuilt", description="workflow, a second time")]
"""


@pytest.fixture
def two_modes(pytester):
    """Two modes on the fake backend: `workflow` has 3 trials (one seed of tasks 0-2), `again`
    (a second prebuilt mode, from the session's conftest) has 6 (two seeds each)."""
    session = FakeSession(pytester)
    pytester.makeconftest(CONFTEST.read_text() + AGAIN_MODE)
    session.config(
        {
            "benchmark": {
                "backend": "fake_backend:FakeBackend",
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["workflow", "again"],
                "task_ids": [0, 1, 2],
                "n_seeds": 2,
                "output_dir": "runs",
                "gate_threshold": 0.0,
                "mode_overrides": {
                    "workflow": {"workflow_dir": "wf", "n_seeds": 1},
                    "again": {"workflow_dir": "wf"},
                },
            }
        }
    )
    return session


def test_modes_do_not_interleave_in_an_xdist_session(two_modes):
    result = two_modes.run("bench.yaml", "-n", "2", GAP_TEST_FAKE_STEP_S="0.05")
    assert result.ret == 0, result.stdout.str()
    times = _times(two_modes.run_dir())
    assert len(times) == 9
    first_end = max(end for mode, _, end, _ in times if mode == "workflow")
    second_start = min(start for mode, start, _, _ in times if mode == "again")
    assert first_end <= second_start, sorted(times, key=lambda t: t[1])
    # Within a mode both workers ran trials; a task's seeds mostly stay on one worker (only the
    # tail is shared).
    by_task: dict[int, set[str]] = {}
    for mode, _, _, record in times:
        if mode == "again":
            by_task.setdefault(record["task_id"], set()).add(record["worker"])
    assert len(set().union(*by_task.values())) == 2
    assert sum(len(workers) == 1 for workers in by_task.values()) >= 2, by_task


def test_a_sigkilled_worker_neither_hangs_nor_loses_trials(two_modes):
    # Seed 1 of task 2 (only `again` has seed 1) kills its worker, in the second mode.
    result = two_modes.run("bench.yaml", "-n", "2", GAP_TEST_FAKE_KILL="2:1", timeout=90)
    out = result.stdout.str()
    assert "replacing crashed worker" in out, out
    records = {(m, r["task_id"], r["seed"]): r for m, _, _, r in _times(two_modes.run_dir())}
    assert len(records) == 9, sorted(records)  # every trial recorded: none lost
    killed = records[("again", 2, 1)]
    assert killed["exit_code"] == 137 and killed["infra_failure"]


def test_suites_cells_run_concurrently(pytester):
    """Suites mode is one phase: its cells run side by side, each within its own num_workers."""
    session = FakeSession(pytester)
    session.config(
        {
            "backend": "fake_backend:FakeBackend",
            "trials": {"output_dir": "runs"},
            "suites": [
                {"suite_name": "fake_easy", "task_ids": [0], "seeds": [1, 2], "workflow_dir": "wf",
                 "num_workers": 1},
                {"suite_name": "fake_hard", "task_ids": [1], "seeds": [1, 2], "workflow_dir": "wf",
                 "num_workers": 1},
            ],
            "gate_threshold": 0.0,
        }
    )  # fmt: skip
    # 0.5 s a step: a trial takes seconds, above the records' one-second time resolution
    result = session.run("bench.yaml", "-n", "2", GAP_TEST_FAKE_STEP_S="0.5")
    assert result.ret == 0, result.stdout.str()
    spans: dict[str, list] = {"fake_easy": [], "fake_hard": []}
    for _, start, end, record in _times(session.run_dir()):
        spans[record["suite_name"]].append((start, end))
    easy, hard = sorted(spans["fake_easy"]), sorted(spans["fake_hard"])
    # the two cells overlap in time; within each, its one slot runs one trial at a time
    assert easy[0][1] > hard[0][0] and hard[0][1] > easy[0][0], spans
    assert easy[0][1] <= easy[1][0] and hard[0][1] <= hard[1][0], spans
