"""Concurrency slots shared by worker processes (mode_overrides.<mode>.num_workers)."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from pytest_gap.throttle import SlotTimeout, slot


def _hold(directory, limit, seconds, starts):
    with slot(directory, limit):
        starts.put(time.monotonic())
        time.sleep(seconds)


def test_at_most_limit_holders_run_at_once(tmp_path):
    ctx = mp.get_context("spawn")
    starts = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(tmp_path, 2, 1.0, starts)) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    times = sorted(starts.get(timeout=5) for _ in procs)
    assert times[1] - times[0] < 0.8  # two slots: the first two start together
    assert times[2] - times[0] >= 0.9  # the third waits for a slot to free


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
