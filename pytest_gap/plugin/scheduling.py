"""The xdist schedule of a benchmark session: one mode after another, a mode's cells in parallel.

Modes run in sequence because they contend for the simulator GPUs and for the shared policy
server (the spec's "Modes run sequentially"); within a mode, the trials of every cell run in
parallel, each cell still bounded by its own `num_workers` slots (pytest_gap/throttle.py). A
*phase* is one `<yaml>::<mode>[@<policy_id>]` group of the collection (suites mode: its one
`suites` group, so suite cells run concurrently), in collection order.

`ModePhaseScheduling` implements xdist's `Scheduling` protocol (xdist/scheduler/protocol.py):
- it hands out trials phase by phase, in collection order, and never queues an earlier phase's
  trial behind a later one on a worker (the worker would wait for itself);
- a worker that needs work takes the next seed of the task it ran last (its env is pooled, its
  workflow produced), else a task nobody has started, else, at a phase's tail, the next seed of
  the task with the most seeds left (stealing from the worker on it); work stays here until a
  worker needs it, so an idle worker never waits behind another's queue;
- the trials of a cell gated sequentially go out block by block (Cell.blocks): a trial of a
  later block only once every trial of the earlier ones has been handed out, so the gate's
  next look comes as early as the workers allow (a worker still keeps to its task within a
  block);
- a worker that dies gives its queued trials back (its running one is xdist's crash item), so a
  SIGKILLed worker neither hangs the session nor loses trials (the reason xdist's loadscope,
  which keeps scopes whole but stalls after a crash, was not used).

xdist's worker runs an item only once it knows the next one (or is shut down), so the last
trial of a phase on a worker needs a successor queued: the next phase's first trial. That one
waits, before it starts and off its watchdog, until the controller's `PhaseGate` says every
earlier phase is complete (`wait_for_phase`, called by the worker role's `wait_turn` before
its trial runs: worker.py). So the schedule is strict: a worker left with nothing of the
current phase (fewer trials than workers) idles until the next phase opens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
from xdist.report import report_collection_diff

from pytest_gap import ids

# A trial of a cell gated sequentially: ((its YAML, its cell's key), its block).
Turn = tuple[tuple[str, str], int]
# A worker holds the trial it runs and the one it runs next (xdist needs that next one).
QUEUE_DEPTH = 2
POLL_S = 0.1


def phases(collection: Sequence[str], phase_key: Callable[[str], str] = ids.phase_of) -> list[int]:
    """Each item's phase index: phases numbered in order of first appearance."""
    index: dict[str, int] = {}
    return [index.setdefault(phase_key(n), len(index)) for n in collection]


def ab_phase(nodeid: str, mode: str) -> str:
    """The phase of a trial of an A/B pair (`compare:`): both arms of a mode share one, so
    that their blocks can take turns (`in_turn`) instead of one arm waiting for the other."""
    return f"{ids.path_of(nodeid)}{ids.SEP}{mode}{ids.SEP}ab"


class PhaseGate:
    """Where the controller says which phases are complete: `<directory>/<k>.done` once phases
    0..k all are. Workers read it (`wait_for_phase`); the directory is the session's."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def open_through(self, phase: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{phase}.done").touch()

    def is_open(self, phase: int) -> bool:
        """May a trial of `phase` start: is every earlier phase complete?"""
        return phase == 0 or (self.directory / f"{phase - 1}.done").exists()


def wait_for_phase(gate: PhaseGate, phase: int, poll_s: float = POLL_S) -> float:
    """Block until `phase` may start; returns the seconds waited. Raises if the controller
    went away meanwhile (this process was orphaned), rather than waiting forever."""
    t0, parent = time.monotonic(), os.getppid()
    while not gate.is_open(phase):
        if os.getppid() != parent:
            raise RuntimeError("the session's controller went away while this trial waited")
        time.sleep(poll_s)
    return time.monotonic() - t0


class Node(Protocol):
    """What the scheduler uses of xdist's WorkerController (tests pass a fake)."""

    shutting_down: bool

    def send_runtest_some(self, indices: Sequence[int]) -> None: ...

    def shutdown(self) -> None: ...


