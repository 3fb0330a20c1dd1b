"""Cap how many trials of one kind run at once across worker processes (file-lock slots).

`mode_overrides.<mode>.num_workers` (and a suite's `num_workers`) bound a mode's concurrent
trials below the session's `-n`, e.g. so that one websocket VLA server is not queued by every
worker. A slot is an flock'ed file in the run dir: the kernel releases it when its holder dies,
so a crashed worker never leaks one. Waiters queue first come, first served: each holds a
ticket (an flock'ed file named by when it arrived) while it waits, and only the oldest live
ticket may take a free slot. Without the queue a worker that frees a slot and asks again at once
would take it back before a waiter's next poll, over and over, until that waiter's trial ran out
of budget.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_S = 0.2
QUEUE_DIR = "queue"
_TICKET = "wait_"
_tickets = itertools.count()  # tells apart the tickets of one process's threads


class SlotTimeout(TimeoutError):
    """No slot came free before the waiter's deadline."""


class Slot:
    """One of `limit` slots under `directory`: `acquire` waits for one, `release` frees it.
    `clock` and `sleep` time the wait (a test gives a clock of its own, so that a deadline is
    checked without waiting on the wall clock); the queue's order is the host's monotonic
    clock whatever they are."""

    def __init__(
        self,
        directory: Path,
        limit: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.directory, self.limit = directory, limit
        self.index: int | None = None
        self._fd: int | None = None
        self._clock, self._sleep = clock, sleep

    def acquire(self, timeout: float | None = None) -> int:
        """Take a free slot, waiting at most `timeout` seconds (None: as long as it takes), after
        every waiter that came before."""
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout is None else self._clock() + timeout
        with _ticket(self.directory / QUEUE_DIR) as ticket:
            while True:
                if _first(ticket):
                    index = self._take_free()
                    if index is not None:
                        return index
                if deadline is None:
                    self._sleep(POLL_S)
                    continue
                left = deadline - self._clock()
                if left <= 0:
                    raise SlotTimeout(f"no slot of {self.limit} came free within {timeout:g} s")
                self._sleep(min(POLL_S, left))

    def _take_free(self) -> int | None:
        for index in range(self.limit):
            fd = os.open(self.directory / f"slot_{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.index, self._fd = index, fd
            return index
        return None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self.index, self._fd = None, None


@contextlib.contextmanager
def _ticket(queue: Path) -> Iterator[Path]:
    """A place in `queue` for as long as the block runs: a file named by the arrival time (the
    host's monotonic clock, which every process shares and no clock step moves back),
    locked before it appears under that name (so no reader takes it for a dead waiter's)."""
    queue.mkdir(parents=True, exist_ok=True)
    name = f"{_TICKET}{time.monotonic_ns():020d}_{os.getpid():010d}_{next(_tickets):06d}.lock"
    path = queue / name
    staging = queue / f".{name}"
    fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, path)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)


def _live(ticket: Path) -> bool:
    """Whether a waiter holds `ticket`; a dead waiter's is removed."""
    try:
        fd = os.open(ticket, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        ticket.unlink()  # its waiter died waiting (the kernel let go of its lock)
    return False


def _queued(queue: Path, before: str | None = None) -> Iterator[Path]:
    """The live tickets in `queue` (those that sort before `before`, if given)."""
    for ticket in sorted(queue.glob(f"{_TICKET}*")):
        if before is not None and ticket.name >= before:
            return
        if _live(ticket):
            yield ticket


def _first(ticket: Path) -> bool:
    """Whether no live waiter arrived before `ticket`'s."""
    return next(_queued(ticket.parent, ticket.name), None) is None


def waiters(directory: Path) -> int:
    """How many waiters are queued for a slot under `directory`."""
    return sum(1 for _ in _queued(directory / QUEUE_DIR))


@contextlib.contextmanager
def slot(directory: Path, limit: int, timeout: float | None = None) -> Iterator[int]:
    """Hold one of `limit` slots under `directory` for the duration of the block.

    Raises SlotTimeout if none comes free within `timeout` seconds (None: wait indefinitely)."""
    held = Slot(directory, limit)
    index = held.acquire(timeout)
    try:
        yield index
    finally:
        held.release()
