"""Concurrency slots shared by worker processes (mode_overrides.<mode>.num_workers)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time

import pytest

from pytest_gap.throttle import Slot, SlotTimeout, slot, waiters


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
    gets nothing until one of them lets go, and then it gets that one's slot."""
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
        # The third is waiting (the holders are holding until told): nothing more arrives,
        # however long we give it; a throttle that let a third in would report it here.
        with pytest.raises(queue.Empty):
            events.get(timeout=1.0)
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
    with slot(tmp_path, 1, timeout=2.0) as index:  # not behind the dead waiter's ticket
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
    t0 = time.monotonic()
    with slot(tmp_path, 1):
        assert time.monotonic() - t0 < 1.0


def test_a_waiter_gives_up_at_its_deadline(tmp_path):
    ctx = mp.get_context("spawn")
    started = ctx.Queue()
    proc = ctx.Process(target=_hold, args=(tmp_path, 1, 60.0, started))
    proc.start()
    try:
        started.get(timeout=30)  # it holds the only slot now
        t0 = time.monotonic()
        with (
            pytest.raises(SlotTimeout, match=r"no slot of 1 came free within 0\.5 s"),
            slot(tmp_path, 1, timeout=0.5),
        ):
            pass
        assert 0.5 <= time.monotonic() - t0 < 1.5
    finally:
        proc.kill()
        proc.join()
    with slot(tmp_path, 1, timeout=2.0) as index:  # freed by the holder's death
        assert index == 0
