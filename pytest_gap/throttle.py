"""Cap how many trials of one kind run at once across worker processes (file-lock slots).

`mode_overrides.<mode>.num_workers` (and a suite's `num_workers`) bound a mode's concurrent
trials below the session's `-n`, e.g. so that one websocket VLA server is not queued by every
worker. A slot is an flock'ed file in the run dir: the kernel releases it when its holder dies,
so a crashed worker never leaks one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

POLL_S = 0.2


class SlotTimeout(TimeoutError):
    """No slot came free before the waiter's deadline."""


class Slot:
    """One of `limit` slots under `directory`: `acquire` waits for one, `release` frees it."""

    def __init__(self, directory: Path, limit: int):
        self.directory, self.limit = directory, limit
        self.index: int | None = None
        self._fd: int | None = None

    def acquire(self, timeout: float | None = None) -> int:
        """Take a free slot, waiting at most `timeout` seconds (None: as long as it takes)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for index in range(self.limit):
                fd = os.open(self.directory / f"slot_{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.index, self._fd = index, fd
                return index
            if deadline is None:
                time.sleep(POLL_S)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise SlotTimeout(f"no slot of {self.limit} came free within {timeout:g} s")
            time.sleep(min(POLL_S, left))

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self.index, self._fd = None, None


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
