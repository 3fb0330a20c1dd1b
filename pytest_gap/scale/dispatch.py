"""Which actor runs which trial, and what happens when an actor dies: the Ray executor's
scheduling, with no Ray in it (pytest_gap/scale/ray_executor.py gives it a real cluster; the
tests give it fake actors, as xdist's scheduler tests give theirs fake nodes).

Pull model: an idle actor asks for work and gets, in collection order,
1. the next trial of the scene (config, backend, suite, task) it ran last: its env pool holds
   that scene, so a task's seeds reuse one env as they do on an xdist worker;
2. else the first trial of a scene no other live actor holds;
3. else the first trial left.
A trial is only handed out while its cell's `num_workers` limit (per config and throttle key)
has room, as the run dir's slots enforce it on one machine.

Faults never lose a trial nor hang the session:
- an actor (or its node) that dies mid-trial: the trial's broken attempt is recorded (an
  infrastructure failure), and the trial is re-run once on another actor, its final record
  listing the broken attempt (`earlier_attempts`); a second death records it as lost;
- a trial still running `GRACE_S` past its watchdog limit: its actor is killed (it may be stuck
  in C code) and replaced, the trial recorded as timed out (124), as a killed xdist worker's is;
- no live actor left: every trial not run yet is recorded as lost, saying so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# How long past its watchdog limit a trial may run before its actor is killed: the actor's own
# watchdog needs none, but a trial stuck where signals do not reach does.
GRACE_S = 30.0
POLL_S = 0.5


class ActorGone(Exception):
    """The actor, or the node it ran on, is gone; the message says what Ray reported."""


class TrialBroke(Exception):
    """The actor is alive but its call failed (the harness raised, the outcome could not be
    sent): the trial is recorded as an infrastructure failure, not re-run."""


@dataclass
class Job:
    """One trial to run. `request` is what its actor is sent; `broken` the attempts an actor's
    death broke (EarlierAttempt dicts), added to the request when it is re-run."""

    key: str  # the pytest node id
    scene: tuple  # actors that ran a trial of this scene hold its env
    throttle: tuple[str, str]  # (config, the cell's throttle key)
    limit: int  # the cell's num_workers
    timeout_s: float  # the trial's watchdog limit; 0: none
    request: dict[str, Any]
    broken: list[dict[str, Any]] = field(default_factory=list)
    # A trial of a cell gated sequentially: (its cell, its block); the cell's blocks go out in
    # order. `needed` says whether the cell still needs trials (read from the records).
    turn: tuple[tuple[str, str], int] | None = None
    needed: Callable[[], bool] | None = None


@dataclass
class Slot:
    """A long-lived actor: one per slot (CPU or GPU share) of a node."""

    name: str
    actor: Any
    node: str
    last_scene: tuple | None = None
    job: Job | None = None
    started: float = 0.0  # monotonic time its job was handed out
    started_at: str | None = None  # ... as a record's timestamp
    handle: Any = None  # the pending call
    alive: bool = True


class Cluster(Protocol):
    """What the dispatcher needs of a cluster (Ray's, or a test's fake)."""

    def submit(self, slot: Slot, request: dict[str, Any]) -> Any:
        """Start `request` on the slot's actor; returns a handle to wait on."""

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        """Those of `handles` that are done (after at most `timeout` s)."""

    def outcome(self, handle: Any) -> dict[str, Any]:
        """A done call's return value; raises ActorGone if its actor or node died, TrialBroke
        if the call failed on a live actor."""

    def kill(self, slot: Slot) -> None:
        """End the slot's actor (a stuck trial)."""

    def replace(self, slot: Slot) -> Slot | None:
        """A fresh actor in the killed one's place (same node), None if none can start."""


@dataclass
class Delivery:
    """What the dispatcher hands back per trial: the actor's outcome, or why there is none."""

    job: Job
    outcome: dict[str, Any] | None = None  # the actor's return value
    lost: str | None = None  # why no actor could finish it (its actor died twice, none left)
    not_needed: bool = False  # never sent: the sequential gate stopped its cell
    timed_out_s: float | None = None  # killed this long after it started (past its limit)
    worker: str | None = None