class ModePhaseScheduling:
    """xdist's `Scheduling` protocol: phases in sequence, a task's seeds on one worker."""

    def __init__(
        self,
        config: Any,
        log: Any = None,
        *,
        gate: PhaseGate,
        numnodes: int,
        turn_of: Callable[[str], Turn | None] = lambda nodeid: None,
        phase_key: Callable[[str], str] = ids.phase_of,
    ):
        self.config, self.gate, self.numnodes = config, gate, numnodes
        # nodeid -> (its cell, its block) for a trial of a cell gated sequentially, else None
        self.turn_of = turn_of
        self.phase_key = phase_key  # nodeid -> its phase (ab_phase for an A/B pair's trials)
        self.log = log.modephasesched if log is not None else (lambda *a: None)
        self.node2collection: dict[Any, list[str]] = {}
        self.node2pending: dict[Any, list[int]] = {}
        self.node2task: dict[Any, str] = {}  # the task each worker was given last
        self.collection: list[str] | None = None
        self.phase: list[int] = []  # item index -> phase
        self.task: list[str] = []  # item index -> task key
        self.turn: list[Turn | None] = []  # item index -> (cell, block) or None
        self.unsent: list[int] = []  # not handed out yet, in collection order
        self.outstanding: dict[int, set[int]] = {}  # phase -> items not complete
        self.opened = 0  # phases 0..opened-1 are complete (the gate says so)

    # -- the protocol's state ---------------------------------------------------------------------
    @property
    def nodes(self) -> list[Any]:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.collection is None or self.unsent:
            return False
        return all(len(p) < QUEUE_DEPTH for p in self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.unsent) or any(self.node2pending.values())

    # -- events -----------------------------------------------------------------------------------
    def add_node(self, node: Any) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        assert node in self.node2pending
        if self.collection is not None and list(collection) != self.collection:
            self.log(f"{node} collected other items than the first worker; not using it")
            return
        self.node2collection[node] = list(collection)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            collections = list(self.node2collection.values())
            if any(c != collections[0] for c in collections[1:]):
                self._report_collection_diff()
                return
            self.collection = collections[0]
            self.phase = phases(self.collection, self.phase_key)
            self.task = [ids.task_of(n) for n in self.collection]
            self.turn = [self.turn_of(n) for n in self.collection]
            self.unsent = list(range(len(self.collection)))
            for index, phase in enumerate(self.phase):
                self.outstanding.setdefault(phase, set()).add(index)
            if not self.collection:
                return
        self._check_schedule()

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self.node2pending[node].remove(item_index)
        self._done(item_index)
        self._check_schedule()

    def mark_test_pending(self, item: str) -> None:
        """A test to run again (xdist's pytest-rerunfailures support): first in line."""
        assert self.collection is not None
        index = self.collection.index(item)
        self.unsent.insert(0, index)
        self.outstanding.setdefault(self.phase[index], set()).add(index)
        self._check_schedule()

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        raise NotImplementedError("this scheduler never sends a steal request")

    def remove_node(self, node: Any) -> str | None:
        """A worker finished or died: its queued trials go back first in line; the one it was
        running (a crash) is returned to xdist, which reports it (and the controller records it)."""
        pending = self.node2pending.pop(node)
        self.node2task.pop(node, None)
        crashitem = None
        if pending:
            assert self.collection is not None
            crashed = pending.pop(0)
            crashitem = self.collection[crashed]
            self._done(crashed)
            self.unsent[:0] = pending
        self._check_schedule()
        return crashitem

    # -- decisions --------------------------------------------------------------------------------
    def _done(self, index: int) -> None:
        self.outstanding.get(self.phase[index], set()).discard(index)
        while self.opened in self.outstanding and not self.outstanding[self.opened]:
            self.gate.open_through(self.opened)
            self.opened += 1

    def _check_schedule(self) -> None:
        if self.collection is None:
            return
        for node, pending in self.node2pending.items():
            if node.shutting_down:
                continue
            while len(pending) < QUEUE_DEPTH:
                index = self._next_for(node, pending)
                if index is None:
                    break
                self.unsent.remove(index)
                pending.append(index)
                self.node2task[node] = self.task[index]
                node.send_runtest_some([index])
        if not self.unsent:
            # Nothing left to hand out: a worker's last trial runs once it is told so.
            for node, pending in self.node2pending.items():
                if len(pending) < QUEUE_DEPTH and not node.shutting_down:
                    node.shutdown()

    def _next_for(self, node: Any, pending: list[int]) -> int | None:
        """The trial `node` takes next, or None: never one of an earlier phase than a trial it
        holds (it would wait behind that trial's gate, which waits for it)."""
        floor = max((self.phase[i] for i in pending), default=0)
        candidates = [i for i in self.unsent if self.phase[i] >= floor]
        if not candidates:
            return None
        phase = min(self.phase[i] for i in candidates)
        candidates = in_turn([i for i in candidates if self.phase[i] == phase], self.turn)
        mine = self.node2task.get(node)
        for index in candidates:  # the next seed of its own task: the env is warm
            if self.task[index] == mine:
                return index
        taken = {self.node2task.get(n) for n in self.node2pending if n is not node}
        for index in candidates:  # a task no worker is on
            if self.task[index] not in taken:
                return index
        left: dict[str, int] = {}
        for index in candidates:  # the tail: help the task with the most seeds left
            left[self.task[index]] = left.get(self.task[index], 0) + 1
        busiest = max(left, key=lambda t: left[t])
        return next(i for i in candidates if self.task[i] == busiest)

    def _report_collection_diff(self) -> None:
        (first, col), *others = self.node2collection.items()
        for node, collection in others:
            msg = report_collection_diff(col, collection, first.gateway.id, node.gateway.id)
            if msg:
                self.log(msg)
                report = _collect_report(node.gateway.id, msg)
                self.config.hook.pytest_collectreport(report=report)


def in_turn(candidates: list[int], turn: Sequence[Turn | None]) -> list[int]:
    """The `candidates` whose turn it is: every one outside a block, and of each sequentially
    gated cell those of its earliest block still among them."""
    earliest: dict[tuple[str, str], int] = {}
    for index in candidates:
        if turn[index] is not None:
            cell, block = turn[index]
            earliest[cell] = min(earliest.get(cell, block), block)
    return [i for i in candidates if turn[i] is None or turn[i][1] == earliest[turn[i][0]]]


def _collect_report(nodeid: str, msg: str):
    return pytest.CollectReport(nodeid=nodeid, outcome="failed", longrepr=msg, result=[])
