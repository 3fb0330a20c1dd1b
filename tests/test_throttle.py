"""Concurrency slots shared by worker processes (mode_overrides.<mode>.num_workers).

No test here reads a wall-clock window that a loaded machine could break: what one process
sees of another is read from the order of their reports and from the queue's state, a
deadline is checked on a clock the test drives, and "free at once" is a wait of 0 s (one
look, no poll). Every wait on another process has a generous ceiling instead."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from pytest_gap.throttle import POLL_S, Slot, SlotTimeout, slot, waiters


def _hold(directory, limit, seconds, starts):
    with slot(directory, limit):
        starts.put(time.monotonic())
        time.sleep(seconds)


def _hold_until_released(directory, limit, name, events, release):
    """Take a slot, report it, hold it until `release` is set, then report the release."""
    with slot(directory, limit) as index:
        events.put(("took", name, index, time.monotonic()))
        release.wait(60)
        events.put(("frees", name, index, time.monotonic()))  # still held while reported


def test_at_most_limit_holders_run_at_once(tmp_path):
    """Three holders of two slots, each holding until told: the order of what they report
    shows the property, whatever the load (no wall-clock margin): two hold at once, the third
    waits in the queue and gets nothing until one of them lets go (its report comes after the
    release, on the clock every process shares), and then it gets that one's slot."""
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    releases = {name: ctx.Event() for name in "abc"}
    procs = [
        ctx.Process(target=_hold_until_released, args=(tmp_path, 2, name, events, release))
        for name, release in releases.items()
    ]
    for proc in procs:
        proc.start()
    try:
        first, second = events.get(timeout=60), events.get(timeout=60)
        assert first[0] == second[0] == "took"  # two slots: two hold at once
        assert {first[2], second[2]} == {0, 1}
        # The third waits in the queue: the two holders took their tickets out with their
        # slots, so the one live ticket is its. A throttle that let it in anyway shows below:
        # its "took" would come before the release, or name a third slot.
        _until(lambda: waiters(tmp_path) == 1, "queued", seconds=60)
        releases[first[1]].set()
        # Two processes' reports may reach the queue in either order: their clocks order them.
        later = {event[0]: event for event in (events.get(timeout=60), events.get(timeout=60))}
        freed, third = later["frees"], later["took"]
        assert freed[1:3] == (first[1], first[2])
        (waiter,) = set(releases) - {first[1], second[1]}
        assert third[1:3] == (waiter, first[2])  # the freed slot, once it was freed
        assert third[3] > freed[3]
    finally:
        for release in releases.values():
            release.set()
        for proc in procs:
            proc.join(30)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]


def _until(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.01)


def test_a_waiter_gets_the_slot_before_its_holder_takes_it_back(tmp_path):
    """First come, first served: a holder that lets go and asks again at once (a worker
    between two trials) queues behind the waiter, whose trial would otherwise wait out its
    budget while the holder took the slot back before every poll."""
    order = []
    held = Slot(tmp_path, 1)
    held.acquire()

    def wait():
        with slot(tmp_path, 1, timeout=30):
            order.append("waiter")
            time.sleep(0.1)

    waiter = threading.Thread(target=wait)
    waiter.start()
    _until(lambda: waiters(tmp_path) == 1, "queued")
    held.release()
    for _ in range(3):
        with slot(tmp_path, 1, timeout=30):
            order.append("holder")
    waiter.join(30)
    assert order == ["waiter", "holder", "holder", "holder"]
    assert waiters(tmp_path) == 0


def _wait_for_slot(directory, limit):
    with slot(directory, limit):
        pass


def test_a_waiter_that_died_in_the_queue_holds_up_nobody(tmp_path):
    ctx = mp.get_context("spawn")
    with slot(tmp_path, 1):
        proc = ctx.Process(target=_wait_for_slot, args=(tmp_path, 1))
        proc.start()
        _until(lambda: waiters(tmp_path) == 1, "queued")
        proc.kill()
        proc.join()
    # Not behind the dead waiter's ticket: free at the first look (a wait of 0 s polls never).
    with slot(tmp_path, 1, timeout=0) as index:
        assert index == 0
    assert waiters(tmp_path) == 0


def test_a_dead_holder_frees_its_slot(tmp_path):
    ctx = mp.get_context("spawn")
    started = ctx.Queue()
    proc = ctx.Process(target=_hold, args=(tmp_path, 1, 60.0, started))
    proc.start()
    started.get(timeout=30)  # it holds the only slot now
    proc.kill()
    proc.join()
    with slot(tmp_path, 1, timeout=0) as index:  # free the moment its holder is gone
        assert index == 0


class _Clock:
    """A clock that moves only when its waiter sleeps: the waiter's deadline, read on it."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert len(self.sleeps) < 1000, "the waiter never gave up"
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_waiter_gives_up_at_its_deadline(tmp_path):
    """Behind a holder (another process) that keeps the only slot: the waiter looks every
    POLL_S until its deadline and gives up exactly there, on its own clock (no sooner: it
    slept the whole timeout; no later: its last sleep ends at the deadline). With the host's
    clock it gives up too, no sooner than its deadline (load only makes it later)."""
    ctx = mp.get_context("spawn")
    started = ctx.Queue()
    proc = ctx.Process(target=_hold, args=(tmp_path, 1, 60.0, started))
    proc.start()
    try:
        started.get(timeout=30)  # it holds the only slot now
        clock = _Clock()
        waiter = Slot(tmp_path, 1, clock=clock, sleep=clock.sleep)
        with pytest.raises(SlotTimeout, match=r"no slot of 1 came free within 0\.5 s"):
            waiter.acquire(timeout=0.5)
        # it looked every POLL_S at most, and stopped at the deadline: not before, not after
        assert len(clock.sleeps) >= 0.5 / POLL_S and max(clock.sleeps) <= POLL_S
        assert clock.now == pytest.approx(1000.5, abs=1e-9)
        assert waiter.index is None and waiters(tmp_path) == 0  # its ticket left with it
        t0 = time.monotonic()
        with (
            pytest.raises(SlotTimeout, match=r"no slot of 1 came free within 0\.5 s"),
            slot(tmp_path, 1, timeout=0.5),
        ):
            pass
        assert time.monotonic() - t0 >= 0.5
    finally:
        proc.kill()
        proc.join()
    with slot(tmp_path, 1, timeout=0) as index:  # freed by the holder's death, at once
        assert index == 0