class Dispatcher:
    """Runs `jobs` on `slots` through `cluster`; calls `deliver` once per job, from the thread
    that runs `run()`. `broken(job, why, slot)` records an attempt an actor's death broke and
    returns it as an EarlierAttempt dict (the job is then re-run once)."""

    def __init__(
        self,
        cluster: Cluster,
        slots: list[Slot],
        jobs: list[Job],
        deliver: Callable[[Delivery], None],
        broken: Callable[[Job, str, Slot], dict[str, Any]],
        *,
        grace_s: float = GRACE_S,
        poll_s: float = POLL_S,
    ):
        self.cluster, self.slots, self.pending = cluster, list(slots), list(jobs)
        self.deliver, self.broken = deliver, broken
        self.grace_s, self.poll_s = grace_s, poll_s
        self.stopping = threading.Event()

    # -- routing ------------------------------------------------------------------------------
    def _in_flight(self, throttle: tuple[str, str]) -> int:
        return sum(1 for s in self.slots if s.job is not None and s.job.throttle == throttle)

    def next_for(self, slot: Slot) -> Job | None:
        """The job `slot` should run next (module docstring), None if none may start now. The
        pending jobs of a cell the sequential gate has stopped are delivered as not needed."""
        room = [j for j in self.pending if self._in_flight(j.throttle) < j.limit]
        room = [j for j in room if j.turn is None or j.turn[1] == self._earliest(j.turn[0])]
        asked = {j.turn[0]: j.needed for j in room if j.turn is not None and j.needed is not None}
        stopped = {cell for cell, needed in asked.items() if not needed()}  # once per cell
        for job in [j for j in self.pending if j.turn is not None and j.turn[0] in stopped]:
            self.pending.remove(job)
            self.deliver(Delivery(job, not_needed=True))
        room = [j for j in room if j.turn is None or j.turn[0] not in stopped]
        if not room:
            return None
        held = {s.last_scene for s in self.slots if s.alive and s is not slot}
        pick = (
            next((j for j in room if j.scene == slot.last_scene), None)
            or next((j for j in room if j.scene not in held), None)
            or room[0]
        )
        self.pending.remove(pick)
        return pick

    def _earliest(self, cell: tuple[str, str]) -> int:
        """The earliest block of `cell` with a job pending: its jobs go out first."""
        return min(j.turn[1] for j in self.pending if j.turn is not None and j.turn[0] == cell)

    def requeue(self, job: Job) -> None:
        """Run `job` again, next (from `deliver`: its policy server died under it and is back)."""
        self.pending.insert(0, job)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        """Until every job is delivered (or `stopping` is set)."""
        from pytest_gap.results import now_iso

        while not self.stopping.is_set():
            for slot in self.slots:
                if slot.alive and slot.job is None:
                    job = self.next_for(slot)
                    if job is not None:
                        request = {**job.request, "earlier_attempts": list(job.broken)}
                        slot.job, slot.last_scene = job, job.scene
                        slot.started, slot.started_at = time.monotonic(), now_iso()
                        try:
                            slot.handle = self.cluster.submit(slot, request)
                        except ActorGone as exc:
                            self._died(slot, str(exc))
            busy = [s for s in self.slots if s.job is not None]
            if not busy:
                if not self.pending:
                    return
                if not any(s.alive for s in self.slots):
                    for job in self.pending:
                        self.deliver(Delivery(job, lost=_NONE_LEFT))
                    self.pending.clear()
                    return
                continue  # a slot died at submit: the next pass hands its job on
            done = self.cluster.wait([s.handle for s in busy], self.poll_s)
            for slot in busy:
                if any(h is slot.handle for h in done):
                    self._collect(slot)
                else:
                    self._check_deadline(slot)

    def _collect(self, slot: Slot) -> None:
        job = slot.job
        try:
            outcome = self.cluster.outcome(slot.handle)
        except ActorGone as exc:
            self._died(slot, str(exc))
            return
        except TrialBroke as exc:
            slot.job, slot.handle = None, None
            self.deliver(Delivery(job, lost=f"its Ray actor {slot.name} failed: {exc}"))
            return
        slot.job, slot.handle = None, None
        self.deliver(Delivery(job, outcome=outcome, worker=slot.name))

    def _died(self, slot: Slot, why: str) -> None:
        """The slot's actor is gone: its trial is recorded broken and re-run once elsewhere."""
        job = slot.job
        slot.alive, slot.job, slot.handle = False, None, None
        if job is None:
            return
        reason = f"its Ray actor {slot.name} (node {slot.node}) died: {why}"
        if job.broken:  # re-run once already
            self.deliver(Delivery(job, lost=reason, worker=slot.name))
            return
        job.broken.append(self.broken(job, reason, slot))
        self.pending.insert(0, job)

    def _check_deadline(self, slot: Slot) -> None:
        job = slot.job
        if not job.timeout_s:
            return
        elapsed = time.monotonic() - slot.started
        if elapsed < job.timeout_s + self.grace_s:
            return
        self.cluster.kill(slot)
        slot.alive, slot.job, slot.handle = False, None, None
        self.deliver(Delivery(job, timed_out_s=elapsed, worker=slot.name))
        fresh = self.cluster.replace(slot)
        if fresh is not None:
            self.slots[self.slots.index(slot)] = fresh


_NONE_LEFT = "no Ray actor is left to run it (every actor of the session died or was killed)"
